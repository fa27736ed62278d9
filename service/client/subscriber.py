"""A subscriber to the broker's events by topic prefix (issue 30, part 1; docs/protocol.md).

    with Subscriber("tcp://127.0.0.1:5556", "job.demo.") as sub:
        for event in sub:          # {"seq", "tseq", "topic", "uuid", "service", "task", "state", "at", ...}
            ...

Single owner: the SUB socket is created, polled, read and closed by the subscriber's own thread,
which puts events in a bounded deque; iterating (any one thread) takes them from there. A full
deque drops the newest and counts it (`dropped`); events the publisher or the subscriber's pipe
dropped show as gaps in each topic's `tseq` and are counted in `missed`. `start()` returns once
the broker confirmed the subscription (its welcome message), so no event after it is lost to a
slow join.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import zmq

from ..errors import ZfabError
from ..settings import Settings
from ..transport.security import curve_client
from ..transport.waker import Waker

MAX_PREFIX = 256  # bytes; the broker refuses longer prefixes (it closes a peer that sends one)
MAX_EVENT_BYTES = 64 * 1024  # an event is a few hundred bytes: anything larger is not one
MAX_TOPICS = 10_000  # per-topic sequence numbers remembered (to count gaps)


class SubscriptionError(ZfabError):
    """The broker's event publisher did not confirm the subscription."""


class Subscriber:
    """Iterates the broker's events whose topic starts with `prefix`: every job's state changes, workers
    that come and go, jobs' progress events, queue depths and hop traces (the wire protocol's "Event
    subscriptions" lists the topics). `Client.subscribe` makes and starts one.

    A slow subscriber holds nothing up: past `queue_size` events held here the oldest are dropped
    (`dropped`), and what the broker dropped for it shows as gaps in a topic's `tseq` (`missed`).

    Args:
        endpoint: the broker's event publisher (`ZFAB_BROKER_EVENTS`).
        prefix: a topic prefix: `"job.demo."`, `"worker."`, `"queue.demo"`; `""` for every event.
        queue_size: events held until read.
        settings: its CURVE keys and bounds (default: none; the client's when `Client.subscribe` made it).
        context: the ZeroMQ context to use (default: the process's).

    Raises:
        ValueError: a prefix over 256 bytes, or a `queue_size` under 1.

    Example:
        ```python
        from zfab import Subscriber

        with Subscriber("tcp://127.0.0.1:5556", "job.demo.") as events:
            for event in events:                       # {"topic", "uuid", "service", "task", "state", ...}
                if event["state"] == "failed":
                    print(event["uuid"], "failed")
        ```
    """

    def __init__(
        self,
        endpoint: str,
        prefix: str = "",
        *,
        queue_size: int = 10_000,
        settings: Settings | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        raw = prefix.encode()
        if len(raw) > MAX_PREFIX:
            raise ValueError(f"a topic prefix is at most {MAX_PREFIX} bytes, not {len(raw)}")
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self.endpoint = endpoint
        self.prefix = prefix
        self._raw = raw
        self.queue_size = queue_size
        self.settings = settings
        self.received = 0
        self.dropped = 0  # the local deque was full
        self.missed = 0  # gaps in a topic's tseq: dropped before they reached this subscriber
        self.ready = threading.Event()
        self._events: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._last: dict[str, int] = {}
        self._ctx = context if context is not None else zmq.Context.instance()
        self._waker = Waker()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, timeout: float = 5.0) -> Subscriber:
        """Connect and subscribe; return once the broker confirmed it.

        Args:
            timeout: seconds to wait for the confirmation.

        Returns:
            The subscriber, started.

        Raises:
            SubscriptionError: the publisher did not confirm it in time (is `ZFAB_BROKER_EVENTS` set on
                the broker?).
        """
        self._thread = threading.Thread(target=self._run, name="zfab-subscriber", daemon=True)
        self._thread.start()
        if not self.ready.wait(timeout):
            self.close()
            why = f": {self._error}" if self._error is not None else ""
            raise SubscriptionError(
                f"the broker's event publisher at {self.endpoint} did not confirm the subscription to "
                f"{self.prefix!r} within {timeout} s{why} (is ZFAB_BROKER_EVENTS set on the broker?)"
            )
        return self

    def close(self, timeout: float = 2.0) -> None:
        """Stop: an iteration in progress ends; `timeout` bounds the wait for its socket's thread."""
        self._closing = True
        self._waker.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> Subscriber:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once close() was called or its socket's thread ended."""
        return self._closing

    def depth(self) -> int:
        return len(self._events)

    def get(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next event, or None when none came within `timeout` (or the subscriber closed).

        Args:
            timeout: seconds to wait (None: until one comes or it closes).

        Returns:
            The event as a dictionary (`seq`, `tseq`, `topic`, and the topic's fields), or None.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._events:
                if self._closing:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._events.popleft()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            event = self.get()
            if event is None:
                return
            yield event

    # ---- the owner thread ------------------------------------------------------------

    def _run(self) -> None:
        sock: zmq.Socket[bytes] | None = None
        try:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, self.queue_size)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_EVENT_BYTES)
            s = self.settings
            if s is not None and s.curve_secret and s.curve_server_key:
                curve_client(sock, s.curve_secret, s.curve_server_key)
            sock.connect(self.endpoint)
            sock.setsockopt(zmq.SUBSCRIBE, self._raw)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._waker.fd, zmq.POLLIN)
            while not self._closing:
                events = dict(poller.poll(None))
                if self._waker.fd in events:
                    self._waker.clear()
                if sock in events:
                    self._receive(sock)
        except Exception as exc:  # reported by start(), or ends the iteration
            self._error = exc
        finally:
            if sock is not None:
                sock.close(0)
            self._waker.close()
            self._closing = True
            with self._cond:
                self._cond.notify_all()

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        got: list[dict[str, Any]] = []
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                continue
            try:
                body = json.loads(frames[1])
            except ValueError:
                continue
            if not isinstance(body, dict):
                continue
            if "subscribed" in body:
                if body["subscribed"] == self.prefix:
                    self.ready.set()
                continue
            if not self.ready.is_set():
                continue  # before the welcome: a prefix of ours someone else subscribed to first
            self._count_gap(body)
            got.append(body)
        if not got:
            return
        with self._cond:
            room = self.queue_size - len(self._events)
            if room < len(got):
                self.dropped += len(got) - max(0, room)
                got = got[: max(0, room)]
            self._events.extend(got)
            self.received += len(got)
            self._cond.notify_all()

    def _count_gap(self, body: dict[str, Any]) -> None:
        topic, n = body.get("topic"), body.get("tseq")
        if not isinstance(topic, str) or not isinstance(n, int):
            return
        last = self._last.get(topic)
        if last is None and len(self._last) >= MAX_TOPICS:
            self._last.clear()
        if last is not None and n > last + 1:
            self.missed += n - last - 1
        self._last[topic] = n
