"""The event publisher's sockets (events.py), opened and answered on its own thread only.

The XPUB is bound with bounded subscriptions (XPUB_MANUAL, MAXMSGSIZE); without CURVE a ZAP socket
of a context of its own names each connection, so its subscriptions count against one peer's share.
"""

from __future__ import annotations

import zmq

from ..transport.security import EVENTS_DOMAIN, curve_server
from .subscriptions import MAX_PREFIX

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # RFC 27: where libzmq asks who a connecting peer is
CURVE_MAXMSG = 1024  # bytes of a frame a CURVE subscriber may send (the handshake's, a boxed subscription)
ZAP_BATCH = 512  # ZAP requests answered per turn

Socket = zmq.Socket[bytes]
Context = zmq.Context[Socket]


def open_xpub(
    ctx: Context, endpoint: str, hwm: int, curve_secret: str | None
) -> tuple[Socket, Socket | None, Context | None]:
    """(the bound XPUB, the ZAP socket without CURVE, the context made for them without CURVE). Under
    CURVE the XPUB is made in `ctx`, the broker's, whose ZAP handler names each key."""
    zap: Socket | None = None
    own: Context | None = None
    try:
        if not curve_secret:
            ctx = own = zmq.Context()
            zap = own.socket(zmq.REP)
            zap.setsockopt(zmq.LINGER, 0)
            zap.bind(ZAP_ENDPOINT)
        sock = ctx.socket(zmq.XPUB)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, hwm)
            sock.setsockopt(zmq.XPUB_MANUAL, 1)
            # NULL mechanism: ZAP names each connection; CURVE: the broker's ZAP handler refuses keys that may not read.
            sock.setsockopt(zmq.ZAP_DOMAIN, EVENTS_DOMAIN)
            if curve_secret:
                # libzmq applies MAXMSGSIZE to the handshake's commands too, and CURVE's INITIATE (about 300
                # bytes) and each boxed message (33 bytes more) pass 1 + MAX_PREFIX: a subscriber would be
                # closed before its first message. The thread refuses a prefix over MAX_PREFIX all the same.
                sock.setsockopt(zmq.MAXMSGSIZE, CURVE_MAXMSG)
                curve_server(sock, curve_secret)
            else:
                sock.setsockopt(zmq.MAXMSGSIZE, 1 + MAX_PREFIX)
            sock.bind(endpoint)
        except zmq.ZMQError:
            sock.close(0)
            raise
    except BaseException:
        if zap is not None:
            zap.close(0)  # (the context's term() would wait on it)
        if own is not None:
            own.term()
        raise
    return sock, zap, own


def answer_zap(zap: Socket, peers_seen: int) -> int:
    """Without CURVE every connection is welcome: the answer only names it, so its subscriptions
    count against one peer's share (a fresh id per connection, never reused). Returns the ids given."""
    for _ in range(ZAP_BATCH):
        try:
            req = zap.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
        if len(req) < 6:  # (only libzmq speaks on this socket; a REP must answer all the same)
            zap.send_multipart([b"1.0", b"", b"500", b"malformed ZAP request", b"", b""])
            continue
        peers_seen += 1
        zap.send_multipart([req[0], req[1], b"200", b"OK", b"c%d" % peers_seen, b""])
    return peers_seen
