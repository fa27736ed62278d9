"""A task that raises leaves its traceback in the worker's log at the default level: bounded in size,
and throttled under a storm of failures (the lines held back counted in the next one logged)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zfab import Settings
from zfab.core import protocol as nfp
from zfab.core.logbudget import LogBudget, clip
from zfab.transport import FakeClock, StubLoop, StubTransport
from zfab.worker import admission, runner
from zfab.workers.demo import DemoWorker

PAUSE = threading.Event()  # never set: the waits below poll with a deadline


def test_a_budget_lets_a_burst_through_then_a_steady_rate_and_counts_what_it_held() -> None:
    clock = FakeClock()
    budget = LogBudget(burst=3, per_second=0.5, clock=clock)
    assert [budget.take() for _ in range(3)] == [0, 0, 0]
    assert [budget.take() for _ in range(4)] == [None] * 4
    clock.advance(2.0)  # one line's worth refilled
    assert budget.take() == 4  # logged, saying four were held back
    assert budget.take() is None
    clock.advance(100.0)  # refills up to the burst, not past it
    assert [budget.take() for _ in range(4)] == [1, 0, 0, None]
    assert budget.held_total == 6


def test_a_budget_refuses_a_setting_that_would_log_nothing() -> None:
    with pytest.raises(ValueError, match="burst"):
        LogBudget(burst=0)
    with pytest.raises(ValueError, match="per_second"):
        LogBudget(per_second=0)


def test_clip_keeps_a_tracebacks_first_line_and_its_end() -> None:
    tb = "Traceback (most recent call last):\n" + "  frame\n" * 2000 + "RuntimeError: the end"
    out = clip(tb, 1000)
    assert len(out) < 1100
    assert out.startswith("Traceback (most recent call last):") and out.endswith("RuntimeError: the end")
    assert "characters left out" in out
    assert clip("short", 1000) == "short"


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[DemoWorker, FakeClock]]:
    clock = FakeClock()
    s = Settings(data_dir=str(tmp_path), keepalive_interval=1.0, keepalive_multiplier=3, pool_size=1)
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock)
    w.start()
    yield w, clock
    w.stop(drain=0)


def run(w: DemoWorker, uuid: bytes, body: dict[str, Any]) -> dict[str, Any]:
    """POST a job to the worker (the test plays the broker) and return its result entry."""
    loop = w.loop
    assert isinstance(loop, StubLoop)
    loop.feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", uuid, nfp.dumps(body)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        loop.tick()
        for f in loop.take():
            if f[2] == nfp.RESPONSE and f[5] == uuid and f[6] == nfp.ST_OK:
                entry: dict[str, Any] = json.loads(f[7])["w1"]
                return entry
        PAUSE.wait(0.005)
    raise AssertionError(f"no result for {uuid!r}")


def test_a_task_that_raises_logs_its_traceback_at_warning(
    worker: tuple[DemoWorker, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    w, _ = worker
    caplog.set_level(logging.WARNING, logger="zfab.worker.runner")
    entry = run(w, b"j1", {"task": "fail", "kwargs": {"message": "boom-4711"}})
    assert entry["failed"]
    [rec] = [r for r in caplog.records if "boom-4711" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    text = rec.getMessage()
    assert "Traceback (most recent call last)" in text and "task fail of job j1 raised" in text
    assert "w1" in text and "attempt 1 of 1" in text


def test_a_storm_of_failures_is_throttled_and_the_held_lines_are_counted(
    worker: tuple[DemoWorker, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    w, clock = worker
    caplog.set_level(logging.WARNING, logger="zfab.worker.runner")
    n = runner.FAILURE_LOG_BURST + 15
    for i in range(n):
        assert run(w, f"s{i}".encode(), {"task": "fail", "kwargs": {"message": f"storm-{i}"}})["failed"]
    logged = [r for r in caplog.records if "storm-" in r.getMessage()]
    assert len(logged) == runner.FAILURE_LOG_BURST  # the fake clock stood still: the burst, no more
    clock.advance(1 / runner.FAILURE_LOG_RATE)
    run(w, b"after", {"task": "fail", "kwargs": {"message": "after-storm"}})
    [after] = [r for r in caplog.records if "after-storm" in r.getMessage()]
    assert "15 more failures not logged" in after.getMessage()


def test_a_huge_traceback_is_logged_clipped(
    worker: tuple[DemoWorker, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    w, _ = worker
    caplog.set_level(logging.WARNING, logger="zfab.worker.runner")
    big = "x" * (runner.MAX_LOGGED_TRACEBACK * 4)
    entry = run(w, b"big", {"task": "fail", "kwargs": {"message": big}})
    assert big in entry["errors"][0]  # the result keeps it whole (the API decides who sees it)
    [rec] = [r for r in caplog.records if "task fail of job big" in r.getMessage()]
    assert len(rec.getMessage()) < runner.MAX_LOGGED_TRACEBACK + 500
    assert "Traceback (most recent call last)" in rec.getMessage()


def test_a_flood_of_malformed_frames_is_logged_a_few_times_and_every_one_counted(
    worker: tuple[DemoWorker, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a worker (its log budget: admission.REFUSALS_LOGGED_AT_ONCE lines, then a steady trickle)
    w, clock = worker
    loop = w.loop
    assert isinstance(loop, StubLoop)
    caplog.set_level(logging.WARNING, logger="zfab.worker")
    # When a peer sends 50 frames that do not decode, while the clock stands still
    for i in range(50):
        loop.feed([b"", b"NOT-NFP", b"%d" % i])
    # Then each is counted, and only the burst is logged
    assert w.counts["rejected_frames"] == 50
    said = [r.getMessage() for r in caplog.records if "dropped a malformed message" in r.getMessage()]
    assert len(said) == admission.REFUSALS_LOGGED_AT_ONCE
    # And once the budget refills, the next line says how many were held back
    clock.advance(1 / admission.REFUSALS_LOGGED_PER_SECOND)
    loop.feed([b"", b"NOT-NFP", b"last"])
    said = [r.getMessage() for r in caplog.records if "dropped a malformed message" in r.getMessage()]
    assert len(said) == admission.REFUSALS_LOGGED_AT_ONCE + 1
    assert f"({50 - admission.REFUSALS_LOGGED_AT_ONCE} more not logged)" in said[-1]
