"""The broker's per-service queue: priority then arrival, delays, parking, lazy removal. Pure."""

from __future__ import annotations

from zfab.broker.jobqueue import ALL, ANY, QueuedJob, ServiceQueue, Spot


def job(uuid: bytes, *, seq: int, priority: int = 5, kind: str = ANY, not_before: float = 0.0) -> QueuedJob:
    return QueuedJob(
        uuid=uuid, client=b"c", service=b"demo", target=b"any", kind=kind, names=None, body=b"x" * 10, task="t",
        push=True, ack=True, announce=True, priority=priority, seq=seq, queued_at=float(seq), not_before=not_before,
        deadline=100.0, timeout=100.0,
    )  # fmt: skip


def drain(q: ServiceQueue) -> list[bytes]:
    out = []
    while (j := q.pop_ready()) is not None:
        q.leave(j)
        out.append(j.uuid)
    return out


def test_higher_priority_first_then_arrival() -> None:
    q = ServiceQueue()
    for uuid, seq, prio in ((b"a", 1, 5), (b"b", 2, 0), (b"c", 3, 9), (b"d", 4, 5), (b"e", 5, 9)):
        q.add(job(uuid, seq=seq, priority=prio), now=0.0)
    assert drain(q) == [b"c", b"e", b"a", b"d", b"b"]


def test_depth_bytes_and_oldest_age_follow_what_waits() -> None:
    q = ServiceQueue()
    q.add(job(b"a", seq=1), now=0.0)
    q.add(job(b"b", seq=2), now=0.0)
    assert (q.depth, q.bytes, q.oldest_age(now=10.0)) == (2, 20, 9.0)
    q.leave(q.waiting[b"a"])
    assert (q.depth, q.bytes, q.oldest_age(now=10.0)) == (1, 10, 8.0)
    assert drain(q) == [b"b"] and q.oldest_age(now=10.0) == 0.0


def test_a_job_that_left_is_skipped_lazily() -> None:
    q = ServiceQueue()
    a, b = job(b"a", seq=1), job(b"b", seq=2)
    q.add(a, now=0.0)
    q.add(b, now=0.0)
    q.leave(a)  # cancelled while queued
    assert a.spot is Spot.GONE and drain(q) == [b"b"]


def test_a_delayed_job_is_not_ready_until_its_time() -> None:
    q = ServiceQueue()
    q.add(job(b"a", seq=1, not_before=5.0), now=0.0)
    assert q.pop_ready() is None and q.next_due() == 5.0
    assert q.due(now=4.9) == []
    assert [j.uuid for j in q.due(now=5.0)] == [b"a"] and drain(q) == [b"a"]


def test_a_job_for_all_waits_parked_not_in_the_ready_heap() -> None:
    q = ServiceQueue()
    j = job(b"a", seq=1, kind=ALL)
    q.add(j, now=0.0)
    assert j.spot is Spot.PARKED and q.pop_ready() is None and list(q.parked.values()) == [j] and q.depth == 1
    q.unpark(j)
    q.hold(j)  # fanned out, some of its parts still wait: still counted
    assert j.spot is Spot.DIRECTED and not q.parked and q.depth == 1
