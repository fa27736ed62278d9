"""The broker's event hooks and the publisher's loop side (issue 30, part 1), on the stub transport.

What the broker's loop hands its publisher (service/broker/events.py) for each state change, the
topic names it derives and bounds, and the hand-off queue's bound; no socket is opened here (the
publisher's thread is never started).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_broker_handlers import finish, make_broker, post, ready, stub

from service import Broker
from service.broker import events as ev
from service.broker.events import EventPublisher, result_state, topic_part
from service.core import protocol as nfp
from service.transport import FakeClock


def with_events(clock: FakeClock, **kw: Any) -> tuple[Broker, EventPublisher]:
    b = make_broker(clock)
    b.events = EventPublisher("inproc://unused", **kw)
    b.events.active = True  # as if someone subscribed
    return b, b.events


def published(p: EventPublisher) -> list[tuple[str, str | None, bytes, bytes]]:
    """(service.task topic names, state, uuid, worker) of what the loop handed over, taken."""
    out = []
    while p._queue:
        kind, service, task, state, uuid, worker, payload, _at, _seq = p._queue.popleft()
        if kind != "job":
            continue
        out.append((f"{service}.{task}", state if state is not None else result_state(payload), uuid, worker))
    return out


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_a_job_publishes_queued_running_and_completed_under_its_service_and_task(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1")
    post(b, b"j1")
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_WORKER_ACCEPTED, b"{}"])
    finish(b, b"w1", b"j1")
    assert published(p) == [
        ("demo.echo", "queued", b"j1", b""),
        ("demo.echo", "running", b"j1", b"w1"),
        ("demo.echo", "completed", b"j1", b"w1"),
    ]
    assert b"j1" not in p._names  # a job for one worker is forgotten at its end


def test_a_failed_task_expiry_and_cancel_are_states_too(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1", credits=1)
    post(b, b"j1")
    failed = nfp.dumps({"w1": {"result": None, "failed": True, "status": "error"}})
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, failed])
    post(b, b"busy")
    post(b, b"late", timeout=2)
    post(b, b"gone")
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.DELETE, b"demo", b"any", b"gone", b"", b"{}"])
    clock.advance(2.01)
    stub(b).tick()
    states = [(s, u) for _, s, u, _ in published(p)]
    assert ("failed", b"j1") in states and ("expired", b"late") in states and ("cancelled", b"gone") in states
    assert [s for s, u in states if u == b"late"] == ["queued", "expired"]


def test_refusals_publish_nothing_and_nobody_subscribed_costs_no_hand_off(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1")
    post(b, b"j1", service=b"nosuch")  # unknown service: refused, a name the broker never accepted
    assert published(p) == []
    p.active = False
    offered = p.offered
    post(b, b"j2")
    finish(b, b"w1", b"j2")
    assert published(p) == [] and p.offered == offered


def test_the_hand_off_queue_is_bounded_and_its_drops_counted(clock: FakeClock) -> None:
    b, p = with_events(clock, queue_size=3)
    ready(b, b"w1", credits=100)
    for i in range(10):
        post(b, f"j{i}".encode())
    assert len(p._queue) == 3 and p.dropped == 8 and p.offered == 11  # the worker's ready, then 10 jobs


def test_topic_parts_are_safe_and_bounded() -> None:
    assert topic_part("demo") == "demo" and topic_part("a.b c") == "a_b_c" and topic_part("") == "_"
    assert len(topic_part("x" * 10_000)) == ev.TOPIC_PART_MAX
    assert topic_part("é\n*>") == "____"
    assert result_state(None) == "completed" and result_state(b"not json") == "completed"
    assert result_state(b'{"w": {"failed": true}}') == "failed"


def test_an_undeclared_task_is_published_as_underscore(clock: FakeClock) -> None:
    b, p = with_events(clock)
    # A NorFab worker declares no tasks: the client's task name is not a name the broker accepted.
    stub(b).feed([b"n1", b"", nfp.WORKER, nfp.READY, b"norfab"])
    post(b, b"j1", service=b"norfab", task="anything.at.all")
    assert published(p)[0][:2] == ("norfab._", "queued")


def test_the_names_remembered_between_events_are_bounded(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev, "MAX_NAMES", 5)
    b, p = with_events(clock)
    ready(b, b"w1", credits=100)
    for i in range(20):
        post(b, f"j{i}".encode())
    assert len(p._names) == 5


def test_results_handed_over_are_bounded_in_bytes_and_then_told_apart_on_the_loop(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ev, "QUEUE_BYTES", 100)
    b, p = with_events(clock)
    ready(b, b"w1", credits=100)
    failed = nfp.dumps({"w1": {"result": None, "failed": True, "errors": ["x" * 80]}})
    for i in range(3):
        post(b, f"j{i}".encode())
        stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", f"j{i}".encode(), nfp.ST_OK, failed])
    assert p.queue_bytes() <= 100
    assert [s for _, s, _, _ in published(p) if s != "queued"] == ["failed"] * 3
    assert p.queue_bytes() == 0


def test_workers_that_register_and_leave_are_published_under_worker_topics(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1", name="w.one")
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.DISCONNECT, b"demo"])
    items = [(i[0], f"{i[1]}.{i[2]}", i[3], i[6]) for i in p._queue]
    assert items == [("worker", "demo.w_one", "ready", ""), ("worker", "demo.w_one", "lost", "disconnected")]
