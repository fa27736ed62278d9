"""The thread owner (OwnerLoop): only its thread touches the socket, it sleeps without a tick, and reads
bursts in bounded batches. What every owner promises (ordering, bounds, stop, failing handlers) is
asserted once for all of them in test_loop_contract.py."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import zmq
from conftest import wait_for

from zfab.transport.loop import OwnerLoop
from zfab.transport.wire import Frames


class GuardedSocket(zmq.Socket):  # type: ignore[type-arg]
    """Records the thread of every call a loop makes on its socket."""

    touched: set[int]

    def _note(self) -> None:
        type(self).touched.add(threading.get_ident())

    def send(self, *a: Any, **k: Any) -> Any:
        self._note()
        return super().send(*a, **k)

    def recv(self, *a: Any, **k: Any) -> Any:
        self._note()
        return super().recv(*a, **k)

    def setsockopt(self, *a: Any, **k: Any) -> Any:
        self._note()
        return super().setsockopt(*a, **k)

    def getsockopt(self, *a: Any, **k: Any) -> Any:
        self._note()
        return super().getsockopt(*a, **k)

    def close(self, *a: Any, **k: Any) -> Any:
        self._note()
        return super().close(*a, **k)


class EchoRole:
    """A DEALER role that records what it receives; the peer is a ROUTER in the test."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.received: list[Frames] = []
        self.got = threading.Event()
        self.timers = 0

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        return s

    def on_connected(self) -> None:
        pass

    def on_frames(self, frames: Frames) -> None:
        self.received.append(frames)
        self.got.set()

    def on_batch_end(self) -> None:
        pass

    def on_timer(self, now: float) -> float | None:
        self.timers += 1
        return None

    def on_closing(self) -> None:
        pass


@pytest.fixture
def router() -> Any:
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.RCVTIMEO, 3000)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    yield r, f"tcp://127.0.0.1:{port}"
    r.close(0)
    ctx.term()


def test_only_the_owner_thread_touches_the_socket(router: Any) -> None:
    # Given a loop whose context makes guarded sockets
    r, ep = router
    GuardedSocket.touched = set()
    ctx: zmq.Context[Any] = zmq.Context()
    ctx._socket_class = GuardedSocket  # type: ignore[attr-defined]
    role = EchoRole(ep)
    loop = OwnerLoop(role, name="t", context=ctx)
    loop.start()
    # When several other threads submit frames and the peer answers
    senders = [
        threading.Thread(target=lambda i=i: [loop.submit([b"x", str(i).encode()]) for _ in range(50)]) for i in range(4)
    ]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    got = [r.recv_multipart() for _ in range(200)]
    r.send_multipart([got[0][0], b"reply"])
    assert role.got.wait(3)
    loop.stop()
    ctx.term()
    # Then every socket call came from the owner thread, and nothing was lost
    assert GuardedSocket.touched == {loop.owner_ident}
    assert loop.owner_ident not in {t.ident for t in senders}
    assert len(got) == 200
    assert role.received == [[b"reply"]]


def test_idle_loop_sleeps_without_a_tick(router: Any) -> None:
    # Given a started loop with no timers due
    _, ep = router
    role = EchoRole(ep)
    loop = OwnerLoop(role, name="idle")
    loop.start()
    before = role.timers
    # When it idles for a while
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        time.sleep(0.05)
    # Then it ran its timers only a couple of times (no fixed polling tick)
    assert role.timers - before <= 2
    # And a submitted frame still goes out at once (woken through the eventfd)
    r = router[0]
    t0 = time.monotonic()
    loop.submit([b"ping"])
    assert r.recv_multipart()[1:] == [b"ping"]
    assert time.monotonic() - t0 < 0.5
    assert loop.stats.wakeups >= 1
    loop.stop()


class BatchRole(EchoRole):
    """Records how many messages each receive batch handed over."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.batches: list[int] = []
        self._in_batch = 0

    def on_frames(self, frames: Frames) -> None:
        self._in_batch += 1
        super().on_frames(frames)

    def on_batch_end(self) -> None:
        self.batches.append(self._in_batch)
        self._in_batch = 0


def test_bursts_are_read_whole_in_bounded_batches_and_a_lone_message_alone(router: Any) -> None:
    # Given a loop with small receive batches, known to its peer
    r, ep = router
    role = BatchRole(ep)
    loop = OwnerLoop(role, name="burst", batch=16)
    loop.start()
    loop.submit([b"hello"])
    ident = r.recv_multipart()[0]
    # When the peer sends one message, and once it is taken a burst of 100
    r.send_multipart([ident, b"lone"])
    assert role.got.wait(3)
    wait_for(lambda: role.batches == [1], 5.0, what="the lone message's batch")
    # (sent while the owner is held in a queued call, so they pile up in its socket)
    release = threading.Event()

    def hold() -> None:
        release.wait(5)

    loop.submit(hold)
    for i in range(100):
        r.send_multipart([ident, str(i).encode()])
    release.set()
    # Then every message arrives, in order, in batches of at most 16, each closed by on_batch_end,
    # and the pile is read several to a batch (on to the end of the socket's queue)
    wait_for(lambda: len(role.received) == 101 and sum(role.batches) == 101, 5.0, what="all 101 messages")
    loop.stop()
    assert role.received == [[b"lone"]] + [[str(i).encode()] for i in range(100)]
    assert role.batches[0] == 1
    assert max(role.batches) <= 16
    assert len(role.batches) < 50


def test_drops_are_all_counted_and_logged_within_a_budget(caplog: pytest.LogCaptureFixture) -> None:
    # Given an owner whose socket is not open (every send is dropped), its log budget on a fake clock
    from zfab.core.logbudget import LogBudget
    from zfab.transport import owner
    from zfab.transport.stub import FakeClock

    clock = FakeClock()
    loop = OwnerLoop(EchoRole("tcp://127.0.0.1:1"), name="drops")
    loop._drop_log = LogBudget(burst=owner.DROPS_LOGGED_AT_ONCE, per_second=owner.DROPS_LOGGED_PER_SECOND, clock=clock)
    caplog.set_level(logging.WARNING, logger="zfab.transport")
    # When 40 messages are dropped at once
    for _ in range(40):
        assert loop.send_now([b"x"]) is False
    # Then each is counted, the first few logged
    said = [r.getMessage() for r in caplog.records if "dropped an outbound message" in r.getMessage()]
    assert loop.stats.send_dropped == 40 and len(said) == owner.DROPS_LOGGED_AT_ONCE
    # And once the budget refills, the next line says how many were not logged
    clock.advance(1 / owner.DROPS_LOGGED_PER_SECOND)
    loop.send_now([b"x"])
    said = [r.getMessage() for r in caplog.records if "dropped an outbound message" in r.getMessage()]
    assert len(said) == owner.DROPS_LOGGED_AT_ONCE + 1
    assert f"(41 so far, {40 - owner.DROPS_LOGGED_AT_ONCE} of them not logged)" in said[-1]
    loop.stop()
