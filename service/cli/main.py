"""The `zfab` parser (commands of other packages join through the zfab.commands entry points) and
main: a mistake the user can fix is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import sys

from .client import cmd_healthcheck, cmd_keys, cmd_limit, cmd_mmi, cmd_pause, cmd_run
from .common import EXIT_USAGE, UsageError, common_flags, curve_flags, metrics_flags, setting_error, version
from .local import cmd_up
from .roles import cmd_broker, cmd_worker

log = logging.getLogger("zfab")

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a command killed by it would exit


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zfab", description="zfab: a job fabric on ZeroMQ")
    p.add_argument("--version", action="version", version=f"zfab {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("broker", help="run the broker")
    common_flags(b)
    metrics_flags(b)
    b.add_argument("--endpoint", help="endpoint to bind (ZFAB_ENDPOINT; default ZFAB_BROKER)")
    b.add_argument(
        "--events-endpoint", dest="broker_events", help="bind an event publisher here (ZFAB_BROKER_EVENTS; off)"
    )
    b.add_argument(
        "--inventory",
        dest="broker_inventory",
        help="a NorFab inventory (file or directory) served to NorFab workers (ZFAB_BROKER_INVENTORY; off)",
    )
    b.add_argument(
        "--lease",
        dest="broker_lease",
        help="the lease deciding which broker is active: postgresql://... or k8s://NS/NAME (ZFAB_BROKER_LEASE; off)",
    )
    curve_flags(b, broker=True)
    b.set_defaults(fn=cmd_broker)

    w = sub.add_parser("worker", help="run a worker")
    common_flags(w)
    metrics_flags(w)
    w.add_argument(
        "--service", help="built-in service (demo, demo-async, files; default demo), or your --worker class's name"
    )
    w.add_argument("--worker", help="module:Class of your own Worker subclass")
    w.add_argument("--name", help="worker name (default: SERVICE-HOSTNAME, stable across restarts)")
    w.add_argument("--root", help="files service: directory to serve")
    w.add_argument("--data-dir", dest="data_dir", help="where the job store lives (ZFAB_DATA_DIR)")
    curve_flags(w)
    w.set_defaults(fn=cmd_worker)

    u = sub.add_parser(
        "up", help="broker + N demo workers (+ API) in one command, supervised: a child that dies is restarted"
    )
    common_flags(u)
    u.add_argument("--workers", type=int, default=2)
    u.add_argument("--api-port", dest="api_port", type=int, default=8000, help="0 = no API")
    u.add_argument("--api-host", dest="api_host", default="127.0.0.1")
    u.add_argument("--endpoint", help="endpoint the broker binds")
    u.add_argument(
        "--grace",
        type=float,
        help="seconds running jobs get to finish when the stack stops (default 10, or ZFAB_DRAIN_TIMEOUT)",
    )
    u.set_defaults(fn=cmd_up)

    r = sub.add_parser("run", help="run one job and print its result dictionary")
    common_flags(r)
    r.add_argument("service")
    r.add_argument("task")
    r.add_argument("--kwargs", help="JSON object")
    r.add_argument("--args", help="JSON list")
    r.add_argument("--workers", default="any", help="any, all, a worker name, or a JSON list of names")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds the job may take (default 60)")
    r.add_argument(
        "--retries", type=int, help="run again if it fails or its worker is lost (default: as its task declares)"
    )
    curve_flags(r)
    r.set_defaults(fn=cmd_run)

    m = sub.add_parser("mmi", help="ask the broker's management interface (show_workers, show_broker, ...)")
    common_flags(m)
    m.add_argument("task")
    m.add_argument("--kwargs", help="JSON object")
    m.add_argument("--timeout", type=float, default=5.0)
    curve_flags(m)
    m.set_defaults(fn=cmd_mmi)

    for verb, what in (("pause", "pause a service's queue: jobs are queued, none is sent"), ("resume", "resume it")):
        pr = sub.add_parser(verb, help=what)
        common_flags(pr)
        pr.add_argument("service")
        pr.add_argument("--timeout", type=float, default=5.0)
        curve_flags(pr)
        pr.set_defaults(fn=cmd_pause)

    li = sub.add_parser("limit", help="set a task's rate and concurrency limits at run time (or --clear them)")
    common_flags(li)
    li.add_argument("service")
    li.add_argument("task")
    li.add_argument("--rate", help="at most this many start, evenly spaced: 5/s, 100/m, 10 per hour")
    li.add_argument("--concurrency", type=int, help="at most this many at once, across all workers")
    li.add_argument("--key", help="apply both per value of this argument of the job")
    li.add_argument("--clear", action="store_true", help="back to what the task declares")
    li.add_argument("--timeout", type=float, default=5.0)
    curve_flags(li)
    li.set_defaults(fn=cmd_limit)

    # Commands from other installed packages (the HTTP API registers `zfab api` this way), so
    # the fabric never imports them: entry points of group "zfab.commands", each a
    # register(subparsers, common_flags) function.
    for ep in importlib.metadata.entry_points(group="zfab.commands"):
        try:
            ep.load()(sub, common_flags)
        except ImportError as exc:
            log.debug("zfab command %s unavailable: %s", ep.name, exc)

    k = sub.add_parser("keys", help="create a CURVE key pair (NAME.key public, NAME.key_secret secret)")
    k.add_argument("--dir", required=True, help="directory for the certificates")
    k.add_argument("--name", required=True, help="certificate name (the ZAP user id)")
    k.add_argument("--worker", help="bind this worker name to the key: only it may register as that worker")
    k.add_argument("--force", action="store_true", help="replace an existing key pair of that name")
    k.set_defaults(fn=cmd_keys)

    h = sub.add_parser("healthcheck", help="exit 0 if the broker answers MMI (or --url answers 2xx)")
    common_flags(h)
    curve_flags(h)
    h.add_argument("--url", help="check this HTTP URL instead, e.g. http://127.0.0.1:8000/readyz")
    h.add_argument("--timeout", type=float, default=3.0)
    h.set_defaults(fn=cmd_healthcheck)
    return p


def _command_parser(parser: argparse.ArgumentParser, cmd: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(cmd or "")
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    parser = build_parser()
    ns = parser.parse_args(argv)
    from ..errors import SecurityError

    try:
        code: int = ns.fn(ns)
        sys.stdout.flush()  # here, inside the try: a reader that left is found now, not at exit
    except BrokenPipeError:
        # `zfab jobs | head`: the reader is gone, which is no error of ours. Point stdout at
        # /dev/null so the interpreter's last flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        code = EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        code = 130
    except (SecurityError, UsageError) as exc:
        print(f"zfab {ns.cmd}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except ValidationError as exc:
        if not exc.title.endswith("Settings"):
            raise
        print(f"zfab {ns.cmd}: {setting_error(exc, ns, _command_parser(parser, ns.cmd))}", file=sys.stderr)
        code = EXIT_USAGE
    return code
