"""Shared fixtures. Integration helpers live in tests/integration/fabric.py."""

from __future__ import annotations

import os
import shutil

import pytest


def require_binary(name: str) -> str:
    """The path of an outside binary; skip when missing, except under CI=true where it must exist."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI=true (.ci/run installs it)")
        pytest.skip(f"{name} not installed (Debian package 'prometheus' provides it)")
    return path
