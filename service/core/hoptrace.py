"""Per-hop traces: where a job's time went, as durations each process measured on its own clock.

No host needs a synchronised clock. Each process times what happens inside it with its monotonic
clock and says how long it held the job; a round trip minus the time its far end held the job is the
time on the wire (both directions, and the sockets' queues at both ends). So every figure is a
difference of two readings of one clock, and the hops add up to the client's own end-to-end time.

Wire form (docs/protocol.md, "Hop traces"): an optional last frame of a final RESPONSE, ASCII
`name=seconds` pairs separated by spaces. The worker sends its pairs to a zfab broker (one that sent
it a meta frame); the broker appends its own and forwards the frame to a client that asked for pushed
results. The broker's pairs come last, so it never parses the worker's.

    worker → broker   worker_queue=0.000031 run=0.010204 worker_result=0.000018
    broker → client   worker_queue=0.000031 run=0.010204 worker_result=0.000018
                      broker_queue=0.000040 broker_wait=0.010390          (one frame, one line)

Pure: no clock is read here; callers pass their readings.
"""

from __future__ import annotations

import math
from typing import Final

# The hops of a job, in the order it passes them (closed: the metric's label values).
API: Final = "api"  # the API: request read, checked and recorded, until its client submits it
CLIENT_BROKER: Final = "client_broker"  # client ⇄ broker, both ways: the client's loop and the wire
BROKER_QUEUE: Final = "broker_queue"  # broker: POST received → sent to its worker (admission, queue)
BROKER_WORKER: Final = "broker_worker"  # broker ⇄ worker, both ways: the wire and the worker's loop
WORKER_QUEUE: Final = "worker_queue"  # worker: received → started by a pool thread
RUN: Final = "run"  # the task itself
WORKER_RESULT: Final = "worker_result"  # worker: the task returned → its result encoded and queued to send
HOPS: Final = (API, CLIENT_BROKER, BROKER_QUEUE, BROKER_WORKER, WORKER_QUEUE, RUN, WORKER_RESULT)

BROKER_WAIT: Final = "broker_wait"  # broker: sent to the worker → its final answer received (not a hop)
_WORKER_HOPS: Final = (WORKER_QUEUE, RUN, WORKER_RESULT)
_WIRE_NAMES: Final = frozenset((*_WORKER_HOPS, BROKER_QUEUE, BROKER_WAIT))
MAX_TRACE_BYTES: Final = 256  # a trace frame longer than this is not read (nor forwarded by the broker)
MAX_SECONDS: Final = 30 * 86_400.0  # past any job's deadline: a larger figure is not a measurement


def worker_frame(received: float, started: float | None, completed: float, queued_to_send: float) -> bytes:
    """The worker's pairs. `started` is None for a job that ended before it ran (cancelled, expired,
    bad arguments): its time waiting counts as queue time and it ran for 0 s."""
    began = completed if started is None else started
    return b"worker_queue=%.6f run=%.6f worker_result=%.6f" % (
        max(0.0, began - received),
        max(0.0, completed - began),
        max(0.0, queued_to_send - completed),
    )


def broker_frame(worker_trace: bytes | None, received: float, sent: float, answered: float) -> bytes:
    """The frame the broker forwards: the worker's pairs (when short enough to be one) and its own."""
    own = b"broker_queue=%.6f broker_wait=%.6f" % (max(0.0, sent - received), max(0.0, answered - sent))
    if worker_trace and len(worker_trace) <= MAX_TRACE_BYTES:
        return worker_trace + b" " + own
    return own


def parse(frame: bytes | bytearray | memoryview) -> tuple[dict[str, float], int]:
    """The pairs of a trace frame it knows, and how many it could not read (an unknown name, a value
    that is no duration). A peer's word never becomes a key: names outside the closed set are skipped."""
    if len(frame) > 2 * MAX_TRACE_BYTES:
        return {}, 1
    pairs: dict[str, float] = {}
    bad = 0
    for item in bytes(frame).split():
        name, sep, value = item.partition(b"=")
        key = name.decode("ascii", "replace")
        if not sep or key not in _WIRE_NAMES:
            bad += 1
            continue
        try:
            seconds = float(value)
        except ValueError:
            bad += 1
            continue
        if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_SECONDS):
            bad += 1
            continue
        pairs[key] = seconds
    return pairs, bad


def hops(total: float, pairs: dict[str, float]) -> dict[str, float]:
    """A job's hops from its client's end-to-end time (`total`, submit to final answer, seconds) and
    the pairs the broker forwarded. Only hops the fabric measured appear: without the broker's pairs
    (a NorFab broker) there are none; without the worker's (a NorFab worker) `broker_worker` holds the
    whole time the broker waited for the worker."""
    queue, wait = pairs.get(BROKER_QUEUE), pairs.get(BROKER_WAIT)
    if queue is None or wait is None:
        return {}
    out = {CLIENT_BROKER: max(0.0, total - queue - wait), BROKER_QUEUE: queue}
    worker = [pairs.get(k) for k in _WORKER_HOPS]
    if all(v is not None for v in worker):
        held = 0.0
        for k, v in zip(_WORKER_HOPS, worker, strict=True):
            assert v is not None
            out[k] = v
            held += v
        out[BROKER_WORKER] = max(0.0, wait - held)
    else:
        out[BROKER_WORKER] = wait
    return {k: out[k] for k in HOPS if k in out}  # in the order the job passed them
