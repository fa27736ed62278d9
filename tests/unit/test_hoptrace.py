"""Hop traces as pure rules: what a worker and the broker write, what a client derives from it."""

from __future__ import annotations

import math
import struct

import pytest

from zfab.core import hoptrace
from zfab.core import protocol as nfp


def figures(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def test_the_worker_and_broker_frames_become_hops_that_add_up_to_the_clients_time() -> None:
    w = hoptrace.worker_frame(received=10.0, started=10.25, completed=11.0, queued_to_send=11.001)
    assert len(w) == hoptrace.WORKER_BYTES
    frame = hoptrace.broker_frame(w, received=5.0, sent=5.5, answered=7.0)
    assert frame == w + figures(0.5, 1.5)  # the broker appends; it never reads the worker's figures
    hops, bad = hoptrace.hops(2.5, frame)
    assert bad == 0
    assert list(hops) == ["client_broker", "broker_queue", "broker_worker", "worker_queue", "run", "worker_result"]
    assert hops == pytest.approx(
        {
            "client_broker": 0.5,
            "broker_queue": 0.5,
            "broker_worker": 0.499,
            "worker_queue": 0.25,
            "run": 0.75,
            "worker_result": 0.001,
        }
    )
    assert sum(hops.values()) == pytest.approx(2.5)


def test_a_job_that_never_started_waited_and_ran_for_nothing() -> None:
    w = hoptrace.worker_frame(received=1.0, started=None, completed=3.0, queued_to_send=3.0)
    assert w == figures(2.0, 0.0, 0.0)


def test_readings_that_disagree_clamp_at_zero_and_never_go_negative() -> None:
    assert hoptrace.worker_frame(received=5.0, started=4.0, completed=3.0, queued_to_send=2.0) == figures(0, 0, 0)
    # A client whose total is below what the broker says it held: the wire hop is 0, not negative.
    hops, _ = hoptrace.hops(0.1, figures(0.1, 0.1))
    assert hops["client_broker"] == 0.0


def test_a_norfab_workers_answer_has_the_brokers_hops_and_its_wait_as_one() -> None:
    frame = hoptrace.broker_frame(None, 0.0, 1.0, 3.0)
    assert hoptrace.hops(4.0, frame) == ({"client_broker": 1.0, "broker_queue": 1.0, "broker_worker": 2.0}, 0)
    # A worker frame of the wrong length is not passed on: the broker's own figures stand alone.
    assert hoptrace.broker_frame(b"x" * 300, 0.0, 1.0, 3.0) == frame


@pytest.mark.parametrize(
    ("frame", "bad"),
    [
        (b"", 1),
        (b"run=1 broker_queue=0.1", 1),  # not the binary form: a frame of another length
        (figures(1, 2, 3, 4), 1),
        (figures(math.nan, 1.0), 1),
        (figures(-1.0, math.inf), 2),
        (figures(0.0, 1e9), 1),  # past any deadline: no measurement
    ],
)
def test_a_frame_that_is_no_trace_gives_no_hops_and_is_counted(frame: bytes, bad: int) -> None:
    assert hoptrace.hops(1.0, frame) == ({}, bad)


def test_bad_worker_figures_leave_the_brokers_hops_and_are_counted() -> None:
    hops, bad = hoptrace.hops(2.0, figures(math.nan, -3.0, 0.1, 0.5, 1.0))
    assert bad == 2
    assert hops == {"client_broker": 0.5, "broker_queue": 0.5, "broker_worker": 1.0}


def test_the_trace_frame_is_optional_and_only_on_a_response() -> None:
    head = [b"", nfp.WORKER, nfp.RESPONSE, b"c1", b"", b"j1", nfp.ST_OK, b"{}"]
    msg = nfp.decode_worker([*head, b"t" * 24])
    assert isinstance(msg, nfp.WorkerReply) and msg.trace == b"t" * 24
    msg = nfp.decode_worker(head)
    assert isinstance(msg, nfp.WorkerReply) and msg.trace is None
    with pytest.raises(nfp.ProtocolError):
        nfp.decode_worker([b"", nfp.WORKER, nfp.EVENT, b"c1", b"", b"j1", nfp.ST_OK, b"{}", b"t" * 24])
    reply = [b"", nfp.BROKER, nfp.RESPONSE, b"demo", b"j1", nfp.ST_OK, b"{}"]
    assert nfp.decode_broker_to_client([*reply, b"t" * 16]).trace == b"t" * 16
    assert nfp.decode_broker_to_client(reply).trace is None
    with pytest.raises(nfp.ProtocolError):
        nfp.decode_broker_to_client([b"", nfp.BROKER, nfp.EVENT, b"demo", b"j1", nfp.ST_OK, b"{}", b"t" * 16])
