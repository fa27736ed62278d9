"""Hop traces as pure rules: what a worker and the broker write, what a client reads and derives."""

from __future__ import annotations

import pytest

from service.core import hoptrace
from service.core import protocol as nfp


def test_the_worker_and_broker_frames_round_trip_into_hops_that_add_up() -> None:
    w = hoptrace.worker_frame(received=10.0, started=10.25, completed=11.0, queued_to_send=11.001)
    frame = hoptrace.broker_frame(w, received=5.0, sent=5.5, answered=7.0)
    pairs, bad = hoptrace.parse(frame)
    assert bad == 0
    assert pairs == pytest.approx(
        {"worker_queue": 0.25, "run": 0.75, "worker_result": 0.001, "broker_queue": 0.5, "broker_wait": 1.5}
    )
    hops = hoptrace.hops(2.5, pairs)
    assert sum(hops.values()) == pytest.approx(2.5)
    assert hops["client_broker"] == pytest.approx(0.5)
    assert hops["broker_worker"] == pytest.approx(0.499)


def test_a_job_that_never_started_waited_and_ran_for_nothing() -> None:
    pairs, _ = hoptrace.parse(hoptrace.worker_frame(received=1.0, started=None, completed=3.0, queued_to_send=3.0))
    assert pairs == {"worker_queue": 2.0, "run": 0.0, "worker_result": 0.0}


def test_clocks_that_disagree_clamp_at_zero_and_never_go_negative() -> None:
    w = hoptrace.worker_frame(received=5.0, started=4.0, completed=3.0, queued_to_send=2.0)
    assert hoptrace.parse(w)[0] == {"worker_queue": 0.0, "run": 0.0, "worker_result": 0.0}
    # A client whose total is below what the broker says it held: the wire hop is 0, not negative.
    assert hoptrace.hops(0.1, {"broker_queue": 0.1, "broker_wait": 0.1})["client_broker"] == 0.0


def test_without_the_brokers_pairs_there_are_no_hops() -> None:
    assert hoptrace.hops(1.0, {"run": 0.5}) == {}


def test_oversized_and_garbled_frames_are_not_read() -> None:
    assert hoptrace.parse(b"run=1 " * 200) == ({}, 1)
    pairs, bad = hoptrace.parse(b"\xff\xfe=1 run==2 run=inf run=1e9 run 0.5 RUN=1")
    assert pairs == {} and bad == 7
    # The broker does not pass on a worker's frame that is too long: its own pairs stand alone.
    assert hoptrace.broker_frame(b"x" * 300, 0.0, 1.0, 2.0) == b"broker_queue=1.000000 broker_wait=1.000000"


def test_the_trace_frame_is_optional_and_only_on_a_response() -> None:
    head = [b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, b"{}"]
    msg = nfp.decode_worker([*head, b"run=1"])
    assert isinstance(msg, nfp.WorkerReply) and msg.trace == b"run=1"
    msg = nfp.decode_worker(head)
    assert isinstance(msg, nfp.WorkerReply) and msg.trace is None
    with pytest.raises(nfp.ProtocolError):
        nfp.decode_worker([b"", nfp.WORKER, nfp.EVENT, b"c1", b"", b"j1", nfp.ST_OK, b"{}", b"run=1"])
    reply = [b"", nfp.BROKER, nfp.RESPONSE, b"demo", b"j1", nfp.ST_OK, b"{}"]
    assert nfp.decode_broker_to_client([*reply, b"run=1"]).trace == b"run=1"
    assert nfp.decode_broker_to_client(reply).trace is None
    with pytest.raises(nfp.ProtocolError):
        nfp.decode_broker_to_client([b"", nfp.BROKER, nfp.EVENT, b"demo", b"j1", nfp.ST_OK, b"{}", b"run=1"])
