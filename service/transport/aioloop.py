"""An owner loop that is an asyncio event loop: the role's socket lives on the loop's own thread.

`OwnerLoop` (loop.py) gives a role a thread of its own; code on an asyncio event loop (the HTTP
API) then hands every frame to that thread through a queue and an eventfd, and every result comes
back through `call_soon_threadsafe`, with the two threads trading the GIL for each job. `AioLoop`
makes the event loop's thread the socket's single owner instead:

    client = Client(settings=s, transport=AioTransport())   # inside a coroutine (a FastAPI lifespan)
    client.start()                                           # opens the socket on this loop, now
    fut = client.submit("demo", "echo", kwargs={"x": 1})     # queued here, sent at this iteration's end
    if await wait_future(fut, 10.0): ...                     # no call_soon_threadsafe either
    await client.aclose()                                    # or: await client.loop.astop()

Thread rules (the same contract as OwnerLoop's, with the loop's thread as the owner):

- The socket is read with `loop.add_reader` on its ZMQ_FD (edge-like: readiness is re-checked
  through ZMQ_EVENTS after every send and receive batch), so zmq.asyncio's future per receive
  and its flag enums are not paid.
- On the loop's thread, `send` and `submit` never hand over to another thread nor write a wake-up
  descriptor. With `coalesce=True` (the default) the frame joins the outbound queue and a pass at
  the end of the loop iteration sends everything queued in it back to back: the ZeroMQ I/O thread
  is woken once for the burst and the broker reads it as one batch, as an OwnerLoop's drain does.
  Sending each at once instead (`coalesce=False`) was measured to cost the broker and the worker
  about a fifth more CPU per job under load (a wake-up and a TCP segment per message), and the API
  twice the I/O thread's CPU. `send` never refuses for its own queue (the owner never waits on
  it); `submit` raises BackpressureError at once when the queue is full, since waiting would
  block the only thread that drains it. Roles' own sends (`send_now`: keepalives, last words) go
  straight to the socket; one the peer cannot take now is dropped and counted.
- From any other thread, `submit`/`send` queue the item and wake the loop with one
  `call_soon_threadsafe` per burst (not per item); a full queue makes them wait up to their
  timeout for room (BackpressureError after it). After stop began both raise ClosedError.
- Timers: the role's `on_timer` runs after every receive batch and pass, and when the deadline it
  returned comes (`loop.call_at`, a few ms of slack: see _timers).
- `start()` works from the loop's own thread (a coroutine or callback on it; it opens the socket
  synchronously), or from another thread while the loop runs. `await astart()` is the same.
- `await astop()` (in a coroutine on the loop) flushes what is queued within `linger`, says the
  role's last words (on_closing), closes the socket here and terminates its context off the loop.
  `stop()` from another thread runs astop on the loop and waits for it; `stop()` on the loop's
  thread (no await possible) flushes what the socket takes at once, and may block the loop for up
  to `linger` while ZeroMQ hands over what it holds. Once the loop has stopped or closed, `stop()`
  tears down from the calling thread, the owner being gone.
- Never call blocking client methods (run_job, mmi, Future.result) on the loop's thread: the
  reply they wait for would be read by that same thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

import zmq

from ..errors import BackpressureError, ClosedError
from .base import Frames, Item, LoopStats, Role, T
from .sending import WireSender
from .wire import Wire

log = logging.getLogger(__name__)

_EVENTS = int(zmq.EVENTS)
_FD = int(zmq.FD)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_FRAMES_ITEM = (list, tuple)
STALL_RECHECK = 0.1  # a peer that stopped taking frames: the stalled one is retried at this pace
TIMER_SLACK = 0.02  # at most this late for a deadline (see _timers)


class AioLoop(WireSender):
    """Runs a Role on an asyncio event loop; the loop's thread is the only one touching the socket."""

    def __init__(
        self,
        role: Role,
        *,
        name: str,
        outbound_size: int = 10_000,
        submit_timeout: float = 1.0,
        batch: int = 256,
        linger: float = 1.0,
        loop: asyncio.AbstractEventLoop | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        coalesce: bool = True,
    ) -> None:
        if outbound_size < 1 or batch < 1:
            raise ValueError("outbound_size and batch must be at least 1")
        self.role = role
        self.name = name
        self.outbound_size = outbound_size
        self.submit_timeout = submit_timeout
        self.batch = batch
        self.linger = linger
        self.coalesce = coalesce
        self.stats = LoopStats()
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.owner_ident: int | None = None
        self._loop = loop
        self._own_context = context is None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = context if context is not None else zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._wire: Wire | None = None
        self._fd: int | None = None
        self._queue: deque[Item] = deque()
        self._space = threading.Condition(threading.Lock())
        self._waiting = 0  # other threads waiting for room in the queue
        self._stalled: Frames | tuple[Frames, Callable[[], None]] | None = None
        self._kicked = False  # a pass is scheduled (call_soon / call_soon_threadsafe): no second one
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")  # monotonic time the timer handle fires at
        self._closing = False
        self._reconnect = False
        self._torn_down = False

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the transport is bound to its event loop at start()"  # programming error
        return self._loop

    def _on_owner(self) -> bool:
        return threading.get_ident() == self.owner_ident

    def start(self, timeout: float = 10.0) -> None:
        """Open the socket on the event loop. On the loop's thread it happens now; from another
        thread it is scheduled on the (running) loop and waited for."""
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    f"{self.name}: start an AioLoop from its event loop's thread, or give it loop="
                ) from None
        if self._closing:
            raise ClosedError(f"{self.name} was stopped; make a new transport")
        if self._in_loop_thread():
            self._start_here()
            return
        if not self._loop.is_running():
            raise RuntimeError(f"{self.name}: its event loop is not running; start it from a coroutine on that loop")
        done: Future[None] = Future()

        def run() -> None:
            try:
                self._start_here()
                done.set_result(None)
            except BaseException as exc:  # handed to the caller
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        try:
            done.result(timeout)
        except TimeoutError:
            raise TimeoutError(f"{self.name}: the event loop did not open the socket within {timeout} s") from None

    async def astart(self, timeout: float = 10.0) -> None:
        """start() from a coroutine (on the transport's loop, or with the loop given at construction)."""
        if self._loop is None or self._loop is asyncio.get_running_loop():
            self.start(timeout)
        else:
            await asyncio.to_thread(self.start, timeout)

    def _in_loop_thread(self) -> bool:
        if self.owner_ident is not None:
            return self._on_owner()
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _start_here(self) -> None:
        if self.started.is_set():
            return
        self.owner_ident = threading.get_ident()
        try:
            self._open()
        except BaseException:
            self._closing = True
            self._teardown(0)
            raise
        self.started.set()
        self._pass()

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, flush within the linger bound, close the socket in its owner (see the module doc)."""
        self._closing = True
        self._wake_waiters()
        if self.stopped.is_set():
            return
        loop = self._loop
        if not self.started.is_set() or loop is None or loop.is_closed():
            self._teardown(0)  # never opened, or its owner is gone: nobody else can touch it
            return
        if self._on_owner():
            self._stop_here()
            return
        if not loop.is_running():
            self._teardown(0)
            return
        fut = asyncio.run_coroutine_threadsafe(self.astop(), loop)
        with suppress(TimeoutError):
            fut.result(timeout if timeout is not None else self.linger + 5.0)

    async def astop(self) -> None:
        """Stop from a coroutine on the loop: flush queued frames within linger (waiting without
        blocking the loop), then on_closing, close the socket here and terminate the context."""
        self._closing = True
        self._wake_waiters()
        if self.stopped.is_set() or self._torn_down:
            return
        if not self.started.is_set():
            self._teardown(0)
            return
        if not self._on_owner():
            await asyncio.to_thread(self.stop)
            return
        deadline = time.monotonic() + self.linger
        while time.monotonic() < deadline:
            more = self._drain()
            if not more and self._stalled is None:
                break
            await asyncio.sleep(0.01)  # a peer that takes nothing now: re-check at a bounded pace
        linger_ms = self._last_words(deadline)
        sock = self._detach()
        if sock is not None:
            sock.close(linger=linger_ms)
        if self._own_context:
            await asyncio.to_thread(self._ctx.term)  # may wait out the linger: never on the loop
        self._finish()

    def _stop_here(self) -> None:
        deadline = time.monotonic() + self.linger
        self._drain_all()
        self._teardown(self._last_words(deadline))

    def _last_words(self, deadline: float) -> int:
        try:
            if self._sock is not None:
                self.role.on_closing()
        except Exception:
            log.exception("%s: closing handler failed", self.name)
        return int(max(0.0, deadline - time.monotonic()) * 1000)

    def _detach(self) -> zmq.Socket[bytes] | None:
        """Stop watching the socket and forget it; the caller closes it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = float("inf")
        sock = self._sock
        if sock is not None and self._fd is not None and self._loop is not None and not self._loop.is_closed():
            with suppress(Exception):
                self._loop.remove_reader(self._fd)
        self._sock = self._wire = None
        self._fd = None
        return sock

    def _teardown(self, linger_ms: int) -> None:
        if self._torn_down:
            return
        sock = self._detach()
        if sock is not None:
            sock.close(linger=linger_ms)
        if self._own_context:
            self._ctx.term()
        self._finish()

    def _finish(self) -> None:
        self._torn_down = True
        self._wake_waiters()
        self.stopped.set()

    # ---- any thread --------------------------------------------------------------------

    def submit(self, item: Item, timeout: float | None = None) -> None:
        """Hand a frame (or a callable to run on the owner) to the loop; see the module doc."""
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if self._on_owner():
            if len(self._queue) >= self.outbound_size:
                raise BackpressureError(
                    f"{self.name}: outbound queue full ({self.outbound_size} frames); the peer is slow or unreachable"
                )
            at_once = not self.coalesce and not self._queue and self._stalled is None
            if at_once and isinstance(item, _FRAMES_ITEM) and self._send_item(item):
                self._schedule()
                return
            self._queue.append(item)
            self._schedule()
            return
        if len(self._queue) >= self.outbound_size:
            self._wait_for_room(self.submit_timeout if timeout is None else timeout)
        self._queue.append(item)
        self._kick()

    def send(self, item: Frames | tuple[Frames, Callable[[], None]], timeout: float | None = None) -> None:
        """On the loop's thread: never waits nor refuses for its own queue. With `coalesce` (the
        default) the frame joins the queue and goes out with the others of this loop iteration, at
        its end; without, it is sent at once (dropped and counted when the peer cannot take it).
        Elsewhere it is queued like submit."""
        if not self._on_owner():
            self.submit(item, timeout)
            return
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if self.coalesce:
            self._queue.append(item)
            self._schedule()
            return
        frames, after = (item, None) if isinstance(item, list) else item
        self.send_now(frames)
        if after is not None:
            self._run_call(after)
        self._schedule()  # the role may have set an earlier deadline; the socket's readiness is re-read

    def call(self, fn: Callable[[], T], timeout: float = 5.0) -> T:
        """Run fn on the loop's thread and return its result (at once when already there)."""
        if self._on_owner():
            return fn()
        fut: Future[T] = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

        self.submit(run, timeout=timeout)
        return fut.result(timeout)

    def queue_depth(self) -> int:
        return len(self._queue) + (1 if self._stalled is not None else 0)

    def request_reconnect(self) -> None:
        self._reconnect = True
        if self._on_owner():
            self._schedule()
        else:
            self._kick()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        return self._ctx

    @property
    def user_id(self) -> bytes | None:
        return self._wire.user_id if self._wire is not None else None

    def _wait_for_room(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._space:
            self._waiting += 1
            try:
                while len(self._queue) >= self.outbound_size:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closing:
                        raise BackpressureError(
                            f"{self.name}: outbound queue full ({self.outbound_size} frames) for "
                            f"{timeout} s; the peer is slow or unreachable"
                        )
                    self._kick()
                    self._space.wait(left)
            finally:
                self._waiting -= 1

    def _wake_waiters(self) -> None:
        if self._waiting:
            with self._space:
                self._space.notify_all()

    def _kick(self) -> None:
        """From another thread: one pass on the loop, however many items arrive before it runs."""
        if self._kicked:
            return
        self._kicked = True
        loop = self._loop
        if loop is None:
            self._kicked = False
            return  # not started: the first pass drains it
        try:
            loop.call_soon_threadsafe(self._woken)
        except RuntimeError:  # the loop closed: nothing will drain it any more
            self._kicked = False

    def _woken(self) -> None:
        self.stats.wakeups += 1
        self._pass()

    # ---- owner only (the loop's thread) ----------------------------------------------------------

    @property
    def socket(self) -> zmq.Socket[bytes]:
        assert self._sock is not None, "socket used before the loop opened it"  # programming error only
        return self._sock

    def _schedule(self) -> None:
        if not self._kicked and self._loop is not None:
            self._kicked = True
            self._loop.call_soon(self._pass)

    def send_now(self, frames: Frames) -> bool:
        """Owner-direct send. False (and counted as dropped) when the peer cannot take it now.

        A send may process the socket's pending commands, and with them the edge of its FD: a
        message that arrived meanwhile would not wake the reader, so a pass re-reads ZMQ_EVENTS."""
        sent = self._send(frames)
        if sent is False:
            self._dropped("peer cannot take more (high-water mark)")
        self._schedule()
        return bool(sent)

    def _open(self) -> None:
        sock = self.role.open_socket(self._ctx)
        self._sock = sock
        self._wire = Wire(sock, meta=bool(sock.getsockopt(zmq.CURVE_SERVER)))
        self._fd = int(sock.getsockopt(_FD))
        self.loop.add_reader(self._fd, self._on_readable)
        self.role.on_connected()

    def _pass(self) -> None:
        """One turn of the owner: queued items, reconnect, readable messages, timers."""
        self._kicked = False
        if self._wire is None or self._torn_down:
            return
        more = self._drain()
        if self._reconnect and not self._closing:
            self._do_reconnect()
        # A send may have taken the socket's pending commands, and with them the edge on its FD.
        self._on_readable(from_pass=True)
        if more and self._stalled is None:
            self._schedule()  # a full batch went out: the rest after other callbacks had their turn

    def _on_readable(self, from_pass: bool = False) -> None:
        wire = self._wire
        if wire is None:
            return
        if not from_pass:
            self.stats.wakeups += 1
        try:
            events = int(self.socket.getsockopt(_EVENTS))
        except zmq.ZMQError:
            return
        if events & _POLLOUT and self._stalled is not None and not from_pass:
            self._drain()
        if events & _POLLIN:
            self._receive(wire)
        self._timers()

    def _receive(self, wire: Wire) -> None:
        sock = self._sock
        readable = wire.readable
        full = True
        for i in range(self.batch):
            if i == 1 and not readable():  # a lone message ends without the costly Again
                full = False
                break
            try:
                frames = wire.recv()
            except zmq.Again:
                full = False
                break
            self.stats.received += 1
            try:
                self.role.on_frames(frames)
            except Exception:
                self.stats.handler_errors += 1
                log.exception("%s: handler failed on a %d-frame message", self.name, len(frames))
            if self._reconnect or self._sock is not sock:
                full = False
                break
        try:
            self.role.on_batch_end()
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: batch handler failed", self.name)
        if full or self._reconnect:
            self._schedule()  # more may wait: read on after the loop's other callbacks

    def _drain(self) -> bool:
        """Send up to one batch of queued items. True when more remain."""
        try:
            if self._stalled is not None:
                if not self._send_item(self._stalled):
                    return True
                self._stalled = None
            q = self._queue
            for _ in range(self.batch):
                if not q:
                    return False
                item = q.popleft()
                if isinstance(item, _FRAMES_ITEM):
                    if not self._send_item(item):
                        self._stalled = item
                        return True
                else:
                    self._run_call(item)
            return bool(q)
        finally:
            self._wake_waiters()

    def _drain_all(self) -> None:
        while self._drain() and self._stalled is None:
            pass

    def _timers(self) -> None:
        if self._torn_down:
            return
        now = time.monotonic()
        try:
            deadline = self.role.on_timer(now)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: timer handler failed", self.name)
            deadline = now + 1.0
        if self._stalled is not None:
            deadline = now + STALL_RECHECK if deadline is None else min(deadline, now + STALL_RECHECK)
        if deadline is None or deadline >= self._timer_at:
            return  # the handle in place fires no later than needed (a pass then asks again)
        if self._timer is not None:
            self._timer.cancel()
        loop = self.loop
        self._timer_at = deadline
        # Slack of 1 % of the wait (1 ms to TIMER_SLACK): under load the client's timer heap has
        # an entry falling due every job (each job's poll check, mostly for jobs long finished), and
        # one handle per entry would wake the loop once per job; a late few ms changes no outcome.
        delay = max(0.0, deadline - now)
        slack = min(TIMER_SLACK, max(0.001, delay * 0.01))
        self._timer = loop.call_at(loop.time() + delay + slack, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        self._pass()

    def _do_reconnect(self) -> None:
        self._reconnect = False
        self.stats.reconnects += 1
        sock = self._detach()
        if sock is not None:
            sock.close(linger=0)
        try:
            self._open()
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: reconnect failed; retrying", self.name)
            self._reconnect = True
            self._retry_reconnect()

    def _retry_reconnect(self) -> None:
        def again() -> None:
            if self._closing or self._torn_down:
                return
            self._reconnect = False
            self.stats.reconnects += 1
            try:
                self._open()
            except Exception:
                self.stats.handler_errors += 1
                log.exception("%s: reconnect failed; retrying", self.name)
                self._retry_reconnect()
                return
            self._pass()

        self.loop.call_later(0.1, again)  # bounded back-off, without blocking the loop


class AioTransport:
    """A `LoopFactory` making AioLoops on one event loop: `Client(..., transport=AioTransport())`.

    Without `loop`, each transport binds to the running loop when it is started (start it from a
    coroutine on that loop); with `loop`, it may also be started from another thread while it runs.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, **options: Any) -> None:
        self.event_loop = loop
        self.options = options  # batch=, context=, or overrides of the role's own settings

    def __call__(self, role: Role, **kwargs: Any) -> AioLoop:
        return AioLoop(role, **{**kwargs, **self.options, "loop": self.event_loop})


async def wait_future(future: Future[Any], timeout: float) -> bool:
    """Wait up to `timeout` seconds for a concurrent future (a JobFuture, its admission); True when
    it is done. Never cancels it: a wait that times out, or a caller that goes away, leaves it be.

    A future completed on this event loop's thread (a client on an AioLoop) wakes the waiter
    directly, without `call_soon_threadsafe` and its self-pipe write; one completed on another
    thread (a client on an OwnerLoop) hands over with `call_soon_threadsafe` as it must. The bound
    is one `call_later`, not an `asyncio.timeout` context.
    """
    if future.done():
        return True
    if timeout <= 0:
        return False
    loop = asyncio.get_running_loop()
    here = threading.get_ident()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: Future[Any]) -> None:
        if threading.get_ident() == here:
            _release(waiter)
        else:
            with suppress(RuntimeError):  # the loop has closed: nobody waits any more
                loop.call_soon_threadsafe(_release, waiter)

    future.add_done_callback(wake)
    bound = loop.call_later(timeout, _release, waiter)
    try:
        await waiter
    finally:
        bound.cancel()
    return future.done()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # (cancelled when its caller went away)
        waiter.set_result(None)
