"""Shared fixtures and waits. Integration helpers live in tests/integration/fabric.py."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import pytest


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.05, what: str = "condition") -> None:
    """Poll cond until it holds; fail the test with `what` after the deadline.

    A condition that raises is polled again (a server still starting refuses connections), but the
    last exception it raised is what the timeout reports, chained, so the real failure is not lost.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            if cond():
                return
            last = None
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            why = f"; the condition last raised {type(last).__name__}: {last}" if last is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{why}") from last
        time.sleep(interval)


def require_binary(name: str, package: str = "prometheus") -> str:
    """The path of an outside binary; skip when missing, except under CI=true where it must exist."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI=true (.ci/run installs it)")
        pytest.skip(f"{name} not installed (Debian package '{package}' provides it)")
    return path
