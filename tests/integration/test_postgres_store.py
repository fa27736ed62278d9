"""The PostgreSQL store on a real server, without a fabric: migrations (concurrent starts, an older
schema brought up with its rows), the bounds on jobs and events, and a due schedule claimed by one of
two replicas racing for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pgserver
import psycopg
import pytest

from zfab.api.jobs.record import JobRecord
from zfab.api.store.pgschedules import PgSchedules
from zfab.api.store.postgres import EVENT_BYTES_PER_JOB, EVENTS_PER_JOB, PgDatabase, PgJobStore
from zfab.api.store.schedules import ScheduleRecord
from zfab.api.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from zfab.client.future import JobFuture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pg() -> Iterator[pgserver.PgServer]:
    yield from pgserver.serving()


def finished(uuid: str, value: Any = 1, events: int = 0, event_size: int = 10) -> JobRecord:
    fut = JobFuture(uuid, max_events=10_000)
    fut.timings.update(submitted=time.time(), completed=time.time())
    for i in range(events):
        fut.add_event({"event_type": "progress", "message": "x" * event_size, "n": i}, event_size)
    fut.set_result({"w1": {"result": value, "failed": False, "errors": []}})
    return JobRecord(uuid, "demo", "echo", "any", fut, "")


def test_concurrent_starts_migrate_once(pg: pgserver.PgServer) -> None:
    url = pg.create_database("mig")

    async def one() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await migrate(conn)

    async def both() -> list[tuple[int, int]]:
        return list(await asyncio.gather(one(), one(), one()))

    results = asyncio.run(both())
    # One of them migrated from 0; the others waited on the advisory lock and found nothing to do.
    assert sorted(results) == [(0, SCHEMA_VERSION)] + [(SCHEMA_VERSION, SCHEMA_VERSION)] * 2
    rows = pg.sql(url, "SELECT version, description FROM schema_version ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    assert [r[1] for r in rows] == [d for d, _ in MIGRATIONS]


def test_an_older_schema_is_migrated_on_start_and_keeps_its_rows(pg: pgserver.PgServer) -> None:
    url = pg.create_database("old")

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            assert await migrate(conn, target=1) == (0, 1)  # a database as the first version left it
        # A v1 row (no owner column yet), as a v1 API wrote it
        pg.sql(
            url,
            "INSERT INTO jobs (uuid, broker, service, task, target, state, workers, fingerprint, timeout,"
            " submitted_at, job) VALUES ('old1', 'tcp://b', 'demo', 'echo', '\"any\"', 'completed', '[\"w1\"]', '',"
            " 60, 1, %s)",
            (finished("old1").view().model_dump_json(),),
        )
        db = await PgDatabase.open(url, "test v2")  # migrates v1 -> v2
        store = PgJobStore(db, 100, 10**9, "r1")
        rec = await store.read("old1")
        assert (
            rec is not None
            and rec.owner == ""
            and rec.view().results == {"w1": {"result": 1, "failed": False, "errors": []}}
        )
        await db.close()

    asyncio.run(scenario())
    assert pg.sql(url, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]


def test_jobs_and_events_stay_bounded_in_count_and_bytes(pg: pgserver.PgServer) -> None:
    url = pg.create_database("bounds")

    async def scenario() -> None:
        db = await PgDatabase.open(url, "test bounds")
        try:
            store = PgJobStore(db, capacity=5, max_bytes=10**9, owner="r1")
            for i in range(8):
                await store.write([finished(f"j{i}", i, events=2)], "tcp://b")
            assert await store.prune() >= 0
            left = [r[0] for r in pg.sql(url, "SELECT uuid FROM jobs ORDER BY seq")]
            assert left == ["j3", "j4", "j5", "j6", "j7"]  # the newest five, in arrival order
            orphans = pg.sql(url, "SELECT count(*) FROM job_events WHERE job_uuid NOT IN (SELECT uuid FROM jobs)")
            assert orphans == [(0,)]  # their events went with them
            # An update keeps a job's place: j3 rewritten is still the oldest
            await store.write([finished("j3", "again")], "tcp://b")
            await store.write([finished("j8")], "tcp://b")
            await store.prune()
            assert [r[0] for r in pg.sql(url, "SELECT uuid FROM jobs ORDER BY seq")] == ["j4", "j5", "j6", "j7", "j8"]
            # Bytes: results of 100 kB each under a 350 kB bound keep the newest three
            big = PgJobStore(db, capacity=100, max_bytes=350_000, owner="r1")
            for i in range(6):
                await big.write([finished(f"big{i}", "x" * 100_000)], "tcp://b")
            await big.prune()
            kept = [r[0] for r in pg.sql(url, "SELECT uuid FROM jobs WHERE uuid LIKE 'big%%' ORDER BY seq")]
            assert kept == ["big3", "big4", "big5"]
            assert pg.sql(url, "SELECT sum(bytes) <= 350000 FROM jobs") == [(True,)]
            # Events of one job: the newest EVENTS_PER_JOB, and at most EVENT_BYTES_PER_JOB of them
            many = finished("many", events=EVENTS_PER_JOB + 200)
            await big.write([many], "tcp://b")
            seqs = pg.sql(url, "SELECT min(seq), max(seq), count(*) FROM job_events WHERE job_uuid = 'many'")
            assert seqs == [(201, EVENTS_PER_JOB + 200, EVENTS_PER_JOB)]
            heavy = finished("heavy", events=300, event_size=8000)
            await big.write([heavy], "tcp://b")
            size, count = pg.sql(url, "SELECT sum(bytes)::bigint, count(*) FROM job_events WHERE job_uuid = 'heavy'")[0]
            assert isinstance(size, int) and isinstance(count, int)
            assert size <= EVENT_BYTES_PER_JOB and 0 < count < 300
            assert heavy.event_bytes == size
        finally:
            await db.close()

    asyncio.run(scenario())


def test_a_due_schedule_is_claimed_by_exactly_one_of_two_replicas(pg: pgserver.PgServer) -> None:
    url = pg.create_database("claim")

    async def scenario() -> None:
        db1, db2 = await PgDatabase.open(url, "r1"), await PgDatabase.open(url, "r2")
        try:
            s1, s2 = PgSchedules(db1, 100), PgSchedules(db2, 100)
            now = time.time()
            rec = ScheduleRecord(id="s1", job={"service": "demo", "task": "echo"}, every=10.0, cron=None)
            rec.next_run_at = now - 0.1
            await s1.save([rec.row()])

            def advance(recs: list[ScheduleRecord]) -> None:
                for r in recs:
                    r.next_run_at = time.time() + 10  # moved past "now": no longer due

            for _ in range(20):  # due again each round; both race for it: one claims, the other passes
                rec.next_run_at = time.time() - 0.1
                await s1.save([rec.row()])
                (c1, p1), (c2, p2) = await asyncio.gather(
                    s1.fire_claimed(["s1"], time.time(), advance),
                    s2.fire_claimed(["s1"], time.time(), advance),
                )
                assert len(c1) + len(c2) == 1 and p1 + p2 == ["s1"]
            (stored,) = await s2.read(["s1"])
            assert stored.next_run_at is not None and stored.next_run_at > time.time() + 5
            await s1.record_firings([("s1", True, None), ("s1", False, "no workers")], [("job1", "s1", now)])
            (stored,) = await s2.read(["s1"])
            assert (stored.runs, stored.failures, stored.last_error, list(stored.last_jobs)) == (
                1,
                1,
                "no workers",
                ["job1"],
            )
        finally:
            await db1.close()
            await db2.close()

    asyncio.run(scenario())
