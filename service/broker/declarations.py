"""A service's task declarations (argument schemas, with the redaction list and limits under `x-zfab`)
are fixed by the first worker that announces them: a later READY that announces one of them otherwise is
refused, counted and told why, not adopted. So a second worker cannot un-redact a task's secret arguments
or lift its limits by announcing it differently. An admin key (under CURVE, core/access.py) may change
them; otherwise they change once the service is forgotten (no worker, nothing queued, for
ZFAB_SERVICE_MEMORY_SECONDS). New tasks are added as they come, up to a bound.
"""

from __future__ import annotations

from typing import Any

MAX_DECLARED = 4000  # task declarations kept per service (each announcement holds at most workers.MAX_TASKS)


def conflict(declared: dict[str, Any], announced: dict[str, Any]) -> str | None:
    """Why `announced` may not be adopted beside what the service has fixed (None: it may)."""
    changed = sorted(t for t in announced if t in declared and announced[t] != declared[t])
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return (
            f"task {', '.join(repr(t) for t in changed[:3])}{more} announced with another schema, redaction or limits "
            "than the service's first worker declared; the service keeps its declarations (an admin key may change "
            "them, or they go with the service once it is forgotten)"
        )
    if len(declared.keys() | announced.keys()) > MAX_DECLARED:
        return f"the service declares {MAX_DECLARED} tasks already: no more are taken"
    return None


def fix(declared: dict[str, Any], announced: dict[str, Any], *, override: bool) -> None:
    """Adopt an accepted announcement: its new tasks (and, from an admin key, its changes too)."""
    for task, schema in announced.items():
        if override or task not in declared:
            declared[task] = schema
