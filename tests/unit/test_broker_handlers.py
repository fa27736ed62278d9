"""The broker's handlers on the stub transport: dispatch, forward, purge, refusals, MMI. No sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service import Broker, Settings
from service.core import protocol as nfp
from service.transport import FakeClock, StubLoop, StubTransport

INTERVAL, MULTIPLIER = 1.0, 3


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(clock: FakeClock) -> Broker:
    s = Settings(keepalive_interval=INTERVAL, keepalive_multiplier=MULTIPLIER, max_inflight_per_worker=2)
    b = Broker(s, endpoint="tcp://127.0.0.1:1", transport=StubTransport(clock), clock=clock)
    b.loop.start()
    return b


def stub(b: Broker) -> StubLoop:
    assert isinstance(b.loop, StubLoop)
    return b.loop


def ready(b: Broker, name: bytes, service: bytes = b"demo") -> None:
    stub(b).feed([name, b"", nfp.WORKER, nfp.READY, service])


def post(b: Broker, uuid: bytes, target: bytes = b"any", service: bytes = b"demo", client: bytes = b"c1") -> None:
    body = b'{"task":"echo","args":[],"kwargs":{}}'
    stub(b).feed([client, b"", nfp.CLIENT, nfp.POST, service, target, uuid, body, b'{"push":true,"ack":true}'])


def replies(frames: list[list[bytes]], to: bytes) -> list[tuple[bytes, bytes, Any]]:
    """(command, status, payload) of what the broker sent to `to`."""
    out = []
    for f in frames:
        if f[0] == to and f[2] == nfp.BROKER and len(f) == 8:
            out.append((f[3], f[6], json.loads(f[7]) if f[7] else {}))
    return out


def jobs_sent(frames: list[list[bytes]]) -> list[tuple[bytes, bytes, bytes]]:
    """(worker, command, uuid) of the jobs the broker forwarded."""
    return [(f[0], f[3], f[6]) for f in frames if len(f) == 8 and f[2] == nfp.BROKER and f[4] == b"c1"]


def test_post_to_any_is_acknowledged_then_sent_to_the_least_loaded_worker(broker: Broker) -> None:
    ready(broker, b"w1")
    ready(broker, b"w2")
    post(broker, b"j1")
    post(broker, b"j2")
    sent = stub(broker).take()
    acks = replies(sent, b"c1")
    assert [(cmd, st) for cmd, st, _ in acks] == [(nfp.RESPONSE, nfp.ST_DISPATCHED)] * 2
    assert acks[0][2]["status"] == "DISPATCHED" and len(acks[0][2]["workers"]) == 1
    # one job each: the second went to the worker the first did not load
    assert sorted(w for w, _, _ in jobs_sent(sent)) == [b"w1", b"w2"]
    # NorFab's order: the 202 goes out before the POST it announces
    first_ack = next(i for i, f in enumerate(sent) if f[0] == b"c1")
    first_job = next(i for i, f in enumerate(sent) if f[0] in (b"w1", b"w2") and f[3] == nfp.POST)
    assert first_ack < first_job


def test_post_to_an_unknown_service_is_refused_with_a_reason(broker: Broker) -> None:
    post(broker, b"j1", service=b"nope")
    ((_, status, payload),) = replies(stub(broker).take(), b"c1")
    assert status == nfp.ST_BAD_REQUEST and payload["workers"] is None
    assert "nope" in payload["errors"][0] and "unknown" in payload["errors"][0]


def test_a_bad_target_list_is_refused_and_counted(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1", target=b"[not json")
    ((_, status, payload),) = replies(stub(broker).take(), b"c1")
    assert status == nfp.ST_BAD_REQUEST and "bad target" in payload["errors"][0]
    assert broker.rejected["target"] == 1


def test_a_full_worker_makes_the_broker_answer_busy(broker: Broker) -> None:
    ready(broker, b"w1")
    for i in range(3):  # the bound is 2 jobs in flight per worker
        post(broker, f"j{i}".encode())
    statuses = [st for _, st, _ in replies(stub(broker).take(), b"c1")]
    assert statuses == [nfp.ST_DISPATCHED, nfp.ST_DISPATCHED, nfp.ST_BUSY]


def test_a_final_result_is_forwarded_to_a_push_client_and_frees_the_slot(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1")
    stub(broker).take()
    result = nfp.dumps({"w1": {"result": 1, "failed": False}})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, result])
    ((cmd, status, payload),) = replies(stub(broker).take(), b"c1")
    assert (cmd, status, payload["w1"]["result"]) == (nfp.RESPONSE, nfp.ST_OK, 1)
    assert broker.registry.workers[b"w1"].inflight == {} and b"j1" not in broker.registry.routes


def test_a_retried_post_of_a_finished_job_goes_back_to_its_worker(broker: Broker) -> None:
    ready(broker, b"w1")
    ready(broker, b"w2")
    post(broker, b"j1")
    (worker, _, _), = jobs_sent(stub(broker).take())
    result = nfp.dumps({worker.decode(): {"result": 1}})
    stub(broker).feed([worker, b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, result])
    stub(broker).take()
    post(broker, b"j1")
    assert [w for w, _, _ in jobs_sent(stub(broker).take())] == [worker]
    assert broker.counts["post_retried"] == 1


def test_a_silent_worker_is_purged_and_its_clients_told_at_once(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1")
    post(broker, b"j1")
    stub(broker).take()
    clock.advance(INTERVAL * MULTIPLIER + 0.01)
    stub(broker).tick()
    sent = stub(broker).take()
    ((_, status, payload),) = replies(sent, b"c1")
    assert status == nfp.ST_WORKER_LOST and payload["worker"] == "w1" and "keepalives expired" in payload["errors"][0]
    assert [f[3] for f in sent if f[0] == b"w1"] == [nfp.DISCONNECT]
    assert b"w1" not in broker.registry.workers and broker.purged["demo"] == 1


def test_keepalives_go_to_workers_every_interval(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1")
    for _ in range(2):
        clock.advance(INTERVAL)
        stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
        stub(broker).tick()
    sent = [f for f in stub(broker).take() if f[0] == b"w1"]
    assert [f[3] for f in sent] == [nfp.KEEPALIVE, nfp.KEEPALIVE]
    ka = broker.registry.workers[b"w1"].keepalive
    assert (ka.sent, ka.received) == (2, 2)


def test_an_unknown_worker_is_told_to_reregister_once_per_interval(broker: Broker, clock: FakeClock) -> None:
    for _ in range(3):
        stub(broker).feed([b"ghost", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    assert [f[3] for f in stub(broker).take()] == [nfp.DISCONNECT]
    clock.advance(INTERVAL)
    stub(broker).feed([b"ghost", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    assert [f[3] for f in stub(broker).take()] == [nfp.DISCONNECT]


def test_malformed_frames_are_counted_and_dropped(broker: Broker) -> None:
    stub(broker).feed([b"x", b"", b"NOPE01", nfp.POST], [b"x", b"", nfp.CLIENT, b"0x99", b"demo", b"any", b"u", b"{}"])
    assert stub(broker).take() == []
    assert broker.rejected["header"] == 1 and broker.rejected["command"] == 1


def test_mmi_is_answered_as_response_and_as_mmi(broker: Broker) -> None:
    ready(broker, b"w1")
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", b'{"task":"show_workers"}'])
    answers = replies(stub(broker).take(), b"c1")
    assert [cmd for cmd, _, _ in answers] == [nfp.RESPONSE, nfp.MMI]
    rows = answers[0][2]
    assert isinstance(rows, list)
    assert [r["name"] for r in rows] == ["w1"] and rows[0]["jobs_in_flight"] == 0


def test_a_bad_mmi_body_gets_a_400_and_is_counted(broker: Broker) -> None:
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", b"[1"])
    ((_, status, payload),) = replies(stub(broker).take(), b"c1")
    assert status == nfp.ST_BAD_REQUEST and payload["errors"]
    assert broker.rejected["json"] == 1
