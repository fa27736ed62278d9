"""Client: submits jobs to the broker and collects their results as dictionaries.

The DEALER socket belongs to the client's owner loop. `submit` (any thread) records
the job in a bounded table and queues its POST; the loop resolves the job's future
when the results are pushed back. GET polling is the fallback for jobs that went
quiet (a broker restart, a lost frame).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import tracing
from ..core import ids, payloads, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.retries import Backoff, read_backoff
from ..errors import JobNotFoundError, PayloadTooLargeError
from ..settings import Settings
from ..transport.base import LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.shm import ShmArena
from . import submission
from .clientjob import ClientJob, EventCallback, ignore_event
from .filestream import FileStream, download, resume_offset, stream_request
from .future import JobFuture
from .inflight import InFlight
from .interaction import answer_input, iter_events
from .session import ClientCounts, CompletionHook, Session
from .subscriber import Subscriber

Workers = str | list[str]

# The frames of a request around its service, target, uuid, body and flags (nfp.client_request).
_REQUEST_HEAD = len(nfp.CLIENT) + len(nfp.POST)


class Client:
    """Talk to a zfab (or NorFab) broker. Use as a context manager, or call start()/close().

    Args:
        broker: the broker's endpoint, e.g. `"tcp://127.0.0.1:5555"` (default: `ZFAB_BROKER`).
        name: the client's name, as the broker shows it (`show_clients`).
        settings: bounds and timings (default: `Settings()`, read from the `ZFAB_*` environment).
        acks: `False` asks the broker and workers to skip the per-job 202/201 acknowledgements: faster,
            at the cost the wire protocol (docs/protocol.md) describes.
        push: `True` (default) has results pushed when ready; `False` polls for them.
        poll_after: seconds before a job with no news is asked about (default: two keepalive intervals).
        queued_notice: seconds a job may wait in the broker's queue before the broker says "queued" (the
            future's admission and its "queued" timing); a job dispatched sooner costs no such message.
            0 asks for it at once (the API does: its POST answers with the state).
        encoded_results: hold finished results as the JSON they came as, decoded at each `result()`, so
            what a holder of many finished futures keeps (the API's job table) is the bytes that came,
            not several times as much in Python objects.
        on_complete: callables run on the client's loop thread as each job ends, with (future, service,
            state, results): the API's latency metrics (metrics/client.py JobMetrics.observe).
        transport: for tests: a `StubTransport` (`zfab.transport.stub`).
        clock: for tests: the stub's `FakeClock`.

    One `Client` may be shared by many threads: its socket is owned by its own loop, and each
    method here may be called from any thread.

    Example:
        ```python
        from zfab import Client

        with Client(broker="tcp://127.0.0.1:5555", name="me") as client:
            results = client.run_job("demo", "echo", kwargs={"data": "hi"})
            for worker, entry in results.items():
                print(worker, entry["result"])             # demo-1 hi
        ```
    """

    def __init__(
        self,
        broker: str | None = None,
        name: str = "client",
        *,
        settings: Settings | None = None,
        acks: bool = True,
        push: bool = True,
        poll_after: float | None = None,
        queued_notice: float = submission.QUEUED_NOTICE,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
        encoded_results: bool = False,
        on_complete: Sequence[CompletionHook] = (),
    ) -> None:
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.name = name
        self.acks = acks
        self.push = push
        self.queued_notice = queued_notice
        self.encoded_results = encoded_results
        self.poll_after = poll_after if poll_after is not None else max(1.0, 2 * s.keepalive_interval)
        self.max_jobs = s.max_client_jobs
        self.clock = clock
        self._flags = payloads.flags(push=push, ack=acks)
        # Same-host shared memory: a body over its threshold goes as a handle when the broker is on
        # this host (its keepalive answers say), and results may come back as one.
        self.shm = ShmArena(s, clock=clock)
        self.jobs = InFlight(s, self.shm)
        self._how = (push, acks, queued_notice, self.shm.host)  # how its jobs are answered (their flags)
        # The owner-loop side: the Role its transport runs, and the loop itself.
        self.session = Session(
            name=name,
            broker=self.broker,
            settings=s,
            jobs=self.jobs,
            shm=self.shm,
            clock=clock,
            poll_after=self.poll_after,
            encoded_results=encoded_results,
            on_complete=on_complete,
            transport=transport or OwnerLoop,
        )
        self.loop: Transport = self.session.loop
        self.counts: ClientCounts = self.session.counts
        self._started = False

    @property
    def identity(self) -> bytes:
        """This connection's identity (renewed on every connection)."""
        return self.session.identity

    @property
    def keepalive(self) -> KeepAlive:
        return self.session.link.keepalive

    @property
    def broker_alive(self) -> bool:
        """True while the broker answered within its hold time."""
        return self.session.link.alive

    # ---- lifecycle -----------------------------------------------------------

    def start(self) -> Client:
        if not self._started:
            self.shm.reclaim()
            self.loop.start()
            self._started = True
        return self

    def close(self) -> None:
        """Stop accepting jobs, flush what is queued (bounded), and fail what is still waiting."""
        self.loop.stop()
        self.session.fail_all()
        self.shm.close()

    async def aclose(self) -> None:
        """close() from a coroutine: on an AioLoop (transport/aioloop.py) its flush waits without
        blocking the event loop; another transport is stopped on a worker thread."""
        astop = getattr(self.loop, "astop", None)
        if astop is not None:
            await astop()
        else:
            await asyncio.to_thread(self.loop.stop)
        self.session.fail_all()
        self.shm.close()

    def __enter__(self) -> Client:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def jobs_in_flight(self) -> int:
        return len(self.jobs)

    def bytes_in_flight(self) -> int:
        """Bytes of request bodies and results this client holds for jobs not finished yet."""
        return self.jobs.bytes

    # ---- public API (any thread) -------------------------------------------------

    def submit(
        self,
        service: str,
        task: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        workers: Workers = "any",
        timeout: float = 60.0,
        *,
        on_event: EventCallback | None = None,
        uuid: str | None = None,
        retries: int | None = None,
        priority: int | None = None,
        delay: float | None = None,
        not_before: float | None = None,
        resubmit: bool = False,
        backoff: float | Backoff | None = None,
        attempt: int = 1,
    ) -> JobFuture:
        """Queue a job; the returned future resolves to {worker name: result entry}.

        `future.admission` resolves once the broker took the job ("queued" or "dispatched"), or
        raises why it would not (unknown service or task, a full queue). `priority` 0-9 (higher
        first, default 5) orders the broker's queue; `delay` seconds or `not_before` (an epoch
        time) hold the job there until then; `timeout` counts from then.
        With `retries` (target "any" only), a job whose worker is lost runs again on
        another worker, with its attempt number; a late result of the lost attempt is dropped;
        and an attempt whose task raised runs again after a wait (`backoff`: seconds, doubling,
        or a Backoff), for the exceptions its task's `retry_on` names. Without `retries` the
        task's own declaration (`@task(retries=...)`) says; `retries=0` asks for none.
        `resubmit` sends again a job (same uuid) a broker admitted before, e.g. after a restart
        of this process: its service counts as known, and a refusal means its outcome is unknown.
        `attempt` > 1 starts it as that attempt (a new wire uuid, `uuid~N`): a job whose earlier attempt
        a restart cut short runs again visibly, never under the uuid its earlier attempt had.

        Args:
            service: the service whose workers run it.
            task: the task's name.
            args: positional arguments, as JSON.
            kwargs: keyword arguments, as JSON; checked against the task's schema before it runs.
            workers: `"any"` (one worker), `"all"` (every worker of the service), a worker's name, or a
                list of names.
            timeout: seconds the job may take, end to end, counted from the end of its delay.
            on_event: called with each of the job's events as it arrives, on the client's loop thread.
            uuid: the job's id (default: a new one).
            retries: attempts after the first when the task raises or its worker is lost.
            priority: 0-9, higher first (default 5).
            delay: seconds the broker holds the job before it is sent.
            not_before: an epoch time before which it is not sent (instead of `delay`).
            resubmit: send again a job the broker admitted before (same uuid).
            backoff: the wait between attempts: seconds (doubling), or a `Backoff`.
            attempt: start it as this attempt.

        Returns:
            The job's `JobFuture`; its `result()` waits for `{worker name: result entry}`.

        Raises:
            ValueError: a timeout, priority, delay or retries out of range.
            BusyError: this client already holds `ZFAB_MAX_CLIENT_JOBS` jobs, or their bytes.
            PayloadTooLargeError: the request is over the message limit.
            ClosedError: the client is closing.

        Example:
            ```python
            futures = [client.submit("demo", "add", args=[i, i]) for i in range(10)]
            print([next(iter(f.result(10).values()))["result"] for f in futures])     # [0, 2, 4, ...]
            later = client.submit("demo", "echo", kwargs={"data": 1}, delay=2, priority=9, retries=2)
            ```
        """
        submission.check(timeout, priority, delay, retries)
        began = self.clock()  # the job's hop trace starts: its encoding is the client's time, too
        schedule = read_backoff(backoff).as_dict() if backoff is not None else None
        body = payloads.post_body(
            task, args, kwargs, timeout=timeout, push=self.push, ack=self.acks, retries=retries, backoff=schedule
        )
        target = (json.dumps(workers) if isinstance(workers, list) else workers).encode()
        fields = submission.job_fields(task, timeout, self._how, priority, delay, not_before, known=resubmit)
        if (traced := tracing.produce(service, task, uuid)) is not None:
            uuid, context = traced  # a PRODUCER span; each attempt's CONSUMER span continues its trace
            fields.update(context)  # W3C traceparent/tracestate, in the flags frame (never the arguments)
        return self._submit(
            service.encode(),
            target,
            body,
            timeout,
            uuid=uuid,
            on_event=on_event or ignore_event,
            retries=retries or 0,
            fields=fields,
            follow_task=retries is None,
            began=began,
            delay=submission.held_for(fields),
            attempt=attempt,
            resubmit=resubmit,
        )

    def run_job(
        self,
        service: str,
        task: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        workers: Workers = "any",
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Run a job and return {worker name: result entry}; raises a JobError subclass otherwise.

        Args:
            service: the service whose workers run it.
            task: the task's name.
            args: positional arguments, as JSON.
            kwargs: keyword arguments, as JSON.
            workers: `"any"`, `"all"`, a worker's name or a list of names.
            timeout: seconds the job may take.

        Returns:
            `{worker name: result entry}`; an entry has `result`, `failed`, `errors`, `messages`, `juuid`,
            `task`, `status`, `task_started`, `task_completed` and `service`. A task that raised is an entry
            with `failed: True` and its traceback in `errors`, not an exception.

        Raises:
            NoWorkersError: no live worker of the service matched `workers`.
            BadRequestError: an unknown task, or arguments its schema refuses.
            BusyError: a queue on the way is full; retry later.
            JobTimeoutError: the job did not finish within `timeout`.
            WorkerLostError: its worker was lost before it answered.
            BrokerUnavailableError: the broker did not answer within its hold time.

        Example:
            ```python
            results = client.run_job("demo", "add", kwargs={"a": 1, "b": 2})
            assert [entry["result"] for entry in results.values()] == [3]
            ```
        """
        fut = self.submit(service, task, args, kwargs, workers, timeout)
        result: dict[str, Any] = fut.result(timeout + 5.0)
        return result

    def recover(
        self, service: str, uuid: str, workers: list[str], timeout: float = 30.0, *, attempt: int = 1
    ) -> JobFuture:
        """Collect a job's result from its workers by GET (after a client or API restart).

        The future resolves like submit()'s: the result dictionary once every worker has a
        final answer (a job cut short by a worker restart reads as failed: interrupted), or
        JobNotFoundError when no worker knows the job.

        Args:
            service: the job's service.
            uuid: the job's id.
            workers: the names of the workers that ran it.
            timeout: seconds to wait for their answers.
            attempt: the attempt to ask for (a retried job's later attempts travel under their own wire
                uuid).

        Returns:
            A `JobFuture` that resolves like `submit()`'s; it runs nothing again.

        Raises:
            ValueError: no worker names given.
            JobNotFoundError: (from the future) no worker knows the job.

        Example:
            ```python
            fut = client.recover("demo", uuid, ["demo-1"])
            print(fut.result(30))
            ```
        """
        if not workers:
            raise ValueError("recover needs the names of the workers that ran the job")
        return self._submit(
            service.encode(),
            nfp.dumps(sorted(workers)),
            payloads.EMPTY_BODY,
            timeout,
            uuid=uuid,
            expected=set(workers),
            attempt=attempt,
        )

    def subscribe(self, prefix: str = "", *, endpoint: str | None = None, queue_size: int = 10_000) -> Subscriber:
        """The broker's events whose topic starts with `prefix`, started and confirmed.

        Args:
            prefix: a topic prefix, e.g. `"job.demo."` (every state change of the demo service's jobs).
            endpoint: the broker's event publisher (default: `ZFAB_BROKER_EVENTS`).
            queue_size: events held for this subscriber before the oldest are dropped (counted).

        Returns:
            A started `Subscriber`: iterate it, and close it (or use it in a `with` block).

        Raises:
            ValueError: no events endpoint is configured.
            SubscriptionError: the publisher did not confirm the subscription in time.

        Example:
            ```python
            with client.subscribe("job.demo.") as events:
                for event in events:
                    print(event["topic"], event["state"])          # job.demo.echo.completed completed
            ```
        """
        where = endpoint or self.settings.broker_events
        if not where:
            raise ValueError("no events endpoint: set ZFAB_BROKER_EVENTS (the broker's --events-endpoint)")
        return Subscriber(where, prefix, queue_size=queue_size, settings=self.settings).start()

    def mmi(self, task: str, timeout: float = 5.0, **kwargs: Any) -> Any:
        """Ask the broker's management interface, e.g. mmi("show_workers").

        Args:
            task: `show_workers`, `show_services`, `show_broker`, `show_clients`, `show_limits`,
                `pause_service`, `resume_service`, `set_limit`...
            timeout: seconds to wait for the answer.
            **kwargs: the task's arguments, e.g. `service="demo"`.

        Returns:
            The broker's answer, as JSON (a list of workers, a dictionary...).

        Raises:
            BrokerUnavailableError: the broker did not answer within its hold time.
            BadRequestError: an unknown MMI task, or bad arguments.

        Example:
            ```python
            print([w["name"] for w in client.mmi("show_workers")])
            client.mmi("pause_service", service="demo")        # jobs queue, none is sent...
            client.mmi("resume_service", service="demo")       # ...until it resumes
            ```
        """
        return self.mmi_future(task, timeout, **kwargs).result(timeout + 5.0)["result"]

    def mmi_future(self, task: str, timeout: float = 5.0, **kwargs: Any) -> JobFuture:
        """mmi() without blocking: the future resolves to {"result": answer} (for event loops)."""
        body = nfp.dumps({"task": task, "kwargs": kwargs})
        return self._submit(nfp.MMI_SERVICE, b"any", body, timeout, mmi=True)

    def get_job(self, uuid: str) -> JobFuture | None:
        job = self.jobs.get(uuid)
        return job.future if job is not None else None

    def cancel(self, uuid: str) -> bool:
        """Ask the job's workers to cancel it.

        Args:
            uuid: the job's id (`future.uuid`).

        Returns:
            False when this client does not track the job, True once the cancel is sent. A queued job
            leaves the queue; a running one is asked to stop (its task sees it at `job.check()`).

        Example:
            ```python
            fut = client.submit("demo", "sleep", kwargs={"seconds": 30})
            client.cancel(fut.uuid)
            ```
        """
        job = self.jobs.get(uuid)
        if job is None:
            return False
        target = nfp.dumps(sorted(job.expected)) if job.expected else job.target
        self.loop.send(nfp.client_request(nfp.DELETE, job.service, target, job.wire_uuid.encode(), b"{}"))
        return True

    def events(self, fut: JobFuture, timeout: float = 60.0) -> Iterator[dict[str, Any]]:
        """Yield the job's events in order as they arrive, until it finishes or the timeout passes.

        Args:
            fut: the job's future.
            timeout: seconds to follow it at most.

        Returns:
            An iterator of event dictionaries (`message`, `progress`, `event_type`, `worker`...).

        Example:
            ```python
            fut = client.submit("demo", "progress", kwargs={"steps": 3})
            for event in client.events(fut):
                print(event["message"], event.get("progress"))
            ```
        """
        return iter_events(fut, timeout)

    def job_events(self, service: str, uuid: str, worker: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Read back the events a (finished) job emitted, from the worker's job store.

        Args:
            service: the job's service.
            uuid: the job's id.
            worker: the worker that ran it.
            timeout: seconds to wait for the worker.

        Returns:
            The job's events, oldest first.

        Example:
            ```python
            events = client.job_events("demo", fut.uuid, "demo-1")
            ```
        """
        r = self.run_job(service, "job_events", kwargs={"uuid": uuid}, workers=worker, timeout=timeout)
        events: list[dict[str, Any]] = r[worker]["result"] or []
        return events

    def send_input(self, uuid: str, value: Any, input_id: str | None = None, timeout: float = 10.0) -> None:
        """Answer a job's input request (PUT).

        Args:
            uuid: the job's id.
            value: the answer, as JSON; the worker checks it against the request's schema.
            input_id: which request it answers (default: the one open).
            timeout: seconds to wait for the worker to take it.

        Raises:
            JobNotFoundError: this client does not track the job.
            BadRequestError: the worker refused the answer (not what the schema asks, or no request open).

        Example:
            ```python
            fut = client.submit("demo", "ask", kwargs={"question": "name?"})
            for event in client.events(fut):
                if event.get("event_type") == "input_request":   # the task asks
                    client.send_input(fut.uuid, "Ada")
            print(fut.result(10))                              # {worker: {"result": {"answer": "Ada", ...}}}
            ```
        """
        job = self.jobs.get(uuid)
        if job is None:
            raise JobNotFoundError(f"this client does not track job {uuid}", uuid=uuid)
        limit = self.message_limit()
        answer_input(self.loop, job.service, job.future, job.wire_uuid, value, input_id, timeout, limit=limit)

    def message_limit(self) -> int:
        """The largest message this client may send: its own ZFAB_MAX_MESSAGE_BYTES, or the broker's
        when that one (said in its keepalive answers) is smaller."""
        own = self.settings.max_message_bytes
        theirs = self.session.link.limit
        return own if theirs is None else min(own, theirs)

    def open_stream(
        self,
        service: str,
        path: str,
        *,
        workers: str = "any",
        offset: int = 0,
        chunk_size: int = 1024 * 1024,
        window: int = 8,
        timeout: float = 600.0,
    ) -> FileStream:
        """Start streaming a file from a files-service worker; iterate the result for its chunks.

        Args:
            service: the files service.
            path: the file's path inside the worker's root.
            workers: `"any"` or one worker's name.
            offset: the byte to start from.
            chunk_size: bytes per chunk.
            window: chunks in flight at once.
            timeout: seconds the whole transfer may take.

        Returns:
            A `FileStream`: iterate it for the file's chunks, in order.

        Raises:
            ValueError: `workers` names more than one worker.

        Example:
            ```python
            with open("copy.csv", "wb") as out:
                for chunk in client.open_stream("files", "reports/2026.csv"):
                    out.write(chunk)
            ```
        """
        if workers == "all" or workers.startswith("["):
            raise ValueError("a stream comes from one worker: use 'any' or a worker name")
        body = stream_request(path, offset=offset, chunk_size=chunk_size, window=window, timeout=timeout)
        # Acknowledgements on: credits go to the worker the broker names in its 202.
        fut = self._submit(service.encode(), workers.encode(), body, timeout, stream_window=window)
        return FileStream(self.loop, fut, service, offset)

    def fetch_file(
        self,
        service: str,
        path: str,
        dest: str | os.PathLike[str],
        *,
        workers: str = "any",
        resume: bool = False,
        chunk_size: int = 1024 * 1024,
        window: int = 8,
        timeout: float = 600.0,
    ) -> dict[str, Any]:
        """Download a file to `dest` and verify its sha256.

        Args:
            service: the files service (`zfab worker --service files --root DIR`).
            path: the file's path inside the worker's root.
            dest: where to write it.
            workers: `"any"` or one worker's name.
            resume: continue a partial `dest` instead of starting over.
            chunk_size: bytes per chunk.
            window: chunks in flight at once: a slow disk throttles the worker, memory stays bounded.
            timeout: seconds the whole transfer may take.

        Returns:
            The file's details from its worker (`path`, `size`, `sha256`...).

        Raises:
            ChecksumError: the download's sha256 differs from the worker's.
            BadRequestError: a path outside the worker's root, or no such file.

        Example:
            ```python
            details = client.fetch_file("files", "reports/2026.csv", "/tmp/2026.csv", resume=True)
            ```
        """
        target = Path(dest)
        offset = resume_offset(target, resume)
        stream = self.open_stream(
            service, path, workers=workers, offset=offset, chunk_size=chunk_size, window=window, timeout=timeout
        )
        return download(stream, target)

    # ---- internals -------------------------------------------------------------

    def _submit(
        self,
        service: bytes,
        target: bytes,
        body: bytes,
        timeout: float,
        *,
        uuid: str | None = None,
        on_event: EventCallback = ignore_event,
        mmi: bool = False,
        stream_window: int = 0,
        retries: int = 0,
        expected: set[str] | None = None,
        fields: dict[str, Any] | None = None,
        follow_task: bool = False,
        began: float | None = None,
        delay: float = 0.0,
        attempt: int = 1,
        resubmit: bool = False,
    ) -> JobFuture:
        if not self._started:
            self.start()
        if uuid is not None:
            payloads.check_job_uuid(uuid)
        juuid = uuid or ids.new_uuid()  # unique and unguessable, without a UUID object
        fut = JobFuture(juuid, stream_window, self.settings.max_events_per_job)
        fut.timings["submitted"] = time.time()
        now = self.clock()
        if stream_window:
            fields = {"push": True, "ack": True, "task": "fetch_file", "timeout": timeout}
        flags = nfp.dumps(fields) if fields else self._flags
        limit = self.message_limit()
        size = _REQUEST_HEAD + len(service) + len(target) + len(juuid) + len(body) + len(flags)
        if not sizes.fits(size, limit):
            # Refused here, at once: sent, it would be dropped on the way (or cost the peer its
            # connection) and the caller would wait out the whole timeout (core/sizes.py).
            self.counts["oversize"] += 1
            raise PayloadTooLargeError(sizes.too_large(f"the request of job {juuid}", size, limit), uuid=juuid)
        handle = None
        if len(body) >= self.shm.threshold and not mmi and not stream_window and expected is None:
            handle = self._shm_body(body, timeout)
            if handle is not None:
                body = handle
        if attempt > 1:
            attempt = fut.attempt = min(attempt, payloads.MAX_ATTEMPT)
            if expected is None and not mmi:
                body = payloads.with_attempt(body, attempt)
        job = ClientJob(
            juuid,
            service,
            target,
            body,
            flags,
            fut,
            payloads.job_deadline(now, timeout, delay),
            now,
            mmi=mmi,
            retries_left=retries,
            attempt=attempt,
            expected=expected,  # known already when recovering a job by GET
            fields=fields,
            follow_task=follow_task,
            resubmitted=resubmit,
            keep_raw=self.encoded_results,
            sent=now if began is None else began,
            on_event=on_event,
            shm_handle=handle,
        )
        # One timer per job: the earlier of its deadline and its first poll; each check re-arms it.
        tracked = self.jobs.add(job, min(job.deadline, now + self.poll_after))
        if tracked is not fut:
            return tracked  # a job under this uuid is in flight already
        cmd = nfp.MMI if mmi else nfp.GET if expected else nfp.POST
        wire = job.wire_uuid.encode()
        try:
            # From the owner thread (an event callback submitting a follow-up) this sends at once.
            self.loop.send(nfp.client_request(cmd, service, target, wire, body, payloads.NO_ACK if expected else flags))
        except BaseException:
            self.jobs.forget(juuid)
            raise
        return fut

    def _shm_body(self, body: bytes, timeout: float) -> bytes | None:
        """The handle of a new block holding `body`, when the broker shares this host's shared
        memory (it reads the block itself for a worker that does not); None: send the bytes."""
        if self.session.link.host != self.shm.host:
            # (A body over the message limit never gets here: the limit is the payload's, however it
            # travels, since the broker may have to send it as bytes to a worker on another host.)
            return None
        # Freed when the job ends (InFlight.forget); the expiry is a backstop for a job this client lost track of.
        return self.shm.put(body, ttl=timeout + 60.0)
