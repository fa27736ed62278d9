"""The thread owner: a socket owner (owner.py) that runs on a thread of its own.

One thread, the owner, creates, polls, sends on, receives from and closes one ZeroMQ socket. Other
threads hand it frames (or small callables) through the bounded queue and wake it through an OS
eventfd registered in its poller, so the loop sleeps until its next timer or a wake-up: no fixed
polling tick. What the owner does lives in owner.py; this adapter only runs the loop.

Loop shape: send a bounded batch of queued items → role timers (keepalives, expiry) → poll until
the next deadline or a wake (the broker looks for work a little first: idlepoll.py) → receive and
dispatch a bounded batch → reconnect or stop if asked.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import zmq

from .base import Role
from .idlepoll import IdlePoll
from .owner import SocketOwner
from .scheduling import batch_this_thread
from .waker import Waker

# Plain ints: `int & zmq.POLLIN` builds an IntFlag through the enum machinery on every wake-up,
# a few percent of a broker whose 1,000 workers wake it 800 times a second.
_POLLIN = int(zmq.POLLIN)
_POLLINOUT = int(zmq.POLLIN | zmq.POLLOUT)
STALL_RECHECK_MS = 100  # a peer that stopped taking frames: the stalled one is retried at this pace
RECONNECT_BACKOFF = 0.1  # seconds between attempts to open a socket that failed to open

log = logging.getLogger(__name__)


def _ms_until(deadline: float | None, now: float) -> int | None:
    """A poll's timeout for `deadline` (monotonic) from `now`: whole ms, rounded up so that the loop wakes
    once it is due, not just before; None for no deadline."""
    return None if deadline is None else max(0, int((deadline - now) * 1000) + 1)


class OwnerLoop(SocketOwner):
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
        sched_batch: bool = False,
        idle_poll: float = 0.0,
    ) -> None:
        super().__init__(
            role,
            name=name,
            outbound_size=outbound_size,
            submit_timeout=submit_timeout,
            batch=batch,
            linger=linger,
            context=context,
        )
        self._waker = Waker()
        self._poller = zmq.Poller()
        self._thread: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self.sched_batch = sched_batch  # run the owner thread under SCHED_BATCH (scheduling.py)
        self.batched = False  # it does
        # Seconds it may look for work before it sleeps, adapted per wait (idlepoll.py); None: it sleeps at once.
        self.idle_poll = IdlePoll(idle_poll) if idle_poll > 0 else None

    # ---- any thread ----------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        """Start the owner thread; raise if the socket could not be opened in time."""
        self._thread = threading.Thread(target=self._run, name=f"zfab-{self.name}", daemon=True)
        self._thread.start()
        if not self.started.wait(timeout):
            raise TimeoutError(f"{self.name}: owner loop did not start within {timeout} s")
        if self._start_error is not None:
            raise self._start_error

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, flush within the linger bound, close the socket in its owner."""
        self._closing = True
        self._wake_waiters()  # a submitter waiting for room hears ClosedError now
        t = self._thread
        if t is None:
            self._teardown(0)  # never started: nobody else can touch what it made
            return
        self._waker.wake()
        if t is not threading.current_thread():
            t.join(timeout if timeout is not None else self.linger + 5.0)

    def _wake(self) -> None:
        self._waker.wake()

    # ---- owner only -----------------------------------------------------------

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        self._poller.register(sock, zmq.POLLIN)

    def _unwatch(self, sock: zmq.Socket[bytes]) -> None:
        try:
            self._poller.unregister(sock)
        except KeyError:
            pass

    def _released(self) -> None:
        self._waker.close()

    def _run(self) -> None:
        self._become_owner()
        if self.sched_batch:
            # Before the socket opens: ZeroMQ's I/O thread, started with a context's first socket, inherits it.
            self.batched = batch_this_thread()
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
        deadline = self._role_timer(time.monotonic())
        if more and self._stalled is None:
            # Work is queued: do not sleep. Checking readiness through ZMQ_EVENTS is
            # cheaper than a poll, and every avoided GIL release counts on a busy loop.
            assert self._wire is not None
            if self._wire.readable():
                self._receive()
            if self._reconnect and not self._closing:
                self._reconnect_or_back_off()
            return
        timeout_ms = _ms_until(deadline, time.monotonic())
        if self._stalled is not None:
            self._poller.modify(self.socket, _POLLINOUT)
            if timeout_ms is None or timeout_ms > STALL_RECHECK_MS:
                timeout_ms = STALL_RECHECK_MS
        self._idle = True
        if timeout_ms != 0 and self._queue and self._stalled is None:
            timeout_ms = 0  # something arrived between drain and sleep
        try:
            if self.idle_poll is None or timeout_ms == 0 or self._stalled is not None:
                ready = self._poller.poll(timeout_ms)
            else:
                ready = self._poll_then_sleep(self.idle_poll, deadline)
        finally:
            self._idle = False
        ev = 0
        sock = self._sock
        for polled, flags in ready:  # at most two: the socket and the waker (no dict built per wake)
            if polled is sock:
                ev = flags
            else:
                self.stats.wakeups += 1
                self._waker.clear()
        if self._stalled is not None:
            self._poller.modify(self.socket, _POLLIN)
        if ev & _POLLIN:
            self._receive()
        if self._reconnect and not self._closing:
            self._reconnect_or_back_off()

    def _poll_then_sleep(self, ip: IdlePoll, deadline: float | None) -> list[tuple[Any, int]]:
        """Look for work for up to the adaptive window (idlepoll.py), then sleep until `deadline` or a wake-up."""
        poll = self._poller.poll
        start = now = time.monotonic()
        ready: list[tuple[Any, int]] = []
        polled = ran = 0.0
        if ip.window:
            end = start + ip.window if deadline is None else min(start + ip.window, deadline)
            cpu = time.thread_time()
            while True:
                ready = poll(0)
                now = time.monotonic()
                if ready or now >= end:
                    break
            polled, ran = now - start, time.thread_time() - cpu
            if ready:
                self.stats.idle_polls_found += 1
        if not ready and (deadline is None or now < deadline):
            # (A window the next timer cut short ends at it, no sleep after: a sleep's timeout is rounded up,
            # and would wake the loop a millisecond past its timer.)
            if ip.window:
                self.stats.idle_polls_slept += 1
            ready = poll(_ms_until(deadline, now))
        ip.settle(time.monotonic() - start, polled, ran)
        return ready

    def _reconnect_or_back_off(self) -> None:
        if not self._reopen():
            self._reconnect = True
            time.sleep(RECONNECT_BACKOFF)  # this thread has nothing else to do until a socket is open

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.linger
        while time.monotonic() < deadline and self._drain():
            if self._sock is not None:
                self._poller.poll(10)  # a peer that takes nothing now: re-check at a bounded pace
        self._teardown(self._last_words(deadline))
