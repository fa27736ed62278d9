"""Worker: a service class whose `@task` methods run jobs sent by the broker.

The DEALER socket belongs to the owner loop, which admits jobs (cheap checks, dedupe by
uuid, bounds) and answers GET/DELETE/PUT (requests.py). Pool threads run the jobs (runner.py); the
job store's writer thread records them in batches, and 201 follows each commit.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import zmq

from ..core import payloads, shmhandle, sizes
from ..core import protocol as nfp
from ..core.errors import ProtocolError
from ..core.keepalive import Clock, KeepAlive
from ..core.payloads import Word
from ..core.schemacheck import is_number
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.shm import ShmArena
from ..transport.wire import dealer_socket
from .aio import AsyncRunner
from .contact import BrokerContact, Silence
from .credits import RECHECK_SECONDS, credits_for, worth_telling
from .job import Job
from .jobstore import JobStore
from .naming import claim_name, worker_file
from .pool import JobPool
from .recent import RecentJobs
from .requests import JobRequests
from .runner import JobRunner
from .task import TaskSpec, build_spec, is_task, task

log = logging.getLogger(__name__)

RECENT_JOBS = 10_000  # finished jobs kept in memory for fast GET; older ones are read from the store
DROPPED = "not started: the broker gave this job up (it lost contact with this worker), so it did not run here"
# The broker purges a worker it has not heard from for its hold time, and the worker cannot tell a
# purge whose notice was lost in a partition from a broker that still counts on it: after a silence
# that long it drops what it had not started, so nothing the broker gave up runs here later.
CUT_OFF = (
    "not started: this worker heard nothing from its broker for longer than the hold time, after which "
    "the broker gives up a worker's jobs, so it did not run here"
)


class Worker:
    """Subclass it, set `service`, and mark task methods with `@task`."""

    service: ClassVar[str] = ""

    def __init__(
        self,
        *,
        broker: str | None = None,
        name: str | None = None,
        service: str | None = None,
        settings: Settings | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """`transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.service_name = service or type(self).service
        if not self.service_name:
            raise ValueError(f"{type(self).__name__} has no service name: set `service` or pass service=")
        self.name, self._name_lock = claim_name(Path(s.data_dir), self.service_name, name)
        self._service_b = self.service_name.encode()
        self._identity = self.name.encode()  # made anew for every connection (open_socket)
        self._previous: str | None = None  # the identity of our last connection, said in READY
        self._refusals = 0  # owner: READYs in a row the broker refused (another worker has our name)
        self._retry_at: float | None = None  # owner: when to try READY again after a refusal
        self.tasks: dict[str, TaskSpec] = {}
        for attr in dir(type(self)):
            fn = getattr(self, attr, None)
            if is_task(fn):
                assert fn is not None
                self.tasks[attr] = build_spec(attr, fn, Job)
        self.has_async = any(spec.is_async for spec in self.tasks.values())
        # Credits: what its pool runs plus its prefetch (never more than its queue admits), and its
        # event loop's slots when it has async tasks. One count for both kinds: a service that mixes
        # long thread tasks and async ones on one worker lets the broker send thread jobs up to the
        # whole count (the worker answers busy past its queue, and the broker takes them back).
        self.credits = 0
        self.keepalive = KeepAlive(s.keepalive_interval, s.keepalive_multiplier, clock, answering=True)
        self._credits_checked = 0.0
        self.jobs = RecentJobs(max_count=RECENT_JOBS, max_bytes=s.worker_recent_bytes)  # owner adds and trims
        self._received = 0  # owner thread only
        self.contact = BrokerContact(self.keepalive)  # may jobs start; a broker silent too long
        self._heard_since_ready = False  # owner: the broker answered this connection (readiness)
        self._unstored: list[Job] = []  # owner thread only: received in this batch, not yet stored
        self.counts: dict[str, int] = {"rejected_frames": 0, "busy": 0, "handler_errors": 0}
        self._draining = False  # set by stop(): new jobs are answered busy, admitted ones finish
        self.store = JobStore(
            worker_file(Path(s.data_dir), self.name, ".sqlite"),
            queue_size=s.job_queue_size * 4 + 64,
            retention_seconds=s.job_retention_seconds,
            retention_count=s.job_retention_count,
            max_events_per_job=s.max_events_per_job,
            max_payload_bytes=s.worker_store_payload_bytes,
        )
        self.loop: Transport = (transport or OwnerLoop)(
            self,
            name=f"worker {self.name}",
            outbound_size=s.outbound_queue_size,
            submit_timeout=s.submit_timeout,
        )
        self.runner = JobRunner(
            name=self.name,
            service=self.service_name,
            tasks=self.tasks,
            store=self.store,
            loop=self.loop,
            recent=self.jobs,
            max_message_bytes=s.max_message_bytes,
            contact=self.contact.wait_to_start,
            in_contact_now=self.contact.in_touch_now,
            clock=clock,
        )
        self.shm = ShmArena(s, clock=clock)
        if self.shm.enabled:
            self.runner.shm, self.runner.shm_threshold = self.shm, self.shm.threshold
        self.requests = JobRequests(
            name=self.name,
            service=self.service_name,
            jobs=self.jobs,
            store=self.store,
            runner=self.runner,
            loop=self.loop,
            counts=self.counts,
        )
        self._tasks_schema: dict[str, Any] | None = None
        self.store.failure_payload = lambda uuid, task, why: nfp.dumps(self.runner.failure(uuid, task, [why]))
        self.aio = (
            AsyncRunner(self.runner.run_async, concurrency=s.async_concurrency, name=self.name)
            if self.has_async
            else None
        )
        self.pool: JobPool[Job] = JobPool(
            self.runner.run, size=s.pool_size, capacity=s.job_queue_size, name=f"{self.name}-job"
        )

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> Worker:
        self.shm.reclaim()  # blocks of processes that died since the last zfab process looked
        self.store.open()
        self.pool.start()
        if self.aio is not None:
            self.aio.start()
        self.loop.start()
        log.debug("worker %s serving '%s' via %s", self.name, self.service_name, self.broker)
        return self

    def stop(self, drain: float | None = None) -> None:
        """Refuse new jobs (busy), let admitted ones finish and send their results for up to
        `drain` seconds (ZFAB_DRAIN_TIMEOUT), then disconnect and close the job store."""
        self._draining = True
        try:
            # Tell the broker now (not at the next keepalive) so it stops picking this worker.
            self.loop.call(self._announce_draining, timeout=2.0)
        except Exception:
            log.debug("worker %s: could not announce draining", self.name)
        deadline = time.monotonic() + (self.settings.drain_timeout if drain is None else drain)
        pause = threading.Event()
        while (self.busy() or self.runner.unreported) and time.monotonic() < deadline:
            pause.wait(0.05)
        self.loop.stop()  # flushes the results still queued, within the linger bound
        self.pool.stop()
        if self.aio is not None:
            self.aio.stop()
        self.store.close()
        self.shm.close()  # its results were flushed with the loop; a client that reads one late asks again
        self._name_lock.close()  # the name is free for the next worker

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- built-in task -----------------------------------------------------------

    @task
    def list_tasks(self) -> list[dict[str, Any]]:
        """List this service's tasks with the JSON schema of their arguments."""
        return [spec.schema() for spec in self.tasks.values()]

    @task
    def job_events(self, uuid: str) -> list[dict[str, Any]]:
        """The events a job emitted on this worker, read back from its job store."""
        return self.store.events_of(uuid)

    # ---- Role: owner thread --------------------------------------------------------

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        # A fresh identity per connection: the broker's ROUTER ignores a second connection under
        # an identity in use, and an old connection of ours may linger there for a while.
        if self.loop.started.is_set():
            self._previous = self._identity.decode()  # READY says it: the broker lets our old one go
        self._identity = f"{self.name}~{secrets.token_hex(4)}".encode()
        return dealer_socket(ctx, self._identity, self.settings, self.broker)

    def announce(self) -> bytes:
        """READY's extra frame: name, credits and tasks with their argument schemas (docs/protocol.md)."""
        self.credits = self.compute_credits()
        if self._tasks_schema is None:  # made once: pydantic's schemas cost milliseconds
            self._tasks_schema = {name: spec.input_schema() for name, spec in self.tasks.items()}
        fields: dict[str, Any] = {"v": 2, "name": self.name, "credits": self.credits, "tasks": self._tasks_schema}
        # Where we run, for the line a second worker under our name is refused with; and our previous
        # connection, which the broker may still hold (a reconnect takes the name back at once).
        fields.update(hostname=socket.gethostname(), pid=os.getpid())
        if self._previous is not None:
            fields["previous"] = self._previous
        if self.shm.host is not None:
            fields["host"] = self.shm.host  # clients on this host may send us handles, and get them back
        return nfp.dumps(fields)

    def on_connected(self) -> None:
        # READY goes first after every (re)connect, before any keepalive.
        self.loop.send_now(nfp.worker_control(nfp.READY, self._service_b, self.announce()))
        self.contact.connected()
        self._heard_since_ready = False

    def on_closing(self) -> None:
        if self._retry_at is None:  # a refused worker is not registered: nothing to say goodbye to
            self.loop.send_now(nfp.worker_control(nfp.DISCONNECT, self._service_b))

    def _announce_draining(self) -> None:
        if self._retry_at is None:
            self._send_keepalive()

    def on_timer(self, now: float) -> float | None:
        if self._retry_at is not None:  # refused: quiet until it is time to try READY again
            if now < self._retry_at:
                return self._retry_at
            self._retry_at = None
            self.loop.request_reconnect()  # a new connection and READY (on_connected)
            return now + self.keepalive.interval
        ka = self.keepalive
        if ka.expired():
            step, until = self.contact.silent(now)
            if step is Silence.PROBE:
                self._send_keepalive()
            elif step is Silence.RECONNECT:
                log.warning("worker %s: broker silent for %.1f s; reconnecting", self.name, ka.hold_time)
                self._drop_unstarted(CUT_OFF)
                self.loop.request_reconnect()
            return until
        if ka.due():
            self._send_keepalive()
        notice = self.runner.send_due_notices(now)
        self.shm.sweep()
        return ka.next_deadline() if notice is None else min(ka.next_deadline(), notice)

    def _send_keepalive(self) -> None:
        self.credits = self.compute_credits()  # the broker takes the new count from the stats
        self.loop.send_now(nfp.worker_control(nfp.KEEPALIVE, self._service_b, nfp.dumps(self.stats())))
        self.keepalive.mark_sent()

    def _follow_run_times(self) -> None:
        """Adaptive prefetch: tell the broker at once (a keepalive with the stats, at most every
        RECHECK_SECONDS) when the credits moved by half or more, instead of at the next
        keepalive: a fresh worker given short jobs reaches its cap in a fraction of a second, and
        one whose jobs turned long stops hoarding them."""
        now = self.keepalive.clock()
        if now - self._credits_checked < RECHECK_SECONDS:
            return
        self._credits_checked = now
        if worth_telling(self.credits, self.compute_credits()):
            self._send_keepalive()

    def compute_credits(self) -> int:
        return credits_for(self.settings, self.runner.run_time, self.has_async)

    @property
    def draining(self) -> bool:
        return self._draining

    def registered(self) -> bool:
        """Ready: the broker answered since this connection's READY, within its hold time."""
        return self._heard_since_ready and not self.keepalive.expired()

    def _full(self, is_async: bool) -> bool:
        """No room for one more job of this kind: the pool's queue, or the event loop's waiting line."""
        if is_async and self.aio is not None:
            return self.aio.waiting >= self.settings.job_queue_size
        return self.pool.depth() >= self.pool.capacity

    def held(self) -> int:
        """Jobs admitted and not finished: queued or running, on the pool or the event loop."""
        return self._received - self.runner.finished

    def busy(self) -> bool:
        return self.held() > 0

    def on_frames(self, frames: Frames) -> None:
        try:
            msg = nfp.decode_broker_to_worker(frames, self.settings.max_message_bytes)
        except nfp.ProtocolError as exc:
            self.counts["rejected_frames"] += 1
            if self.counts["rejected_frames"] <= 3 or self.counts["rejected_frames"] % 1000 == 0:
                log.warning("worker %s dropped a malformed message: %s", self.name, exc)
            if exc.reason == "oversize":
                self._refuse_oversize(frames)
            return
        self._heard_since_ready = True
        if isinstance(msg, nfp.BrokerControl):
            if msg.command == nfp.KEEPALIVE:
                self.keepalive.heard()
                if self._refusals:
                    log.info(
                        "worker %s: registered with the broker (refused %d times before)", self.name, self._refusals
                    )
                    self._refusals = 0
                if self.keepalive.answers():  # with the broker's wave, not on a clock of our own
                    self._send_keepalive()
            elif msg.reason == "name_taken":
                self._name_refused(msg)
            elif self._retry_at is not None:
                pass  # refused, and waiting to try again: a new READY goes then, not now
            else:  # DISCONNECT: the broker does not know us (restarted), or dropped us
                if self.keepalive.expired():
                    # Heard only past the hold time: the broker may have purged us with the notice lost
                    # (a partition), and now knows us no more; what we hold may run elsewhere already.
                    log.warning("worker %s: the broker forgot us after a silence past its hold time", self.name)
                    self.contact.cut_off = True
                elif msg.reason in ("purged", "replaced"):
                    log.warning(
                        "worker %s: the broker gave us up (%s); jobs not started are dropped", self.name, msg.reason
                    )
                    self.contact.given_up = True
                else:
                    log.info("worker %s: broker asked to re-register", self.name)
                self.loop.request_reconnect()
            return
        self.keepalive.heard(keepalive=False)
        try:
            if msg.command == nfp.POST:
                self.handle_post(msg)
            elif msg.command == nfp.GET:
                self.requests.get(msg)
            elif msg.command == nfp.DELETE:
                self.requests.delete(msg)
            elif msg.command == nfp.PUT:
                self.requests.put(msg)
            else:
                self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.status(msg.uuid.decode(), Word.UNSUPPORTED))
        except Exception as exc:  # RecursionError, MemoryError...: answered, counted; the loop goes on
            self.counts["handler_errors"] += 1
            log.exception("worker %s failed on a %s", self.name, nfp.COMMAND_NAMES[msg.command])
            why = f"the worker could not handle this request: {type(exc).__name__}: {str(exc)[:200]}"
            self._reply(msg, nfp.ST_ERROR, self.runner.failure(msg.uuid.decode(errors="replace"), "", [why]))

    def _refuse_oversize(self, frames: Frames) -> None:
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
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [why]))

    def _name_refused(self, msg: nfp.BrokerControl) -> None:
        """The broker refused our READY: a live worker holds our name. We do not spin: we wait (the
        broker's suggestion, doubled on each refusal in a row, at most a hold time, with jitter) and
        try again, so we take the name over once its holder leaves; the first refusal is logged,
        the ones after it are not."""
        self._heard_since_ready = False  # not registered: not ready
        self._refusals += 1
        ka = self.keepalive
        base = msg.retry_after if msg.retry_after is not None else ka.interval
        wait = min(ka.hold_time, max(ka.interval, base) * 2 ** min(self._refusals - 1, 16))
        wait *= random.uniform(0.9, 1.1)  # two refused workers do not come back in step
        self._retry_at = ka.clock() + wait
        if self._refusals == 1:
            why = msg.detail or f"another worker is registered as {self.name}"
            log.warning(
                "worker %s: the broker refused it: %s. Trying again every %.0f s at most, until the name is free",
                self.name,
                why,
                ka.hold_time,
            )

    # ---- job handling (owner) ------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What the worker reports to the broker with each keepalive."""
        return {
            "job_queue_depth": self.pool.depth(),
            "job_queue_capacity": self.pool.capacity,
            "jobs_running": self.pool.running + (self.aio.running if self.aio is not None else 0),
            "async_jobs_running": self.aio.running if self.aio is not None else 0,
            "async_jobs_waiting": self.aio.waiting if self.aio is not None else 0,
            "pool_size": self.pool.size,
            "outbound_queue_depth": self.loop.queue_depth(),
            "outbound_queue_capacity": self.loop.outbound_size,
            "store_queue_depth": self.store.depth(),
            "store_queue_capacity": self.store.queue_size,
            # 201s held for runner.STARTED_NOTICE_DELAY: at most one per job the worker holds
            "started_notices_waiting": self.runner.notices_waiting(),
            "started_notices_capacity": self.pool.capacity
            + self.pool.size
            + (self.settings.job_queue_size + self.settings.async_concurrency if self.aio is not None else 0),
            "jobs_completed": self.runner.counts["completed"],
            "jobs_failed": self.runner.counts["failed"],
            "jobs_busy": self.counts["busy"],
            "jobs_dropped": self.runner.counts["dropped"],
            "results_oversize": self.runner.counts["oversize"],
            "payloads_not_stored": self.store.payloads_not_stored,
            "handler_errors": self.counts["handler_errors"],
            "frames_rejected": self.counts["rejected_frames"],
            "reconnects": self.loop.stats.reconnects,
            "draining": self._draining,
            "jobs_remembered": len(self.jobs),
            "jobs_remembered_capacity": RECENT_JOBS,
            "jobs_remembered_bytes": self.jobs.bytes,
            "jobs_remembered_bytes_capacity": self.jobs.max_bytes,
            "credits": self.credits,
            **self.shm.stats(),
        }

    def _reply(self, msg: nfp.BrokerJob, status: bytes, payload: Any, command: bytes = nfp.RESPONSE) -> None:
        self.requests.reply(msg, status, payload, command)

    def handle_post(self, msg: nfp.BrokerJob) -> None:
        """Admit a job: cheap checks here, validation and the run on a pool thread."""
        uuid = msg.uuid.decode(errors="replace")
        known = self.jobs.get(uuid)
        if known is not None:
            # A retried POST never runs a job twice: answer with what the job is now.
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
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))
            return
        self._admit(msg, uuid, body)

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
                    self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))
                    return
                body.attempt = max(body.attempt, p.handle.attempt)  # a retried job's block says attempt 1
                self._admit(msg, uuid, body)
        except shmhandle.HandleError as exc:
            n = self.shm.counts["refused"]
            if n <= 3 or n % 1000 == 0:  # a peer sending forged handles cannot flood the log
                log.warning("worker %s refused the body of job %s: %s", self.name, uuid[:64], exc.detail)
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))

    def _admit(self, msg: nfp.BrokerJob, uuid: str, body: payloads.PostBody) -> None:
        task_name = body.task
        if task_name not in self.tasks:
            why = (
                f"task '{task_name}' is not a task of service '{self.service_name}'; "
                f"its tasks are: {', '.join(sorted(self.tasks))}"
            )
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, task_name, [why]))
            return
        if self._draining:
            self.counts["busy"] += 1
            self._reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker is stopping"]))
            return
        if self._full(self.tasks[task_name].is_async):
            self.counts["busy"] += 1
            self._reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker job queue is full"]))
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
            retry=self.tasks[task_name].retry_policy(body.retries, body.backoff),
            trace=trace,
            traced=msg.meta is not None and self.settings.hop_traces,
            shm_reply=shm_reply,
            emit=self.runner.emit,
            stream_out=self.runner.stream_out,
        )
        # The job runs as soon as a pool thread is free; the store records the whole
        # receive batch in one write (see on_batch_end), and 201 follows that commit.
        if self.aio is not None and self.tasks[task_name].is_async:
            self.aio.submit(job)
        else:
            self.pool.put(job)  # cannot be full: admission above keeps it within capacity
        self._received += 1
        self._unstored.append(job)
        self.jobs.add(job)

    def on_batch_end(self) -> None:
        """After a receive batch: store its new jobs in one write (201 follows the commit), drop what
        the broker gave up, and let pool threads start jobs again once in touch."""
        if self.contact.given_up:
            self.contact.given_up = False
            self._drop_unstarted(DROPPED)
        if self.contact.cut_off:
            self.contact.cut_off = False
            self._drop_unstarted(CUT_OFF)
        self.contact.heard_again()
        if not self._unstored:
            return
        if self.settings.worker_prefetch is None:
            self._follow_run_times()
        batch, self._unstored = self._unstored, []
        rows = [(j.uuid, j.client, j.task, j.request, j.received_at) for j in batch]
        acks = [j for j in batch if j.ack]
        try:
            self.store.submit(
                self.store.insert_op(rows), (lambda: self.runner.acknowledge(acks)) if acks else None, timeout=0.5
            )
        except queue.Full:
            log.error("worker %s: job store full; %d received jobs not recorded", self.name, len(rows))

    def _drop_unstarted(self, why: str) -> None:
        """The broker purged us (or may have: `why` says which): it told the jobs' clients they were
        lost (and retried them where asked), so a job not started yet must not run here too. Each
        ends, stored, as failed with `why`; the answer reaches a client whose broker still routes it."""
        n = 0
        for job in self.jobs.unstarted():
            if job.claim():
                self.runner.drop(job, why)
                n += 1
        if n:
            log.warning("worker %s: dropped %d jobs it had not started (%s)", self.name, n, why.split(":")[0])
