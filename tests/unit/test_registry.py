"""The broker's tables and routing decisions, with a fake clock for keepalive expiry."""

from __future__ import annotations

import pytest
from fakeclock import FakeClock

from service.broker.registry import Registry, WorkerRecord

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


def names(workers: list[WorkerRecord]) -> list[bytes]:
    return [w.name for w in workers]


def busy(reg: Registry, worker: WorkerRecord, jobs: int) -> None:
    for i in range(jobs):
        reg.add_route(f"{worker.label}-job-{i}".encode(), b"client-a", worker.service, [worker], push=True)


# ---- registration --------------------------------------------------------------------


def test_ready_registers_a_worker_under_its_service(reg: Registry) -> None:
    rec = reg.register_worker(b"w1", SVC)

    assert reg.workers[b"w1"] is rec
    assert reg.services[SVC].workers == {b"w1": rec}
    assert rec.keepalive.is_alive()
    assert rec.label == "w1"


def test_ready_again_replaces_the_record_and_forgets_its_old_jobs(reg: Registry, clock: FakeClock) -> None:
    # Given a worker with a job in flight, heard from long ago
    old = reg.register_worker(b"w1", SVC)
    reg.add_route(b"job-1", b"client-a", SVC, [old], push=True)
    clock.advance(2.5)

    # When it sends READY again (it reconnected or restarted with the same identity)
    new = reg.register_worker(b"w1", SVC)

    # Then a fresh record takes its place: no jobs, keepalive timed from now, no stale route
    assert new is not old
    assert reg.workers[b"w1"] is new and reg.services[SVC].workers == {b"w1": new}
    assert new.inflight == {} and old.inflight == {}
    assert b"job-1" not in reg.routes
    assert new.keepalive.hold_time_left() == INTERVAL * MULTIPLIER


def test_ready_under_another_service_moves_the_worker(reg: Registry) -> None:
    reg.register_worker(b"w1", SVC)

    reg.register_worker(b"w1", b"other")

    assert b"w1" not in reg.services[SVC].workers
    assert b"w1" in reg.services[b"other"].workers
    assert reg.select(SVC, "any") == []


def test_removing_a_worker_reports_its_jobs_in_flight_as_lost(reg: Registry) -> None:
    # Given a worker with two jobs from two clients
    w1 = reg.register_worker(b"w1", SVC)
    reg.add_route(b"job-1", b"client-a", SVC, [w1], push=True)
    reg.add_route(b"job-2", b"client-b", SVC, [w1], push=False)

    # When it is removed (purged or DISCONNECT)
    lost = reg.remove_worker(w1)

    # Then the broker learns which client owned each lost job, and the tables are clean
    assert lost == {b"job-1": b"client-a", b"job-2": b"client-b"}
    assert reg.routes == {}
    assert b"w1" not in reg.workers and b"w1" not in reg.services[SVC].workers
    assert w1.inflight == {}


def test_removing_one_worker_of_a_broadcast_keeps_the_route_for_the_other(reg: Registry) -> None:
    w1, w2 = reg.register_worker(b"w1", SVC), reg.register_worker(b"w2", SVC)
    reg.add_route(b"job-1", b"client-a", SVC, [w1, w2], push=True)

    lost = reg.remove_worker(w1)

    assert lost == {b"job-1": b"client-a"}
    assert reg.routes[b"job-1"].workers == {b"w2"}


def test_expired_workers_are_those_not_heard_within_the_hold_time(reg: Registry, clock: FakeClock) -> None:
    w1, w2 = reg.register_worker(b"w1", SVC), reg.register_worker(b"w2", SVC)
    clock.advance(2.0)
    w2.keepalive.heard()

    clock.advance(1.0)

    assert reg.expired_workers() == [w1]


# ---- selection -----------------------------------------------------------------------


def test_any_picks_the_least_loaded_worker(reg: Registry) -> None:
    w1, w2, w3 = (reg.register_worker(n, SVC) for n in (b"w1", b"w2", b"w3"))
    busy(reg, w1, 2)
    busy(reg, w2, 1)
    busy(reg, w3, 3)

    assert names(reg.select(SVC, "any")) == [b"w2"]


def test_any_rotates_between_equally_loaded_workers(reg: Registry) -> None:
    for n in (b"w1", b"w2", b"w3"):
        reg.register_worker(n, SVC)

    picks = [names(reg.select(SVC, "any"))[0] for _ in range(6)]

    assert picks == [b"w1", b"w2", b"w3", b"w1", b"w2", b"w3"]


def test_any_spreads_jobs_evenly_when_each_pick_gets_a_job(reg: Registry) -> None:
    for n in (b"w1", b"w2", b"w3"):
        reg.register_worker(n, SVC)

    for i in range(9):
        picked = reg.select(SVC, "any")
        reg.add_route(f"job-{i}".encode(), b"client-a", SVC, picked, push=True)

    assert sorted(len(w.inflight) for w in reg.workers.values()) == [3, 3, 3]


def test_any_skips_workers_whose_keepalive_expired(reg: Registry, clock: FakeClock) -> None:
    # Given an idle worker gone quiet and a busy one still heard from
    idle = reg.register_worker(b"idle", SVC)
    alive = reg.register_worker(b"alive", SVC)
    busy(reg, alive, 5)
    clock.advance(3.0)
    alive.keepalive.heard()
    assert idle.keepalive.expired()

    # Then the busy live worker is picked every time
    for _ in range(3):
        assert names(reg.select(SVC, "any")) == [b"alive"]


def test_any_with_every_worker_expired_selects_nobody(reg: Registry, clock: FakeClock) -> None:
    reg.register_worker(b"w1", SVC)
    clock.advance(10.0)

    assert reg.select(SVC, "any") == []


def test_all_selects_only_live_workers(reg: Registry, clock: FakeClock) -> None:
    reg.register_worker(b"w1", SVC)
    w2 = reg.register_worker(b"w2", SVC)
    w3 = reg.register_worker(b"w3", SVC)
    clock.advance(3.0)
    w2.keepalive.heard()
    w3.keepalive.heard()

    assert sorted(names(reg.select(SVC, "all"))) == [b"w2", b"w3"]


def test_a_worker_name_selects_that_worker_only_while_alive(reg: Registry, clock: FakeClock) -> None:
    reg.register_worker(b"w1", SVC)
    reg.register_worker(b"w2", SVC)

    assert names(reg.select(SVC, "w2")) == [b"w2"]
    assert reg.select(SVC, "w9") == []

    clock.advance(3.0)
    assert reg.select(SVC, "w2") == []


def test_a_list_of_names_selects_each_known_live_worker_once(reg: Registry) -> None:
    for n in (b"w1", b"w2", b"w3"):
        reg.register_worker(n, SVC)

    picked = reg.select(SVC, ["w3", "w1", "w3", "unknown"])

    assert names(picked) == [b"w3", b"w1"]


def test_a_worker_of_another_service_is_not_selected_by_name(reg: Registry) -> None:
    reg.register_worker(b"w1", b"other")
    reg.register_worker(b"w2", SVC)

    assert reg.select(SVC, ["w1", "w2"]) == [reg.workers[b"w2"]]


def test_unknown_service_selects_nobody(reg: Registry) -> None:
    reg.register_worker(b"w1", SVC)

    assert reg.select(b"nope", "any") == []
    assert reg.select(b"nope", "all") == []


def test_service_whose_workers_all_left_selects_nobody(reg: Registry) -> None:
    reg.remove_worker(reg.register_worker(b"w1", SVC))

    assert reg.select(SVC, "any") == []
    assert reg.select(SVC, "all") == []


# ---- capacity ------------------------------------------------------------------------


def test_worker_at_its_inflight_bound_has_no_capacity(clock: FakeClock) -> None:
    reg = make_registry(clock, max_inflight_per_worker=2)
    w1, w2 = reg.register_worker(b"w1", SVC), reg.register_worker(b"w2", SVC)
    busy(reg, w1, 1)

    assert reg.has_capacity([w1, w2])

    busy(reg, w1, 2)
    assert not reg.has_capacity([w1, w2])
    assert reg.has_capacity([w2])


def test_broker_at_its_route_bound_has_no_capacity(clock: FakeClock) -> None:
    reg = make_registry(clock, max_routes=2)
    w1 = reg.register_worker(b"w1", SVC)
    reg.add_route(b"job-1", b"c", SVC, [w1], push=True)
    assert reg.has_capacity([w1])

    reg.add_route(b"job-2", b"c", SVC, [w1], push=True)

    assert not reg.has_capacity([w1])


# ---- routes --------------------------------------------------------------------------


def test_add_route_records_the_job_on_each_worker(reg: Registry) -> None:
    w1, w2 = reg.register_worker(b"w1", SVC), reg.register_worker(b"w2", SVC)

    reg.add_route(b"job-1", b"client-a", SVC, [w1, w2], push=True)

    route = reg.routes[b"job-1"]
    assert (route.client, route.service, route.workers, route.push) == (b"client-a", SVC, {b"w1", b"w2"}, True)
    assert w1.inflight == {b"job-1": b"client-a"} and w2.inflight == {b"job-1": b"client-a"}
    assert (w1.jobs_dispatched, w2.jobs_dispatched) == (1, 1)
    assert reg.inflight_by_client() == {b"client-a": 1}


def test_route_is_deleted_when_the_last_worker_answers(reg: Registry) -> None:
    # Given a job broadcast to two workers
    w1, w2 = reg.register_worker(b"w1", SVC), reg.register_worker(b"w2", SVC)
    reg.add_route(b"job-1", b"client-a", SVC, [w1, w2], push=False)

    # When the first answers, the route waits for the other
    first = reg.complete(w1, b"job-1")
    assert first is not None and first.client == b"client-a"
    assert reg.routes[b"job-1"].workers == {b"w2"}

    # When the second answers, the route is gone
    second = reg.complete(w2, b"job-1")
    assert second is first
    assert b"job-1" not in reg.routes
    assert w1.inflight == {} and w2.inflight == {}


def test_completing_a_job_not_in_flight_on_that_worker_returns_none(reg: Registry) -> None:
    w1, w2 = reg.register_worker(b"w1", SVC), reg.register_worker(b"w2", SVC)
    reg.add_route(b"job-1", b"client-a", SVC, [w1], push=True)

    assert reg.complete(w2, b"job-1") is None
    assert reg.complete(w1, b"never-sent") is None
    assert reg.routes[b"job-1"].workers == {b"w1"}


def test_a_second_final_reply_for_the_same_job_returns_none(reg: Registry) -> None:
    w1 = reg.register_worker(b"w1", SVC)
    reg.add_route(b"job-1", b"client-a", SVC, [w1], push=True)
    assert reg.complete(w1, b"job-1") is not None

    assert reg.complete(w1, b"job-1") is None


# ---- clients -------------------------------------------------------------------------


def test_touching_a_client_counts_its_requests(reg: Registry) -> None:
    reg.touch_client(b"c1")
    rec = reg.touch_client(b"c1")

    assert rec.requests == 2
    assert rec.last_seen >= rec.first_seen


def test_client_table_is_bounded_and_evicts_the_longest_idle(clock: FakeClock) -> None:
    # Given a table of two clients where c1 was seen again after c2
    reg = make_registry(clock, max_clients=2)
    reg.touch_client(b"c1")
    reg.touch_client(b"c2")
    reg.touch_client(b"c1")

    # When a third client arrives
    reg.touch_client(b"c3")

    # Then c2, idle longest, is forgotten
    assert list(reg.clients) == [b"c1", b"c3"]
