"""Drive a broker with NorFab 0.25's own NFPClient and report what it saw.

This script runs INSIDE a separate virtualenv that has ``norfab==0.25.0`` (see
``norfab_env.py``). It does not import zfab. It builds NorFab's ``NFPClient``
with CURVE off and calls ``run_job`` (``workers="any"`` by default). It then
calls MMI ``show_workers`` on ``mmi.service.broker`` and prints exactly one
JSON line on stdout::

    {"result": <run_job return value>,
     "show_workers": {"status": "200", "results": [...], "errors": []},
     "uuid": "<job uuid>", "elapsed": {"run_job": s, "mmi": s}}

It exits 0. On any failure it prints ``{"error": "...", ...details}`` and exits 1.
A job counts as failed when run_job returns None, or when the job ended STALE
(NorFab returns a dict of fake ``status="timeout"`` results after its deadline).
An MMI reply whose status is not "200" is also a failure.

A hard timeout stops it: SIGALRM, with a watchdog thread as a backstop, prints
an error line and exits. The script never hangs.

Usage::

    python norfab_driver.py --broker tcp://127.0.0.1:PORT --service demo --task echo \
        --kwargs '{"data": "hi"}' --timeout 20
    python norfab_driver.py --broker tcp://127.0.0.1:PORT --mmi-only --timeout 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from types import FrameType
from typing import Any, NoReturn, TextIO

EXIT_OK = 0
EXIT_ERROR = 1
# Slack beyond --timeout for client construction, MMI and shutdown.
HARD_TIMEOUT_SLACK_S = 15
# The watchdog thread fires this long after SIGALRM would have.
WATCHDOG_EXTRA_S = 5

_REAL_STDOUT: TextIO = sys.stdout
_emit_lock = threading.Lock()
_emitted = False
# Temporary client base directories to remove even when we exit through os._exit.
_cleanup_dirs: list[str] = []


def _emit(obj: dict[str, Any]) -> None:
    """Write the single JSON result line to the real stdout, at most once."""
    global _emitted
    with _emit_lock:
        if _emitted:
            return
        _emitted = True
        _REAL_STDOUT.write(json.dumps(obj, default=str) + "\n")
        _REAL_STDOUT.flush()


def _die(message: str, code: int = EXIT_ERROR, **details: Any) -> NoReturn:
    _emit({"error": message, **details})
    for path in _cleanup_dirs:
        shutil.rmtree(path, ignore_errors=True)
    # os._exit: NorFab threads or sockets may be stuck; do not wait for them.
    os._exit(code)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    _die(f"hard timeout: driver did not finish within its budget (signal {signum})")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broker", required=True, help="broker endpoint, e.g. tcp://127.0.0.1:5555")
    p.add_argument("--service", default="demo")
    p.add_argument("--task", default="echo")
    p.add_argument("--kwargs", default="{}", help="JSON object of task keyword arguments")
    p.add_argument("--args", default="[]", help="JSON list of task positional arguments")
    p.add_argument(
        "--workers",
        default="any",
        help='target: "any", "all", a worker name, or a JSON list of names',
    )
    p.add_argument("--timeout", type=float, default=20.0, help="run_job timeout in seconds")
    p.add_argument("--mmi-timeout", type=float, default=10.0, help="MMI show_workers timeout in seconds")
    p.add_argument("--name", default=None, help="client name = DEALER identity (default: unique)")
    p.add_argument("--mmi-only", action="store_true", help="skip run_job; only call MMI show_workers")
    p.add_argument("--log-level", default="WARNING", help="NorFab log level (logs go to stderr)")
    return p.parse_args(argv)


def _decode_workers(raw: str) -> str | list[str]:
    raw = raw.strip()
    if raw.startswith("["):
        value = json.loads(raw)
        if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
            raise ValueError("--workers JSON must be a list of strings")
        return value
    return raw


def _job_snapshot(client: Any, juuid: str) -> dict[str, Any]:
    """Pick the job-store fields that explain an outcome. Never raises."""
    try:
        job = client.job_db.get_job(juuid) or {}
    except Exception as exc:  # diagnostics only
        return {"snapshot_error": repr(exc)}
    keys = ("status", "errors", "workers_requested", "workers_dispatched", "workers_completed")
    return {k: job.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    opts = _parse_args(argv)
    try:
        kwargs = json.loads(opts.kwargs)
        args = json.loads(opts.args)
        workers = _decode_workers(opts.workers)
    except ValueError as exc:
        _die(f"bad arguments: {exc}")
    if not isinstance(kwargs, dict) or not isinstance(args, list):
        _die("bad arguments: --kwargs must be a JSON object and --args a JSON list")

    budget = (0 if opts.mmi_only else opts.timeout) + opts.mmi_timeout + HARD_TIMEOUT_SLACK_S
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(math.ceil(budget))
    watchdog = threading.Timer(
        budget + WATCHDOG_EXTRA_S, _die, args=("hard timeout: watchdog fired (SIGALRM did not)",)
    )
    watchdog.daemon = True
    watchdog.start()

    # NorFab logs through `logging`. Send every log line to stderr, and send any stray
    # print() there too, so stdout carries only our JSON line.
    logging.basicConfig(stream=sys.stderr, level=opts.log_level.upper())
    with contextlib.redirect_stdout(sys.stderr):
        return _run(opts, kwargs, args, workers)


def _run(opts: argparse.Namespace, kwargs: dict[str, Any], args: list[Any], workers: str | list[str]) -> int:
    try:
        from norfab.core.client import NFPClient
        from norfab.core.inventory import NorFabInventory
    except Exception as exc:
        _die(f"cannot import NorFab NFPClient: {exc!r}")

    name = opts.name or f"nf-interop-{os.getpid()}-{uuidlib.uuid4().hex[:8]}"
    out: dict[str, Any] = {}
    elapsed: dict[str, float] = {}
    # A fresh base_dir: NFPClient keeps a SQLite job store there and re-submits
    # any unfinished job it finds in it at construction.
    with tempfile.TemporaryDirectory(prefix="zfab-norfab-client-") as base_dir:
        _cleanup_dirs.append(base_dir)
        inventory = NorFabInventory(
            data={"broker": {"endpoint": opts.broker, "zmq_auth": False}},
            base_dir=base_dir,
        )
        try:
            client = NFPClient(inventory, opts.broker, name=name)
        except Exception as exc:
            _die(f"NFPClient construction failed: {exc!r}")
        try:
            if not opts.mmi_only:
                juuid = uuidlib.uuid4().hex
                out["uuid"] = juuid
                t0 = time.monotonic()
                result = client.run_job(
                    service=opts.service,
                    task=opts.task,
                    uuid=juuid,
                    args=args,
                    kwargs=kwargs,
                    workers=workers,
                    timeout=max(1, math.ceil(opts.timeout)),
                )
                elapsed["run_job"] = round(time.monotonic() - t0, 4)
                job = _job_snapshot(client, juuid)
                if result is None:
                    _die("run_job returned None (job failed or client stopped)", job=job, elapsed=elapsed)
                if job.get("status") == "STALE":
                    _die(
                        f"run_job timed out after {opts.timeout}s (job STALE)",
                        result=result,
                        job=job,
                        elapsed=elapsed,
                    )
                out["result"] = result

            t0 = time.monotonic()
            mmi = client.mmi(
                "mmi.service.broker",
                task="show_workers",
                timeout=max(1, math.ceil(opts.mmi_timeout)),
            )
            elapsed["mmi"] = round(time.monotonic() - t0, 4)
            if not isinstance(mmi, dict) or mmi.get("status") != "200":
                _die("MMI show_workers failed", show_workers=mmi, elapsed=elapsed, **out)
            out["show_workers"] = mmi
            out["elapsed"] = elapsed
        except Exception as exc:
            _die(f"driver error: {exc!r}", elapsed=elapsed, **out)
        finally:
            with contextlib.suppress(Exception):
                client.destroy()

    signal.alarm(0)
    _emit(out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
