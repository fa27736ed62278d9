"""Submitting a job to the fabric and recording it in the table: the one way a job starts."""

from __future__ import annotations

# A job the API submits gets the fabric's own kind of uuid: UUIDv7, time-ordered, so each
# worker's job store and the shared PostgreSQL table insert at the end of their uuid index; its
# random bits come from the OS 256 uuids at a time, so the event loop rarely gives up the GIL.
import time
from typing import Any

from zfab import new_job_uuid
from zfab.errors import ZfabError

from ..errors import from_fabric_error, unavailable
from ..models import JobRequest
from ..state import ApiState
from .record import JobRecord, encode_request
from .table import JobTable


def received(table: JobTable, uuid: str, event: dict[str, Any]) -> None:
    """An event of the job came (on the client's loop, as the worker sent it): stamped with its receipt on
    this process's clock (`received`, epoch seconds), where its history places it (api/jobs/history.py),
    and the job's SSE streams, if any, are woken."""
    event["received"] = round(time.time(), 6)
    table.changed(uuid)


def submit_record(
    st: ApiState,
    req: JobRequest,
    uuid: str | None,
    fp: str,
    *,
    resubmit: bool = False,
    persist: bool = True,
    retry_of: str | None = None,
    began: float | None = None,
    raw: bytes | None = None,
    attempt: int = 1,
    submitter: str = "",
) -> JobRecord:
    """Submit a job to the fabric and remember it in the table (POST /jobs, schedules, recovery).

    `persist=False`: not written until it changes (an event, its end) or the caller touches it.
    `retry_of`: the dead job this one submits again (POST /jobs/{uuid}/retry). `began`: the monotonic
    time its request was read, the start of its hop trace's `api` hop. `raw`: the request's JSON as it
    came, when the caller has it (else it is encoded): the table holds that, not the decoded request.
    `attempt` > 1: the next attempt of a job a restart cut short (api/jobs/recovery.py). `submitter`: who
    asked for it (its row and answer name them: api/http/audit.py)."""
    if not st.client.broker_alive:
        raise unavailable(f"the broker at {st.client.broker} is not answering; retry shortly")
    juuid = uuid or new_job_uuid()
    table = st.jobs
    held = time.monotonic() - began if began is not None else 0.0
    try:
        fut = st.client.submit(
            req.service,
            req.task,
            req.args,
            req.kwargs,
            req.workers,
            req.timeout,
            uuid=juuid,
            on_event=lambda event: received(table, juuid, event),
            retries=req.retries,
            backoff=req.backoff,
            priority=req.priority,
            delay=req.delay or None,
            resubmit=resubmit,
            attempt=attempt,
        )
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    # Set before the loop runs again: the API's client answers on this thread, so no reply is read first.
    fut.held_before = held
    rec = JobRecord(
        fut.uuid,
        req.service,
        req.task,
        req.workers,
        fut,
        fp,
        req.timeout,
        request_json=raw if raw is not None else encode_request(req),
        priority=req.priority,
        retries=req.retries,
        retry_of=retry_of,
        submitter=submitter,
    )
    table.add(rec, persist=persist)
    return rec
