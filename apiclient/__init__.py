"""`zfab submit|status|result|retry|input|cancel|watch|jobs|schedules|audit`: the CLI as a client of the HTTP API.

Not part of the API server: these commands speak HTTP only (the standard library's urllib, so
`zfab status` starts fast) and the server never imports them. They join the `zfab` command through
the entry point group "zfab.commands" (pyproject.toml), as `zfab api` does from api/cli.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the job and schedule commands to the `zfab` subcommands (`common` is not needed: they speak HTTP)."""
    from .audit import register as register_audit
    from .jobs import register as register_jobs
    from .schedules import register as register_schedules

    register_jobs(sub)
    register_schedules(sub)
    register_audit(sub)
