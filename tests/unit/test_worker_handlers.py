"""The worker's admission and answers on the stub transport: POST, GET, DELETE, PUT. No sockets.

The pool and the job store are real (threads, SQLite in a temporary folder): what the stub
replaces is the socket and the broker behind it.
"""

from __future__ import annotations

import itertools
import json
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zfab import Job, Settings, task
from zfab.core import hoptrace
from zfab.core import protocol as nfp
from zfab.transport import FakeClock, StubLoop, StubTransport
from zfab.worker import journal
from zfab.worker.notices import STARTED_NOTICE_DELAY
from zfab.workers.demo import AsyncDemoWorker, DemoWorker

Frames = list[bytes]
PAUSE = threading.Event()  # never set: waits below are bounded polls with a deadline


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def worker(tmp_path: Path, clock: FakeClock) -> Iterator[DemoWorker]:
    s = Settings(data_dir=str(tmp_path), keepalive_interval=1.0, keepalive_multiplier=3, pool_size=1, job_queue_size=2)
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock)
    w.start()
    yield w
    w.stop(drain=0)


def stub(w: DemoWorker) -> StubLoop:
    assert isinstance(w.loop, StubLoop)
    return w.loop


def job(w: DemoWorker, command: bytes, uuid: bytes, body: Any = b"{}") -> None:
    raw = body if isinstance(body, bytes) else nfp.dumps(body)
    stub(w).feed([b"", nfp.BROKER, command, b"c1", b"", uuid, raw])


def answers(frames: list[Frames]) -> list[tuple[bytes, bytes, bytes, Any]]:
    """(command, uuid, status, payload) of the worker's replies."""
    out = []
    for f in frames:
        if f[1] == nfp.WORKER and len(f) in (8, 9):  # 9: a final answer's hop trace
            out.append((f[2], f[5], f[6], json.loads(f[7])))
    return out


def collect(w: DemoWorker, until: Callable[[list[Any]], bool], timeout: float = 5.0) -> list[Any]:
    """The worker's replies, gathered until `until` holds for them (or fail at the deadline)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while True:
        got += answers(stub(w).take())
        if until(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"replies so far: {got}")
        PAUSE.wait(0.005)


def final(uuid: bytes) -> Callable[[list[Any]], bool]:
    return lambda got: any(c == nfp.RESPONSE and u == uuid and st in nfp.FINAL_STATUSES for c, u, st, _ in got)


def test_ready_is_the_first_frame_and_keepalives_follow_each_interval(worker: DemoWorker, clock: FakeClock) -> None:
    first = stub(worker).take()
    assert first[0][1:4] == [nfp.WORKER, nfp.READY, b"demo"]
    announce = json.loads(first[0][4])
    # credits: pool 1, and the adaptive prefetch starts at 0
    assert announce["name"] == "w1" and announce["v"] == 2 and announce["credits"] == 1
    assert {"echo", "sleep", "list_tasks"} <= set(announce["tasks"])
    assert announce["tasks"]["add"]["properties"]["a"]["type"] == "number"
    clock.advance(1.0)
    stub(worker).tick()
    (ka,) = stub(worker).take()
    assert ka[2] == nfp.KEEPALIVE and json.loads(ka[4])["pool_size"] == 1


def test_the_brokers_keepalive_is_answered_at_once_and_the_workers_own_clock_yields(
    worker: DemoWorker, clock: FakeClock
) -> None:
    broker_ka = [b"", nfp.BROKER, nfp.KEEPALIVE, b"demo"]
    stub(worker).take()  # READY; our own keepalive is due at +1.0

    # A broker keepalive more than half an interval before ours is not answered
    clock.advance(0.4)
    stub(worker).feed(broker_ka)
    assert stub(worker).take() == []

    # One within half an interval is answered at once, with the worker's stats
    clock.advance(0.2)
    stub(worker).feed(broker_ka)
    (answer,) = stub(worker).take()
    assert answer[2] == nfp.KEEPALIVE and json.loads(answer[4])["pool_size"] == 1

    # and the worker's own clock waits 1.2 intervals, so the broker's next wave, one interval on,
    # is answered instead of crossing a keepalive of the worker's own
    assert tick_at(worker, clock, 1.0) == pytest.approx(clock() + 0.2)
    assert stub(worker).take() == []
    stub(worker).feed(broker_ka)
    assert [f[2] for f in stub(worker).take()] == [nfp.KEEPALIVE]

    # A broker gone quiet still hears from the worker, on the worker's own clock
    clock.advance(1.2)
    stub(worker).tick()
    assert [f[2] for f in stub(worker).take()] == [nfp.KEEPALIVE]


def test_a_running_job_is_acknowledged_once_stored_and_started_then_answered(
    worker: DemoWorker, clock: FakeClock
) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"slow", {"task": "sleep", "kwargs": {"seconds": 0.3}})
    wait(lambda: worker.runner.notices.waiting() == 1)  # stored and started: its 201 is held
    stats = worker.stats()  # a bounded table, shown (zfab_queue_depth{hop="worker_started_notices"})
    assert stats["started_notices_waiting"] == 1 and stats["started_notices_capacity"] >= 3
    assert tick_at(worker, clock, STARTED_NOTICE_DELAY / 2) is not None  # not due yet: the timer is set
    assert not [a for a in answers(stub(worker).take()) if a[2] == nfp.ST_WORKER_ACCEPTED]
    tick_at(worker, clock, STARTED_NOTICE_DELAY / 2)
    got = collect(worker, final(b"slow"))
    assert [st for c, u, st, _ in got if c == nfp.RESPONSE] == [nfp.ST_WORKER_ACCEPTED, nfp.ST_OK]
    (ack,) = [p for c, u, st, p in got if st == nfp.ST_WORKER_ACCEPTED]
    assert ack["status"] == "ACCEPTED" and ack["worker"] == "w1"


def test_a_job_done_before_its_201_is_due_gets_no_201(worker: DemoWorker, clock: FakeClock) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"quick", {"task": "echo", "kwargs": {"data": 1}})
    got = collect(worker, final(b"quick"))
    wait(lambda: worker.runner.notices.waiting() == 1 or worker.store.commits > 0)
    tick_at(worker, clock, STARTED_NOTICE_DELAY)
    got += answers(stub(worker).take())
    assert [st for c, u, st, _ in got if c == nfp.RESPONSE] == [nfp.ST_OK]
    assert worker.runner.notices.waiting() == 0


def test_a_job_that_ended_leaves_no_timer_for_its_201(worker: DemoWorker, clock: FakeClock) -> None:
    # Given a quick job answered before its 201 was due
    stub(worker).take()
    job(worker, nfp.POST, b"brief", {"task": "echo", "kwargs": {"data": 1}})
    collect(worker, final(b"brief"))
    # When the owner next looks at its timers, before that 201 would be due
    nxt = tick_at(worker, clock, 0)
    # Then the ended job's notice is gone and no timer is set for it (an owner woken only to drop it
    # woke in the middle of the next job: once a job, for sequential short jobs)
    assert worker.runner.notices.waiting() == 0
    assert nxt is not None and nxt > clock() + STARTED_NOTICE_DELAY


def tick_at(w: DemoWorker, clock: FakeClock, seconds: float) -> float | None:
    clock.advance(seconds)
    return stub(w).tick()


def wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within the deadline")
        PAUSE.wait(0.005)


def test_a_post_runs_and_its_result_is_sent(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"j1", {"task": "echo", "kwargs": {"data": 7}})
    # A job whose result is out before its insert commits gets no 201: it would say less than the 200.
    got = collect(worker, final(b"j1"))
    (entry,) = [p["w1"] for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK]
    assert entry["result"] == 7 and entry["failed"] is False and entry["juuid"] == "j1"
    assert entry["task"] == "w1:echo" and entry["status"] == "completed"


def test_a_bad_body_and_an_unknown_task_are_refused_at_once(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"bad", b"[not json")
    job(worker, nfp.POST, b"unk", {"task": "nope"})
    got = answers(stub(worker).take())
    by_uuid = {u: (st, p) for _, u, st, p in got}
    assert by_uuid[b"bad"][0] == nfp.ST_BAD_REQUEST and "bad request body" in by_uuid[b"bad"][1]["w1"]["errors"][0]
    st, payload = by_uuid[b"unk"]
    assert st == nfp.ST_BAD_REQUEST and "'nope'" in payload["w1"]["errors"][0] and "echo" in payload["w1"]["errors"][0]


def test_bad_arguments_fail_with_the_field_named(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"j1", {"task": "add", "kwargs": {"a": "x", "b": 1}})
    got = collect(worker, final(b"j1"))
    ((st, payload),) = [(st, p) for c, u, st, p in got if c == nfp.RESPONSE and st in nfp.FINAL_STATUSES]
    assert st == nfp.ST_BAD_REQUEST and "a:" in payload["w1"]["errors"][0]


def test_a_repeated_post_is_answered_with_the_job_not_run_again(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"j1", {"task": "echo", "kwargs": {"data": 1}})
    collect(worker, final(b"j1"))
    job(worker, nfp.POST, b"j1", {"task": "echo", "kwargs": {"data": 1}})
    (again,) = answers(stub(worker).take())
    assert again[2] == nfp.ST_OK and worker.runner.counts["completed"] == 1


def test_a_full_job_queue_answers_busy(worker: DemoWorker) -> None:
    stub(worker).take()
    sleep = {"task": "sleep", "kwargs": {"seconds": 5}}
    job(worker, nfp.POST, b"s0", sleep)
    collect(worker, lambda g: worker.pool.running == 1)
    for i in range(1, 4):  # one thread, a queue of 2: s0 runs, two wait, the fourth is refused
        job(worker, nfp.POST, f"s{i}".encode(), sleep)
    busy = [(u, p) for _, u, st, p in answers(stub(worker).take()) if st == nfp.ST_BUSY]
    assert [u for u, _ in busy] == [b"s3"] and busy[0][1]["errors"] == ["worker job queue is full"]
    assert worker.pool.depth() == 2
    for i in range(3):
        job(worker, nfp.DELETE, f"s{i}".encode())


def test_get_answers_pending_then_the_result_and_404_for_an_unknown_job(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"j1", {"task": "sleep", "kwargs": {"seconds": 0.2}})
    job(worker, nfp.GET, b"j1")
    got = answers(stub(worker).take())
    assert any(u == b"j1" and st == nfp.ST_PENDING for _, u, st, _ in got)
    collect(worker, final(b"j1"))
    job(worker, nfp.GET, b"j1")
    assert [st for c, u, st, _ in answers(stub(worker).take()) if c == nfp.RESPONSE] == [nfp.ST_OK]
    job(worker, nfp.GET, b"ghost")
    got = collect(worker, lambda g: any(u == b"ghost" for _, u, _, _ in g))
    assert [(st, p["status"]) for _, u, st, p in got if u == b"ghost"] == [(nfp.ST_NOT_FOUND, "JOB NOT FOUND")]


def test_delete_ends_a_queued_job_at_once_and_asks_a_running_one_to_stop(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"run", {"task": "sleep", "kwargs": {"seconds": 5}})
    job(worker, nfp.POST, b"wait", {"task": "echo", "kwargs": {"data": 1}})
    collect(worker, lambda g: worker.pool.running == 1)
    job(worker, nfp.DELETE, b"wait")
    job(worker, nfp.DELETE, b"run")
    got = collect(worker, lambda g: final(b"run")(g) and final(b"wait")(g))
    results = {u: p["w1"]["status"] for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK}
    assert results == {b"wait": "cancelled", b"run": "cancelled"}
    words = {u: p["status"] for _, u, st, p in got if st == nfp.ST_DISPATCHED}
    assert words[b"run"] == "CANCELLING" and words[b"wait"] == "failed"
    job(worker, nfp.DELETE, b"ghost")
    assert [st for _, _, st, _ in answers(stub(worker).take())] == [nfp.ST_NOT_FOUND]


def test_a_job_ended_before_it_started_keeps_no_arguments_among_the_recent_jobs(worker: DemoWorker) -> None:
    # The recent-jobs table bounds request and result bytes; decoded arguments are not counted,
    # so a job that never ran must drop them like one that did.
    stub(worker).take()
    job(worker, nfp.POST, b"run", {"task": "sleep", "kwargs": {"seconds": 5}})
    job(worker, nfp.POST, b"wait", {"task": "echo", "kwargs": {"data": "x" * 100_000}})
    collect(worker, lambda g: worker.pool.running == 1)
    queued = worker.jobs.get("wait")
    assert queued is not None and queued.kwargs == {"data": "x" * 100_000}
    job(worker, nfp.DELETE, b"wait")
    collect(worker, final(b"wait"))
    kept = worker.jobs.get("wait")
    assert kept is queued and kept.state.final
    assert kept.args == [] and kept.kwargs == {}
    job(worker, nfp.DELETE, b"run")
    collect(worker, final(b"run"))


def test_put_answers_a_waiting_input_request_and_refuses_a_wrong_one(worker: DemoWorker) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"j1", {"task": "ask", "kwargs": {"question": "name?", "timeout": 5}})
    got = collect(worker, lambda g: any(p.get("event_type") == "input_request" for c, _, _, p in g if c == nfp.EVENT))
    (request,) = [p["extras"]["input_request"] for c, _, _, p in got if p.get("event_type") == "input_request"]
    job(worker, nfp.PUT, b"j1", {"input_id": "wrong", "value": "Ada"})
    job(worker, nfp.PUT, b"j1", {"input_id": request["id"], "value": 3})  # the schema wants a string
    job(worker, nfp.PUT, b"j1", {"input_id": request["id"], "value": "Ada"})
    got = collect(worker, final(b"j1"))
    responses = [p["extras"]["input_response"] for _, _, _, p in got if p.get("event_type") == "input_response"]
    verdicts = [r["accepted"] for r in responses]
    assert verdicts == [False, False, True]
    (entry,) = [p["w1"] for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK]
    assert entry["result"] == {"question": "name?", "answer": "Ada"}


def test_a_malformed_frame_is_counted_and_dropped(worker: DemoWorker) -> None:
    stub(worker).take()
    stub(worker).feed([b"", nfp.BROKER, b"0x99"], [b"junk"])
    assert stub(worker).take() == [] and worker.counts["rejected_frames"] == 2


def test_a_disconnect_from_the_broker_makes_the_worker_register_again(worker: DemoWorker) -> None:
    stub(worker).take()
    stub(worker).feed([b"", nfp.BROKER, nfp.DISCONNECT, b"demo"])
    assert [f[2] for f in stub(worker).take()] == [nfp.READY]
    assert worker.loop.stats.reconnects == 1


@pytest.mark.parametrize("resumed_past_hold_time", [False, True])
def test_jobs_not_started_are_dropped_when_the_broker_says_it_purged_us(
    worker: DemoWorker, clock: FakeClock, resumed_past_hold_time: bool
) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"run", {"task": "sleep", "kwargs": {"seconds": 5}})
    job(worker, nfp.POST, b"wait", {"task": "echo", "kwargs": {"data": 1}})
    collect(worker, lambda g: worker.pool.running == 1)
    if resumed_past_hold_time:
        # Resumed past the hold time with the broker's DISCONNECT (purged) not read yet: the
        # timer comes first, and must not reconnect over it
        tick_at(worker, clock, 3.5)
        assert worker.loop.stats.reconnects == 0
    # The broker gave us up (we were stopped, or cut off): it told the clients, and may have
    # retried the jobs elsewhere. The queued one must not run here too.
    stub(worker).feed([b"", nfp.BROKER, nfp.DISCONNECT, b"demo", b'{"reason":"purged"}'])
    got = collect(worker, final(b"wait"))
    ((entry,),) = [list(p.values()) for c, u, st, p in got if c == nfp.RESPONSE and u == b"wait" and st == nfp.ST_OK]
    assert entry["failed"] is True and "not started" in entry["errors"][0] and entry["result"] is None
    assert worker.runner.counts["dropped"] == 1 and worker.loop.stats.reconnects == 1
    assert worker.runner.task_stats["echo"].outcomes["completed"] == 0
    job(worker, nfp.DELETE, b"run")


@pytest.mark.parametrize("how", ["no answer", "forgotten"])
def test_jobs_not_started_are_dropped_after_a_silence_past_the_hold_time_even_without_the_purge_notice(
    worker: DemoWorker, clock: FakeClock, how: str
) -> None:
    """A partition longer than the hold time: the broker purged us and told the clients, but its notice
    was lost in the cut. The prefetched job must not start when the link heals (issue 39)."""
    stub(worker).take()
    job(worker, nfp.POST, b"run", {"task": "sleep", "kwargs": {"seconds": 5}})
    job(worker, nfp.POST, b"held", {"task": "echo", "kwargs": {"data": 1}})
    collect(worker, lambda g: worker.pool.running == 1)
    tick_at(worker, clock, 3.5)  # silent past the hold time (3 s): one probe
    assert worker.runner.counts["dropped"] == 0
    if how == "no answer":
        tick_at(worker, clock, 0.6)  # the probe unanswered: a reconnect, and what was not started goes
        assert worker.loop.stats.reconnects == 1
    else:
        # The link heals; the broker purged us meanwhile and answers the probe as it answers a stranger
        stub(worker).feed([b"", nfp.BROKER, nfp.DISCONNECT, b"demo"])
    got = collect(worker, final(b"held"))
    ((entry,),) = [list(p.values()) for c, u, st, p in got if c == nfp.RESPONSE and u == b"held" and st == nfp.ST_OK]
    assert entry["failed"] is True and "hold time" in entry["errors"][0] and entry["result"] is None
    assert worker.runner.counts["dropped"] == 1
    # In touch again, the job still does not run here
    stub(worker).feed([b"", nfp.BROKER, nfp.KEEPALIVE, b"demo"])
    assert worker.contact.is_set()
    assert worker.runner.task_stats["echo"].outcomes["completed"] == 0
    job(worker, nfp.DELETE, b"run")


def test_a_broker_restart_within_the_hold_time_drops_nothing(worker: DemoWorker, clock: FakeClock) -> None:
    stub(worker).take()
    job(worker, nfp.POST, b"run", {"task": "sleep", "kwargs": {"seconds": 5}})
    job(worker, nfp.POST, b"held", {"task": "echo", "kwargs": {"data": 1}})
    collect(worker, lambda g: worker.pool.running == 1)
    tick_at(worker, clock, 1.0)
    stub(worker).feed([b"", nfp.BROKER, nfp.DISCONNECT, b"demo"])  # a restarted broker: re-register
    assert worker.runner.counts["dropped"] == 0 and worker.loop.stats.reconnects == 1
    job(worker, nfp.DELETE, b"run")
    got = collect(worker, final(b"held"))
    ((entry,),) = [list(p.values()) for c, u, st, p in got if c == nfp.RESPONSE and u == b"held" and st == nfp.ST_OK]
    assert entry["failed"] is False and entry["result"] == 1


def test_a_worker_past_its_hold_time_asks_the_broker_before_it_reconnects(worker: DemoWorker, clock: FakeClock) -> None:
    stub(worker).take()
    # Stopped past the hold time (3 s): at once on resume it sends one keepalive, no reconnect yet
    assert tick_at(worker, clock, 3.5) == pytest.approx(clock() + 0.5)
    assert [f[2] for f in stub(worker).take()] == [nfp.KEEPALIVE]
    assert worker.loop.stats.reconnects == 0 and not worker.contact.is_set()
    # The broker's answer still in time: in touch again, no reconnect, jobs may start
    stub(worker).feed([b"", nfp.BROKER, nfp.KEEPALIVE, b"demo"])
    stub(worker).take()
    assert worker.contact.is_set()
    tick_at(worker, clock, 0.5)
    assert worker.loop.stats.reconnects == 0
    # Silent past the hold time again and through the probe: then it reconnects (READY)
    tick_at(worker, clock, 3.0)
    stub(worker).take()
    tick_at(worker, clock, 0.5)
    assert worker.loop.stats.reconnects == 1
    assert [f[2] for f in stub(worker).take()] == [nfp.READY]


def test_a_result_over_the_message_limit_becomes_a_failure_that_says_so(tmp_path: Path, clock: FakeClock) -> None:
    s = Settings(data_dir=str(tmp_path), max_message_bytes=4096, pool_size=1)
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock).start()
    try:
        stub(w).take()
        job(w, nfp.POST, b"big", {"task": "echo", "kwargs": {"data": "x" * 3600}})
        got = collect(w, final(b"big"))
        ((entry,),) = [list(p.values()) for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK]
        assert entry["failed"] is True and "over the message limit" in entry["errors"][0]
        assert "4096" in entry["errors"][0]
    finally:
        w.stop(drain=0)


def test_a_payload_over_the_store_bound_is_delivered_but_not_stored_and_a_later_get_says_so(
    tmp_path: Path, clock: FakeClock
) -> None:
    s = Settings(data_dir=str(tmp_path), worker_store_payload_bytes=2000, worker_recent_bytes=0, pool_size=1)
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock).start()
    try:
        stub(w).take()
        job(w, nfp.POST, b"big", {"task": "echo", "kwargs": {"data": "x" * 3000}})
        got = collect(w, final(b"big"))
        ((entry,),) = [list(p.values()) for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK]
        assert entry["result"] == "x" * 3000 and entry["failed"] is False  # delivered whole
        big = w.jobs.get("big")
        assert big is not None and big.request == b""  # a body it will never write is not kept either
        assert w.stats()["payloads_not_stored"] == 2  # its body and its result, once each
        job(w, nfp.POST, b"small", {"task": "echo", "kwargs": {"data": "y"}})  # pushes `big` out of memory
        collect(w, final(b"small"))
        job(w, nfp.POST, b"small2", {"task": "echo", "kwargs": {"data": "z"}})  # and `small` too
        collect(w, final(b"small2"))
        assert w.jobs.get("big") is None and w.jobs.get("small") is None
        job(w, nfp.GET, b"big")
        job(w, nfp.GET, b"small")
        got = collect(w, lambda g: {u for c, u, _, _ in g if c == nfp.RESPONSE} >= {b"big", b"small"})
        by_uuid = {u: (st, p) for c, u, st, p in got if c == nfp.RESPONSE}
        st, p = by_uuid[b"big"]
        assert st == nfp.ST_NOT_FOUND and p["status"] == "RESULT NOT KEPT" and p["bytes"] > 3000
        assert "ZFAB_WORKER_STORE_PAYLOAD_BYTES" in p["errors"][0]
        st, p = by_uuid[b"small"]
        assert st == nfp.ST_OK and p["w1"]["result"] == "y"  # small ones come back from the store
        assert w.stats()["payloads_not_stored"] == 2  # the request body and the result of `big`
    finally:
        w.stop(drain=0)


def test_the_brokers_meta_frame_shortens_the_deadline_by_the_time_queued(worker: DemoWorker) -> None:
    stub(worker).take()
    body = nfp.dumps({"task": "sleep", "kwargs": {"seconds": 2}, "timeout": 60})
    stub(worker).feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", b"j1", body, b'{"deadline":0.2,"queued":59.8}'])
    got = collect(worker, final(b"j1"))
    ((entry,),) = [list(p.values()) for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK]
    assert entry["status"] == "timeout"
    assert worker.runner.task_stats["sleep"].outcomes["expired"] == 1
    assert worker.runner.task_stats["sleep"].wait.count == 1 and worker.runner.task_stats["sleep"].wait.total >= 59.8


def test_a_job_from_a_zfab_broker_ends_with_its_hop_trace_and_one_from_norfab_without(worker: DemoWorker) -> None:
    stub(worker).take()
    body = nfp.dumps({"task": "sleep", "kwargs": {"seconds": 0.05}, "timeout": 60})
    t0 = time.monotonic()
    stub(worker).feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", b"j1", body, b'{"deadline":60,"queued":0}'])
    stub(worker).feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", b"j2", body])  # NorFab's broker: no meta
    frames: list[Frames] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        frames += stub(worker).take()
        finals = {f[5]: f for f in frames if f[2] == nfp.RESPONSE and f[6] == nfp.ST_OK}
        if len(finals) == 2:
            break
        time.sleep(0.01)
    assert len(finals[b"j1"]) == 9 and len(finals[b"j2"]) == 8
    # its three durations, then its outcome as data (one byte: the broker need not read the result)
    assert len(finals[b"j1"][8]) == hoptrace.WORKER_BYTES + 1 and hoptrace.outcome_of(finals[b"j1"][8]) == "completed"
    worker_queue, run, worker_result = struct.unpack_from("<3d", finals[b"j1"][8])
    # The task slept 0.05 s; its hops are no more than the whole the test saw (an order, not a time window)
    took = time.monotonic() - t0
    assert run >= 0.05 and worker_queue >= 0 and worker_result >= 0 and worker_queue + run + worker_result <= took


@pytest.fixture
def aworker(tmp_path: Path, clock: FakeClock) -> Iterator[AsyncDemoWorker]:
    s = Settings(data_dir=str(tmp_path / "a"), keepalive_interval=1.0, pool_size=1, job_queue_size=100)
    w = AsyncDemoWorker(name="a1", settings=s, transport=StubTransport(clock), clock=clock)
    w.start()
    yield w
    w.stop(drain=0)


def test_an_async_task_runs_on_the_event_loop_many_at_once(aworker: AsyncDemoWorker) -> None:
    stub(aworker).take()
    for i in range(50):  # pool of 1 thread: only the event loop can run these together
        job(aworker, nfp.POST, f"a{i}".encode(), {"task": "nap", "kwargs": {"seconds": 0.3}})
    got = collect(aworker, lambda g: sum(1 for c, _, st, _ in g if c == nfp.RESPONSE and st == nfp.ST_OK) == 50)
    entries = [p["a1"] for c, _, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK]
    assert all(e["status"] == "completed" and e["result"] >= 0.3 for e in entries)
    # An order, not a time: their runs overlap (one thread alone would run them one after another)
    edges = sorted(
        [(e["timestamps"]["started"], 1) for e in entries] + [(e["timestamps"]["completed"], -1) for e in entries]
    )
    at_once = max(itertools.accumulate(step for _, step in edges))
    assert at_once > 1, at_once
    assert aworker.runner.task_stats["nap"].outcomes["completed"] == 50


def test_an_async_task_is_cancelled_by_delete_and_ended_by_its_deadline(aworker: AsyncDemoWorker) -> None:
    stub(aworker).take()
    job(aworker, nfp.POST, b"c", {"task": "nap", "kwargs": {"seconds": 30}})
    collect(aworker, lambda g: aworker.aio is not None and aworker.aio.running == 1)
    job(aworker, nfp.DELETE, b"c")
    body = nfp.dumps({"task": "nap", "kwargs": {"seconds": 30}, "timeout": 60})
    stub(aworker).feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", b"d", body, b'{"deadline":0.3,"queued":0}'])
    got = collect(aworker, lambda g: final(b"c")(g) and final(b"d")(g))
    status = {u: p["a1"]["status"] for c, u, st, p in got if c == nfp.RESPONSE and st == nfp.ST_OK}
    assert status == {b"c": "cancelled", b"d": "timeout"}


def test_a_worker_with_async_tasks_announces_its_event_loop_in_its_credits(tmp_path: Path, clock: FakeClock) -> None:
    s = Settings(data_dir=str(tmp_path), pool_size=2, worker_prefetch=3, async_concurrency=50, job_queue_size=10)
    w = AsyncDemoWorker(name="w9", settings=s, transport=StubTransport(clock), clock=clock).start()
    try:
        (ready,) = stub(w).take()
        assert json.loads(ready[4])["credits"] == 2 + 3 + 50
    finally:
        w.stop(drain=0)


def readies(frames: list[Frames]) -> list[dict[str, Any]]:
    """The announces of the READY frames a worker sent."""
    return [json.loads(f[4]) for f in frames if f[1] == nfp.WORKER and f[2] == nfp.READY]


def test_a_worker_refused_its_name_waits_logs_once_then_tries_again_and_takes_it_when_free(
    worker: DemoWorker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    (first,) = readies(stub(worker).take())
    assert first["name"] == "w1" and first["pid"] > 0 and first["hostname"] and "previous" not in first
    refusal = {
        "reason": "name_taken",
        "detail": "a worker named w1 is already connected from h (pid 1)",
        "retry_after": 2,
    }
    with caplog.at_level("INFO", logger="zfab.worker"):
        for _ in range(3):
            stub(worker).feed([b"", nfp.BROKER, nfp.DISCONNECT, b"demo", nfp.dumps(refusal)])
            assert not worker.registered()
            # it does not spin: nothing is sent (no READY, no keepalive) until its wait is over
            clock.advance(1.5)
            stub(worker).tick()
            assert readies(stub(worker).take()) == []
            clock.advance(worker.keepalive.hold_time)  # the longest wait: at most a hold time
            stub(worker).tick()
            (again,) = readies(stub(worker).take())
            # a new connection, which names the refused one: the broker may let that one go
            assert again["previous"].startswith("w1~")
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(said) == 1 and "already connected from h (pid 1)" in said[0]
        stub(worker).feed([b"", nfp.BROKER, nfp.KEEPALIVE, b"demo"])  # accepted: the broker keeps it alive
    assert worker.registered()
    assert any("registered with the broker (refused 3 times before)" in r.getMessage() for r in caplog.records)


class ReceiptWorker(DemoWorker):
    """A task that looks, as it starts, for its own job's receipt where a restarted worker would."""

    @task
    def receipt(self, job: Job) -> bool:
        import sqlite3

        replayed = journal.Journal(self.store.path).replay()
        held = {r[0] for kind, rows in replayed for r in rows if kind == journal.INSERT}
        if job.uuid in held:
            return True
        conn = sqlite3.connect(f"file:{self.store.path}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT 1 FROM jobs WHERE uuid=?", (job.uuid,)).fetchone() is not None
        finally:
            conn.close()


def test_a_job_starts_only_once_its_receipt_is_durable(tmp_path: Path, clock: FakeClock) -> None:
    """A worker killed while a task runs answers the job's retried POST "interrupted" after its
    restart, never runs it again: the receipt is kept before the task starts (admission.py)."""
    s = Settings(data_dir=str(tmp_path), keepalive_interval=1.0, keepalive_multiplier=3, pool_size=2, job_queue_size=8)
    w = ReceiptWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock)
    w.start()
    try:
        stub(w).take()
        for n in range(5):
            # one job alone, and two in one receive batch
            uuids = [f"rc{n}a".encode()] if n % 2 else [f"rc{n}a".encode(), f"rc{n}b".encode()]
            for uuid in uuids:
                job(w, nfp.POST, uuid, {"task": "receipt"})
            got = collect(w, lambda got, uuids=uuids: all(final(u)(got) for u in uuids))
            for uuid in uuids:
                (entry,) = [p for c, u, st, p in got if c == nfp.RESPONSE and u == uuid and st in nfp.FINAL_STATUSES]
                assert entry["w1"]["result"] is True, f"job {uuid!r} ran before its receipt was kept"
    finally:
        w.stop(drain=0)


def test_a_result_is_reported_only_once_the_job_store_holds_it(worker: DemoWorker) -> None:
    """Write before report (issue 39): a worker killed right after its task returned has either told
    nobody, or stored what it told (journal.py: a store opened again replays it before it marks
    unfinished jobs interrupted); a later GET never reads such a job as interrupted."""
    import sqlite3

    stub(worker).take()
    for n in range(5):
        uuid = f"wbr{n}".encode()
        job(worker, nfp.POST, uuid, {"task": "echo", "kwargs": {"data": n}})
        collect(worker, final(uuid))
        # the moment the result is out, its row is durable: in the store's journal, or already folded into
        # SQLite (the journal is read first: the writer deletes a segment only once its rows are committed)
        held = [r for kind, rows in journal.Journal(worker.store.path).replay() for r in rows if kind == journal.RESULT]
        found = [(r[4], r[9]) for r in held if r[0] == uuid.decode()]
        conn = sqlite3.connect(f"file:{worker.store.path}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("SELECT state, result FROM jobs WHERE uuid=?", (uuid.decode(),)).fetchone()
        finally:
            conn.close()
        assert found or row is not None, "a reported result is neither in the journal nor in SQLite"
        state, result = found[-1] if found else row
        assert state == "completed" and json.loads(result)["w1"]["result"] == n
