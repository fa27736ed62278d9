"""A transport without a socket, for unit tests of the roles (dramatiq's StubBroker is the model).

    clock = FakeClock()
    broker = Broker(settings, transport=StubTransport(clock), clock=clock).start()
    broker.loop.feed([b"w1", b"", b"NFPW01", b"0x01", b"demo"])     # a worker says READY
    clock.advance(2.5); broker.loop.tick()                          # timers fire
    assert broker.loop.take()                                       # what the broker sent

Everything runs on the test's thread, which plays the owner: `feed` calls the role's
on_frames and on_batch_end, `tick` its on_timer, and queued items (frames and calls handed
over with `submit`, as other threads do) run at `flush` — or at once from feed/tick, as the
real loop would run them before it sleeps again.

It keeps the owner loops' contract (tests/unit/test_loop_contract.py runs one suite over the
three): a handler that raises is counted in `stats.handler_errors` and the rest of the batch,
on_batch_end and the queued items still run. With `strict` (the default) the first such
exception is then raised from the call that ran it (feed, tick, flush, take), so a role's unit
test fails on a bug that the real loop would only log.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from ..core.keepalive import Clock
from ..errors import BackpressureError, ClosedError
from .base import Frames, Item, LoopStats, Role, T
from .wire import COPY_LIMIT


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeSocket:
    """What a role's open_socket configures, without a network: options and endpoints are recorded."""

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.options: dict[int, Any] = {}
        self.endpoints: list[str] = []

    def setsockopt(self, option: int, value: Any) -> None:
        self.options[option] = value

    def getsockopt(self, option: int) -> Any:
        return self.options.get(option, 0)

    def getsockopt_string(self, option: int) -> str:
        return self.endpoints[-1] if self.endpoints else ""

    def connect(self, endpoint: str) -> None:
        self.endpoints.append(endpoint)

    def bind(self, endpoint: str) -> None:
        self.endpoints.append(endpoint)

    def close(self, linger: int | None = None) -> None:
        pass


class FakeContext:
    def socket(self, kind: int) -> FakeSocket:
        return FakeSocket(kind)


class StubLoop:
    """Implements `Transport` for one role: records what the role sends, feeds what it receives."""

    def __init__(
        self,
        role: Role,
        *,
        name: str,
        clock: Clock,
        outbound_size: int = 10_000,
        submit_timeout: float = 1.0,
        linger: float = 1.0,
        strict: bool = True,
        sched_batch: bool = False,
        idle_poll: float = 0.0,
    ) -> None:
        self.role = role
        self.sched_batch = sched_batch  # recorded: no thread here to schedule
        self.idle_poll = idle_poll  # recorded: nothing here sleeps
        self.name = name
        self.clock = clock
        self.outbound_size = outbound_size
        self.submit_timeout = submit_timeout
        self.stats = LoopStats()
        self.strict = strict
        self._error: Exception | None = None  # the first handler error since the last raise (strict)
        self.sent: list[Frames] = []
        self.user_id_next: bytes | None = None  # the ZAP user id the next fed message comes with
        self.full = False  # a test sets it to make the peer refuse sends (high-water mark reached)
        self.gone: set[bytes] = set()  # ROUTER identities whose connection closed: sends to them fail
        self.bundled: set[bytes] = set()  # peers the role said read bundles (the stub sends each message alone)
        self.started = threading.Event()
        self.stopped = threading.Event()
        self._queue: deque[Item] = deque()
        self._closing = False
        self._user_id: bytes | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self.owner_ident = threading.get_ident()  # the thread that made it plays the owner

    # ---- Transport -------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        self._open()
        self.started.set()

    def _open(self) -> None:
        # The role configures a socket as it would for real (identity, options), on a fake one.
        self.socket: FakeSocket = self.role.open_socket(FakeContext())  # type: ignore[arg-type, assignment]
        self.role.on_connected()

    def stop(self, timeout: float | None = None) -> None:
        if self.stopped.is_set():
            return
        self._closing = True
        self.flush()
        self.role.on_closing()
        self.stopped.set()
        if self._ctx is not None:
            self._ctx.term()

    def submit(self, item: Item, timeout: float | None = None) -> None:
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if len(self._queue) >= self.outbound_size:
            raise BackpressureError(f"{self.name}: outbound queue full ({self.outbound_size} frames)")
        self._queue.append(item)

    def call(self, fn: Callable[[], T], timeout: float = 5.0) -> T:
        return fn()

    def send(self, item: Frames | tuple[Frames, Callable[[], None]], timeout: float | None = None) -> None:
        # The test's thread plays the owner; other threads (pool, store) queue as they would.
        if threading.get_ident() != self.owner_ident:
            self.submit(item, timeout)
            return
        frames, after = (item, None) if isinstance(item, list) else item
        self.send_now(frames)
        if after is not None:
            self._run(after)
        self._raise_first()

    def send_now(self, frames: Frames) -> bool:
        if self.full or (self.gone and bytes(frames[0]) in self.gone):
            self.stats.send_dropped += 1
            return False
        self.sent.append(list(frames))
        self.stats.sent += 1
        return True

    def request_reconnect(self) -> None:
        if threading.get_ident() != self.owner_ident:
            self._queue.append(self.request_reconnect)  # the owner opens the new socket, at its next flush
            return
        self.stats.reconnects += 1
        self._open()

    def queue_depth(self) -> int:
        return len(self._queue)

    def bundle_peers(self) -> int:
        return len(self.bundled)

    def bundles(self, peer: bytes, yes: bool = True) -> None:
        if yes:
            self.bundled.add(peer)
        else:
            self.bundled.discard(peer)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def user_id(self) -> bytes | None:
        return self._user_id

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        if self._ctx is None:
            self._ctx = zmq.Context()
        return self._ctx

    # ---- the test's side ----------------------------------------------------------------

    def feed(self, *messages: Frames, user_id: bytes | None = None) -> None:
        """Messages arrive as one receive batch; queued items then run."""
        self._user_id = user_id
        for frames in messages:
            self.stats.received += 1
            # as the wire hands them over: bytes, but a large frame stays the view it is
            self._run(
                self.role.on_frames,
                [f if len(f) >= COPY_LIMIT and isinstance(f, memoryview) else bytes(f) for f in frames],
            )
        self._run(self.role.on_batch_end)
        self._user_id = None
        self.flush()

    def tick(self) -> float | None:
        """The role's timers at the clock's current time; returns its next deadline (as the real
        loops do, a timer handler that raised is looked at again a second later)."""
        self._drain()
        now = self.clock()
        deadline: float | None = now + 1.0
        try:
            deadline = self.role.on_timer(now)
        except Exception as exc:
            self._failed(exc)
        self.flush()
        return deadline

    def flush(self) -> None:
        """Run what other threads queued: frames are sent (then their follow-ups run), calls are made."""
        self._drain()
        self._raise_first()

    def _drain(self) -> None:
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, list):
                self.send_now(item)
            elif isinstance(item, tuple):
                frames, after = item
                self.send_now(frames)
                self._run(after)
            else:
                self._run(item)

    def _run(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.stats.handler_errors += 1
        if self._error is None:
            self._error = exc

    def _raise_first(self) -> None:
        if self._error is not None and self.strict:
            exc, self._error = self._error, None
            raise exc
        self._error = None

    def take(self) -> list[Frames]:
        """What was sent since the last take."""
        self.flush()
        out, self.sent = self.sent, []
        return out


class StubTransport:
    """A `LoopFactory` making StubLoops on one fake clock: `Broker(..., transport=StubTransport(clock))`."""

    def __init__(self, clock: Clock | None = None, *, strict: bool = True) -> None:
        self.clock: Clock = clock if clock is not None else FakeClock()
        self.strict = strict
        self.loops: list[StubLoop] = []

    def __call__(self, role: Role, **kwargs: Any) -> StubLoop:
        loop = StubLoop(role, clock=self.clock, strict=self.strict, **kwargs)
        self.loops.append(loop)
        return loop
