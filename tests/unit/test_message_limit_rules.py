"""The message limit (ZFAB_MAX_MESSAGE_BYTES, core/sizes.py) answers at once on every side, on the stub
transport: the client refuses before sending, the broker and the worker answer what is over theirs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zfab import BadRequestError, Broker, Client, PayloadTooLargeError, Settings
from zfab.core import protocol as nfp
from zfab.core import sizes
from zfab.transport import FakeClock, StubLoop, StubTransport
from zfab.workers.demo import DemoWorker

LIMIT = 64 * 1024  # the smallest that keeps a test's frames apart from the zero-copy ones is fine here


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def stub(role: Any) -> StubLoop:
    assert isinstance(role.loop, StubLoop)
    return role.loop


@pytest.fixture
def client(clock: FakeClock) -> Iterator[Client]:
    s = Settings(max_message_bytes=LIMIT, keepalive_interval=1.0, keepalive_multiplier=3)
    c = Client(settings=s, name="t", transport=StubTransport(clock), clock=clock).start()
    stub(c).take()
    yield c
    c.close()


@pytest.fixture
def broker(clock: FakeClock) -> Broker:
    s = Settings(max_message_bytes=LIMIT, keepalive_interval=1.0, keepalive_multiplier=3, startup_grace=0)
    b = Broker(s, endpoint="tcp://127.0.0.1:1", transport=StubTransport(clock), clock=clock)
    b.loop.start()
    stub(b).tick()
    return b


def test_the_sentence_names_the_size_the_limit_and_its_setting() -> None:
    why = sizes.too_large("the request of job j1", 6 * 2**20, 4 * 2**20)
    assert "6291456 bytes" in why and "ZFAB_MAX_MESSAGE_BYTES = 4194304 bytes, 4.0 MiB" in why
    assert sizes.fits(4 * 2**20, 4 * 2**20) and not sizes.fits(4 * 2**20 + 1, 4 * 2**20)
    assert sizes.socket_cap(4 * 2**20) > 4 * 2**20  # a little over is answered, not disconnected


def test_a_request_over_the_limit_is_refused_before_anything_is_sent(client: Client) -> None:
    with pytest.raises(PayloadTooLargeError, match="ZFAB_MAX_MESSAGE_BYTES = 65536") as exc:
        client.submit("demo", "echo", kwargs={"data": "x" * LIMIT}, timeout=5)
    assert isinstance(exc.value, BadRequestError) and exc.value.uuid  # the API answers it as a bad request
    assert stub(client).take() == [] and client.jobs_in_flight() == 0 and client.counts["oversize"] == 1
    assert client.bytes_in_flight() == 0
    # just under the limit, with its frames, goes
    fut = client.submit("demo", "echo", kwargs={"data": "x" * (LIMIT - 400)}, timeout=5)
    (sent,) = stub(client).take()
    assert sum(map(len, sent)) <= LIMIT and sent[5].decode() == fut.uuid


def test_the_broker_s_smaller_limit_from_its_keepalive_answer_is_the_one_the_client_keeps(client: Client) -> None:
    small = 16 * 1024
    stub(client).feed(
        [b"", nfp.BROKER, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", nfp.ST_OK, nfp.dumps({"boot": "b1", "max": small})]
    )
    assert client.message_limit() == small
    with pytest.raises(PayloadTooLargeError, match=f"= {small} bytes"):
        client.submit("demo", "echo", kwargs={"data": "x" * small}, timeout=5)
    # a broker's larger limit does not raise ours, and a nonsense one is ignored
    for said in (10 * LIMIT, "lots", True, 3):
        stub(client).feed(
            [b"", nfp.BROKER, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", nfp.ST_OK, nfp.dumps({"boot": "b1", "max": said})]
        )
        assert client.message_limit() == LIMIT


def test_an_answer_over_the_clients_limit_fails_its_job_at_once_naming_the_limit(client: Client) -> None:
    fut = client.submit("demo", "echo", kwargs={"data": 1}, timeout=60)
    stub(client).take()
    big = nfp.dumps({"w1": {"result": "x" * LIMIT, "failed": False}})
    stub(client).feed([b"", nfp.BROKER, nfp.RESPONSE, b"demo", fut.uuid.encode(), nfp.ST_OK, big])
    with pytest.raises(PayloadTooLargeError, match=r"the answer for job .*\(ZFAB_MAX_MESSAGE_BYTES = 65536"):
        fut.result(0)
    assert client.counts["oversize"] == 1 and client.jobs_in_flight() == 0


def test_the_broker_answers_a_request_over_its_limit_too_large_and_counts_it(broker: Broker) -> None:
    body = nfp.dumps({"task": "echo", "args": [], "kwargs": {"data": "x" * LIMIT}})
    flags = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10})
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j1", body, flags])
    (answer,) = stub(broker).take()
    payload = json.loads(answer[7])
    assert answer[0] == b"c1" and answer[6] == nfp.ST_BAD_REQUEST and payload["status"] == "TOO LARGE"
    assert "ZFAB_MAX_MESSAGE_BYTES = 65536" in payload["errors"][0] and payload["uuid"] == "j1"
    assert broker.rejected["oversize"] == 1 and broker.counts["refused_400"] == 1


def test_a_client_told_too_large_by_the_broker_raises_payload_too_large(client: Client) -> None:
    fut = client.submit("demo", "echo", kwargs={"data": 1}, timeout=60)
    stub(client).take()
    refusal = {"workers": None, "uuid": fut.uuid, "target": "any", "status": "TOO LARGE", "service": "demo",
               "errors": ["the request of job x is 9 bytes with its frames, over the message limit"]}  # fmt: skip
    stub(client).feed(
        [b"", nfp.BROKER, nfp.RESPONSE, b"demo", fut.uuid.encode(), nfp.ST_BAD_REQUEST, nfp.dumps(refusal)]
    )
    with pytest.raises(PayloadTooLargeError, match="over the message limit"):
        fut.result(0)


def test_a_result_over_the_brokers_limit_reaches_the_client_as_a_failure_and_frees_the_credit(broker: Broker) -> None:
    ann = nfp.dumps({"v": 2, "name": "w1", "credits": 1, "tasks": {"echo": {}}})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.READY, b"demo", ann])
    flags = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10})
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j1", b'{"task":"echo"}', flags])
    stub(broker).take()
    big = nfp.dumps({"w1": {"result": "x" * LIMIT, "failed": False}})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, big])
    (answer,) = [f for f in stub(broker).take() if f[0] == b"c1"]
    entry = json.loads(answer[7])["w1"]
    assert answer[6] == nfp.ST_ERROR and entry["failed"] is True
    assert "the answer of job j1 from worker w1" in entry["errors"][0] and "= 65536 bytes" in entry["errors"][0]
    assert not broker.registry.workers[b"w1"].inflight  # its credit is free again


def test_a_worker_answers_a_job_over_its_limit_with_a_failure_naming_the_limit(
    tmp_path: Path, clock: FakeClock
) -> None:
    s = Settings(data_dir=str(tmp_path), max_message_bytes=LIMIT, keepalive_interval=1.0, keepalive_multiplier=3)
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock).start()
    try:
        stub(w).take()
        body = nfp.dumps({"task": "echo", "args": [], "kwargs": {"data": "x" * LIMIT}})
        stub(w).feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", b"j1", body])
        (answer,) = [f for f in stub(w).take() if f[2] == nfp.RESPONSE]
        entry = json.loads(answer[7])["w1"]
        assert answer[6] == nfp.ST_BAD_REQUEST and entry["failed"] is True
        assert "the request of job j1" in entry["errors"][0] and "ZFAB_MAX_MESSAGE_BYTES = 65536" in entry["errors"][0]
        assert w.counts["rejected_frames"] == 1
    finally:
        w.stop(drain=0)


def test_the_api_answers_a_payload_over_the_limit_413_with_the_sentence() -> None:
    from zfab.api.errors import admission_problem, from_fabric_error

    exc = PayloadTooLargeError(sizes.too_large("the request of job j1", 6 * 2**20, 4 * 2**20), uuid="j1")
    for problem in (from_fabric_error(exc), admission_problem(exc, "j1")):
        assert problem.status == 413 and "ZFAB_MAX_MESSAGE_BYTES = 4194304" in problem.detail


def test_the_clients_refusals_are_a_metric(client: Client) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from zfab.metrics.client import ClientMetrics

    registry = CollectorRegistry()
    ClientMetrics(client, registry)
    with pytest.raises(PayloadTooLargeError):
        client.submit("demo", "echo", kwargs={"data": "x" * LIMIT}, timeout=5)
    assert "zfab_client_oversize_total 1.0" in generate_latest(registry).decode()
