"""Keepalive arithmetic, driven by a fake clock: when to send, when the peer's hold time runs out."""

from __future__ import annotations

import itertools

import pytest
from fakeclock import FakeClock

from zfab.core.keepalive import DEFAULT_INTERVAL, DEFAULT_MULTIPLIER, KeepAlive


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ka(clock: FakeClock) -> KeepAlive:
    return KeepAlive(interval=2.0, multiplier=3, clock=clock)


def test_defaults_are_two_and_a_half_seconds_times_six() -> None:
    ka = KeepAlive()

    assert (ka.interval, ka.multiplier) == (DEFAULT_INTERVAL, DEFAULT_MULTIPLIER) == (2.5, 6)
    assert ka.hold_time == 15.0


def test_keepalive_is_not_due_until_one_interval_has_passed(ka: KeepAlive, clock: FakeClock) -> None:
    clock.advance(1.75)
    assert not ka.due()

    clock.advance(0.25)
    assert ka.due()


def test_marking_a_keepalive_sent_counts_it_and_schedules_the_next_one(ka: KeepAlive, clock: FakeClock) -> None:
    # Given a keepalive that became due late
    clock.advance(2.5)
    assert ka.due()

    # When the owner sends it
    ka.mark_sent()

    # Then the next one is one interval from now, not from when it was due
    assert ka.sent == 1
    assert not ka.due()
    assert ka.next_due == clock() + 2.0
    clock.advance(2.0)
    assert ka.due()


def test_peer_expires_after_the_hold_time_without_hearing_from_it(ka: KeepAlive, clock: FakeClock) -> None:
    assert ka.hold_time == 6.0

    clock.advance(5.75)
    assert ka.is_alive() and not ka.expired()

    clock.advance(0.25)
    assert ka.expired() and not ka.is_alive()


def test_hearing_from_the_peer_extends_expiry_by_interval_times_multiplier(ka: KeepAlive, clock: FakeClock) -> None:
    # Given a peer heard four seconds in
    clock.advance(4.0)
    ka.heard()

    # Then it stays alive for a full hold time from that moment
    assert ka.expires_at == clock() + 6.0
    clock.advance(5.75)
    assert ka.is_alive()
    clock.advance(0.25)
    assert ka.expired()


def test_only_keepalive_frames_are_counted_as_received(ka: KeepAlive, clock: FakeClock) -> None:
    ka.heard()
    ka.heard(keepalive=False)
    ka.heard(keepalive=False)

    assert ka.received == 1


def test_any_frame_from_the_peer_keeps_it_alive_even_when_not_counted(ka: KeepAlive, clock: FakeClock) -> None:
    clock.advance(5.0)
    ka.heard(keepalive=False)

    clock.advance(5.0)

    assert ka.is_alive()
    assert ka.received == 0


def test_reset_zeroes_counters_and_restarts_timers_from_now(ka: KeepAlive, clock: FakeClock) -> None:
    # Given a keepalive that has traffic behind it and an expired peer
    ka.heard()
    ka.mark_sent()
    clock.advance(30.0)
    assert ka.expired()

    # When the connection starts afresh
    ka.reset()

    # Then
    assert (ka.sent, ka.received) == (0, 0)
    assert ka.is_alive()
    assert ka.alive_for() == 0.0
    assert ka.next_due == clock() + 2.0
    assert ka.hold_time_left() == 6.0


def test_hold_time_left_counts_down_and_stops_at_zero(ka: KeepAlive, clock: FakeClock) -> None:
    assert ka.hold_time_left() == 6.0

    clock.advance(2.5)
    assert ka.hold_time_left() == 3.5

    clock.advance(100.0)
    assert ka.hold_time_left() == 0.0


def test_alive_for_measures_time_since_the_last_reset(ka: KeepAlive, clock: FakeClock) -> None:
    clock.advance(7.0)
    ka.heard()
    assert ka.alive_for() == 7.0

    ka.reset()
    clock.advance(1.5)
    assert ka.alive_for() == 1.5


def test_next_deadline_is_the_next_send_while_the_peer_is_fresh(ka: KeepAlive, clock: FakeClock) -> None:
    assert ka.next_deadline() == clock() + 2.0


def test_next_deadline_is_the_expiry_when_it_comes_before_the_next_send(clock: FakeClock) -> None:
    # Given a multiplier of one, expiry and send coincide; after a send, expiry comes first
    ka = KeepAlive(interval=2.0, multiplier=1, clock=clock)
    clock.advance(1.0)
    ka.mark_sent()  # next send at +3.0; expiry still at +2.0

    assert ka.next_deadline() == ka.expires_at == clock() + 1.0


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_non_positive_interval_is_rejected(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        KeepAlive(interval=interval)


@pytest.mark.parametrize("multiplier", [0, -3])
def test_multiplier_below_one_is_rejected(multiplier: int) -> None:
    with pytest.raises(ValueError, match="multiplier"):
        KeepAlive(multiplier=multiplier)


def test_a_keepalive_due_within_half_an_interval_answers_the_peers(clock: FakeClock) -> None:
    # Given an answering peer's own keepalive due at +2.0
    ka = KeepAlive(interval=2.0, multiplier=3, clock=clock, answering=True)
    clock.advance(0.9)
    assert not ka.answers()  # 1.1 s early: more than half an interval; our clock sends it

    # When the peer's keepalive comes within half an interval of ours
    clock.advance(0.1)
    assert ka.answers()
    ka.mark_sent()

    # Then the next of our own is 1.2 intervals on, so the peer's next, one interval on, comes first
    assert ka.sent == 1
    assert ka.next_due == clock() + 2.4
    clock.advance(2.0)
    assert not ka.due() and ka.answers()


def test_a_peer_that_does_not_answer_keeps_its_own_clock(ka: KeepAlive, clock: FakeClock) -> None:
    clock.advance(1.9)
    assert not ka.answers()  # the broker and the client send on their own clocks only
    clock.advance(0.1)
    ka.mark_sent()
    assert ka.next_due == clock() + 2.0


@pytest.mark.parametrize("phase", [0.01, 0.25, 0.45, 0.49])
def test_an_answering_peer_out_of_phase_drifts_into_the_other_sides_wave(clock: FakeClock, phase: float) -> None:
    # Given a peer whose own keepalive went out `phase` intervals before the other side's wave,
    # too soon to answer it; the other side sends one every interval
    ka = KeepAlive(interval=1.0, multiplier=6, clock=clock, answering=True)
    ka.mark_sent()
    t0 = clock()
    sent_at = [t0]
    wave = t0 + phase
    answered_at = None
    while clock() < t0 + 5.0 and answered_at is None:
        step = min(wave, ka.next_due) - clock()
        clock.advance(max(step, 0.0))
        if clock() >= ka.next_due:  # our own clock
            ka.mark_sent()
            sent_at.append(clock())
        if clock() >= wave:
            if ka.answers():
                answered_at = clock()
            wave += 1.0

    # Then within three intervals a wave is answered (and every later one, by the test above),
    # and the peer never went longer than 1.2 intervals without sending
    assert answered_at is not None and answered_at - t0 <= 3.0 + phase + 1e-9
    times = [*sent_at, answered_at]
    assert max(b - a for a, b in itertools.pairwise(times)) <= 1.2 + 1e-9


def test_a_peer_sending_fast_is_answered_at_most_once_per_0_7_intervals(clock: FakeClock) -> None:
    # Given a peer whose keepalives come every 0.1 s, answered whenever answers() says so
    ka = KeepAlive(interval=2.0, multiplier=3, clock=clock, answering=True)
    answered = 0
    for _ in range(100):  # 10 s
        clock.advance(0.1)
        if ka.answers():
            ka.mark_sent()
            answered += 1

    # Then an answer goes out every 1.4 s (1.2 intervals less the half-interval window), not 100 times
    assert answered == 7  # at 1.0 s, then every 1.4 s up to 9.4 s
