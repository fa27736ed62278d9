"""A job as a worker runs it, and the handle task code gets to talk back to its client."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.lazy import lazy
from ..core.payloads import iso
from ..core.schemacheck import check as check_schema
from ..core.states import JobState as JobState  # a worker's job goes through the one state machine
from ..errors import JobCancelledError, JobTimeoutError
from .task import RetryPolicy

_ACK_LOCK = threading.Lock()  # short: one lock for every job's claim and 201 gate


@dataclass(slots=True, eq=False)
class Job:
    """The running job, as its task sees it: declare a parameter annotated `Job` to receive it.

    Through it a task reports progress (`event`), honours a cancel and its deadline (`check`), asks its
    caller for input (`request_input`, `ask`) and streams data (`stream`). `job.attempt` says which
    attempt runs (1, then 2, 3... when a failed one runs again), of `job.attempts`; `job.uuid`,
    `job.task`, `job.args` and `job.kwargs` say what it is.

    Example:
        ```python
        from zfab import Job, Worker, task


        class Devices(Worker):
            service = "devices"

            @task
            def scan(self, job: Job, hosts: list[str]) -> dict[str, str]:
                for i, host in enumerate(hosts):
                    job.check()                                   # cancelled or past its deadline: stop
                    job.event(f"scanning {host}", progress=(i + 1) / len(hosts))
                return {host: "ok" for host in hosts}
        ```
    """

    uuid: str
    client: bytes
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None
    push: bool
    ack: bool
    request: bytes = b""  # the raw POST body, as stored
    received_at: float = field(default_factory=time.time)  # epoch: shown in results and stored
    received_mono: float = field(default_factory=time.monotonic)  # the deadline's base: immune to clock steps
    started_at: float | None = None
    completed_at: float | None = None
    started_mono: float | None = None  # its hop trace's readings are monotonic (core/hoptrace.py)
    traced: bool = False  # its final answer carries a hop trace (its broker is zfab's: it sent a meta frame)
    state: JobState = JobState.QUEUED  # stored, waiting for a pool thread
    status_code: bytes = b"300"
    result_payload: bytes = b""
    event_seq: int = 0
    queued_s: float = 0.0  # how long the broker held it before sending (its meta frame says)
    attempt: int = 1  # which attempt of the job this is (a retried job's second is 2)
    retry: RetryPolicy | None = None  # when a failed attempt runs again (the task's declaration, the job's ask)
    trace: dict[str, str] | None = None  # the submitter's W3C trace context (service/tracing.py)
    shm_reply: bool = False  # its client shares our shared memory: a large result may go as a handle
    is_async: bool = False  # an `async def` task's: it runs on the worker's event loop (worker/aio.py)
    _ack_gate: int = 2  # the 201 goes once the job is both stored and started (see ack_ready)
    on_cancel: Callable[[], None] | None = None  # an async task's: cancels its coroutine
    emit: Callable[[Job, dict[str, Any]], None] | None = None
    stream_out: Callable[[Job, bytes], None] | None = None
    _cancel: threading.Event | None = None
    _cond: threading.Condition | None = None  # guards credits and input; made on first use
    _credits: int = 0
    _input_request: dict[str, Any] | None = None
    _input_value: Any = None
    _input_ready: bool = False
    _claimed: bool = False

    @property
    def attempts(self) -> int:
        """How many attempts the job may have in all (1 without retries)."""
        return 1 + (self.retry.retries if self.retry is not None else 0)

    @property
    def cancel_event(self) -> threading.Event:
        """Set when the job is cancelled; tasks may wait on it instead of sleeping."""
        return lazy(self, "_cancel", threading.Event)

    @property
    def deadline(self) -> float | None:
        """Monotonic time by which the job must be done."""
        return self.received_mono + self.timeout if self.timeout else None

    @property
    def cond(self) -> threading.Condition:
        return lazy(self, "_cond", threading.Condition)

    @property
    def started(self) -> bool:
        return self._claimed

    def ack_ready(self) -> bool:
        """Called once when the job's insert is committed and once when a pool thread starts it:
        True for the second call, which sends the 201 (NorFab's "started"; zfab's state running)."""
        with _ACK_LOCK:
            self._ack_gate -= 1
            return self._ack_gate == 0

    def claim(self) -> bool:
        """True for the first caller only: the pool thread about to run the job, or a DELETE
        ending it while still queued. Whoever claims it produces its one result."""
        with _ACK_LOCK:  # shared, not the job's own condition: most jobs never need one
            if self._claimed:
                return False
            self._claimed = True
            return True

    def cancel(self) -> None:
        """Ask the task to stop: sets cancel_event and wakes a task blocked on credits or input (an
        `async def` task's coroutine is cancelled)."""
        self.cancel_event.set()
        hook = self.on_cancel
        if hook is not None:
            hook()
        cond = self._cond
        if cond is not None:  # nobody waits on a condition nobody made
            with cond:
                cond.notify_all()

    @property
    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    def expired(self) -> bool:
        d = self.deadline
        return d is not None and time.monotonic() >= d

    def check(self) -> None:
        """Raise if the job was cancelled or ran past its deadline: call it between steps.

        Raises:
            JobCancelledError: the job was cancelled (`DELETE /jobs/{uuid}`, `Client.cancel`).
            JobTimeoutError: the job ran past its deadline (its `timeout`).

        Example:
            ```python
            for item in items:
                job.check()
                work_on(item)
            ```
        """
        if self.cancelled:
            raise JobCancelledError(f"job {self.uuid} was cancelled", uuid=self.uuid)
        if self.expired():
            raise JobTimeoutError(f"job {self.uuid} ran past its {self.timeout} s deadline", uuid=self.uuid)

    def event(
        self,
        message: str,
        *,
        severity: str = "INFO",
        progress: float | None = None,
        data: dict[str, Any] | None = None,
        event_type: str = "progress",
        status: str = "running",
    ) -> None:
        """Send an event to the job's caller as it happens, and keep it in the job store.

        Events reach the caller in order (`Client.events`, `on_event`, `GET /jobs/{uuid}/events`), at
        most `ZFAB_MAX_EVENTS_PER_JOB` of them per job.

        Args:
            message: what happens, in words.
            severity: `INFO`, `WARNING`, `ERROR`...
            progress: the share done, 0.0 to 1.0 (clamped).
            data: a small dictionary of JSON to go with it (the event's `extras`).
            event_type: `progress` unless it is another kind.
            status: the job's status word while it runs.

        Example:
            ```python
            job.event("copied 3 of 4 files", progress=0.75, data={"file": "d.txt"})
            ```
        """
        payload: dict[str, Any] = {
            "event_type": event_type,
            "message": message,
            "severity": severity,
            "status": status,
            "task": self.task,
            "juuid": self.uuid,
            "timestamp": iso(time.time()),
        }
        if progress is not None:
            payload["progress"] = max(0.0, min(1.0, float(progress)))
        if data:
            payload["extras"] = data
        if self.emit is not None:
            self.emit(self, payload)

    # ---- streaming (credit-based flow control) ----------------------------------

    def grant(self, credits: int) -> None:
        """The client may take `credits` more chunks (it wrote what it had)."""
        with self.cond:
            self._credits += max(0, credits)
            self.cond.notify_all()

    def stream(self, data: bytes, timeout: float = 60.0) -> None:
        """Send one chunk to the client, waiting for a credit first: a slow reader throttles the task.

        Args:
            data: the chunk.
            timeout: seconds to wait for a credit.

        Raises:
            JobTimeoutError: the client granted no credit within `timeout`.
            JobCancelledError: the job was cancelled.
        """
        with self.cond:
            if not self.cond.wait_for(lambda: self._credits > 0 or self.cancelled, timeout):
                raise JobTimeoutError(f"job {self.uuid}: the client granted no stream credit for {timeout} s")
            if self.cancelled:
                raise JobCancelledError(f"job {self.uuid} was cancelled", uuid=self.uuid)
            self._credits -= 1
        if self.stream_out is not None:
            self.stream_out(self, data)

    # ---- interactive input ----------------------------------------------------------

    def request_input(self, question: str, schema: dict[str, Any] | None = None, timeout: float = 300.0) -> Any:
        """Ask the job's caller for input and wait for it (the job is `waiting` meanwhile).

        Args:
            question: what to ask, in words.
            schema: a small JSON schema the answer must match (type, enum, required, properties,
                items, bounds); an answer that does not is refused and the job goes on waiting.
            timeout: seconds to wait for a valid answer.

        Returns:
            The answer, as JSON.

        Raises:
            JobTimeoutError: no valid answer came within `timeout`.
            JobCancelledError: the job was cancelled while it waited.

        Example:
            ```python
            name = job.request_input("name?", {"type": "string"}, timeout=60)
            ```
        """
        request = {"id": uuidlib.uuid4().hex, "question": question, "schema": schema or {}, "timeout": timeout}
        with self.cond:
            self._input_request = request
            self._input_ready = False
        previous, self.state = self.state, JobState.WAITING
        self.event(question, event_type="input_request", status="waiting", data={"input_request": request})
        try:
            with self.cond:
                got = self.cond.wait_for(lambda: self._input_ready or self.cancelled, timeout)
                self._input_request = None
                if self.cancelled:
                    raise JobCancelledError(f"job {self.uuid} was cancelled while waiting for input", uuid=self.uuid)
                if not got:
                    raise JobTimeoutError(f"job {self.uuid}: no input for {question!r} within {timeout} s")
                return self._input_value
        finally:
            self.state = previous

    async def ask(self, question: str, schema: dict[str, Any] | None = None, timeout: float = 300.0) -> Any:
        """request_input for an `async def` task: the wait runs on a helper thread, so the event
        loop (and every other async job on it) goes on meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.request_input, question, schema, timeout)

    @property
    def input_request(self) -> dict[str, Any] | None:
        return self._input_request

    def deliver_input(self, input_id: str, value: Any) -> str | None:
        """Hand the task its input. Returns why it was refused, or None when accepted."""
        with self.cond:
            req = self._input_request
            if req is None or req["id"] != input_id:
                return f"job {self.uuid} is not waiting for input {input_id!r}"
            problem = check_schema(value, req["schema"])
            if problem is not None:
                return f"input does not match the schema: {problem}"
            self._input_value = value
            self._input_ready = True
            self.cond.notify_all()
        return None
