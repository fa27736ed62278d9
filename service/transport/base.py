"""The contract between a role (broker, worker, client) and the loop that owns its socket.

A role is handed a `Transport` when it is built (`transport=` on Broker, Worker, Client): the
real `OwnerLoop`, or `StubLoop` (transport/stub.py) in unit tests, which records sent frames,
feeds received ones and moves a fake clock. Roles never touch a socket themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import zmq

from ..core.protocol import Frame as Frame  # re-exported

Frames = list[Frame]  # one multipart message (Frame: core/protocol.py)
# A frame; a frame and what to do once it is sent; or a call to run on the owner.
Item = Frames | tuple[Frames, Callable[[], None]] | Callable[[], None]
T = TypeVar("T")


class Role(Protocol):
    """What a broker, worker or client plugs into the loop. Every method runs on the owner."""

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        """Create, configure and bind/connect the socket (also on every reconnect)."""

    def on_connected(self) -> None:
        """Called right after open_socket: send READY and the like."""

    def on_frames(self, frames: Frames) -> None:
        """One received multipart message."""

    def on_batch_end(self) -> None:
        """After a batch of on_frames calls: flush work gathered across the batch."""

    def on_timer(self, now: float) -> float | None:
        """Do what is due; return the next monotonic deadline, or None for none."""

    def on_closing(self) -> None:
        """The loop is about to close the socket: last words such as DISCONNECT."""


@dataclass(slots=True)
class LoopStats:
    sent: int = 0
    received: int = 0
    send_dropped: int = 0
    handler_errors: int = 0
    wakeups: int = 0
    reconnects: int = 0
    bundles_sent: int = 0  # several messages as one (bundle.py); `sent` and `received` count each message
    bundles_received: int = 0
    bundles_rejected: int = 0  # malformed, dropped whole
    idle_polls_found: int = 0  # idle waits whose poll found work: a sleep and a wake-up saved (idlepoll.py)
    idle_polls_slept: int = 0  # idle waits that polled their whole window, then slept (not those a timer ended)


class Transport(Protocol):
    """What a role may ask of the loop that owns its socket."""

    name: str
    stats: LoopStats
    outbound_size: int
    started: threading.Event
    stopped: threading.Event

    def start(self, timeout: float = 10.0) -> None:
        """Start the owner (open the socket); raise if it could not."""

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, flush within the linger bound, close the socket in its owner."""

    def submit(self, item: Item, timeout: float | None = None) -> None:
        """Any thread: hand a frame or a call to the owner (BackpressureError, ClosedError)."""

    def call(self, fn: Callable[[], T], timeout: float = 5.0) -> T:
        """Any thread: run fn on the owner and return its result."""

    def send_now(self, frames: Frames) -> bool:
        """Owner only: send at once; False (and counted as dropped) when the peer cannot take it."""

    def send(self, item: Frames | tuple[Frames, Callable[[], None]], timeout: float | None = None) -> None:
        """Any thread: on the owner, send at once (never waiting on its own queue); elsewhere, queue
        it like submit (BackpressureError when the queue stays full, ClosedError after stop)."""

    def request_reconnect(self) -> None:
        """Close the socket and open a new one (role.open_socket, then role.on_connected)."""

    def bundles(self, peer: bytes, yes: bool = True) -> None:
        """Owner only: the peer reads bundles (transport/bundle.py), or no longer does. A client's or
        worker's one peer, its broker, is b"" (the first frame of everything it sends); a broker
        learns its peers from the bundles they send it."""

    def bundle_peers(self) -> int:
        """How many peers are known to read bundles (bounded)."""

    def queue_depth(self) -> int:
        """Items waiting in the outbound queue."""

    @property
    def closing(self) -> bool:
        """True once stop() began."""

    @property
    def user_id(self) -> bytes | None:
        """Owner only: the ZAP user id of the message being handled (CURVE servers)."""

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The ZeroMQ context the socket lives in (the broker's ZAP handler shares it)."""


class LoopFactory(Protocol):
    """How a role makes its transport: OwnerLoop itself, or a StubTransport in tests."""

    def __call__(
        self,
        role: Role,
        *,
        name: str,
        outbound_size: int = ...,
        submit_timeout: float = ...,
        linger: float = ...,
        sched_batch: bool = ...,
        idle_poll: float = ...,
    ) -> Transport: ...
