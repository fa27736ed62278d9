"""Reading a job's events as the client's owner thread appends them: snapshots and open input requests."""

from __future__ import annotations

import time
from collections import deque
from datetime import datetime
from typing import Any


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
            asked = event.get("timestamp")
            return {**request, "worker": event.get("worker"), "asked_at": asked if isinstance(asked, str) else None}
    return None


def is_open(request: dict[str, Any]) -> bool:
    """False once the request's own timeout has passed (the task then stopped waiting)."""
    asked, timeout = request.get("asked_at"), request.get("timeout")
    if not isinstance(asked, str) or not isinstance(timeout, int | float):
        return True
    try:
        return time.time() < datetime.fromisoformat(asked).timestamp() + float(timeout)
    except ValueError:
        return True
