"""Reading a job's events as the client's owner thread appends them: snapshots and open input requests."""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from .history import event_time


def snapshot(events: deque[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of a job's events, safe while the client's owner thread appends to them.

    Copying a deque takes no lock; if an append lands mid-copy (possible when the copy lets a
    thread switch happen) the deque raises RuntimeError, and copying again is enough.
    """
    while True:
        try:
            return list(events)
        except RuntimeError:
            continue


def _extras(event: dict[str, Any], key: str) -> dict[str, Any]:
    extras = event.get("extras")
    value = extras.get(key) if isinstance(extras, dict) else None
    return value if isinstance(value, dict) else {}


def pending_input(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest input request no accepted answer followed, with the worker that asked, or None."""
    answered: set[str] = set()
    for event in reversed(events):
        kind = event.get("event_type")
        if kind == "input_response":
            response = _extras(event, "input_response")
            if response.get("accepted"):
                answered.add(str(response.get("input_id")))
        elif kind == "input_request":
            request = _extras(event, "input_request")
            if not request or str(request.get("id")) in answered:
                return None
            # When it was asked, on this process's clock: the event's receipt (history.event_time), not
            # the worker's wall clock, so its deadline is counted on the clock that compares it with now.
            asked = event_time(event)
            timeout = request.get("timeout")
            deadline = asked + float(timeout) if asked is not None and isinstance(timeout, int | float) else None
            return {
                **request,
                "worker": event.get("worker"),
                "asked_at": _iso(asked),
                "deadline": _iso(deadline),
                "_deadline": deadline,
            }
    return None


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat() if epoch is not None else None


def is_open(request: dict[str, Any]) -> bool:
    """False once the request's own timeout has passed (the task then stopped waiting)."""
    deadline = request.get("_deadline")
    return not isinstance(deadline, float) or time.time() < deadline


def shown(request: dict[str, Any]) -> dict[str, Any]:
    """The open request as the API shows it: with `expires_in`, the seconds left now, so a caller (the
    console's countdown) counts down on its own clock from its receipt of the answer."""
    out = {k: v for k, v in request.items() if k != "_deadline"}
    deadline = request.get("_deadline")
    if isinstance(deadline, float):
        out["expires_in"] = round(max(0.0, deadline - time.time()), 3)
    return out
