"""Admitting the jobs the broker sends (POST), on the worker's owner loop: the cheap checks here,
validation and the run on a pool thread or the event loop (runner.py). A receive batch's new jobs are
recorded by the job store in one write, and start once it is durable: a job never runs before its
receipt is kept, so a worker killed while it runs answers a retried POST with "interrupted" after
its restart instead of running it again. Their 201 follows too.

A retried POST never runs a job twice: it is answered with what the job is now (or, after a restart,
from the store). A task the service lacks, a body that cannot be read, a worker that is stopping or
has no room are answered at once (400, or busy).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable

from ..core import payloads, shmhandle, sizes
from ..core import protocol as nfp
from ..core.errors import ProtocolError
from ..core.logbudget import LogBudget
from ..core.payloads import Word
from ..core.schemacheck import is_number
from ..settings import Settings
from ..transport.base import Frames
from ..transport.shm import ShmArena
from .aio import AsyncRunner
from .job import Job
from .jobstore import JobStore
from .pool import JobPool
from .recent import RecentJobs
from .requests import JobRequests
from .runner import JobRunner
from .task import TaskSpec

log = logging.getLogger(__name__)

# A peer sending bad handles: the first few refusals are logged, then one every 10 s saying how many
# were not (each one is answered 400 and counted either way).
REFUSALS_LOGGED_AT_ONCE = 3
REFUSALS_LOGGED_PER_SECOND = 0.1


class Admission:
    """The worker's door for jobs: `post` for each POST, `record_batch` after each receive batch."""

    def __init__(
        self,
        *,
        settings: Settings,
        service: str,
        tasks: dict[str, TaskSpec],
        jobs: RecentJobs,
        store: JobStore,
        runner: JobRunner,
        requests: JobRequests,
        shm: ShmArena,
        pool: JobPool[Job],
        aio: AsyncRunner | None,
        counts: dict[str, int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.service = service
        self.tasks = tasks
        self.jobs = jobs
        self.store = store
        self.runner = runner
        self.requests = requests
        self.shm = shm
        self.pool = pool
        self.aio = aio
        self.counts = counts  # the worker's counters: busy answers, rejected frames
        self.received = 0  # owner: jobs admitted since the start
        self.draining = False  # the worker is stopping: new jobs are answered busy, admitted ones finish
        self._unstored: list[Job] = []  # owner: admitted in this receive batch, not yet recorded nor started
        self._unstored_async = 0  # of them, `async def` tasks' (they wait for the event loop, not the pool)
        self._refusals_log = LogBudget(
            burst=REFUSALS_LOGGED_AT_ONCE, per_second=REFUSALS_LOGGED_PER_SECOND, clock=clock
        )

    def post(self, msg: nfp.BrokerJob) -> None:
        """Admit a job: cheap checks here, validation and the run on a pool thread."""
        uuid = msg.uuid.decode(errors="replace")
        known = self.jobs.get(uuid)
        if known is not None:
            # A retried POST never runs a job twice: answer with what the job is now, and its end to the
            # client that asked last (it reconnected, perhaps to another broker: docs/failover.md).
            known.client = msg.client
            self.requests.answer(known, msg.client)
            return
        if uuid in self.store.stored_before:
            self.requests.get(msg)  # ran before this worker restarted: its stored outcome answers
            return
        if shmhandle.is_handle(msg.body):
            self._post_from_shm(msg, uuid)
            return
        try:
            body = payloads.read_post_body(msg.body)
        except ProtocolError as exc:
            self.requests.reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))
            return
        self._admit(msg, uuid, body)

    def refuse_oversize(self, frames: Frames) -> None:
        """A job over our message limit (the broker's is larger): answered 400 naming the limit, so its
        client hears why now, not at its deadline. The socket's cap bounded what came in (core/sizes.py)."""
        limit = self.settings.max_message_bytes
        try:
            msg = nfp.decode_broker_to_worker(frames, sizes.socket_cap(limit))
        except nfp.ProtocolError:
            return
        if isinstance(msg, nfp.BrokerJob):
            uuid = msg.uuid.decode(errors="replace")
            why = sizes.too_large(f"the request of job {uuid}", sum(len(f) for f in frames), limit)
            self.requests.reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [why]))

    def record_batch(self) -> bool:
        """After a receive batch: its new jobs go to the store in one write, then start (201 follows once
        the write is durable). False when it admitted none."""
        if not self._unstored:
            return False
        batch, self._unstored, self._unstored_async = self._unstored, [], 0
        rows = [(j.uuid, j.client, j.task, j.request, j.received_at) for j in batch]
        acks = [j for j in batch if j.ack]
        try:
            self.store.write(
                self.store.insert_op(rows), (lambda: self.runner.acknowledge(acks)) if acks else None, timeout=0.5
            )
        except queue.Full:
            log.error("worker %s: job store full; %d received jobs not recorded", self.runner.name, len(rows))
        # Started after the write, not as each came: a pool thread woken before it would also have
        # waited for the owner, which holds the GIL until it polls again (the same wait on a sequential
        # echo, with two more GIL hand-offs).
        self.runner.notices.handed(batch)  # before the puts: a job started at once finds the owner's look promised
        for job in batch:
            if self.aio is not None and job.is_async:
                self.aio.submit(job)
            else:
                self.pool.put(job)  # cannot be full: _full counted the batch's jobs
        return True

    def _full(self, is_async: bool) -> bool:
        """No room for one more job of this kind: the pool's queue, or the event loop's waiting line
        (either with this batch's jobs, which start once recorded)."""
        if is_async and self.aio is not None:
            return self.aio.waiting + self._unstored_async >= self.settings.job_queue_size
        return self.pool.depth() + len(self._unstored) - self._unstored_async >= self.pool.capacity

    def _post_from_shm(self, msg: nfp.BrokerJob, uuid: str) -> None:
        """A POST whose body is a handle to a block of a client on this host: copied out of the
        block (transport/shm.py: never mapped, so a peer cutting the file cannot fault us) and
        parsed. A handle that is not good, or a block cut or reused while it was read, is refused 400."""
        try:
            with self.shm.payload(msg.body) as p:
                msg.body = p.data
                try:
                    body = payloads.read_post_body(p.data)
                except ProtocolError as exc:
                    self.requests.reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))
                    return
                body.attempt = max(body.attempt, p.handle.attempt)  # a retried job's block says attempt 1
                self._admit(msg, uuid, body)
        except shmhandle.HandleError as exc:
            held = self._refusals_log.take()  # a peer sending forged handles cannot flood the log
            if held is not None:
                more = f" ({held} more refusals not logged)" if held else ""
                log.warning("worker %s refused the body of job %s: %s%s", self.runner.name, uuid[:64], exc.detail, more)
            self.requests.reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))

    def _admit(self, msg: nfp.BrokerJob, uuid: str, body: payloads.PostBody) -> None:
        task_name = body.task
        spec = self.tasks.get(task_name)
        if spec is None:
            why = (
                f"task '{task_name}' is not a task of service '{self.service}'; "
                f"its tasks are: {', '.join(sorted(self.tasks))}"
            )
            self.requests.reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, task_name, [why]))
            return
        if self.draining:
            self.counts["busy"] += 1
            self.requests.reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker is stopping"]))
            return
        if self._full(spec.is_async):
            self.counts["busy"] += 1
            self.requests.reply(
                msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker job queue is full"])
            )
            return
        timeout, queued, trace, shm_reply = body.timeout, 0.0, None, False
        if msg.meta is not None:
            # The broker held the job a while: what is left of its deadline is the worker's deadline.
            left, held = msg.meta.get("deadline"), msg.meta.get("queued")
            if is_number(left) and left >= 0:
                timeout = max(1e-3, float(left))
            if is_number(held) and held >= 0:
                queued = float(held)
            if "traceparent" in msg.meta:
                try:
                    trace = payloads.trace_context(msg.meta)  # the submitter's, for the attempt's span
                except ValueError:
                    self.counts["rejected_frames"] += 1  # the job runs, untraced
            # The broker passes the client's host id on only when it is ours; we check it anyway.
            shm_reply = self.shm.host is not None and msg.meta.get("host") == self.shm.host
        # A body over the store's bound is never written, so the job keeps no copy of it: a 10 MB
        # job then holds its decoded arguments, not the raw body as well, for as long as it is
        # remembered.
        # (bytes() copies only a large frame's view, which would otherwise pin ZeroMQ's message.)
        request = bytes(msg.body) if self.store.storable(msg.body) else b""
        job = Job(
            uuid=uuid,
            client=msg.client,
            task=task_name,
            args=body.args,
            kwargs=body.kwargs,
            timeout=timeout,
            push=body.push,
            ack=body.ack,
            request=request,
            queued_s=queued,
            attempt=body.attempt,
            retry=spec.retry_policy(body.retries, body.backoff),
            trace=trace,
            traced=msg.meta is not None and self.settings.hop_traces,
            shm_reply=shm_reply,
            emit=self.runner.emit,
            stream_out=self.runner.stream_out,
            is_async=self.aio is not None and spec.is_async,
        )
        # The store records the whole receive batch in one write; the job starts after it (record_batch).
        self.received += 1
        self._unstored.append(job)
        if job.is_async:
            self._unstored_async += 1
        self.jobs.add(job)
