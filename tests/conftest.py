"""Shared fixtures and waits. Integration helpers live in tests/integration/fabric.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import NoReturn

import pytest


@pytest.fixture(autouse=True, scope="session")
def _the_runs_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reads or writes the user's data directory (~/.local/share/zfab): a broker made with default
    settings keeps paused queues and run-time limits there, and every later broker would start with them.
    Module- and session-scoped fixtures get this run's directory; each test gets one of its own (below)."""
    old = os.environ.get("ZFAB_DATA_DIR")
    os.environ["ZFAB_DATA_DIR"] = str(tmp_path_factory.mktemp("zfab-data"))
    yield
    if old is None:
        os.environ.pop("ZFAB_DATA_DIR", None)
    else:
        os.environ["ZFAB_DATA_DIR"] = old


@pytest.fixture(autouse=True)
def _a_tests_data_dir(
    _the_runs_data_dir: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What one test's brokers and workers keep (paused queues, limits, job stores) is not the next test's."""
    monkeypatch.setenv("ZFAB_DATA_DIR", str(tmp_path_factory.mktemp("data", numbered=True)))


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.05, what: str = "condition") -> None:
    """Poll cond until it holds; fail the test with `what` after the deadline.

    A condition that raises is polled again (a server still starting refuses connections), and the
    last exception it raised is what the timeout reports, chained, so the real failure is not lost,
    even when later polls only said false. pytest.fail() or skip() inside cond end the wait at once.
    """
    deadline = time.monotonic() + timeout
    waited = Waited(what, timeout)
    while True:
        try:
            if cond():
                return
            waited.false()
        except Exception as e:
            waited.raised(e)
        if time.monotonic() > deadline:
            waited.fail()
        time.sleep(interval)


async def until(cond: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.05) -> None:
    """wait_for for an async condition (on the test's event loop): the same rule, the same report."""
    deadline = time.monotonic() + timeout
    waited = Waited(what, timeout)
    while True:
        try:
            if await cond():
                return
            waited.false()
        except Exception as e:
            waited.raised(e)
        if time.monotonic() > deadline:
            waited.fail()
        await asyncio.sleep(interval)


class Waited:
    """What a wait saw: how its condition last answered, and the last exception it raised."""

    def __init__(self, what: str, timeout: float) -> None:
        self.what = what
        self.timeout = timeout
        self.last: Exception | None = None
        self.last_raised = False

    def false(self) -> None:
        self.last_raised = False

    def raised(self, exc: Exception) -> None:
        self.last, self.last_raised = exc, True

    def fail(self) -> NoReturn:
        why = ""
        if self.last is not None:
            said = f"{type(self.last).__name__}: {self.last}"
            why = f"; the condition last raised {said}"
            if not self.last_raised:
                why = f"; it said false, and earlier raised {said}"
        raise AssertionError(f"timed out after {self.timeout} s waiting for {self.what}{why}") from self.last


def require_binary(name: str, package: str = "prometheus") -> str:
    """The path of an outside binary; skip when missing, except under CI=true where it must exist."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI=true (.ci/run installs it)")
        pytest.skip(f"{name} not installed (Debian package '{package}' provides it)")
    return path
