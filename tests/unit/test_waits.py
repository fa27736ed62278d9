"""tests/conftest.py's waits report the real failure: the exception their condition raised, not
only that time ran out."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from conftest import until, wait_for


def refusing() -> bool:
    raise ConnectionRefusedError("nobody listens on 127.0.0.1:1")


def test_a_condition_that_keeps_raising_is_reported_with_its_exception() -> None:
    with pytest.raises(AssertionError, match="ConnectionRefusedError: nobody listens") as info:
        wait_for(refusing, 0.05, 0.01, what="the server")
    assert "waiting for the server" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_an_exception_raised_before_the_condition_said_false_is_still_reported() -> None:
    answers = itertools.chain([None], itertools.repeat(False))

    def cond() -> bool:
        if next(answers) is None:
            raise KeyError("first look")
        return False

    with pytest.raises(AssertionError, match="said false, and earlier raised KeyError") as info:
        wait_for(cond, 0.05, 0.01)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_condition_that_only_said_false_times_out_naming_what() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the flag$"):
        wait_for(lambda: False, 0.05, 0.01, what="the flag")


def test_a_condition_that_raised_then_held_passes() -> None:
    answers = iter([None, True])

    def cond() -> bool:
        if next(answers) is None:
            raise OSError("starting")
        return True

    wait_for(cond, 5, 0.001)


def test_pytest_fail_inside_the_condition_ends_the_wait_at_once() -> None:
    calls = []

    def cond() -> bool:
        calls.append(1)
        pytest.fail("the process exited")

    with pytest.raises(pytest.fail.Exception, match="the process exited"):
        wait_for(cond, 30, 0.01)
    assert len(calls) == 1


def test_the_async_wait_reports_the_same_way() -> None:
    async def refused() -> bool:
        raise ConnectionResetError("reset by peer")

    with pytest.raises(AssertionError, match="ConnectionResetError: reset by peer"):
        asyncio.run(until(refused, 0.05, "the API", 0.01))
