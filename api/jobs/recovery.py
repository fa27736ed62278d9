"""After an API restart: jobs the database knows as unfinished are answered by their workers (GET)."""

from __future__ import annotations

import asyncio
import logging
import time

from zfab import State, job_deadline, timeout_left
from zfab.errors import ZfabError

from ..fabric import mmi
from ..models import JobRequest
from ..state import ApiState
from .submit import submit_record
from .table import JobRecord

log = logging.getLogger(__name__)

# A recovery waits for the job's own deadline, and at least this long (the job may have ended
# long ago: its workers then answer the first GET at once).
RECOVER_MIN = 10.0
RECOVER_GRACE = 5.0


async def _service_workers(st: ApiState, service: str) -> list[str]:
    """The live workers of a service: who may hold a job whose worker the database never learnt."""
    try:
        found = await mmi(st.client, "show_workers", service=service, status="alive")
    except (ZfabError, TimeoutError) as exc:
        log.info("api: cannot list the workers of %s for a recovery: %s", service, exc)
        return []
    return sorted(str(w["name"]) for w in found if isinstance(w, dict) and w.get("service") == service)


async def ensure_live(st: ApiState, rec: JobRecord) -> None:
    """Start recovering a job known only from the database as unfinished; no-op otherwise.

    The recovery's future then answers the job like a submitted one. One that could try
    nothing (no broker, no workers yet) leaves the job as stored, and the next read retries.
    """
    if rec.remote or rec.live is not None or rec.stored is None or rec.stored.state.finished:
        return  # (a remote job is its owner's to recover: api/replicas/remote.py)
    if rec.request is not None and not rec.dispatched():
        _resubmit(st, rec, rec.request)
        return
    workers = rec.dispatched() or await _service_workers(st, rec.service)
    if not workers or rec.live is not None:  # nobody to ask, or a concurrent read started it
        return
    delay = rec.request.delay if rec.request is not None else 0.0
    left = job_deadline(rec.stored.submitted_at.timestamp(), rec.timeout, delay) - time.time()
    try:
        fut = st.client.recover(rec.service, rec.uuid, workers, timeout=max(RECOVER_MIN, left + RECOVER_GRACE))
    except (ZfabError, ValueError) as exc:
        log.info("api: cannot recover job %s yet: %s", rec.uuid, exc)
        return
    fut.state = State(rec.stored.state.value)  # as far as we know, until its workers answer
    rec.future = fut
    st.jobs.watch(fut)
    log.info("api: recovering job %s from %s", rec.uuid, ", ".join(workers))


def _resubmit(st: ApiState, rec: JobRecord, req: JobRequest) -> None:
    """A job the broker had queued when this API stopped: POST it again, same uuid. The broker
    dedupes (still queued: the answer comes to us now; dispatched or done: its worker answers),
    and a new broker takes it as a job of a service its first broker knew."""
    assert rec.stored is not None
    submitted, now = rec.stored.submitted_at.timestamp(), time.time()
    left = timeout_left(job_deadline(submitted, req.timeout, req.delay), now, req.timeout)
    again = req.model_copy(update={"timeout": round(left, 3), "delay": max(0.0, submitted + req.delay - now)})
    try:
        fresh = submit_record(st, again, rec.uuid, rec.fingerprint, resubmit=True)
    except Exception as exc:  # no broker yet: the next read tries again
        log.info("api: cannot submit job %s again yet: %s", rec.uuid, exc)
        return
    fresh.stored, fresh.request = rec.stored, req
    log.info("api: job %s was queued when the API stopped; submitted again", rec.uuid)


async def recover_unfinished(st: ApiState, wait_for_broker: float = 60.0) -> None:
    """After a start: every job the database knows as unfinished is re-established once the broker
    answers (bounded: one at a time, newest first, the table's jobs only)."""
    deadline = time.monotonic() + wait_for_broker
    while not st.client.broker_alive:
        if time.monotonic() > deadline:
            return  # reads recover them later, one by one
        await asyncio.sleep(0.2)
    for rec in list(st.jobs.newest()):
        if rec.live is None and rec.stored is not None and not rec.stored.state.finished:
            try:
                await ensure_live(st, rec)
            except Exception:  # one job's recovery must not stop the others'
                log.exception("api: recovering job %s failed", rec.uuid)
