"""Jobs another API replica owns (PostgreSQL only): read from the shared database, waited for by
notification, and cancelled or answered through their owner (api/replicas/coordination.py).

A job read from the database is one of three things to this replica:
- its own (it submitted or adopted it): held in the in-memory table, answered as ever;
- **remote**: its owner is alive. It is never put in this replica's table (its copy would go stale);
  every request reads its row, `?wait=` and SSE wake on the `zfab_jobs` notification its owner sends
  when the row or its events change, and DELETE / input go to the owner as commands;
- an orphan: unfinished, and its owner is gone. This replica adopts it (one replica wins) and
  recovers it from its workers, as after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import TYPE_CHECKING, Any, cast

from ..errors import ProblemError, database_unavailable
from ..jobs.operations import cancel_local, input_local
from ..jobs.record import JobRecord
from ..jobs.recovery import ensure_live
from ..models import InputAnswer, Job, JobState
from ..state import ApiState

if TYPE_CHECKING:  # psycopg is imported only when ZFAB_API_DB names PostgreSQL
    from ..store.postgres import PgJobStore

log = logging.getLogger(__name__)

SAFETY_READ = 5.0  # a waiter re-reads its job this often even without a notification (one may be lost)


class CommandTimeout(Exception):
    """The job's owner did not answer a command in time (it is busy, stuck, or just died)."""


async def place(st: ApiState, rec: JobRecord) -> JobRecord:
    """Decide what a job read from the shared store is to us (see the module's doc)."""
    rp = st.replicas
    assert rp is not None
    held = st.jobs.get(rec.uuid)
    if held is not None:  # ours, and in memory (e.g. adopted by the heartbeat meanwhile): that one is live
        return held
    if rec.owner == rp.id or rec.done:
        rec.remote = rec.owner != rp.id
        if not rec.done:  # ours but not in memory (the table let it go): hold it again, it is live
            st.jobs.add(rec, persist=False)
        return rec
    if rp.owner_alive(rec.owner):
        rec.remote = True
        return rec
    try:
        adopted = await rp.adopt(rec)
    except Exception as exc:
        raise database_unavailable(str(exc)) from None
    if not adopted:
        fresh = await read(st, rec.uuid)
        if fresh is None:
            return rec
        fresh.remote = fresh.owner != rp.id
        return fresh
    take_over(st, rec)
    return rec


def take_over(st: ApiState, rec: JobRecord) -> None:
    """An adopted job: its input request died with its owner; hold it, to be recovered from its workers."""
    if rec.stored is not None and rec.stored.state is JobState.WAITING:
        rec.stored = rec.stored.model_copy(update={"state": JobState.RUNNING, "input_request": None})
    rec.remote = False
    st.jobs.add(rec, persist=False)
    st.jobs.touch(rec.uuid)  # its row says who owns it now on the next write


async def adopted(st: ApiState, recs: list[JobRecord]) -> None:
    """Jobs of gone replicas this one adopted in a heartbeat sweep: recovered from their workers."""
    for rec in recs:
        if st.jobs.get(rec.uuid) is not None:
            continue
        take_over(st, rec)
        try:
            await ensure_live(st, rec)
        except Exception:
            log.exception("api: recovering adopted job %s failed", rec.uuid)


async def recover_pending(st: ApiState) -> None:
    """At each heartbeat: adopted jobs whose recovery could try nothing yet (no broker or worker to ask
    at the time) try again, as a read of them would."""
    if not st.client.broker_alive:
        return
    for rec in list(st.jobs.newest()):
        if not rec.remote and rec.live is None and rec.stored is not None and not rec.stored.state.final:
            try:
                await ensure_live(st, rec)
            except Exception:
                log.exception("api: recovering job %s failed", rec.uuid)


async def read(st: ApiState, uuid: str) -> JobRecord | None:
    assert st.store is not None
    try:
        return await st.store.read(uuid)
    except Exception as exc:  # StoreError: the database is away
        raise database_unavailable(str(exc)) from None


async def wait_remote(st: ApiState, rec: JobRecord, bound: float) -> JobRecord:
    """Wait up to `bound` s for another replica's job to finish: woken by its owner's NOTIFY, re-read then."""
    rp = st.replicas
    assert rp is not None
    deadline = time.monotonic() + bound
    ev = rp.listen(rec.uuid)
    try:
        while not rec.done and not st.jobs.closing:
            ev.clear()  # before the read: a change after it sets the event again
            fresh = await read(st, rec.uuid)
            if fresh is None:
                break
            fresh.remote = True
            rec = fresh
            left = deadline - time.monotonic()
            if rec.done or left <= 0:
                break
            if rec.owner == rp.id or not rp.owner_alive(rec.owner):
                rec = await place(st, rec)  # adopted meanwhile (by us or another): answer as such
                if not rec.remote:
                    break
            with suppress(TimeoutError):
                async with asyncio.timeout(min(left, SAFETY_READ)):
                    await ev.wait()
    finally:
        rp.unlisten(rec.uuid, ev)
    return rec


def problem_body(exc: ProblemError) -> dict[str, Any]:
    return {"problem": {"slug": exc.slug, "title": exc.title, "detail": exc.detail, "headers": exc.headers}}


def problem_of(status: int, body: dict[str, Any], uuid: str) -> ProblemError:
    p = body.get("problem")
    if not isinstance(p, dict):
        return ProblemError(502, "replica-error", "Replica error", f"the replica running job {uuid} gave no answer")
    headers = p.get("headers") if isinstance(p.get("headers"), dict) else {}
    return ProblemError(
        status, str(p.get("slug")), str(p.get("title")), str(p.get("detail")), headers or None, job=uuid
    )


async def forward(st: ApiState, rec: JobRecord, op: str, body: dict[str, Any]) -> Job:
    """Have the job's owner run `op` (cancel, input) and answer as it did."""
    rp = st.replicas
    assert rp is not None
    try:
        status, answer = await rp.command(rec.owner, rec.uuid, op, body)
    except CommandTimeout as exc:
        raise ProblemError(
            503, "replica-unavailable", "Replica unavailable", str(exc), {"Retry-After": "1"}, job=rec.uuid
        ) from None
    except Exception as exc:
        raise database_unavailable(str(exc)) from None
    if status >= 300:
        raise problem_of(status, answer, rec.uuid)
    return Job.model_validate(answer.get("job"))


async def run_command(st: ApiState, op: str, uuid: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The owner's side of a command: the same code as its own DELETE and POST .../input."""
    rec = st.jobs.get(uuid)
    try:
        if rec is None:
            raise ProblemError(
                409, "job-finished", "Job already finished", f"job {uuid} already finished; nothing to do", job=uuid
            )
        if op == "cancel":
            job = await cancel_local(st, rec)
        elif op == "input":
            job = await input_local(st, rec, InputAnswer.model_validate(body))
        else:
            raise ProblemError(400, "bad-command", "Unknown command", f"no command {op!r}", job=uuid)
    except ProblemError as exc:
        return exc.status, problem_body(exc)
    except ValueError as exc:
        return 422, problem_body(ProblemError(422, "validation", "Invalid request", str(exc)))
    return 202, {"job": job.model_dump(mode="json")}


async def remote_events(st: ApiState, rec: JobRecord, after: int) -> AsyncIterator[tuple[int, dict[str, Any]] | None]:
    """A job's events from the shared database as its owner writes them, then the job once finished:
    yields (seq, event) for each event, None when nothing came within the ping interval, and ends
    once the job is finished and every event was yielded (the caller reads the final row)."""
    rp, store = st.replicas, cast("PgJobStore", st.store)
    assert rp is not None and store is not None
    ping = st.settings.sse_ping_seconds
    next_ping = time.monotonic() + ping
    ev = rp.listen(rec.uuid)
    sent = after
    try:
        while not st.jobs.closing:
            if time.monotonic() >= next_ping:
                yield None
                next_ping = time.monotonic() + ping
            ev.clear()
            fresh = await read(st, rec.uuid)  # the state first: a finished job's events are all written by then
            try:
                got = await store.events(rec.uuid, sent)
            except Exception as exc:
                raise database_unavailable(str(exc)) from None
            for seq, event in got:
                yield seq, event
                sent = seq
            if fresh is None or fresh.done:
                if got:
                    continue  # more may follow the page just read
                return
            with suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(next_ping - time.monotonic(), SAFETY_READ))):
                    await ev.wait()
    finally:
        rp.unlisten(rec.uuid, ev)
