"""No answer claims what the API does not know (issue 37 item 6): a POST the broker never confirms
answers 202 with the job's uuid and `outcome_unknown`, the API follows that uuid to the truth, and
/readyz turns not-ready within the broker's hold time of losing it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from fabric import fabric, free_port, wait_for

from tests.integration.declared_workers import marks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

COUNTER = "tests.integration.declared_workers:Counter"


def test_a_post_the_broker_never_confirms_says_so_and_ends_in_what_ran(tmp_path: Path) -> None:
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file)}
    port = free_port()
    with fabric(tmp_path, interval=1.0, multiplier=3) as f:  # a hold time of 3 s
        f.broker()
        f.start("cnt", "worker", "--worker", COUNTER, "--name", "cnt", env=env)
        f.start("api", "api", "--host", "127.0.0.1", "--port", str(port), env=env)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            wait_for(lambda: c.get("/readyz").status_code == 200, 30, what="the API ready")
            warm = c.post("/jobs?wait=10", json={"service": "count", "task": "mark", "kwargs": {"token": "warm"}})
            assert warm.json()["state"] == "completed", warm.text
            # Given a broker that dies with the API still counting it alive
            f.kill("broker")
            r = c.post("/jobs", json={"service": "count", "task": "mark", "kwargs": {"token": "once"}, "timeout": 60})
            # Then the answer is no 503 (a caller told to retry would run it twice) but the job's uuid,
            # saying its outcome is unknown
            assert r.status_code == 202, r.text
            job = r.json()
            assert job["outcome_unknown"] is True and job["state"] not in ("completed", "failed", "lost"), job
            assert r.headers["Location"].endswith(job["uuid"])
            # and /readyz said not ready within the hold time of the loss (it is polled after the POST's
            # admission wait here, so only its answer counts, not when it turned)
            assert c.get("/readyz").status_code == 503
            assert marks(marks_file, "once") == 0
            # When the broker comes back, the API follows the uuid: the job runs once and says so
            f.broker("broker2")
            got = c.get(f"/jobs/{job['uuid']}", params={"wait": 30}).json()
            assert got["state"] == "completed" and got["outcome_unknown"] is False, got
            assert got["attempt"] == 1 and marks(marks_file, "once") == 1
            # and a later look (past a hold time) finds no second run
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:
                assert marks(marks_file, "once") == 1
                time.sleep(0.2)


def test_readyz_turns_not_ready_within_the_hold_time_of_losing_the_broker(tmp_path: Path) -> None:
    port = free_port()
    with fabric(tmp_path, interval=1.0, multiplier=3) as f:
        f.broker()
        f.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            wait_for(lambda: c.get("/readyz").status_code == 200, 30, what="the API ready")
            f.kill("broker")
            t0 = time.monotonic()
            wait_for(lambda: c.get("/readyz").status_code == 503, f.hold_time + 1.5, what="/readyz not ready")
            took = time.monotonic() - t0
            assert took <= f.hold_time + 1.5
            # and a POST now is refused at once, never sent: retrying it as told runs it once
            r = c.post("/jobs", json={"service": "demo", "task": "echo", "kwargs": {"data": 1}})
            assert r.status_code == 503 and "Retry-After" in r.headers, r.text
