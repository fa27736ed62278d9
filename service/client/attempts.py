"""A job's attempts as its client keeps them: when a failed attempt may run again, and the record each
earlier attempt leaves in its future's `attempts` (pure; ClientJob.retry and retry_failed apply them)."""

from __future__ import annotations

from typing import Any

from ..core.retries import MAX_BACKOFF
from ..core.schemacheck import is_number

MAX_ATTEMPT_ERROR = 4096  # characters of each error an earlier attempt's record keeps


def retry_hint(entry: Any) -> tuple[dict[str, Any], float] | None:
    """A failed result entry's `retry` (its worker says it may run again) and the wait it names, when the
    wait makes sense; None for an entry that did not fail or names no such wait."""
    if not isinstance(entry, dict) or not entry.get("failed"):
        return None
    hint = entry.get("retry")
    after = hint.get("after") if isinstance(hint, dict) else None
    if not isinstance(hint, dict) or not is_number(after) or not 0 <= after <= MAX_BACKOFF:
        return None
    return hint, float(after)


def lost_record(names: str) -> dict[str, Any]:
    """What an attempt whose worker was lost leaves."""
    return {"worker": names, "status": "lost", "error": f"worker {names} was lost while running it"}


def failed_record(worker: str, entry: dict[str, Any], after: float) -> dict[str, Any]:
    """What an attempt that failed and runs again after `after` seconds leaves: its error, bounded."""
    times = entry.get("timestamps") or {}
    return {
        "worker": worker,
        "status": str(entry.get("status", "error")),
        "error": one_line(entry),
        "errors": [str(e)[:MAX_ATTEMPT_ERROR] for e in (entry.get("errors") or [])[:3]],
        "started": times.get("started"),
        "completed": times.get("completed"),
        "retry_after": after,
    }


def one_line(entry: dict[str, Any]) -> str:
    """A failed entry's error in one line: its last message, else its traceback's last line."""
    for key in ("messages", "errors"):
        texts = [str(t) for t in entry.get(key) or [] if t]
        if texts:
            lines = texts[-1].strip().splitlines()
            return (lines[-1] if lines else "")[:MAX_ATTEMPT_ERROR]
    return str(entry.get("status", "failed"))
