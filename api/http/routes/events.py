"""`/jobs/{uuid}/events` (server-sent events) and `/jobs/{uuid}/input`: following and answering a job.

A stream never blocks the event loop and holds no thread: it waits on an asyncio.Event that
the job table sets (through call_soon_threadsafe) when the client's owner thread adds an
event or finishes the job. A caller that hangs up cancels the stream's task, and the
generator's `finally` gives its listener back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from zfab.errors import ZfabError

from ...errors import ProblemError
from ...fabric import await_result
from ...jobs.inputs import snapshot
from ...jobs.operations import input_local, known_job
from ...jobs.record import JobRecord
from ...jobs.recovery import ensure_live
from ...models import InputAnswer, Job
from ...state import ApiState
from ..auth import Principal, grant_of, not_found_outside
from ..problems import responses
from ..sse import PING, EventStreamResponse, comment, frame, json_frame
from ..state import api_state
from .jobs import JobUuid

READ_BACK_TIMEOUT = 10.0
RECOVERY_RETRY_SECONDS = 1.0

router = APIRouter(prefix="/jobs", tags=["jobs"])

LastEventId = Annotated[
    str,
    Header(
        pattern=r"^(0|[1-9][0-9]{0,17}|end)$",
        description="Resume after this event id (what an EventSource sends when it reconnects); `end` = the "
        "caller saw the terminal event (answered 204 once the job has finished)",
    ),
]


def event_frame(seq: int, event: dict[str, Any]) -> bytes:
    """A job's event, its id its sequence number in the job."""
    return json_frame(event, id=seq)


def end_frame(job: Job) -> bytes:
    return frame(job.model_dump_json(), id="end", event="end")


async def _live(st: ApiState, rec: JobRecord, after: int) -> AsyncIterator[bytes]:
    """Events of a job this API process submitted, as they arrive, until it finishes."""
    fut = rec.live
    assert fut is not None
    ping = st.settings.sse_ping_seconds
    waiter = st.jobs.listen(rec.uuid)
    try:
        sent = after
        while not st.jobs.closing:
            waiter.clear()
            done = fut.done()  # read before the events: every event of a finished job is in the deque
            events = snapshot(fut.events)
            if len(events) > sent:
                yield b"".join(event_frame(i + 1, events[i]) for i in range(sent, len(events)))
                sent = len(events)
            if done:
                return
            try:
                await asyncio.wait_for(waiter.wait(), ping)
            except TimeoutError:
                yield PING
    finally:
        st.jobs.unlisten(rec.uuid, waiter)


async def _worker_events(st: ApiState, rec: JobRecord, worker: str) -> list[dict[str, Any]] | str:
    """The events the job emitted on `worker`, read back from its job store, or why not."""
    try:
        fut = st.client.submit(
            rec.service, "job_events", kwargs={"uuid": rec.uuid}, workers=worker, timeout=READ_BACK_TIMEOUT
        )
        result = await await_result(fut, READ_BACK_TIMEOUT + 1.0)
    except (ZfabError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    entry = result.get(worker) if isinstance(result, dict) else None
    events = entry.get("result") if isinstance(entry, dict) and not entry.get("failed") else None
    if not isinstance(events, list):
        return "the worker could not read them back"
    return [e for e in events if isinstance(e, dict)]


async def _from_workers(st: ApiState, rec: JobRecord, after: int) -> AsyncIterator[bytes]:
    """A job from before an API restart: keep-alives until its recovery ends, then its stored events."""
    ping = st.settings.sse_ping_seconds
    next_ping = time.monotonic() + ping
    waiter = st.jobs.listen(rec.uuid)  # set when the recovery ends, or the server stops
    tried = float("-inf")
    try:
        while not rec.done:
            if st.jobs.closing:
                return
            waiter.clear()
            if rec.live is None and time.monotonic() - tried >= RECOVERY_RETRY_SECONDS:
                tried = time.monotonic()
                await ensure_live(st, rec)
            wait = max(0.0, next_ping - time.monotonic())
            if rec.live is None:  # nobody to ask yet (no broker, no workers): try again shortly
                wait = min(wait, max(0.0, tried + RECOVERY_RETRY_SECONDS - time.monotonic()))
            try:
                await asyncio.wait_for(waiter.wait(), wait)
            except TimeoutError:
                pass
            if time.monotonic() >= next_ping:
                yield PING
                next_ping = time.monotonic() + ping
    finally:
        st.jobs.unlisten(rec.uuid, waiter)
    workers = rec.dispatched()
    answers = await asyncio.gather(*(_worker_events(st, rec, w) for w in workers))
    events: list[dict[str, Any]] = []
    for worker, got in zip(workers, answers, strict=True):
        if isinstance(got, str):
            yield comment(f"the events of worker {worker} are not available: {got}")
        else:
            events.extend(got)
    if len(events) > after:
        yield b"".join(event_frame(i + 1, events[i]) for i in range(after, len(events)))


async def _from_database(st: ApiState, rec: JobRecord, after: int) -> AsyncIterator[bytes]:
    """Another replica's job (or one this replica let go of): its events as its owner writes them to
    the shared database, woken by the owner's NOTIFY; ids are the events' sequence numbers in the job."""
    assert st.cluster is not None
    async for item in st.cluster.events(rec, after):
        yield PING if item is None else event_frame(*item)


def from_database(st: ApiState, rec: JobRecord) -> bool:
    """Stream from the shared database: a job of another replica, or a finished one not in memory."""
    return st.cluster is not None and (rec.remote or (rec.live is None and rec.stored is not None and rec.done))


async def event_stream(
    st: ApiState, rec: JobRecord, after: int, tracebacks: bool, payloads: bool = True
) -> AsyncIterator[bytes]:
    if from_database(st, rec):
        async for chunk in _from_database(st, rec, after):
            yield chunk
        assert st.cluster is not None
        fresh = await st.cluster.read(rec.uuid)
        rec = fresh if fresh is not None else rec
    else:
        source = _live if rec.stored is None and rec.live is not None else _from_workers
        async for chunk in source(st, rec, after):
            yield chunk
    # Without `end`, the server is stopping: the caller reconnects (to the restarted API) with Last-Event-ID.
    if rec.done:
        view = rec.view(tracebacks=tracebacks)
        if not payloads:  # a caller without the payloads flag: the finished job without its results
            view.results = None
        yield end_frame(view)


@router.get(
    "/{uuid}/events",
    operation_id="job_events",
    summary="Follow a job's events (server-sent events)",
    response_class=EventStreamResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "One `data:` line (JSON) per event with `id:` its sequence number in the job, in order; "
            "then `event: end` with the finished job as data, and the stream closes. Idle streams get "
            "`: ping` comments.",
        },
        204: {"description": "`Last-Event-ID: end` for a finished job: nothing more to send"},
        **responses(401, 403, 404, 422),
    },
)
async def job_events(
    uuid: JobUuid, request: Request, principal: Principal, last_event_id: LastEventId = "0"
) -> Response:
    """The job's events as server-sent events, from the start or after `Last-Event-ID`.

    A finished job streams its events and the terminal event at once. After an API restart
    the events are read back from the workers' job stores (ids are then counted per worker,
    in worker-name order; for a one-worker job they are the same ids).
    """
    st = api_state(request)
    rec = await known_job(st, uuid)
    not_found_outside(request, rec.service, uuid)
    if not rec.remote:
        await ensure_live(st, rec)
    if last_event_id == "end" and rec.done:
        return Response(status_code=204)
    after = int(last_event_id) if last_event_id != "end" else 0
    tracebacks = st.settings.tracebacks_for(principal)
    return EventStreamResponse(event_stream(st, rec, after, tracebacks, grant_of(request).payloads))


@router.post(
    "/{uuid}/input",
    operation_id="send_input",
    summary="Answer a job's input request",
    status_code=202,
    response_model=Job,
    responses=responses(400, 401, 403, 404, 409, 413, 422, 503, 504),
)
async def send_input(uuid: JobUuid, answer: InputAnswer, request: Request, principal: Principal) -> Job:
    """Give a job waiting for input (`state: waiting`) its answer. 202 once the worker took it;
    400 with the worker's reason when the value does not match the request's schema; 409 when
    the job is not waiting for input."""
    st = api_state(request)
    rec = await known_job(st, uuid)
    not_found_outside(request, rec.service, uuid)
    if rec.remote:
        if rec.done:
            raise ProblemError(409, "job-finished", "Job already finished", f"job {uuid} already finished", job=uuid)
        assert st.cluster is not None  # only a replica's jobs are remote
        return await st.cluster.forward(rec, "input", answer.model_dump(mode="json"))
    return await input_local(st, rec, answer, tracebacks=st.settings.tracebacks_for(principal))
