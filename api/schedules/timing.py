"""When a schedule fires next: pure arithmetic on epoch seconds (no clock, no loop), so it is tested alone.

Policy, in one place:
- `every` runs on a fixed grid from the first due time (no drift from how long a firing took);
- `cron` is a five-field expression in UTC (minute hour day-of-month month day-of-week);
- whatever was missed (the API was down, or the loop was held up) fires **once**, as soon as the
  scheduler runs again, and the schedule then goes on from the next slot after now: never a burst of
  one firing per missed slot.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from croniter import CroniterBadDateError, croniter  # type: ignore[import-untyped, unused-ignore]

CRON_FIELDS = 5
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _field(value: str) -> str:
    item = rf"(?:\*|(?:{value})(?:-(?:{value}))?)(?:/[1-9][0-9]{{0,2}})?"
    return rf"{item}(?:,{item})*"


def _names(names: list[str]) -> str:
    return "|".join(names + [n.upper() for n in names])


# The five fields with their ranges, so that the OpenAPI schema itself tells a valid expression from an
# invalid one (`61 * * * *` does not match); croniter then parses what matched.
CRON_PATTERN = (
    "^"
    + " +".join(
        _field(v)
        for v in (
            "[0-5]?[0-9]",
            "[01]?[0-9]|2[0-3]",
            "0?[1-9]|[12][0-9]|3[01]",
            f"0?[1-9]|1[0-2]|{_names(MONTHS)}",
            f"[0-7]|{_names(DAYS)}",
        )
    )
    + "$"
)


CRON_RX = re.compile(CRON_PATTERN)


def cron_problem(expr: str) -> str | None:
    """Why `expr` is not a five-field cron expression, or None when it is one."""
    fields = expr.split()
    if len(fields) != CRON_FIELDS:
        return (
            f"a cron expression has {CRON_FIELDS} fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}: {expr!r}"
        )
    try:
        croniter(expr)
    except (ValueError, KeyError) as exc:  # croniter's errors derive from ValueError
        return f"not a valid cron expression: {expr!r} ({exc})"
    if not CRON_RX.match(expr):  # what croniter takes beyond the documented form (tabs, mixed-case names)
        return f"not a valid cron expression: {expr!r} (fields separated by spaces, values within their ranges)"
    return None


def next_cron(expr: str, after: float) -> float | None:
    """The first time strictly after `after` that `expr` (UTC) matches; None for one that never does
    (`0 0 30 2 *`: cron itself accepts such an expression and never runs it)."""
    try:
        it: Any = croniter(expr, datetime.fromtimestamp(after, UTC))
        return float(it.get_next(float))
    except CroniterBadDateError:
        return None


def next_every(due: float, every: float, now: float) -> float:
    """The next slot of the grid `due + k * every` that is after `now` (k >= 1): missed slots are skipped."""
    nxt = due + every
    if nxt > now:
        return nxt
    return due + every * (math.floor((now - due) / every) + 1)


def following(every: float | None, cron: str | None, due: float, now: float) -> float | None:
    """When a schedule that was due at `due` (and fired at `now`) is due again."""
    if every is not None:
        return next_every(due, every, now)
    assert cron is not None
    return next_cron(cron, max(due, now))


def first(every: float | None, cron: str | None, now: float) -> float | None:
    """When a new (or resumed, or re-timed) schedule is first due: one period from now, or cron's next match."""
    if every is not None:
        return now + every
    assert cron is not None
    return next_cron(cron, now)
