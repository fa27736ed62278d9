"""An owner loop that is an asyncio event loop: the role's socket lives on the loop's own thread.

`OwnerLoop` (loop.py) gives a role a thread of its own; code on an asyncio event loop (the HTTP
API) then hands every frame to that thread through a queue and an eventfd, and every result comes
back through `call_soon_threadsafe`, with the two threads trading the GIL for each job. `AioLoop`
makes the event loop's thread the socket's single owner instead. What an owner does (the bounded
queue, batches, timers, reconnects, teardown) is owner.py's, shared with OwnerLoop; this adapter
only waits and wakes the asyncio way:

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
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

import zmq

from ..errors import BackpressureError, ClosedError
from .base import Frames, Item, Role
from .owner import FRAMES_ITEM, SocketOwner

_EVENTS = int(zmq.EVENTS)
_FD = int(zmq.FD)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
STALL_RECHECK = 0.1  # a peer that stopped taking frames: the stalled one is retried at this pace
TIMER_SLACK = 0.02  # at most this late for a deadline (see _timers)
RECONNECT_BACKOFF = 0.1  # seconds between attempts to open a socket that failed to open


class AioLoop(SocketOwner):
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
        sched_batch: bool = False,
        idle_poll: float = 0.0,
    ) -> None:
        # `sched_batch` and `idle_poll` are an owner thread's (loop.py, scheduling.py, idlepoll.py): the event
        # loop's thread is its application's, so it is taken and left as it is.
        del sched_batch, idle_poll
        super().__init__(
            role,
            name=name,
            outbound_size=outbound_size,
            submit_timeout=submit_timeout,
            batch=batch,
            linger=linger,
            context=context,
        )
        self.coalesce = coalesce
        self._loop = loop
        self._fd: int | None = None
        self._idle = True  # no pass is scheduled (call_soon / call_soon_threadsafe): the next hand-over asks one
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")  # monotonic time the timer handle fires at

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the transport is bound to its event loop at start()"  # programming error
        return self._loop

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
        self._become_owner()
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
            deadline = time.monotonic() + self.linger
            while self._drain() and self._stalled is None:
                pass  # what the socket takes at once; the rest is ZeroMQ's to hand over within the linger
            self._teardown(self._last_words(deadline))
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
        while time.monotonic() < deadline and self._drain():
            await asyncio.sleep(0.01)  # a peer that takes nothing now: re-check at a bounded pace
        self._close_socket(self._last_words(deadline))
        if self._own_context:
            await asyncio.to_thread(self._ctx.term)  # may wait out the linger: never on the loop
        self._finish()

    # ---- any thread --------------------------------------------------------------------

    def submit(self, item: Item, timeout: float | None = None) -> None:
        """Hand a frame (or a callable to run on the owner) to the loop; see the module doc."""
        if not self._on_owner():
            super().submit(item, timeout)
            return
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if len(self._queue) >= self.outbound_size:
            raise BackpressureError(
                f"{self.name}: outbound queue full ({self.outbound_size} frames); the peer is slow or unreachable"
            )
        at_once = not self.coalesce and not self._queue and self._stalled is None
        if at_once and isinstance(item, FRAMES_ITEM) and self._send_item(item):
            self._schedule()
            return
        self._queue.append(item)
        self._schedule()

    def send(self, item: Frames | tuple[Frames, Callable[[], None]], timeout: float | None = None) -> None:
        """On the loop's thread: never waits nor refuses for its own queue. With `coalesce` (the
        default) the frame joins the queue and goes out with the others of this loop iteration, at
        its end; without, it is sent at once (dropped and counted when the peer cannot take it).
        Elsewhere it is queued like submit."""
        if not self._on_owner():
            super().submit(item, timeout)
            return
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if self.coalesce:
            self._queue.append(item)
            self._schedule()
            return
        super().send(item)  # sent now; send_now schedules a pass (the socket's readiness is re-read)

    def request_reconnect(self) -> None:
        self._reconnect = True
        if self._on_owner():
            self._schedule()
        else:
            self._wake()

    def _wake(self) -> None:
        """From another thread: one pass on the loop, however many items arrive before it runs."""
        if not self._idle:
            return
        self._idle = False
        loop = self._loop
        if loop is None:
            self._idle = True
            return  # not started: the first pass drains it
        try:
            loop.call_soon_threadsafe(self._woken)
        except RuntimeError:  # the loop closed: nothing will drain it any more
            self._idle = True

    def _woken(self) -> None:
        self.stats.wakeups += 1
        self._pass()

    # ---- owner only (the loop's thread) ----------------------------------------------------------

    def _schedule(self) -> None:
        if self._idle and self._loop is not None:
            self._idle = False
            self._loop.call_soon(self._pass)

    def send_now(self, frames: Frames) -> bool:
        """Owner-direct send. False (and counted as dropped) when the peer cannot take it now.

        A send may process the socket's pending commands, and with them the edge of its FD: a
        message that arrived meanwhile would not wake the reader, so a pass re-reads ZMQ_EVENTS."""
        sent = super().send_now(frames)
        self._schedule()
        return sent

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        self._fd = int(sock.getsockopt(_FD))
        self.loop.add_reader(self._fd, self._on_readable)

    def _unwatch(self, sock: zmq.Socket[bytes]) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = float("inf")
        if self._fd is not None and self._loop is not None and not self._loop.is_closed():
            with suppress(Exception):
                self._loop.remove_reader(self._fd)
        self._fd = None

    def _pass(self) -> None:
        """One turn of the owner: queued items, reconnect, readable messages, timers."""
        self._idle = True
        if self._wire is None or self._torn_down:
            return
        more = self._drain()
        if self._reconnect and not self._closing and not self._reopen():
            self._retry_reconnect()
        # A send may have taken the socket's pending commands, and with them the edge on its FD.
        self._on_readable(from_pass=True)
        if more and self._stalled is None:
            self._schedule()  # a full batch went out: the rest after other callbacks had their turn

    def _on_readable(self, from_pass: bool = False) -> None:
        if self._wire is None:
            return
        if not from_pass:
            self.stats.wakeups += 1
        try:
            events = int(self.socket.getsockopt(_EVENTS))
        except zmq.ZMQError:
            return
        if events & _POLLOUT and self._stalled is not None and not from_pass:
            self._drain()
        if events & _POLLIN and (self._receive() or self._reconnect):
            self._schedule()  # more may wait: read on after the loop's other callbacks
        self._timers()

    def _timers(self) -> None:
        if self._torn_down:
            return
        now = time.monotonic()
        deadline = self._role_timer(now)
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

    def _retry_reconnect(self) -> None:
        """A socket that failed to open: try again after a back-off, without blocking the loop."""

        def again() -> None:
            if self._closing or self._torn_down:
                return
            if self._reopen():
                self._pass()
            else:
                self._retry_reconnect()

        self.loop.call_later(RECONNECT_BACKOFF, again)


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
