"""The broker as a mediator of composed parts (issue 40): hooks precomputed per point, parts that
return what the broker must do, and a job's outcome told as data. On the stub transport."""

from __future__ import annotations

import json
import logging
import struct
from typing import Any

import pytest
from test_broker_handlers import finish, make_broker, post, ready, replies, stub

from zfab.broker.events import EventPublisher
from zfab.broker.hooks import POINTS, Hook, Hooks
from zfab.broker.jobqueue import QueuedJob
from zfab.broker.registry import ServiceRecord
from zfab.broker.replies import norfab_status
from zfab.core import hoptrace
from zfab.core import protocol as nfp
from zfab.transport import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class Admissions(Hook):
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def admitted(self, job: QueuedJob, svc: ServiceRecord) -> None:
        self.seen.append(job.uuid)


def test_a_point_holds_only_the_hooks_that_override_it_and_none_is_an_empty_tuple() -> None:
    # Given no hook at all, every point is an empty tuple: the broker's cost there is one read
    empty = Hooks()
    assert all(getattr(empty, point) == () for point in POINTS)
    # When one hook overrides only `admitted`, only that point calls it
    h = Admissions()
    hooks = Hooks([h, Hook()])
    assert hooks.admitted == (h.admitted,)
    assert all(getattr(hooks, point) == () for point in POINTS if point != "admitted")


def test_a_broker_without_events_or_traces_calls_no_hook_on_a_jobs_path(clock: FakeClock) -> None:
    b = make_broker(clock, hop_traces=False)
    for point in ("admitted", "replied", "forwarded", "final", "worker", "queue_now"):
        assert getattr(b.hooks, point) == (), point
    ready(b, b"w1")
    post(b, b"j1")
    finish(b, b"w1", b"j1")
    ((_, _, status, _), (_, _, final, _)) = replies(stub(b).take())
    assert (status, final) == (nfp.ST_DISPATCHED, nfp.ST_OK)


def test_the_parts_are_wired_at_construction_and_nothing_calls_back_into_the_registry(clock: FakeClock) -> None:
    b = make_broker(clock)
    assert not hasattr(b.registry, "on_drop")
    # The dispatcher sends through the one Outbox, not through methods of the broker
    assert b.dispatch.out is b.out and b.dispatch.reply == b.out.reply


def test_a_lost_worker_is_returned_with_its_jobs_and_the_broker_answers_them(clock: FakeClock) -> None:
    b = make_broker(clock)
    ready(b, b"w1")
    post(b, b"j1")
    stub(b).take()
    w = b.registry.workers[b"w1"]
    # When the worker part loses it, it only returns the loss: nobody is told yet
    loss = b.workers.lose(w, "testing")
    assert loss.jobs == {b"j1": b"c1"} and loss.worker is w and stub(b).take() == []
    # Then the broker answers its jobs
    b.lost(loss)
    ((_, uuid, status, body),) = replies(stub(b).take())
    assert (uuid, status) == (b"j1", nfp.ST_WORKER_LOST) and "testing" in body["errors"][0]


def final_with_outcome(b: Any, uuid: bytes, result: dict[str, Any], outcome: bytes, status: bytes = nfp.ST_OK) -> None:
    trace = struct.pack("<3d", 0.001, 0.002, 0.0001) + outcome
    payload = nfp.dumps(result)
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", uuid, status, payload, trace])


def with_events(clock: FakeClock) -> tuple[Any, EventPublisher]:
    p = EventPublisher("inproc://unused")
    p.active = True
    return make_broker(clock, events=p), p


def test_the_outcome_a_worker_tells_is_published_without_the_result_being_read(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1", credits=10)
    # Given results whose bytes say the opposite of the outcome their worker told as data
    for uuid, outcome in ((b"j1", hoptrace.OUTCOME_FAILED), (b"j2", hoptrace.OUTCOME_RETRYING)):
        post(b, uuid)
        final_with_outcome(b, uuid, {"w1": {"result": 1, "failed": False}}, outcome)
    post(b, b"j3")
    final_with_outcome(b, b"j3", {"w1": {"result": None, "failed": True}}, hoptrace.OUTCOME_COMPLETED)
    # Then the events carry the told outcome, and no result was handed over to be read
    states = [(item[4], item[3]) for item in p._queue if item[0] == "job" and item[3] != "queued"]
    assert states == [(b"j1", "failed"), (b"j2", "retrying"), (b"j3", "completed")]
    assert p.queue_bytes() == 0 and all(item[6] is None for item in p._queue if item[0] == "job")
    # And the client's trace is the usual 40 bytes: the outcome byte stays at the broker
    finals = [f for f in stub(b).take() if f[0] == b"c1" and f[6] == nfp.ST_OK]
    assert [len(f[8]) for f in finals] == [40, 40, 40]


def test_a_worker_that_tells_no_outcome_has_its_result_read_once_on_the_publishers_thread(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1")
    post(b, b"j1")
    failed = nfp.dumps({"w1": {"result": None, "failed": True}})
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, failed])
    (item,) = [i for i in p._queue if i[0] == "job" and i[3] != "queued"]
    assert item[3] is None and item[6] == failed and p.queue_bytes() == len(failed)  # handed over, unread


def test_a_norfab_client_is_told_a_failed_task_as_200_from_the_outcome_alone() -> None:
    not_json = b"\xff not a result"
    assert norfab_status("w1", nfp.ST_ERROR, not_json, "failed") == nfp.ST_OK
    assert norfab_status("w1", nfp.ST_ERROR, not_json, None) == nfp.ST_ERROR  # unreadable, untold: as sent
    entry = nfp.dumps({"w1": {"failed": True}})
    assert norfab_status("w1", nfp.ST_BAD_REQUEST, entry, None) == nfp.ST_OK  # untold: its entry read


def test_a_flood_of_malformed_frames_is_counted_in_full_and_logged_in_a_few_lines(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    b = make_broker(clock)
    with caplog.at_level(logging.WARNING, logger="zfab.broker.broker"):
        for _ in range(1000):
            stub(b).feed([b"x", b"", b"NOPE01", b"\x01"])
    lines = [r.getMessage() for r in caplog.records if "dropped a message" in r.getMessage()]
    assert b.rejected["header"] == 1000
    assert 1 <= len(lines) <= 3  # the budget's burst, the clock standing still
    clock.advance(60)
    with caplog.at_level(logging.WARNING, logger="zfab.broker.broker"):
        stub(b).feed([b"x", b"", b"NOPE01", b"\x01"])
    assert "997 lines held back" in caplog.records[-1].getMessage()  # nothing silently lost


def test_a_route_that_ends_returns_its_limit_slot_as_data(clock: FakeClock) -> None:
    b = make_broker(clock)
    ready(b, b"w1")
    body = nfp.dumps({"task": "set_limit", "kwargs": {"service": "demo", "task_name": "echo", "concurrency": 1}})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", body])
    post(b, b"j1")
    post(b, b"j2")  # held by the limit: one at a time
    sent = [f for f in stub(b).take() if f[0] == b"w1" and f[3] == nfp.POST]
    assert [f[6] for f in sent] == [b"j1"]
    finish(b, b"w1", b"j1")  # the route ends: its slot comes back, and the next job goes
    assert [f[6] for f in stub(b).take() if f[0] == b"w1" and f[3] == nfp.POST] == [b"j2"]
    assert b.registry.freed == []  # taken by the dispatcher before its pump
    show = json.loads(json.dumps(b.mmi.show_limits()))
    assert [(r["task"], r["running"]) for r in show] == [("echo", 1)]
