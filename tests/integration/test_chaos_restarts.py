"""Nothing runs twice unannounced, nothing asked to retry is forgotten, across restarts and kills
(issue 39). Real processes on 127.0.0.1; executions are counted by the task itself (a line per run
in a file), independently of what zfab reports."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fabric import Fabric, fabric, free_port, wait_for, wait_workers

from tests.integration.declared_workers import marks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

COUNTER = "tests.integration.declared_workers:Counter"
FINAL = {"completed", "failed", "cancelled", "expired", "lost"}


def counter(f: Fabric, name: str, env: dict[str, str]) -> None:
    f.start(name, "worker", "--worker", COUNTER, "--name", name, env=env)


def api(f: Fabric, name: str, port: int, env: dict[str, str]) -> httpx.Client:
    f.start(name, "api", "--host", "127.0.0.1", "--port", str(port), env=env)
    c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    wait_for(lambda: c.get("/readyz").status_code == 200, 30, what=f"{name} ready")
    return c


def stored_state(f: Fabric, uuid: str) -> str | None:
    """The job's state in the API's SQLite file, read on a connection of our own (None: no row yet)."""
    db = Path(f.env["ZFAB_DATA_DIR"]) / "api" / "jobs.sqlite"
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute("SELECT state FROM jobs WHERE uuid=?", (uuid,)).fetchone()
    finally:
        conn.close()
    return str(row[0]) if row else None


def recorded_as_started(f: Fabric, uuid: str) -> None:
    """Wait until the API's database knows the job left the queue (its sweep writes what it knows)."""
    wait_for(lambda: stored_state(f, uuid) in ("dispatched", "running"), 15, what=f"job {uuid} recorded as started")


def alive(c: httpx.Client, names: set[str]) -> bool:
    return names <= {w["name"] for w in c.get("/mmi/workers", params={"status": "alive"}).json()}


def final(c: httpx.Client, uuid: str, within: float = 40) -> dict[str, Any]:
    deadline = time.monotonic() + within
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = c.get(f"/jobs/{uuid}", params={"wait": 5}).json()
        if job.get("state") in FINAL:
            return job
    raise AssertionError(f"job {uuid} not final in {within} s: {job}")


def mark(token: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"service": "count", "task": "mark", "kwargs": {"token": token, "seconds": seconds}, **extra}


def test_an_api_restart_after_a_broker_restart_does_not_run_again_a_job_that_left_the_queue(tmp_path: Path) -> None:
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file), "ZFAB_POOL_SIZE": "1", "ZFAB_WORKER_PREFETCH": "0"}
    port = free_port()
    with fabric(tmp_path) as f:
        f.broker()
        counter(f, "c1", env)
        counter(f, "c2", env)
        c = api(f, "api1", port, env)
        wait_for(lambda: alive(c, {"c1", "c2"}), 30, what="both counters")
        # Given both workers busy, so that the job waits in the broker's queue when the API records it
        for n in (1, 2):
            assert c.post("/jobs", json=mark(f"busy{n}", 2.0)).status_code == 202
        job = c.post("/jobs", json=mark("x", 3.0)).json()
        assert job["state"] == "queued", job
        # and then dispatched and running when the broker and then the API are killed and restarted
        wait_for(lambda: marks(marks_file, "x") == 1, 15, what="the job started")
        recorded_as_started(f, job["uuid"])  # what the API knows is on disk
        f.kill("broker")
        f.broker("broker2")
        wait_for(lambda: c.get("/readyz").status_code == 200, 20, what="the broker back")
        f.kill("api1")
        c.close()
        c = api(f, "api2", port, env)
        # Then the restarted API asks the fabric instead of submitting it again: it ran once, attempt 1
        got = final(c, job["uuid"])
        assert got["state"] == "completed" and got["attempt"] == 1 and got["attempts"] == [], got
        time.sleep(2 * f.hold_time)
        assert marks(marks_file, "x") == 1
        # (the new broker was never sent the job again: a worker other than the one running it would
        # have run it twice, and which one gets it is the new broker's choice)
        assert c.get("/mmi/broker").json()["counts"].get("post", 0) == 0
        c.close()


def test_retries_survive_a_worker_restart_followed_by_an_api_restart(tmp_path: Path) -> None:
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file), "ZFAB_POOL_SIZE": "1"}
    port = free_port()
    with fabric(tmp_path) as f:
        f.broker()
        counter(f, "c1", env)
        c = api(f, "api1", port, env)
        wait_for(lambda: alive(c, {"c1"}), 30, what="the counter")
        # Given a job that asked for one retry, running
        job = c.post("/jobs", json=mark("r", 3.0, retries=1, timeout=30)).json()
        wait_for(lambda: marks(marks_file, "r") == 1, 15, what="the job started")
        recorded_as_started(f, job["uuid"])  # recorded as running on c1
        # When its worker and the API die together, and the worker comes back before the API does
        f.kill("api1")
        f.kill("c1")
        c.close()
        counter(f, "c1b", {**env})  # another worker takes attempt 2 ...
        f.start("c1-again", "worker", "--worker", COUNTER, "--name", "c1", env=env)  # ... c1's store says interrupted
        c = api(f, "api2", port, env)
        # Then the job runs again as attempt 2, and says so
        got = final(c, job["uuid"])
        assert got["state"] == "completed" and got["attempt"] == 2, got
        assert [a["attempt"] for a in got["attempts"]] == [1] and got["attempts"][0]["status"] == "lost", got
        assert marks(marks_file, "r") == 2  # ran as often as the attempts it reports, no more
        c.close()


def test_a_job_nobody_knows_after_restarts_ends_lost_with_a_reason_and_never_runs_again(tmp_path: Path) -> None:
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file), "ZFAB_POOL_SIZE": "1"}
    port = free_port()
    with fabric(tmp_path) as f:
        f.broker()
        counter(f, "c1", env)
        counter(f, "c2", env)
        c = api(f, "api1", port, env)
        wait_for(lambda: alive(c, {"c1", "c2"}), 30, what="both counters")
        job = c.post("/jobs", json=mark("gone", 5.0, workers="c1", retries=0, timeout=4)).json()
        wait_for(lambda: marks(marks_file, "gone") == 1, 15, what="the job started")
        recorded_as_started(f, job["uuid"])
        # c1 dies for good with the API; the API comes back and finds nobody who knows the job
        f.kill("api1")
        f.kill("c1")
        c.close()
        c = api(f, "api2", port, env)
        got = final(c, job["uuid"])
        why = got["reason"] or ""
        assert got["state"] == "lost" and "c1" in why and "unknown" in why, (got["state"], why)
        time.sleep(2 * f.hold_time)
        assert marks(marks_file, "gone") == 1
        c.close()


def test_a_job_still_queued_at_the_broker_when_the_api_restarts_runs_once(tmp_path: Path) -> None:
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file), "ZFAB_POOL_SIZE": "1", "ZFAB_WORKER_PREFETCH": "0"}
    port = free_port()
    with fabric(tmp_path) as f:
        f.broker()
        counter(f, "c1", env)
        c = api(f, "api1", port, env)
        wait_for(lambda: alive(c, {"c1"}), 30, what="the counter")
        # Given a job waiting in the broker's queue behind a busy worker (it asked for a retry)
        assert c.post("/jobs", json=mark("blocker", 8.0)).status_code == 202
        wait_for(lambda: marks(marks_file, "blocker") == 1, 15, what="the blocker started")
        job = c.post("/jobs", json=mark("q", 0.0, retries=1)).json()
        assert job["state"] == "queued", job
        wait_for(lambda: stored_state(f, job["uuid"]) == "queued", 15, what="the job recorded as queued")
        # When the API is killed and comes back while it still waits there
        f.kill("api1")
        c.close()
        c = api(f, "api2", port, env)
        # Then the workers are asked first (none has it), it is sent again under its uuid (the broker
        # dedupes), and it runs once, as attempt 1
        got = final(c, job["uuid"])
        assert got["state"] == "completed" and got["attempt"] == 1, got
        time.sleep(2 * f.hold_time)
        assert marks(marks_file, "q") == 1
        c.close()


def test_a_results_only_job_sent_again_after_a_broker_restart_runs_once(tmp_path: Path) -> None:
    # Given a results-only client (no 202: it never learns which worker has its job), its job running on
    # c1 while c2 is idle, and the broker (no lease) killed and started again
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file), "ZFAB_POOL_SIZE": "1"}
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker("b1")
        counter(f, "c1", env)
        counter(f, "c2", env)
        with f.client(acks=False) as c:
            wait_workers(c, {"c1", "c2"})
            fut = c.submit("count", "mark", kwargs={"token": "once", "seconds": 3.0}, timeout=60)
            wait_for(lambda: marks(marks_file, "once") == 1, 15, what="the job started")
            f.kill("b1")
            f.broker("b2")
            # When the client sends it again to the new broker (it can only POST it: it knows no worker),
            # then the broker holds it until the worker that has it says so, and it ends on that worker
            result = fut.result(40)
            (entry,) = result.values()
            assert not entry["failed"], result
        # (a second run elsewhere would have started at once when the job was sent again, 3 s before this)
        assert marks(marks_file, "once") == 1
