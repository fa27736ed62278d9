"""The broker's events as they go out (docs/protocol.md, "Event subscriptions"): topic parts and bodies.

Pure: no socket, no thread. The publisher's thread (events.py) builds every message with these; the
broker's loop uses only `topic_part` (for the names it remembers) and, while the publisher's
hand-off is full, `result_state`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..core import hoptrace
from ..core.states import State

TOPIC_PART_MAX = 64  # characters of a topic part (service, task)
EVENT_TEXT_MAX = 1024  # characters of a job event's message published (so an event stays far below 64 KiB)
EVENT_WORD_MAX = 64  # characters of its event_type and severity
# An attempt's end that is not the job's: a failed attempt its worker says runs again (its route ends).
RETRYING = "retrying"
_PLAIN = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:.~-"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:-")


def topic_part(name: str) -> str:
    """A name as a topic part: safe characters only (no dot), bounded, never empty."""
    part = "".join(c if c in _SAFE else "_" for c in name[:TOPIC_PART_MAX])
    return part or "_"


def json_str(raw: bytes) -> bytes:
    """A peer's bytes as a JSON string (uuids and worker names are short and nearly always plain)."""
    if not raw.translate(None, _PLAIN):  # nothing but plain characters: nothing to escape
        return b'"%s"' % raw
    return json.dumps(raw.decode(errors="replace")).encode()


def result_state(payload: bytes | memoryview | None) -> str:
    """completed, failed or retrying, read from a worker's 200 whose worker did not say (a NorFab
    worker's, or a zfab worker's without its trace frame): the result entries, decoded once.
    `retrying`: every failed entry carries the worker's `retry` (docs/protocol.md "Retries on
    failure"), so this attempt's failure is not the job's end: its next attempt follows as `<uuid>~<N>`.
    A payload that is no JSON object of entries holds no failed entry: completed."""
    if payload is None:
        return State.COMPLETED
    try:
        entries = json.loads(payload if type(payload) is bytes else bytes(payload))
    except (ValueError, RecursionError):
        return State.COMPLETED
    failed = (
        [e for e in entries.values() if isinstance(e, dict) and e.get("failed")] if isinstance(entries, dict) else []
    )
    if failed:
        return RETRYING if all(isinstance(e.get("retry"), dict) for e in failed) else State.FAILED
    return State.COMPLETED


def event_fields(payload: bytes) -> dict[str, Any]:
    """A job event's fields as its payload has them (docs/protocol.md "Events"), bounded: event_type and
    severity EVENT_WORD_MAX characters, the message EVENT_TEXT_MAX, progress a number. Others are left out
    (extras may be large; the job's own event stream has them)."""
    try:
        ev = json.loads(payload)
    except (ValueError, RecursionError):
        return {"malformed": True}
    if not isinstance(ev, dict):
        return {"malformed": True}
    out: dict[str, Any] = {}
    for key, bound in (("event_type", EVENT_WORD_MAX), ("message", EVENT_TEXT_MAX), ("severity", EVENT_WORD_MAX)):
        value = ev.get(key)
        if isinstance(value, str):
            out[key] = value[:bound]
    progress = ev.get("progress")
    if isinstance(progress, (int, float)) and not isinstance(progress, bool) and math.isfinite(progress):
        out["progress"] = progress
    return out


def job_body(
    seq: int, tseq: int, topic: str, uuid: bytes, service: str, task: str, state: str, at: float, worker: bytes
) -> bytes:
    """job.<service>.<task>.<state>: formatted by hand, as this is the one every job has several of."""
    who = b',"worker":%s' % json_str(worker) if worker else b""
    return b'{"seq":%d,"tseq":%d,"topic":"%s","uuid":%s,"service":"%s","task":"%s","state":"%s","at":%.6f%s}' % (
        seq,
        tseq,
        topic.encode(),
        json_str(uuid),
        service.encode(),
        task.encode(),
        state.encode(),
        at,
        who,
    )


def worker_body(seq: int, tseq: int, topic: str, service: str, state: str, worker: bytes, why: str, at: float) -> bytes:
    body = {"seq": seq, "tseq": tseq, "topic": topic, "service": service, "state": state, "at": round(at, 6)}
    body["worker"] = worker.decode(errors="replace")
    if why:
        body["why"] = why
    return _dump(body)


def event_body(
    seq: int,
    tseq: int,
    topic: str,
    uuid: bytes,
    service: str,
    task: str,
    worker: bytes,
    payload: bytes | None,
    at: float,
) -> bytes:
    body: dict[str, Any] = {"seq": seq, "tseq": tseq, "topic": topic}
    body.update(uuid=uuid.decode(errors="replace"), service=service, task=task, worker=worker.decode(errors="replace"))
    body["at"] = round(at, 6)
    if payload is None:
        body["oversize"] = True  # larger than the hand-off takes (or the hand-off full of them): no fields
    else:
        body.update(event_fields(payload))
    return _dump(body)


def trace_body(
    seq: int, tseq: int, topic: str, uuid: bytes, service: str, task: str, worker: bytes, frame: bytes, at: float
) -> bytes:
    hops, held = hoptrace.fabric_hops(frame)
    body: dict[str, Any] = {"seq": seq, "tseq": tseq, "topic": topic}
    body.update(uuid=uuid.decode(errors="replace"), service=service, task=task, worker=worker.decode(errors="replace"))
    body.update(at=round(at, 6), held=held, hops=hops)
    return _dump(body)


def queue_body(seq: int, tseq: int, topic: str, service: str, facts: tuple[int, int, int, bool], at: float) -> bytes:
    depth, nbytes, capacity, paused = facts
    return (
        b'{"seq":%d,"tseq":%d,"topic":"%s","service":"%s","depth":%d,"bytes":%d,"capacity":%d,"paused":%s,"at":%.6f}'
        % (seq, tseq, topic.encode(), service.encode(), depth, nbytes, capacity, b"true" if paused else b"false", at)
    )


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
