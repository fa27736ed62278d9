"""Polling before sleeping (transport/idlepoll.py, ZFAB_BROKER_IDLE_POLL_US): the window widens while
messages come soon after a sleep, keeps while a poll finds them, halves while waits are long and closes
on a busy host; a loop that polls takes work its poll finds and, idle, polls once and then sleeps; only
the broker's owner polls, and 0 turns it off."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from test_loop import EchoRole, router  # noqa: F401  (the fixture)

from zfab.broker.broker import Broker
from zfab.settings import Settings
from zfab.transport.base import Frames
from zfab.transport.idlepoll import GROW_START, IdlePoll
from zfab.transport.loop import OwnerLoop
from zfab.transport.stub import StubTransport

LIMIT = 500e-6


def test_a_short_sleep_widens_the_window_by_doubling_up_to_the_limit() -> None:
    ip = IdlePoll(LIMIT)
    widths = []
    for _ in range(8):
        ip.settle(waited=min(LIMIT, ip.window + 50e-6), polled=ip.window, ran=ip.window)  # slept, woken soon
        widths.append(ip.window)
    assert widths[0] == GROW_START
    assert widths[1] == 2 * GROW_START
    assert widths[-1] == LIMIT
    assert widths == sorted(widths)


def test_a_poll_that_found_its_message_keeps_the_window() -> None:
    ip = IdlePoll(LIMIT, window=200e-6)
    ip.settle(waited=150e-6, polled=150e-6, ran=150e-6)
    assert ip.window == 200e-6


def test_long_waits_halve_the_window_until_the_loop_sleeps_at_once() -> None:
    ip = IdlePoll(LIMIT, window=LIMIT)
    ip.settle(waited=0.5, polled=LIMIT, ran=LIMIT)
    assert ip.window == LIMIT / 2
    for _ in range(10):
        ip.settle(waited=0.5, polled=ip.window, ran=ip.window)
    assert ip.window == 0.0
    # and a loop that sleeps at once, woken late, stays so
    ip.settle(waited=2.0, polled=0.0, ran=0.0)
    assert ip.window == 0.0


def test_a_poll_preempted_for_long_closes_the_window_and_a_short_preemption_does_not() -> None:
    # Given a full window whose poll was preempted for a few microseconds (a thread of the fabric's woken
    # onto its CPU), then one that waited 3 ms for its CPU (other work's time slice: a busy host)
    ip = IdlePoll(LIMIT, window=LIMIT)
    ip.settle(waited=LIMIT, polled=LIMIT, ran=LIMIT - 80e-6)
    assert ip.window == LIMIT
    ip.settle(waited=3.5e-3, polled=3.5e-3, ran=LIMIT)
    # Then the next wait sleeps at once
    assert ip.window == 0.0


class PingRole(EchoRole):
    """Sends its next ping from its own handler, on the owner's thread, as each pong arrives, until `rounds`."""

    def __init__(self, endpoint: str, rounds: int) -> None:
        super().__init__(endpoint)
        self.rounds = rounds
        self.loop: OwnerLoop | None = None
        self.done = threading.Event()

    def on_connected(self) -> None:
        assert self.loop is not None
        self.loop.send([b"ping", b"0"])

    def on_frames(self, frames: Frames) -> None:
        self.received.append(frames)
        assert self.loop is not None
        if len(self.received) < self.rounds:
            self.loop.send([b"ping", str(len(self.received)).encode()])
        else:
            self.done.set()


@pytest.fixture
def echo_peer() -> Iterator[str]:
    """A ROUTER that echoes each message to its sender from libzmq's own proxy loop, without the GIL (so
    that the loop under test is the only Python thread that wants it while it polls)."""
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    port = r.bind_to_random_port("tcp://127.0.0.1")

    def run() -> None:
        try:
            zmq.proxy(r, r)  # one socket as both sides: each message goes back to its sender
        except zmq.ContextTerminated:
            pass
        finally:
            r.close(0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield f"tcp://127.0.0.1:{port}"
    ctx.term()
    t.join(5)


def test_a_polling_loop_takes_what_its_poll_finds_and_idle_polls_once_then_sleeps(echo_peer: str) -> None:
    # Given a loop with a wide limit (an answer within it is found however slow the machine), the busy
    # rule off (a loaded test machine would close the window: that rule has its own test above)
    role = PingRole(echo_peer, rounds=200)
    loop = OwnerLoop(role, name="poller", idle_poll=0.2)
    assert loop.idle_poll is not None
    loop.idle_poll.busy_lost = float("inf")
    role.loop = loop
    loop.start()
    try:
        # When its peer echoes each ping at once, 200 times in a row
        assert role.done.wait(20)
        # Then every answer arrived in order; a wait that slept doubled the window, so few slept (from 10 µs,
        # 15 doublings pass 0.2 s) and, the window past the round trip, polls found the answers instead
        assert role.received == [[b"ping", str(i).encode()] for i in range(200)]
        assert loop.stats.idle_polls_slept <= 16
        assert loop.stats.idle_polls_found >= 1
        # And once idle (no timer due, nothing sent) it polls one window, then sleeps: no further polls
        deadline = time.monotonic() + 5
        while loop.stats.idle_polls_slept == 0 or not loop._idle:
            assert time.monotonic() < deadline, "the idle loop never went to sleep"
            time.sleep(0.01)
        time.sleep(0.3)  # longer than the widest window
        counts = loop.stats.idle_polls_slept, loop.stats.idle_polls_found
        time.sleep(0.5)
        assert (loop.stats.idle_polls_slept, loop.stats.idle_polls_found) == counts
    finally:
        loop.stop()


class RecordingPoller:
    """The loop's poller as `_poll_then_sleep` uses it: each timeout asked, and nothing ever ready."""

    def __init__(self) -> None:
        self.timeouts: list[int | None] = []

    def poll(self, timeout: int | None = None) -> list[tuple[Any, int]]:
        self.timeouts.append(timeout)
        return []


def test_a_window_a_timer_cuts_short_ends_at_the_timer_without_a_sleep(router: Any) -> None:  # noqa: F811
    # Given a polling loop whose next timer falls within its window
    _, ep = router
    loop = OwnerLoop(EchoRole(ep), name="timed", idle_poll=0.5)
    ip = IdlePoll(0.5, window=0.5, busy_lost=float("inf"))
    poller = RecordingPoller()
    loop._poller = poller  # type: ignore[assignment]
    # When it waits with nothing coming
    assert loop._poll_then_sleep(ip, time.monotonic() + 0.002) == []
    # Then it looked until the timer and no further: no sleep, whose timeout (rounded up to whole ms)
    # would have woken it past the timer, and it counts no slept wait; the window stays
    assert poller.timeouts and set(poller.timeouts) == {0}
    assert (loop.stats.idle_polls_slept, loop.stats.idle_polls_found) == (0, 0)
    assert ip.window == 0.5
    # And a timer past the window: the loop polls the window, then sleeps until the timer (counted)
    ip.window = 0.001
    poller.timeouts.clear()
    loop._poll_then_sleep(ip, time.monotonic() + 5.0)
    assert poller.timeouts[-1] is not None and poller.timeouts[-1] > 0
    assert set(poller.timeouts[:-1]) == {0}
    assert loop.stats.idle_polls_slept == 1


def test_only_the_broker_polls_and_zero_turns_it_off(router: Any) -> None:  # noqa: F811
    # The broker asks its transport for the setting's window, 500 µs by default
    assert Settings().broker_idle_poll_us == 500
    for us, window in ((None, 500e-6), (250, 250e-6), (0, 0.0)):
        s = Settings() if us is None else Settings(broker_idle_poll_us=us)
        b = Broker(s, endpoint="tcp://127.0.0.1:1", transport=StubTransport())
        assert b.loop.idle_poll == pytest.approx(window)  # type: ignore[attr-defined]
        b.loop.context.term()  # the stub's context, made for the broker's event publisher
    # and an owner loop given none, or 0, sleeps at once (the worker's and the client's)
    _, ep = router
    assert OwnerLoop(EchoRole(ep), name="plain").idle_poll is None
    assert OwnerLoop(EchoRole(ep), name="off", idle_poll=0.0).idle_poll is None
