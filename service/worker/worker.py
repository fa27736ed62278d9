"""Worker: a service class whose `@task` methods run jobs sent by the broker.

The DEALER socket belongs to the owner loop, which keeps the worker registered with its broker
(READY, keepalives, credits: here), admits jobs (admission.py: cheap checks, dedupe by uuid, bounds)
and answers GET/DELETE/PUT (requests.py). Pool threads run the jobs (runner.py); the job store's
writer thread records them in batches, and 201 follows each commit.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import zmq

from ..core import payloads
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.logbudget import LogBudget
from ..core.payloads import Word
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.links import Links, several
from ..transport.loop import OwnerLoop
from ..transport.shm import ShmArena
from ..transport.wire import dealer_socket
from .admission import REFUSALS_LOGGED_AT_ONCE, REFUSALS_LOGGED_PER_SECOND, Admission
from .aio import AsyncRunner
from .contact import BrokerContact, Silence
from .credits import RECHECK_SECONDS, credits_for, worth_telling
from .job import Job
from .jobstore import MAX_PARKED_BYTES, JobStore
from .naming import claim_name, worker_file
from .pool import JobPool
from .recent import RecentJobs
from .refusals import NameRefusals
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
    """Subclass it, set `service`, and mark task methods with `@task`.

    A task's type hints are its arguments' schema (`list_tasks` serves it). Jobs run on a bounded
    pool of threads (`ZFAB_POOL_SIZE`), or on the worker's event loop for `async def` tasks, never
    on the socket's loop, and are recorded in the worker's job store (SQLite, under `ZFAB_DATA_DIR`).
    `zfab worker --worker module:Class` runs one; so does `start()` in your own process.

    Args:
        broker: the broker's endpoint (default: `ZFAB_BROKER`).
        name: the worker's name (default: `SERVICE-HOSTNAME`, stable across restarts); one process
            holds a name at a time.
        service: the service's name, instead of the class's `service`.
        settings: bounds and timings (default: `Settings()`, from the `ZFAB_*` environment).
        transport: for tests: a `StubTransport` (`zfab.transport.stub`).
        clock: for tests: the stub's `FakeClock`.

    Raises:
        ValueError: the class has no service name and none was given.

    Example:
        ```python
        from zfab import Job, Worker, task


        class Inventory(Worker):
            service = "inventory"

            @task
            def count(self, job: Job, site: str, limit: int = 10) -> int:
                job.event(f"counting {site}", progress=0.5)
                return min(limit, 42)


        with Inventory(broker="tcp://127.0.0.1:5555", name="inv-1"):
            ...                                   # serves jobs until the block ends
        ```
    """

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
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.service_name = service or type(self).service
        if not self.service_name:
            raise ValueError(f"{type(self).__name__} has no service name: set `service` or pass service=")
        self.name, self._name_lock = claim_name(Path(s.data_dir), self.service_name, name)
        self._service_b = self.service_name.encode()
        self._identity = self.name.encode()  # made anew for every connection (open_socket)
        self._previous: str | None = None  # the identity of our last connection, said in READY
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
        self.refusals = NameRefusals(self.name, self.keepalive)  # READYs refused: another worker has our name
        self._credits_checked = 0.0
        self.jobs = RecentJobs(max_count=RECENT_JOBS, max_bytes=s.worker_recent_bytes)  # owner adds and trims
        self.contact = BrokerContact(self.keepalive)  # may jobs start; a broker silent too long
        self._heard_since_ready = False  # owner: the broker answered this connection (readiness)
        self.counts: dict[str, int] = {"rejected_frames": 0, "busy": 0, "handler_errors": 0}
        # A peer sending malformed frames: the first few logged, then one every 10 s (all counted).
        self._rejects_log = LogBudget(burst=REFUSALS_LOGGED_AT_ONCE, per_second=REFUSALS_LOGGED_PER_SECOND, clock=clock)
        self.store = JobStore(
            worker_file(Path(s.data_dir), self.name, ".sqlite"),
            queue_size=s.job_queue_size * 4 + 64,
            retention_seconds=s.job_retention_seconds,
            retention_count=s.job_retention_count,
            max_events_per_job=s.max_events_per_job,
            max_payload_bytes=s.worker_store_payload_bytes,
            # what a job left unfinished by a previous run reads as (payloads.py's rule, this worker's name)
            failure_payload=lambda uuid, task, why: nfp.dumps(
                payloads.failure(self.name, self.service_name, uuid, task, [why])
            ),
        )
        self.loop: Transport = (transport or OwnerLoop)(
            self,
            name=f"worker {self.name}",
            outbound_size=s.outbound_queue_size,
            submit_timeout=s.submit_timeout,
            sched_batch=s.sched_batch,
        )
        self.links = Links(self.loop, self._hello, lambda: None) if several(self.broker) else None  # docs/failover.md
        self.epoch = 0  # the highest term a broker's keepalive said (docs/failover.md)
        self.shm = ShmArena(s, clock=clock)
        self.runner = JobRunner(
            name=self.name,
            service=self.service_name,
            tasks=self.tasks,
            store=self.store,
            loop=self.loop,
            recent=self.jobs,
            max_message_bytes=s.max_message_bytes,
            contact=self.contact,
            shm=self.shm if self.shm.enabled else None,
            clock=clock,
        )
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
        self.aio = (
            AsyncRunner(self.runner.run_async, concurrency=s.async_concurrency, name=self.name)
            if self.has_async
            else None
        )
        self.pool: JobPool[Job] = JobPool(
            self.runner.run, size=s.pool_size, capacity=s.job_queue_size, name=f"{self.name}-job"
        )
        self.admission = Admission(
            settings=s,
            service=self.service_name,
            tasks=self.tasks,
            jobs=self.jobs,
            store=self.store,
            runner=self.runner,
            requests=self.requests,
            shm=self.shm,
            pool=self.pool,
            aio=self.aio,
            counts=self.counts,
            clock=clock,
        )

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> Worker:
        """Opens its job store, starts its pool and connects to the broker; returns the worker itself, so
        `worker = MyWorker().start()` reads well. A `with` block starts and stops it.

        Returns:
            The worker, started.

        Example:
            ```python
            worker = Inventory(name="inv-1").start()
            ```
        """
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
        `drain` seconds (ZFAB_DRAIN_TIMEOUT), then disconnect and close the job store.

        Args:
            drain: seconds its admitted jobs may take to finish (default: `ZFAB_DRAIN_TIMEOUT`).

        Example:
            ```python
            worker.stop(drain=10)
            ```
        """
        self.admission.draining = True
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
        watch = None if self.links is None else self.links.watch  # several brokers: READY once one is up
        return dealer_socket(ctx, self._identity, self.settings, self.broker, watch)

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
        if held := self.jobs.uuids(1000):  # a broker that took over sends a retried POST of one here, not elsewhere
            fields["holds"] = held
        if self.shm.host is not None:
            fields["host"] = self.shm.host  # clients on this host may send us handles, and get them back
        return nfp.dumps(fields)

    def on_connected(self) -> None:
        if self.links is None:  # several brokers: READY once a connection is up (transport/links.py)
            self._hello()

    def _hello(self) -> None:
        # READY goes first after every (re)connect, before any keepalive.
        self.loop.send_now(nfp.worker_control(nfp.READY, self._service_b, self.announce()))
        self.contact.connected()
        self._heard_since_ready = False

    def on_closing(self) -> None:
        if self.refusals.retry_at is None:  # a refused worker is not registered: nothing to say goodbye to
            self.loop.send_now(nfp.worker_control(nfp.DISCONNECT, self._service_b))

    def _announce_draining(self) -> None:
        if self.refusals.retry_at is None:
            self._send_keepalive()

    def on_timer(self, now: float) -> float | None:
        retry_at = self.refusals.retry_at
        if retry_at is not None:  # refused: quiet until it is time to try READY again
            if now < retry_at:
                return retry_at
            self.refusals.retry_at = None
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
        if ka.due() and (self.links is None or self.links.connected):  # several brokers: one must be up
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
        return self.admission.draining

    def registered(self) -> bool:
        """Ready: the broker answered since this connection's READY, within its hold time."""
        return self._heard_since_ready and not self.keepalive.expired()

    def held(self) -> int:
        """Jobs admitted and not finished: queued or running, on the pool or the event loop."""
        return self.admission.received - self.runner.finished

    def busy(self) -> bool:
        return self.held() > 0

    def on_frames(self, frames: Frames) -> None:
        try:
            msg = nfp.decode_broker_to_worker(frames, self.settings.max_message_bytes)
        except nfp.ProtocolError as exc:
            self.counts["rejected_frames"] += 1
            held = self._rejects_log.take()
            if held is not None:
                more = f" ({held} more not logged)" if held else ""
                log.warning("worker %s dropped a malformed message: %s%s", self.name, exc, more)
            if exc.reason == "oversize":
                self.admission.refuse_oversize(frames)
            return
        self._heard_since_ready = True
        if isinstance(msg, nfp.BrokerControl):
            if msg.command == nfp.KEEPALIVE:
                if msg.epoch is not None and msg.epoch < self.epoch:  # a deposed broker (docs/failover.md): leave
                    return self.loop.request_reconnect()
                self.epoch = max(self.epoch, msg.epoch or 0)
                self.loop.bundles(b"", msg.bundle)  # what this loop sends in one step may go as one
                self.keepalive.heard()
                self.refusals.registered()
                if self.keepalive.answers():  # with the broker's wave, not on a clock of our own
                    self._send_keepalive()
            elif msg.reason in ("name_taken", "declaration_conflict"):  # refused: back off, then try again
                self._heard_since_ready = False  # not registered: not ready
                self.refusals.refused(msg)
            elif self.refusals.retry_at is not None:
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
                self.admission.post(msg)
            elif msg.command == nfp.GET:
                self.requests.get(msg)
            elif msg.command == nfp.DELETE:
                self.requests.delete(msg)
            elif msg.command == nfp.PUT:
                self.requests.put(msg)
            else:
                self.requests.reply(msg, nfp.ST_BAD_REQUEST, self.runner.status(msg.uuid.decode(), Word.UNSUPPORTED))
        except Exception as exc:  # RecursionError, MemoryError...: answered, counted; the loop goes on
            self.counts["handler_errors"] += 1
            log.exception("worker %s failed on a %s", self.name, nfp.COMMAND_NAMES[msg.command])
            why = f"the worker could not handle this request: {type(exc).__name__}: {str(exc)[:200]}"
            self.requests.reply(msg, nfp.ST_ERROR, self.runner.failure(msg.uuid.decode(errors="replace"), "", [why]))

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
            # journaled rows not in SQLite yet (jobstore.py); the journal on disk holds them and one segment more
            "store_parked_bytes": self.store.parked_bytes(),
            "store_parked_bytes_capacity": MAX_PARKED_BYTES,
            "store_journal_bytes": self.store.journal.bytes_held,
            # 201s held for notices.STARTED_NOTICE_DELAY: at most one per job the worker holds
            "started_notices_waiting": self.runner.notices.waiting(),
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
            "draining": self.admission.draining,
            "jobs_remembered": len(self.jobs),
            "jobs_remembered_capacity": RECENT_JOBS,
            "jobs_remembered_bytes": self.jobs.bytes,
            "jobs_remembered_bytes_capacity": self.jobs.max_bytes,
            "credits": self.credits,
            **self.shm.stats(),
        }

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
        if self.admission.record_batch() and self.settings.worker_prefetch is None:
            self._follow_run_times()

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
