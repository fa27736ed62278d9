"""A DEALER that knows several brokers (ZFAB_BROKER=tcp://a:5555,tcp://b:5555): what its connections do.

Only the active broker binds its endpoint (docs/failover.md), and the DEALER connects to every endpoint with
ZMQ_IMMEDIATE, so its messages go only over a connection that is up: to the active broker. libzmq says when a
connection comes up or ends through a socket monitor; a small thread of the peer's own reads the monitor's
PAIR socket (which only it touches) and hands each event to the peer's loop (`loop.submit` of a call), so the
peer's socket stays with its one owner. The peer hears `up()` at the first connection of a socket, where it
says hello (READY, a keepalive); a later connection is another broker: the peer reconnects (a new socket and
identity) as after a broker restart, and re-establishes its jobs; and `down()` when no connection is left (a
kill -9 is seen at once).
One endpoint (the default) makes no watcher: nothing changes for it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import ZfabError
from .base import Transport

log = logging.getLogger(__name__)

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
POLL_MS = 500  # the watcher looks at its stop flag this often (the monitor's own end stops it at once)


def endpoints(broker: str) -> list[str]:
    """The endpoints of a ZFAB_BROKER that may list several, comma-separated."""
    return [e.strip() for e in broker.split(",") if e.strip()]


def several(broker: str) -> bool:
    return "," in broker and len(endpoints(broker)) > 1


class Links:
    """The connections of one peer's DEALER to its brokers; `watch` each new socket (owner thread)."""

    def __init__(self, loop: Transport, up: Callable[[], None], down: Callable[[], None]) -> None:
        self.loop, self._up, self._down = loop, up, down
        self.generation = 0  # one per socket: a late event of an old socket changes nothing
        self.connected = 0  # connections up on the current socket
        self.first = True  # the current socket has not had a connection yet
        self.changes = 0  # connections that came up after the first (a broker change each)
        self._stop: threading.Event | None = None

    def watch(self, sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        """A new socket: its events from now on (no connection is up yet: `down`). Returns it."""
        self._down()
        if self._stop is not None:
            self._stop.set()
        self.generation += 1
        self.connected, self.first = 0, True
        mon = sock.get_monitor_socket(EVENTS, f"inproc://zfab-links-{id(self):x}-{self.generation}")
        stop = self._stop = threading.Event()
        gen = self.generation
        threading.Thread(target=self._read, args=(mon, stop, gen), name="zfab-links", daemon=True).start()
        return sock

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _read(self, mon: zmq.Socket[bytes], stop: threading.Event, gen: int) -> None:
        try:
            while not stop.is_set():
                if not mon.poll(POLL_MS):
                    continue
                event = recv_monitor_message(mon)["event"]
                if event == zmq.EVENT_MONITOR_STOPPED:
                    return
                try:
                    self.loop.submit(functools.partial(self._event, gen, int(event)))
                except ZfabError:  # the peer is closing
                    return
        except zmq.ZMQError:  # the context is ending
            return
        finally:
            mon.close(linger=0)

    def _event(self, gen: int, event: int) -> None:
        """Owner thread."""
        if gen != self.generation:
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected += 1
            first, self.first = self.first, False
            if first:
                self._up()
            else:  # another broker is active: a new socket meets it, as after a broker restart
                log.warning("%s: another broker is active; reconnecting to it", self.loop.name)
                self.changes += 1
                self.loop.request_reconnect()
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            self.connected -= 1
            if not self.connected:
                self._down()
