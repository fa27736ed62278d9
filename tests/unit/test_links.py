"""transport/links.py with wire.py's DEALER: a peer that knows several brokers hears of its first connection.

The monitor must be on the socket before it connects: libzmq reports nothing that happened before its
monitor, and on loopback the handshake can finish within a millisecond of the connect. When it came after,
a client's new socket after a failover sometimes never said hello (the failover check: "no job completed
within 10 s", the API not ready for good)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from conftest import wait_for

from zfab.settings import Settings
from zfab.transport.links import Links
from zfab.transport.wire import dealer_socket

ROUNDS = 40  # sockets made one after another: a monitor attached after the connect missed some of them


class CallingLoop:
    """What Links needs of a loop: calls run at once (on the monitor's thread: enough for a test)."""

    name = "links-test"

    def __init__(self) -> None:
        self.reconnects = 0

    def submit(self, item: Callable[[], Any], timeout: float | None = None) -> None:
        item()

    def request_reconnect(self) -> None:
        self.reconnects += 1


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.term()


def test_the_monitor_is_on_the_socket_before_it_connects(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    seen: list[bytes] = []
    sock = dealer_socket(
        ctx, b"order", Settings(), "tcp://127.0.0.1:1,tcp://127.0.0.1:2", lambda s: seen.append(s.last_endpoint)
    )
    try:
        assert seen == [b""], "watch came after a connect"
        assert sock.last_endpoint.startswith(b"tcp://127.0.0.1:")  # and the connects followed it
    finally:
        sock.close(linger=0)


def test_every_new_socket_hears_its_first_connection_to_the_active_broker(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    closed = ctx.socket(zmq.ROUTER)  # a standby's endpoint: nothing listens there once this is closed
    closed_port = closed.bind_to_random_port("tcp://127.0.0.1")
    closed.close(linger=0)
    brokers = f"tcp://127.0.0.1:{port},tcp://127.0.0.1:{closed_port}"
    loop = CallingLoop()
    ups = threading.Semaphore(0)
    # A peer's `down` does some work (the session marks its broker gone), and watch() calls it before it
    # attaches the monitor: 2 ms of it gave a handshake ample time to come first when the connect did.
    links = Links(loop, up=ups.release, down=lambda: time.sleep(0.002))  # type: ignore[arg-type]
    try:
        for i in range(ROUNDS):
            sock = dealer_socket(ctx, f"peer-{i}".encode(), Settings(), brokers, links.watch)
            try:
                wait_for(lambda: ups.acquire(blocking=False), 10, interval=0.005, what=f"socket {i} hearing it is up")
            finally:
                sock.close(linger=0)
        assert loop.reconnects == 0  # one broker up: no socket took it for another
    finally:
        links.close()
        router.close(linger=0)
