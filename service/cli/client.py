"""`zfab run`, `mmi`, `healthcheck` and `keys`: one-shot commands through a Client, and CURVE keys."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from .common import ProgressLine, UsageError, failure_lines, json_flag, settings_of, setup_logging, workers_flag

log = logging.getLogger("zfab")


def _await_job(c: Any, fut: Any, hold: float) -> Any:
    """The job's result; BrokerUnavailableError once the broker has been silent for its hold time
    (the job's own timeout can be much longer: nobody should wait 60 s for a typo in --broker)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from ..errors import BrokerUnavailableError

    heard = time.monotonic()
    while True:
        try:
            return fut.result(timeout=min(0.25, hold / 4))
        except FutureTimeout:
            pass
        now = time.monotonic()
        if c.broker_alive:
            heard = now
        elif now - heard >= hold:
            raise BrokerUnavailableError(
                f"the broker at {c.broker} did not answer within its hold time ({hold:g} s); is it running? "
                "(--broker, ZFAB_BROKER)"
            )


def cmd_run(ns: argparse.Namespace) -> int:
    from ..client.client import Client
    from ..errors import ZfabError

    s = settings_of(ns)
    setup_logging(s.log_level if ns.log_level else "WARNING")
    kwargs = json_flag("--kwargs", ns.kwargs, dict, {})
    args = json_flag("--args", ns.args, list, [])
    workers = workers_flag(ns.workers)
    if ns.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {ns.timeout:g}")
    progress = ProgressLine(sys.stderr)
    with Client(settings=s, name="cli") as c:
        try:
            fut = c.submit(
                ns.service, ns.task, args, kwargs, workers, ns.timeout, on_event=progress.event, retries=ns.retries
            )
            result = _await_job(c, fut, s.keepalive_interval * s.keepalive_multiplier)
        except ValueError as exc:  # e.g. retries with a target other than "any"
            raise UsageError(str(exc)) from None
        except ZfabError as exc:
            progress.done()
            print(f"zfab run: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        progress.done()
    print(json.dumps(result, indent=2, default=str), flush=True)
    failed = failure_lines(result)
    if failed:  # the result above stays JSON for scripts; people read the tracebacks here
        print("\n".join(failed), file=sys.stderr)
    return 1 if any(isinstance(v, dict) and v.get("failed") for v in result.values()) else 0


def cmd_mmi(ns: argparse.Namespace) -> int:
    from ..client.client import Client
    from ..errors import ZfabError

    s = settings_of(ns)
    setup_logging(s.log_level if ns.log_level else "WARNING")
    kwargs = json_flag("--kwargs", ns.kwargs, dict, {})
    with Client(settings=s, name="cli-mmi") as c:
        try:
            print(json.dumps(c.mmi(ns.task, timeout=ns.timeout, **kwargs), indent=2, default=str))
        except ZfabError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_pause(ns: argparse.Namespace) -> int:
    """`zfab pause SERVICE` / `zfab resume SERVICE`: the broker's pause_service / resume_service."""
    from ..client.client import Client
    from ..errors import ZfabError

    s = settings_of(ns)
    setup_logging(s.log_level if ns.log_level else "WARNING")
    task = "pause_service" if ns.cmd == "pause" else "resume_service"
    with Client(settings=s, name="cli-mmi") as c:
        try:
            got = c.mmi(task, timeout=ns.timeout, service=ns.service)
        except ZfabError as exc:
            print(f"zfab {ns.cmd}: {exc}", file=sys.stderr)
            return 1
    state = "paused" if got.get("paused") else "running"
    already = "" if got.get("changed") else " (it was already)"
    print(f"service {ns.service}: {state}{already}; {got.get('queue_depth', 0)} jobs queued")
    return 0


def cmd_limit(ns: argparse.Namespace) -> int:
    """`zfab limit SERVICE TASK --rate 5/s --concurrency 2 [--key ARG]` / `--clear`: the broker's
    set_limit / clear_limit; prints the limit now in force."""
    from ..client.client import Client
    from ..errors import ZfabError

    s = settings_of(ns)
    setup_logging(s.log_level if ns.log_level else "WARNING")
    if ns.clear and (ns.rate or ns.concurrency or ns.key):
        raise UsageError("--clear takes no --rate, --concurrency or --key")
    kwargs: dict[str, Any] = {"service": ns.service, "task_name": ns.task}
    if not ns.clear:
        kwargs.update(rate_limit=ns.rate, concurrency=ns.concurrency, limit_key=ns.key)
    with Client(settings=s, name="cli-mmi") as c:
        try:
            got = c.mmi("clear_limit" if ns.clear else "set_limit", timeout=ns.timeout, **kwargs)
        except ZfabError as exc:
            said = getattr(exc, "results", None)  # a refusal's {"error", "detail"} (a JobError's)
            detail = said.get("detail") if isinstance(said, dict) else None
            print(f"zfab limit: {detail or exc}", file=sys.stderr)
            return 1
    parts = [
        p
        for p in (
            f"rate {got['rate_limit']}" if got.get("rate_limit") else "",
            f"at most {got['concurrency']} at once" if got.get("concurrency") else "",
            f"per {got['limit_key']}" if got.get("limit_key") else "",
        )
        if p
    ]
    print(f"{ns.service}.{ns.task}: {', '.join(parts) or 'no limit'} ({got.get('source')})")
    return 0


def cmd_healthcheck(ns: argparse.Namespace) -> int:
    """Exit 0 when healthy: for container HEALTHCHECKs (slim images have no curl)."""
    if ns.url:
        import urllib.request

        try:
            with urllib.request.urlopen(ns.url, timeout=ns.timeout) as r:
                return 0 if 200 <= r.status < 300 else 1
        except Exception as exc:
            print(f"unhealthy: {ns.url}: {exc}", file=sys.stderr)
            return 1
    from ..client.client import Client
    from ..errors import ZfabError

    s = settings_of(ns)
    logging.basicConfig(level=logging.ERROR)
    with Client(settings=s, name="healthcheck") as c:
        try:
            c.mmi("show_broker", timeout=ns.timeout)
        except ZfabError as exc:
            print(f"unhealthy: broker {s.broker}: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_keys(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from ..transport.security import create_keys

    key_dir = Path(ns.dir)
    existing = [p for p in (key_dir / f"{ns.name}.key", key_dir / f"{ns.name}.key_secret") if p.exists()]
    if existing and not ns.force:
        # A new pair would lock out every broker or worker that trusts the old public key.
        print(
            f"zfab keys: {existing[0]} already exists; not replacing the key pair (pass --force to replace it)",
            file=sys.stderr,
        )
        return 1
    public, secret = create_keys(key_dir, ns.name, ns.worker)
    print(f"public key:  {public}   (copy into the broker's ZFAB_CURVE_CLIENTS directory)")
    print(f"secret key:  {secret}   (keep private: ZFAB_CURVE_SECRET of the process it belongs to)")
    return 0
