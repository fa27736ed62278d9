"""The worker's credits: fixed prefetch, the adaptive one from run times, and when a change is told."""

from __future__ import annotations

import pytest

from zfab import Settings
from zfab.worker.credits import ADAPTIVE_MAX, credits_for, worth_telling


def settings(**kw: object) -> Settings:
    return Settings(**{"pool_size": 4, "job_queue_size": 1000, **kw})  # type: ignore[arg-type]


def test_a_fixed_prefetch_is_taken_as_set_whatever_the_run_times() -> None:
    s = settings(worker_prefetch=3)
    assert credits_for(s, 0.0, False) == credits_for(s, 0.0001, False) == credits_for(s, 30.0, False) == 4 + 3


def test_the_adaptive_prefetch_starts_at_nothing_before_any_job_ran() -> None:
    assert credits_for(settings(), 0.0, False) == 4


@pytest.mark.parametrize(
    ("run_time", "prefetch"),
    [
        (10.0, 0),  # long jobs: none wait behind one another on this worker
        (0.05, 4),  # 50 ms of waiting work per pool thread: one job each
        (0.01, 20),
        (0.0001, ADAPTIVE_MAX),  # very short jobs: the cap
    ],
)
def test_the_adaptive_prefetch_aims_at_fifty_ms_of_waiting_work_per_thread(run_time: float, prefetch: int) -> None:
    assert credits_for(settings(), run_time, False) == 4 + prefetch


def test_credits_never_exceed_what_the_pool_and_its_queue_hold_and_async_slots_add() -> None:
    assert credits_for(settings(job_queue_size=2), 0.0001, False) == 4 + 2
    assert credits_for(settings(worker_prefetch=1, async_concurrency=50), 0.0, True) == 4 + 1 + 50
    assert credits_for(settings(pool_size=1, worker_prefetch=0), 0.0, False) >= 1


def test_only_a_change_of_half_or_more_is_worth_a_message() -> None:
    assert not worth_telling(10, 10)
    assert not worth_telling(10, 14) and not worth_telling(10, 7)
    assert worth_telling(10, 15) and worth_telling(10, 6)
    assert worth_telling(1, 2)  # a fresh single-thread worker whose jobs turned out short
