"""bench/console.py builds its table from the API's own models: run quick, so a renamed model or state
breaks `make bench` here rather than in the speed check (JobState's members were renamed once and the
bench failed only there)."""

from __future__ import annotations

from bench import console


def test_the_console_bench_runs_quick_on_the_apis_models() -> None:
    console.run(quick=True)
