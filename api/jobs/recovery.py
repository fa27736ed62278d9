"""After an API restart: jobs the database knows as unfinished are asked of the fabric, never run twice.

The database row says what the API last knew of a job (api/store/persister.py): queued, dispatched
(its workers), running, and its attempt. Recovery follows it:

- last known dispatched or running: never submitted again. Its workers (or, when none was known, the
  service's live workers) are asked by GET for that attempt; what they answer is recorded. Workers
  missing from the broker's live ones are waited for a hold time first (after a broker restart they
  re-register; the others never had the job and would call it unknown); then, still missing, they
  count as gone and an `any` job is asked of the live ones. When no worker knows it, or the one that
  ran it restarted (its store says `interrupted`), the attempt ends `lost` with that reason; a job that
  asked for retries (`retries` in its request) and has some left then runs again as the next attempt,
  visibly (`attempt`, `attempts`), never under the old wire uuid.
- last known queued (the broker had not said it dispatched it): the service's live workers are asked
  first, since the row may predate a dispatch by up to the persister's sweep; only when none knows it
  is it POSTed again under its uuid (a broker that still holds it dedupes; one that restarted takes it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from zfab import JobFuture, State, interrupted, job_deadline, timeout_left
from zfab.errors import JobNotFoundError, JobTimeoutError, OutcomeUnknownError, WorkerLostError, ZfabError

from ..fabric import mmi
from ..models import Attempt, JobRequest, JobState
from ..state import ApiState
from .arguments import holds_redacted
from .record import JobRecord
from .submit import submit_record

log = logging.getLogger(__name__)

# A recovery waits for the job's own deadline, and at least this long (the job may have ended
# long ago: its workers then answer the first GET at once).
RECOVER_MIN = 10.0
RECOVER_GRACE = 5.0
_clock = time.monotonic  # (tests move it)


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
    if rec.remote or rec.live is not None or rec.stored is None or rec.stored.state.final:
        return  # (a remote job is its owner's to recover: api/replicas/remote.py)
    known = rec.dispatched()
    if rec.request is not None and not known and rec.stored.state is JobState.QUEUED:
        await _recover_queued(st, rec, rec.request)
        return
    live = await _service_workers(st, rec.service)
    workers = known or live
    if known and not set(known) & set(live):
        # The workers it ran on are gone. One that restarted says "interrupted" once it is back; an
        # `any` job is asked of the live ones meanwhile (none knows it: lost, and retried if asked);
        # past its deadline nobody is waited for any longer: it ends lost, saying why.
        past = _deadline(rec) + RECOVER_GRACE < time.time()
        if past and rec.live is None:
            _give_up(st, rec, known)
            return
        if rec.workers == "any" and not _waited_for(st, rec):
            # Missing is not gone: after a broker restart its workers re-register within a hold time, and the
            # live ones, which never had it, would answer "not known" for a job that is running (it would end
            # lost, and run again if it asked for retries). Asked again at the next read, or the sweep's.
            return
        workers = live if rec.workers == "any" else known
    else:
        rec.absent_since = None  # its workers are there: should they go missing again, that is waited afresh
    if not workers or rec.live is not None:  # nobody to ask, or a concurrent read started it
        return
    fut = _ask(st, rec, workers)
    if fut is not None:
        log.info("api: recovering job %s (attempt %d) from %s", rec.uuid, fut.attempt, ", ".join(workers))


def _waited_for(st: ApiState, rec: JobRecord) -> bool:
    """The job's workers have been missing from the broker's live ones for a hold time (from the first look)."""
    now = _clock()
    if rec.absent_since is None:
        rec.absent_since = now
    return now - rec.absent_since >= st.client.keepalive.hold_time


def _deadline(rec: JobRecord) -> float:
    """The job's deadline on this clock: its timeout counts from the end of its delay (the one rule,
    payloads.job_deadline, as the client and the broker count it)."""
    assert rec.stored is not None
    req = rec.request
    return job_deadline(rec.stored.submitted_at.timestamp(), rec.timeout, req.delay if req is not None else 0.0)


def _ask(st: ApiState, rec: JobRecord, workers: list[str], *, probe: bool = False) -> JobFuture | None:
    """GET the job's last known attempt from `workers`; the future answers the job from then on.
    `probe`: a job last known queued, whose "nobody knows it" the caller answers (it never left the
    queue: submitted again as the same attempt), not _after_recovery."""
    assert rec.stored is not None
    left = _deadline(rec) - time.time()
    try:
        fut = st.client.recover(
            rec.service,
            rec.uuid,
            workers,
            timeout=max(RECOVER_MIN, left + RECOVER_GRACE),
            attempt=rec.stored.attempt,
        )
    except (ZfabError, ValueError) as exc:
        log.info("api: cannot recover job %s yet: %s", rec.uuid, exc)
        return None
    fut.state = State(rec.stored.state.value)  # as far as we know, until its workers answer
    fut.attempts.extend(_earlier(rec))
    rec.future = fut
    loop = asyncio.get_running_loop()

    def ended(f: JobFuture) -> None:
        # Before the table's own callback, so an attempt that runs again is never written, or
        # answered to a waiter, as the job's end. The API's client settles futures on this loop.
        then = _requeue if probe else _after_recovery
        if _running_loop() is loop:
            then(st, rec, f)
        else:
            loop.call_soon_threadsafe(then, st, rec, f)

    fut.add_done_callback(ended)  # type: ignore[arg-type]
    st.jobs.watch(fut)
    return fut


def _give_up(st: ApiState, rec: JobRecord, workers: list[str]) -> None:
    """The job's workers are gone and its deadline passed: it ends lost, with what is known."""
    assert rec.stored is not None
    fut = JobFuture(rec.uuid)
    fut.attempt = rec.stored.attempt
    fut.attempts.extend(_earlier(rec))
    fut.timings["submitted"] = rec.stored.submitted_at.timestamp()
    fut.timings["completed"] = time.time()
    names = ", ".join(workers)
    fut.set_exception(
        OutcomeUnknownError(
            f"job {rec.uuid} (attempt {fut.attempt}) was running on {names} when the API restarted; "
            f"{names} did not come back before its deadline and no live worker knows it: its outcome is unknown",
            uuid=rec.uuid,
        )
    )
    rec.future = fut
    st.jobs.watch(fut)
    log.warning("api: job %s: its workers %s are gone; it ends lost", rec.uuid, names)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _recover_queued(st: ApiState, rec: JobRecord, req: JobRequest) -> None:
    """A job last known queued: a worker may hold it anyway (dispatched after the row was written);
    ask the service's workers, and submit it again only when none of them knows it."""
    workers = await _service_workers(st, rec.service)
    if workers and rec.live is None:
        # Their answer decides, however late it comes (_requeue): a worker just restarted may take longer
        # than any wait here, and a "nobody knows it" after the wait must still send the job again.
        _ask(st, rec, workers, probe=True)
    elif rec.live is None:
        _resubmit(st, rec, req)


def _requeue(st: ApiState, rec: JobRecord, fut: JobFuture) -> None:
    """A probe of a job last known queued ended (event loop). Nobody knows it: it never left the broker's
    queue (or never reached one), so it is submitted again as the same attempt; else its workers' answer
    is the job's, as any recovered attempt's."""
    if not fut.cancelled() and isinstance(fut.exception(), JobNotFoundError):
        if rec.future is fut and rec.request is not None:
            rec.future = None
            if rec.live is None:
                _resubmit(st, rec, rec.request)
        return
    log.info("api: job %s, last known queued, was held by a worker: its answer is the job's", rec.uuid)
    _after_recovery(st, rec, fut)


def cut_short(fut: JobFuture) -> str | None:
    """Why a recovered attempt did not run to its end (no worker knows it, its worker was lost, or its
    worker's restart interrupted it), or None when it ended on its own (completed, failed, ...)."""
    if not fut.done() or fut.cancelled():
        return None
    exc = fut.exception()
    if isinstance(exc, JobNotFoundError | WorkerLostError):
        return str(exc)
    if fut.state is State.LOST:
        return fut.reason
    if exc is not None:
        return None
    results: dict[str, Any] = fut.result()
    entries = [e for e in results.values() if isinstance(e, dict)]
    if entries and all(interrupted(e) for e in entries):
        return "; ".join(f"{w}: {(e.get('errors') or [''])[0]}" for w, e in results.items() if isinstance(e, dict))
    return None


def _after_recovery(st: ApiState, rec: JobRecord, fut: JobFuture) -> None:
    """A recovered attempt ended (event loop). One cut short by a restart runs again when its request
    asked for retries and some are left: a new attempt, its earlier one kept with why it ended."""
    if rec.future is not fut or rec.stored is None:
        return
    if not fut.cancelled() and isinstance(fut.exception(), JobTimeoutError):
        # Its workers never answered the GET, up to its deadline and a grace: not `expired` (nobody
        # saw it run out of time), but unknown.
        names = ", ".join(rec.dispatched()) or "its workers"
        fut.state = State.LOST
        fut.reason = (
            f"the API restarted while job {rec.uuid} ran; {names} did not answer for it by its deadline: "
            "its outcome is unknown"
        )
    if (req := rec.request) is None:
        return
    why = cut_short(fut)
    if why is None or req.retries is None or fut.attempt > req.retries or rec.workers != "any":
        return  # as it ended: recorded as such (lost, with the reason) by the table's done callback
    worker = fut.worker or ", ".join(rec.dispatched()) or None
    earlier = [*fut.attempts, {"attempt": fut.attempt, "worker": worker, "status": "lost", "error": why}]
    _resubmit(st, rec, req, attempt=fut.attempt + 1, earlier=earlier)


def _earlier(rec: JobRecord) -> list[dict[str, Any]]:
    """The earlier attempts the database recorded, as the client's futures keep them."""
    assert rec.stored is not None
    return [_attempt_record(a) for a in rec.stored.attempts]


def _attempt_record(a: Attempt) -> dict[str, Any]:
    record: dict[str, Any] = {"attempt": a.attempt, "worker": a.worker, "status": a.status, "error": a.error}
    record["errors"] = list(a.errors)
    if a.started_at is not None:
        record["started"] = a.started_at.timestamp()
    if a.finished_at is not None:
        record["completed"] = a.finished_at.timestamp()
    if a.retry_after is not None:
        record["retry_after"] = a.retry_after
    return record


def _resubmit(
    st: ApiState, rec: JobRecord, req: JobRequest, *, attempt: int = 1, earlier: list[dict[str, Any]] | None = None
) -> None:
    """POST the job again, same uuid. As attempt 1: a job the broker had queued when this API stopped,
    which no worker holds (the broker dedupes: still queued, the answer comes to us now; a new broker
    takes it as a job of a service its first broker knew). As attempt N > 1: the next attempt of a job
    a restart cut short, with the full timeout and one retry fewer."""
    assert rec.stored is not None
    if holds_redacted(req):
        # Its secret arguments were never recorded: it cannot be submitted again as it was; its workers are
        # asked for it instead (ensure_live), and it ends lost with its reason when none knows it.
        log.info("api: job %s had secret arguments, which the API does not keep: not submitted again", rec.uuid)
        return
    if attempt > 1:
        again = req.model_copy(update={"retries": max(0, (req.retries or 0) - (attempt - 1)), "delay": 0.0})
    else:
        submitted, now = rec.stored.submitted_at.timestamp(), time.time()
        left = timeout_left(job_deadline(submitted, req.timeout, req.delay), now, req.timeout)
        again = req.model_copy(update={"timeout": round(left, 3), "delay": max(0.0, submitted + req.delay - now)})
    try:
        fresh = submit_record(
            st, again, rec.uuid, rec.fingerprint, resubmit=True, attempt=attempt, submitter=rec.submitter
        )
    except Exception as exc:  # no broker yet: the next read tries again
        log.info("api: cannot submit job %s again yet: %s", rec.uuid, exc)
        return
    fresh.stored, fresh.request, fresh.unconfirmed = rec.stored, req, rec.stored.outcome_unknown
    fut = fresh.future
    assert fut is not None
    fut.attempts.extend(earlier if earlier is not None else _earlier(rec))
    rec.future = fut  # whoever holds the old record (a waiting GET) sees the new attempt
    if attempt > 1:
        log.warning("api: job %s was cut short by a restart; running it again as attempt %d", rec.uuid, attempt)
    else:
        log.info("api: job %s was queued when the API stopped and no worker holds it; submitted again", rec.uuid)


async def recover_unfinished(st: ApiState, wait_for_broker: float = 60.0) -> None:
    """After a start: every job the database knows as unfinished is re-established once the broker
    answers (bounded: one at a time, newest first, the table's jobs only)."""
    deadline = time.monotonic() + wait_for_broker
    while not st.client.broker_alive:
        if time.monotonic() > deadline:
            return  # reads recover them later, one by one
        await asyncio.sleep(0.2)
    waiting = await _recover_pass(st, list(st.jobs.newest()))
    if waiting:
        # Jobs whose workers were missing (on their way back after a broker restart, or gone): once more
        # after a hold time, when those that are coming are back, and the rest are asked of the live ones.
        await asyncio.sleep(st.client.keepalive.hold_time)
        await _recover_pass(st, waiting)


async def _recover_pass(st: ApiState, recs: list[JobRecord]) -> list[JobRecord]:
    """ensure_live for each unfinished job of `recs`; those it left waiting for their workers."""
    waiting = []
    for rec in recs:
        if rec.live is None and rec.stored is not None and not rec.stored.state.final:
            try:
                await ensure_live(st, rec)
            except Exception:  # one job's recovery must not stop the others'
                log.exception("api: recovering job %s failed", rec.uuid)
            if rec.live is None and rec.absent_since is not None:
                waiting.append(rec)
    return waiting
