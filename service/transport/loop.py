"""The single-owner socket loop shared by broker, worker and client.

One thread, the owner, creates, polls, sends on, receives from and closes one ZeroMQ
socket. Other threads hand it frames (or small callables) through a bounded queue
and wake it through an OS eventfd registered in its poller, so the loop sleeps until
its next timer or a wake-up: no fixed polling tick.

Loop shape: send a bounded batch of queued items → role timers (keepalives, expiry)
→ poll until the next deadline or a wake → receive and dispatch a bounded batch →
reconnect or stop if asked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import zmq

from ..errors import BackpressureError, ClosedError
from .base import Frames, Item, LoopStats, Role, T
from .sending import WireSender
from .waker import Waker
from .wire import Wire

# Plain ints: `int & zmq.POLLIN` builds an IntFlag through the enum machinery on every wake-up,
# a few percent of a broker whose 1,000 workers wake it 800 times a second.
_POLLIN = int(zmq.POLLIN)
_POLLINOUT = int(zmq.POLLIN | zmq.POLLOUT)
_FRAMES_ITEM = (list, tuple)  # a tuple, not list | tuple: that expression builds a UnionType per call

log = logging.getLogger(__name__)


class OwnerLoop(WireSender):
    """Runs a Role on its own thread; the only code that touches the role's socket."""

    def __init__(
        self,
        role: Role,
        *,
        name: str,
        outbound_size: int = 10_000,
        submit_timeout: float = 1.0,
        batch: int = 256,
        linger: float = 1.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        if outbound_size < 1 or batch < 1:
            raise ValueError("outbound_size and batch must be at least 1")
        self.role = role
        self.name = name
        self.outbound_size = outbound_size
        self.submit_timeout = submit_timeout
        self.batch = batch
        self.linger = linger
        self.stats = LoopStats()
        # A deque, not a queue.Queue: appends and pops are atomic under the GIL, with no Condition
        # round trip per item; only a full queue makes a submitter wait (on _space).
        self._queue: deque[Item] = deque()
        self._space = threading.Condition(threading.Lock())
        self._waiting = 0  # submitters waiting for room (read by the owner after each batch)
        self._waker = Waker()
        self._own_context = context is None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = context if context is not None else zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._wire: Wire | None = None
        self._poller = zmq.Poller()
        self._stalled: Frames | tuple[Frames, Callable[[], None]] | None = None  # not taken by the socket yet
        self._sleeping = False
        self._closing = False
        self._reconnect = False
        self._thread: threading.Thread | None = None
        self.owner_ident: int | None = None
        self.started = threading.Event()
        self.stopped = threading.Event()
        self._start_error: BaseException | None = None

    # ---- any thread ----------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        """Start the owner thread; raise if the socket could not be opened in time."""
        self._thread = threading.Thread(target=self._run, name=f"zfab-{self.name}", daemon=True)
        self._thread.start()
        if not self.started.wait(timeout):
            raise TimeoutError(f"{self.name}: owner loop did not start within {timeout} s")
        if self._start_error is not None:
            raise self._start_error

    def submit(self, item: Item, timeout: float | None = None) -> None:
        """Hand a frame (or a callable to run on the owner) to the loop.

        Returns once accepted. Raises ClosedError after shutdown began, and
        BackpressureError when the queue stays full past the timeout.
        """
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if len(self._queue) >= self.outbound_size:
            self._wait_for_room(self.submit_timeout if timeout is None else timeout)
        self._queue.append(item)
        if self._sleeping:
            self._waker.wake()

    def _wait_for_room(self, timeout: float) -> None:
        """The slow path of submit: the queue is full. The bound is soft by the number of threads
        submitting at the same instant, which is what keeps the fast path free of locks."""
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
                    self._waker.wake()
                    self._space.wait(left)
            finally:
                self._waiting -= 1

    def send(self, item: Frames | tuple[Frames, Callable[[], None]], timeout: float | None = None) -> None:
        """Any thread. The owner sends at once: waiting on its own queue could only deadlock it
        (nobody else drains it), so a frame the peer cannot take now is dropped and counted."""
        if threading.get_ident() != self.owner_ident:
            self.submit(item, timeout)
            return
        frames, after = (item, None) if isinstance(item, list) else item
        self.send_now(frames)
        if after is not None:
            self._run_call(after)

    def call(self, fn: Callable[[], T], timeout: float = 5.0) -> T:
        """Run fn on the owner thread and return its result (for snapshots of owner state)."""
        if threading.get_ident() == self.owner_ident:
            return fn()
        fut: Future[T] = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, not swallowed
                fut.set_exception(exc)

        self.submit(run, timeout=timeout)
        return fut.result(timeout)

    def queue_depth(self) -> int:
        return len(self._queue) + (1 if self._stalled is not None else 0)

    def request_reconnect(self) -> None:
        self._reconnect = True
        self._waker.wake()

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, flush within the linger bound, close the socket in its owner."""
        self._closing = True
        self._waker.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout if timeout is not None else self.linger + 5.0)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        return self._ctx

    @property
    def user_id(self) -> bytes | None:
        """Owner only: the ZAP user id of the message being handled (CURVE sockets)."""
        return self._wire.user_id if self._wire is not None else None

    # ---- owner only -----------------------------------------------------------

    @property
    def socket(self) -> zmq.Socket[bytes]:
        assert self._sock is not None, "socket used before the loop opened it"  # programming error only
        return self._sock

    def send_now(self, frames: Frames) -> bool:
        """Owner-direct send. False (and counted as dropped) when the peer cannot take it now:
        an owner never waits on a peer."""
        sent = self._send(frames)
        if sent is False:
            self._dropped("peer cannot take more (high-water mark)")
        return bool(sent)

    def _open(self) -> None:
        self._sock = self.role.open_socket(self._ctx)
        self._wire = Wire(self._sock, meta=bool(self._sock.getsockopt(zmq.CURVE_SERVER)))
        self._poller.register(self._sock, zmq.POLLIN)
        self.role.on_connected()

    def _close_socket(self, linger_ms: int) -> None:
        if self._sock is not None:
            try:
                self._poller.unregister(self._sock)
            except KeyError:
                pass
            self._sock.close(linger=linger_ms)
            self._sock = None
            self._wire = None

    def _run(self) -> None:
        self.owner_ident = threading.get_ident()
        try:
            self._poller.register(self._waker.fd, zmq.POLLIN)
            self._open()
        except BaseException as exc:
            self._start_error = exc
            self._closing = True
            self.started.set()
            self._teardown(0)
            return
        self.started.set()
        try:
            while not self._closing:
                self._loop_once()
            self._shutdown()
        except BaseException:  # the loop must never die silently
            log.exception("%s: owner loop crashed", self.name)
            self._teardown(0)
            raise

    def _loop_once(self) -> None:
        more = self._drain()
        deadline = self._timers()
        if more and self._stalled is None:
            # Work is queued: do not sleep. Checking readiness through ZMQ_EVENTS is
            # cheaper than a poll, and every avoided GIL release counts on a busy loop.
            assert self._wire is not None
            if self._wire.readable():
                self._receive()
            if self._reconnect and not self._closing:
                self._do_reconnect()
            return
        if deadline is None:
            timeout_ms: int | None = None
        else:
            timeout_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
        if self._stalled is not None:
            self._poller.modify(self.socket, _POLLINOUT)
            if timeout_ms is None or timeout_ms > 100:
                timeout_ms = 100  # a stalled peer: re-check at a bounded pace
        self._sleeping = True
        if timeout_ms != 0 and self._queue and self._stalled is None:
            timeout_ms = 0  # something arrived between drain and sleep
        try:
            events = dict(self._poller.poll(timeout_ms))
        finally:
            self._sleeping = False
        if self._waker.fd in events:
            self.stats.wakeups += 1
            self._waker.clear()
        ev = events.get(self._sock, 0) if self._sock is not None else 0
        if self._stalled is not None:
            self._poller.modify(self.socket, _POLLIN)
        if ev & _POLLIN:
            self._receive()
        if self._reconnect and not self._closing:
            self._do_reconnect()

    def _drain(self) -> bool:
        """Send up to one batch of queued items. True when more remain."""
        if self._stalled is not None:
            if not self._send_item(self._stalled):
                return True
            self._stalled = None
        q = self._queue
        try:
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
            if self._waiting:
                with self._space:
                    self._space.notify_all()

    def _timers(self) -> float | None:
        try:
            return self.role.on_timer(time.monotonic())
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: timer handler failed", self.name)
            return time.monotonic() + 1.0

    def _receive(self) -> None:
        sock = self.socket
        wire = self._wire
        assert wire is not None
        readable = wire.readable
        for i in range(self.batch):
            # The caller saw the socket readable. After the first message ZMQ_EVENTS is asked
            # once: a lone message (the sequential case) then ends without the Again, which
            # costs more than a message (pyzmq builds the exception and its errno enum). A
            # longer batch reads on to its Again instead: asking ZMQ_EVENTS before every
            # message (it processes the socket's pending commands each time) was the top line of
            # the broker's and the client's pipelined profiles (13 %). Receiving bursts of
            # 8-frame messages, the batch that reads on costs 14.2-15.0 us of CPU a message
            # against 16.1-20.1 us with a check before each.
            if i == 1 and not readable():
                break
            try:
                frames = wire.recv()
            except zmq.Again:
                break
            self.stats.received += 1
            try:
                self.role.on_frames(frames)
            except Exception:
                self.stats.handler_errors += 1
                log.exception("%s: handler failed on a %d-frame message", self.name, len(frames))
            if self._reconnect or self._sock is not sock:
                break
        try:
            self.role.on_batch_end()
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: batch handler failed", self.name)

    def _do_reconnect(self) -> None:
        self._reconnect = False
        self.stats.reconnects += 1
        # A stalled frame stays in self._stalled and is retried first on the new socket.
        self._close_socket(0)
        try:
            self._open()
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: reconnect failed; retrying", self.name)
            self._reconnect = True
            time.sleep(0.1)  # bounded back-off before the next attempt

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.linger
        while time.monotonic() < deadline:
            more = self._drain()
            if not more and self._stalled is None:
                break
            if self._sock is not None:
                self._poller.poll(10)
        try:
            if self._sock is not None:
                self.role.on_closing()
        except Exception:
            log.exception("%s: closing handler failed", self.name)
        self._teardown(int(max(0.0, deadline - time.monotonic()) * 1000))

    def _teardown(self, linger_ms: int) -> None:
        self._close_socket(linger_ms)
        self._waker.close()
        if self._own_context:
            self._ctx.term()
        self.stopped.set()
