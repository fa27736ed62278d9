"""`zfab schedules list|add|show|pause|resume|delete`: the API's /schedules from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from urllib.parse import quote

from zfab.cli import UsageError, json_flag

from .jobs import add_api_flags, client_of, guarded, table, when, workers_flag


def timing(s: dict[str, Any]) -> str:
    return f"every {s['every']:g}s" if s.get("every") is not None else f"cron {s.get('cron')}"


def show(s: dict[str, Any]) -> None:
    job = s.get("job") or {}
    lines = [
        ("id", s.get("id")),
        ("name", s.get("name")),
        ("job", f"{job.get('service')}/{job.get('task')} {json.dumps(job.get('kwargs') or {})}"),
        ("timing", timing(s)),
        ("state", s.get("state")),
        ("next run", when(s.get("next_run_at"))),
        ("last run", when(s.get("last_run_at"))),
        ("runs", s.get("runs")),
        ("failures", s.get("failures") or None),
        ("last error", s.get("last_error")),
        ("last jobs", ", ".join(s.get("last_jobs") or []) or None),
    ]
    for key, value in lines:
        if value is not None:
            print(f"{key + ':':<11} {value}")


def cmd_list(ns: argparse.Namespace) -> int:
    page = client_of(ns).call("GET", "/schedules", query={"limit": 1000})
    items = page.get("items", []) if isinstance(page, dict) else []
    if ns.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = [["ID", "NAME", "TIMING", "STATE", "NEXT RUN", "LAST RUN", "RUNS", "JOB"]]
    for s in items:
        job = s.get("job") or {}
        rows.append(
            [
                str(s.get("id")),
                str(s.get("name") or "-"),
                timing(s),
                str(s.get("state")),
                when(s.get("next_run_at")),
                when(s.get("last_run_at")),
                str(s.get("runs", 0)),
                f"{job.get('service')}/{job.get('task')}",
            ]
        )
    table(rows, sys.stdout)
    return 0


def cmd_add(ns: argparse.Namespace) -> int:
    if (ns.every is None) == (ns.cron is None):
        raise UsageError("give exactly one of --every SECONDS or --cron 'M H DOM MON DOW'")
    job: dict[str, Any] = {"service": ns.service, "task": ns.task}
    optional = {
        "args": json_flag("--args", ns.args, list),
        "kwargs": json_flag("--kwargs", ns.kwargs, dict),
        "workers": workers_flag(ns.workers),
        "timeout": ns.timeout,
    }
    job.update({k: v for k, v in optional.items() if v is not None})
    body: dict[str, Any] = {"job": job, "paused": ns.paused}
    for key in ("every", "cron", "name"):
        if getattr(ns, key) is not None:
            body[key] = getattr(ns, key)
    s = client_of(ns).call("POST", "/schedules", body)
    print(s["id"])
    return 0


def cmd_show(ns: argparse.Namespace) -> int:
    s = client_of(ns).call("GET", f"/schedules/{quote(ns.id, safe='')}")
    if ns.json:
        print(json.dumps(s, indent=2))
    else:
        show(s)
    return 0


def patcher(paused: bool) -> Any:
    def cmd(ns: argparse.Namespace) -> int:
        s = client_of(ns).call("PATCH", f"/schedules/{quote(ns.id, safe='')}", {"paused": paused})
        nxt = f", next run {when(s.get('next_run_at'))}" if s.get("next_run_at") else ""
        print(f"schedule {s.get('id')} {s.get('state')}{nxt}")
        return 0

    return cmd


def cmd_delete(ns: argparse.Namespace) -> int:
    client_of(ns).call("DELETE", f"/schedules/{quote(ns.id, safe='')}")
    print(f"schedule {ns.id} deleted")
    return 0


def register(sub: Any) -> None:
    top: argparse.ArgumentParser = sub.add_parser("schedules", help="periodic jobs (through the API)")
    verbs = top.add_subparsers(dest="verb", required=True)

    ls = verbs.add_parser("list", help="every schedule as a table")
    add_api_flags(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=guarded("schedules list", cmd_list))

    a = verbs.add_parser("add", help="create a schedule; prints its id")
    add_api_flags(a)
    a.add_argument("service")
    a.add_argument("task")
    a.add_argument("--every", type=float, help="seconds between firings")
    a.add_argument("--cron", help="five-field cron expression, UTC, e.g. '*/5 * * * *'")
    a.add_argument("--name", help="a label")
    a.add_argument("--kwargs", help="JSON object of keyword arguments")
    a.add_argument("--args", help="JSON list of positional arguments")
    a.add_argument("--workers", help="any (default), all, a worker name, or a JSON list of names")
    a.add_argument("--timeout", type=float, help="seconds each job may take (the API's default: 60)")
    a.add_argument("--paused", action="store_true", help="create it paused")
    a.set_defaults(fn=guarded("schedules add", cmd_add))

    for verb, fn, text in (
        ("show", cmd_show, "a schedule's details: next and last runs, last jobs"),
        ("pause", patcher(True), "pause a schedule"),
        ("resume", patcher(False), "resume a paused schedule (from now)"),
        ("delete", cmd_delete, "delete a schedule (its jobs stay)"),
    ):
        v = verbs.add_parser(verb, help=text)
        add_api_flags(v)
        v.add_argument("id", help="the schedule's id or name")
        if verb == "show":
            v.add_argument("--json", action="store_true")
        v.set_defaults(fn=guarded(f"schedules {verb}", fn))
