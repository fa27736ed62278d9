"""`zfab api`: serve the app with uvicorn (one process, one event loop, one fabric client)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType
from typing import Any

import uvicorn

from .app import create_app
from .auth import is_loopback_host
from .settings import ApiSettings

UVICORN_LEVELS = {"critical", "error", "warning", "info", "debug", "trace"}


def settings_from(ns: argparse.Namespace) -> ApiSettings:
    """Environment first, then the flags the user actually gave."""
    given: dict[str, Any] = {}
    for flag, field in (
        ("host", "api_host"),
        ("port", "api_port"),
        ("broker", "broker"),
        ("keepalive_interval", "keepalive_interval"),
        ("keepalive_multiplier", "keepalive_multiplier"),
        ("log_level", "log_level"),
    ):
        value = getattr(ns, flag, None)
        if value is not None:
            given[field] = value
    return ApiSettings(**given)


def run_api(ns: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT; exit code 2 when asked to listen beyond loopback without a token."""
    s = settings_from(ns)
    logging.basicConfig(
        level=getattr(logging, s.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not s.token_list() and not is_loopback_host(s.api_host):
        print(
            f"zfab api: refusing to listen on {s.api_host} without auth. Set ZFAB_API_TOKENS to one or more "
            "comma-separated bearer tokens, or listen on 127.0.0.1.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    host, port, level, access_log = s.api_host, s.api_port, s.log_level, s.api_access_log
    app = create_app(s)
    del s  # the app keeps only the tokens' digests; this frame lives as long as the server
    serve(app, host, port, log_level=level, access_log=access_log)


def serve(app: Any, host: str, port: int, *, log_level: str = "INFO", access_log: bool = False) -> None:
    """Run `app` under uvicorn as zfab does (also used by bench/bare_app.py, so both are measured alike)."""
    level = log_level.lower()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        workers=1,
        lifespan="on",
        log_config=None,  # keep zfab's log format; uvicorn's loggers propagate to the root logger
        log_level=level if level in UVICORN_LEVELS else "info",
        access_log=access_log,  # off by default: a log line per request costs more than the request
        server_header=False,
    )
    server = uvicorn.Server(config)

    def stop(signum: int, frame: FrameType | None) -> None:
        # Before uvicorn installs its own handler this stops the startup; afterwards uvicorn
        # re-raises the captured SIGTERM once it has shut down, and this makes that a clean exit 0.
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    server.run()
    if not server.started:
        print(f"zfab api: could not start on {host}:{port}; see the log above", file=sys.stderr)
        raise SystemExit(1)
