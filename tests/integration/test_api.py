"""The HTTP control plane against a real broker and workers (processes on 127.0.0.1).

Most tests run the app in-process (httpx over ASGI, the lifespan run by the test); the
last ones run the real `zfab api` process and talk HTTP to it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import require_binary, until
from fabric import ROOT, Fabric, fabric, free_port, wait_for

from zfab.api.http.app import create_app
from zfab.api.http.auth import TokenSet
from zfab.api.http.routes.jobs import prefer_wait, wait_bound
from zfab.api.jobs.record import JobRecord
from zfab.api.jobs.table import JobTable
from zfab.api.settings import ApiSettings
from zfab.client.future import JobFuture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PROBLEM = "application/problem+json"


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def settings_for(f: Fabric, **kw: Any) -> ApiSettings:
    return ApiSettings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier, **kw)


@asynccontextmanager
async def api(
    settings: ApiSettings, peer: str = "127.0.0.1", headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process, its lifespan (and so its fabric client) running."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=headers) as c:
            yield c


async def workers_ready(c: httpx.AsyncClient, names: set[str], timeout: float = 20) -> None:
    async def alive() -> bool:
        r = await c.get("/mmi/workers", params={"status": "alive"})
        return r.status_code == 200 and names <= {w["name"] for w in r.json()}

    await until(alive, timeout, f"workers {names} alive")


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["type"] and body["title"] and body["detail"]
    return body


# ---- pure pieces, no processes -------------------------------------------------------


def test_job_table_stays_bounded_and_lists_newest_first() -> None:
    table = JobTable(3)
    for i in range(5):
        table.add(JobRecord(f"j{i}", "demo", "echo", "any", JobFuture(f"j{i}"), ""))
    assert len(table) == 3 and table.get("j0") is None and table.get("j1") is None
    assert [r.uuid for r in table.page(2, 0)] == ["j4", "j3"]
    assert [r.uuid for r in table.page(2, 2)] == ["j2"]
    assert table.page(10, 5) == []


def test_prefer_wait_follows_rfc_7240_and_the_cap() -> None:
    assert prefer_wait("respond-async, wait=5") == 5.0
    assert prefer_wait('wait="2.5"; foo=bar') == 2.5
    assert prefer_wait("wait=abc") is None and prefer_wait("wait=-1") is None and prefer_wait(None) is None
    assert wait_bound(None, "wait=100", cap=60) == 60 and wait_bound(3, "wait=100", cap=60) == 3
    assert wait_bound(None, None, cap=60) is None


def test_token_check_accepts_only_configured_tokens_and_names_the_caller_by_digest() -> None:
    tokens = TokenSet(["alpha", "beta"])
    assert tokens.check("alpha") and tokens.check("beta") and tokens.check("alpha") != tokens.check("beta")
    assert tokens.check("gamma") is None and tokens.check("") is None
    principal = tokens.check("alpha")
    assert principal is not None and "alpha" not in principal and not TokenSet([])
    assert "alpha" not in repr(vars(tokens))  # only digests are kept


# ---- the app in-process, with a real broker and workers --------------------------------


def test_jobs_are_submitted_awaited_polled_and_listed(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1", "w2"})
            # Given a wait bound, the finished job comes back in the same answer
            r = await c.post("/jobs?wait=10", json={"service": "demo", "task": "echo", "kwargs": {"data": "hi"}})
            assert r.status_code == 200, r.text
            job = r.json()
            assert r.headers["location"] == f"/jobs/{job['uuid']}"
            assert job["state"] == "completed" and job["completed_at"] and job["error"] is None
            ((name, entry),) = job["results"].items()
            assert name in {"w1", "w2"} and entry["result"] == "hi" and entry["failed"] is False
            # Without one: 202 and a Location to poll, then a long-poll GET sees it finish
            r = await c.post("/jobs", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 0.3}})
            assert r.status_code == 202 and r.json()["state"] in ("queued", "running") and r.json()["results"] is None
            loc = r.headers["location"]
            r = await c.get(loc, params={"wait": 10})
            assert r.status_code == 200 and r.json()["state"] == "completed"
            assert r.json()["results"][next(iter(r.json()["results"]))]["result"] >= 0.3
            # a fresh job submitted without a wait is 202 even when it is done before the answer
            for i in range(20):
                r = await c.post("/jobs", json={"service": "demo", "task": "echo", "kwargs": {"data": i}})
                assert r.status_code == 202, r.json()
            # `all` reaches both workers; the results dict is keyed by their names
            r = await c.post("/jobs?wait=10", json={"service": "demo", "task": "add", "args": [2, 3], "workers": "all"})
            assert r.status_code == 200 and r.json()["results"].keys() == {"w1", "w2"}
            assert {v["result"] for v in r.json()["results"].values()} == {5}
            # a task that raised is a finished job in state failed, with its traceback as data
            r = await c.post("/jobs", json={"service": "demo", "task": "fail"}, headers={"Prefer": "wait=10"})
            assert r.status_code == 200 and r.headers["preference-applied"] == "wait=10"
            assert r.json()["state"] == "failed"
            ((entry),) = r.json()["results"].values()
            assert "RuntimeError" in entry["errors"][0]
            # a job that outlives its timeout is a finished job in state expired, not an HTTP error
            r = await c.post(
                "/jobs?wait=10", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 5}, "timeout": 0.5}
            )
            assert r.status_code == 200 and r.json()["state"] == "expired" and r.json()["reason"]
            # the table lists them newest first, as summaries, page by page (cursor pagination)
            r = await c.get("/jobs", params={"limit": 2})
            page = r.json()
            assert [j["task"] for j in page["items"]] == ["sleep", "fail"] and page["total"] == 25
            assert "results" not in page["items"][0] and page["next"]
            seen = [j["uuid"] for j in page["items"]]
            while page["next"]:
                page = (await c.get(page["next"])).json()
                seen += [j["uuid"] for j in page["items"]]
            assert len(seen) == len(set(seen)) == 25

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        run(scenario(f))


def test_a_pending_job_is_cancelled_and_a_finished_one_cannot_be(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1"})
            r = await c.post("/jobs", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 30}})
            loc = r.headers["location"]
            r = await c.delete(loc)
            assert r.status_code == 202 and r.json()["cancel_requested"] is True
            r = await c.get(loc, params={"wait": 10})
            job = r.json()
            # the worker stops the 30 s task and reports it: a finished job whose result says cancelled
            assert job["state"] == "cancelled", job
            assert job["results"]["w1"]["status"] == "cancelled"
            assert_problem(await c.delete(loc), 409)
            assert_problem(await c.delete("/jobs/not-a-job"), 404)

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        run(scenario(f))


def test_a_retried_post_with_the_same_idempotency_key_runs_once(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1", "w2"})
            body = {"service": "demo", "task": "sleep", "kwargs": {"seconds": 0.2}}
            key = {"Idempotency-Key": "order-42"}
            first = await c.post("/jobs", json=body, headers=key)
            again = await c.post("/jobs?wait=10", json=body, headers=key)
            assert first.status_code == 202 and again.status_code == 200
            assert first.json()["uuid"] == again.json()["uuid"]
            # and after it finished, a third try still returns that one run
            third = await c.post("/jobs", json=body, headers=key)
            assert third.status_code == 200 and third.json()["results"] == again.json()["results"]
            assert (await c.get("/jobs")).json()["total"] == 1
            # the same key for a different request is refused, not silently mapped to the old job
            other = await c.post("/jobs", json={**body, "kwargs": {"seconds": 1}}, headers=key)
            assert "Idempotency-Key" in assert_problem(other, 409)["detail"]

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        run(scenario(f))


def test_bad_requests_are_problems_that_say_what_is_wrong(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1"})
            p = assert_problem(await c.post("/jobs", json={"service": "demo"}), 422)
            assert "body.task" in p["detail"]
            p = assert_problem(await c.post("/jobs", json={"service": "demo", "task": "echo", "timeout": 0}), 422)
            assert "body.timeout" in p["detail"]
            p = assert_problem(await c.post("/jobs", json={"service": "demo", "task": "echo", "kwarg": {}}), 422)
            assert "body.kwarg" in p["detail"]
            assert_problem(await c.get("/jobs/0123456789abcdef"), 404)
            assert_problem(await c.get("/no/such/route"), 404)
            # the fabric's refusals: a service nobody registered is not retryable
            r = await c.post("/jobs?wait=5", json={"service": "nope", "task": "echo"})
            p = assert_problem(r, 404)
            assert "nope" in p["detail"] and "retry-after" not in r.headers
            p = assert_problem(await c.post("/jobs?wait=5", json={"service": "demo", "task": "nosuch"}), 400)
            assert "nosuch" in p["detail"]
            # MMI: a service's tasks, and 404 for a service nobody serves
            r = await c.get("/mmi/services/demo/tasks")
            assert r.status_code == 200 and {"echo", "sleep", "list_tasks"} <= {t["name"] for t in r.json()}
            assert_problem(await c.get("/mmi/services/nope/tasks"), 404)
            r = await c.get("/mmi/services")
            assert r.status_code == 200 and {"service": "demo"}.items() <= r.json()[0].items()
            r = await c.get("/mmi/broker")
            assert r.status_code == 200 and r.json()["endpoint"] == f.endpoint

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        run(scenario(f))


def test_a_post_refused_at_once_leaves_no_job_behind(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        s = settings_for(f, api_db=str(tmp_path / "api.sqlite"))
        async with api(s) as c:
            await workers_ready(c, {"w1"})
            # When the broker refuses POSTs at once: no such service, no such worker, no such task
            refused = [
                assert_problem(await c.post("/jobs", json={"service": "nope", "task": "echo"}), 404),
                assert_problem(await c.post("/jobs", json={"service": "demo", "task": "echo", "workers": ["w9"]}), 404),
                assert_problem(await c.post("/jobs?wait=5", json={"service": "demo", "task": "nosuch"}), 400),
            ]
            # Then none of them is a row of the job table, nor a `failed` job to list
            page = (await c.get("/jobs", params={"state": "failed"})).json()
            assert page["total"] == 0 and page["items"] == [], page
            ok = (await c.post("/jobs?wait=5", json={"service": "demo", "task": "echo", "kwargs": {"data": 1}})).json()
            assert ok["state"] == "completed"
            assert [j["uuid"] for j in (await c.get("/jobs")).json()["items"]] == [ok["uuid"]]
            for p in refused:
                if p.get("job"):
                    assert_problem(await c.get(f"/jobs/{p['job']}"), 404)
        # And the API's database holds only the job that ran
        async with api(s) as c:
            assert [j["uuid"] for j in (await c.get("/jobs")).json()["items"]] == [ok["uuid"]]

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        run(scenario(f))


def test_a_waited_post_answers_the_jobs_arguments_as_get_does(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1"})
            body = {"service": "demo", "task": "add", "args": [2, 3]}
            done = await c.post("/jobs?wait=5", json=body)
            assert done.status_code == 200 and done.json()["state"] == "completed", done.text
            got = (await c.get(f"/jobs/{done.json()['uuid']}")).json()
            assert done.json()["arguments"] == got["arguments"] and got["arguments"]["args"] == [2, 3]
            queued = await c.post("/jobs", json={"service": "demo", "task": "echo", "kwargs": {"data": "x"}})
            assert queued.status_code == 202 and queued.json()["arguments"]["kwargs"] == {"data": "x"}

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        run(scenario(f))


def test_a_jobs_history_has_each_state_when_its_process_says_in_order(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1"})
            # Given a job that sleeps 1.5 s, and a quick one whose 201 never comes (it ends first)
            slow = (
                await c.post("/jobs?wait=10", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 1.5}})
            ).json()
            quick = (
                await c.post("/jobs?wait=10", json={"service": "demo", "task": "echo", "kwargs": {"data": 1}})
            ).json()
            for job in (slow, quick):
                steps = job["history"]
                # Then each state is there once, in the order it happened, by the process that saw it
                assert [(s["state"], s["by"]) for s in steps] == [
                    ("submitted", "api"),
                    ("queued", "broker"),
                    ("running", "worker"),
                    ("completed", "worker"),
                ], steps
                at = [datetime.fromisoformat(s["at"]) for s in steps]
                assert at == sorted(at)
                assert job["queued_at"] == steps[1]["at"] and job["started_at"] == steps[2]["at"]
                # And the task's run is the worker's own measure of it (its hop trace), not message receipts
                ran = (at[3] - at[2]).total_seconds()
                assert ran == pytest.approx(job["trace"]["hops"]["run"], abs=1e-5), (ran, job["trace"])
            assert (
                datetime.fromisoformat(slow["history"][3]["at"]) - datetime.fromisoformat(slow["history"][2]["at"])
            ).total_seconds() >= 1.5
            # And GET says the same as the POST that waited for it
            assert (await c.get(f"/jobs/{slow['uuid']}")).json()["history"] == slow["history"]

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        run(scenario(f))


def test_a_tasks_traceback_is_shown_only_to_a_caller_allowed_to_see_it(tmp_path: Path) -> None:
    fail = {"service": "demo", "task": "fail", "kwargs": {"message": "tb-secret-path"}}

    async def errors(c: httpx.AsyncClient) -> list[str]:
        job = (await c.post("/jobs?wait=5", json=fail)).json()
        assert job.get("state") == "failed", job
        shown: list[str] = job["results"]["w1"]["errors"]
        again = (await c.get(f"/jobs/{job['uuid']}")).json()["results"]["w1"]["errors"]
        assert again == shown  # POST and GET say the same to the same caller
        return shown

    async def scenario(f: Fabric) -> None:
        # A caller of an API without tokens (loopback), and one with a token: the error's type and message
        async with api(settings_for(f)) as c:
            await workers_ready(c, {"w1"})
            assert await errors(c) == ["RuntimeError: tb-secret-path"]
        s = settings_for(f, api_tokens="t0k, ops-t0k", api_traceback_tokens="ops-t0k")
        async with api(s, headers={"Authorization": "Bearer t0k"}) as c:
            await workers_ready(c, {"w1"})
            assert await errors(c) == ["RuntimeError: tb-secret-path"]
        # A caller whose token may see tracebacks (ZFAB_API_TRACEBACK_TOKENS): the whole traceback
        async with api(s, headers={"Authorization": "Bearer ops-t0k"}) as c:
            await workers_ready(c, {"w1"})
            [tb] = await errors(c)
            assert tb.startswith("Traceback (most recent call last)") and "tb-secret-path" in tb
        # And everyone, when the API is told to show them (ZFAB_API_EXPOSE_TRACEBACKS)
        async with api(settings_for(f, api_expose_tracebacks=True)) as c:
            await workers_ready(c, {"w1"})
            assert (await errors(c))[0].startswith("Traceback")
        # And the worker logged each one, traceback and message, at its default level
        log = f.log("w1")
        assert "Traceback (most recent call last)" in log and log.count("RuntimeError: tb-secret-path") >= 4

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        run(scenario(f))


def test_job_and_mmi_routes_need_a_bearer_token_when_tokens_are_configured(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        s = settings_for(f, api_tokens="s3cret, other")
        async with api(s) as c:
            for method, path in (("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/mmi/workers"), ("GET", "/jobs/x")):
                r = await c.request(method, path, json={"service": "demo", "task": "echo"})
                assert_problem(r, 401)
                assert r.headers["www-authenticate"].startswith("Bearer")
                r = await c.request(method, path, headers={"Authorization": "Bearer wrong"})
                assert_problem(r, 401)
                assert 'error="invalid_token"' in r.headers["www-authenticate"]
            # probes and scrapes need none
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/metrics")).status_code == 200
        async with api(s, headers={"Authorization": "Bearer other"}) as c:
            assert (await c.get("/jobs")).status_code == 200
        # with no token configured, only loopback peers are served
        async with api(settings_for(f), peer="192.0.2.7") as c:
            assert_problem(await c.get("/jobs"), 403)
            assert (await c.get("/healthz")).status_code == 200

    with fabric(tmp_path) as f:
        f.broker()
        run(scenario(f))


def test_without_a_broker_the_api_answers_503_and_is_not_ready(tmp_path: Path) -> None:
    async def scenario(f: Fabric) -> None:
        async with api(settings_for(f)) as c:  # nothing listens on f.endpoint
            health = (await c.get("/healthz")).json()
            assert health["status"] == "ok" and health["role"] == "api"
            ready = await c.get("/readyz")  # the health shape every process answers, not a problem document
            assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
            assert ready.json()["status"] == "not ready" and ready.json()["checks"]["broker_alive"] is False
            for r in (
                await c.post("/jobs", json={"service": "demo", "task": "echo"}),
                await c.get("/mmi/workers"),
            ):
                assert_problem(r, 503)
                assert r.headers["retry-after"] == "1"
            r = await c.get("/metrics")
            assert r.status_code == 200 and "zfab_broker_up 0.0" in r.text

    with fabric(tmp_path) as f:
        run(scenario(f))


# ---- the real `zfab api` process ------------------------------------------------------


def start_api(f: Fabric, *extra: str, env: dict[str, str] | None = None) -> str:
    port = free_port()
    f.start("api", "api", "--host", "127.0.0.1", "--port", str(port), *extra, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(base + "/healthz", timeout=1).status_code == 200, 20, what="zfab api /healthz")
    return base


def test_zfab_api_process_serves_jobs_metrics_and_tracks_broker_restarts(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker("broker1")
        f.worker("w1")
        f.worker("w2")
        base = start_api(f)
        with httpx.Client(base_url=base, timeout=15) as c:
            wait_for(lambda: c.get("/readyz").status_code == 200, 20, what="/readyz 200")
            wait_for(
                lambda: {"w1", "w2"} <= {w["name"] for w in c.get("/mmi/workers", params={"status": "alive"}).json()},
                20,
                what="both workers alive",
            )
            r = c.post(
                "/jobs?wait=10", json={"service": "demo", "task": "echo", "kwargs": {"data": 1}, "workers": "all"}
            )
            assert r.status_code == 200 and r.json()["results"].keys() == {"w1", "w2"}

            r = c.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            for needle in (
                "zfab_workers{",
                "zfab_worker_keepalives_sent_total",
                "zfab_queue_depth",
                "zfab_http_requests_total",
            ):
                assert needle in r.text, needle
            assert re.search(
                r'^zfab_http_requests_total\{method="POST",route="/jobs",status="200"\} 1\.0$', r.text, re.M
            )

            # the broker dies: readiness follows within a hold time, and jobs get 503 + Retry-After
            f.kill("broker1")
            wait_for(lambda: c.get("/readyz").status_code == 503, f.hold_time + 5, what="/readyz 503")
            r = c.post("/jobs", json={"service": "demo", "task": "echo"})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.headers["content-type"] == PROBLEM

            # a new broker on the same port: ready again, and jobs run again
            f.broker("broker2")
            wait_for(lambda: c.get("/readyz").status_code == 200, 20, what="/readyz 200 after restart")
            wait_for(
                lambda: c.post("/jobs?wait=5", json={"service": "demo", "task": "echo"}).status_code == 200,
                20,
                what="a job through the new broker",
            )

        # SIGTERM: a clean exit
        f.signal("api", signal.SIGTERM)
        assert f.procs["api"].wait(15) == 0, f.log("api")
        assert "fabric client closed" in f.log("api")


def test_metrics_pass_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        base = start_api(f)
        with httpx.Client(base_url=base, timeout=15) as c:
            wait_for(lambda: c.get("/mmi/workers", params={"status": "alive"}).json() != [], 20, what="w1 alive")
            assert c.post("/jobs?wait=10", json={"service": "demo", "task": "echo"}).status_code == 200
            text = c.get("/metrics").text
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr


def test_zfab_api_refuses_a_public_address_without_a_token() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "zfab.cli", "api", "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, "ZFAB_API_TOKENS": ""},
    )
    assert r.returncode == 2
    assert "ZFAB_API_TOKENS" in r.stderr
