"""Per-hop traces: where a job's time went, as durations each process measured on its own clock.

No host needs a synchronised clock. Each process times what happens inside it with its monotonic
clock and says how long it held the job; a round trip minus the time its far end held the job is the
time on the wire (both directions, and the sockets' queues at both ends). So every figure is a
difference of two readings of one clock, and the hops add up to the client's own end-to-end time.

Wire form (docs/protocol.md, "Hop traces"): an optional last frame of a final RESPONSE holding
little-endian IEEE 754 doubles, seconds, in a fixed order. The worker sends its three to a zfab broker
(one that sent it a meta frame); the broker appends its two and forwards the frame to a client that
asked for pushed results, so it never reads the worker's. Binary, not text: formatting and parsing
five decimal numbers cost more per job than the rest of the trace together.

    worker → broker   24 bytes: worker_queue, run, worker_result; a 25th, the task's outcome (below)
    broker → client   40 bytes: the worker's 24, then broker_queue, broker_wait
                      16 bytes: broker_queue, broker_wait (the worker sent none, or not 24 bytes)

Pure: no clock is read here; callers pass their readings.
"""

from __future__ import annotations

import struct
from typing import Final

from .states import State

# The hops of a job, in the order it passes them (closed: the metric's label values).
API: Final = "api"  # the API: request read, checked and recorded, until its client submits it
CLIENT_BROKER: Final = "client_broker"  # client ⇄ broker, both ways: the client's own work and the wire
BROKER_QUEUE: Final = "broker_queue"  # broker: POST received → sent to its worker (admission, queue)
BROKER_WORKER: Final = "broker_worker"  # broker ⇄ worker, both ways: the wire and the worker's loop
WORKER_QUEUE: Final = "worker_queue"  # worker: received → started by a pool thread
RUN: Final = "run"  # the task itself
WORKER_RESULT: Final = "worker_result"  # worker: the task returned → its result encoded and queued to send
HOPS: Final = (API, CLIENT_BROKER, BROKER_QUEUE, BROKER_WORKER, WORKER_QUEUE, RUN, WORKER_RESULT)

_WORKER = struct.Struct("<3d")
_BROKER = struct.Struct("<2d")
_BOTH = struct.Struct("<5d")
_FORWARD = struct.Struct("<24s2d")  # the worker's 24 bytes as they are, then the broker's two
WORKER_BYTES: Final = _WORKER.size  # 24
BROKER_BYTES: Final = _BROKER.size  # 16
MAX_SECONDS: Final = 30 * 86_400.0  # past any job's deadline: a larger figure is not a measurement

# The outcome of a final answer, as data: the one byte a zfab worker appends to its 24 (docs/protocol.md,
# "Hop traces"), so the broker knows completed from failed without reading the result. The words are
# core/states.py's, and `retrying`: a failed attempt its worker runs again (not the job's end).
OUTCOME_COMPLETED: Final = b"c"
OUTCOME_FAILED: Final = b"f"
OUTCOME_RETRYING: Final = b"r"
OUTCOMES: Final = {
    OUTCOME_COMPLETED[0]: State.COMPLETED.value,
    OUTCOME_FAILED[0]: State.FAILED.value,
    OUTCOME_RETRYING[0]: "retrying",
}


def worker_frame(
    received: float, started: float | None, completed: float, queued_to_send: float, outcome: bytes = b""
) -> bytes:
    """The worker's three durations, and its `outcome` byte (OUTCOME_*) when given. `started` is None for
    a job that ended before it ran (cancelled, expired, bad arguments): its time waiting counts as queue
    time and it ran for 0 s."""
    began = completed if started is None else started
    figures = _WORKER.pack(
        max(0.0, began - received), max(0.0, completed - began), max(0.0, queued_to_send - completed)
    )
    return figures + outcome if outcome else figures


def outcome_of(worker_trace: bytes | memoryview | None) -> str | None:
    """The outcome a worker's frame tells (completed, failed, retrying), or None: it tells none."""
    if worker_trace is None or len(worker_trace) != WORKER_BYTES + 1:
        return None
    return OUTCOMES.get(worker_trace[WORKER_BYTES])


def broker_frame(worker_trace: bytes | None, received: float, sent: float, answered: float) -> bytes:
    """The frame the broker forwards: the worker's durations (when they are a worker frame, with or
    without its outcome byte, which stays at the broker) and its own."""
    queue, wait = max(0.0, sent - received), max(0.0, answered - sent)
    if worker_trace is not None and WORKER_BYTES <= len(worker_trace) <= WORKER_BYTES + 1:
        return _FORWARD.pack(worker_trace, queue, wait)  # "24s" takes the figures, not the outcome: one copy
    return _BROKER.pack(queue, wait)


def _ok(v: float) -> bool:
    return 0.0 <= v <= MAX_SECONDS  # False for NaN too


def fabric_hops(frame: bytes) -> tuple[dict[str, float], float]:
    """The hops a broker's trace frame tells without its client (for the `trace.` topic), and how long
    the broker held the job (`broker_queue + broker_wait`; the client's `total` less `client_broker`)."""
    n = len(frame)
    if n not in (_BOTH.size, BROKER_BYTES):
        return {}, 0.0
    queue, wait = _BROKER.unpack_from(frame, n - BROKER_BYTES)  # the broker's own: always durations
    out = {BROKER_QUEUE: queue, BROKER_WORKER: wait}
    if n == _BOTH.size:
        wq, run, wr = _WORKER.unpack_from(frame)
        if _ok(wq) and _ok(run) and _ok(wr):  # the worker's word: NaN or a negative is left out
            out[BROKER_WORKER] = max(0.0, wait - wq - run - wr)
            out[WORKER_QUEUE], out[RUN], out[WORKER_RESULT] = wq, run, wr
    return out, queue + wait


def hops(total: float, frame: bytes | bytearray | memoryview, held: float = 0.0) -> tuple[dict[str, float], int]:
    """A job's hops from its client's end-to-end time (`total`, submit to final answer, seconds) and
    the frame the broker forwarded, and how many of the frame's figures could not be used (not a
    duration; a frame of another length counts 1). Only hops the fabric measured appear: without the
    broker's figures there are none; without the worker's (a NorFab worker, or any of them bad)
    `broker_worker` holds the whole time the broker waited for its worker. `held` > 0: the submitter's
    own hop (`api`) comes first."""
    n = len(frame)
    if n == _BOTH.size:
        wq, run, wr, queue, wait = _BOTH.unpack(frame)
        bad = (not _ok(wq)) + (not _ok(run)) + (not _ok(wr))
    elif n == BROKER_BYTES:
        queue, wait = _BROKER.unpack(frame)
        wq = run = wr = 0.0
        bad = -1  # no worker figures, none of them bad
    else:
        return {}, 1
    if not (_ok(queue) and _ok(wait)):
        return {}, (not _ok(queue)) + (not _ok(wait)) + max(0, bad)
    out = {API: held} if held > 0 else {}  # in the order the job passed them
    out[CLIENT_BROKER] = max(0.0, total - queue - wait)
    out[BROKER_QUEUE] = queue
    if bad == 0:
        out[BROKER_WORKER] = max(0.0, wait - wq - run - wr)
        out[WORKER_QUEUE], out[RUN], out[WORKER_RESULT] = wq, run, wr
    else:
        out[BROKER_WORKER] = wait
    return out, max(0, bad)
