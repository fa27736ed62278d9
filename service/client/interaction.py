"""Talking with a running job from the client side: its event stream and its input requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

from ..core import payloads, sizes
from ..core import protocol as nfp
from ..errors import BadRequestError, JobTimeoutError, PayloadTooLargeError
from ..transport.base import Transport
from .future import JobFuture


def _has_news(fut: JobFuture, seen: int) -> bool:
    return len(fut.events) > seen or fut.done()


def iter_events(fut: JobFuture, timeout: float) -> Iterator[dict[str, Any]]:
    """The job's events in order as they arrive, until it finishes or the timeout passes."""
    seen = 0
    deadline = time.monotonic() + timeout
    while True:
        with fut.changed:
            fut.changed.wait_for(partial(_has_news, fut, seen), max(0.0, deadline - time.monotonic()))
            new = list(fut.events)[seen:]
            finished = fut.done() or time.monotonic() >= deadline
        yield from new
        seen += len(new)
        if finished and seen >= len(fut.events):
            return


def answer_input(
    loop: Transport,
    service: bytes,
    fut: JobFuture,
    wire_uuid: str,
    value: Any,
    input_id: str | None,
    timeout: float,
    *,
    limit: int,
) -> None:
    """PUT the answer to the job's latest input request and wait for the worker's verdict (an answer
    over the message `limit` is refused before it is sent: PayloadTooLargeError)."""
    uuid = fut.uuid
    requests = [e for e in fut.events if e.get("event_type") == "input_request"]
    if not requests:
        raise BadRequestError(f"job {uuid} has not asked for input", uuid=uuid)
    req = requests[-1]
    rid = input_id or str(((req.get("extras") or {}).get("input_request") or {}).get("id", ""))
    worker = str(req.get("worker", ""))
    body = nfp.dumps({"input_id": rid, "value": value})
    size = len(body) + sizes.ENVELOPE_BYTES
    if not sizes.fits(size, limit):
        raise PayloadTooLargeError(sizes.too_large(f"the input answer for job {uuid}", size, limit), uuid=uuid)
    before = len(fut.events)
    loop.submit(nfp.client_request(nfp.PUT, service, worker.encode(), wire_uuid.encode(), body, payloads.NO_ACK))

    def answered() -> dict[str, Any] | None:
        for e in list(fut.events)[before:]:
            resp = (e.get("extras") or {}).get("input_response") or {}
            if e.get("event_type") == "input_response" and resp.get("input_id") == rid:
                return dict(resp)
        return None

    with fut.changed:
        fut.changed.wait_for(lambda: answered() is not None or fut.done(), timeout)
    resp = answered()
    if resp is None:
        if fut.done():
            raise BadRequestError(f"job {uuid} ended before it took the input", uuid=uuid)
        raise JobTimeoutError(f"worker {worker} did not answer the input within {timeout} s", uuid=uuid)
    if not resp.get("accepted"):
        raise BadRequestError("; ".join(resp.get("errors") or ["input refused"]), uuid=uuid)
