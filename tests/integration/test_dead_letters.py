"""Dead letters against real processes: jobs that ended failed, expired or lost are listed as such,
and POST /jobs/{uuid}/retry submits one again as a new job linked to the old."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fabric import Fabric, fabric, wait_workers
from inprocess import in_process_api as api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DECLARED = "tests.integration.declared_workers"


async def post(c: httpx.AsyncClient, body: dict[str, Any], wait: float = 10) -> dict[str, Any]:
    r = await c.post(f"/jobs?wait={wait}", json=body)
    assert r.status_code in (200, 202), r.text
    job: dict[str, Any] = r.json()
    return job


async def dead_uuids(c: httpx.AsyncClient, **query: str) -> set[str]:
    r = await c.get("/jobs", params={"dead": "true", **query})
    assert r.status_code == 200, r.text
    return {j["uuid"] for j in r.json()["items"]}


def test_a_dead_job_requeued_by_rest_completes_as_a_new_job_linked_to_the_old(tmp_path: Path) -> None:
    needed = tmp_path / "config.txt"

    async def go(f: Fabric) -> None:
        async with api(f, db=str(tmp_path / "api.sqlite")) as c:
            # Given jobs that end every way
            broken = await post(c, {"service": "fixable", "task": "needs", "kwargs": {"path": str(needed)}})
            late = await post(c, {"service": "demo", "task": "sleep", "kwargs": {"seconds": 5}, "timeout": 0.5})
            done = await post(c, {"service": "demo", "task": "echo", "kwargs": {"data": 1}})
            stopped = await post(c, {"service": "demo", "task": "sleep", "kwargs": {"seconds": 30}}, wait=0)
            assert (await c.delete(f"/jobs/{stopped['uuid']}")).status_code == 202
            refused = await c.post("/jobs", json={"service": "demo", "task": "nosuch"})
            assert refused.status_code == 400
            assert (await post(c, {"service": "demo", "task": "echo"}))["dead"] is False
            assert broken["state"] == "failed" and broken["dead"] is True, broken
            assert late["state"] == "expired" and late["dead"] is True, late
            # Then the dead letters are exactly the failed and the expired one
            for _ in range(100):
                if (await c.get(f"/jobs/{stopped['uuid']}")).json()["state"] == "cancelled":
                    break
                await asyncio.sleep(0.05)
            assert await dead_uuids(c) == {broken["uuid"], late["uuid"]}
            assert await dead_uuids(c, state="failed") == {broken["uuid"]}
            assert broken["uuid"] not in {j["uuid"] for j in (await c.get("/jobs?dead=false")).json()["items"]}
            # When its fault is fixed and it is requeued over REST
            needed.write_text("fixed")
            r = await c.post(f"/jobs/{broken['uuid']}/retry?wait=10")
            new = r.json()
            assert r.status_code == 200 and new["state"] == "completed", new
            assert new["uuid"] != broken["uuid"] and new["retry_of"] == broken["uuid"]
            assert r.headers["location"].endswith(f"/jobs/{new['uuid']}")
            assert next(iter(new["results"].values()))["result"] == "fixed"
            # Then the old one names the new one and is a dead letter no more
            old = (await c.get(f"/jobs/{broken['uuid']}")).json()
            assert old["retried_as"] == new["uuid"] and old["dead"] is False and old["state"] == "failed"
            assert (await c.get(f"/jobs/{new['uuid']}")).json()["arguments"]["kwargs"] == {"path": str(needed)}
            assert await dead_uuids(c) == {late["uuid"]}
            # And it is not requeued twice; nor is a job that completed, runs, or is unknown
            again = await c.post(f"/jobs/{broken['uuid']}/retry")
            assert again.status_code == 409 and again.json()["job"] == new["uuid"], again.text
            assert (await c.post(f"/jobs/{done['uuid']}/retry")).status_code == 409
            running = await post(c, {"service": "demo", "task": "sleep", "kwargs": {"seconds": 2}}, wait=0)
            assert (await c.post(f"/jobs/{running['uuid']}/retry")).json()["title"] == "Job not finished"
            assert (await c.post("/jobs/nosuch/retry")).status_code == 404
            # And a cancelled job may be submitted again too (it is no dead letter: someone stopped it)
            assert (await c.post(f"/jobs/{stopped['uuid']}/retry")).status_code == 202
        # The links survive an API restart (they are in the job table on disk)
        async with api(f, db=str(tmp_path / "api.sqlite")) as c:
            old = (await c.get(f"/jobs/{broken['uuid']}")).json()
            assert old["retried_as"] == new["uuid"] and old["dead"] is False
            assert (await c.get(f"/jobs/{new['uuid']}")).json()["retry_of"] == broken["uuid"]

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.start("x1", "worker", "--worker", f"{DECLARED}:Fixable", "--name", "x1")
        with f.client() as c:
            wait_workers(c, {"w1", "x1"})
        asyncio.run(go(f))
