"""NorFab 0.25's own NFPClient talks to a zfab broker and zfab demo workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from fabric import Fabric, fabric, wait_workers
from norfab_env import last_failure_reason, norfab_python, run_driver

pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def norfab() -> Path:
    python = norfab_python()
    if python is None:
        reason = f"NorFab 0.25 virtualenv unavailable: {last_failure_reason()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def _ready(f: Fabric, names: set[str]) -> None:
    with f.client("probe") as c:
        wait_workers(c, names)


def test_norfab_client_runs_a_job_and_reads_show_workers(tmp_path: Path, norfab: Path) -> None:
    with fabric(tmp_path, interval=0.5, multiplier=6) as f:
        f.broker()
        f.worker("demo-1")
        f.worker("demo-2")
        _ready(f, {"demo-1", "demo-2"})
        rc, out, err = run_driver(norfab, f.endpoint, service="demo", task="echo", kwargs={"data": "from norfab"})
        assert rc == 0, (out, err[-2000:])
        result = out["result"]
        (name,) = result
        assert name in {"demo-1", "demo-2"}
        assert result[name]["result"] == "from norfab" and result[name]["failed"] is False
        # NorFab's client waits for run_job's result_ready + GET round trip, not its 10 s poll
        assert out["elapsed"]["run_job"] < 5
        workers = out["show_workers"]["results"]
        assert {w["name"] for w in workers} == {"demo-1", "demo-2"}
        assert all(w["status"] == "alive" and "keepalives tx/rx" in w for w in workers)


def test_norfab_client_targets_all_workers(tmp_path: Path, norfab: Path) -> None:
    with fabric(tmp_path, interval=0.5, multiplier=6) as f:
        f.broker()
        f.worker("demo-1")
        f.worker("demo-2")
        _ready(f, {"demo-1", "demo-2"})
        rc, out, err = run_driver(norfab, f.endpoint, task="add", kwargs={"a": 2, "b": 3}, workers="all")
        assert rc == 0, (out, err[-2000:])
        assert {k: v["result"] for k, v in out["result"].items()} == {"demo-1": 5, "demo-2": 5}
