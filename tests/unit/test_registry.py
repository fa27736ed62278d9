"""The broker's tables and routing decisions, with a fake clock for keepalive expiry."""

from __future__ import annotations

import pytest
from fakeclock import FakeClock

from zfab.broker.jobqueue import ANY, QueuedJob
from zfab.broker.registry import Registry, ServiceRecord, WorkerRecord

SVC = b"demo"
INTERVAL, MULTIPLIER = 1.0, 3  # hold time 3 s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_registry(clock: FakeClock, **kw: int) -> Registry:
    return Registry(interval=INTERVAL, multiplier=MULTIPLIER, clock=clock, **kw)


@pytest.fixture
def reg(clock: FakeClock) -> Registry:
    return make_registry(clock)


def service(reg: Registry, name: bytes = SVC) -> ServiceRecord:
    svc = reg.service(name, create=True)
    assert svc is not None
    return svc


def worker(reg: Registry, name: bytes, credits: int = 2, svc: bytes = SVC) -> WorkerRecord:
    return reg.register_worker(name + b"~id", name, service(reg, svc), credits=credits, v2=True, tasks=None)


def job(uuid: bytes, kind: str = ANY) -> QueuedJob:
    return QueuedJob(
        uuid=uuid, client=b"c", service=SVC, target=b"any", kind=kind, names=None, body=b"{}", task="echo",
        push=True, ack=True, announce=True, priority=5, seq=0, queued_at=0.0, not_before=0.0, deadline=60.0,
        timeout=60.0,
    )  # fmt: skip


def send(reg: Registry, w: WorkerRecord, uuid: bytes) -> None:
    reg.add_route(job(uuid), [w], 60.0)
    reg.send_to(reg.services[w.service], w, uuid, b"c")


# ---- registration --------------------------------------------------------------------


def test_ready_registers_a_worker_under_its_service_by_identity_and_name(reg: Registry) -> None:
    rec = worker(reg, b"w1")
    assert reg.workers[b"w1~id"] is rec and reg.by_name[b"w1"] is rec
    assert reg.services[SVC].workers == {b"w1~id": rec}
    assert rec.keepalive.is_alive() and rec.label == "w1" and rec.free == 2


def test_credits_are_capped_by_the_brokers_bound(clock: FakeClock) -> None:
    reg = make_registry(clock, max_inflight_per_worker=3)
    assert worker(reg, b"w1", credits=100).credits == 3


def test_removing_a_worker_reports_its_jobs_in_flight_as_lost(reg: Registry) -> None:
    w = worker(reg, b"w1")
    send(reg, w, b"j1")
    lost = reg.remove_worker(w)
    assert lost == {b"j1": b"c"}
    assert b"j1" not in reg.routes and b"w1" not in reg.by_name and not reg.services[SVC].workers


def test_removing_one_worker_of_a_broadcast_keeps_the_route_for_the_other(reg: Registry) -> None:
    w1, w2 = worker(reg, b"w1"), worker(reg, b"w2")
    reg.add_route(job(b"j1"), [w1, w2], 60.0)
    for w in (w1, w2):
        reg.send_to(reg.services[SVC], w, b"j1", b"c")
    reg.remove_worker(w1)
    assert reg.routes[b"j1"].workers == {b"w2"}


def test_expired_workers_are_those_not_heard_within_the_hold_time(reg: Registry, clock: FakeClock) -> None:
    w1, w2 = worker(reg, b"w1"), worker(reg, b"w2")
    clock.advance(2.0)
    w2.keepalive.heard()
    clock.advance(1.5)
    assert reg.expired_workers() == [w1]


# ---- least loaded, by credits --------------------------------------------------------------


def test_any_picks_the_worker_with_fewest_jobs_and_credit_left(reg: Registry) -> None:
    w1, w2 = worker(reg, b"w1"), worker(reg, b"w2")
    send(reg, w1, b"a")
    assert reg.least_loaded(reg.services[SVC]) is w2
    send(reg, w2, b"b")
    send(reg, w2, b"c")  # w2 is full (2 credits): w1 is the only one with credit
    assert reg.least_loaded(reg.services[SVC]) is w1
    send(reg, w1, b"d")
    assert reg.least_loaded(reg.services[SVC]) is None


def test_equally_loaded_workers_take_turns(reg: Registry) -> None:
    ws = [worker(reg, f"w{i}".encode(), credits=10) for i in range(3)]
    picked = []
    for i in range(6):
        w = reg.least_loaded(reg.services[SVC])
        assert w is not None
        picked.append(w.name)
        send(reg, w, f"j{i}".encode())
    assert picked == [w.name for w in ws] * 2


def test_a_deeply_loaded_worker_is_found_and_a_freed_one_below_it_comes_first(reg: Registry) -> None:
    busy, idle = worker(reg, b"w1", credits=300), worker(reg, b"w2", credits=1)
    send(reg, idle, b"i")  # idle is full: only busy has credit
    for i in range(200):
        assert reg.least_loaded(reg.services[SVC]) is busy
        send(reg, busy, f"j{i}".encode())
    assert reg.least_loaded(reg.services[SVC]) is busy
    assert reg.services[SVC].low == 200  # the walk starts at busy's level, past the empty ones
    reg.complete(idle, b"i")  # idle is back at level 0, below where the walk starts
    assert reg.least_loaded(reg.services[SVC]) is idle


def test_a_completion_gives_the_credit_back(reg: Registry) -> None:
    w = worker(reg, b"w1", credits=1)
    send(reg, w, b"j1")
    assert reg.least_loaded(reg.services[SVC]) is None
    route = reg.complete(w, b"j1")
    assert route is not None and b"j1" not in reg.routes and reg.finished[b"j1"] == b"w1"
    assert reg.least_loaded(reg.services[SVC]) is w


def test_a_worker_past_its_hold_time_is_not_picked(reg: Registry, clock: FakeClock) -> None:
    _, w2 = worker(reg, b"w1"), worker(reg, b"w2")
    clock.advance(2.5)
    w2.keepalive.heard()
    clock.advance(1.0)
    assert reg.least_loaded(reg.services[SVC]) is w2


def test_a_draining_worker_is_not_picked(reg: Registry) -> None:
    w1, w2 = worker(reg, b"w1"), worker(reg, b"w2")
    w1.stats = {"draining": True}
    reg.set_level(reg.services[SVC], w1)
    assert [reg.least_loaded(reg.services[SVC]) for _ in range(2)] == [w2, w2]


def test_names_and_all_resolve_to_live_workers_of_the_service(reg: Registry, clock: FakeClock) -> None:
    _, w2 = worker(reg, b"w1"), worker(reg, b"w2")
    worker(reg, b"x1", svc=b"other")
    svc = reg.services[SVC]
    assert {w.name for w in reg.resolve(svc, None)} == {b"w1", b"w2"}
    assert reg.resolve(svc, ["w2", "w2", "x1", "ghost"]) == [w2]
    clock.advance(3.5)
    assert reg.resolve(svc, ["w1"]) == []


def test_a_second_final_reply_for_the_same_job_returns_none(reg: Registry) -> None:
    w = worker(reg, b"w1")
    send(reg, w, b"j1")
    assert reg.complete(w, b"j1") is not None
    assert reg.complete(w, b"j1") is None


# ---- bounded tables -----------------------------------------------------------------------


def test_services_are_bounded_and_idle_ones_make_room(clock: FakeClock) -> None:
    reg = make_registry(clock, max_services=2)
    worker(reg, b"w1", svc=b"a")
    service(reg, b"b")  # idle: no worker, no queue
    assert reg.service(b"c", create=True) is not None and b"b" not in reg.services
    worker(reg, b"w2", svc=b"c")
    assert reg.service(b"d", create=True) is None  # both busy: nothing to evict


def test_idle_services_are_forgotten_after_a_while(clock: FakeClock) -> None:
    reg = Registry(interval=INTERVAL, multiplier=MULTIPLIER, clock=clock, service_memory=60.0)
    service(reg, b"old")
    clock.advance(61)
    gone = reg.forget_idle_services()
    assert [s.name for s in gone] == [b"old"] and not reg.services


def test_client_table_is_bounded_and_evicts_the_longest_idle(clock: FakeClock) -> None:
    reg = make_registry(clock, max_clients=2)
    for c in (b"a", b"b", b"a", b"c"):
        reg.touch_client(c)
    assert list(reg.clients) == [b"a", b"c"] and reg.clients[b"a"].requests == 2
