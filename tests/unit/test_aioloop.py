"""AioLoop: the event loop's thread is the socket's single owner; sends from it go out at the end of
the loop iteration (or at once, without coalescing); other threads hand over through a bounded
queue and call_soon_threadsafe; timers, reconnects, stop/close, and wait_future's wake-up without a
thread hand-off."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
import zmq
from conftest import wait_for
from test_loop import EchoRole, GuardedSocket

from zfab.errors import BackpressureError, ClosedError
from zfab.transport.aioloop import AioLoop, AioTransport, wait_future
from zfab.transport.wire import Frames

DEADLINE = 5.0  # every wait in these tests ends by then


class AioRole(EchoRole):
    """EchoRole whose received messages also wake coroutines (an asyncio.Event per loop)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.arrived: asyncio.Event | None = None
        self.timer_calls: list[float] = []
        self.next_timer: Callable[[float], float | None] = lambda now: None
        self.opened = 0
        self.closing_called = False
        self.connected_threads: set[int] = set()

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        self.opened += 1
        return super().open_socket(ctx)

    def on_connected(self) -> None:
        self.connected_threads.add(threading.get_ident())

    def on_frames(self, frames: Frames) -> None:
        super().on_frames(frames)
        if self.arrived is not None:
            self.arrived.set()

    def on_timer(self, now: float) -> float | None:
        self.timer_calls.append(now)
        return self.next_timer(now)

    def on_closing(self) -> None:
        self.closing_called = True

    async def wait_received(self, n: int) -> None:
        assert self.arrived is not None
        async with asyncio.timeout(DEADLINE):
            while len(self.received) < n:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
def router() -> Iterator[tuple[zmq.Socket[bytes], str]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.RCVTIMEO, int(DEADLINE * 1000))
    r.setsockopt(zmq.SNDTIMEO, int(DEADLINE * 1000))
    port = r.bind_to_random_port("tcp://127.0.0.1")
    yield r, f"tcp://127.0.0.1:{port}"
    r.close(0)
    ctx.term()


def run(coro: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(4 * DEADLINE):
            await coro()

    asyncio.run(bounded())


def guarded_context() -> zmq.Context[zmq.Socket[bytes]]:
    GuardedSocket.touched = set()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx._socket_class = GuardedSocket  # type: ignore[attr-defined]
    return ctx


async def flushed(t: AioLoop) -> None:
    """Until the loop's pass has sent what this iteration queued."""
    async with asyncio.timeout(DEADLINE):
        while t.queue_depth():
            await asyncio.sleep(0)


@pytest.mark.parametrize("coalesce", [True, False])
def test_send_on_the_loop_and_replies_are_read_on_it(router: Any, coalesce: bool) -> None:
    r, ep = router
    ctx = guarded_context()

    async def main() -> None:
        # Given a transport started from a coroutine, its socket owned by the loop's thread
        role = AioRole(ep)
        role.arrived = asyncio.Event()
        t = AioLoop(role, name="t", context=ctx, coalesce=coalesce)
        t.start()
        assert t.started.is_set() and t.owner_ident == threading.get_ident()
        # When the loop's thread sends three frames (no await in between)
        for word in (b"hello", b"there", b"you"):
            t.send([word])
        if coalesce:
            # Then they wait for the end of this loop iteration, and go out together, in order
            assert t.queue_depth() == 3 and t.stats.sent == 0
            await flushed(t)
        # (or, without coalescing, they left at once: nothing queued)
        assert t.queue_depth() == 0 and t.stats.sent == 3
        got = [r.recv_multipart() for _ in range(3)]
        assert [m[1] for m in got] == [b"hello", b"there", b"you"]
        ident = got[0][0]
        # And the peer's replies arrive on the loop (read through add_reader, in order)
        for i in range(3):
            r.send_multipart([ident, b"reply", str(i).encode()])
        await role.wait_received(3)
        assert role.received == [[b"reply", b"0"], [b"reply", b"1"], [b"reply", b"2"]]
        await t.astop()
        # And only the loop's thread ever touched the socket, which it closed
        assert GuardedSocket.touched == {threading.get_ident()}
        assert t.stopped.is_set() and role.closing_called

    run(main)
    ctx.term()


def test_other_threads_hand_over_and_only_the_loop_touches_the_socket(router: Any) -> None:
    r, ep = router
    ctx = guarded_context()

    async def main() -> None:
        role = AioRole(ep)
        t = AioLoop(role, name="t", context=ctx)
        await t.astart()
        # When four other threads submit 50 frames each (and one a frame with a follow-up)
        follow_up = threading.Event()
        threads = [
            threading.Thread(target=lambda i=i: [t.submit([b"x", str(i).encode()]) for _ in range(50)])
            for i in range(4)
        ]
        threads.append(threading.Thread(target=lambda: t.send(([b"last"], follow_up.set))))
        for th in threads:
            th.start()
        await asyncio.to_thread(lambda: [th.join(DEADLINE) for th in threads])
        # Then the peer gets all 201 (read on a worker thread: the loop must run meanwhile)
        got = await asyncio.to_thread(lambda: [r.recv_multipart() for _ in range(201)])
        assert sorted(m[1] for m in got).count(b"x") == 200
        assert follow_up.is_set()
        # Woken once per burst, not once per frame
        assert 1 <= t.stats.wakeups <= 201
        await t.astop()
        assert GuardedSocket.touched == {t.owner_ident}
        assert t.owner_ident not in {th.ident for th in threads}

    run(main)
    ctx.term()


def test_full_queue_backpressure_on_the_loop_and_from_other_threads() -> None:
    async def main() -> None:
        # Given a transport whose peer never answers and a queue of two
        t = AioLoop(AioRole("tcp://127.0.0.1:1"), name="bp", outbound_size=2, submit_timeout=0.05)
        t.start()
        # When the loop's thread queues calls (they run at the next pass) up to the bound
        ran: list[int] = []
        t.submit(lambda: ran.append(1))
        t.submit(lambda: ran.append(2))
        # Then one more fails at once: waiting would block the only thread that drains the queue
        with pytest.raises(BackpressureError, match="outbound queue full"):
            t.submit(lambda: ran.append(3))
        # And another thread, with the loop blocked, waits its timeout and then fails too
        release = threading.Event()
        blocked = threading.Event()
        outcome: list[BaseException | None] = []

        def other() -> None:
            assert blocked.wait(DEADLINE)
            try:
                t.submit([b"x"])
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
            release.set()

        th = threading.Thread(target=other)
        th.start()
        blocked.set()
        assert release.wait(DEADLINE)  # the loop is blocked here on purpose: nothing drains
        th.join(DEADLINE)
        assert isinstance(outcome[0], BackpressureError)
        # Once the loop runs again the queued calls run, in order, and there is room again
        async with asyncio.timeout(DEADLINE):
            while ran != [1, 2]:
                await asyncio.sleep(0)
        await asyncio.to_thread(t.submit, [b"y"])
        await t.astop()

    run(main)


def test_stop_flushes_then_refuses_and_closes_on_the_loop(router: Any) -> None:
    r, ep = router
    ctx = guarded_context()

    async def main() -> None:
        role = AioRole(ep)
        t = AioLoop(role, name="stop", context=ctx, linger=2.0)
        t.start()
        # Given frames another thread queued while the loop was busy (not yet drained)
        th = threading.Thread(target=lambda: [t.submit([b"q", str(i).encode()]) for i in range(20)])
        th.start()
        th.join(DEADLINE)
        assert t.queue_depth() == 20
        # When the loop stops
        await t.astop()
        # Then what was queued went out before the socket closed, and the role said its last words
        got = [r.recv_multipart()[1:] for _ in range(20)]
        assert got == [[b"q", str(i).encode()] for i in range(20)]
        assert role.closing_called and t.stopped.is_set() and t.closing
        # And nothing more is accepted, from the loop's thread or any other
        with pytest.raises(ClosedError):
            t.submit([b"late"])
        with pytest.raises(ClosedError):
            await asyncio.to_thread(t.send, [b"late"])
        with pytest.raises(ClosedError):
            t.start()
        assert GuardedSocket.touched == {threading.get_ident()}
        await t.astop()  # a second stop is harmless

    run(main)
    ctx.term()


def test_stop_from_another_thread_and_synchronously_on_the_loop(router: Any) -> None:
    _, ep = router

    async def main() -> None:
        # From another thread while the loop runs: it runs the stop on the loop and waits for it
        a = AioLoop(AioRole(ep), name="a")
        a.start()
        await asyncio.to_thread(a.stop)
        assert a.stopped.is_set()
        # On the loop's thread, without await (a sync close in a coroutine)
        b = AioLoop(AioRole(ep), name="b")
        b.start()
        b.submit(lambda: None)
        b.stop()
        assert b.stopped.is_set() and b.queue_depth() == 0

    run(main)
    # Once the loop is gone, stop tears down from the caller (the owner is gone)
    c = AioLoop(AioRole(ep), name="c")
    c.stop()
    assert c.stopped.is_set()


def test_timers_fire_at_the_deadline_the_role_returns() -> None:
    async def main() -> None:
        role = AioRole("tcp://127.0.0.1:1")
        fired = asyncio.Event()
        due: list[float] = []

        def next_timer(now: float) -> float | None:
            if due and now >= due[0]:
                fired.set()
                return None
            if not due:
                due.append(now + 0.05)
            return due[0]

        role.next_timer = next_timer
        t = AioLoop(role, name="timers")
        t.start()
        async with asyncio.timeout(DEADLINE):
            await fired.wait()
        assert role.timer_calls[-1] >= due[0]
        # No fixed tick: once no deadline is returned, no timer is left to wake the loop
        assert t._timer is None
        await t.astop()

    run(main)


def test_reconnect_opens_a_new_socket_and_keeps_working(router: Any) -> None:
    r, ep = router

    async def main() -> None:
        role = AioRole(ep)
        role.arrived = asyncio.Event()
        t = AioLoop(role, name="re")
        t.start()
        t.send([b"one"])
        await flushed(t)
        first = r.recv_multipart()
        # When another thread asks for a reconnect
        await asyncio.to_thread(t.request_reconnect)
        async with asyncio.timeout(DEADLINE):
            while t.stats.reconnects < 1:
                await asyncio.sleep(0)
        # Then a new socket was opened (on the loop) and it sends and receives
        assert role.opened == 2 and role.connected_threads == {threading.get_ident()}
        t.send([b"two"])
        await flushed(t)
        second = r.recv_multipart()
        assert second[1] == b"two" and second[0] != first[0]  # a new connection, a new routing id
        r.send_multipart([second[0], b"back"])
        await role.wait_received(1)
        await t.astop()

    run(main)


def test_start_from_another_thread_and_the_factory(router: Any) -> None:
    r, ep = router
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        t = AioTransport(loop=loop, batch=16)(AioRole(ep), name="f", outbound_size=5)
        assert t.batch == 16 and t.outbound_size == 5
        t.start()  # from this thread: the loop opens the socket, this waits for it
        assert t.owner_ident == runner.ident
        assert t.call(threading.get_ident) == runner.ident
        t.submit([b"ping"])
        assert r.recv_multipart()[1] == b"ping"
        t.stop()
        assert t.stopped.is_set()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(DEADLINE)
        loop.close()
    with pytest.raises(RuntimeError, match="event loop"):
        AioLoop(AioRole(ep), name="nowhere").start()  # no running loop and none given


def test_wait_future_wakes_from_the_loop_and_from_other_threads() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        # Completed on the loop's thread: woken without call_soon_threadsafe
        here: Future[int] = Future()
        loop.call_soon(here.set_result, 1)
        calls: list[str] = []
        real = loop.call_soon_threadsafe

        def counting(*a: Any, **k: Any) -> Any:
            calls.append("threadsafe")
            return real(*a, **k)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        try:
            assert await wait_future(here, DEADLINE)
        finally:
            loop.call_soon_threadsafe = real  # type: ignore[method-assign]
        assert calls == []
        # Completed on another thread
        there: Future[int] = Future()
        timer = threading.Timer(0.01, there.set_result, (2,))
        timer.start()
        assert await wait_future(there, DEADLINE)
        timer.join(DEADLINE)
        # Done already, a zero bound, and a bound that passes (the future is not cancelled)
        assert await wait_future(here, 0)
        never: Future[int] = Future()
        assert not await wait_future(never, 0)
        t0 = time.monotonic()
        assert not await wait_future(never, 0.05)
        assert time.monotonic() - t0 >= 0.04 and not never.cancelled()

    run(main)


@pytest.mark.parametrize("coalesce", [True, False])
def test_a_lone_reply_after_an_owner_send_is_not_missed(router: Any, coalesce: bool) -> None:
    """A send on the loop may consume the FD's edge of a message that arrived meanwhile; the pass
    after the send re-reads ZMQ_EVENTS, so the reply is read without waiting for another one."""
    r, ep = router

    async def main() -> None:
        role = AioRole(ep)
        role.arrived = asyncio.Event()
        t = AioLoop(role, name="edge", coalesce=coalesce)
        t.start()
        t.send([b"hi"])
        await flushed(t)
        ident = r.recv_multipart()[0]
        for i in range(50):
            r.send_multipart([ident, str(i).encode()])
            # Reading ZMQ_EVENTS here, as a send does, processes the pending command: no edge left on the FD
            wait_for(lambda: bool(t.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN), DEADLINE, 0.001, "the reply")
            t.send([b"tick"])
            await role.wait_received(i + 1)
        await t.astop()

    run(main)
