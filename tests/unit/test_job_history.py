"""A job's history: each state at the time the process that saw it says it happened, placed on the API's
clock from durations (hop traces, a 201's age, a result's own run time), never reordered by another
process's clock (api/jobs/history.py, docs/protocol.md "Times across processes")."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest

from zfab.api.jobs.history import Step, event_time, history, in_order, input_steps, placed
from zfab.api.jobs.inputs import is_open, pending_input, shown
from zfab.core import payloads
from zfab.core import protocol as nfp

T0 = 1_800_000_000.0
HOPS = {
    "client_broker": 0.004,
    "broker_queue": 1.5,
    "broker_worker": 0.002,
    "worker_queue": 0.01,
    "run": 5.0,
    "worker_result": 0.001,
}


def states(steps: list[Step]) -> list[str]:
    return [s.state for s in steps]


def test_a_traced_job_is_placed_from_its_durations_so_a_5_s_task_takes_5_s() -> None:
    total = sum(HOPS.values())
    timings = {"submitted": T0, "dispatched": T0 + 1.6, "started": T0 + 1.63, "completed": T0 + total}
    steps = history(
        state="completed",
        finished=True,
        reason=None,
        timings=timings,
        trace={"total": total, "hops": HOPS},
        results={"w1": {"failed": False, "timestamps": {"started": 5.0, "completed": 10.0}}},
        worker="w1",
    )
    assert states(steps) == ["submitted", "queued", "running", "completed"]
    at = {s.state: s.at for s in steps}
    assert at["queued"] == pytest.approx(T0 + 0.002)  # the broker's admission: half the client's round trip
    assert at["running"] == pytest.approx(T0 + 0.002 + 1.5 + 0.001 + 0.01)  # not the 201's receipt
    assert at["completed"] - at["running"] == pytest.approx(5.0)
    assert [s.by for s in steps] == ["api", "broker", "worker", "worker"]
    assert steps[2].worker == "w1" and steps[3].worker == "w1"


def test_placed_needs_the_broker_figures_and_takes_a_retried_attempts_start() -> None:
    assert placed({"submitted": T0}, None) == {}
    assert placed({"submitted": T0}, {"hops": {"run": 1.0}}) == {}
    broker_only = placed({"submitted": T0}, {"hops": {"client_broker": 0.01, "broker_queue": 0.5}})
    assert broker_only == {"admitted": pytest.approx(T0 + 0.005), "sent": pytest.approx(T0 + 0.505)}
    again = placed({"submitted": T0, "retried": T0 + 30}, {"hops": HOPS})
    assert again["admitted"] == pytest.approx(T0 + 30.002)


def test_an_untraced_quick_job_never_reads_queued_after_running() -> None:
    # Given a job that ended before its 201 was due, whose 202 the API read late (its loop was busy):
    # the 202's receipt is after the worker's start, as the result's run time places it
    timings = {"submitted": T0, "dispatched": T0 + 0.050, "completed": T0 + 0.052}
    results = {"w1": {"failed": False, "timestamps": {"started": 99.000, "completed": 99.004}}}
    steps = history(
        state="completed",
        finished=True,
        reason=None,
        timings=timings,
        trace=None,
        results=results,
        worker=None,
    )
    # Then queued comes first, and the run keeps its 4 ms (placed before the answer that told it)
    assert states(steps) == ["submitted", "queued", "running", "completed"]
    at = [s.at for s in steps]
    assert at == sorted(at)
    assert steps[3].at - steps[2].at == pytest.approx(0.002, abs=1e-6)  # floored to the 202's receipt, never before it
    assert steps[2].worker == "w1"


def test_a_running_job_is_placed_at_its_messages_and_a_refused_one_by_the_broker() -> None:
    running = history(
        state="running",
        finished=False,
        reason=None,
        timings={"submitted": T0, "dispatched": T0 + 0.001, "started": T0 + 0.002},
        trace=None,
        results=None,
        worker="w1",
    )
    assert states(running) == ["submitted", "queued", "running"]
    lost = history(
        state="expired",
        finished=True,
        reason="deadline passed in the queue",
        timings={"submitted": T0, "queued": T0 + 0.001, "completed": T0 + 10},
        trace=None,
        results=None,
        worker=None,
    )
    assert states(lost) == ["submitted", "queued", "expired"] and lost[-1].by == "broker"
    assert lost[-1].note == "deadline passed in the queue"


def test_earlier_attempts_and_input_steps_take_their_places() -> None:
    events: list[dict[str, Any]] = [
        {"event_type": "progress", "received": T0 + 0.5},
        {"event_type": "input_request", "message": "proceed?", "worker": "w1", "received": T0 + 1.0},
        {
            "event_type": "input_response",
            "worker": "w1",
            "received": T0 + 3.0,
            "extras": {"input_response": {"accepted": False}},
        },
        {
            "event_type": "input_response",
            "worker": "w1",
            "timestamp": "2027-01-15T08:00:04+00:00",  # read back from a worker's store: no receipt
            "extras": {"input_response": {"accepted": True}},
        },
    ]
    asked = input_steps(events)
    assert [(s.state, s.note) for s in asked] == [("waiting", "asked: proceed?"), ("running", "took the answer")]
    assert asked[1].at == event_time(events[3]) == datetime.fromisoformat("2027-01-15T08:00:04+00:00").timestamp()
    steps = history(
        state="running",
        finished=False,
        reason=None,
        timings={"submitted": T0 - 60, "retried": T0 - 1, "dispatched": T0 - 0.9, "started": T0 - 0.8},
        trace=None,
        results=None,
        worker="w2",
        attempts=[{"attempt": 1, "worker": "w1", "status": "error", "error": "boom", "ended": T0 - 2}],
        inputs=asked[:1],
    )
    assert states(steps) == ["submitted", "failed", "queued", "running", "waiting"]
    assert steps[1].note == "attempt 1: boom" and steps[1].worker == "w1"


def test_in_order_floors_a_state_to_the_one_it_follows() -> None:
    steps = in_order(
        [
            Step("submitted", 10.0, "api"),
            Step("queued", 11.0, "broker"),
            Step("running", 10.5, "worker", "w1", "a worker started it"),
            Step("completed", 10.8, "worker", "w1"),
        ]
    )
    assert states(steps) == ["submitted", "queued", "running", "completed"]
    assert [s.at for s in steps] == [10.0, 11.0, 11.0, 11.0]


def test_an_input_request_counts_down_on_the_apis_clock() -> None:
    now = time.time()
    event = {
        "event_type": "input_request",
        "worker": "w1",
        "received": now - 10,
        "timestamp": "1999-01-01T00:00:00+00:00",  # the worker's clock, far off: not used for the deadline
        "extras": {"input_request": {"id": "i1", "question": "q", "timeout": 30}},
    }
    req = pending_input([event])
    assert req is not None and is_open(req)
    out = shown(req)
    assert 19.0 < out["expires_in"] <= 20.0 and "_deadline" not in out
    assert out["asked_at"].startswith(time.strftime("%Y-", time.gmtime(now)))
    late = pending_input([{**event, "received": now - 31}])
    assert late is not None and not is_open(late)


def test_a_201_says_its_age_and_a_bad_age_says_nothing() -> None:
    assert payloads.age_of(nfp.dumps(payloads.worker_status("w1", "demo", "u", "ACCEPTED", age=0.01))) == 0.01
    for bad in (b"", b"not json", b"[]", b'{"age": -1}', b'{"age": "1"}', b'{"age": true}', b'{"age": 1e9}'):
        assert payloads.age_of(bad) == 0.0
