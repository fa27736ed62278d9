"""A short random-kill soak (issue 39; `make chaos` runs the long one): jobs through the API with
`retries: 1` while workers are SIGKILLed at random and the broker and the API once each, every job
audited against the task's own count of its executions (bench/chaos.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import soak

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_short_random_kill_soak_keeps_every_promise(tmp_path: Path) -> None:
    figures = soak(tmp_path, 300, workers=3, kill_every=1.0, threads=6, seed=39, worker_kills=3)
    assert figures["violations"] == [], figures
    kills = figures["kills"]
    assert figures["accepted"] == 300 and kills["broker"] == 1 and kills["api"] == 1 and kills["worker"] >= 3
    assert figures["executions"] >= figures["states"].get("completed", 0)
