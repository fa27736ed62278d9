"""The suite's polling helper reports the real failure instead of swallowing it."""

from __future__ import annotations

import pytest
from conftest import wait_for


def test_a_condition_that_keeps_raising_reports_its_exception() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("nobody listens on 127.0.0.1:1")

    with pytest.raises(AssertionError, match="ConnectionRefusedError: nobody listens") as info:
        wait_for(refused, 0.05, 0.01, "the server")
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_a_condition_that_is_merely_false_says_so_without_a_cause() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the flag$") as info:
        wait_for(lambda: False, 0.05, 0.01, "the flag")
    assert info.value.__cause__ is None


def test_a_condition_that_raised_then_holds_passes() -> None:
    calls = iter([OSError("not yet"), True])

    def flaky() -> bool:
        r = next(calls)
        if isinstance(r, Exception):
            raise r
        return r

    wait_for(flaky, 1.0, 0.001, "flaky")
