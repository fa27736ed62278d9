"""Periodic schedules against a real `zfab api` (with a broker and a demo worker): they fire ordinary jobs,
pause, resume and stop, survive a restart, and a firing missed while the API was down runs once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fabric import ROOT, Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ECHO = {"service": "demo", "task": "echo", "kwargs": {"data": "tick"}}


class Api:
    """A `zfab api` process of a fabric, restartable on the same port and database."""

    def __init__(self, f: Fabric, **env: str) -> None:
        self.f = f
        self.port = free_port()
        self.db = f.tmp / "api.sqlite"
        self.env = {"ZFAB_API_DB": str(self.db), **env}
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def start(self) -> None:
        self.f.start("api", "api", "--port", str(self.port), env=self.env)
        wait_for(lambda: self.http.get("/readyz").status_code == 200, 30, what="the API ready")

    def stop(self) -> None:
        self.f.signal("api", signal.SIGTERM)
        self.f.procs["api"].wait(20)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    f = Fabric(tmp_path)
    try:
        f.broker()
        f.worker("w1")
        a = Api(f)
        a.start()
        wait_for(
            lambda: a.http.post("/jobs?wait=5", json={"service": "demo", "task": "echo"}).status_code == 200,
            30,
            what="a demo job to complete",
        )
        yield a
        a.http.close()
    finally:
        f.stop()


def schedule(api: Api, sid: str) -> dict[str, Any]:
    r = api.http.get(f"/schedules/{sid}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def job_uuids(api: Api) -> set[str]:
    return {j["uuid"] for j in api.http.get("/jobs", params={"limit": 1000}).json()["items"]}


def two_periods_later(api: Api) -> set[str]:
    """Wait until a new every-1 s schedule (a witness) has fired twice, by the scheduler's own count: by
    then any schedule of that period that should fire has; then pause it. The jobs the witness fired.
    (An order check instead of a sleep; the periods themselves are fake-clock tests, test_schedule_timing.py.)"""
    wid = api.http.post("/schedules", json={"job": ECHO, "every": 1}).json()["id"]
    wait_for(lambda: schedule(api, wid)["runs"] >= 2, 15, what="two firings of a witness schedule")
    r = api.http.patch(f"/schedules/{wid}", json={"paused": True})
    assert r.status_code == 200, r.text
    return set(schedule(api, wid)["last_jobs"])


def test_an_every_schedule_fires_ordinary_jobs_until_deleted(api: Api) -> None:
    # Given a schedule firing every second
    r = api.http.post("/schedules", json={"job": ECHO, "every": 1, "name": "ticker"})
    assert r.status_code == 201 and r.headers["location"] == f"/schedules/{r.json()['id']}", r.text
    sid = r.json()["id"]
    assert r.json()["state"] == "active" and r.json()["next_run_at"] and r.json()["runs"] == 0
    # Then it fires, once a second (the spacing: tests/unit/test_schedule_timing.py)
    wait_for(lambda: schedule(api, sid)["runs"] >= 3, 10, what="3 firings")
    s = schedule(api, sid)
    assert len(s["last_jobs"]) == s["runs"] and s["failures"] == 0 and s["last_run_at"]
    # And each firing is an ordinary job of the API, with its result
    for uuid in s["last_jobs"]:
        job = api.http.get(f"/jobs/{uuid}", params={"wait": 5}).json()
        assert job["state"] == "completed" and job["results"]["w1"]["result"] == "tick", job
    assert sid in api.http.get("/schedules").text
    metrics = api.http.get("/metrics").text
    assert 'zfab_schedules{state="active"} 1.0' in metrics
    assert 'zfab_schedule_firings_total{outcome="submitted"}' in metrics
    # When it is deleted
    assert api.http.delete(f"/schedules/{sid}").status_code == 204
    runs = s["runs"]
    jobs_after_delete = job_uuids(api)
    # Then it fires no more while another of its period fires twice, and is gone
    witnessed = two_periods_later(api)
    assert job_uuids(api) - jobs_after_delete <= witnessed
    assert api.http.get(f"/schedules/{sid}").status_code == 404
    assert runs >= 3


def test_pause_resume_and_retime(api: Api) -> None:
    sid = api.http.post("/schedules", json={"job": ECHO, "every": 1}).json()["id"]
    wait_for(lambda: schedule(api, sid)["runs"] >= 1, 10, what="a first firing")
    # Paused: no next run, no more firings
    r = api.http.patch(f"/schedules/{sid}", json={"paused": True})
    assert r.status_code == 200 and r.json()["state"] == "paused" and r.json()["next_run_at"] is None
    runs = r.json()["runs"]
    two_periods_later(api)
    assert schedule(api, sid)["runs"] == runs
    # Resumed: fires again, from now on (the paused slots are not caught up)
    r = api.http.patch(f"/schedules/{sid}", json={"paused": False})
    assert r.json()["state"] == "active" and r.json()["runs"] == runs
    wait_for(lambda: schedule(api, sid)["runs"] == runs + 1, 5, what="a firing after resume")
    # Re-timed to a cron expression
    r = api.http.patch(f"/schedules/{sid}", json={"cron": "0 0 1 1 *"})
    assert r.json()["cron"] == "0 0 1 1 *" and r.json()["every"] is None
    assert datetime.fromisoformat(r.json()["next_run_at"]).strftime("%m-%d %H:%M") == "01-01 00:00"
    assert api.http.patch("/schedules/nope", json={"paused": True}).status_code == 404


def test_cron_schedules_show_their_next_run_and_bad_ones_are_refused(api: Api) -> None:
    r = api.http.post("/schedules", json={"job": ECHO, "cron": "*/5 * * * *"})
    assert r.status_code == 201, r.text
    nxt = datetime.fromisoformat(r.json()["next_run_at"])
    now = datetime.now(UTC)
    assert nxt > now and nxt.minute % 5 == 0 and nxt.second == 0 and (nxt - now).total_seconds() <= 300
    for body, says in (
        ({"job": ECHO, "cron": "61 * * * *"}, "61 * * * *"),
        ({"job": ECHO, "cron": "* * * *"}, "5 fields"),
        ({"job": ECHO, "every": 0.1}, "every"),
        ({"job": ECHO}, "exactly one of"),
        ({"job": ECHO, "every": 5, "cron": "* * * * *"}, "exactly one of"),
        ({"job": {"service": "demo"}, "every": 5}, "body.job.task"),
    ):
        r = api.http.post("/schedules", json=body)
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
        assert says in r.json()["detail"], (body, r.json()["detail"])


def test_schedules_survive_a_restart_and_a_missed_firing_runs_once(api: Api) -> None:
    # Given a ten-minute schedule
    sid = api.http.post("/schedules", json={"job": ECHO, "every": 600}).json()["id"]
    paused = api.http.post("/schedules", json={"job": ECHO, "every": 1, "paused": True}).json()["id"]
    # When the API is down through six of its slots (its next run put an hour back, as if it had been)
    api.stop()
    with sqlite3.connect(api.db) as db:
        db.execute("UPDATE schedules SET next_run_at=? WHERE id=?", (time.time() - 3600, sid))
    api.start()
    # Then both are back, and the missed firing runs once: not six times
    assert {s["id"] for s in api.http.get("/schedules").json()["items"]} == {sid, paused}
    wait_for(lambda: schedule(api, sid)["runs"] == 1, 10, what="the missed firing")
    two_periods_later(api)  # time for the other missed slots to fire, had they been let
    s = schedule(api, sid)
    assert s["runs"] == 1 and len(s["last_jobs"]) == 1 and s["failures"] == 0, s
    nxt = datetime.fromisoformat(s["next_run_at"]).timestamp()
    assert time.time() < nxt <= time.time() + 600  # back on its grid, in the future
    job = api.http.get(f"/jobs/{s['last_jobs'][0]}", params={"wait": 5}).json()
    assert job["state"] == "completed"
    # And a paused one stays paused
    assert schedule(api, paused)["state"] == "paused" and schedule(api, paused)["runs"] == 0


def test_schedules_are_bounded_and_need_the_bearer_token(tmp_path: Path) -> None:
    f = Fabric(tmp_path)
    try:
        f.broker()
        f.worker("w1")  # a schedule's job is checked against the services the broker knows
        a = Api(f, ZFAB_MAX_SCHEDULES="2", ZFAB_API_TOKENS="sched-token")
        a.start()
        assert a.http.get("/schedules").status_code == 401
        auth = {"Authorization": "Bearer sched-token"}
        for _ in range(2):
            assert a.http.post("/schedules", json={"job": ECHO, "every": 60}, headers=auth).status_code == 201
        r = a.http.post("/schedules", json={"job": ECHO, "every": 60}, headers=auth)
        assert r.status_code == 409 and "ZFAB_MAX_SCHEDULES" in r.json()["detail"], r.text
        assert a.http.get("/schedules", headers=auth).json()["total"] == 2
    finally:
        f.stop()


def test_a_schedule_is_checked_like_a_job_when_it_is_made_or_changed(api: Api) -> None:
    # Given a fabric whose demo workers declare their tasks, past the broker's startup grace (until then
    # it cannot tell a typo from a service whose workers are on their way)
    wait_for(lambda: api.http.get("/mmi/broker").json()["starting"] is False, 10, what="the broker's grace to end")
    # Then what POST /jobs would refuse is refused now
    for job, status, says in (
        ({"service": "demo", "task": "no_such_task"}, 400, "no task 'no_such_task'"),
        ({"service": "no-such-service", "task": "echo"}, 404, "no-such-service"),
        ({"service": "demo", "task": "add", "args": ["one", 2]}, 422, "bad arguments for task 'add'"),
    ):
        r = api.http.post("/schedules", json={"job": job, "every": 60, "name": "refused"})
        assert r.status_code == status and r.headers["content-type"].startswith("application/problem+json"), r.text
        assert says in r.json()["detail"], r.json()
    assert api.http.get("/schedules").json()["total"] == 0  # nothing was made
    # And a good one made, then changed to a job its task refuses, is refused and unchanged
    sid = api.http.post("/schedules", json={"job": ECHO, "every": 60}).json()["id"]
    r = api.http.patch(f"/schedules/{sid}", json={"job": {"service": "demo", "task": "nope"}})
    assert r.status_code == 400 and "nope" in r.json()["detail"], r.text
    assert schedule(api, sid)["job"]["task"] == "echo"


def test_a_schedule_is_addressed_by_its_unique_name(api: Api) -> None:
    r = api.http.post("/schedules", json={"job": ECHO, "every": 60, "name": "nightly-report"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    # GET, PATCH, DELETE take the name in place of the id
    assert schedule(api, "nightly-report")["id"] == sid
    r = api.http.patch("/schedules/nightly-report", json={"paused": True})
    assert r.status_code == 200 and r.json()["id"] == sid and r.json()["state"] == "paused"
    # A second schedule of that name, made or renamed, is a clear 409
    r = api.http.post("/schedules", json={"job": ECHO, "every": 60, "name": "nightly-report"})
    assert r.status_code == 409 and "nightly-report" in r.json()["detail"] and "exists" in r.json()["detail"], r.text
    other = api.http.post("/schedules", json={"job": ECHO, "every": 60, "name": "other"}).json()["id"]
    r = api.http.patch(f"/schedules/{other}", json={"name": "nightly-report"})
    assert r.status_code == 409, r.text
    assert api.http.patch(f"/schedules/{sid}", json={"name": "nightly-report"}).status_code == 200  # its own
    # A name that is not one path segment is refused
    for bad in ("with/slash", "tab\there"):
        r = api.http.post("/schedules", json={"job": ECHO, "every": 60, "name": bad})
        assert r.status_code == 422, r.text
    assert api.http.delete("/schedules/nightly-report").status_code == 204
    assert api.http.get(f"/schedules/{sid}").status_code == 404
    assert api.http.get("/schedules/nightly-report").status_code == 404


def test_a_schedules_failing_jobs_are_counted_and_shown(api: Api) -> None:
    # Given a schedule whose job raises
    job = {"service": "demo", "task": "fail", "kwargs": {"message": "scheduled-boom"}}
    sid = api.http.post("/schedules", json={"job": job, "every": 1, "name": "failing"}).json()["id"]
    # Then each firing's failure is counted on it, with the last error
    wait_for(lambda: schedule(api, sid)["failures"] >= 2, 15, what="two failed firings")
    s = schedule(api, sid)
    assert s["runs"] >= 2 and "failed" in s["last_error"] and "scheduled-boom" in s["last_error"], s
    assert 'zfab_schedule_failures_total{reason="failed"}' in api.http.get("/metrics").text
    metric = [
        line for line in api.http.get("/metrics").text.splitlines() if line.startswith("zfab_schedule_failures_total")
    ]
    assert any('reason="failed"' in line and float(line.split()[-1]) >= 2 for line in metric), metric
    # And the console's schedules page shows them (its script reads the same fields)
    api.http.delete(f"/schedules/{sid}")


def zfab(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zfab.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def test_the_schedules_command_mirrors_the_routes(api: Api) -> None:
    env = {**os.environ, "ZFAB_API_URL": str(api.http.base_url).rstrip("/")}
    r = zfab(["schedules", "add", "demo", "echo", "--every", "1", "--kwargs", '{"data": "cli"}', "--name", "c"], env)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    wait_for(lambda: schedule(api, sid)["runs"] >= 1, 10, what="a firing")
    r = zfab(["schedules", "list"], env)
    assert r.returncode == 0 and r.stdout.splitlines()[0].split()[:4] == ["ID", "NAME", "TIMING", "STATE"]
    assert any(line.startswith(sid) and "every 1s" in line and "active" in line for line in r.stdout.splitlines())
    r = zfab(["schedules", "show", sid], env)
    assert r.returncode == 0 and "last jobs:" in r.stdout and "demo/echo" in r.stdout, r.stdout
    r = zfab(["schedules", "show", "c"], env)  # by its name
    assert r.returncode == 0 and sid in r.stdout, r.stdout
    r = zfab(["schedules", "pause", sid], env)
    assert r.returncode == 0 and "paused" in r.stdout and schedule(api, sid)["paused"] is True
    r = zfab(["schedules", "resume", sid], env)
    assert r.returncode == 0 and "active" in r.stdout and schedule(api, sid)["paused"] is False
    r = zfab(["schedules", "add", "demo", "echo", "--cron", "61 * * * *"], env)
    assert r.returncode == 1 and "422" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = zfab(["schedules", "add", "demo", "echo"], env)
    assert r.returncode == 2 and "--every" in r.stderr
    r = zfab(["schedules", "delete", sid], env)
    assert r.returncode == 0 and api.http.get(f"/schedules/{sid}").status_code == 404
    r = zfab(["schedules", "delete", sid], env)
    assert r.returncode == 1 and "404" in r.stderr
