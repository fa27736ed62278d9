"""Socket plumbing shared by the owner loops: fast multipart send/recv, the OS wake
descriptor, and the DEALER setup clients and workers have in common."""

from __future__ import annotations

from collections.abc import Callable

import zmq

from ..core.sizes import socket_cap
from ..errors import SecurityError
from ..settings import Settings
from .base import Frames
from .links import endpoints, several
from .security import curve_client

_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
COPY_LIMIT = 65536  # larger frames go zero-copy
RECONNECT_MAX_MS = 2000  # ZMQ_RECONNECT_IVL_MAX: a lost broker is tried again at least this often
FAILOVER_RECONNECT_MAX_MS = 500  # ZMQ_RECONNECT_IVL_MAX when ZFAB_BROKER lists several brokers
_BASE_SEND = zmq.Socket.__mro__[1].send  # type: ignore[attr-defined]  # the Cython send, under pyzmq's wrapper


class Wire:
    """Multipart send/recv with the socket's methods looked up once.

    pyzmq's send_multipart/recv_multipart re-check every frame and build flag enums
    on each call; on the hot path this halves the cost per message. ZeroMQ takes a
    multipart message atomically, so Again or EHOSTUNREACH can only come from the
    first frame.
    """

    __slots__ = ("_get", "_recv", "_send", "meta", "user_id")

    def __init__(self, sock: zmq.Socket[bytes], meta: bool = False) -> None:
        # pyzmq's Python-level send only adds routing-id/group handling we never use, at about a
        # microsecond per frame: the Cython send underneath is taken directly, unless a subclass
        # overrides send (the tests' guarded socket records every call).
        self._send = _BASE_SEND.__get__(sock) if type(sock).send is zmq.Socket.send else sock.send
        self._recv = sock.recv
        self._get = sock.getsockopt
        self.meta = meta  # read the ZAP user id of each message (CURVE brokers)
        self.user_id: bytes | None = None

    def send(self, frames: Frames) -> None:
        send = self._send
        last = len(frames) - 1
        for i in range(last):
            f = frames[i]
            # A large frame goes zero-copy wherever it stands: a POST's body comes before its
            # flags frame, and the broker's dispatch puts a meta frame after the body.
            if len(f) < COPY_LIMIT:
                send(f, _SNDMORE | _NOBLOCK)
            else:
                send(f, _SNDMORE | _NOBLOCK, copy=False)
        send(frames[last], _NOBLOCK, copy=len(frames[last]) < COPY_LIMIT)

    def recv(self) -> Frames:
        # Frames (copy=False) carry their `more` flag: no RCVMORE getsockopt per frame, which
        # makes a 9-frame message 30 % cheaper to receive even with the copy out of each.
        recv = self._recv
        first = recv(_NOBLOCK, copy=False)
        if self.meta:
            user = first.get("User-Id")
            self.user_id = user.encode() if isinstance(user, str) else None
        frames: Frames = [first.bytes]
        more = first.more
        while more:
            f = recv(_NOBLOCK, copy=False)
            # A large frame stays in ZeroMQ's buffer (the memoryview keeps the message alive): the
            # broker hands a 10 MB body on without a copy. Small ones become bytes, which are
            # cheaper to hash, compare and keep than a view that pins a message.
            frames.append(f.bytes if len(f) < COPY_LIMIT else f.buffer)
            more = f.more
        return frames

    def readable(self) -> bool:
        return bool(int(self._get(_EVENTS)) & _POLLIN)


def dealer_socket(
    ctx: zmq.Context[zmq.Socket[bytes]],
    identity: bytes,
    settings: Settings,
    endpoint: str,
    watch: Callable[[zmq.Socket[bytes]], object] | None = None,
) -> zmq.Socket[bytes]:
    """A client's or worker's DEALER: identity, bounds, fast reconnects, CURVE when configured. `watch`
    (links.py's monitor of several brokers) gets the socket before it connects: libzmq reports no event that
    came before its monitor, and a loopback handshake can come within a millisecond of the connect."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, socket_cap(settings.max_message_bytes))  # answered past the limit
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
    if settings.curve_secret or settings.curve_server_key:
        if not (settings.curve_secret and settings.curve_server_key):
            raise SecurityError("CURVE needs both curve_secret (own key) and curve_server_key (the broker's)")
        curve_client(sock, settings.curve_secret, settings.curve_server_key)
    if several(endpoint):
        # Every broker's endpoint; only the active one is bound (docs/failover.md). IMMEDIATE: a message goes
        # only over a connection that is up, never into the pipe of a broker that is not there. A short
        # reconnect ceiling finds a new active broker within half a second (a standby's closed port costs a
        # refused connect twice a second).
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, FAILOVER_RECONNECT_MAX_MS)
        if watch is not None:
            watch(sock)
        for one in endpoints(endpoint):
            sock.connect(one)
        return sock
    sock.connect(endpoint)
    return sock
