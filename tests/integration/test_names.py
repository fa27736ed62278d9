"""Worker names with real processes: a name that is a path is refused by the CLI in one line, and a
name has one owner at the broker (a second worker under a live one's name is refused, a restarted one
gets its name back at once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fabric import ROOT, Fabric, fabric, wait_for, wait_workers

from zfab import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.mark.parametrize("flags", [["--name", "a/b"], ["--name", "../x"], ["--name", ".."]])
def test_zfab_worker_refuses_a_name_that_is_a_path_in_one_line_with_exit_code_2(
    tmp_path: Path, flags: list[str]
) -> None:
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


def _lines(f: Fabric, name: str) -> int:
    return len(f.log(name).splitlines())


def _w1(c: Client) -> list[dict[str, Any]]:
    return [w for w in c.mmi("show_workers", timeout=2) if w["name"] == "w1"]


def test_a_second_worker_under_a_live_name_is_refused_and_the_first_keeps_its_place_and_jobs(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.5, multiplier=6) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            running = c.submit("demo", "sleep", kwargs={"seconds": 3}, workers="w1", timeout=20)
            wait_for(lambda: running.state == "running", 10, what="a job running on the first w1")
            before = _lines(f, "broker") + _lines(f, "w1")
            # a second w1 with a data directory of its own, as on another host
            f.start(
                "w1-second", "worker", "--service", "demo", "--name", "w1", env={"ZFAB_DATA_DIR": str(tmp_path / "d2")}
            )
            wait_for(lambda: "already connected from" in f.log("w1-second"), 15, what="the second w1 told why")
            # it tried again (it waits, then comes back): still refused, and the logs stay quiet
            wait_for(lambda: c.mmi("show_broker")["counts"].get("worker_name_taken", 0) >= 2, 10, what="a retry")
            assert (entry := running.result(20)["w1"])["failed"] is False, entry  # not lost, not run twice
            assert (
                c.run_job("demo", "echo", kwargs={"data": "after"}, workers="w1", timeout=10)["w1"]["result"] == "after"
            )
            (only,) = _w1(c)
            assert only["alive_for_s"] >= 3.0  # the first registration, not a new one
            gained = _lines(f, "broker") + _lines(f, "w1") - before
            assert gained < 10, f.log("broker")[-2000:]
            assert f.procs["w1-second"].poll() is None  # it waits to take the name over: it does not exit
            said = [line for line in f.log("w1-second").splitlines() if "already connected from" in line]
            assert len(said) == 1 and "choose another --name" in said[0]


def test_a_killed_worker_restarted_under_its_name_gets_it_back_within_a_second_not_a_hold_time(
    tmp_path: Path,
) -> None:
    with fabric(tmp_path, interval=1.0, multiplier=10) as f:  # a hold time of 10 s
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            f.kill("w1")
            t = time.monotonic()
            f.worker("w1")
            wait_for(lambda: (w := _w1(c)) and w[0]["alive_for_s"] < time.monotonic() - t, 10, what="w1 back")
            took = time.monotonic() - t
            assert took < 8.0, f"the restarted w1 registered after {took:.1f} s"  # well inside the hold time
            assert (
                c.run_job("demo", "echo", kwargs={"data": "back"}, workers="w1", timeout=10)["w1"]["result"] == "back"
            )
            assert "already connected" not in f.log("w1")


def test_a_refused_worker_takes_the_name_over_once_its_holder_stops(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=3) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            f.start(
                "w1-second", "worker", "--service", "demo", "--name", "w1", env={"ZFAB_DATA_DIR": str(tmp_path / "d2")}
            )
            wait_for(lambda: "already connected from" in f.log("w1-second"), 15, what="the second w1 refused")
            f.signal("w1", signal.SIGTERM)  # the holder leaves (DISCONNECT): the name is free
            wait_for(lambda: "registered with the broker" in f.log("w1-second"), 10, what="the second w1 takes over")
            assert c.run_job("demo", "echo", kwargs={"data": "x"}, workers="w1", timeout=10)["w1"]["result"] == "x"


def test_a_second_zfab_worker_under_a_name_held_in_the_same_data_directory_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    with fabric(tmp_path) as f:
        f.worker("w1")  # no broker needed: the name is held by its lock in the data directory
        wait_for(lambda: " ready" in f.log("w1"), 15, what="the first w1 started")
        r = subprocess.run(
            [sys.executable, "-m", "zfab.cli", "worker", "--service", "demo", "--name", "w1"],
            env=f.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "another worker named 'w1' is running" in lines[0], r.stderr
