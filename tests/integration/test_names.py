"""Worker names with real processes: a name that is a path is refused by the CLI in one line, and a
name has one owner at the broker (a second worker under a live one's name is refused, a restarted one
gets its name back at once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fabric import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.mark.parametrize("flags", [["--name", "a/b"], ["--name", "../x"], ["--name", ".."]])
def test_zfab_worker_refuses_a_name_that_is_a_path_in_one_line_with_exit_code_2(tmp_path: Path, flags: list[str]) -> None:
    data = tmp_path / "data"
    env = dict(os.environ, ZFAB_DATA_DIR=str(data), ZFAB_BROKER="tcp://127.0.0.1:9")
    r = subprocess.run(
        [sys.executable, "-m", "zfab.cli", "worker", *flags],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("zfab worker: ") and "not allowed" in lines[0], lines
    assert "Traceback" not in r.stderr
    assert not any(tmp_path.rglob("*.lock")) and not (tmp_path / "x.lock").exists()
