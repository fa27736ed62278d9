"""Issue 42's "Done when", through the public surfaces on real processes: roles and scopes on HTTP, the
ZeroMQ plane's key entries under CURVE, a conflicting announcement refused, a secret in neither the API's
store nor its log, every state change in the audit log with its actor."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fabric import fabric, free_port, wait_for, wait_workers
from test_api import start_api
from test_security import curve_client

from zfab import ZfabError
from zfab.client.subscriber import SubscriptionError
from zfab.transport.security import create_keys

pytestmark = pytest.mark.integration

DECLARED = "tests.integration.declared_workers"
TOKENS = {"viewer": "t-view-1", "operator": "t-op-1", "admin": "t-admin-1", "scoped": "t-demo-1"}
PASSWORD = "hunter2-never-stored-9f3"


def access_file(tmp: Path, keys: str = "") -> Path:
    rows = []
    for name, token in TOKENS.items():
        role = "viewer" if name == "scoped" else name
        scope = 'scope = ["demo"]\n' if name == "scoped" else ""
        rows.append(
            f'[[token]]\nname = "{name}"\nsha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            f'role = "{role}"\n{scope}'
        )
    path = tmp / "access.toml"
    path.write_text("\n".join(rows) + keys)
    return path


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def forbidden(r: httpx.Response, role: str) -> bool:
    return r.status_code == 403 and f"needs the role {role}" in r.json()["detail"]


def sse_topics(base: str, who: str, seconds: float, out: list[str], ready: threading.Event) -> None:
    """The topics of /events?topic=job. as `who` sees them, for `seconds`."""
    end = time.monotonic() + seconds
    try:
        with httpx.stream(
            "GET", f"{base}/events", params={"topic": "job."}, headers=auth(who), timeout=seconds + 5
        ) as r:
            for line in r.iter_lines():
                if line.startswith(": subscribed"):
                    ready.set()
                if line.startswith("data:"):
                    out.append(str(json.loads(line[5:]).get("topic", "")))
                if time.monotonic() > end:
                    return
    except httpx.HTTPError as exc:
        out.append(f"error: {exc!r}")
    finally:
        ready.set()


def test_roles_scopes_a_refused_announcement_a_secret_never_stored_and_the_audit_log(tmp_path: Path) -> None:
    db = tmp_path / "api.sqlite"
    with fabric(tmp_path) as f:
        events = f"tcp://127.0.0.1:{free_port()}"
        f.env.update(ZFAB_BROKER_EVENTS=events)
        f.broker()
        f.worker("w1")
        f.start("s1", "worker", "--worker", f"{DECLARED}:Secrets", "--name", "s1")
        with f.client() as c:
            wait_workers(c, {"w1", "s1"})
        access = access_file(tmp_path)
        base = start_api(
            f,
            env={
                "ZFAB_ACCESS_FILE": str(access),
                "ZFAB_API_DB": str(db),
                "ZFAB_SSE_PING_SECONDS": "0.5",
            },
        )
        with httpx.Client(base_url=base, timeout=20) as h:
            wait_for(lambda: h.get("/readyz").status_code == 200, 20, what="/readyz 200")
            job = {"service": "demo", "task": "echo", "kwargs": {"data": 1}}
            # A viewer reads, and cannot submit, cancel or pause: 403 naming the role needed.
            assert h.get("/jobs", headers=auth("viewer")).status_code == 200
            assert forbidden(h.post("/jobs", json=job, headers=auth("viewer")), "operator")
            assert forbidden(h.delete("/jobs/0190a000-0000-7000-8000-000000000000", headers=auth("viewer")), "operator")
            assert forbidden(h.post("/mmi/services/demo/pause", headers=auth("viewer")), "admin")
            # An operator submits, and cannot pause or set limits.
            r = h.post("/jobs?wait=10", json=job, headers=auth("operator"))
            assert r.status_code == 200 and r.json()["state"] == "completed", r.text
            demo_uuid = r.json()["uuid"]
            assert forbidden(h.post("/mmi/services/demo/pause", headers=auth("operator")), "admin")
            limit = {"rate_limit": "5/s", "concurrency": None, "limit_key": None}
            assert forbidden(
                h.put("/mmi/services/demo/tasks/echo/limits", json=limit, headers=auth("operator")), "admin"
            )
            # An admin does; its job's secret is recorded redacted. A scoped token streams meanwhile.
            seen: list[str] = []
            ready = threading.Event()
            t = threading.Thread(target=sse_topics, args=(base, "scoped", 6.0, seen, ready), daemon=True)
            t.start()
            assert ready.wait(10)
            assert h.post("/mmi/services/demo/pause", headers=auth("admin")).json()["paused"] is True
            assert h.post("/mmi/services/demo/resume", headers=auth("admin")).json()["paused"] is False
            secret = {"service": "secrets", "task": "login", "kwargs": {"user": "ada", "password": PASSWORD}}
            r = h.post("/jobs?wait=10", json=secret, headers=auth("admin"))
            assert r.status_code == 200 and r.json()["state"] == "completed", r.text
            secret_uuid = r.json()["uuid"]
            assert r.json()["arguments"]["kwargs"]["password"] == "***"
            r = h.post("/jobs?wait=10", json=job, headers=auth("admin"))
            assert r.json()["state"] == "completed"
            t.join(15)
            # A token added to the access file while the API runs is taken at once; payloads=false hides
            # a job's arguments and results.
            hidden = "t-no-payloads-1"
            with access.open("a") as out:
                digest = hashlib.sha256(hidden.encode()).hexdigest()
                out.write(f'\n[[token]]\nname = "np"\nsha256 = "{digest}"\npayloads = false\n')
            np = {"Authorization": f"Bearer {hidden}"}
            wait_for(lambda: h.get(f"/jobs/{demo_uuid}", headers=np).status_code == 200, 10, what="the new token")
            seen_np = h.get(f"/jobs/{demo_uuid}", headers=np).json()
            assert seen_np["state"] == "completed" and seen_np["results"] is None and seen_np["arguments"] is None
            me = {"name": "np", "role": "viewer", "scope": ["*"], "payloads": False, "actions": ["read"]}
            assert h.get("/me", headers=np).json() == me
            # A token scoped to demo sees nothing of another service.
            listed = {j["uuid"] for j in h.get("/jobs", headers=auth("scoped")).json()["items"]}
            assert demo_uuid in listed and secret_uuid not in listed
            assert h.get(f"/jobs/{secret_uuid}", headers=auth("scoped")).status_code == 404
            assert h.get(f"/jobs/{secret_uuid}/events", headers=auth("scoped")).status_code == 404
            assert h.get(f"/ui/api/jobs/{secret_uuid}/request", headers=auth("scoped")).status_code == 404
            assert {w["service"] for w in h.get("/mmi/workers", headers=auth("scoped")).json()} == {"demo"}
            assert any(s.startswith("job.demo.") for s in seen), seen
            assert not any(s.startswith("job.secrets.") for s in seen), seen
            # A worker announcing `login` without its redaction is refused; the declaration stays.
            f.start("leak", "worker", "--worker", f"{DECLARED}:LeakySecrets", "--name", "leak")
            wait_for(
                lambda: "declaration_conflict" in f.log("broker") or "refused" in f.log("leak"),
                20,
                what="the broker refuses the conflicting announcement",
            )
            with f.client() as c:
                assert c.mmi("show_tasks", service="secrets")["tasks"]["login"]["x-zfab"]["redact"] == ["password"]
                assert "leak" not in {w["name"] for w in c.mmi("show_workers")}
                assert c.mmi("show_broker")["counts"].get("announcement_refused", 0) >= 1
            # Every state change made here is in the audit log, with its actor.
            rows = h.get("/audit", params={"limit": 1000}, headers=auth("admin")).json()["items"]
            did = {(e["actor"], e["action"], e["status"]) for e in rows}
            assert ("admin", "POST /mmi/services/{service}/pause", 200) in did
            assert ("admin", "POST /mmi/services/{service}/resume", 200) in did
            assert ("viewer", "POST /mmi/services/{service}/pause", 403) in did
            assert ("operator", "PUT /mmi/services/{service}/tasks/{task}/limits", 403) in did
            assert forbidden(h.get("/audit", headers=auth("operator")), "admin")
            # The CLI reads the same log.
            cli = subprocess.run(
                [sys.executable, "-m", "zfab.cli", "audit", "--api", base, "--token", TOKENS["admin"], "--json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert cli.returncode == 0, cli.stderr
            assert ("viewer", "POST /mmi/services/{service}/pause") in {
                (e["actor"], e["action"]) for e in json.loads(cli.stdout)
            }
            table = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "zfab.cli",
                    "audit",
                    "--api",
                    base,
                    "--token",
                    TOKENS["admin"],
                    "--actor",
                    "viewer",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert table.returncode == 0 and "WHO" in table.stdout and "viewer" in table.stdout, table.stderr
        f.signal("api", 15)
        f.procs["api"].wait(15)
    # The secret is in neither the API's store nor its log (nor the broker's).
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("api.sqlite*"))
    assert stored and PASSWORD.encode() not in stored
    assert PASSWORD not in f.log("api") and PASSWORD not in f.log("broker")


def test_a_job_submission_is_audited_and_its_job_names_who_submitted_it(tmp_path: Path) -> None:
    db = tmp_path / "api.sqlite"
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
        base = start_api(f, env={"ZFAB_ACCESS_FILE": str(access_file(tmp_path)), "ZFAB_API_DB": str(db)})
        with httpx.Client(base_url=base, timeout=20) as h:
            wait_for(lambda: h.get("/readyz").status_code == 200, 20, what="/readyz 200")
            job = {"service": "demo", "task": "echo", "kwargs": {"data": 1}}
            # The lean path (a bearer token, ?wait only) and the documented one (an Idempotency-Key).
            lean = h.post("/jobs?wait=10", json=job, headers=auth("operator"))
            assert lean.status_code == 200 and lean.json()["submitted_by"] == "operator", lean.text
            documented = h.post("/jobs", json=job, headers={**auth("admin"), "Idempotency-Key": "k-1"})
            assert documented.status_code == 202 and documented.json()["submitted_by"] == "admin", documented.text
            again = h.post("/jobs", json=job, headers={**auth("admin"), "Idempotency-Key": "k-1"})
            assert again.json()["uuid"] == documented.json()["uuid"]  # a replay: no second job, no second entry
            assert forbidden(h.post("/jobs", json=job, headers=auth("viewer")), "operator")
            unknown = {"service": "nope", "task": "echo"}  # refused by the fabric on the lean path: its actor too
            assert h.post("/jobs", json=unknown, headers=auth("operator")).status_code == 404
            # Whoever may read the job sees who submitted it.
            read = h.get(f"/jobs/{lean.json()['uuid']}", headers=auth("viewer")).json()
            assert read["submitted_by"] == "operator"
            entries = h.get("/audit", params={"action": "POST /jobs"}, headers=auth("admin")).json()["items"]
            did = [(e["actor"], e["target"], e["status"], e["origin"]) for e in entries if e["action"] == "POST /jobs"]
            assert ("operator", lean.json()["uuid"], 200, "api") in did
            assert ("admin", documented.json()["uuid"], 202, "api") in did
            assert ("viewer", "/jobs", 403, "api") in did
            assert ("operator", "/jobs", 404, "api") in did
            assert len(did) == 4, did
            metrics = h.get("/metrics").text
            assert 'zfab_table_size{table="api_audit_pending"} 0.0' in metrics  # all written: none waits
            assert "zfab_api_audit_dropped_total 0.0" in metrics
        f.signal("api", 15)
        f.procs["api"].wait(15)
    # The job's row names its submitter (a column of the job table), and its audit rows were written.
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT uuid, submitter FROM jobs").fetchall())
        audited = conn.execute("SELECT actor, target FROM audit WHERE action = 'POST /jobs'").fetchall()
    assert rows[lean.json()["uuid"]] == "operator" and rows[documented.json()["uuid"]] == "admin"
    assert ("operator", lean.json()["uuid"]) in audited and ("viewer", "/jobs") in audited


def test_a_worker_key_cannot_submit_pause_or_subscribe_and_a_client_key_has_its_role(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    k = {
        "broker": create_keys(tmp_path / "keys", "broker"),
        "w1": create_keys(tmp_path / "keys", "w1", worker="w1"),
        "ops": create_keys(tmp_path / "keys", "ops"),
    }
    for name in ("w1", "ops"):
        (allowed / f"{name}.key").write_bytes(k[name][0].read_bytes())
    keys = '\n[[key]]\nname = "w1"\nregister = ["demo"]\n\n[[key]]\nname = "ops"\nrole = "operator"\nscope = ["demo"]\n'
    with fabric(tmp_path) as f:
        events = f"tcp://127.0.0.1:{free_port()}"
        f.env.update(
            ZFAB_CURVE_SECRET=str(k["broker"][1]),
            ZFAB_CURVE_CLIENTS=str(allowed),
            ZFAB_ACCESS_FILE=str(access_file(tmp_path, keys)),
            ZFAB_BROKER_EVENTS=events,
        )
        f.broker()
        f.env.pop("ZFAB_CURVE_CLIENTS")
        f.env.update(ZFAB_CURVE_SECRET=str(k["w1"][1]), ZFAB_CURVE_SERVER_KEY=str(k["broker"][0]))
        f.worker("w1")
        with curve_client(f, k["ops"][1], k["broker"][0], "ops") as ops:
            wait_for(lambda: {w["name"] for w in ops.mmi("show_workers", timeout=1)} == {"w1"}, 20, what="w1")
            assert ops.run_job("demo", "echo", kwargs={"data": "x"}, timeout=10)["w1"]["result"] == "x"
            with pytest.raises(ZfabError, match="needs the role admin"):
                ops.mmi("pause_service", service="demo")
            # A key scoped to demo subscribes to demo's events only: a prefix that could match another
            # service's topics is refused.
            with pytest.raises(SubscriptionError):
                ops.subscribe("job.", endpoint=events).close()
            with ops.subscribe("job.demo.", endpoint=events) as sub:
                ops.run_job("demo", "echo", kwargs={"data": "y"}, timeout=10)
                wait_for(lambda: sub.depth() > 0, 10, what="demo's events for the scoped key")
        with curve_client(f, k["w1"][1], k["broker"][0], "as-client") as wk:
            wait_for(lambda: wk.broker_alive, 10, what="the worker key connects")
            with pytest.raises(ZfabError, match="worker key"):
                wk.run_job("demo", "echo", kwargs={"data": "x"}, timeout=5)
            with pytest.raises(ZfabError, match="forbidden"):
                wk.mmi("pause_service", service="demo")
            with pytest.raises(SubscriptionError):
                wk.subscribe("job.", endpoint=events).close()
        with curve_client(f, k["ops"][1], k["broker"][0], "check") as ops:
            assert ops.mmi("show_broker")["counts"].get("refused_by_key", 0) >= 1
            assert not ops.mmi("show_services")[0].get("paused", False)


def test_mmi_commands_a_key_sends_the_broker_directly_are_in_the_apis_audit_log_once(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    k = {n: create_keys(tmp_path / "keys", n) for n in ("broker", "api", "root", "ops")}
    k["w1"] = create_keys(tmp_path / "keys", "w1", worker="w1")
    for name in ("api", "root", "ops", "w1"):
        (allowed / f"{name}.key").write_bytes(k[name][0].read_bytes())
    keys = '\n[[key]]\nname = "ops"\nrole = "operator"\n'  # api and root: no entry, so admins
    access = access_file(tmp_path, keys)
    with fabric(tmp_path) as f:
        f.env.update(
            ZFAB_CURVE_SECRET=str(k["broker"][1]), ZFAB_CURVE_CLIENTS=str(allowed), ZFAB_ACCESS_FILE=str(access)
        )
        f.broker()
        f.env.pop("ZFAB_CURVE_CLIENTS")
        f.env.update(ZFAB_CURVE_SECRET=str(k["w1"][1]), ZFAB_CURVE_SERVER_KEY=str(k["broker"][0]))
        f.worker("w1")
        f.env.update(ZFAB_CURVE_SECRET=str(k["api"][1]))
        base = start_api(f, env={"ZFAB_API_DB": str(tmp_path / "api.sqlite")})
        with (
            curve_client(f, k["root"][1], k["broker"][0], "root") as root,
            curve_client(f, k["ops"][1], k["broker"][0], "ops") as ops,
            httpx.Client(base_url=base, timeout=20) as h,
        ):
            wait_for(lambda: {w["name"] for w in root.mmi("show_workers", timeout=1)} == {"w1"}, 20, what="w1")
            wait_for(lambda: h.get("/readyz").status_code == 200, 20, what="/readyz 200")
            # Straight to the broker: an admin key pauses and resumes, an operator key is refused.
            assert root.mmi("pause_service", service="demo")["paused"] is True
            with pytest.raises(ZfabError, match="needs the role admin"):
                ops.mmi("pause_service", service="demo")
            assert root.mmi("resume_service", service="demo")["paused"] is False
            # Through the API: audited by the API with the token's name, and not again as the broker's.
            assert h.post("/mmi/services/demo/pause", headers=auth("admin")).json()["paused"] is True
            assert h.post("/mmi/services/demo/resume", headers=auth("admin")).json()["paused"] is False
            page = root.mmi("show_audit")
            assert page["you"] == "root" and len(page["entries"]) == 5  # the API's two calls are its key's
            assert {e["key"] for e in page["entries"]} == {"root", "ops", "api"}
            with pytest.raises(ZfabError, match="needs the role admin"):
                ops.mmi("show_audit")

            def audited() -> list[tuple[str, str, str, int, str]]:
                items = h.get("/audit", params={"limit": 1000}, headers=auth("admin")).json()["items"]
                return [(e["actor"], e["action"], e["target"], e["status"], e["origin"]) for e in items]

            wait_for(lambda: len([e for e in audited() if e[4] == "broker"]) >= 3, 15, what="the broker's entries")
            rows = audited()
            broker = [e for e in rows if e[4] == "broker"]
            assert sorted(broker) == sorted(
                [
                    ("root", "MMI pause_service", "demo", 200, "broker"),
                    ("ops", "MMI pause_service", "demo", 400, "broker"),
                    ("root", "MMI resume_service", "demo", 200, "broker"),
                ]
            ), rows
            assert ("admin", "POST /mmi/services/{service}/pause", "/mmi/services/demo/pause", 200, "api") in rows
            assert not any(e[0] == "api" for e in rows)  # the API's own MMI calls: once, under the token's name
            only = h.get("/audit", params={"actor": "ops"}, headers=auth("admin")).json()["items"]
            assert [(e["action"], e["origin"]) for e in only] == [("MMI pause_service", "broker")]
            assert 'zfab_table_size{table="broker_mmi_audit"} 5.0' in h.get("/metrics").text
        # A restarted API reads the broker's log from its start again: each entry stays in its database once.
        f.signal("api", 15)
        f.procs["api"].wait(15)
        base = start_api(f, env={"ZFAB_API_DB": str(tmp_path / "api.sqlite")})
        with (
            curve_client(f, k["root"][1], k["broker"][0], "root2") as root,
            httpx.Client(base_url=base, timeout=20) as h,
        ):
            wait_for(lambda: h.get("/readyz").status_code == 200, 20, what="/readyz 200")
            assert root.mmi("pause_service", service="demo")["paused"] is True
            wait_for(lambda: len([e for e in audited() if e[4] == "broker"]) >= 4, 15, what="the new entry")
            assert len([e for e in audited() if e[4] == "broker"]) == 4, audited()


def test_a_schedule_giving_a_secret_argument_is_refused_through_rest_and_the_cli(tmp_path: Path) -> None:
    db = tmp_path / "api.sqlite"
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.start("s1", "worker", "--worker", f"{DECLARED}:Secrets", "--name", "s1")
        with f.client() as c:
            wait_workers(c, {"w1", "s1"})
        base = start_api(f, env={"ZFAB_ACCESS_FILE": str(access_file(tmp_path)), "ZFAB_API_DB": str(db)})
        with httpx.Client(base_url=base, timeout=20) as h:
            wait_for(lambda: h.get("/readyz").status_code == 200, 20, what="/readyz 200")
            secret = {"service": "secrets", "task": "login", "kwargs": {"user": "ada", "password": PASSWORD}}
            r = h.post("/schedules", json={"job": secret, "every": 60}, headers=auth("operator"))
            assert r.status_code == 422 and r.json()["type"].endswith("secret-arguments"), r.text
            assert "'password'" in r.json()["detail"] and "never written" in r.json()["detail"]
            assert r.json()["arguments"] == ["password"]
            positional = {"service": "secrets", "task": "login", "args": ["ada", PASSWORD]}
            r = h.post("/schedules", json={"job": positional, "every": 60}, headers=auth("operator"))
            assert r.status_code == 422 and r.json()["arguments"] == ["password"], r.text
            # A schedule changed to give one is refused too, and stays as it was.
            job = {"service": "demo", "task": "echo", "kwargs": {"data": 1}}
            made = h.post("/schedules", json={"job": job, "every": 60, "paused": True}, headers=auth("operator"))
            assert made.status_code == 201, made.text
            sid = made.json()["id"]
            r = h.patch(f"/schedules/{sid}", json={"job": secret}, headers=auth("operator"))
            assert r.status_code == 422 and "'password'" in r.json()["detail"], r.text
            assert h.get(f"/schedules/{sid}", headers=auth("operator")).json()["job"]["service"] == "demo"
            cli = subprocess.run(
                [
                    *(sys.executable, "-m", "zfab.cli", "schedules", "add", "secrets", "login", "--every", "60"),
                    *("--kwargs", json.dumps(secret["kwargs"]), "--api", base, "--token", TOKENS["operator"]),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert cli.returncode != 0 and "'password'" in cli.stderr and "secret" in cli.stderr, cli.stderr
            assert PASSWORD not in cli.stderr
            assert len(h.get("/schedules", headers=auth("operator")).json()["items"]) == 1
        f.signal("api", 15)
        f.procs["api"].wait(15)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("api.sqlite*"))
    assert stored and PASSWORD.encode() not in stored


def test_on_postgresql_the_secret_is_not_stored_and_the_audit_log_is_in_the_shared_database(tmp_path: Path) -> None:
    import pgserver

    pg = pgserver.started()
    try:
        url = pg.create_database("roles")
        with fabric(tmp_path) as f:
            f.broker()
            f.start("s1", "worker", "--worker", f"{DECLARED}:Secrets", "--name", "s1")
            with f.client() as c:
                wait_workers(c, {"s1"})
            env = {"ZFAB_ACCESS_FILE": str(access_file(tmp_path)), "ZFAB_API_DB": url}
            base = start_api(f, env=env)
            with httpx.Client(base_url=base, timeout=20) as h:
                wait_for(lambda: h.get("/readyz").status_code == 200, 30, what="/readyz 200")
                secret = {"service": "secrets", "task": "login", "kwargs": {"user": "ada", "password": PASSWORD}}
                r = h.post("/jobs?wait=10", json=secret, headers=auth("operator"))
                assert r.status_code == 200 and r.json()["state"] == "completed", r.text
                assert forbidden(h.post("/mmi/services/secrets/pause", headers=auth("operator")), "admin")
                assert h.post("/mmi/services/secrets/pause", headers=auth("admin")).status_code == 200
                wait_for(lambda: len(pg.sql(url, "SELECT 1 FROM audit")) >= 2, 10, what="audit rows in PostgreSQL")
                rows = {(e["actor"], e["status"]) for e in h.get("/audit", headers=auth("admin")).json()["items"]}
                assert {("operator", 403), ("admin", 200)} <= rows
                wait_for(lambda: len(pg.sql(url, "SELECT 1 FROM jobs")) >= 1, 10, what="the job's row")
            stored = json.dumps([list(map(str, r)) for r in pg.sql(url, "SELECT * FROM jobs")])
            assert "ada" in stored and PASSWORD not in stored
            assert [r[0] for r in pg.sql(url, "SELECT submitter FROM jobs")] == ["operator"]  # who submitted it
            assert PASSWORD not in f.log("api")
    finally:
        pg.destroy()


def test_a_bad_access_file_stops_zfab_api_with_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "access.toml"
    bad.write_text('[[token]]\nsha256 = "abc"\n')
    r = subprocess.run(
        [sys.executable, "-m", "zfab.cli", "api", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "ZFAB_ACCESS_FILE": str(bad)},
    )
    assert r.returncode == 2 and "token #1: sha256 must be" in r.stderr and "Traceback" not in r.stderr
