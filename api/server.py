"""`zfab api`: serve the app with uvicorn (one process, one event loop, one fabric client)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from service.settings import settings_from as service_settings_from

from .app import create_app
from .auth import is_loopback_host
from .settings import ApiSettings

# Below docker's default stop grace (10 s), so the API still shuts down cleanly (jobs written to disk).
GRACEFUL_SHUTDOWN_SECONDS = 8
UVICORN_LEVELS = {"critical", "error", "warning", "info", "debug", "trace"}


def settings_from(ns: argparse.Namespace) -> ApiSettings:
    """Environment first, then the flags the user actually gave."""
    s = service_settings_from(ns, ApiSettings)
    # The server keeps its jobs across restarts by default; an app built in-process (tests,
    # embedding) keeps them in memory unless told where.
    return s if s.api_db is not None else s.model_copy(update={"api_db": s.default_api_db()})


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

    def end_streams() -> None:
        # uvicorn waits for open responses before it stops: event streams would hold it forever.
        st = getattr(app.state, "zfab", None)
        if st is not None:
            st.jobs.close_streams()

    serve(app, host, port, log_level=level, access_log=access_log, on_exit=end_streams)


class ApiServer(uvicorn.Server):
    """uvicorn's server, telling the app when it is asked to stop (before it waits for open responses)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.on_exit is not None:
            self.on_exit()


def serve(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "INFO",
    access_log: bool = False,
    on_exit: Callable[[], None] | None = None,
) -> None:
    """Run `app` under uvicorn as zfab does (also used by bench/bare_app.py, so both are measured alike).

    `on_exit` runs when a stop is asked for (in the signal handler: it may only schedule work).
    Responses still open GRACEFUL_SHUTDOWN_SECONDS later (long downloads, long polls) are cut.
    """
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
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = ApiServer(config, on_exit)

    def stop(signum: int, frame: FrameType | None) -> None:
        # Before uvicorn installs its own handler this stops the startup; afterwards uvicorn
        # re-raises the captured SIGTERM once it has shut down, and this makes that a clean exit 0.
        server.should_exit = True
        if on_exit is not None:
            on_exit()

    signal.signal(signal.SIGTERM, stop)
    server.run()
    if not server.started:
        print(f"zfab api: could not start on {host}:{port}; see the log above", file=sys.stderr)
        raise SystemExit(1)
