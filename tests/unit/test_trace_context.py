"""Trace context on the wire without an SDK (this process has none): nothing is added to a job, and
the broker passes a submitter's W3C context to the worker in the meta frame, refusing a malformed
one. (Spans themselves: tests/integration/test_tracing.py, with the SDK in a process of its own.)"""

from __future__ import annotations

import json

from test_broker_handlers import make_broker, ready, replies, stub

from zfab import Client, Settings, tracing
from zfab.core import payloads
from zfab.core import protocol as nfp
from zfab.transport import FakeClock, StubLoop, StubTransport

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_without_an_sdk_no_span_is_made_and_no_header_sent() -> None:
    assert not tracing.enabled() and tracing.produce("demo", "echo", None) is None
    clock = FakeClock()
    c = Client(settings=Settings(), name="t", transport=StubTransport(clock), clock=clock).start()
    try:
        c.submit("demo", "echo", timeout=5)
        assert isinstance(c.loop, StubLoop)
        ((*_, flags),) = [f for f in c.loop.take() if f[2] == nfp.POST]
        assert "traceparent" not in json.loads(flags)
    finally:
        c.close()


def test_the_broker_passes_a_trace_context_to_the_worker_and_refuses_a_malformed_one() -> None:
    b = make_broker(FakeClock())
    ready(b, b"w1")
    stub(b).take()
    body = b'{"task":"echo","args":[],"kwargs":{}}'
    for uuid, trace in ((b"j1", {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}), (b"j2", {"traceparent": "x"})):
        flags = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10, **trace})
        stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", uuid, body, flags])
    sent = stub(b).take()
    ((*_, meta),) = [f for f in sent if f[0] == b"w1" and f[3] == nfp.POST]
    assert json.loads(meta)["traceparent"] == TRACEPARENT and json.loads(meta)["tracestate"] == "vendor=1"
    ((_, _, status, answer),) = [r for r in replies(sent) if r[1] == b"j2"]
    assert status == nfp.ST_BAD_REQUEST and "traceparent" in answer["errors"][0]


def test_a_trace_context_is_read_strictly() -> None:
    assert payloads.trace_context({}) is None
    assert payloads.trace_context({"traceparent": TRACEPARENT}) == {"traceparent": TRACEPARENT}
    for bad in (
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": 1},
        {"traceparent": TRACEPARENT, "tracestate": "x" * 513},
    ):
        try:
            payloads.trace_context(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
