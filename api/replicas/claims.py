"""POST /jobs on the shared store (PostgreSQL replicas): an Idempotency-Key claimed by one replica
only, a refused job's key taken over by the next retry, and a job's row committed before the answer,
so that any replica asked next answers the same (docs/postgres.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from datetime import UTC, datetime

from ..errors import database_unavailable
from ..jobs.record import JobRecord, encode_request
from ..models import Job, JobRequest, JobState
from ..state import ApiState
from .remote import place, read

log = logging.getLogger(__name__)

# How long POST /jobs waits for its job's row to commit (so that any replica finds it).
DURABLE_TIMEOUT = 5.0


async def claim_key(st: ApiState, uuid: str, fp: str, req: JobRequest) -> tuple[JobRecord | None, bool]:
    """Shared store: the job an Idempotency-Key already stands for on some replica, or (None, True) once
    this replica has claimed the key's row (an insert that only one replica's succeeds)."""
    from ..store.postgres import PgJobStore

    store = st.store
    assert isinstance(store, PgJobStore)
    now = time.time()
    placeholder = JobRecord(
        uuid,
        req.service,
        req.task,
        req.workers,
        None,
        fp,
        req.timeout,
        request_json=encode_request(req),
        priority=req.priority,
        retries=req.retries,
        stored=Job(
            uuid=uuid,
            service=req.service,
            task=req.task,
            workers=req.workers,
            state=JobState.QUEUED,
            results=None,
            submitted_at=datetime.fromtimestamp(now, UTC),
            timings={"submitted": now},
            priority=req.priority,
            retries=req.retries,
        ),
    )
    for _ in range(2):  # a row released between our insert and our read: claim again
        try:
            if await store.claim(placeholder, st.settings.broker):
                return None, True
        except Exception as exc:
            raise database_unavailable(str(exc)) from None
        existing = await read(st, uuid)
        if existing is not None:
            return await place(st, existing), False
    raise database_unavailable(f"the row of job {uuid} came and went; retry")


async def take_refused(st: ApiState, rec: JobRecord) -> tuple[JobRecord, bool]:
    """Another replica's job the fabric refused: this retry of its key submits it again, unless another
    replica's retry got there first (then that one is the job)."""
    from ..store.postgres import PgJobStore

    store = st.store
    assert isinstance(store, PgJobStore)
    try:
        if await store.take(rec.uuid, rec.owner):
            return rec, True
    except Exception as exc:
        raise database_unavailable(str(exc)) from None
    again = await read(st, rec.uuid)
    if again is None:
        return rec, True
    again = await place(st, again)
    return again, again.refused() and not again.remote


async def release(st: ApiState, uuid: str) -> None:
    from ..store.postgres import PgJobStore

    if isinstance(st.store, PgJobStore):
        try:
            await st.store.release(uuid)
        except Exception as exc:  # the row stays as a queued job nobody runs: a retry reads it, waits, and times out
            log.warning("api: could not release the row of job %s: %s", uuid, exc)


async def settled(st: ApiState, rec: JobRecord, *, started: bool = False) -> None:
    """Shared store: before answering about one of our jobs, let its row commit so that any replica asked
    next answers the same (a few milliseconds: the persister's next batch). A finished job waits for its
    final row; one this request `started`, for its first (POST /jobs answers once any replica finds it)."""
    if st.replicas is None or st.persister is None or rec.remote or rec.live is None or rec.final_written:
        return  # (a job known from the database only is what the database says)
    if not st.replicas.ok:  # the write waits for the database to come back: answer now
        return
    if not rec.done and not started:
        return
    if not rec.done:
        st.jobs.touch(rec.uuid)  # (deferred while the POST waited for it: see submit_job)
    with suppress(TimeoutError):
        async with asyncio.timeout(DURABLE_TIMEOUT):  # (not wait_for: no task per request)
            await st.persister.durable(rec.uuid, final=rec.done)
