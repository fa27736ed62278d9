"""Payload rules that are easy to get subtly wrong: result entry timestamps."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from zfab.core.payloads import iso

EDGES = [0.0, 1e9, 1_700_000_000.0, 1_700_000_000.9999995, 1_700_000_000.0000005, 1e9 + 1.5e-6, 1e9 - 0.5e-6, -1.25]


@pytest.mark.parametrize("ts", EDGES)
def test_iso_says_what_datetime_says_at_the_edges_of_rounding(ts: float) -> None:
    assert iso(ts) == datetime.fromtimestamp(ts, UTC).isoformat()


def test_iso_says_what_datetime_says_for_many_times_in_and_across_seconds() -> None:
    rng = random.Random(7)
    base = 1_764_590_000.0
    times = [base + rng.uniform(-1e7, 1e7) for _ in range(20_000)]
    times += [base + i * 0.1 for i in range(100)]  # several in one second, then the next: the cache turns over
    for ts in times:
        assert iso(ts) == datetime.fromtimestamp(ts, UTC).isoformat(), ts


def test_iso_of_none_is_none() -> None:
    assert iso(None) is None
