"""A job's history: each state, at the time the process that saw it says it happened, on the API's clock.

Three processes see a job's states: the broker admits it (`queued`), a worker starts it (`running`),
asks for input (`waiting`) and ends it (`completed`, `failed`), and the API submits it and learns each
of these from a message. Their clocks are not one clock: each monotonic clock starts anywhere, and wall
clocks of two hosts (or containers) may differ by more than a job takes. So no instant travels between
processes; durations do, each measured on one process's own monotonic clock, and the API places them
on its own clock relative to a message it received (docs/protocol.md, "Times across processes"):

- A finished job's hop trace (core/hoptrace.py) says how long the broker held the job before sending
  it (`broker_queue`), how long the worker held it before its task started (`worker_queue`), how long
  the task ran (`run`), and the wire legs between (`client_broker`, `broker_worker`, both ways: each
  way is taken as half). Laid end to end from the attempt's start on the API's clock they give the
  broker's admission, the worker's start and the task's end, in order, and a 5 s task takes 5 s.
- Before the end (or without a trace: a NorFab worker, a job the broker ended), a state is placed at
  the API's receipt of the message that told it (202/301, the worker's 201 less the age it carries,
  an event), and a worker's run time from its result's own timestamps (two readings of one clock).
- Each state is placed no earlier than the one before it (`queued` never follows `running`): a
  figure off by clock-rate drift or rounding does not reorder what happened.

Pure: the caller hands in what the job's future and record hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..models import JobState

WORKER_ENDS = (JobState.COMPLETED, JobState.FAILED)  # the ends a worker reports (the others, the broker)


@dataclass(frozen=True, slots=True)
class Step:
    """One state of a job: when it happened (epoch seconds on the API's clock), who saw it, what happened."""

    state: str
    at: float
    by: str  # "api", "broker" or "worker"
    worker: str | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        when = datetime.fromtimestamp(self.at, UTC)
        return {"state": self.state, "at": when, "by": self.by, "worker": self.worker, "note": self.note}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def placed(timings: dict[str, float], trace: dict[str, Any] | None) -> dict[str, float]:
    """From the attempt's start on the API's clock and its hop trace: when the broker admitted the job
    (`admitted`), sent it (`sent`), its worker started it (`started`) and its task ended (`ended`).
    Empty without a trace; without the worker's figures (a NorFab worker), the broker's only."""
    hops = (trace or {}).get("hops")
    t0 = _num(timings.get("retried")) or _num(timings.get("submitted"))
    if not isinstance(hops, dict) or t0 is None:
        return {}
    h = {k: v for k, v in hops.items() if _num(v) is not None and v >= 0}
    if "client_broker" not in h or "broker_queue" not in h:
        return {}
    out = {"admitted": t0 + h["client_broker"] / 2}
    out["sent"] = out["admitted"] + h["broker_queue"]
    if {"broker_worker", "worker_queue", "run"} <= h.keys():
        out["started"] = out["sent"] + h["broker_worker"] / 2 + h["worker_queue"]
        out["ended"] = out["started"] + h["run"]
    return out


def _run_time(results: dict[str, Any] | None) -> tuple[str | None, float | None]:
    """(worker, seconds its task ran) from a result's own timestamps: the longest, for several workers."""
    best: tuple[str | None, float | None] = (None, None)
    for worker, entry in (results or {}).items():
        ts = entry.get("timestamps") if isinstance(entry, dict) else None
        if not isinstance(ts, dict):
            continue
        start, end = _num(ts.get("started")), _num(ts.get("completed"))
        if start is not None and end is not None and end >= start and (best[1] is None or end - start > best[1]):
            best = (str(worker), end - start)
    return best


def event_time(event: dict[str, Any]) -> float | None:
    """When an event happened on the API's clock: its receipt (`received`, stamped by the API as it came:
    a worker sends an event as it happens), else the worker's own `timestamp` (an event read back from a
    worker's store after a restart)."""
    got = _num(event.get("received"))
    if got is not None:
        return got
    stamp = event.get("timestamp")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            return None
    return None


def input_steps(events: Iterable[dict[str, Any]]) -> list[Step]:
    """The job's input requests and answers, each at its time (an answer refused is no step)."""
    steps: list[Step] = []
    for e in events:
        kind = e.get("event_type")
        if kind not in ("input_request", "input_response"):
            continue
        at = event_time(e)
        if at is None:
            continue
        worker = str(e["worker"]) if e.get("worker") else None
        if kind == "input_request":
            steps.append(Step(JobState.WAITING, at, "worker", worker, f"asked: {e.get('message', '')}"))
            continue
        extras = e.get("extras")
        response = extras.get("input_response") if isinstance(extras, dict) else None
        if isinstance(response, dict) and response.get("accepted"):
            steps.append(Step(JobState.RUNNING, at, "worker", worker, "took the answer"))
    return steps


def history(
    *,
    state: str,
    finished: bool,
    reason: str | None,
    timings: dict[str, float],
    trace: dict[str, Any] | None,
    results: dict[str, Any] | None,
    worker: str | None,
    attempts: Iterable[dict[str, Any]] = (),
    inputs: Iterable[Step] = (),
) -> list[Step]:
    """The job's states in the order they happened (see the module's doc), each placed on the API's clock."""
    steps: list[Step] = []
    submitted = _num(timings.get("submitted"))
    if submitted is None:
        return steps
    steps.append(Step("submitted", submitted, "api", None, "the API took the job"))
    for a in sorted(attempts, key=lambda a: _num(a.get("ended")) or 0.0):  # a retried job's earlier attempts
        ended = _num(a.get("ended")) or _num(a.get("completed"))
        if ended is None:
            continue
        lost = a.get("status") == JobState.LOST
        note = f"attempt {a.get('attempt', '?')}: {a.get('error') or a.get('status') or 'failed'}"
        steps.append(
            Step(
                JobState.LOST if lost else JobState.FAILED, ended, "broker" if lost else "worker", a.get("worker"), note
            )
        )
    at = placed(timings, trace)
    completed = _num(timings.get("completed")) if finished else None
    queued = at.get("admitted") or _num(timings.get("queued")) or _num(timings.get("dispatched"))
    if queued is not None:
        steps.append(Step(JobState.QUEUED, queued, "broker", None, "the broker admitted it"))
    ran_on, ran_for = _run_time(results)
    started = at.get("started") or _num(timings.get("started"))
    if started is None and completed is not None and ran_for is not None:
        started = completed - ran_for  # the worker's run time, placed before the answer that told it
    if started is not None:
        steps.append(Step(JobState.RUNNING, started, "worker", worker or ran_on, "a worker started it"))
    steps.extend(sorted(inputs, key=lambda s: s.at))
    if finished:
        end = at.get("ended") if state in WORKER_ENDS else None
        end = end if end is not None else completed
        if end is not None and state in WORKER_ENDS and results:
            steps.append(Step(state, end, "worker", worker or ran_on, reason or ""))
        elif end is not None:  # ended by the broker (expired, lost, cancelled while queued) or refused
            steps.append(Step(state, end, "broker", None, reason or ""))
    return in_order(steps)


def in_order(steps: list[Step]) -> list[Step]:
    """`steps` in the order they happen (submitted, earlier attempts' ends, queued, running, input steps,
    the end), each placed no earlier than the one before it, so drift never reorders them."""
    out: list[Step] = []
    floor = float("-inf")
    for s in steps:
        at = max(s.at, floor)
        floor = at
        out.append(s if at == s.at else Step(s.state, at, s.by, s.worker, s.note))
    return out
