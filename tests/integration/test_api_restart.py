"""The API keeps its job table in SQLite: after a restart GET /jobs/{uuid} still answers, and jobs that
were running are recovered from their workers by GET."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from fabric import Fabric, fabric, free_port, wait_for

from zfab.api.jobs.record import JobRecord
from zfab.api.models import JobState
from zfab.api.server import GRACEFUL_SHUTDOWN_SECONDS
from zfab.api.store.sqlite import JobDB, row_of
from zfab.client.future import JobFuture
from zfab.errors import ClosedError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def finished(uuid: str, worker: str = "w1", value: object = 1) -> JobFuture:
    fut = JobFuture(uuid)
    fut.timings.update(submitted=time.time(), completed=time.time())
    fut.set_result({worker: {"result": value, "failed": False, "errors": []}})
    return fut


def test_the_job_table_on_disk_is_bounded_and_scoped_to_its_broker(tmp_path: Path) -> None:
    db = JobDB(tmp_path / "api" / "jobs.sqlite", capacity=3)
    recs = [JobRecord(f"j{i}", "demo", "echo", "any", finished(f"j{i}", value=i), "") for i in range(5)]
    db.write([row_of(r, "tcp://a") for r in recs])
    db.write([row_of(JobRecord("other", "demo", "echo", "any", finished("other"), ""), "tcp://b")])
    # an update keeps the job's place (rows are ordered by first write)
    db.write([row_of(recs[3], "tcp://a")])
    loaded = db.load("tcp://a")
    assert [r.uuid for r in loaded] == ["j3", "j4"]  # three rows kept in all: j3, j4 and other
    assert [r.uuid for r in db.load("tcp://b")] == ["other"]
    (j3, _) = loaded
    assert j3.future is None and j3.done and j3.view().state is JobState.COMPLETED
    assert j3.view().results == {"w1": {"result": 3, "failed": False, "errors": []}}
    assert j3.dispatched() == ["w1"]
    # a job cut off by the API's own shutdown is stored as unfinished, to be recovered later
    closing = JobFuture("c1")
    closing.timings["submitted"] = time.time()
    closing.worker = "w2"
    closing.set_exception(ClosedError("client closed before job c1 finished"))
    db.write([row_of(JobRecord("c1", "demo", "sleep", "any", closing, "", 30.0), "tcp://a")])
    (c1,) = [r for r in db.load("tcp://a") if r.uuid == "c1"]
    assert c1.view().state is JobState.RUNNING and not c1.done and c1.ran_on == ["w2"] and c1.timeout == 30.0
    db.close()


def start_api(f: Fabric, name: str, port: int, **env: str) -> httpx.Client:
    f.start(name, "api", "--host", "127.0.0.1", "--port", str(port), env=env)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(base + "/healthz", timeout=1).status_code == 200, 20, what=f"{name} /healthz")
    return httpx.Client(base_url=base, timeout=30)


def stored_state(db: Path, uuid: str) -> str | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute("SELECT state FROM jobs WHERE uuid=?", (uuid,)).fetchone()
    finally:
        conn.close()
    return str(row[0]) if row else None


def test_jobs_survive_an_api_restart_and_running_ones_are_recovered(tmp_path: Path) -> None:
    db = tmp_path / "data" / "api" / "jobs.sqlite"
    port = free_port()
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with start_api(f, "api1", port) as c:
            wait_for(
                lambda: {"w1", "w2"} <= {w["name"] for w in c.get("/mmi/workers", params={"status": "alive"}).json()},
                20,
                what="workers alive",
            )
            # Given finished jobs, and jobs still running when the API dies
            key = {"Idempotency-Key": "restart-1"}
            echo_body = {"service": "demo", "task": "echo", "kwargs": {"data": "kept"}}
            echo = c.post("/jobs?wait=10", json=echo_body, headers=key).json()
            assert echo["state"] == "completed"
            progress = c.post(
                "/jobs?wait=10", json={"service": "demo", "task": "progress", "kwargs": {"steps": 3, "delay": 0}}
            ).json()
            assert progress["state"] == "completed"
            sleep = {"service": "demo", "task": "sleep", "kwargs": {"seconds": 3}}
            one = c.post("/jobs", json=sleep).json()
            both = c.post("/jobs", json={**sleep, "workers": "all"}).json()
            assert one["state"] in ("queued", "running") and both["state"] in ("queued", "running")
            for uuid, state in ((echo["uuid"], "completed"), (one["uuid"], "running"), (both["uuid"], "running")):
                wait_for(lambda u=uuid, s=state: stored_state(db, u) == s, 10, what=f"job {uuid} on disk")
        # When the API is killed outright and started again
        f.kill("api1")
        with start_api(f, "api2", port, ZFAB_SSE_PING_SECONDS="0.3") as c:
            # Then finished jobs read as before
            r = c.get(f"/jobs/{echo['uuid']}")
            assert r.status_code == 200 and r.json()["results"] == echo["results"]
            assert r.json()["state"] == "completed" and r.json()["submitted_at"] == echo["submitted_at"]
            assert c.get("/jobs").json()["total"] == 4
            again = c.post("/jobs", json=echo_body, headers=key)  # the Idempotency-Key still maps to that run
            assert again.status_code == 200 and again.json()["uuid"] == echo["uuid"]
            # and the running ones are recovered from their workers once they finish
            r = c.get(f"/jobs/{one['uuid']}", params={"wait": 20})
            job = r.json()
            assert r.status_code == 200 and job["state"] == "completed", job
            ((worker, entry),) = job["results"].items()
            assert worker in {"w1", "w2"} and entry["result"] >= 3
            r = c.get(f"/jobs/{both['uuid']}", params={"wait": 20})
            assert r.json()["state"] == "completed" and r.json()["results"].keys() == {"w1", "w2"}, r.json()
            # the events of a job from before the restart are read back from its worker
            with c.stream("GET", f"/jobs/{progress['uuid']}/events") as resp:
                text = resp.read().decode()
            blocks = [b for b in text.split("\n\n") if b.strip()]
            assert [b.splitlines()[0] for b in blocks] == ["id: 1", "id: 2", "id: 3", "event: end"]
            messages = [json.loads(b.splitlines()[1][len("data: ") :])["message"] for b in blocks[:3]]
            assert messages == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
            wait_for(lambda: stored_state(db, one["uuid"]) == "completed", 10, what="the recovered result on disk")
            wait_for(lambda: stored_state(db, both["uuid"]) == "completed", 10, what="the recovered result on disk")
            # A clean stop with a caller following a long job: its stream ends (to resume with
            # Last-Event-ID on the next API) instead of holding the shutdown up
            long = c.post("/jobs", json={**sleep, "kwargs": {"seconds": 60}}).json()
            with c.stream("GET", f"/jobs/{long['uuid']}/events") as resp:
                lines = resp.iter_lines()
                wait_for(lambda: next(lines) == ": ping", 10, what="the stream established")
                t0 = time.monotonic()
                f.signal("api2", signal.SIGTERM)
                rest = list(lines)
            assert "event: end" not in rest  # ended before the 60 s job did
        assert f.procs["api2"].wait(15) == 0, f.log("api2")
        assert time.monotonic() - t0 < GRACEFUL_SHUTDOWN_SECONDS, "the API took its whole graceful-shutdown bound"
        with start_api(f, "api3", port) as c:
            r = c.get(f"/jobs/{both['uuid']}")
            assert r.json()["state"] == "completed" and r.json()["results"].keys() == {"w1", "w2"}
            # a finished job is read back, not recovered again (the 60 s one still running may be)
            assert f"recovering job {both['uuid']}" not in f.log("api3")
            assert f"recovering job {one['uuid']}" not in f.log("api3")
            assert c.get(f"/jobs/{long['uuid']}").json()["state"] == "running"  # its worker still runs it
            assert c.delete(f"/jobs/{long['uuid']}").status_code == 202
