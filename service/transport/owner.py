"""What a socket's single owner does, shared by both kinds of owner: `OwnerLoop` (loop.py), a thread of
its own, and `AioLoop` (aioloop.py), an asyncio event loop.

As pyzmq's zmq/auth/base.py holds the authenticator's policy and its thread.py and asyncio.py only run
a loop around it, this holds the owner's policy: the bounded outbound queue and how other threads hand
items over (submit, send, call), the owner's own sends, a drain of one batch, a receive of one batch,
the role's timers, reconnects, last words and teardown, and how a failing handler is counted. An
adapter adds only how the owner waits and is woken:

- `_wake()`: another thread queued an item; get the owner to drain it (an eventfd, call_soon_threadsafe);
  `_idle` says when that is needed: True while nothing already under way would see the queue;
- `_watch(sock)` / `_unwatch(sock)`: a socket was opened / is about to close (a poller, add_reader);
- `_released()`: its own resources, at teardown;
- `start()` and `stop()`, and the loop that calls `_drain`, `_receive` and `_role_timer`.

Nothing here adds a step per message to either adapter: the receive and drain loops are the ones the
two adapters ran, once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import zmq

from ..core.logbudget import LogBudget
from ..core.lru import BoundedLRU
from ..errors import BackpressureError, ClosedError
from . import bundle
from .base import Frames, Item, LoopStats, Role, T
from .sending import WireSender
from .wire import Wire

log = logging.getLogger(__name__)

# Outbound messages dropped (a peer gone, or one that takes nothing): the first few are logged, then
# one every 10 s saying how many were not; stats.send_dropped counts every one.
DROPS_LOGGED_AT_ONCE = 3
DROPS_LOGGED_PER_SECOND = 0.1
FRAMES_ITEM = (list, tuple)  # a tuple, not list | tuple: that expression builds a UnionType per call


class SocketOwner(WireSender):
    """The owner of one role's socket; an adapter (OwnerLoop, AioLoop) runs it."""

    def __init__(
        self,
        role: Role,
        *,
        name: str,
        outbound_size: int,
        submit_timeout: float,
        batch: int,
        linger: float,
        context: zmq.Context[zmq.Socket[bytes]] | None,
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
        self._drop_log = LogBudget(burst=DROPS_LOGGED_AT_ONCE, per_second=DROPS_LOGGED_PER_SECOND)
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.owner_ident: int | None = None  # the thread that owns (or owned) the socket, once started
        self._owner: int | None = None  # the same while it owns it: a thread id may be reused once it ended
        # A deque, not a queue.Queue: appends and pops are atomic under the GIL, with no Condition
        # round trip per item; only a full queue makes a submitter wait (on _space).
        self._queue: deque[Item] = deque()
        self._space = threading.Condition(threading.Lock())
        self._waiting = 0  # submitters waiting for room (the owner notifies them after each drain)
        self._own_context = context is None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = context if context is not None else zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._wire: Wire | None = None
        self._stalled: Frames | tuple[Frames, Callable[[], None]] | None = None  # not taken by the socket yet
        # Bundles (bundle.py): within a step of the owner (a receive batch, a drain, a timer pass), what goes
        # to a peer that reads them is gathered and sent as one at the step's end.
        self._corking = False
        self._bundled: BoundedLRU[bytes, bool] = BoundedLRU(max_count=bundle.PEERS)
        self._pending: dict[bytes, bundle.Pending] = {}
        self._skip = 0
        self._bundle_log = LogBudget(burst=DROPS_LOGGED_AT_ONCE, per_second=DROPS_LOGGED_PER_SECOND)
        self._closing = False
        self._reconnect = False
        self._torn_down = False
        # The owner sleeps (or no pass is scheduled) and would not see a queued item: the adapter keeps
        # it, so that a hand-over pays for a wake-up only then, without a call to ask.
        self._idle = False

    # ---- what an adapter provides ---------------------------------------------------------------

    def _wake(self) -> None:
        """Another thread queued an item (or waits for room): the owner is to drain."""
        raise NotImplementedError

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        """A socket was opened: wait for its messages."""

    def _unwatch(self, sock: zmq.Socket[bytes]) -> None:
        """The socket is about to close: stop waiting for it."""

    def _released(self) -> None:
        """Teardown: the adapter's own resources."""

    # ---- any thread -----------------------------------------------------------------------------

    def submit(self, item: Item, timeout: float | None = None) -> None:
        """Hand a frame (or a callable to run on the owner) to the owner.

        Returns once accepted. Raises ClosedError after shutdown began, and BackpressureError when
        the queue stays full past the timeout."""
        if self._closing:
            raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
        if len(self._queue) >= self.outbound_size:
            self._wait_for_room(self.submit_timeout if timeout is None else timeout)
        self._queue.append(item)
        if self._idle:
            self._wake()

    def send(self, item: Frames | tuple[Frames, Callable[[], None]], timeout: float | None = None) -> None:
        """Any thread. The owner sends at once: waiting on its own queue could only deadlock it
        (nobody else drains it), so a frame the peer cannot take now is dropped and counted."""
        if threading.get_ident() != self._owner:
            self.submit(item, timeout)
            return
        frames, after = (item, None) if isinstance(item, list) else item
        self.send_now(frames)
        if after is not None:
            self._run_call(after)

    def call(self, fn: Callable[[], T], timeout: float = 5.0) -> T:
        """Run fn on the owner and return its result (at once when already there)."""
        if threading.get_ident() == self._owner:
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

    def bundles(self, peer: bytes, yes: bool = True) -> None:
        """Owner only: the peer reads bundles, or no longer does (what is gathered for it goes first)."""
        if yes:
            self._mark_bundled(peer)
        elif self._bundled.pop(peer) is not None and peer in self._pending:
            self._flush_peer(peer)

    def bundle_peers(self) -> int:
        """How many peers are known to read bundles (bounded by bundle.PEERS)."""
        return len(self._bundled)

    def _mark_bundled(self, peer: bytes) -> None:
        if peer not in self._bundled:
            self._bundled.put(peer, True)
            self._bundled.shed()  # the oldest gets single messages again until it sends a bundle

    def request_reconnect(self) -> None:
        self._reconnect = True
        self._wake()

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

    def _on_owner(self) -> bool:
        return threading.get_ident() == self._owner

    def _become_owner(self) -> None:
        self.owner_ident = self._owner = threading.get_ident()

    def _wait_for_room(self, timeout: float) -> None:
        """The slow path of submit: the queue is full. The bound is soft by the number of threads
        submitting at the same instant, which is what keeps the fast path free of locks."""
        deadline = time.monotonic() + timeout
        with self._space:
            self._waiting += 1
            try:
                while len(self._queue) >= self.outbound_size:
                    if self._closing:
                        raise ClosedError(f"{self.name} is shutting down; nothing more is accepted")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BackpressureError(
                            f"{self.name}: outbound queue full ({self.outbound_size} frames) for "
                            f"{timeout} s; the peer is slow or unreachable"
                        )
                    self._wake()
                    self._space.wait(left)
            finally:
                self._waiting -= 1

    def _wake_waiters(self) -> None:
        if self._waiting:
            with self._space:
                self._space.notify_all()

    # ---- owner only -----------------------------------------------------------------------------

    @property
    def socket(self) -> zmq.Socket[bytes]:
        assert self._sock is not None, "socket used before the loop opened it"  # programming error only
        return self._sock

    def send_now(self, frames: Frames) -> bool:
        """Owner-direct send. False (and counted as dropped) when the peer cannot take it now: an
        owner never waits on a peer."""
        sent = self._send(frames)
        if sent is False:
            self._dropped("peer cannot take more (high-water mark)")
        return bool(sent)

    def _open(self) -> None:
        sock = self.role.open_socket(self._ctx)
        self._sock = sock
        self._wire = Wire(sock, meta=bool(sock.getsockopt(zmq.CURVE_SERVER)))
        # A new socket, new peers: none is known to read bundles until it says so again.
        self._bundled = BoundedLRU(max_count=bundle.PEERS)
        self._pending.clear()
        self._skip = 1 if sock.type == zmq.ROUTER else 0
        self._watch(sock)
        self.role.on_connected()

    def _close_socket(self, linger_ms: int) -> None:
        sock = self._sock
        if sock is None:
            return
        self._unwatch(sock)
        self._sock = self._wire = None
        sock.close(linger=linger_ms)

    def _drain(self) -> bool:
        """Send up to one batch of queued items (a stalled frame first). True when more remain."""
        if self._stalled is not None:
            if not self._send_item(self._stalled):
                return True
            self._stalled = None
        q = self._queue
        more = False
        self._corking = True
        try:
            for _ in range(self.batch):
                if not q:
                    break
                item = q.popleft()
                if isinstance(item, FRAMES_ITEM):
                    if not self._send_item(item):
                        if self._stalled is None:
                            self._stalled = item
                        else:  # behind a bundle the peer could not take
                            q.appendleft(item)
                        break
                    if self._stalled is not None:  # a full bundle the peer could not take: it goes first
                        break
                else:
                    self._run_call(item)
            else:
                more = bool(q)
        finally:
            self._corking = False
            if self._pending:
                self._flush()
            if self._waiting:
                self._wake_waiters()
        return more or self._stalled is not None

    def _receive(self) -> bool:
        """Read up to one batch of messages and hand each to the role, then end the batch. True when
        the batch was full: more may be waiting."""
        wire = self._wire
        sock = self._sock
        assert wire is not None  # the adapters receive only while a socket is open
        readable = wire.readable
        on_frames = self.role.on_frames
        full = True
        i = 0
        self._corking = True
        try:
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
                    full = False
                    break
                try:
                    frames = wire.recv()
                except zmq.Again:
                    full = False
                    break
                if bundle.is_bundle(frames):
                    self._unbundle(frames, sock)
                else:
                    try:
                        on_frames(frames)
                    except Exception:
                        self._handler_failed("handler failed on a %d-frame message", len(frames))
                if self._reconnect or self._sock is not sock:
                    full = False
                    i += 1  # this one was handled
                    break
            else:
                i = self.batch
            self.stats.received += i  # once per batch, not per message
            try:
                self.role.on_batch_end()
            except Exception:
                self._handler_failed("batch handler failed")
        finally:
            self._corking = False
            if self._pending:
                self._flush()
        return full

    def _unbundle(self, frames: Frames, sock: zmq.Socket[bytes] | None) -> None:
        """A bundle: each of its messages to the role, as if each had come on its own. A broker's peer
        that sends one reads them (its answers may come as one); a malformed one is dropped, counted."""
        try:
            messages = bundle.unpack(frames)
        except bundle.BundleError as exc:
            self.stats.bundles_rejected += 1
            held = self._bundle_log.take()
            if held is not None:
                more = f" ({held} more not logged)" if held else ""
                log.warning("%s: dropped a malformed bundle: %s%s", self.name, exc, more)
            return
        self.stats.bundles_received += 1
        self.stats.received += len(messages) - 1
        if self._skip:
            self._mark_bundled(bytes(frames[0]))
        on_frames = self.role.on_frames
        for message in messages:
            try:
                on_frames(message)
            except Exception:
                self._handler_failed("handler failed on a %d-frame message", len(message))
            if self._reconnect or self._sock is not sock:
                break  # the rest came on a socket the role has left

    def _role_timer(self, now: float) -> float | None:
        """The role's timers; the next deadline (a failing handler is looked at again in a second)."""
        self._corking = True
        try:
            return self.role.on_timer(now)
        except Exception:
            self._handler_failed("timer handler failed")
            return now + 1.0
        finally:
            self._corking = False
            if self._pending:
                self._flush()

    def _reopen(self) -> bool:
        """Close the socket and open a new one (role.open_socket, then role.on_connected). False when
        it could not be opened: the adapter tries again after a bounded back-off. A stalled frame
        stays stalled and goes first on the new socket."""
        self._reconnect = False
        self.stats.reconnects += 1
        stalled = self._stalled
        if isinstance(stalled, list) and bundle.is_bundle(stalled):
            # The new socket's peer may not read bundles: its messages go again one by one, first.
            self._stalled = None
            self._queue.extendleft(reversed(bundle.unpack(stalled)))
        self._close_socket(0)
        try:
            self._open()
        except Exception:
            self._handler_failed("reconnect failed; retrying")
            return False
        return True

    def _last_words(self, deadline: float) -> int:
        """The role's on_closing while its socket is open; what is left of the linger, in ms."""
        if self._sock is not None:
            try:
                self.role.on_closing()
            except Exception:
                log.exception("%s: closing handler failed", self.name)
        return int(max(0.0, deadline - time.monotonic()) * 1000)

    def _teardown(self, linger_ms: int) -> None:
        """Close the socket where this runs (the owner, or any thread once the owner is gone), then the
        adapter's resources and an own context; stopped."""
        if self._torn_down:
            return
        self._close_socket(linger_ms)
        self._released()
        if self._own_context:
            self._ctx.term()
        self._finish()

    def _finish(self) -> None:
        self._torn_down = True
        self._closing = True
        self._owner = None
        self._wake_waiters()
        self.stopped.set()

    def _handler_failed(self, what: str, *args: object) -> None:
        """A role's handler (or a queued call) raised: counted and logged, and the loop goes on."""
        self.stats.handler_errors += 1
        log.exception("%s: " + what, self.name, *args)
