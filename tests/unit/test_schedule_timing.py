"""When schedules fire: the pure rules of api/schedules/timing.py (no clock, no loop)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from zfab.api.schedules.timing import CRON_PATTERN, cron_problem, first, following, next_cron, next_every


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_every_keeps_a_fixed_grid_whatever_a_firing_took() -> None:
    # Due at 100, fired a little late at 100.3: next at 110, not 110.3
    assert next_every(100.0, 10.0, 100.3) == 110.0


def test_every_skips_the_slots_it_missed_instead_of_bursting() -> None:
    # Due at 100 but run only at 135 (the API was down): one firing now, the next at the grid's 140
    assert next_every(100.0, 10.0, 135.0) == 140.0
    # Exactly on a slot: that slot is now, so the next one
    assert next_every(100.0, 10.0, 130.0) == 140.0


def test_cron_is_utc_and_strictly_after() -> None:
    assert next_cron("*/5 * * * *", at("2026-01-01T10:02:00")) == at("2026-01-01T10:05:00")
    assert next_cron("*/5 * * * *", at("2026-01-01T10:05:00")) == at("2026-01-01T10:10:00")
    assert next_cron("0 3 * * MON-FRI", at("2026-01-02T04:00:00")) == at("2026-01-05T03:00:00")  # Fri -> Mon


def test_a_missed_cron_slot_fires_once_then_follows_from_now() -> None:
    due, now = at("2026-01-01T10:00:00"), at("2026-01-01T12:34:00")  # down for 30 slots
    assert following(None, "*/5 * * * *", due, now) == at("2026-01-01T12:35:00")


def test_a_cron_that_never_matches_has_no_next_run() -> None:
    assert cron_problem("0 0 30 2 *") is None  # cron accepts it too, and never runs it
    assert next_cron("0 0 30 2 *", at("2026-01-01T00:00:00")) is None
    assert first(None, "0 0 30 2 *", 0.0) is None


def test_first_runs_one_period_from_now() -> None:
    assert first(60.0, None, 1000.0) == 1060.0
    assert first(None, "0 * * * *", at("2026-01-01T10:30:00")) == at("2026-01-01T11:00:00")


@pytest.mark.parametrize(
    "expr", ["*/5 * * * *", "0 3 * * *", "0,30 8-18 * * mon-fri", "15 2 1 JAN *", "0 0 * * 7", "5-3 * * * *"]
)
def test_valid_cron_expressions_pass_both_the_schema_pattern_and_the_parser(expr: str) -> None:
    assert cron_problem(expr) is None
    assert re.search(CRON_PATTERN, expr)


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("61 * * * *", "out of range"),
        ("0 24 * * *", "out of range"),
        ("*/0 * * * *", "step"),
        ("* * * *", "5 fields"),
        ("0 * * * * *", "5 fields"),
        ("@daily", "5 fields"),
        ("a b c d e", "not a valid cron expression"),
    ],
)
def test_invalid_cron_expressions_say_why_and_fail_the_schema_pattern(expr: str, says: str) -> None:
    problem = cron_problem(expr)
    assert problem is not None and says in problem
    assert not re.search(CRON_PATTERN, expr)
