"""What the commands share: usage errors, settings from flags and ZFAB_* variables, the flags
every role takes, logging, the wait for a stop signal, the metrics port, and the progress line."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import signal
import threading
from typing import Any, TextIO

from ..settings import Settings, settings_from

log = logging.getLogger("zfab")


EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake in the command line or the settings: printed as one line, exit code 2."""


def version() -> str:
    try:
        return importlib.metadata.version("zfab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def settings_of(ns: argparse.Namespace, **extra: Any) -> Settings:
    return settings_from(ns, Settings, **extra)


def json_flag(flag: str, text: str | None, kind: type[Any], default: Any = None) -> Any:
    """The value of a JSON-valued flag, or a UsageError saying where the JSON is wrong."""
    if text is None:
        return default
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(value, kind):
        raise UsageError(f"{flag} must be a JSON {'object' if kind is dict else 'list'}, got {text!r}")
    return value


def workers_flag(text: str) -> str | list[str]:
    return json_flag("--workers", text, list) if text.startswith("[") else text


def setting_error(exc: Exception, ns: argparse.Namespace, parser: argparse.ArgumentParser | None) -> str:
    """One line naming each bad setting as the user gave it (flag or ZFAB_* variable) and what is wrong."""
    flags: dict[str, str] = {}
    if parser is not None:
        flags = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    parts = []
    for err in exc.errors():  # type: ignore[attr-defined]
        field = str(err["loc"][0]) if err.get("loc") else ""
        given = getattr(ns, field, None)
        name = flags.get(field, "--" + field.replace("_", "-")) if given is not None else f"ZFAB_{field.upper()}"
        parts.append(f"{name}={err.get('input')!r}: {err.get('msg')}")
    return "bad setting " + "; ".join(parts or [str(exc)])


class ProgressLine:
    """Shows a job's events on a stream as they come: a bar redrawn in place on a terminal,
    one line per event elsewhere (a log file or a pipe must stay readable)."""

    WIDTH = 24

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.drawn = False
        self.lock = threading.Lock()  # events arrive on the client's owner thread

    def event(self, ev: dict[str, Any]) -> None:
        message = str(ev.get("message") or ev.get("event_type") or "")
        worker = ev.get("worker")
        who = f"{worker}: " if worker else ""
        progress = ev.get("progress")
        with self.lock:
            if isinstance(progress, int | float):
                pct = max(0.0, min(1.0, float(progress)))
                fill = round(pct * self.WIDTH)
                bar = f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {pct * 100:3.0f}% {who}{message}"
                if self.tty:
                    self.out.write("\r\x1b[K" + bar)
                    self.drawn = True
                else:
                    self.out.write(bar + "\n")
            else:
                self._clear()
                self.out.write(f"{who}{message}\n")
            self.out.flush()

    def _clear(self) -> None:
        if self.drawn:
            self.out.write("\r\x1b[K")
            self.drawn = False

    def done(self) -> None:
        with self.lock:
            if self.drawn:
                self.out.write("\n")
                self.out.flush()
                self.drawn = False


def failure_lines(results: Any) -> list[str]:
    """Each failed worker's errors of a result dictionary as lines to print: a traceback reads as the
    traceback it is, not as one JSON string full of \\n."""
    lines: list[str] = []
    if not isinstance(results, dict):
        return lines
    for worker, entry in sorted(results.items(), key=lambda kv: str(kv[0])):
        if not (isinstance(entry, dict) and entry.get("failed")):
            continue
        errors = [str(e) for e in entry.get("errors") or [] if str(e).strip()]
        if not errors:
            continue
        status = entry.get("status")
        lines.append(f"worker {worker} failed" + (f" ({status})" if status and status != "failed" else "") + ":")
        for error in errors:
            lines.extend("  " + line for line in error.rstrip().splitlines())
    return lines


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def catch_stop_signals() -> threading.Event:
    """SIGINT/SIGTERM set the returned event from now on.

    A role calls this before it starts: its peers see it as soon as its socket connects, so a
    supervisor may stop it before it is "ready". Under the default action that signal would kill
    the process without its DISCONNECT, and the broker would hold a dead worker for a hold time.
    """
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def wait_for_signal(stop: threading.Event) -> None:
    while not stop.wait(3600):
        pass


def common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="broker endpoint to connect to (ZFAB_BROKER)")
    p.add_argument(
        "--keepalive-interval", dest="keepalive_interval", type=float, help="seconds (ZFAB_KEEPALIVE_INTERVAL)"
    )
    p.add_argument("--keepalive-multiplier", dest="keepalive_multiplier", type=int, help="(ZFAB_KEEPALIVE_MULTIPLIER)")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO, WARNING (ZFAB_LOG_LEVEL)")


def curve_flags(p: argparse.ArgumentParser, broker: bool = False) -> None:
    p.add_argument("--curve-secret", dest="curve_secret", help="own CURVE secret certificate (ZFAB_CURVE_SECRET)")
    if broker:
        p.add_argument("--curve-clients", dest="curve_clients", help="directory of accepted public certificates")
        p.add_argument(
            "--insecure", action="store_const", const=True, help="allow a non-loopback endpoint without CURVE"
        )
    else:
        p.add_argument("--curve-server-key", dest="curve_server_key", help="the broker's public certificate")


def metrics_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", dest="metrics_port", type=int, help="port for /metrics and /healthz, 0 = off")
    p.add_argument("--metrics-host", dest="metrics_host", help="address for the metrics port")


class _NoMetrics:
    """What metrics_server gives when no port is set: a server with nothing to shut down."""

    def shutdown(self) -> None:
        pass


def metrics_server(s: Settings, **roles: Any) -> Any:
    """The role's /metrics server (shutdown() when the role stops), or a stand-in without a port."""
    if not s.metrics_port:
        return _NoMetrics()
    from ..metrics import serve_metrics

    try:
        return serve_metrics(s.metrics_host, s.metrics_port, **roles)
    except OSError as exc:
        where = f"{s.metrics_host}:{s.metrics_port}"
        raise UsageError(f"cannot serve metrics on {where}: {exc.strerror or exc} (--metrics-port)") from None
