"""A NorFab fabric unchanged on a zfab broker: NorFab's client and two NorFab workers (issue 44).

NorFab's workers take their inventory from the broker (sid.service.broker), a job returns on the
worker's result, not on NorFab's 10 s poll, and no answer of a two-worker job is lost. The
figures for 1,000 jobs are `norfab_load.py`'s (docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "norfab_suite"
_spec = importlib.util.spec_from_file_location("norfab_suite_run", HERE / "run.py")
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)

pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def norfab_python() -> Path:
    try:
        return suite.norfab_venv()
    except (OSError, subprocess.SubprocessError) as exc:
        reason = f"NorFab {suite.NORFAB} suite virtualenv unavailable: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.mark.parametrize("workers", ["norfab", "zfab"])
def test_a_norfab_client_on_a_zfab_broker_is_answered_fast_and_loses_nothing(norfab_python: Path, workers: str) -> None:
    """NorFab's client with two NorFab workers (a NorFab fabric), or with two zfab workers."""
    zfab = Path(sys.executable).with_name("zfab")
    cmd = [str(norfab_python), str(HERE / "norfab_load.py"), "--broker", "zfab", "--zfab", str(zfab)]
    cmd += ["--latency", "20", "--jobs", "200", "--window", "20", "--timeout", "30"]
    cmd += ["--zfab-workers"] if workers == "zfab" else []
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-3000:])
    out = json.loads(lines[-1])
    assert out["fanout"]["answers_missing"] == 0 and out["fanout"]["jobs_failed"] == 0
    # a job returns on the worker's answer: NorFab's client polls only every 10 s
    assert out["latency_ms"]["median"] < 2000, out
