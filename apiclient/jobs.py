"""`zfab submit|status|result|retry|input|cancel|watch|jobs`: jobs through the HTTP API, as a user wants them.

They speak HTTP only (`--api URL`, or ZFAB_API_URL; `--token` or ZFAB_API_TOKEN for the bearer token), so they
work from anywhere the API is reachable. Output for people goes to stdout (a uuid, a table, a
result's JSON), progress and errors to stderr.

Exit codes: 0 done (the job completed), 1 the job did not complete or the API refused, 2 a usage
mistake, 3 the job had not finished when the wait ended.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

from zfab.cli import EXIT_USAGE, UsageError, failure_lines, json_flag
from zfab.cli import workers_flag as cli_workers_flag
from zfab.core.states import FINAL_STATES, STATES, UNFINISHED_STATES, JobState

from .http import DEFAULT_URL, ApiClient, ApiError, ApiUnreachable

EXIT_FAILED = 1
EXIT_UNFINISHED = 3

# States of the API's job (core/states.py), and the words older APIs used ("error", "pending");
# anything else reads as "not finished" unless the job carries a finish time.
SUCCESS = {JobState.COMPLETED.value}
FINAL = {*FINAL_STATES, "error"}
UNFINISHED = {*UNFINISHED_STATES, "pending"}
WATCH_RECONNECT_SECONDS = 30.0


# ---- shared -------------------------------------------------------------------------------


def add_api_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api",
        dest="api_url",
        default=None,
        help=f"the zfab API's base URL (ZFAB_API_URL, default {DEFAULT_URL})",
    )
    p.add_argument(
        "--token",
        dest="api_token",
        default=None,
        help="bearer token for an API with ZFAB_API_TOKENS set (ZFAB_API_TOKEN)",
    )


def client_of(ns: argparse.Namespace) -> ApiClient:
    base = ns.api_url or os.environ.get("ZFAB_API_URL") or DEFAULT_URL
    return ApiClient(base=base, token=ns.api_token or os.environ.get("ZFAB_API_TOKEN") or None)


def auth_hint(exc: ApiError) -> str:
    """What to do about a 401: the API wants a token this command did not send, or not this one."""
    if exc.status != 401:
        return ""
    return " (give the API's token: ZFAB_API_TOKEN=... or --token ...; the API's own ZFAB_API_TOKENS lists them)"


def workers_flag(text: str | None) -> str | list[str] | None:
    return None if text is None else cli_workers_flag(text)


def guarded(name: str, fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command; API errors and usage mistakes become one line on stderr and an exit code."""

    def run(ns: argparse.Namespace) -> int:
        try:
            return fn(ns)
        except UsageError as exc:
            print(f"zfab {name}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ApiError as exc:
            print(f"zfab {name}: {exc}{auth_hint(exc)}", file=sys.stderr)
            return EXIT_FAILED
        except ApiUnreachable as exc:
            print(f"zfab {name}: {exc}", file=sys.stderr)
            return EXIT_FAILED

    return run


def is_final(job: dict[str, Any]) -> bool:
    state = str(job.get("state", ""))
    return state in FINAL or (state not in UNFINISHED and _finished_at(job) is not None)


def _finished_at(job: dict[str, Any]) -> Any:
    return job.get("finished_at") or job.get("completed_at")


def when(value: Any) -> str:
    """An API timestamp as `YYYY-MM-DD HH:MM:SS` UTC (the API's own zone), or '-'."""
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(str(value)).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return str(value)


def took(job: dict[str, Any]) -> str:
    start, end = job.get("started_at") or job.get("submitted_at"), _finished_at(job)
    try:
        secs = (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds()
    except (TypeError, ValueError):
        return "-"
    return f"{secs:.3f}s" if secs < 10 else f"{secs:.1f}s"


def why(job: dict[str, Any]) -> str:
    """The reason a job ended as it did (the API's `reason`, else its `error`), or ''."""
    reason = job.get("reason")
    if reason:
        return str(reason)
    err = job.get("error")
    if isinstance(err, dict):
        return ": ".join(str(err[k]) for k in ("type", "message") if err.get(k))
    return str(err) if err else ""


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


# ---- submit / status / result / cancel ------------------------------------------------------


def cmd_submit(ns: argparse.Namespace) -> int:
    body: dict[str, Any] = {"service": ns.service, "task": ns.task}
    optional = {
        "args": json_flag("--args", ns.args, list),
        "kwargs": json_flag("--kwargs", ns.kwargs, dict),
        "workers": workers_flag(ns.workers),
        "timeout": ns.timeout,
        "priority": ns.priority,
        "delay": ns.delay,
        "retries": ns.retries,
        "backoff": ns.backoff,
    }
    # Only what the user gave: the API's defaults stay the API's (the job timeout is 60 s there).
    body.update({k: v for k, v in optional.items() if v is not None})
    job = client_of(ns).call("POST", "/jobs", body)
    print(job["uuid"])
    return 0


def show_job(job: dict[str, Any], out: TextIO) -> None:
    lines = [
        ("uuid", job.get("uuid")),
        ("job", f"{job.get('service')}/{job.get('task')} on {json.dumps(job.get('workers'))}"),
        ("state", job.get("state")),
        ("reason", why(job) or None),
        ("submitted", when(job.get("submitted_at"))),
        ("started", when(job.get("started_at")) if job.get("started_at") else None),
        ("finished", when(_finished_at(job)) if _finished_at(job) else None),
        ("took", took(job) if _finished_at(job) else None),
        ("cancel requested", "yes" if job.get("cancel_requested") else None),
        ("attempt", job.get("attempt") if (job.get("attempt") or 1) > 1 else None),
        ("dead letter", "yes (zfab retry submits it again)" if job.get("dead") else None),
        ("retry of", job.get("retry_of")),
        ("retried as", job.get("retried_as")),
    ]
    for earlier in job.get("attempts") or []:
        if isinstance(earlier, dict):
            wait = earlier.get("retry_after")
            then = f" (next after {wait:g} s)" if isinstance(wait, int | float) else ""
            ended = f"{earlier.get('status')}: {earlier.get('error')}{then}"
            lines.append((f"attempt {earlier.get('attempt')}", ended))
    ask = job.get("input_request")
    if isinstance(ask, dict):
        lines.append(("waiting for input", f"{ask.get('question')} (answer: zfab input {job.get('uuid')} VALUE)"))
    for worker, entry in sorted((job.get("results") or {}).items()):
        if isinstance(entry, dict):
            lines.append((f"worker {worker}", worker_outcome(entry)))
    for key, value in lines:
        if value is not None:
            out.write(f"{key + ':':<18} {value}\n")
    # Tracebacks (an API with ZFAB_API_EXPOSE_TRACEBACKS on) as the lines they are, below the summary.
    if any(len(e.strip().splitlines()) > 1 for e in _errors(job)):
        out.write("\n".join(failure_lines(job.get("results"))) + "\n")


def _errors(job: dict[str, Any]) -> list[str]:
    results = job.get("results")
    if not isinstance(results, dict):
        return []
    return [str(e) for entry in results.values() if isinstance(entry, dict) for e in entry.get("errors") or []]


def worker_outcome(entry: dict[str, Any]) -> str:
    """`ok`, or `failed (its status): its first error line` for one worker's result entry."""
    if not entry.get("failed"):
        return "ok"
    status = entry.get("status")
    errors = entry.get("errors") or []
    first = str(errors[0]).strip().splitlines()[-1] if errors and str(errors[0]).strip() else ""
    return "failed" + (f" ({status})" if status and status != "failed" else "") + (f": {first[:120]}" if first else "")


def cmd_status(ns: argparse.Namespace) -> int:
    job = client_of(ns).call("GET", f"/jobs/{ns.uuid}")
    if ns.json:
        print(json.dumps(job, indent=2))
    else:
        show_job(job, sys.stdout)
    return 0


def wait_job(api: ApiClient, uuid: str, wait: float) -> dict[str, Any]:
    """The job once finished, or as it stands when `wait` seconds have passed (the API caps each long poll)."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        query = {"wait": f"{left:.3f}"} if left > 0 else None
        job: dict[str, Any] = api.call("GET", f"/jobs/{uuid}", query=query, timeout=max(left, 0) + 30)
        # Not finished yet with time left: the API's own cap (ZFAB_DEFAULT_WAIT_MAX) ended that long poll.
        if is_final(job) or time.monotonic() >= deadline:
            return job


def cmd_result(ns: argparse.Namespace) -> int:
    if ns.wait < 0:
        raise UsageError(f"--wait must be 0 or more seconds, got {ns.wait:g}")
    job = wait_job(client_of(ns), ns.uuid, ns.wait)
    if not is_final(job):
        print(f"zfab result: job {ns.uuid} is {job.get('state')}: not finished yet (try --wait N)", file=sys.stderr)
        return EXIT_UNFINISHED
    if job.get("results") is not None:
        print(json.dumps(job["results"], indent=2, default=str))
    if job.get("state") in SUCCESS:
        return 0
    print(f"zfab result: job {ns.uuid} {job.get('state')}" + (f": {why(job)}" if why(job) else ""), file=sys.stderr)
    return EXIT_FAILED


def cmd_retry(ns: argparse.Namespace) -> int:
    """POST /jobs/{uuid}/retry: the dead job again, as a new job; prints the new job's uuid."""
    if ns.wait is not None and ns.wait < 0:
        raise UsageError(f"--wait must be 0 or more seconds, got {ns.wait:g}")
    query = {"wait": f"{ns.wait:g}"} if ns.wait else None
    job = client_of(ns).call("POST", f"/jobs/{ns.uuid}/retry", query=query, timeout=(ns.wait or 0) + 30)
    print(job["uuid"], flush=True)
    if not ns.wait:
        return 0
    if not is_final(job):
        print(f"zfab retry: job {job['uuid']} is {job.get('state')}: not finished after {ns.wait:g} s", file=sys.stderr)
        return EXIT_UNFINISHED
    if job.get("state") in SUCCESS:
        return 0
    print(f"zfab retry: job {job['uuid']} {job.get('state')}" + (f": {why(job)}" if why(job) else ""), file=sys.stderr)
    return EXIT_FAILED


def cmd_input(ns: argparse.Namespace) -> int:
    """POST /jobs/{uuid}/input: the answer to a job's input request (a string, or JSON with --json)."""
    value: Any = ns.value
    if ns.json:
        try:
            value = json.loads(ns.value)
        except json.JSONDecodeError as exc:
            raise UsageError(f"VALUE is not JSON (--json): {exc.msg} at column {exc.colno}") from None
    body: dict[str, Any] = {"value": value}
    if ns.input_id is not None:
        body["input_id"] = ns.input_id
    job = client_of(ns).call("POST", f"/jobs/{ns.uuid}/input", body)
    state = job.get("state") if isinstance(job, dict) else None
    print(f"answered {ns.uuid}" + (f" (state: {state})" if state else ""))
    return 0


def cmd_cancel(ns: argparse.Namespace) -> int:
    job = client_of(ns).call("DELETE", f"/jobs/{ns.uuid}")
    print(f"cancel requested for {job.get('uuid', ns.uuid)} (state: {job.get('state')})")
    return 0


# ---- watch ----------------------------------------------------------------------------------


class WatchView:
    """Each event as a line on stdout; a progress bar on stderr when it is a terminal and events carry
    `progress`. When both are the same terminal the bar is cleared before a line and drawn again after."""

    WIDTH = 30

    def __init__(self, out: TextIO, err: TextIO, as_json: bool) -> None:
        self.out, self.err, self.as_json = out, err, as_json
        self.bar_on = err.isatty()
        self.bar = ""
        self.lock = threading.Lock()

    def event(self, ev: dict[str, Any]) -> None:
        progress = ev.get("progress")
        with self.lock:
            self._clear_bar()
            if self.as_json:
                self.out.write(json.dumps(ev) + "\n")
            else:
                stamp = str(ev.get("timestamp") or "")[11:19]
                pct = f"{float(progress) * 100:3.0f}% " if isinstance(progress, int | float) else ""
                kind = ev.get("event_type") or "event"
                who = ev.get("worker") or ""
                self.out.write(" ".join(x for x in (stamp, who, str(kind), pct + str(ev.get("message") or "")) if x))
                self.out.write("\n")
            self.out.flush()
            if isinstance(progress, int | float):
                pct_f = max(0.0, min(1.0, float(progress)))
                fill = round(pct_f * self.WIDTH)
                self.bar = f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {pct_f * 100:3.0f}%"
            self._draw_bar()

    def end(self, job: dict[str, Any]) -> None:
        with self.lock:
            self._clear_bar()
            self.bar = ""
            if self.as_json:
                self.out.write(json.dumps({"event": "end", "job": job}) + "\n")
            else:
                reason = why(job)
                self.out.write(f"{job.get('state')}" + (f": {reason}" if reason else "") + "\n")
            self.out.flush()

    def _clear_bar(self) -> None:
        if self.bar_on and self.bar:
            self.err.write("\r\x1b[K")
            self.err.flush()

    def _draw_bar(self) -> None:
        if self.bar_on and self.bar:
            self.err.write(self.bar)
            self.err.flush()


def cmd_watch(ns: argparse.Namespace) -> int:
    api = client_of(ns)
    view = WatchView(sys.stdout, sys.stderr, ns.json)
    last: str | None = None
    # A stream that closes without `end` was cut by an API restart: resume after the last event seen.
    deadline = time.monotonic() + WATCH_RECONNECT_SECONDS
    while True:
        try:
            for ev in api.events(f"/jobs/{ns.uuid}/events", last):
                if ev.event == "end":
                    job = ev.data if isinstance(ev.data, dict) else {}
                    view.end(job)
                    return 0 if job.get("state") in SUCCESS else EXIT_FAILED
                if isinstance(ev.data, dict):
                    view.event(ev.data)
                last = ev.id or last
                deadline = time.monotonic() + WATCH_RECONNECT_SECONDS
        except ApiUnreachable:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise ApiUnreachable(f"the event stream of {ns.uuid} kept closing before the job ended")
        time.sleep(1.0)  # between reconnects only, not a poll of the job


# ---- jobs -------------------------------------------------------------------------------------


def items_of(page: Any) -> list[dict[str, Any]]:
    items = page if isinstance(page, list) else (page or {}).get("items", [])
    return [i for i in items if isinstance(i, dict)]


def cmd_jobs(ns: argparse.Namespace) -> int:
    if ns.limit < 1:
        raise UsageError(f"--limit must be 1 or more, got {ns.limit}")
    query = {"limit": ns.limit, "state": ns.state, "service": ns.service, "task": ns.task}
    if ns.dead:
        query["dead"] = "true"
    items = items_of(client_of(ns).call("GET", "/jobs", query=query))
    # Filtered here as well, so the table is right against an API that does not filter yet.
    items = [
        i
        for i in items
        if (ns.state is None or i.get("state") == ns.state)
        and (ns.service is None or i.get("service") == ns.service)
        and (ns.task is None or i.get("task") == ns.task)
        and (not ns.dead or i.get("dead"))
    ]
    if ns.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = [["UUID", "STATE", "SERVICE", "TASK", "SUBMITTED", "TOOK", "REASON"]]
    for i in items:
        reason = why(i)
        rows.append(
            [
                str(i.get("uuid", "")),
                str(i.get("state", "")),
                str(i.get("service", "")),
                str(i.get("task", "")),
                when(i.get("submitted_at")),
                took(i) if is_final(i) else "-",
                reason if len(reason) <= 60 else reason[:57] + "...",
            ]
        )
    table(rows, sys.stdout)
    if len(items) == 0:
        print("(no jobs)", file=sys.stderr)
    return 0


# ---- registration -------------------------------------------------------------------------------


def register(sub: Any) -> None:
    """Add the job commands to `zfab`."""
    s: argparse.ArgumentParser = sub.add_parser("submit", help="submit a job through the API; prints its uuid")
    add_api_flags(s)
    s.add_argument("service")
    s.add_argument("task")
    s.add_argument("--kwargs", help="JSON object of keyword arguments")
    s.add_argument("--args", help="JSON list of positional arguments")
    s.add_argument("--workers", help="any (default), all, a worker name, or a JSON list of names")
    s.add_argument("--timeout", type=float, help="seconds the job may take, end to end (the API's default: 60)")
    s.add_argument("--priority", type=int, help="queue priority (higher runs first)")
    s.add_argument("--delay", type=float, help="seconds to wait before the job may start")
    s.add_argument("--retries", type=int, help="times to run it again if it fails or its worker is lost")
    s.add_argument("--backoff", type=float, help="seconds before the second attempt of a failed job (doubling)")
    s.set_defaults(fn=guarded("submit", cmd_submit))

    st = sub.add_parser("status", help="show a job's state (through the API)")
    add_api_flags(st)
    st.add_argument("uuid")
    st.add_argument("--json", action="store_true", help="print the API's JSON")
    st.set_defaults(fn=guarded("status", cmd_status))

    r = sub.add_parser("result", help="print a job's results as JSON (exit 3 if it has not finished)")
    add_api_flags(r)
    r.add_argument("uuid")
    r.add_argument("--wait", type=float, default=0.0, help="seconds to wait for it to finish (default 0)")
    r.set_defaults(fn=guarded("result", cmd_result))

    rt = sub.add_parser("retry", help="submit a dead job again (same request) as a new job; prints its uuid")
    add_api_flags(rt)
    rt.add_argument("uuid")
    rt.add_argument(
        "--wait",
        type=float,
        help="seconds to wait for the new job (exit 1 and its reason if it fails, 3 if it has not finished)",
    )
    rt.set_defaults(fn=guarded("retry", cmd_retry))

    i = sub.add_parser("input", help="answer a job's input request (state waiting)")
    add_api_flags(i)
    i.add_argument("uuid")
    i.add_argument("value", help="the answer, sent as a string (with --json: parsed as JSON)")
    i.add_argument("--json", action="store_true", help="VALUE is JSON (a number, true, an object...)")
    i.add_argument("--input-id", dest="input_id", help="the request's id, when the job asks more than once")
    i.set_defaults(fn=guarded("input", cmd_input))

    c = sub.add_parser("cancel", help="cancel a job (through the API)")
    add_api_flags(c)
    c.add_argument("uuid")
    c.set_defaults(fn=guarded("cancel", cmd_cancel))

    w = sub.add_parser("watch", help="follow a job's events as they happen, with a progress bar")
    add_api_flags(w)
    w.add_argument("uuid")
    w.add_argument("--json", action="store_true", help="one JSON object per event")
    w.set_defaults(fn=guarded("watch", cmd_watch))

    j = sub.add_parser("jobs", help="list recent jobs as a table (through the API)")
    add_api_flags(j)
    j.add_argument("--state", choices=STATES, help="only jobs in this state")
    j.add_argument("--service", help="only jobs of this service")
    j.add_argument("--task", help="only jobs of this task")
    j.add_argument("--dead", action="store_true", help="only dead letters: failed, expired or lost, not retried")
    j.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    j.add_argument("--json", action="store_true", help="print the items as JSON")
    j.set_defaults(fn=guarded("jobs", cmd_jobs))
