"""One contract, three owners: the thread owner (OwnerLoop), the event-loop owner (AioLoop) and the stub
that roles are unit-tested on (StubLoop) keep the same promises to a role and to other threads.

Each test runs against every owner through a small harness that plays the peer (a ROUTER on
127.0.0.1 for the real owners; the stub's feed and take for the stub) and says how to wait (a
deadline for the real owners; the stub runs what is queued when asked). As pyzmq's zmq/auth tests
run one abstract suite against each authenticator adapter, behaviour an owner shares lives here;
what only one of them does (coalescing on the event loop, sleeping without a tick, the guarded
socket) stays in test_loop.py and test_aioloop.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import pytest
import zmq
from conftest import wait_for

from zfab.errors import BackpressureError, ClosedError
from zfab.transport import AioLoop, FakeClock, OwnerLoop, StubLoop, StubTransport, Transport, bundle
from zfab.transport.base import Frames

DEADLINE = 5.0  # every wait here ends by then


class ContractRole:
    """A DEALER role that says hello on every connect and goodbye at close, records what it is handed
    and on which thread, raises on a b"boom" message, and runs a timer when asked (`due_in`)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.loop: Transport | None = None
        self.received: list[Frames] = []
        self.batch_ends = 0
        self.connected = 0
        self.closed = 0
        self.threads: set[int] = set()
        self.due_in: float | None = None  # on_timer's next call sets a deadline this far ahead
        self.due: float | None = None
        self.fired: list[tuple[float, float]] = []  # (deadline, the time the timer ran at)
        self.timer_raises = False

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        return s

    def on_connected(self) -> None:
        self.threads.add(threading.get_ident())
        self.connected += 1
        assert self.loop is not None
        self.loop.send_now([b"hello", str(self.connected).encode()])

    def on_frames(self, frames: Frames) -> None:
        self.threads.add(threading.get_ident())
        if frames == [b"boom"]:
            raise RuntimeError("a handler bug")
        self.received.append(frames)

    def on_batch_end(self) -> None:
        self.batch_ends += 1

    def on_timer(self, now: float) -> float | None:
        self.threads.add(threading.get_ident())
        if self.timer_raises:
            self.timer_raises = False
            raise RuntimeError("a timer bug")
        if self.due_in is not None:
            self.due, self.due_in = now + self.due_in, None
        if self.due is not None and now >= self.due:
            self.fired.append((self.due, now))
            self.due = None
        return self.due

    def on_closing(self) -> None:
        self.closed += 1
        assert self.loop is not None
        self.loop.send_now([b"bye"])


class Harness:
    """How a test drives one kind of owner and plays its peer."""

    real = True  # a socket and an owner of its own (False: the stub, driven by the test's thread)

    def make(self, role: ContractRole, **options: Any) -> Transport:
        """The owner of `role`'s socket, started; the role's hello has been read."""
        raise NotImplementedError

    def peer_send(self, *messages: Frames) -> None:
        raise NotImplementedError

    def peer_recv(self, n: int) -> list[Frames]:
        """The next n messages the role sent, in order."""
        raise NotImplementedError

    def until(self, cond: Callable[[], bool], what: str) -> None:
        wait_for(cond, DEADLINE, 0.002, what)

    def later(self, seconds: float) -> None:
        """Time passes (the real owners' clocks move by themselves)."""

    def hold(self, t: Transport) -> AbstractContextManager[None]:
        """Keep the owner busy (in a queued call) so nothing queued is drained meanwhile."""
        return _held(t)

    def close(self) -> None:
        pass


@contextmanager
def _held(t: Transport) -> Iterator[None]:
    running, release = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(DEADLINE)

    t.submit(hold)
    assert running.wait(DEADLINE), "the owner never ran the holding call"
    try:
        yield
    finally:
        release.set()


class RouterPeer(Harness):
    """A ROUTER on 127.0.0.1 playing the peer of a real owner."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVTIMEO, int(DEADLINE * 1000))
        self.router.setsockopt(zmq.SNDTIMEO, int(DEADLINE * 1000))
        self.endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.ident = b""
        self.transports: list[Transport] = []

    def started(self, t: Transport, role: ContractRole) -> Transport:
        role.loop = t
        t.start()
        self.transports.append(t)
        assert self.peer_recv(1)[0][0] == b"hello"
        return t

    def peer_send(self, *messages: Frames) -> None:
        for m in messages:
            self.router.send_multipart([self.ident, *m])

    def peer_recv(self, n: int) -> list[Frames]:
        out = []
        for _ in range(n):
            ident, *frames = self.router.recv_multipart()
            if frames[0] == b"hello":
                self.ident = ident  # a new connection has a new routing id
            out.append(frames)
        return out

    def close(self) -> None:
        for t in self.transports:
            t.stop()
        self.router.close(0)
        self.ctx.term()


class ThreadOwner(RouterPeer):
    def make(self, role: ContractRole, **options: Any) -> Transport:
        return self.started(OwnerLoop(role, name="contract", **options), role)


class EventLoopOwner(RouterPeer):
    """AioLoop on an event loop run by a thread of its own: the test's thread is another thread to it."""

    def __init__(self) -> None:
        super().__init__()
        self.evloop = asyncio.new_event_loop()
        self.runner = threading.Thread(target=self.evloop.run_forever, name="contract-aio")
        self.runner.start()

    def make(self, role: ContractRole, **options: Any) -> Transport:
        return self.started(AioLoop(role, name="contract", loop=self.evloop, **options), role)

    def close(self) -> None:
        super().close()
        self.evloop.call_soon_threadsafe(self.evloop.stop)
        self.runner.join(DEADLINE)
        self.evloop.close()


class Stub(Harness):
    """The stub transport; the test's thread plays the owner, and the peer is its feed and take."""

    real = False

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.factory = StubTransport(self.clock, strict=False)  # strict mode: test_the_stub_is_strict_*
        self.loop: StubLoop | None = None
        self.inbox: list[Frames] = []
        self.endpoint = "tcp://127.0.0.1:1"  # configured on a fake socket: nothing connects

    def make(self, role: ContractRole, **options: Any) -> Transport:
        options.pop("batch", None)
        role.loop = self.loop = self.factory(role, name="contract", **options)
        self.loop.start()
        assert self.peer_recv(1)[0][0] == b"hello"
        return self.loop

    def peer_send(self, *messages: Frames) -> None:
        assert self.loop is not None
        self.loop.feed(*messages)

    def peer_recv(self, n: int) -> list[Frames]:
        assert self.loop is not None
        self.inbox += self.loop.take()
        assert len(self.inbox) >= n, f"the role sent {len(self.inbox)} messages, not {n}"
        out, self.inbox = self.inbox[:n], self.inbox[n:]
        return out

    def until(self, cond: Callable[[], bool], what: str) -> None:
        assert self.loop is not None
        if not self.loop.stopped.is_set():
            self.loop.tick()  # the owner runs what was queued, and its timers
        assert cond(), f"not so: {what}"

    def later(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def hold(self, t: Transport) -> AbstractContextManager[None]:
        return nullcontext()  # nothing drains the stub's queue until the test asks


@pytest.fixture(params=[ThreadOwner, EventLoopOwner, Stub], ids=["thread", "event-loop", "stub"])
def owner(request: pytest.FixtureRequest) -> Iterator[Harness]:
    h: Harness = request.param()
    yield h
    h.close()


def test_frames_from_other_threads_go_out_in_order_and_replies_come_in_in_order(owner: Harness) -> None:
    # Given a started owner
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)
    # When four threads each hand it 50 frames
    threads = [
        threading.Thread(target=lambda i=i: [t.submit([b"x", b"%d" % i, b"%d" % j]) for j in range(50)])
        for i in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(DEADLINE)
    # Then the peer gets all 200, each thread's in the order it handed them over
    got = owner.peer_recv(200)
    for i in range(4):
        assert [int(m[2]) for m in got if m[1] == b"%d" % i] == list(range(50))
    # And the peer's messages reach the role in the order sent, on the owner's thread only
    owner.peer_send(*[[b"reply", b"%d" % k] for k in range(3)])
    owner.until(lambda: len(role.received) == 3, "three replies")
    assert role.received == [[b"reply", b"0"], [b"reply", b"1"], [b"reply", b"2"]]
    owner.until(lambda: role.batch_ends >= 1, "the batch's end")  # the owner's thread calls it after the batch
    assert role.threads == {t.owner_ident}


def test_the_owner_sends_at_once_and_call_runs_there(owner: Harness) -> None:
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)
    followed: list[int] = []

    def on_owner() -> int:
        t.send([b"direct"])
        t.send(([b"then"], lambda: followed.append(threading.get_ident())))
        return threading.get_ident()

    # When a call runs on the owner, sending a frame and a frame with a follow-up
    assert t.call(on_owner) == t.owner_ident
    # Then both went out in order, and the follow-up ran on the owner once its frame was sent
    assert owner.peer_recv(2) == [[b"direct"], [b"then"]]
    owner.until(lambda: followed == [t.owner_ident], "the follow-up, on the owner")
    # And what the call raises is raised to its caller
    with pytest.raises(ZeroDivisionError):
        t.call(lambda: 1 // 0)


def test_timers_run_at_the_deadline_the_role_returns(owner: Harness) -> None:
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)

    def arm() -> None:
        role.due_in = 0.05

    # When the role asks for a timer 50 ms ahead (on the owner, which then looks at its timers)
    t.call(arm)
    owner.until(lambda: role.due is not None, "the deadline set")
    owner.later(0.05)
    # Then its timer runs once, no earlier than the deadline
    owner.until(lambda: len(role.fired) == 1, "the timer")
    due, ran = role.fired[0]
    assert ran >= due
    # And a timer handler that raises is counted, and timers go on
    t.call(lambda: setattr(role, "timer_raises", True))
    owner.until(lambda: t.stats.handler_errors == 1, "the failed timer counted")
    t.call(arm)
    owner.until(lambda: role.due is not None, "a new deadline")
    owner.later(0.05)
    owner.until(lambda: len(role.fired) == 2, "the next timer")


def test_a_frame_from_another_thread_wakes_an_idle_owner(owner: Harness) -> None:
    # Given an owner with no timer due (it sleeps until woken)
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)
    owner.until(lambda: role.due is None, "idle")
    # When another thread hands it a frame
    th = threading.Thread(target=t.submit, args=([b"wake"],))
    th.start()
    th.join(DEADLINE)
    # Then it goes out without any timer falling due
    assert owner.peer_recv(1) == [[b"wake"]]
    if owner.real:
        assert t.stats.wakeups >= 1  # woken by the hand-over (the stub has no sleeping owner)


def test_a_full_queue_says_busy_and_a_stopped_owner_refuses(owner: Harness) -> None:
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role, outbound_size=3, submit_timeout=0.05)
    # Given an owner that drains nothing for now
    with owner.hold(t):
        for i in range(3):
            t.submit([b"q", b"%d" % i])
        assert t.queue_depth() == 3
        # When one more frame is handed over, it is refused (after at most the submit timeout)
        with pytest.raises(BackpressureError, match="outbound queue full"):
            t.submit([b"late"])
    # Then once the owner drains, what was accepted goes out, and there is room again
    assert owner.peer_recv(3) == [[b"q", b"%d" % i] for i in range(3)]
    owner.until(lambda: t.queue_depth() == 0, "an empty queue")
    t.submit([b"room"])
    assert owner.peer_recv(1) == [[b"room"]]


def test_stop_flushes_what_was_accepted_says_last_words_then_refuses(owner: Harness) -> None:
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role, linger=2.0)
    # Given frames accepted but not yet sent
    with owner.hold(t):
        for i in range(20):
            t.submit([b"q", b"%d" % i])
    # When the owner stops
    t.stop()
    # Then everything accepted went out, in order, before the role's last words
    assert owner.peer_recv(21) == [[b"q", b"%d" % i] for i in range(20)] + [[b"bye"]]
    assert t.stopped.is_set() and t.closing and role.closed == 1
    # And nothing more is accepted, from any thread
    with pytest.raises(ClosedError):
        t.submit([b"late"])
    refused: list[BaseException] = []
    th = threading.Thread(target=lambda: _catch(lambda: t.send([b"late"]), refused))
    th.start()
    th.join(DEADLINE)
    assert len(refused) == 1 and isinstance(refused[0], ClosedError)
    # And a second stop is harmless
    t.stop()
    assert role.closed == 1


def test_a_malformed_message_its_handler_raises_on_is_counted_and_the_loop_goes_on(owner: Harness) -> None:
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)
    # When a message the role cannot read makes its handler raise, and a queued call raises too
    owner.peer_send([b"boom"], [b"after"])
    owner.until(lambda: role.received == [[b"after"]], "the message after the bad one")
    t.submit(lambda: 1 // 0 and None)
    t.submit([b"still"])
    # Then each is counted, and what follows is handled and sent
    assert owner.peer_recv(1) == [[b"still"]]
    owner.until(lambda: t.stats.handler_errors == 2, "both failures counted")
    owner.peer_send([b"fine"])
    owner.until(lambda: role.received == [[b"after"], [b"fine"]], "the next message")


def test_a_reconnect_opens_a_new_socket_that_works(owner: Harness) -> None:
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)
    # When another thread asks for a new connection
    th = threading.Thread(target=t.request_reconnect)
    th.start()
    th.join(DEADLINE)
    # Then the role opened a new socket (on the owner) and said hello on it
    owner.until(lambda: t.stats.reconnects == 1, "the reconnect")
    assert owner.peer_recv(1) == [[b"hello", b"2"]]
    assert role.connected == 2 and role.threads == {t.owner_ident}
    # And it sends and receives as before
    t.submit([b"again"])
    assert owner.peer_recv(1) == [[b"again"]]
    owner.peer_send([b"back"])
    owner.until(lambda: role.received == [[b"back"]], "a reply on the new socket")


def test_the_stub_is_strict_by_default_once_the_batch_is_done() -> None:
    # Given a stub made the way role tests make it
    clock = FakeClock()
    role = ContractRole("tcp://127.0.0.1:1")
    loop = StubTransport(clock)(role, name="strict")
    role.loop = loop
    loop.start()
    # When a handler raises in the middle of a batch
    with pytest.raises(RuntimeError, match="a handler bug"):
        loop.feed([b"one"], [b"boom"], [b"two"])
    # Then the test hears of it, but only after the batch ran to its end, as the real owners run it
    assert role.received == [[b"one"], [b"two"]] and role.batch_ends == 1
    assert loop.stats.handler_errors == 1
    # And the error is raised once: the stub goes on
    loop.feed([b"three"])
    assert role.received[-1] == [b"three"]


def _catch(fn: Callable[[], None], into: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:
        into.append(exc)


@pytest.fixture(params=[ThreadOwner, EventLoopOwner], ids=["thread", "event-loop"])
def real_owner(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The owners with a wire (the stub hands over what it is fed, and records what is sent, message by message)."""
    h: Harness = request.param()
    yield h
    h.close()


def test_a_bundle_reaches_the_role_as_its_messages_and_a_step_sends_its_peer_one(real_owner: Harness) -> None:
    """transport/bundle.py: on either real owner, a bundle from the peer is handed over as the messages it
    carried, in order; told the peer reads them, what one step sends goes as one."""
    owner = real_owner
    role = ContractRole(getattr(owner, "endpoint", ""))
    t = owner.make(role)
    p = bundle.Pending()
    for k in range(5):
        assert p.add([b"", b"in", b"%d" % k], 0)
    owner.peer_send(p.message([]))
    owner.until(lambda: len(role.received) == 5, "the bundle's five messages")
    assert role.received == [[b"", b"in", b"%d" % k] for k in range(5)]
    t.call(lambda: t.bundles(b""))  # (a role does this when its broker says it reads them)
    t.call(lambda: [t.send([b"", b"out", b"%d" % k]) for k in range(5)])  # one step: a queued call
    (got,) = owner.peer_recv(1)
    assert bundle.is_bundle(got) and bundle.unpack(got) == [[b"", b"out", b"%d" % k] for k in range(5)]
    # The owner counts a bundle once the socket took it, which may be after the peer has it: waited for.
    owner.until(lambda: t.stats.bundles_sent == 1, "the bundle sent counted")
    assert t.stats.bundles_received == 1
