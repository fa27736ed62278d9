"""What a submitter holds for a job: its JobFuture (result, state, admission, events, chunks, trace),
and the byte count of what it keeps (decoded_size), which bounds the tables that hold futures.

No sockets or threads of its own: the client's owner loop feeds it (session.py), any thread reads it.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any

from ..core import hoptrace
from ..core import protocol as nfp
from ..core.lazy import lazy
from ..core.states import State

_ADMISSION_LOCK = threading.Lock()
MAX_EVENTS_PER_JOB = 1000
MAX_EVENT_BYTES_PER_JOB = 1024 * 1024  # events a future holds, in bytes: older ones make room

# Objects walked to measure what a decoded event holds; past it, the worst ratio JSON decodes at (a
# list of one-item lists of ints: [[0],[1],...] is ~17x its text as Python objects) stands for the rest.
SIZE_WALK_NODES = 4096
WORST_DECODE_RATIO = 24
# The decoder (msgspec, core/protocol.py loads) hands out one shared object for a dict key of at most
# this many ASCII characters (its key cache), as CPython does for None, True, False, "" and the small
# ints: a thousand events share their keys, so a key is no byte of any one of them.
SHARED_KEY_CHARS = 32
_SMALL_INTS = range(-5, 257)


def decoded_size(obj: Any, wire: int = 0) -> int:
    """Bytes `obj` (decoded JSON: dicts, lists, str, numbers) holds as Python objects of its own, at least
    `wire`: the objects the decoder shares between documents (dict keys, None, booleans, small ints) are
    not counted. A walk of at most SIZE_WALK_NODES objects; a larger one is counted at
    WORST_DECODE_RATIO x `wire`."""
    total, stack, budget = 0, [obj], SIZE_WALK_NODES
    getsize = sys.getsizeof
    while stack:
        budget -= 1
        if budget < 0:
            return max(total, wire * WORST_DECODE_RATIO)
        o = stack.pop()
        kind = type(o)
        if kind is dict:
            total += getsize(o)
            for k in o:
                if not (type(k) is str and len(k) <= SHARED_KEY_CHARS and k.isascii()):
                    total += getsize(k)
            stack.extend(o.values())
        elif kind is list:
            total += getsize(o)
            stack.extend(o)
        elif kind is int:
            if o not in _SMALL_INTS:
                total += getsize(o)
        elif o is not None and kind is not bool and o != "":
            total += getsize(o)
    return max(total, wire)


class Encoded:
    """A finished job's result held as the JSON it came as; JobFuture.result() decodes it at each read."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


class JobFuture(Future[Any]):
    """A submitted job (`Client.submit` returns one): `result()` gives the dictionary keyed by worker
    name, or raises.

    `state` and `reason` follow the job (`queued`, `running`, `waiting`, then `completed`, `failed`,
    `cancelled`, `expired` or `lost`); `admission` resolves once the broker took the job ("queued"
    or "dispatched") or raises why it would not. `events` holds the job's events as they arrive
    (bounded in count and bytes); `chunks` the stream chunks of a streaming job, bounded by its
    credit window. `attempt` is the attempt that runs (or ran last) and `attempts` what each
    earlier one ended with (its worker, error, times, the wait before the next), for a job that was
    retried; `trace` where its time went, hop by hop, once it ended. It is a
    `concurrent.futures.Future`: `done()`, `add_done_callback()` and `wait()` work on it.

    Example:
        ```python
        fut = client.submit("demo", "sleep", kwargs={"seconds": 0.1})
        print(fut.admission.result(5))                   # "dispatched" (or "queued")
        results = fut.result(10)                         # {worker: {"result": 0.1, ...}}
        print(fut.state, fut.trace["hops"]["run"])       # completed 0.1...
        ```
    """

    # What most jobs never change, read from the class until a job sets its own (a job's construction
    # is on the submit path: a store less each).
    reason: str | None = None
    _admission: Future[str] | None = None  # made when asked for: most callers never ask
    _admitted: str | None = None
    _refusal: BaseException | None = None
    # Made on first use, as `changed` is: most jobs never have an event.
    _events: deque[dict[str, Any]] | None = None
    _event_sizes: deque[int] | None = None  # each held event's size, in step with `events`
    events_bytes = 0
    events_dropped = 0
    result_bytes = 0
    _changed: threading.Condition | None = None  # made on first use: most jobs never need it
    chunks: queue.Queue[bytes] | None = None  # a streaming job's, bounded by its credit window
    worker: str | None = None  # the one worker running it, once known (202 or first event)
    dispatched: list[str] | None = None  # every worker the broker sent it to (from 202)
    attempt = 1  # the attempt that runs (or ran last): 2, 3... once retried
    # Where the (last) attempt's time went, hop by hop (core/hoptrace.py), once it ended with
    # traced answers: {"total": s, "hops": {hop: s}}, and "workers" for a job sent to several.
    _trace: dict[str, Any] | None = None
    _trace_from: dict[str, tuple[float, bytes]] | None = None  # what it is built from, once ended
    trace_rejected = 0  # figures of its trace that were no duration (counted when it is built)
    held_before = 0.0  # seconds its submitter held the job before submit() (the API's hop), set by it
    answered: list[str] | None = None  # the workers whose answers make its result, once it ended

    def __init__(self, uuid: str, stream_window: int = 0, max_events: int = MAX_EVENTS_PER_JOB) -> None:
        super().__init__()
        self.uuid = uuid
        self.state = State.QUEUED
        self.max_events = max_events
        self.timings: dict[str, float] = {}
        self.attempts: list[dict[str, Any]] = []  # each earlier attempt: its worker, error, times, wait
        if stream_window:
            self.chunks = queue.Queue(maxsize=stream_window + 1)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job's result: the dictionary keyed by worker name (decoded anew at each call when
        its client keeps results encoded: `Client(encoded_results=True)`), or the job's error raised.

        Args:
            timeout: seconds to wait (None: until it ends).

        Returns:
            `{worker name: result entry}`, as `Client.run_job` returns it.

        Raises:
            TimeoutError: it did not end within `timeout` (it goes on; ask again).
            JobError: its subclass says how the job ended otherwise: `NoWorkersError`,
                `BadRequestError`, `BusyError`, `JobTimeoutError`, `WorkerLostError`...
        """
        value = super().result(timeout)
        return nfp.loads(value.raw) if type(value) is Encoded else value

    @property
    def trace(self) -> dict[str, Any] | None:
        """Where the (last) attempt's time went, hop by hop (core/hoptrace.py), once it ended with a
        traced answer: {"total": s, "hops": {hop: s}}; for a job several workers ran, the slowest's,
        with each worker's under "workers". None: no answer carried a trace."""
        if self._trace is None and (raw := self._trace_from) is not None:
            self._trace_from = None
            self._trace, self.trace_rejected = build_trace(raw, self.held_before)
        return self._trace

    @property
    def size(self) -> int:
        """Bytes this future holds: its results (their JSON, as an encoded result holds them) and its
        events (as decoded objects), what a table of finished jobs must bound."""
        return self.result_bytes + self.events_bytes

    @property
    def events(self) -> deque[dict[str, Any]]:
        """The job's events as they came, the oldest gone past the count or byte bound."""
        return lazy(self, "_events", self._new_events)

    @property
    def has_events(self) -> bool:
        """Did any event come? (Asked per view of every job: without making the queue of one that had none.)"""
        return bool(self._events)

    def _new_events(self) -> deque[dict[str, Any]]:
        return deque(maxlen=self.max_events)

    @property
    def changed(self) -> threading.Condition:
        """Notified on each event and when the job ends."""
        return lazy(self, "_changed", self._new_changed)

    def _new_changed(self) -> threading.Condition:
        # Only a future somebody waits on pays for the done callback that notifies its waiters (made once,
        # under lazy's lock; a future done already calls it at once, while `_changed` is still unset).
        self.add_done_callback(JobFuture._notify)
        return threading.Condition()

    def add_event(self, event: dict[str, Any], size: int) -> None:
        """Keep `event`, which holds `size` bytes (decoded_size of it and its wire length); the oldest go
        first past the count or byte bound, each taking its own size with it (the worker's job store keeps
        them all). `events_bytes` is always the sum of the sizes of the events held."""
        with self.changed:
            events, sizes = self.events, self._event_sizes
            if sizes is None:
                sizes = self._event_sizes = deque()
            if len(events) == events.maxlen:
                events.popleft()  # made room for here, so its size leaves with it
                self.events_bytes -= sizes.popleft()
                self.events_dropped += 1
            events.append(event)
            sizes.append(size)
            self.events_bytes += size
            while self.events_bytes > MAX_EVENT_BYTES_PER_JOB and len(events) > 1:
                events.popleft()
                self.events_bytes -= sizes.popleft()
                self.events_dropped += 1
            self.changed.notify_all()

    @property
    def admission(self) -> Future[str]:
        """Resolves once the broker took the job ("queued", "dispatched"), or raises why it would not."""
        with _ADMISSION_LOCK:
            fut = self._admission
            if fut is None:
                fut = self._admission = Future()
                if self._admitted is not None:
                    fut.set_result(self._admitted)
                elif self._refusal is not None:
                    fut.set_exception(self._refusal)
            return fut

    def admitted(self, how: str) -> None:
        if self._admitted is not None:
            return  # said already (the 202, then each answer): no lock taken again
        with _ADMISSION_LOCK:
            if self._admitted is None:
                self._admitted = how
                if self._admission is not None and not self._admission.done():
                    self._admission.set_result(how)

    def refused(self, error: BaseException) -> None:
        """The job ended before the broker took it (its refusal, or the client gave up)."""
        with _ADMISSION_LOCK:
            if self._admitted is None:
                self._refusal = error  # kept: the admission future may be asked for only later
                if self._admission is not None and not self._admission.done():
                    self._admission.set_exception(error)

    def move(self, state: State) -> None:
        """A step of a job not finished yet (queued, running, waiting)."""
        if not self.state.final:
            self.state = state

    def settle(self, result: Any, error: BaseException | None) -> None:
        """Complete the future (on the client's owner), unless it is done already."""
        if self.done():
            return
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(result)

    @staticmethod
    def _notify(fut: Future[Any]) -> None:
        c = getattr(fut, "_changed", None)
        if c is not None:
            with c:
                c.notify_all()


def build_trace(traces: dict[str, tuple[float, bytes]], held: float) -> tuple[dict[str, Any] | None, int]:
    """A job's trace from each worker's (seconds to its answer, trace frame), and the figures that
    were no duration. `held`: seconds the submitter held it first (the `api` hop)."""
    if len(traces) == 1:
        ((t, frame),) = traces.values()
        hops, bad = hoptrace.hops(t, frame, held)
        return ({"total": t + held, "hops": hops} if hops else None), bad
    views: dict[str, dict[str, Any]] = {}
    bad = 0
    for w, (t, frame) in traces.items():
        hops, n = hoptrace.hops(t, frame, held)
        bad += n
        if hops:
            views[w] = {"total": t + held, "hops": hops}
    if not views:
        return None, bad
    last = max(views, key=lambda w: traces[w][0])
    return {**views[last], "workers": views}, bad
