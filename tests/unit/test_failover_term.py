"""A broker's term on the lease (service/broker/term.py, keeper.py): a standby is unbound and takes no work,
the holder binds, and the fence stops it before the lease can expire in the engine, counted from when each
renewal was SENT. No sockets, no database: a fake lease and a fake clock; the loop's hand-over is the stub's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_broker_handlers import INTERVAL, MULTIPLIER, TASKS, jobs_sent, post, stub

from zfab import Broker
from zfab.broker import requests as requests_module
from zfab.broker import term as term_module
from zfab.broker.keeper import EXPIRY_SLACK, LeaseKeeper, next_round, watched
from zfab.broker.lease import LeaseState, LeaseUnavailable, open_lease
from zfab.broker.term import ACTIVE, DEPOSED, SETTLE, SINGLE, STANDBY, fence_margin, settle_for
from zfab.client.brokerlink import BrokerLink, News
from zfab.core import protocol as nfp
from zfab.settings import Settings
from zfab.transport import FakeClock, StubTransport
from zfab.transport.wire import RECONNECT_MAX_MS
from zfab.workers.demo import DemoWorker

DURATION, RENEW = 1.5, 0.3
ME = "tcp://127.0.0.1:1"


class FakeLease:
    """Answers what the test says; counts round trips."""

    def __init__(self) -> None:
        self.answers: list[LeaseState | Exception] = []
        self.calls = 0
        self.released: list[str] = []

    def acquire_or_renew(self, holder: str, duration: float) -> LeaseState:
        self.calls += 1
        a = self.answers.pop(0) if self.answers else LeaseState(True, 1, holder, duration)
        if isinstance(a, Exception):
            raise a
        return a

    def release(self, holder: str) -> None:
        self.released.append(holder)

    def close(self) -> None:
        pass


def leased_broker(
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    lease: FakeLease | None = None,
    on_deposed: Callable[[], None] | None = None,
) -> Broker:
    monkeypatch.setattr(term_module, "open_lease", lambda url, timeout: lease or FakeLease())
    s = Settings(
        keepalive_interval=INTERVAL,
        keepalive_multiplier=MULTIPLIER,
        startup_grace=0,
        broker_lease="postgresql://nowhere/zfab",
        broker_lease_duration=DURATION,
        broker_lease_renew=RENEW,
    )
    b = Broker(s, endpoint=ME, transport=StubTransport(clock), clock=clock, on_deposed=on_deposed)
    b.loop.start()
    return b


def held(epoch: int = 1, holder: str = ME) -> LeaseState:
    return LeaseState(holder == ME, epoch, holder, DURATION)


def test_without_a_lease_a_broker_is_single_and_always_bound() -> None:
    clock = FakeClock()
    b = Broker(Settings(startup_grace=0), endpoint=ME, transport=StubTransport(clock), clock=clock)
    b.loop.start()
    assert b.term.role == SINGLE and b.term.serving and b.bound_endpoint == ME
    facts = b.mmi.show_broker()
    assert facts["role"] == "single" and facts["epoch"] == 0 and facts["failovers"] == 0


def test_a_standby_is_unbound_until_it_holds_the_lease_then_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    assert b.term.role == STANDBY and not b.term.serving
    assert b.bound_endpoint == ""  # no peer can reach it, so none can give it work
    b.term.heard(held(holder="tcp://127.0.0.1:2"), clock())  # another broker holds it
    assert b.term.role == STANDBY and b.bound_endpoint == ""
    assert b.mmi.show_broker()["lease_holder"] == "tcp://127.0.0.1:2"
    b.term.heard(held(epoch=2), clock())
    assert b.term.role == ACTIVE and b.bound_endpoint == ME
    facts = b.mmi.show_broker()
    assert (facts["role"], facts["epoch"], facts["failovers"]) == ("active", 2, 1)
    assert b.requests.grace_until is not None  # the services' workers are on their way: the startup grace again


def test_the_fence_counts_from_when_the_renewal_was_sent_and_comes_before_the_engine_expiry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    sent = clock()
    clock.advance(0.4)  # the answer came late: the lease counts from the request, not from the answer
    b.term.heard(held(), sent)
    assert b.term.role == ACTIVE
    fence = sent + DURATION - fence_margin(DURATION)
    assert b.term.valid_until == pytest.approx(fence) and fence < sent + DURATION
    assert b.on_timer(clock()) <= fence  # the loop wakes at the fence at the latest
    clock.now = fence - 0.01
    b.on_timer(clock())
    assert b.term.role == ACTIVE
    clock.now = fence
    b.on_timer(clock())
    assert b.term.role == DEPOSED and b.bound_endpoint == ""  # its ROUTER closed: peers see their connection end


def test_renewals_move_the_fence_and_failed_ones_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    for _ in range(10):  # renewed every RENEW: never fenced
        b.term.heard(held(), clock())
        clock.advance(RENEW)
        b.on_timer(clock())
    assert b.term.role == ACTIVE
    last = clock() - RENEW
    for _ in range(3):
        b.term.heard(None, clock())  # the engine unreachable
        clock.advance(RENEW)
        b.on_timer(clock())
    assert b.term.lease_errors == 3
    assert b.term.role == ACTIVE and b.term.valid_until == pytest.approx(last + DURATION - fence_margin(DURATION))
    clock.now = b.term.valid_until
    b.on_timer(clock())
    assert b.term.role == DEPOSED


def test_an_active_broker_that_reads_another_holder_stops_at_once_and_never_serves_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    told: list[bool] = []
    b = leased_broker(clock, monkeypatch, on_deposed=lambda: told.append(True))
    b.term.heard(held(epoch=3), clock())
    b.term.heard(held(epoch=4, holder="tcp://127.0.0.1:2"), clock())
    assert b.term.role == DEPOSED and told == [True] and b.term.epoch == 4
    b.term.heard(held(epoch=5), clock())  # a deposed broker's state is gone: it does not take the lease again
    assert b.term.role == DEPOSED and not b.term.serving


def test_the_keepalive_answer_carries_the_epoch_and_a_client_leaves_an_older_term(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    b.term.heard(held(epoch=7), clock())
    stub(b).take()
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""])
    (answer,) = [f for f in stub(b).take() if f[3] == nfp.KEEPALIVE]
    said = nfp.loads(answer[-1])
    assert said["epoch"] == 7

    link = BrokerLink(Settings(), FakeClock())

    def keepalive(**facts: Any) -> nfp.BrokerReply:
        return nfp.BrokerReply(nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", nfp.ST_OK, nfp.dumps(facts), None)

    assert link.heard(keepalive(boot="a", epoch=7)) is News.NONE
    assert link.heard(keepalive(boot="b", epoch=8)) is News.RESTARTED  # the new term: jobs re-established
    assert link.heard(keepalive(boot="a", epoch=7)) is News.DEPOSED  # the deposed one, still answering
    assert link.boot == "b" and link.epoch == 8


def test_the_keeper_renews_on_its_thread_and_hands_each_answer_with_its_send_time() -> None:
    lease = FakeLease()
    lease.answers = [held(), LeaseUnavailable("cut"), held()]
    got: list[tuple[LeaseState | None, float]] = []
    three = threading.Event()

    def heard(state: LeaseState | None, sent: float) -> None:
        got.append((state, sent))
        if len(got) == 3:
            three.set()

    k = LeaseKeeper(lease, ME, duration=DURATION, renew=0.01, heard=heard, clock=time.monotonic)
    k.start()
    assert three.wait(5)
    k.release_on_stop = True
    k.stop()
    assert [s is None for s, _ in got[:3]] == [False, True, False]
    assert got[0][1] < got[1][1] < got[2][1]
    assert lease.released == [ME]


def test_a_standby_reads_the_lease_right_after_it_expires_and_no_more_often_than_the_renewal() -> None:
    other = LeaseState(False, 3, "tcp://b:1", 0.1)
    assert next_round(other, 100.0, RENEW) == pytest.approx(100.0 + 0.1 + EXPIRY_SLACK)
    assert next_round(LeaseState(False, 3, "tcp://b:1", 1.4), 100.0, RENEW) == pytest.approx(100.0 + RENEW)
    assert next_round(held(), 100.0, RENEW) == pytest.approx(100.0 + RENEW)
    assert next_round(None, 100.0, RENEW) == pytest.approx(100.0 + RENEW)


def test_a_broker_watched_the_holder_when_its_first_read_came_before_the_holders_last_renewal() -> None:
    expiring = LeaseState(False, 3, "tcp://b:1 (boot 1)", 0.2)  # read at 105: renewed last at 105.2 - 1.5
    assert watched(100.0, expiring, 105.0, DURATION)  # a standby reading since 100
    assert watched(103.7, expiring, 105.0, DURATION)  # however briefly before the holder died
    assert not watched(104.0, expiring, 105.0, DURATION)  # first read after the holder's last renewal
    assert watched(104.0, None, 105.0, DURATION)  # nothing read: nothing to wait for
    assert watched(104.0, held(), 105.0, DURATION)


def test_a_newcomer_reads_an_expiring_lease_a_renewal_after_the_standby_that_watched_it() -> None:
    other = LeaseState(False, 3, "tcp://b:1", 0.1)
    assert next_round(other, 100.0, RENEW, newcomer=True) == pytest.approx(100.0 + 0.1 + EXPIRY_SLACK + RENEW)
    expired = LeaseState(False, 3, "tcp://b:1", -0.5)  # read after its expiry: still a renewal later
    assert next_round(expired, 100.0, RENEW, newcomer=True) == pytest.approx(100.0 + EXPIRY_SLACK + RENEW)
    far = LeaseState(False, 3, "tcp://b:1", 1.4)  # not about to expire: the same cadence as anyone's
    assert next_round(far, 100.0, RENEW, newcomer=True) == pytest.approx(100.0 + RENEW)
    free = LeaseState(False, 3, "", 0.0)  # nobody holds it: a newcomer takes it at its next round
    assert next_round(free, 100.0, RENEW, newcomer=True) == pytest.approx(100.0 + RENEW)


def test_a_lease_url_of_another_scheme_is_refused_with_its_reason() -> None:
    with pytest.raises(ValueError, match="ZFAB_BROKER_LEASE must start with"):
        open_lease("redis://x", timeout=1.0)


def test_keepalives_to_zfab_workers_carry_the_epoch_and_a_worker_leaves_an_older_term(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    b.term.heard(held(epoch=5), clock())
    ann = nfp.dumps({"v": 2, "name": "w1", "credits": 1, "tasks": {}})
    stub(b).feed([b"w1~1", b"", nfp.WORKER, nfp.READY, b"demo", ann])
    stub(b).feed([b"nf", b"", nfp.WORKER, nfp.READY, b"demo"])  # a NorFab worker: NFP's frames only
    stub(b).take()
    clock.advance(INTERVAL)
    b.on_timer(clock())
    kas = {f[0]: f for f in stub(b).take() if f[3] == nfp.KEEPALIVE}
    # (and that this broker reads bundles: transport/bundle.py)
    assert nfp.loads(kas[b"w1~1"][5]) == {"epoch": 5, "bundle": 1} and len(kas[b"nf"]) == 5

    wclock = FakeClock()
    s = Settings(data_dir=str(tmp_path), broker="tcp://127.0.0.1:1")
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(wclock), clock=wclock)
    w.start()
    try:
        keepalive = [b"", nfp.BROKER, nfp.KEEPALIVE, b"demo"]
        stub_w = w.loop
        stub_w.feed([*keepalive, nfp.dumps({"epoch": 5, "bundle": 1})])  # type: ignore[attr-defined]
        assert w.epoch == 5 and w.loop.stats.reconnects == 0
        assert stub_w.bundled == {b""}  # type: ignore[attr-defined]  # it may send its broker bundles
        stub_w.feed([*keepalive])  # type: ignore[attr-defined]  # (a NorFab broker's: no epoch, nothing changes)
        assert stub_w.bundled == set()  # type: ignore[attr-defined]  # and no bundles to it
        stub_w.feed([*keepalive, nfp.dumps({"epoch": 4})])  # type: ignore[attr-defined]  # a deposed broker
        assert w.loop.stats.reconnects == 1 and w.epoch == 5
    finally:
        w.stop(drain=0)


def ready_holding(b: Broker, ident: bytes, holds: list[str]) -> None:
    ann = nfp.dumps({"v": 2, "name": ident.decode(), "credits": 2, "tasks": TASKS, "holds": holds})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.READY, b"demo", ann])


def test_a_new_term_holds_resubmitted_jobs_until_their_workers_say_they_hold_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a failover the job's client may resubmit it before the worker that has it registers: the new
    broker must not hand it to another worker (it would run twice), nor hold a new job."""
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    b.term.heard(held(epoch=2), clock())
    stub(b).take()
    ready_holding(b, b"w2", [])  # a worker that does not have it registers first
    post(b, b"old", known=True)  # resubmitted: held while the term settles
    post(b, b"new")  # a new job goes at once
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"new"]
    held_now = b.term.figures()
    assert held_now["settling"] == 1 and held_now["settling_bytes"] > 0, held_now  # show_broker, /metrics
    ready_holding(b, b"w1", ["old"])  # the worker that has it comes back, saying so
    while clock() < b.requests.settle_until:  # the lease renewed meanwhile, as its keeper does
        clock.advance(RENEW)
        b.term.heard(held(epoch=2), clock())
    b.on_timer(clock())
    sent = stub(b).take()
    assert jobs_sent(sent) == [(b"w1", nfp.POST, b"old")]  # to its holder, which answers without running it again
    post(b, b"later", known=True)  # settled: a resubmission is admitted as any job
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"later"]
    assert (b.term.figures()["settling"], b.term.figures()["settling_bytes"]) == (0, 0)


def test_a_broker_without_a_lease_settles_when_it_starts_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single broker restarted (no lease): a results-only client, which had no 202 naming the job's worker,
    POSTs it again; held until the worker that has it says so in READY, it goes there, not to another."""
    clock = FakeClock()
    b = Broker(Settings(startup_grace=0), endpoint=ME, transport=StubTransport(clock), clock=clock)
    b.loop.start()
    assert b.term.role == SINGLE
    stub(b).take()
    ready_holding(b, b"w2", [])  # a worker that does not have it registers first
    post(b, b"old", known=True)  # resubmitted: held while the broker settles
    post(b, b"new")  # a new job goes at once
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"new"]
    assert b.mmi.show_broker()["settling"] == 1
    ready_holding(b, b"w1", ["old"])  # the worker that has it comes back, saying so
    clock.advance(b.term.settle)
    b.on_timer(clock())
    assert jobs_sent(stub(b).take()) == [(b"w1", nfp.POST, b"old")]
    post(b, b"later", known=True)  # settled: a resubmission is admitted as any job
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"later"]
    assert b.term.requests is None and b.mmi.show_broker()["settling"] == 0


def test_a_settling_term_holds_resubmitted_jobs_within_a_bound_of_bytes_and_admits_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    monkeypatch.setattr(requests_module, "MAX_SETTLING_BYTES", 100)
    b.term.heard(held(epoch=2), clock())
    stub(b).take()
    ready_holding(b, b"w2", [])
    post(b, b"a", known=True)  # 38 bytes of body: held
    post(b, b"b", known=True)  # 76: held
    post(b, b"c", known=True)  # past 100: admitted at once, not held
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"c"]
    assert b.term.figures()["settling"] == 2


def test_a_standby_rereads_what_a_user_set_before_its_first_held_answer_reaches_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pause or limit set on the deposed broker (kept in the shared store) holds from the new term's first
    dispatch: the keeper's thread rereads it before the held answer is handed to the loop, once per takeover."""
    clock = FakeClock()
    b = leased_broker(clock, monkeypatch)
    seen: list[str] = []
    monkeypatch.setattr(b.term, "takeover", lambda: seen.append(f"{b.term.role} {len(b.loop._queue)}"))
    b.term.hand_over(held(holder="tcp://127.0.0.1:2"), clock())  # another broker holds it: nothing to reread
    b.loop.flush()
    assert seen == [] and b.term.role == STANDBY
    b.term.hand_over(held(epoch=2), clock())
    assert seen == [f"{STANDBY} 0"]  # before the held answer was queued for the loop
    b.loop.flush()
    assert b.term.role == ACTIVE
    b.term.hand_over(held(epoch=2), clock())  # its own renewal
    b.loop.flush()
    assert seen == [f"{STANDBY} 0"]


def test_a_broker_restarted_under_its_endpoint_is_a_new_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its holder id is its endpoint and its process's boot: a restart waits for the lease like any standby
    (its dead predecessor's term is not its own), and takes it with a new epoch."""
    clock = FakeClock()
    first, again = leased_broker(clock, monkeypatch), leased_broker(clock, monkeypatch)
    assert first.term.holder.startswith(ME) and again.term.holder.startswith(ME)
    assert first.term.holder != again.term.holder


def get(b: Broker, uuid: bytes, target: bytes, client: bytes = b"c1") -> None:
    stub(b).feed([client, b"", nfp.CLIENT, nfp.GET, b"demo", target, uuid, b"", nfp.dumps({"ack": False})])


def test_a_restarted_broker_holds_a_get_for_a_worker_not_back_yet_until_it_settles() -> None:
    """An API restarted after its broker recovers a job by GET to the worker that ran it; if that GET comes
    before the worker re-registered, "no such worker" would make the API call a finished job lost. Held while
    the broker settles, it goes to the worker once it is back."""
    clock = FakeClock()
    b = Broker(Settings(startup_grace=0), endpoint=ME, transport=StubTransport(clock), clock=clock)
    b.loop.start()
    stub(b).take()
    ready_holding(b, b"w2", [])  # another worker of the service is back first
    get(b, b"j1", b"w1")  # w1 is on its way back
    assert stub(b).take() == []  # neither refused nor sent
    assert b.mmi.show_broker()["settling"] == 1
    ready_holding(b, b"w1", ["j1"])
    clock.advance(b.term.settle)
    b.on_timer(clock())
    sent = stub(b).take()
    assert [(f[0], f[3], f[6]) for f in sent if f[0] == b"w1" and len(f) > 6] == [(b"w1", nfp.GET, b"j1")]
    assert b.mmi.show_broker()["settling"] == 0


def test_a_settled_broker_still_refuses_a_get_for_a_worker_it_does_not_know() -> None:
    clock = FakeClock()
    b = Broker(Settings(startup_grace=0), endpoint=ME, transport=StubTransport(clock), clock=clock)
    b.loop.start()
    ready_holding(b, b"w2", [])
    clock.advance(b.term.settle)
    b.on_timer(clock())
    stub(b).take()
    get(b, b"j1", b"w1")
    (answer,) = stub(b).take()
    assert answer[0] == b"c1" and answer[5] == b"j1" and answer[6] == nfp.ST_BAD_REQUEST, answer
    # nor, settling or not, a request for a service no worker registered
    b2 = Broker(Settings(startup_grace=0), endpoint=ME, transport=StubTransport(clock), clock=clock)
    b2.loop.start()
    stub(b2).take()
    get(b2, b"j3", b"w1")
    (refused,) = stub(b2).take()
    assert refused[6] == nfp.ST_NOT_FOUND, refused


def test_a_restarted_broker_settles_until_a_worker_that_knows_only_it_can_be_back() -> None:
    """A worker that knows one broker learns of its restart only from the DISCONNECT its next keepalive gets
    (ANSWER_DELAY intervals apart at most, once its socket reconnected): a job resubmitted two seconds after
    the start, its worker not back yet, is still held, not run on another worker."""
    clock = FakeClock()
    s = Settings(startup_grace=0)
    assert settle_for(s) > s.keepalive_interval >= SETTLE
    b = Broker(s, endpoint=ME, transport=StubTransport(clock), clock=clock)
    b.loop.start()
    stub(b).take()
    ready_holding(b, b"w2", [])
    clock.advance(2.0)
    b.on_timer(clock())
    post(b, b"old", known=True)
    assert jobs_sent(stub(b).take()) == [] and b.mmi.show_broker()["settling"] == 1
    ready_holding(b, b"w1", ["old"])
    clock.advance(b.term.settle)
    b.on_timer(clock())
    assert jobs_sent(stub(b).take()) == [(b"w1", nfp.POST, b"old")]


def test_a_start_settles_past_a_workers_reconnect_even_with_short_keepalives() -> None:
    """A worker's keepalive waits in its socket until the socket reconnects, up to RECONNECT_MAX_MS after the
    broker binds: with short keepalives that is the longer wait, and the settle window covers it too."""
    short = Settings(keepalive_interval=0.5)
    assert settle_for(short) > RECONNECT_MAX_MS / 1000
    assert settle_for(short) <= short.keepalive_interval * short.keepalive_multiplier  # never past a hold time
    assert settle_for(Settings()) == 3.5  # the default: 1.2 keepalive intervals of 2.5 s, and the margin
