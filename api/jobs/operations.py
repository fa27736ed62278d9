"""What a request does to a job, whatever asked: submit, wait, read, cancel, answer its input.

POST /jobs, the scheduler, recovery and other replicas' forwarded commands all come through here,
so a job is recorded, refused and answered alike wherever it came from. Nothing here knows HTTP
(refusals are `ProblemError`s, api/errors.py) or PostgreSQL: a job another replica owns is reached
through `st.cluster`, the interface api/jobs/cluster.py defines and api/replicas/ implements.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

from zfab import JobFuture
from zfab.errors import (
    BadRequestError,
    JobNotFoundError,
    JobTimeoutError,
    ZfabError,
)

from ..errors import ProblemError, admission_problem, database_unavailable, from_fabric_error, unavailable
from ..fabric import wait_done
from ..models import InputAnswer, Job, JobRequest, JobState
from ..state import ApiState
from .admission import check_job
from .arguments import holds_redacted, recorded_json
from .record import JobRecord, encode_request, refused_at_once
from .recovery import ensure_live
from .shares import CallerShares
from .submit import submit_record

# How long POST /jobs waits for the broker to admit a job. A broker that just started holds a POST
# for a service none of its workers confirmed yet for its startup grace (a few seconds).
ADMISSION_TIMEOUT = 10.0
RECORD_TIMEOUT = 2.0  # POST waits this long at most for its job's row (SQLite)
INPUT_TIMEOUT = 10.0


async def submit(
    st: ApiState,
    req: JobRequest,
    uuid: str | None,
    fp: str,
    bound: float | None,
    *,
    retry_of: str | None = None,
    began: float | None = None,
    raw: bytes | None = None,
    caller: str | None = None,
    submitter: str = "",
) -> tuple[JobRecord, bool]:
    """POST /jobs: submit the job (or find the one its Idempotency-Key names: `uuid` and the request's
    fingerprint `fp`), wait until the broker admitted it and, with a `bound`, up to that long for its
    end. The record as it then stands, and whether this call started it (`fresh`). `began`: the
    monotonic time the request was read (the job's `api` hop runs from then to its submission). `caller`:
    the principal a new job counts for while it is in flight (api/jobs/shares.py); None: no caller's.
    `submitter`: the caller's name, kept in the job's row and answer (`submitted_by`)."""
    cluster = st.cluster
    if cluster is not None and not cluster.ok:
        # A job this replica could not record would be invisible to the others (and an Idempotency-Key
        # could not be honoured across them): refuse, as a load balancer would once /readyz says so.
        raise database_unavailable("this replica takes no job until it can record it for the others")
    rec = st.jobs.get(uuid) if uuid else None
    claimed = False
    if uuid is not None and rec is None and cluster is not None:
        rec, claimed = await cluster.claim_key(uuid, fp, req)
    if rec is not None and rec.fingerprint != fp:
        # 409, not the 422 of the IETF idempotency draft: 422 already means "fix your body",
        # while this request is fine and only clashes with one the server remembers.
        raise ProblemError(
            409,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            "this Idempotency-Key was used for a different request; use a new key for a new job",
            job=rec.uuid,
        )
    fresh = rec is None or rec.refused()
    if rec is not None and fresh and rec.remote and cluster is not None:
        rec, fresh = await cluster.take_refused(rec)
    # Shared store: a job this POST waits for is written when it ends (or when the wait does), not also
    # when it starts: one write per quick job instead of two, and nobody else knows its uuid meanwhile.
    deferred = cluster is not None and bound is not None and st.persister is not None
    started = rec is None or fresh
    if started:
        try:
            await check_job(st.schemas, st.client, req)
            shares = st.shares if caller is not None else None
            if shares is not None and caller is not None:
                raw = raw if raw is not None else encode_request(req)
                shares.check(caller, len(raw))
            # Written once the broker has taken it (below): a job it refuses at once is no row. Recorded with
            # its secret arguments redacted; the fabric gets them from `req`.
            kept = recorded_json(st, req, raw)
            rec = submit_record(
                st, req, uuid, fp, persist=False, retry_of=retry_of, began=began, raw=kept, submitter=submitter
            )
            if shares is not None and caller is not None and rec.future is not None:
                held(shares, caller, rec.future, len(raw or b""))
            if not deferred:
                _persist_once_taken(st, rec)
        except Exception:
            if claimed and uuid is not None and cluster is not None:
                await cluster.release(uuid)
            raise
    elif rec is not None and not rec.remote:
        await ensure_live(st, rec)
    assert rec is not None
    # Submitted (or found): the decoded request is not held while the job is waited for; the table
    # holds its JSON, counted (a 4 MB nested argument is 70 MB as Python objects).
    del req
    waited = 0.0
    if not rec.remote:
        if bound is not None and rec.live is not None:
            # Most jobs a POST waits for end within it: one wait (one wake-up of the event loop) covers
            # both the admission and the end, since a client settles a job's admission before its end.
            t0 = time.monotonic()
            await wait_done(rec.live, min(bound, ADMISSION_TIMEOUT))
            waited = time.monotonic() - t0
        try:
            confirmed = await admitted(rec, max(0.0, ADMISSION_TIMEOUT - waited))
        except Exception:
            if started and (fut := rec.live) is not None and refused_at_once(fut):
                # The caller has the refusal and nothing ran: the job leaves no `failed` row behind
                # (an Idempotency-Key retry submits it anew).
                st.jobs.discard(rec.uuid)
                if claimed and uuid is not None and cluster is not None:
                    await cluster.release(uuid)
            elif started and not deferred:
                st.jobs.touch(rec.uuid)  # written, and followed (api/jobs/recovery.py)
            raise
        if not confirmed:
            rec.unconfirmed = True
            st.jobs.touch(rec.uuid)  # recorded as such: a restarted API still knows nobody confirmed it
    if bound is not None:
        rec = await await_job(st, rec, max(0.0, bound - waited))
    if cluster is not None:
        await cluster.settled(rec, started=fresh)
    elif fresh and st.persister is not None:
        await recorded(st, rec)
    return rec, fresh


def held(shares: CallerShares, caller: str, fut: JobFuture, size: int) -> None:
    """The job counts for `caller` until its future ends (on whichever thread ends it)."""
    shares.hold(caller, size)
    fut.add_done_callback(lambda _: shares.release(caller, size))


def _persist_once_taken(st: ApiState, rec: JobRecord) -> None:
    """Write a new job when the broker takes it, not before: one it refuses at once is no row."""
    uuid, fut = rec.uuid, rec.live
    if fut is None:
        return
    rec.row_once_taken = True  # and a write the future's end asked for skips it if refused (JobRecord.writable)

    def taken(admission: Future[Any]) -> None:
        if admission.cancelled() or admission.exception() is None:
            st.jobs.touch(uuid)

    fut.admission.add_done_callback(taken)


async def recorded(st: ApiState, rec: JobRecord) -> None:
    """One store (SQLite): POST answers once its job's row is written, so an API killed after the answer
    still knows the job it acknowledged (the crash window is closed; the wait is the persister's next
    batch, a few milliseconds). A store that does not answer in time is not waited for longer: the
    job is answered, and its row follows when the store does."""
    assert st.persister is not None
    if rec.written:
        return
    with suppress(TimeoutError):
        async with asyncio.timeout(RECORD_TIMEOUT):  # (not wait_for: no task per request)
            await st.persister.durable(rec.uuid)


async def admitted(rec: JobRecord, timeout: float = ADMISSION_TIMEOUT) -> bool:
    """Wait until the broker took the job (queued or dispatched); a refusal becomes its 4xx/503.

    A broker that says nothing in time (it died after the job was sent, or a partition) gets no
    503: the job may already be on its way to a worker, and a caller told to retry would run it
    twice. The job is marked unconfirmed instead, and POST answers 202 with its uuid and
    `outcome_unknown`; the API's client keeps following it (it POSTs it again, same uuid, when a
    broker answers: brokers and workers dedupe by uuid), so GET /jobs/{uuid} ends in the truth."""
    fut = rec.live
    if fut is None:
        return True
    admission = fut.admission
    if not await wait_done(admission, timeout):
        return False
    exc = admission.exception()
    if isinstance(exc, ZfabError):
        raise admission_problem(exc, rec.uuid) from None
    if exc is not None:
        raise exc
    return True


async def wait_for_job(rec: JobRecord, bound: float) -> None:
    """Wait up to `bound` seconds for the job to finish (not at all for one that cannot: see ensure_live)."""
    fut = rec.live
    if fut is not None:
        await wait_done(fut, bound)


async def await_job(st: ApiState, rec: JobRecord, bound: float) -> JobRecord:
    """Wait up to `bound` s for the job to finish, wherever it runs; the record as it then stands."""
    if rec.remote:
        cluster = st.cluster
        assert cluster is not None  # only a replica's jobs are remote
        started = time.monotonic()
        rec = await cluster.wait_remote(rec, bound)
        if rec.remote or rec.done:
            return rec
        bound = max(0.0, bound - (time.monotonic() - started))  # adopted meanwhile: ours now
        await ensure_live(st, rec)
    await wait_for_job(rec, bound)
    return rec


async def known_job(st: ApiState, uuid: str) -> JobRecord:
    """The job (from memory, or the API's database when memory let it go), or a 404 problem."""
    rec = st.jobs.get(uuid)
    if rec is None and st.jobs.loader is not None:
        try:
            rec = await st.jobs.loader(uuid)
        except Exception as exc:  # StoreError: the database is away (the job may be another replica's)
            raise database_unavailable(str(exc)) from None
        if rec is not None and st.cluster is not None:
            rec = await st.cluster.place(rec)  # another replica's, or one we adopt
        elif rec is not None:
            st.jobs.add(rec, persist=False)
    if rec is None:
        raise ProblemError(
            404,
            "job-not-found",
            "Job not found",
            f"no job {uuid} here: this API remembers the last {st.jobs.capacity} jobs it submitted"
            + (" (all replicas' together)" if st.cluster is not None else ""),
        )
    return rec


async def cancel_local(st: ApiState, rec: JobRecord, *, tracebacks: bool | None = None) -> Job:
    """Cancel a job this replica holds (its own DELETE, or one another replica forwarded)."""
    uuid = rec.uuid
    await ensure_live(st, rec)
    if rec.live is None and not rec.done:
        raise unavailable(f"job {uuid} ran before the API restarted and none of its workers answers yet; retry shortly")
    try:
        # False when the client no longer tracks the job: it has finished.
        sent = not rec.done and st.client.cancel(uuid)
    except ZfabError as exc:
        raise from_fabric_error(exc, uuid) from None
    if not sent:
        raise ProblemError(
            409, "job-finished", "Job already finished", f"job {uuid} already finished; nothing to cancel", job=uuid
        )
    rec.cancel_requested = True
    st.jobs.touch(uuid)
    return rec.view(tracebacks=st.settings.api_expose_tracebacks if tracebacks is None else tracebacks)


def _conflict(uuid: str, slug: str, title: str, detail: str) -> ProblemError:
    return ProblemError(409, slug, title, detail, job=uuid)


async def retry_job(
    st: ApiState, rec: JobRecord, bound: float | None, caller: str | None = None, submitter: str = ""
) -> JobRecord:
    """POST /jobs/{uuid}/retry: submit a finished job that did not complete again, with the same
    request, as a new job linked to it (`retry_of`, and the old one's `retried_as`). The new job
    as it stands once admitted, or once it ended within `bound` seconds."""
    uuid = rec.uuid
    view = rec.view()
    if not view.state.final:
        raise _conflict(
            uuid, "job-not-finished", "Job not finished", f"job {uuid} is {view.state.value}: it may still end well"
        )
    if view.state is JobState.COMPLETED:
        raise _conflict(
            uuid, "job-completed", "Job completed", f"job {uuid} completed: submit a new job to run it again"
        )
    again = rec.retried_as or view.retried_as
    if again is not None or rec.retrying:
        detail = f"job {uuid} was submitted again already" + (f", as job {again}" if again else "")
        raise ProblemError(409, "job-retried", "Job retried already", detail, job=again or uuid)
    asked = rec.request
    if asked is None:
        raise _conflict(
            uuid, "no-request", "Request not kept", f"the API does not hold what job {uuid} was submitted with"
        )
    if holds_redacted(asked):
        raise _conflict(
            uuid,
            "secret-arguments",
            "Secret arguments not kept",
            f"job {uuid} had secret arguments (its task's `redact`), which the API never records: submit it anew",
        )
    rec.retrying = True  # a second retry arriving while this one awaits the broker is refused, not run twice
    try:
        new, _ = await submit(
            st, asked, None, "", None, retry_of=uuid, raw=rec.request_json, caller=caller, submitter=submitter
        )
    finally:
        rec.retrying = False
    rec.retried_as = new.uuid
    st.jobs.touch(uuid)  # its row now says who took over (and that it is no dead letter any more)
    if bound is not None:
        new = await await_job(st, new, bound)
    return new


async def input_local(st: ApiState, rec: JobRecord, answer: InputAnswer, *, tracebacks: bool | None = None) -> Job:
    """Answer the input request of a job this replica holds (its own POST, or one another replica forwarded)."""
    uuid = rec.uuid
    fut = rec.live
    if rec.done:
        raise _conflict(uuid, "job-finished", "Job already finished", f"job {uuid} already finished")
    if fut is None or rec.stored is not None:
        raise _conflict(
            uuid,
            "not-waiting",
            "Job not waiting for input",
            f"job {uuid} ran before the API restarted; its input requests cannot be answered through this API",
        )
    pending = rec.input_request()
    if pending is None or (answer.input_id is not None and answer.input_id != pending.get("id")):
        asked = f" (it waits for input {pending.get('id')})" if pending else ""
        raise _conflict(
            uuid, "not-waiting", "Job not waiting for input", f"job {uuid} is not waiting for this input{asked}"
        )
    try:
        await asyncio.to_thread(st.client.send_input, uuid, answer.value, answer.input_id, INPUT_TIMEOUT)
    except BadRequestError as exc:
        if fut.done() or "not waiting for input" in str(exc):  # it ended, or another answer came first
            raise _conflict(uuid, "not-waiting", "Job not waiting for input", str(exc)) from None
        raise ProblemError(400, "input-rejected", "Input rejected by the worker", str(exc), job=uuid) from None
    except JobNotFoundError:
        raise _conflict(uuid, "job-finished", "Job already finished", f"job {uuid} already finished") from None
    except JobTimeoutError as exc:
        raise ProblemError(504, "timeout", "The worker did not answer in time", str(exc), job=uuid) from None
    except ZfabError as exc:
        raise from_fabric_error(exc, uuid) from None
    return rec.view(tracebacks=st.settings.api_expose_tracebacks if tracebacks is None else tracebacks)


__all__ = [
    "ADMISSION_TIMEOUT",
    "admitted",
    "await_job",
    "cancel_local",
    "input_local",
    "known_job",
    "retry_job",
    "submit",
    "submit_record",
    "wait_for_job",
]
