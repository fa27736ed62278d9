"""A worker's answers about a job it already received: GET (its state or result, from memory or
from the store), DELETE (cancel it) and PUT (stream credits, or the answer to an input request).

Owner thread only, like the rest of the worker's handlers; a GET of a job the worker no longer
remembers is answered from the store's writer thread once the row is read.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

from ..core import protocol as nfp
from ..core.payloads import Outcome, Word, iso
from ..core.states import JobState
from ..transport.base import Transport
from .job import Job
from .jobstore import JobStore, StoredJob
from .recent import RecentJobs
from .runner import JobRunner

log = logging.getLogger(__name__)


class JobRequests:
    """GET, DELETE and PUT for one worker (its name, jobs, store, runner and owner loop)."""

    def __init__(
        self,
        *,
        name: str,
        service: str,
        jobs: RecentJobs,
        store: JobStore,
        runner: JobRunner,
        loop: Transport,
        counts: dict[str, int],
    ) -> None:
        self.name = name
        self.service = service
        self.jobs = jobs
        self.store = store
        self.runner = runner
        self.loop = loop
        self.counts = counts  # the worker's own counters: a bad PUT is a rejected frame

    def reply(self, msg: nfp.BrokerJob, status: bytes, payload: Any, command: bytes = nfp.RESPONSE) -> None:
        self.loop.send(nfp.worker_reply(command, msg.client, msg.uuid, status, nfp.dumps(payload)))

    def answer(self, job: Job, client: bytes) -> None:
        """A remembered job's result, or where it stands."""
        if job.state.final:
            frames = nfp.worker_reply(nfp.RESPONSE, client, job.uuid.encode(), job.status_code, job.result_payload)
        else:
            status = nfp.ST_WAITING_INPUT if job.state == JobState.WAITING else nfp.ST_PENDING
            state = Word.STARTED if job.state != JobState.QUEUED else Word.PENDING
            frames = nfp.worker_reply(
                nfp.RESPONSE, client, job.uuid.encode(), status, nfp.dumps(self.runner.status(job.uuid, state))
            )
        self.loop.send(frames)

    def get(self, msg: nfp.BrokerJob) -> None:
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        if job is not None:
            self.answer(job, msg.client)
            return

        def reply(found: StoredJob | None) -> None:
            if found is None:
                status, payload = nfp.ST_NOT_FOUND, nfp.dumps(self.runner.status(uuid, Word.NOT_FOUND))
            elif found.result is not None:
                r = found.result
                status, payload = (found.status_code or "200").encode(), r.encode() if isinstance(r, str) else r
            else:
                status, payload = nfp.ST_PENDING, nfp.dumps(self.runner.status(uuid, Word.PENDING))
            self.runner.send(nfp.worker_reply(nfp.RESPONSE, msg.client, msg.uuid, status, payload))

        try:
            self.store.read(uuid, reply)
        except queue.Full:
            self.reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker job store is busy"]))

    def delete(self, msg: nfp.BrokerJob) -> None:
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        if job is None:
            self.reply(msg, nfp.ST_NOT_FOUND, self.runner.status(uuid, Word.NOT_FOUND))
            return
        if not job.state.final:
            job.cancel()
            if job.claim():
                # Still queued: it ends now, without waiting for a pool thread.
                job.started_at = time.time()
                self.runner.complete(job, nfp.ST_OK, None, Outcome.CANCELLED, ["cancelled before it started"])
        state = job.state.value if job.state.final else Word.CANCELLING
        self.reply(msg, nfp.ST_DISPATCHED, self.runner.status(uuid, state))

    def put(self, msg: nfp.BrokerJob) -> None:
        """Client data for a running job: stream credits, or the answer to an input request."""
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        try:
            body = nfp.loads(msg.body)
            if not isinstance(body, dict):
                raise ValueError("PUT body must be a JSON object")
        except ValueError as exc:
            self.counts["rejected_frames"] += 1
            log.warning("worker %s: bad PUT for job %s: %s", self.name, uuid, exc)
            return
        if "credit" in body:
            if job is not None and isinstance(body["credit"], int):
                job.grant(body["credit"])
            return
        input_id = str(body.get("input_id", ""))
        problem = "job not found" if job is None or job.state.final else job.deliver_input(input_id, body.get("value"))
        response = {"input_id": input_id, "accepted": problem is None, "errors": [problem] if problem else []}
        payload = {
            "event_type": "input_response",
            "message": "input accepted" if problem is None else problem,
            "severity": "INFO" if problem is None else "WARNING",
            "status": "running",
            "task": job.task if job else "",
            "juuid": uuid,
            "timestamp": iso(time.time()),  # as every event has: when the answer came (the worker's clock)
            "extras": {"input_response": response},
        }
        if job is not None:
            self.runner.emit(job, payload)
        else:
            payload.update(worker=self.name, service=self.service, uuid=uuid)
            self.loop.send(nfp.worker_reply(nfp.EVENT, msg.client, msg.uuid, nfp.ST_OK, nfp.dumps(payload)))
