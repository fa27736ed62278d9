"""`zfab api`: registered with the `zfab` command through the entry point group "zfab.commands"
(pyproject.toml), so the fabric's CLI never imports the HTTP layer. Also `python -m zfab.api`.

Only the standard library is imported here (the server is imported when the command runs): every
`zfab` invocation loads this module. The commands that speak to the API over HTTP (`zfab submit`,
`status`, ...) are its clients and live apart, in apiclient/.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `api` to the `zfab` subcommands; `common` adds the flags every command shares."""
    a: argparse.ArgumentParser = sub.add_parser("api", help="run the HTTP control plane")
    common(a)
    a.add_argument("--host", dest="api_host", help="address to listen on (ZFAB_API_HOST)")
    a.add_argument("--port", dest="api_port", type=int, help="port to listen on (ZFAB_API_PORT)")
    a.set_defaults(fn=run)


def run(ns: argparse.Namespace) -> int:
    from .server import run_api

    run_api(ns)
    return 0
