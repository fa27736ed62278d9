"""The broker's ROUTER socket: how it is set up, and why (opened by the owner loop's thread)."""

from __future__ import annotations

from typing import Any

import zmq

from ..core import sizes
from ..errors import SecurityError
from ..settings import Settings
from ..transport import bundle
from ..transport.base import Transport
from ..transport.security import curve_server, is_loopback

RCVHWM = 1000  # messages one peer may have waiting in the ROUTER's receive pipe


def check_bind(s: Settings, endpoint: str) -> None:
    """SecurityError when the settings would let a peer in unchecked: no CURVE beyond loopback
    (without --insecure), half a CURVE setup, or identity handover under CURVE."""
    curve = bool(s.curve_secret)
    if curve != bool(s.curve_clients):
        raise SecurityError("CURVE needs both curve_secret (the broker's key) and curve_clients (accepted keys)")
    if not curve and not s.insecure and not is_loopback(endpoint):
        raise SecurityError(
            f"refusing to bind {endpoint} without CURVE: anyone who reaches it could submit jobs. "
            "Set ZFAB_CURVE_SECRET and ZFAB_CURVE_CLIENTS (see `zfab keys`), or pass --insecure."
        )
    if curve and s.broker_handover:
        raise SecurityError(
            "ZFAB_BROKER_HANDOVER with CURVE would let any peer with a key take another's identity: unset one"
        )
    if s.broker_events and not curve and not s.insecure and not is_loopback(s.broker_events):
        raise SecurityError(f"refusing to bind the events endpoint {s.broker_events} without CURVE")


def loop_figures(loop: Transport) -> dict[str, Any]:
    """What went through the ROUTER and its owner loop (show_broker)."""
    st = loop.stats
    return {
        "outbound_queue_depth": loop.queue_depth(),
        "outbound_queue_capacity": loop.outbound_size,
        "frames_received": st.received,
        "frames_sent": st.sent,
        "frames_send_dropped": st.send_dropped,
        "handler_errors": st.handler_errors,
        # Several messages as one (transport/bundle.py): how many went each way, and malformed ones dropped.
        "bundles_received": st.bundles_received,
        "bundles_sent": st.bundles_sent,
        "bundles_rejected": st.bundles_rejected,
        "bundle_peers": loop.bundle_peers(),
        "bundle_peers_capacity": bundle.PEERS,
        # Idle waits that looked for work before sleeping (transport/idlepoll.py), by what they found.
        "idle_polls_found": st.idle_polls_found,
        "idle_polls_slept": st.idle_polls_slept,
    }


def open_router(
    ctx: zmq.Context[zmq.Socket[bytes]], s: Settings, endpoint: str, *, bind: bool = True
) -> zmq.Socket[bytes]:
    """The bound ROUTER (its LAST_ENDPOINT says where, with an ephemeral port resolved); unbound for a
    standby or deposed broker (term.py): no peer can reach it, so none can give it work."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    # No handover by default: a second connection under an identity in use is ignored by
    # libzmq, so no peer can take another's route (and its frames). zfab peers make a fresh
    # identity per connection, so they never collide with a stale one of their own. A NorFab
    # peer's identity is its name: a NorFab worker that reconnects while its old connection
    # is still open here loses its READY (libzmq drops the new connection's first frames)
    # unless the new connection takes the route over, as NorFab's own broker lets it
    # (ZFAB_BROKER_HANDOVER, refused with CURVE in Broker.start()).
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1 if s.broker_handover else 0)
    # Unroutable sends raise instead of vanishing silently, so they are counted.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # Above the limit: a message a little over it is answered (TOO LARGE) and counted, not the
    # connection of its sender silently dropped by libzmq (core/sizes.py).
    sock.setsockopt(zmq.MAXMSGSIZE, sizes.socket_cap(s.max_message_bytes))
    sock.setsockopt(zmq.SNDHWM, 10_000)
    # Per peer: what one connection may have waiting in libzmq before it is read no further (its
    # sender then waits). 10,000 let one peer's flood of small frames take 13 MB there, which
    # the allocator kept after the flood (issue 31, docs/broker-memory.md).
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    # ZMTP heartbeats drop half-open connections (a peer's host gone), so the identity it held
    # is free again. Twice the hold time: the DISCONNECT a purge sends (at one hold time)
    # still reaches a stopped peer's socket buffer before its connection is closed. A ping
    # per hold time, not per keepalive interval: NFP keepalives already prove live peers, and
    # with 1,000 workers pings every 2.5 s cost the I/O thread a third of its time.
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(s.hold_time * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(2 * s.hold_time * 1000))
    if s.curve_secret:
        curve_server(sock, s.curve_secret)
    if bind:
        sock.bind(endpoint)
    return sock
