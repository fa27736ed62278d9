"""The broker's event hooks and the publisher's loop side (issue 30, part 1), on the stub transport.

What the broker's loop hands its publisher (service/broker/events.py) for each state change, the
topic names it derives and bounds, and the hand-off queue's bound; no socket is opened here (the
publisher's thread is never started).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import zmq
from test_broker_handlers import finish, make_broker, post, ready, stub

from zfab import Broker
from zfab.broker import eventbody
from zfab.broker import events as ev
from zfab.broker.events import EventPublisher, result_state, topic_part
from zfab.broker.queueevents import QUEUE_INTERVAL
from zfab.core import protocol as nfp
from zfab.transport import FakeClock


def with_events(clock: FakeClock, **kw: Any) -> tuple[Broker, EventPublisher]:
    p = EventPublisher("inproc://unused", **kw)
    p.active = True  # as if someone subscribed
    b = make_broker(clock, events=p)
    return b, p


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


def test_an_attempt_that_runs_again_publishes_retrying_not_the_jobs_final_failed(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, p = with_events(clock)
    ready(b, b"w1", credits=10)
    retry = {"after": 1.0, "attempt": 2, "attempts": 3}
    again = nfp.dumps({"w1": {"result": None, "failed": True, "status": "error", "retry": retry}})
    last = nfp.dumps({"w1": {"result": None, "failed": True, "status": "error"}})
    # Given attempt 1 fails and its worker says it runs again, then attempt 2 fails for good
    post(b, b"j1")
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, again])
    post(b, b"j1~2")
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1~2", nfp.ST_OK, last])
    # Then the first attempt's end reads `retrying`, and only the last one's `failed`
    assert [(s, u) for _, s, u, _ in published(p)] == [
        ("queued", b"j1"),
        ("retrying", b"j1"),
        ("queued", b"j1~2"),
        ("failed", b"j1~2"),
    ]
    assert b"j1" not in p._names  # the attempt's route ended
    # And so it reads when the hand-off is full and the loop looks at the bytes instead of parsing
    monkeypatch.setattr(ev, "QUEUE_BYTES", 0)
    post(b, b"j2")
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j2", nfp.ST_OK, again])
    assert [s for _, s, u, _ in published(p) if u == b"j2"] == ["queued", "retrying"]


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
    assert len(topic_part("x" * 10_000)) == eventbody.TOPIC_PART_MAX
    assert topic_part("é\n*>") == "____"
    assert result_state(None) == "completed" and result_state(b"not json") == "completed"
    assert result_state(b'{"w": {"failed": true}}') == "failed"
    assert result_state(b'{"w": {"failed": true, "retry": {"after": 1}}}') == "retrying"
    assert result_state(b'{"a": {"failed": true, "retry": {"after": 1}}, "b": {"failed": true}}') == "failed"
    # told from the bytes when every entry says false; parsed otherwise (any spelling, any truthy value)
    assert result_state(b'{"a": {"failed": false}, "b": {"failed":false}}') == "completed"
    assert result_state(b'{"a": {"failed": false}, "b": {"failed" : 1}}') == "failed"


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


class _Sent:
    """Stands in for the XPUB on the publisher's side: _send_batch's messages, as JSON bodies by topic."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._frames: list[bytes] = []

    def send(self, frame: bytes, flags: int = 0) -> None:
        self._frames.append(frame)
        if not flags & zmq.SNDMORE:
            topic, body = self._frames
            self.messages.append((topic.decode(), json.loads(body)))
            self._frames = []


def sent(p: EventPublisher, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """What the publisher's thread would send of what the loop handed over, of topics `kind`.*."""
    sock = _Sent()
    while p._send_batch(sock):  # type: ignore[arg-type]
        pass
    return [(t, b) for t, b in sock.messages if t.startswith(kind + ".")]


def job_event(b: Broker, ident: bytes, uuid: bytes, payload: bytes) -> None:
    stub(b).feed([ident, b"", nfp.WORKER, nfp.EVENT, b"c1", b"", uuid, nfp.ST_OK, payload])


def test_a_jobs_progress_events_are_published_under_event_service_worker_bounded(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1", name="w.one")
    post(b, b"j1")
    ev_ = {"event_type": "progress", "message": "m" * 5000, "severity": "INFO", "progress": 0.5, "extras": {"x": 1}}
    job_event(b, b"w1", b"j1", nfp.dumps(ev_))
    job_event(b, b"w1", b"j1", nfp.dumps({"message": "x" * (ev.EVENT_PAYLOAD_MAX + 1)}))  # too large to parse
    job_event(b, b"w1", b"j1", b"not json")
    forwarded = [f for f in stub(b).take() if f[0] == b"c1" and f[3] == nfp.EVENT]
    assert len(forwarded) == 3  # the client gets its events as before
    (topic, first), (_, big), (_, bad) = sent(p, "event")
    assert topic == "event.demo.w_one" and first["uuid"] == "j1" and first["worker"] == "w.one"
    assert (first["task"], first["event_type"], first["severity"], first["progress"]) == (
        "echo",
        "progress",
        "INFO",
        0.5,
    )
    assert len(first["message"]) == eventbody.EVENT_TEXT_MAX and "extras" not in first
    assert big["oversize"] is True and "message" not in big and bad["malformed"] is True
    assert [first["tseq"], big["tseq"], bad["tseq"]] == [1, 2, 3] and p.queue_bytes() == 0
    p.active = False  # nobody subscribed: nothing handed over
    offered = p.offered
    job_event(b, b"w1", b"j1", nfp.dumps(ev_))
    assert p.offered == offered and not p._queue


def test_queue_changes_are_coalesced_to_one_event_per_interval_per_service(clock: FakeClock) -> None:
    b, p = with_events(clock, queue_size=100_000)
    b.settings.service_queue_size = 1000
    ready(b, b"w1", credits=1)
    ready(b, b"o1", credits=1, service=b"other")
    stub(b).tick()
    sent(p, "queue")  # (the workers' ready)
    for i in range(200):  # the first takes w1's credit, the rest queue
        post(b, f"j{i}".encode())
        post(b, f"o{i}".encode(), service=b"other")
        stub(b).tick()  # the real loop looks at its timers every pass
    first = sent(p, "queue")
    # The first change of each published at once, the other 398 changes wait for their turn
    assert sorted((t, e["depth"]) for t, e in first) == [("queue.demo", 1), ("queue.other", 1)]
    assert stub(b).tick() == pytest.approx(clock() + QUEUE_INTERVAL)  # the loop wakes for them
    clock.advance(QUEUE_INTERVAL)
    stub(b).tick()
    second = {t: e for t, e in sent(p, "queue")}
    assert set(second) == {"queue.demo", "queue.other"}
    q = second["queue.demo"]
    assert (q["depth"], q["capacity"], q["paused"], q["tseq"]) == (199, 1000, False, 2) and q["bytes"] > 0
    assert not b.dispatch.queue_changed  # nothing waits: the loop does not wake for queues
    clock.advance(QUEUE_INTERVAL)
    stub(b).tick()
    assert sent(p, "queue") == []  # unchanged: nothing published


def test_a_pause_and_a_resume_are_published_at_once(clock: FakeClock, tmp_path: Any) -> None:
    b, p = with_events(clock)
    b.settings.data_dir = str(tmp_path)
    ready(b, b"w1")
    stub(b).tick()
    body = nfp.dumps({"task": "pause_service", "kwargs": {"service": "demo"}})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", body])
    ((topic, paused),) = sent(p, "queue")
    assert topic == "queue.demo" and paused["paused"] is True and paused["depth"] == 0
    post(b, b"j1")  # queued, not sent: the queue's next change waits for its interval
    stub(b).tick()
    body = nfp.dumps({"task": "resume_service", "kwargs": {"service": "demo"}})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m2", body])
    got = sent(p, "queue")
    assert [(e["paused"], e["depth"]) for _, e in got][-1] == (False, 1)


def test_queue_changes_while_nobody_is_subscribed_hand_nothing_over(clock: FakeClock) -> None:
    b, p = with_events(clock)
    p.active = False
    ready(b, b"w1", credits=1)
    for i in range(3):
        post(b, f"j{i}".encode())
    stub(b).tick()
    assert not p._queue and not b.dispatch.queue_changed


def test_a_hop_trace_is_handed_over_only_while_a_subscription_could_match_it(clock: FakeClock) -> None:
    b, p = with_events(clock)
    ready(b, b"w1")
    post(b, b"j1")
    post(b, b"j2")
    finish(b, b"w1", b"j1")  # nobody subscribed to trace topics: no trace handed over
    assert "trace" not in [k for k, *_ in p._queue]
    p._queue.clear()
    p.tracing = True
    finish(b, b"w1", b"j2")
    kinds = [(k, svc, task, uuid, worker, len(payload)) for k, svc, task, _s, uuid, worker, payload, *_ in p._queue]
    assert kinds[-1] == ("trace", b"demo", "echo", b"j2", b"w1", 16)  # the broker's two figures, no worker's


def test_which_subscriptions_could_get_a_trace_topic() -> None:
    for prefix in (b"", b"t", b"trace.", b"trace.demo.", b"trace.demo.echo"):
        assert ev._may_match(prefix, b"trace.")
    for prefix in (b"job.", b"tracer", b"trace-", b"x"):
        assert not ev._may_match(prefix, b"trace.")
