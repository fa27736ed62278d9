"""The broker's handlers on the stub transport: admission, credits, the queue, deadlines, purge,
refusals, identities, MMI. No sockets; a fake clock."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from zfab import Broker, Settings
from zfab.broker.events import EventPublisher
from zfab.core import protocol as nfp
from zfab.transport import FakeClock, StubLoop, StubTransport

INTERVAL, MULTIPLIER = 1.0, 3
TASKS = {"echo": {"type": "object"}, "sleep": {"type": "object"}}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_broker(clock: FakeClock, events: EventPublisher | None = None, **settings: Any) -> Broker:
    base: dict[str, Any] = {
        "keepalive_interval": INTERVAL,
        "keepalive_multiplier": MULTIPLIER,
        "startup_grace": 0,
        "route_grace": 1.0,
        "service_queue_size": 5,
    }
    s = Settings(**{**base, **settings})
    b = Broker(s, endpoint="tcp://127.0.0.1:1", transport=StubTransport(clock), clock=clock, events=events)
    b.loop.start()
    stub(b).tick()  # the startup grace (0 s) ends
    return b


@pytest.fixture
def broker(clock: FakeClock) -> Broker:
    return make_broker(clock)


def stub(b: Broker) -> StubLoop:
    assert isinstance(b.loop, StubLoop)
    return b.loop


def ready(b: Broker, ident: bytes, name: str | None = None, credits: int = 2, service: bytes = b"demo") -> None:
    """A zfab worker's READY: a connection identity, and its name, credits and tasks announced."""
    ann = nfp.dumps({"v": 2, "name": name or ident.decode(), "credits": credits, "tasks": TASKS})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.READY, service, ann])


def post(
    b: Broker, uuid: bytes, target: bytes = b"any", service: bytes = b"demo", client: bytes = b"c1", **flags: Any
) -> None:
    body = b'{"task":"echo","args":[],"kwargs":{}}'
    f = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10, **flags})
    stub(b).feed([client, b"", nfp.CLIENT, nfp.POST, service, target, uuid, body, f])


def finish(b: Broker, ident: bytes, uuid: bytes, name: str | None = None, status: bytes = nfp.ST_OK) -> None:
    result = nfp.dumps({name or ident.decode(): {"result": 1, "failed": False}})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", uuid, status, result])


def replies(frames: list[list[bytes]], to: bytes = b"c1") -> list[tuple[bytes, bytes, bytes, Any]]:
    """(command, uuid, status, payload) of what the broker sent to `to`."""
    out = []
    for f in frames:
        if f[0] == to and f[2] == nfp.BROKER and len(f) in (8, 9):  # 9: a final answer's hop trace
            out.append((f[3], f[5], f[6], json.loads(f[7]) if f[7] else {}))
    return out


def jobs_sent(frames: list[list[bytes]]) -> list[tuple[bytes, bytes, bytes]]:
    """(worker identity, command, uuid) of the jobs the broker forwarded."""
    return [(f[0], f[3], f[6]) for f in frames if len(f) >= 8 and f[2] == nfp.BROKER and f[4] == b"c1"]


def test_post_to_any_is_acknowledged_then_sent_to_the_least_loaded_worker(broker: Broker) -> None:
    ready(broker, b"w1")
    ready(broker, b"w2")
    post(broker, b"j1")
    post(broker, b"j2")
    sent = stub(broker).take()
    acks = replies(sent)
    assert [(cmd, st) for cmd, _, st, _ in acks] == [(nfp.RESPONSE, nfp.ST_DISPATCHED)] * 2
    assert acks[0][3]["status"] == "DISPATCHED" and len(acks[0][3]["workers"]) == 1
    # one job each: the second went to the worker the first did not load
    assert sorted(w for w, _, _ in jobs_sent(sent)) == [b"w1", b"w2"]
    # NorFab's order: the 202 goes out before the POST it announces
    first_ack = next(i for i, f in enumerate(sent) if f[0] == b"c1")
    first_job = next(i for i, f in enumerate(sent) if f[0] in (b"w1", b"w2") and f[3] == nfp.POST)
    assert first_ack < first_job


def settled(b: Broker, clock: FakeClock) -> None:
    """The broker's first `term.settle` seconds are over: a resubmitted job (`known`) is no longer held for its
    worker's READY (test_failover_term.py) but admitted as any."""
    clock.advance(b.term.settle)
    b.on_timer(clock())


def test_a_zfab_worker_gets_what_is_left_of_the_deadline_with_its_job(broker: Broker, clock: FakeClock) -> None:
    settled(broker, clock)
    post(broker, b"j1", timeout=10, known=True)  # no worker yet: queued
    clock.advance(4)
    ready(broker, b"w1")
    ((_, _, _, _, _, _, _, _, meta),) = [f for f in stub(broker).take() if f[0] == b"w1" and f[3] == nfp.POST]
    info = json.loads(meta)
    assert info["deadline"] == pytest.approx(6, abs=0.01) and info["queued"] == pytest.approx(4, abs=0.01)


def test_credits_bound_what_a_worker_holds_and_the_rest_waits_in_the_queue(broker: Broker) -> None:
    ready(broker, b"w1", credits=2)
    for i in range(4):
        post(broker, f"j{i}".encode())
    sent = stub(broker).take()
    assert [u for _, _, u in jobs_sent(sent)] == [b"j0", b"j1"]
    assert [(u, st) for _, u, st, _ in replies(sent) if st == nfp.ST_QUEUED] == [(b"j2", b"301"), (b"j3", b"301")]
    finish(broker, b"w1", b"j0")
    sent = stub(broker).take()
    assert [u for _, _, u in jobs_sent(sent)] == [b"j2"]  # a freed credit takes the oldest waiting job
    assert (b"j2", nfp.ST_DISPATCHED) in [(u, st) for _, u, st, _ in replies(sent)]


def test_a_queued_notice_is_sent_only_for_a_job_still_waiting_when_it_comes_due(
    broker: Broker, clock: FakeClock
) -> None:
    # Given a worker with one credit, and three jobs whose client asked for "queued" after 1 s
    ready(broker, b"w1", credits=1)
    post(broker, b"j0", notice=1.0)
    post(broker, b"j1", notice=1.0, ack=False)
    post(broker, b"j2", notice=1.0)
    sent = stub(broker).take()
    assert [u for _, _, u in jobs_sent(sent)] == [b"j0"]
    # j0's 202 goes at once, even with a notice: a client that has not heard which worker holds
    # a job re-POSTs it after a broker restart, and another worker could run it a second time.
    assert [st for _, _, st, _ in replies(sent)] == [nfp.ST_DISPATCHED]  # j1 and j2 wait, told nothing yet
    assert broker.mmi.run("show_broker", {})["queued_notices"] == 2  # a bounded table, shown
    # When j1 is dispatched within its notice
    clock.advance(0.5)
    finish(broker, b"w1", b"j0")
    sent = stub(broker).take()
    assert [u for _, _, u in jobs_sent(sent)] == [b"j1"]
    # Then its client gets no 301 and, with ack false, no 202 either: only the result will come
    assert [u for _, u, st, _ in replies(sent) if u == b"j1"] == []
    # And j2, still waiting when its notice comes due, is told "queued" then, once
    clock.advance(0.49)
    stub(broker).tick()
    assert [st for _, _, st, _ in replies(stub(broker).take())] == []
    clock.advance(0.02)
    stub(broker).tick()
    stub(broker).tick()
    assert [(u, st) for _, u, st, _ in replies(stub(broker).take())] == [(b"j2", nfp.ST_QUEUED)]
    # and, told it was queued, it learns of its dispatch
    finish(broker, b"w1", b"j1")
    assert (b"j2", nfp.ST_DISPATCHED) in [(u, st) for _, u, st, _ in replies(stub(broker).take())]


def test_higher_priority_goes_first_then_arrival(broker: Broker) -> None:
    ready(broker, b"w1", credits=1)
    post(broker, b"busy")
    post(broker, b"low", priority=0)
    post(broker, b"mid")
    post(broker, b"high", priority=9)
    stub(broker).take()
    order = []
    for done in (b"busy", b"high", b"mid"):
        finish(broker, b"w1", done)
        order += [u for _, _, u in jobs_sent(stub(broker).take())]
    assert order == [b"high", b"mid", b"low"]


def test_a_job_waits_for_a_worker_of_its_service_and_runs_when_one_comes(broker: Broker) -> None:
    ready(broker, b"w1")
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.DISCONNECT, b"demo"])  # the service is known, no worker
    post(broker, b"j1")
    assert [st for _, _, st, _ in replies(stub(broker).take())] == [nfp.ST_QUEUED]
    ready(broker, b"w2")
    assert [u for _, _, u in jobs_sent(stub(broker).take())] == [b"j1"]


def test_a_queued_job_expires_at_its_deadline_and_is_never_sent(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1", credits=1)
    post(broker, b"busy")
    post(broker, b"j1", timeout=2)
    stub(broker).take()
    clock.advance(2.01)
    stub(broker).tick()
    ((_, uuid, status, payload),) = replies(stub(broker).take())
    assert (uuid, status, payload["status"]) == (b"j1", nfp.ST_EXPIRED, "EXPIRED") and "2 s" in payload["errors"][0]
    finish(broker, b"w1", b"busy")
    assert jobs_sent(stub(broker).take()) == []
    assert broker.registry.services[b"demo"].expired_queue == 1


def test_a_delayed_job_waits_for_its_time(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1")
    post(broker, b"j1", delay=2)
    assert jobs_sent(stub(broker).take()) == []
    clock.advance(1.0)
    stub(broker).tick()
    assert jobs_sent(stub(broker).take()) == []
    clock.advance(1.01)
    stub(broker).tick()
    assert [u for _, _, u in jobs_sent(stub(broker).take())] == [b"j1"]


def test_cancel_of_a_queued_job_removes_it_at_once(broker: Broker) -> None:
    ready(broker, b"w1", credits=1)
    post(broker, b"busy")
    post(broker, b"j1")
    stub(broker).take()
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.DELETE, b"demo", b"any", b"j1", b"{}"])
    ((_, uuid, status, payload),) = replies(stub(broker).take())
    assert (uuid, status, payload["status"]) == (b"j1", nfp.ST_CANCELLED, "CANCELLED")
    finish(broker, b"w1", b"busy")
    assert jobs_sent(stub(broker).take()) == []


def test_a_full_queue_answers_busy_with_a_retry_hint(broker: Broker) -> None:
    ready(broker, b"w1", credits=1)
    for i in range(7):  # one runs, five wait (the bound), the seventh is refused
        post(broker, f"j{i}".encode())
    busy = [(u, p) for _, u, st, p in replies(stub(broker).take()) if st == nfp.ST_BUSY]
    assert [u for u, _ in busy] == [b"j6"] and busy[0][1]["retry_after"] >= 1
    assert "full" in busy[0][1]["errors"][0]


def test_a_byte_bound_on_the_queues_answers_busy_too(clock: FakeClock) -> None:
    b = make_broker(clock, broker_queue_bytes=1024)
    ready(b, b"w1", credits=1)
    post(b, b"run")
    body = b'{"task":"echo","kwargs":{"data":"' + b"x" * 600 + b'"}}'
    flags = b'{"push":true,"ack":true,"task":"echo","timeout":10}'
    for u in (b"big1", b"big2"):
        stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", u, body, flags])
    statuses = {u: st for _, u, st, _ in replies(stub(b).take())}
    assert statuses[b"big1"] == nfp.ST_QUEUED and statuses[b"big2"] == nfp.ST_BUSY


def test_unknown_service_and_task_are_refused_at_once(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1", service=b"nope")
    f = nfp.dumps({"push": True, "ack": True, "task": "nope", "timeout": 10})
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j2", b"{}", f])
    answers = {u: (st, p) for _, u, st, p in replies(stub(broker).take())}
    assert answers[b"j1"][0] == nfp.ST_NOT_FOUND and "'nope' is unknown" in answers[b"j1"][1]["errors"][0]
    st, payload = answers[b"j2"]
    assert st == nfp.ST_BAD_REQUEST and "'nope'" in payload["errors"][0] and "echo" in payload["errors"][0]


def test_during_the_startup_grace_an_unknown_service_waits_then_is_refused(clock: FakeClock) -> None:
    b = make_broker(clock, startup_grace=5, keepalive_multiplier=10)
    post(b, b"j1", service=b"typo")
    post(b, b"j2", service=b"demo")
    assert replies(stub(b).take()) == []  # no answer yet: its workers may be on their way back
    ready(b, b"w1")  # demo comes back
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"j2"]
    clock.advance(5.01)
    stub(b).tick()
    ((_, uuid, status, payload),) = replies(stub(b).take())
    assert (uuid, status) == (b"j1", nfp.ST_NOT_FOUND) and "typo" in payload["errors"][0]


def test_a_client_that_vouches_for_a_service_is_queued_after_a_restart(broker: Broker, clock: FakeClock) -> None:
    settled(broker, clock)
    post(broker, b"j1", service=b"later", known=True)
    assert [st for _, _, st, _ in replies(stub(broker).take())] == [nfp.ST_QUEUED]


def test_bad_flags_are_refused_with_the_field_named(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1", priority=12)
    post(broker, b"j2", delay=-1)
    post(broker, b"j3", target=b"[not json")
    answers = {u: (st, p["errors"][0]) for _, u, st, p in replies(stub(broker).take())}
    assert answers[b"j1"][0] == nfp.ST_BAD_REQUEST and "priority" in answers[b"j1"][1]
    assert answers[b"j2"][0] == nfp.ST_BAD_REQUEST and "delay" in answers[b"j2"][1]
    assert answers[b"j3"][0] == nfp.ST_BAD_REQUEST and "bad target" in answers[b"j3"][1]


def test_a_named_target_goes_to_that_worker_and_waits_for_its_credit(broker: Broker) -> None:
    ready(broker, b"w1", credits=1)
    ready(broker, b"w2", credits=1)
    post(broker, b"a", target=b"w1")
    post(broker, b"b", target=b"w1")
    sent = stub(broker).take()
    assert [(w, u) for w, _, u in jobs_sent(sent)] == [(b"w1", b"a")]  # b waits for w1, not for w2
    assert [(u, p["workers"]) for _, u, st, p in replies(sent) if st == nfp.ST_DISPATCHED] == [
        (b"a", ["w1"]),
        (b"b", ["w1"]),
    ]
    finish(broker, b"w1", b"a")
    assert [(w, u) for w, _, u in jobs_sent(stub(broker).take())] == [(b"w1", b"b")]


def test_all_goes_to_every_live_worker(broker: Broker) -> None:
    ready(broker, b"w1")
    ready(broker, b"w2")
    post(broker, b"j1", target=b"all")
    sent = stub(broker).take()
    assert sorted(w for w, _, _ in jobs_sent(sent)) == [b"w1", b"w2"]
    ((_, _, _, payload),) = [r for r in replies(sent) if r[2] == nfp.ST_DISPATCHED]
    assert sorted(payload["workers"]) == ["w1", "w2"]


def test_a_name_never_registered_is_refused(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1", target=b"ghost")
    ((_, _, status, payload),) = replies(stub(broker).take())
    assert status == nfp.ST_NOT_FOUND and "ghost" in payload["errors"][0]


def test_a_worker_busy_answer_frees_its_credit_and_the_job_goes_back_to_the_queue(broker: Broker) -> None:
    ready(broker, b"w1", credits=2)
    ready(broker, b"w2", credits=2)
    post(broker, b"j1")
    ((worker, _, _),) = jobs_sent(stub(broker).take())
    busy = nfp.dumps({"worker": worker.decode(), "status": "BUSY", "errors": ["full"]})
    stub(broker).feed([worker, b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_BUSY, busy])
    sent = stub(broker).take()
    assert [st for _, _, st, _ in replies(sent)] == [nfp.ST_DISPATCHED]  # not the 503: it runs elsewhere
    assert [u for _, _, u in jobs_sent(sent)] == [b"j1"]
    assert broker.registry.workers[worker].inflight == {}


def test_a_final_result_is_forwarded_to_a_push_client_and_frees_the_credit(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1")
    stub(broker).take()
    finish(broker, b"w1", b"j1")
    ((cmd, _, status, payload),) = replies(stub(broker).take())
    assert (cmd, status, payload["w1"]["result"]) == (nfp.RESPONSE, nfp.ST_OK, 1)
    assert broker.registry.workers[b"w1"].inflight == {} and b"j1" not in broker.registry.routes


def test_a_large_body_and_its_result_pass_through_the_broker_as_the_frames_received(broker: Broker) -> None:
    # the wire gives a frame of 64 KiB or more as a view onto ZeroMQ's buffer; the broker queues
    # and forwards that same view (zero-copy), it never copies or parses a body it routes
    body = memoryview(bytearray(b'{"task":"echo","args":["' + b"x" * 100_000 + b'"],"kwargs":{}}'))
    flags = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10})
    ready(broker, b"w1", credits=1)
    post(broker, b"j0")  # takes the only credit
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j1", body, flags])
    assert broker.dispatch.queued_bytes == len(body)  # queued, counted by its length
    stub(broker).take()
    finish(broker, b"w1", b"j0")
    (job,) = [f for f in stub(broker).take() if f[0] == b"w1" and f[3] == nfp.POST]
    result = memoryview(bytearray(nfp.dumps({"w1": {"result": "x" * 100_000, "failed": False}})))
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, result])
    (reply,) = [f for f in stub(broker).take() if f[0] == b"c1" and f[3] == nfp.RESPONSE and f[6] == nfp.ST_OK]

    assert job[7] is body
    assert reply[7] is result


def test_a_job_its_worker_started_holds_no_body_in_the_broker_and_its_201_and_result_still_pass(
    broker: Broker,
) -> None:
    # Until the 201 the body is kept: a busy answer puts the job back in the queue, to go again.
    ready(broker, b"w1", credits=2)
    body = nfp.dumps({"task": "echo", "args": ["x" * 100_000], "kwargs": {}})
    flags = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10})
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"j1", body, flags])
    stub(broker).take()
    route = broker.registry.routes[b"j1"]
    assert route.job is not None and route.job.body == body
    accepted = nfp.dumps({"worker": "w1", "status": "ACCEPTED"})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_WORKER_ACCEPTED, accepted])
    assert [st for _, _, st, _ in replies(stub(broker).take())] == [nfp.ST_WORKER_ACCEPTED]
    assert route.job is not None and route.job.body == b"" and route.job.client == b"c1"
    assert broker.dispatch.queued_bytes == 0
    finish(broker, b"w1", b"j1")
    assert [st for _, _, st, _ in replies(stub(broker).take())] == [nfp.ST_OK]
    assert b"j1" not in broker.registry.routes and broker.registry.workers[b"w1"].inflight == {}


def big_post(b: Broker, uuid: bytes, target: bytes = b"any", **flags: Any) -> bytes:
    body = b'{"task":"echo","kwargs":{"data":"' + b"x" * 600 + b'"}}'
    f = nfp.dumps({"push": True, "ack": True, "task": "echo", "timeout": 10, **flags})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", target, uuid, body, f])
    return body


def accepted(b: Broker, ident: bytes, uuid: bytes) -> None:
    payload = nfp.dumps({"worker": ident.decode(), "status": "ACCEPTED"})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", uuid, nfp.ST_WORKER_ACCEPTED, payload])


def test_bodies_kept_for_dispatched_jobs_count_against_the_byte_bound_until_they_start(clock: FakeClock) -> None:
    # Given a worker with room for three jobs and a broker that may hold 1 KiB of bodies
    b = make_broker(clock, broker_queue_bytes=1024)
    ready(b, b"w1", credits=3)
    body = big_post(b, b"big1")
    assert b.registry.held_bytes == len(body)
    assert b.mmi.run("show_broker", {})["dispatched_bytes"] == len(body)
    # When a second one comes while the first's body is still kept (no 201 yet)
    big_post(b, b"big2")
    # Then it is refused busy, though a credit is free: the broker would hold 1,200 bytes
    statuses = {u: (st, p) for _, u, st, p in replies(stub(b).take())}
    assert statuses[b"big1"][0] == nfp.ST_DISPATCHED
    assert statuses[b"big2"][0] == nfp.ST_BUSY and "dispatched" in statuses[b"big2"][1]["errors"][0]
    # Once the first has started its body is let go, and the next job goes at once
    accepted(b, b"w1", b"big1")
    assert b.registry.held_bytes == 0
    body3 = big_post(b, b"big3")
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"big3"]
    assert b.registry.held_bytes == len(body3)
    # A result ends the route and what it kept (a results-only job sends no 201)
    finish(b, b"w1", b"big3")
    assert b.registry.held_bytes == 0 and b.mmi.run("show_broker", {})["dispatched_bytes"] == 0


@pytest.mark.parametrize("ending", ["purged", "expired", "cancelled", "busy", "fan-out done"])
def test_every_way_a_dispatched_job_leaves_lets_its_body_go(broker: Broker, clock: FakeClock, ending: str) -> None:
    ready(broker, b"w1", credits=1)
    ready(broker, b"w2", credits=1)
    if ending == "cancelled":  # w1 is full, so j1's part for it waits in the broker until cancelled
        post(broker, b"j0", target=b"w1")
        before = broker.registry.held_bytes
        big_post(broker, b"j1", target=b"w1", timeout=2)
        assert broker.registry.held_bytes > before
        stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.DELETE, b"demo", b"any", b"j1", b"{}"])
        assert b"j1" not in broker.registry.routes and broker.registry.held_bytes == before
        return
    big_post(broker, b"j1", target=b"all" if ending == "fan-out done" else b"any", timeout=2)
    assert broker.registry.held_bytes > 0
    if ending == "purged":
        clock.advance(INTERVAL * MULTIPLIER + 0.01)
        stub(broker).tick()
    elif ending == "expired":
        clock.advance(2 + 1.0 + 0.01)
        stub(broker).tick()
    elif ending == "busy":  # back in the queue: counted there, not twice
        ((worker, _, _),) = jobs_sent(stub(broker).take())
        other = b"w2" if worker == b"w1" else b"w1"
        big_post(broker, b"j2", target=other)  # the other worker is full: j1 must wait for a credit
        size = broker.registry.held_bytes // 2
        busy = nfp.dumps({"worker": worker.decode(), "status": "BUSY", "errors": ["full"]})
        stub(broker).feed([worker, b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_BUSY, busy])
        assert broker.dispatch.queued_bytes == size and broker.registry.held_bytes == size
        return
    else:
        finish(broker, b"w1", b"j1")
        assert broker.registry.held_bytes > 0  # w2 still owes its part
        finish(broker, b"w2", b"j1")
    assert b"j1" not in broker.registry.routes
    assert broker.registry.held_bytes == 0


def test_a_busy_answer_after_its_201_cannot_requeue_a_job_whose_body_is_gone(broker: Broker) -> None:
    # A worker that says busy after it started the job breaks the protocol: the broker holds no
    # body to send elsewhere, so the 503 goes to the client instead of an empty job to a worker.
    ready(broker, b"w1", credits=2)
    ready(broker, b"w2", credits=2)
    post(broker, b"j1")
    ((worker, _, _),) = jobs_sent(stub(broker).take())
    accepted(broker, worker, b"j1")
    stub(broker).take()
    busy = nfp.dumps({"worker": worker.decode(), "status": "BUSY", "errors": ["full"]})
    stub(broker).feed([worker, b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_BUSY, busy])
    sent = stub(broker).take()
    assert jobs_sent(sent) == []
    assert [st for _, _, st, _ in replies(sent)] == [nfp.ST_BUSY]


def test_a_dispatched_job_unanswered_past_its_deadline_frees_the_slot_and_says_so(
    broker: Broker, clock: FakeClock
) -> None:
    ready(broker, b"w1", credits=1)
    post(broker, b"j1", timeout=2)
    stub(broker).take()
    clock.advance(2 + 1.0 + 0.01)  # the deadline, then the route grace
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    stub(broker).tick()
    ((_, _, status, payload),) = replies(stub(broker).take())
    assert status == nfp.ST_EXPIRED and payload["worker"] == "w1" and "unknown" in payload["errors"][0]
    assert broker.registry.workers[b"w1"].inflight == {}


def test_a_retried_post_of_a_finished_job_goes_back_to_its_worker(broker: Broker) -> None:
    ready(broker, b"w1")
    ready(broker, b"w2")
    post(broker, b"j1")
    ((worker, _, _),) = jobs_sent(stub(broker).take())
    finish(broker, worker, b"j1")
    stub(broker).take()
    post(broker, b"j1")
    assert [w for w, _, _ in jobs_sent(stub(broker).take())] == [worker]
    assert broker.counts["post_retried"] == 1


def test_a_repeated_post_of_a_queued_job_is_not_queued_twice(broker: Broker, clock: FakeClock) -> None:
    settled(broker, clock)
    post(broker, b"j1", service=b"later", known=True)
    post(broker, b"j1", service=b"later", known=True)
    assert [st for _, _, st, _ in replies(stub(broker).take())] == [nfp.ST_QUEUED, nfp.ST_QUEUED]
    assert broker.registry.services[b"later"].queue.depth == 1


def test_a_silent_worker_is_purged_told_why_and_its_clients_told_at_once(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1")
    post(broker, b"j1")
    stub(broker).take()
    clock.advance(INTERVAL * MULTIPLIER + 0.01)
    stub(broker).tick()
    sent = stub(broker).take()
    ((_, _, status, payload),) = replies(sent)
    assert status == nfp.ST_WORKER_LOST and payload["worker"] == "w1" and "keepalives expired" in payload["errors"][0]
    (bye,) = [f for f in sent if f[0] == b"w1"]
    assert bye[3] == nfp.DISCONNECT and json.loads(bye[5]) == {"reason": "purged"}
    assert b"w1" not in broker.registry.workers and broker.registry.services[b"demo"].purged == 1


def test_a_purged_worker_heard_again_is_told_again_that_it_was_purged(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1")
    stub(broker).take()
    clock.advance(INTERVAL * MULTIPLIER + 0.01)
    stub(broker).tick()
    stub(broker).take()  # the first DISCONNECT (purged); say its connection was reset meanwhile
    # Its keepalive within the interval gets nothing more; later ones hear the same reason, so
    # it still drops the jobs the broker gave up instead of running them
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    assert stub(broker).take() == []
    clock.advance(INTERVAL)
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    (bye,) = [f for f in stub(broker).take() if f[0] == b"w1"]
    assert bye[3] == nfp.DISCONNECT and json.loads(bye[5]) == {"reason": "purged"}


def announce_ready(b: Broker, ident: bytes, name: str, **extra: Any) -> None:
    ann = nfp.dumps({"v": 2, "name": name, "credits": 2, "tasks": TASKS, **extra})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.READY, b"demo", ann])


def test_a_second_worker_under_a_live_workers_name_is_refused_and_the_first_keeps_its_jobs(broker: Broker) -> None:
    announce_ready(broker, b"w1~aaaa", "w1", hostname="host-a", pid=101)
    post(broker, b"j1")
    stub(broker).take()
    announce_ready(broker, b"w1~bbbb", "w1", hostname="host-b", pid=202)
    sent = stub(broker).take()
    assert replies(sent) == []  # no job was reported lost
    (bye,) = [f for f in sent if f[0] == b"w1~bbbb"]
    why = json.loads(bye[5])
    assert bye[3] == nfp.DISCONNECT and why["reason"] == "name_taken" and why["retry_after"] > 0
    assert why["detail"].startswith("a worker named w1 is already connected from host-a (pid 101)")
    assert why["detail"].endswith("choose another --name")
    # the holder was probed (a keepalive), not told to leave, and keeps its name and its job
    assert [f[3] for f in sent if f[0] == b"w1~aaaa"] == [nfp.KEEPALIVE]
    holder = broker.registry.by_name[b"w1"]
    assert holder.ident == b"w1~aaaa" and b"j1" in holder.inflight and b"w1~bbbb" not in broker.registry.workers
    assert broker.counts["worker_name_taken"] == 1 and broker.counts["worker_replaced"] == 0
    finish(broker, b"w1~aaaa", b"j1", name="w1")
    assert [st for _, _, st, _ in replies(stub(broker).take())] == [nfp.ST_OK]


def test_a_rival_that_keeps_trying_is_refused_each_time_and_logged_once_per_hundred(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    announce_ready(broker, b"w1~aaaa", "w1")
    stub(broker).take()
    with caplog.at_level("WARNING", logger="zfab.broker.workers"):
        for i in range(150):
            announce_ready(broker, f"w1~{i:04x}".encode(), "w1")
    assert broker.counts["worker_name_taken"] == 150
    assert len([r for r in caplog.records if "refused a worker named w1" in r.getMessage()]) == 2  # 1st, 100th
    assert broker.registry.by_name[b"w1"].ident == b"w1~aaaa"


def test_a_worker_restarted_after_a_crash_takes_its_name_back_at_once(broker: Broker) -> None:
    announce_ready(broker, b"w1~aaaa", "w1")
    post(broker, b"j1")
    stub(broker).take()
    stub(broker).gone.add(b"w1~aaaa")  # killed: libzmq closed its connection, a send there fails
    announce_ready(broker, b"w1~bbbb", "w1")
    sent = stub(broker).take()
    ((_, _, status, payload),) = replies(sent)
    assert status == nfp.ST_WORKER_LOST and "is gone" in payload["errors"][0]
    assert broker.registry.by_name[b"w1"].ident == b"w1~bbbb" and b"w1~aaaa" not in broker.registry.workers
    assert not [f for f in sent if f[0] == b"w1~bbbb" and f[3] == nfp.DISCONNECT]
    assert broker.counts["worker_replaced"] == 1 and broker.counts["worker_name_taken"] == 0


def test_a_holder_silent_past_the_bound_gives_its_name_to_a_new_connection(broker: Broker, clock: FakeClock) -> None:
    announce_ready(broker, b"w1~aaaa", "w1")
    stub(broker).take()
    clock.advance(broker.registry.silence_bound - 0.1)
    announce_ready(broker, b"w1~bbbb", "w1")  # heard recently enough: refused
    assert broker.registry.by_name[b"w1"].ident == b"w1~aaaa"
    clock.advance(0.2)  # the holder still silent: past the bound (within its hold time)
    assert broker.registry.by_name[b"w1"].keepalive.is_alive()
    announce_ready(broker, b"w1~cccc", "w1")
    sent = stub(broker).take()
    assert broker.registry.by_name[b"w1"].ident == b"w1~cccc"
    (bye,) = [f for f in sent if f[0] == b"w1~aaaa" and f[3] == nfp.DISCONNECT]
    assert json.loads(bye[5]) == {"reason": "replaced"}  # it drops what it had not started


def test_a_worker_that_reconnects_names_its_previous_connection_and_takes_its_name_back(broker: Broker) -> None:
    announce_ready(broker, b"w1~aaaa", "w1")
    stub(broker).take()
    announce_ready(broker, b"w1~bbbb", "w1", previous="w1~zzzz")  # not the holder's: refused
    assert broker.registry.by_name[b"w1"].ident == b"w1~aaaa"
    stub(broker).take()
    announce_ready(broker, b"w1~cccc", "w1", previous="w1~aaaa")
    assert broker.registry.by_name[b"w1"].ident == b"w1~cccc" and broker.counts["worker_replaced"] == 1
    assert not [f for f in stub(broker).take() if f[0] == b"w1~aaaa"]  # it closed that socket: nothing sent there


def test_under_curve_only_the_holders_key_may_say_it_was_the_previous_connection(clock: FakeClock) -> None:
    b = make_broker(clock)
    # every key may be w1 (and register any service)
    b.identities.zap = type("Zap", (), {"may_register": staticmethod(lambda name, user, *_: True), "grants": {}})()
    ann = nfp.dumps({"v": 2, "name": "w1", "credits": 2, "tasks": TASKS})
    stub(b).feed([b"w1~aaaa", b"", nfp.WORKER, nfp.READY, b"demo", ann], user_id=b"key-a")
    other = nfp.dumps({"v": 2, "name": "w1", "credits": 2, "tasks": TASKS, "previous": "w1~aaaa"})
    stub(b).feed([b"w1~bbbb", b"", nfp.WORKER, nfp.READY, b"demo", other], user_id=b"key-b")
    assert b.registry.by_name[b"w1"].ident == b"w1~aaaa" and b.counts["worker_name_taken"] == 1
    stub(b).feed([b"w1~cccc", b"", nfp.WORKER, nfp.READY, b"demo", other], user_id=b"key-a")
    assert b.registry.by_name[b"w1"].ident == b"w1~cccc"


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


def test_a_thousand_workers_fall_into_one_keepalive_wave(clock: FakeClock) -> None:
    """Workers that joined at scattered moments fall into one keepalive wave within two passes:
    the broker's timer wakes once per interval, every worker still gets a keepalive at least
    once per interval, and none is purged while it answers."""
    b = make_broker(clock)
    for i in range(1000):
        clock.advance(INTERVAL / 1000)
        ready(b, f"w{i}".encode())
    stub(b).take()
    wakeups = 0
    end = clock() + 10 * INTERVAL
    while clock() < end:
        deadline = stub(b).tick()
        wakeups += 1
        for f in stub(b).take():
            if f[3] == nfp.KEEPALIVE:
                stub(b).feed([f[0], b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
        assert deadline is not None and deadline > clock()
        clock.advance(deadline - clock())
    assert len(b.registry.workers) == 1000
    sent = [w.keepalive.sent for w in b.registry.workers.values()]
    assert min(sent) >= 10 and max(sent) <= 11  # one per interval, and one early during the merge
    assert len({w.keepalive.next_due for w in b.registry.workers.values()}) == 1  # one wave
    assert wakeups <= 10 + 2  # a pass per interval, and one more while the joins merged, not 1,000


def test_a_client_keepalive_is_answered_with_the_brokers_incarnation(broker: Broker) -> None:
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""])
    ((answer,),) = [[f] for f in stub(broker).take()]
    host = {"host": broker.shm.host} if broker.shm.host else {}  # its shared-memory host id, when it has one
    limit = {"max": broker.settings.max_message_bytes}  # its message limit: a client refuses what is over it
    bundle = {"bundle": 1}  # it reads bundles (transport/bundle.py): the client may send it several messages as one
    assert answer[3] == nfp.KEEPALIVE and json.loads(answer[7]) == {"boot": broker.boot, **limit, **host, **bundle}


def client_ka(b: Broker, ident: bytes = b"c1") -> None:
    stub(b).feed([ident, b"", nfp.CLIENT, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""])


def keepalives_to(frames: list[list[bytes]]) -> list[bytes]:
    return [f[0] for f in frames if f[3] == nfp.KEEPALIVE]


def test_clients_that_keep_alive_share_the_workers_wave_and_their_answers_get_no_answer(
    broker: Broker, clock: FakeClock
) -> None:
    ready(broker, b"w1")  # its keepalive is due at +1.0
    clock.advance(0.3)
    client_ka(broker)  # answered at once; the client's next is due at +1.3
    assert keepalives_to(stub(broker).take()) == [b"c1"]

    # The wave at +1.0 takes the client too: it is due within half an interval
    clock.advance(0.7)
    stub(broker).tick()
    wave = stub(broker).take()
    assert sorted(keepalives_to(wave)) == [b"c1", b"w1"]
    (to_client,) = [f for f in wave if f[0] == b"c1"]
    assert to_client[2:5] == [nfp.BROKER, nfp.KEEPALIVE, nfp.MMI_SERVICE]
    assert json.loads(to_client[7])["boot"] == broker.boot

    # The client's answer, at once, is not answered again (no ping-pong)
    clock.advance(0.001)
    client_ka(broker)
    assert stub(broker).take() == []
    # but a keepalive of its own, more than half an interval after the wave, is
    clock.advance(0.6)
    client_ka(broker)
    assert keepalives_to(stub(broker).take()) == [b"c1"]
    assert broker.mmi.show_broker()["client_keepalives"] == 1


def test_a_client_gone_quiet_or_unroutable_leaves_the_keepalive_table(broker: Broker, clock: FakeClock) -> None:
    client_ka(broker, b"quiet")
    stub(broker).take()
    # Not heard for a hold time: the waves to it stop, and it leaves the table
    for _ in range(int(MULTIPLIER / INTERVAL * 2) + 1):
        clock.advance(INTERVAL / 2)
        stub(broker).tick()
    assert b"quiet" not in broker.registry.client_keepalives
    stub(broker).take()
    clock.advance(INTERVAL)
    stub(broker).tick()
    assert stub(broker).take() == []

    # One whose keepalive cannot be sent (gone: unroutable) leaves at once
    client_ka(broker, b"gone")
    stub(broker).take()
    stub(broker).full = True
    clock.advance(INTERVAL)
    stub(broker).tick()
    assert b"gone" not in broker.registry.client_keepalives


def test_a_closing_client_leaves_the_keepalive_table_and_gets_no_more_waves(broker: Broker, clock: FakeClock) -> None:
    client_ka(broker)
    stub(broker).take()
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.DISCONNECT, nfp.MMI_SERVICE, b"", b"", b""])
    assert b"c1" not in broker.registry.client_keepalives and stub(broker).take() == []
    clock.advance(INTERVAL)
    stub(broker).tick()
    assert stub(broker).take() == [] and broker.loop.stats.send_dropped == 0


def test_the_client_keepalive_table_is_bounded_by_max_clients(clock: FakeClock) -> None:
    b = make_broker(clock, max_clients=2)
    for ident in (b"c1", b"c2", b"c3"):
        client_ka(b, ident)
    assert list(b.registry.client_keepalives) == [b"c2", b"c3"]  # the least recently heard went
    shown = b.mmi.show_broker()
    assert (shown["client_keepalives"], shown["client_keepalives_capacity"]) == (2, 2)


def test_an_unknown_worker_is_told_to_reregister_once_per_interval(broker: Broker, clock: FakeClock) -> None:
    for _ in range(3):
        stub(broker).feed([b"ghost", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    assert [f[3] for f in stub(broker).take()] == [nfp.DISCONNECT]
    clock.advance(INTERVAL)
    stub(broker).feed([b"ghost", b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
    assert [f[3] for f in stub(broker).take()] == [nfp.DISCONNECT]


def test_services_named_by_peers_are_bounded(clock: FakeClock) -> None:
    b = make_broker(clock, max_services=3)
    for i in range(10):
        ready(b, f"w{i}".encode(), service=f"svc{i}".encode())
        stub(b).feed([f"w{i}".encode(), b"", nfp.WORKER, nfp.DISCONNECT, f"svc{i}".encode()])
    assert len(b.registry.services) == 3  # idle ones make room for new ones


def test_malformed_frames_are_counted_and_dropped(broker: Broker) -> None:
    stub(broker).feed([b"x", b"", b"NOPE01", nfp.POST], [b"x", b"", nfp.CLIENT, b"0x99", b"demo", b"any", b"u", b"{}"])
    assert stub(broker).take() == []
    assert broker.rejected["header"] == 1 and broker.rejected["command"] == 1


def test_mmi_is_answered_as_response_and_as_mmi(broker: Broker) -> None:
    ready(broker, b"w1~x", name="w1")
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", b'{"task":"show_workers"}'])
    answers = replies(stub(broker).take())
    assert [cmd for cmd, _, _, _ in answers] == [nfp.RESPONSE, nfp.MMI]
    rows = answers[0][3]
    assert [r["name"] for r in rows] == ["w1"] and rows[0]["jobs_in_flight"] == 0 and rows[0]["credits"] == 2


def test_mmi_show_services_reports_the_queue(broker: Broker) -> None:
    ready(broker, b"w1", credits=1)
    post(broker, b"busy")
    post(broker, b"j1")
    stub(broker).take()
    (svc,) = broker.mmi.run("show_services", {})
    assert (svc["queue_depth"], svc["queue_capacity"], svc["credits"]) == (1, 5, 1)
    assert svc["queue_bytes"] > 0 and svc["tasks"] == ["echo", "sleep"]
    assert broker.mmi.run("show_tasks", {"service": "demo"})["tasks"] == TASKS


def test_a_bad_mmi_body_gets_a_400_in_both_frames_and_is_counted(broker: Broker) -> None:
    stub(broker).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", b"[1"])
    answers = replies(stub(broker).take())
    # NorFab's NFPClient.mmi() reads only the MMI copy: a refusal comes in it too
    assert [cmd for cmd, *_ in answers] == [nfp.RESPONSE, nfp.MMI]
    for _, _, status, payload in answers:
        assert status == nfp.ST_BAD_REQUEST and payload["errors"]
    assert broker.rejected["json"] == 1


def _trace_of(frames: list[list[bytes]], to: bytes = b"c1") -> bytes | None:
    (f,) = [f for f in frames if f[0] == to and f[3] == nfp.RESPONSE and f[6] == nfp.ST_OK]
    return f[8] if len(f) == 9 else None


def test_a_pushed_final_answer_carries_the_workers_hops_and_the_brokers(broker: Broker, clock: FakeClock) -> None:
    ready(broker, b"w1", credits=1)
    post(broker, b"j1")
    post(broker, b"j2")  # waits for w1's one credit
    stub(broker).take()
    clock.advance(0.5)
    finish(broker, b"w1", b"j1")
    stub(broker).take()
    clock.advance(0.25)
    worker_trace = struct.pack("<3d", 0.01, 0.2, 0.0001)
    result = nfp.dumps({"w1": {"result": 1, "failed": False}})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j2", nfp.ST_OK, result, worker_trace])
    trace = _trace_of(stub(broker).take())
    # j2 waited 0.5 s in the queue for the credit, then 0.25 s for its worker: the broker's clock.
    assert trace is not None and trace[:24] == worker_trace
    assert struct.unpack("<2d", trace[24:]) == pytest.approx((0.5, 0.25))


def test_a_norfab_workers_answer_gets_the_brokers_hops_alone_and_a_long_trace_is_not_forwarded(
    broker: Broker, clock: FakeClock
) -> None:
    ready(broker, b"w1")
    post(broker, b"j1")
    post(broker, b"j2")
    stub(broker).take()
    clock.advance(0.1)
    finish(broker, b"w1", b"j1")  # no trace frame: a NorFab worker's answer
    assert struct.unpack("<2d", _trace_of(stub(broker).take()) or b"") == pytest.approx((0.0, 0.1))
    result = nfp.dumps({"w1": {"result": 1, "failed": False}})
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j2", nfp.ST_OK, result, b"x" * 300])
    assert struct.unpack("<2d", _trace_of(stub(broker).take()) or b"") == pytest.approx((0.0, 0.1))


def test_with_hop_traces_off_the_broker_adds_no_frame(clock: FakeClock) -> None:
    b = make_broker(clock, hop_traces=False)
    ready(b, b"w1")
    post(b, b"j1")
    stub(b).take()
    finish(b, b"w1", b"j1")
    assert _trace_of(stub(b).take()) is None


def test_a_trace_frame_on_an_event_is_malformed(broker: Broker) -> None:
    ready(broker, b"w1")
    post(broker, b"j1")
    stub(broker).take()
    stub(broker).feed([b"w1", b"", nfp.WORKER, nfp.EVENT, b"c1", b"", b"j1", nfp.ST_OK, b"{}", b"run=1"])
    assert broker.rejected["frame_count"] == 1
