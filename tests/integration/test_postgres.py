"""Two `zfab api` processes on one real PostgreSQL server (tests/integration/pgserver.py), a broker and a
demo worker: any replica answers any job (GET ?wait=, DELETE, POST .../input, SSE, Idempotency-Key,
listing), schedules fire once per tick across the replicas, migrations run on start (once, under an
advisory lock), and what a replica leaves when it dies is adopted by the other.

Skipped where PostgreSQL is not installed, except under CI=true (.ci/run installs it), where that fails.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pgserver
import pytest
from fabric import Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPLICA_TIMEOUT = "3"  # seconds: a killed replica's jobs are adopted within a few seconds


@pytest.fixture(scope="module")
def pg() -> Iterator[pgserver.PgServer]:
    yield from pgserver.serving()


def start_api(f: Fabric, name: str, port: int, url: str, **env: str) -> None:
    f.start(
        name,
        "api",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        env={"ZFAB_API_DB": url, "ZFAB_API_REPLICA_TIMEOUT": REPLICA_TIMEOUT, **env},
    )


def wait_ready(f: Fabric, name: str, base: str, timeout: float = 30) -> None:
    def ready() -> bool:
        if f.procs[name].poll() is not None:
            pytest.fail(f"{name} exited {f.procs[name].returncode}: {f.log(name)[-1500:]}")
        return httpx.get(base + "/readyz", timeout=2).status_code == 200

    try:
        wait_for(ready, timeout, 0.1, what=f"{name} ready")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{name}'s log: {f.log(name)[-1500:]}") from exc.__cause__


@dataclass
class Replicas:
    f: Fabric
    url: str
    a: httpx.Client
    b: httpx.Client
    worker_metrics: int


def worker_jobs(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(v) for v in re.findall(r"^zfab_jobs_total(?:\{[^}]*\})?\s+(\S+)$", text, re.M))


@pytest.fixture(scope="module")
def two(pg: pgserver.PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Broker, worker w1 and replicas A and B, started together on a fresh database (so they migrate at once)."""
    tmp = tmp_path_factory.mktemp("pg-replicas")
    url = pg.create_database("replicas")
    f = Fabric(tmp)
    try:
        f.broker()
        metrics = free_port()
        f.worker("w1", "demo", "--metrics-port", str(metrics))
        pa, pb = free_port(), free_port()
        start_api(f, "apiA", pa, url)
        start_api(f, "apiB", pb, url)
        wait_ready(f, "apiA", f"http://127.0.0.1:{pa}")
        wait_ready(f, "apiB", f"http://127.0.0.1:{pb}")
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{pa}", timeout=30) as a,
            httpx.Client(base_url=f"http://127.0.0.1:{pb}", timeout=30) as b,
        ):
            wait_for(
                lambda: "w1" in {w["name"] for w in a.get("/mmi/workers", params={"status": "alive"}).json()},
                20,
                what="w1 alive",
            )
            yield Replicas(f, url, a, b, metrics)
    finally:
        f.stop()


def post(c: httpx.Client, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    r = c.post("/jobs", json=body, **kw)
    assert r.status_code in (200, 202), r.text
    job: dict[str, Any] = r.json()
    return job


def test_replicas_started_together_migrate_once(two: Replicas, pg: pgserver.PgServer) -> None:
    from zfab.api.store.schema import SCHEMA_VERSION

    rows = pg.sql(two.url, "SELECT version FROM schema_version ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    replicas = pg.sql(two.url, "SELECT count(*) FROM api_replicas")
    assert replicas == [(2,)]
    for c in (two.a, two.b):
        checks = c.get("/readyz").json()["checks"]
        assert checks == {"started": True, "broker_alive": True, "database": True}


def test_a_job_posted_on_one_replica_is_read_and_waited_for_on_the_other(two: Replicas) -> None:
    job = post(two.a, {"service": "demo", "task": "echo", "kwargs": {"data": "across"}})
    # No retry for a 404: POST answers once the job's row is committed, so B finds it at once.
    r = two.b.get(f"/jobs/{job['uuid']}", params={"wait": 10})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["state"] == "completed" and got["results"]["w1"]["result"] == "across"
    # A long job: B's wait ends on A's NOTIFY when it finishes, not at the wait's bound
    slow = post(two.a, {"service": "demo", "task": "sleep", "kwargs": {"seconds": 1.5}})
    wait_for(lambda: two.b.get(f"/jobs/{slow['uuid']}").json()["state"] == "running", 10, what="running on B")
    started = time.monotonic()
    r = two.b.get(f"/jobs/{slow['uuid']}", params={"wait": 20})
    assert r.json()["state"] == "completed" and time.monotonic() - started < 5
    # and listing on B shows A's jobs, newest first
    page = two.b.get("/jobs", params={"limit": 5}).json()
    assert [j["uuid"] for j in page["items"]][:2] == [slow["uuid"], job["uuid"]]
    assert page["total"] >= 2
    only = two.b.get("/jobs", params={"state": "completed", "task": "echo", "worker": "w1"}).json()
    assert job["uuid"] in {j["uuid"] for j in only["items"]}


def test_a_delete_on_the_other_replica_cancels_the_job(two: Replicas) -> None:
    job = post(two.a, {"service": "demo", "task": "sleep", "kwargs": {"seconds": 30}})
    wait_for(lambda: two.b.get(f"/jobs/{job['uuid']}").json()["state"] == "running", 10, what="running on B")
    r = two.b.delete(f"/jobs/{job['uuid']}")
    assert r.status_code == 202, r.text
    assert r.json()["cancel_requested"] is True
    r = two.a.get(f"/jobs/{job['uuid']}", params={"wait": 10})
    assert r.json()["state"] == "cancelled", r.json()
    r = two.b.get(f"/jobs/{job['uuid']}")
    assert r.json()["state"] == "cancelled" and r.json()["cancel_requested"] is True
    # A finished job: 409 on either replica, as for a job of its own
    assert two.b.delete(f"/jobs/{job['uuid']}").status_code == 409
    assert two.a.delete(f"/jobs/{job['uuid']}").status_code == 409


def test_input_is_answered_through_the_other_replica(two: Replicas) -> None:
    job = post(two.a, {"service": "demo", "task": "ask", "kwargs": {"question": "name?"}})

    def waiting() -> bool:
        got = two.b.get(f"/jobs/{job['uuid']}").json()
        return bool(got["state"] == "waiting" and got["input_request"])

    wait_for(waiting, 10, what="waiting for input, seen on B")
    pending = two.b.get(f"/jobs/{job['uuid']}").json()["input_request"]
    assert pending["question"] == "name?" and pending["worker"] == "w1"
    wrong = two.b.post(f"/jobs/{job['uuid']}/input", json={"value": "Ada", "input_id": "nope"})
    assert wrong.status_code == 409, wrong.text  # the owner's own check, answered through B
    r = two.b.post(f"/jobs/{job['uuid']}/input", json={"value": "Ada"})
    assert r.status_code == 202, r.text
    done = two.a.get(f"/jobs/{job['uuid']}", params={"wait": 10}).json()
    assert done["state"] == "completed" and "Ada" in json.dumps(done["results"]["w1"]["result"])


def test_events_stream_on_the_other_replica(two: Replicas) -> None:
    job = post(two.a, {"service": "demo", "task": "progress", "kwargs": {"steps": 5, "delay": 0.2}})
    ids, data, end = [], [], None
    with two.b.stream("GET", f"/jobs/{job['uuid']}/events") as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        event: dict[str, str] = {}
        for line in resp.iter_lines():
            if line == "":
                if event.get("event") == "end":
                    end = json.loads(event["data"])
                    break
                if "data" in event:
                    ids.append(event["id"])
                    data.append(json.loads(event["data"]))
                event = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                event[key] = value
    assert ids == ["1", "2", "3", "4", "5"]
    assert [e["event_type"] for e in data] == ["progress"] * 5 and data[-1]["progress"] == 1.0
    assert end is not None and end["state"] == "completed" and end["uuid"] == job["uuid"]
    # Resuming after event 3 on B: the rest, then the end
    r = two.b.get(f"/jobs/{job['uuid']}/events", headers={"Last-Event-ID": "3"})
    assert re.findall(r"^id: (\S+)$", r.text, re.M) == ["4", "5", "end"]
    assert two.b.get(f"/jobs/{job['uuid']}/events", headers={"Last-Event-ID": "end"}).status_code == 204


def test_an_idempotency_key_means_one_job_across_replicas(two: Replicas) -> None:
    body = {"service": "demo", "task": "echo", "kwargs": {"data": "once"}}
    before = worker_jobs(two.worker_metrics)
    answers: list[httpx.Response] = []

    def send(c: httpx.Client) -> None:
        answers.append(c.post("/jobs", json=body, params={"wait": 10}, headers={"Idempotency-Key": "same-key"}))

    # Both replicas at the same moment: one claims the key's row, the other finds it
    threads = [threading.Thread(target=send, args=(c,)) for c in (two.a, two.b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    uuids = {r.json()["uuid"] for r in answers}
    assert len(uuids) == 1 and all(r.json()["state"] == "completed" for r in answers)
    # and again on each, later: the same job, not run again
    for c in (two.a, two.b):
        again = c.post("/jobs", json=body, headers={"Idempotency-Key": "same-key"})
        assert again.status_code == 200 and again.json()["uuid"] in uuids
    wait_for(lambda: worker_jobs(two.worker_metrics) >= before + 1, 5, what="the worker counted the job")
    time.sleep(0.5)  # a second run, if there were one, would have been counted by now
    assert worker_jobs(two.worker_metrics) == before + 1
    # The key with another body: 409 on the other replica too
    r = two.b.post("/jobs", json={**body, "kwargs": {"data": "other"}}, headers={"Idempotency-Key": "same-key"})
    assert r.status_code == 409, r.text


def test_a_schedule_fires_once_per_tick_across_replicas(two: Replicas, pg: pgserver.PgServer) -> None:
    before = worker_jobs(two.worker_metrics)
    r = two.a.post("/schedules", json={"every": 1, "job": {"service": "demo", "task": "echo", "kwargs": {"data": 1}}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    t0 = time.monotonic()
    assert two.b.get(f"/schedules/{sid}").status_code == 200  # made on A, read on B at once
    wait_for(lambda: len(pg.sql(two.url, "SELECT 1 FROM schedule_jobs WHERE schedule_id = %s", (sid,))) >= 5, 15)
    assert two.b.delete(f"/schedules/{sid}").status_code == 204
    window = time.monotonic() - t0
    fired = pg.sql(two.url, "SELECT fired_at FROM schedule_jobs WHERE schedule_id = %s ORDER BY fired_at", (sid,))
    times = [float(str(t[0])) for t in fired]
    # One firing per one-second slot, whichever replica fired it: two replicas both firing would make
    # about twice as many as the slots between the first and the last
    assert 5 <= len(times) <= (times[-1] - times[0]) + 1.5 and len(times) <= window + 1, times
    assert min(b - a for a, b in itertools.pairwise(times)) > 0.2, times
    wait_for(lambda: worker_jobs(two.worker_metrics) >= before + len(times), 5, what="every firing ran")
    assert two.a.get(f"/schedules/{sid}").status_code == 404  # deleted on B: gone on A too
    settled = worker_jobs(two.worker_metrics)
    time.sleep(2.5)
    assert worker_jobs(two.worker_metrics) == settled, "a deleted schedule fired again"
    # both replicas label and list the jobs it made
    made = two.b.get("/jobs", params={"schedule": sid, "limit": 100}).json()["items"]
    assert len(made) == len(times) and all(j["schedule"] == sid for j in made)


def test_a_replica_that_dies_leaves_its_jobs_and_schedules_to_the_other(pg: pgserver.PgServer, tmp_path: Path) -> None:
    url = pg.create_database("adopt")
    f = Fabric(tmp_path)
    try:
        f.broker()
        f.worker("w1")
        pa, pb = free_port(), free_port()
        start_api(f, "apiA", pa, url)
        start_api(f, "apiB", pb, url)
        wait_ready(f, "apiA", f"http://127.0.0.1:{pa}")
        wait_ready(f, "apiB", f"http://127.0.0.1:{pb}")
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{pa}", timeout=30) as a,
            httpx.Client(base_url=f"http://127.0.0.1:{pb}", timeout=30) as b,
        ):
            wait_for(lambda: a.get("/mmi/workers").json() != [], 20, what="a worker")
            done = post(a, {"service": "demo", "task": "echo", "kwargs": {"data": "kept"}}, params={"wait": 10})
            running = post(a, {"service": "demo", "task": "sleep", "kwargs": {"seconds": 3}})
            sched = a.post("/schedules", json={"every": 1, "job": {"service": "demo", "task": "echo"}}).json()
            wait_for(lambda: b.get(f"/jobs/{running['uuid']}").json()["state"] == "running", 10, what="running")
            # When A dies outright (no deregistration: B waits out ZFAB_API_REPLICA_TIMEOUT)
            f.kill("apiA")
            killed = time.monotonic()
            # Then B adopts the running job and recovers its result from the worker
            r = b.get(f"/jobs/{running['uuid']}", params={"wait": 20})
            assert r.json()["state"] == "completed", r.json()
            assert time.monotonic() - killed < 15
            owner = pg.sql(url, "SELECT owner FROM jobs WHERE uuid = %s", (running["uuid"],))[0][0]
            alive = pg.sql(url, "SELECT id FROM api_replicas WHERE seen_at > now() - interval '3 seconds'")
            assert [(owner,)] == alive  # B's, the one replica left
            # and the schedule goes on firing from B alone
            n = len(pg.sql(url, "SELECT 1 FROM schedule_jobs WHERE schedule_id = %s", (sched["id"],)))
            wait_for(
                lambda: len(pg.sql(url, "SELECT 1 FROM schedule_jobs WHERE schedule_id = %s", (sched["id"],))) >= n + 2,
                10,
                what="firings from B after A died",
            )
        # A restarted (a new replica, same database) sees every job and schedule
        start_api(f, "apiA2", pa, url)
        wait_ready(f, "apiA2", f"http://127.0.0.1:{pa}")
        with httpx.Client(base_url=f"http://127.0.0.1:{pa}", timeout=30) as a:
            assert a.get(f"/jobs/{done['uuid']}").json()["results"]["w1"]["result"] == "kept"
            assert a.get(f"/jobs/{running['uuid']}").json()["state"] == "completed"
            assert a.get(f"/schedules/{sched['id']}").status_code == 200
            assert [s["id"] for s in a.get("/schedules").json()["items"]] == [sched["id"]]
    finally:
        f.stop()


def test_without_the_database_a_replica_is_not_ready_and_takes_no_job(pg: pgserver.PgServer, tmp_path: Path) -> None:
    url = pg.create_database("outage")
    f = Fabric(tmp_path)
    try:
        f.broker()
        f.worker("w1")
        port = free_port()
        start_api(f, "api", port, url)
        base = f"http://127.0.0.1:{port}"
        wait_ready(f, "api", base)
        with httpx.Client(base_url=base, timeout=30) as c:
            kept = post(c, {"service": "demo", "task": "echo", "kwargs": {"data": 1}}, params={"wait": 10})
            pg.stop()
            try:
                wait_for(lambda: c.get("/readyz").status_code == 503, 30, what="/readyz 503 without PostgreSQL")
                report = c.get("/readyz").json()
                assert report["status"] == "not ready" and report["checks"]["database"] is False
                assert report["checks"]["broker_alive"] is True
                r = c.post("/jobs", json={"service": "demo", "task": "echo"})
                assert r.status_code == 503 and r.json()["type"].endswith("/database-unavailable"), r.text
                assert "Retry-After" in r.headers
                assert c.get("/healthz").status_code == 200  # alive: a database outage is no reason to restart it
            finally:
                pg.start()
            wait_for(lambda: c.get("/readyz").status_code == 200, 30, what="/readyz 200 once PostgreSQL is back")
            after = post(c, {"service": "demo", "task": "echo", "kwargs": {"data": 2}}, params={"wait": 10})
            assert after["state"] == "completed"
            assert c.get(f"/jobs/{kept['uuid']}").json()["state"] == "completed"
        f.signal("api", signal.SIGTERM)
        f.procs["api"].wait(15)
        assert pg.sql(url, "SELECT count(*) FROM api_replicas") == [(0,)]  # a clean stop deregisters
    finally:
        f.stop()


def test_an_api_on_a_database_migrated_by_a_newer_zfab_refuses_to_start(pg: pgserver.PgServer, tmp_path: Path) -> None:
    url = pg.create_database("newer")
    pg.sql(url, "CREATE TABLE schema_version (version integer PRIMARY KEY, description text, applied_at timestamptz)")
    pg.sql(url, "INSERT INTO schema_version VALUES (999, 'from the future', now())")
    f = Fabric(tmp_path)
    try:
        start_api(f, "api", free_port(), url)
        f.procs["api"].wait(60)
        assert f.procs["api"].returncode != 0
        assert "schema v999" in f.log("api")
    finally:
        f.stop()
