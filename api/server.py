"""`zfab api`: serve the app with uvicorn (one process, one event loop, one fabric client)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from email.utils import formatdate
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

from zfab import tune_process
from zfab.core.access import AccessError, AccessFile
from zfab.settings import settings_from as service_settings_from

from .http.app import create_app
from .http.auth import is_loopback_host
from .settings import ApiSettings

# Below docker's default stop grace (10 s), so the API still shuts down cleanly (jobs written to disk).
GRACEFUL_SHUTDOWN_SECONDS = 8
IDLE_CHECK_SECONDS = 30.0  # a stop is woken at once; this is only the fallback (uvicorn ticks every 0.1 s)
UVICORN_LEVELS = {"critical", "error", "warning", "info", "debug", "trace"}


def settings_from(ns: argparse.Namespace) -> ApiSettings:
    """Environment first, then the flags the user actually gave."""
    s = service_settings_from(ns, ApiSettings)
    # The server keeps its jobs across restarts by default; an app built in-process (tests,
    # embedding) keeps them in memory unless told where.
    return s if s.api_db is not None else s.model_copy(update={"api_db": s.default_api_db()})


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound listening socket for host:port; OSError (port in use, no such address) before anything starts.

    Bound here rather than by uvicorn, which opens the broker connection and the job database first and
    then exits with a logged traceback-like line when the port is taken.
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(addr)
        sock.listen(2048)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def run_api(ns: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT; exit code 2 when asked to listen beyond loopback without a token,
    or when the address cannot be bound."""
    s = settings_from(ns)
    logging.basicConfig(
        level=getattr(logging, s.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not s.token_list() and not s.access_file and not is_loopback_host(s.api_host):
        print(
            f"zfab api: refusing to listen on {s.api_host} without auth. Set ZFAB_API_TOKENS to one or more "
            "comma-separated bearer tokens (or ZFAB_ACCESS_FILE: docs/roles.md), or listen on 127.0.0.1.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if s.access_file:
        try:
            AccessFile(s.access_file)  # read once here: a bad file is one clear line, not a traceback
        except AccessError as exc:
            print(f"zfab api: the access file: {exc} (ZFAB_ACCESS_FILE, docs/roles.md)", file=sys.stderr)
            raise SystemExit(2) from None
    host, port, level, access_log, broker = s.api_host, s.api_port, s.log_level, s.api_access_log, s.broker
    try:
        sock = listen_socket(host, port)
    except OSError as exc:
        print(
            f"zfab api: cannot listen on {host}:{port}: {exc.strerror or exc} (--port, ZFAB_API_PORT)", file=sys.stderr
        )
        raise SystemExit(2) from None
    app = create_app(s)
    del s  # the app keeps only the tokens' digests; this frame lives as long as the server
    jobs_known = 0

    def end_streams() -> None:
        # uvicorn waits for open responses before it stops: event streams would hold it forever.
        nonlocal jobs_known
        st = getattr(app.state, "zfab", None)
        if st is not None:
            jobs_known = len(st.jobs)
            st.jobs.close_streams()

    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host

    def ready() -> None:
        print(f"zfab api ready on http://{shown}:{bound_port} (broker {broker}; console /ui, docs /docs)", flush=True)

    serve(app, host, port, log_level=level, access_log=access_log, on_exit=end_streams, sock=sock, on_ready=ready)
    print(f"zfab api stopped ({jobs_known} jobs in its table)", flush=True)


class ApiServer(uvicorn.Server):
    """uvicorn's server, telling the app when it is asked to stop (before it waits for open responses)
    and when it listens (`on_ready`, once the app's startup is done)."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_exit: Callable[[], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.on_exit = on_exit
        self.on_ready = on_ready
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._date_second = 0

    async def main_loop(self) -> None:
        """uvicorn's loop, without its tick: it woke an idle API ten times a second (bench/idle.py)
        to refresh the Date header and look for a stop. A stop now wakes it (`handle_exit`), and
        each request refreshes the Date header itself (`dated`); the loop only looks again every
        IDLE_CHECK_SECONDS in case a stop came some other way."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        should_exit = await self.on_tick(0)  # sets the default headers, Date among them
        while not should_exit:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), IDLE_CHECK_SECONDS)
            should_exit = await self.on_tick(0)

    def refresh_date(self) -> None:
        """Before a request's answer starts: the Date header of the current second.

        uvicorn hands each request the list of default headers when its headers arrive, and reads
        it when the answer starts, so the Date entry is replaced in that same list."""
        now = int(time.time())
        if now == self._date_second:
            return
        self._date_second = now
        headers = self.server_state.default_headers
        for i, (name, _) in enumerate(headers):
            if name == b"date":
                headers[i] = (b"date", formatdate(now, usegmt=True).encode())
                break

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        tune_process()  # after the app's startup, so what it made is frozen too (core/tuning.py)
        if self.on_ready is not None:
            self.on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
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
    sock: socket.socket | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run `app` under uvicorn as zfab does (also used by bench/bare_app.py, so both are measured alike).

    `on_exit` runs when a stop is asked for (in the signal handler: it may only schedule work).
    Responses still open GRACEFUL_SHUTDOWN_SECONDS later (long downloads, long polls) are cut.
    `sock`, when given, is the already bound socket to serve on; `on_ready` runs once it serves.
    """
    level = log_level.lower()
    server: ApiServer | None = None

    async def dated(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and server is not None:
            server.refresh_date()
        await app(scope, receive, send)

    config = uvicorn.Config(
        dated,
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
    if on_ready is not None and level in ("info", "warning"):
        # uvicorn's own startup and shutdown lines would repeat the ready and stopped lines the caller prints.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    server = ApiServer(config, on_exit, on_ready)

    def stop(signum: int, frame: FrameType | None) -> None:
        # Before uvicorn installs its own handler this stops the startup; afterwards uvicorn
        # re-raises the captured SIGTERM once it has shut down, and this makes that a clean exit 0.
        server.should_exit = True
        if on_exit is not None:
            on_exit()

    signal.signal(signal.SIGTERM, stop)
    server.run(sockets=[sock] if sock is not None else None)
    if not server.started:
        print(f"zfab api: could not start on {host}:{port}; see the log above", file=sys.stderr)
        raise SystemExit(1)
