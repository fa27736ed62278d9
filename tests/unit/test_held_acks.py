"""A zfab client's 202 held a moment (flags ack_late, broker/heldacks.py): left out when the job's final
answer goes first, sent first when another answer of its worker goes before, sent when the moment is
over and the job is still in flight; and the broker's own record of the dispatch is made at once."""

from __future__ import annotations

from typing import Any

from test_broker_handlers import finish, make_broker, post, ready, replies, stub

from zfab.broker.heldacks import DISPATCH_HOLD
from zfab.core import protocol as nfp
from zfab.transport import FakeClock


def statuses(b: Any) -> list[bytes]:
    return [status for _, _, status, _ in replies(stub(b).take())]


def test_a_job_answered_within_the_moment_costs_its_client_no_202() -> None:
    clock = FakeClock()
    b = make_broker(clock)
    ready(b, b"w1")
    post(b, b"u1", ack_late=True)
    sent = stub(b).take()
    assert [f[3] for f in sent if f[0] == b"w1"] == [nfp.POST]  # the job went to its worker
    assert replies(sent) == []  # and nothing to the client yet
    clock.advance(DISPATCH_HOLD / 2)
    finish(b, b"w1", b"u1")
    assert statuses(b) == [nfp.ST_OK]  # the result alone
    clock.advance(DISPATCH_HOLD * 10)
    stub(b).tick()
    assert statuses(b) == []  # and no 202 after it
    assert b.dispatch.held_acks.left_out == 1 and not b.dispatch.held_acks.held


def test_a_job_still_in_flight_after_the_moment_gets_its_202_naming_its_worker() -> None:
    clock = FakeClock()
    b = make_broker(clock)
    ready(b, b"w1")
    post(b, b"u1", ack_late=True)
    stub(b).take()
    clock.advance(DISPATCH_HOLD * 1.5)
    stub(b).tick()
    (answer,) = replies(stub(b).take())
    assert answer[2] == nfp.ST_DISPATCHED and answer[3]["workers"] == ["w1"]
    finish(b, b"w1", b"u1")
    assert statuses(b) == [nfp.ST_OK]


def test_another_answer_of_the_worker_takes_the_held_202_with_it_first() -> None:
    clock = FakeClock()
    b = make_broker(clock)
    ready(b, b"w1")
    post(b, b"u1", ack_late=True)
    stub(b).take()
    started = nfp.dumps({"status": "running"})
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"u1", nfp.ST_WORKER_ACCEPTED, started])
    assert statuses(b) == [nfp.ST_DISPATCHED, nfp.ST_WORKER_ACCEPTED]  # NFP's order


def test_a_job_lost_within_the_moment_gets_its_410_and_never_a_late_202() -> None:
    clock = FakeClock()
    b = make_broker(clock)
    ready(b, b"w1")
    post(b, b"u1", ack_late=True)
    stub(b).take()
    stub(b).feed([b"w1", b"", nfp.WORKER, nfp.DISCONNECT, b"demo"])
    assert statuses(b) == [nfp.ST_WORKER_LOST]
    clock.advance(DISPATCH_HOLD * 10)
    stub(b).tick()
    assert statuses(b) == []


def test_without_ack_late_the_202_goes_at_once_and_with_it_the_dispatch_is_recorded_at_once() -> None:
    clock = FakeClock()
    b = make_broker(clock)
    heard: list[tuple[bytes, bytes]] = []
    b.hooks.replied = (*b.hooks.replied, lambda uuid, status: heard.append((uuid, status)))
    b.dispatch.out.replied = b.hooks.replied  # (the outbox took the tuple at construction)
    ready(b, b"w1")
    post(b, b"u1")
    assert statuses(b) == [nfp.ST_DISPATCHED]
    post(b, b"u2", ack_late=True)
    assert statuses(b) == []
    assert heard == [(b"u1", nfp.ST_DISPATCHED), (b"u2", nfp.ST_DISPATCHED)]  # events and audit hear of both


def test_a_job_collected_by_get_keeps_its_202_at_once() -> None:
    """Without push the client needs its worker's name to ask: nothing is held."""
    clock = FakeClock()
    b = make_broker(clock)
    ready(b, b"w1")
    post(b, b"u1", ack_late=True, push=False)
    assert statuses(b) == [nfp.ST_DISPATCHED]
