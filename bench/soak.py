"""Soak: many jobs through a fabric whose workers are SIGKILLed and restarted, then an audit.

    python -m bench.soak --jobs 100000 --workers 3 --kill-every 5

Not part of CI. A broker and N `demo` workers run as processes; one client here keeps
up to --window jobs in flight (`demo.sleep` with a small random duration, and
`demo.echo`), each submitted with ``retries=1``. Meanwhile a thread SIGKILLs a random
worker every --kill-every seconds and starts it again under the same name and the same
ZFAB_DATA_DIR, so its job store survives the kill.

At the end it prints what happened to every job:

- submitted, completed, and failed with the reason (error class, or the result's status);
- duplicated: a job that ran to an end (state completed or failed) in more than one
  worker's job store (``ZFAB_DATA_DIR/workers/<name>.sqlite``, table ``jobs``), plus any
  job whose result dictionary has more than one entry. With --strict-stores, any uuid
  present in more than one store counts, including a job that was interrupted by a kill
  on one worker and then ran on another (which is what ``retries=1`` asks for);
- lost: a future not resolved by its deadline (the job's timeout plus a grace).

The exit code is 1 when duplicated or lost is non-zero, 2 when the run could not start.
Everything is bounded in time: submissions stop after --max-seconds, and waiting for the
results after that is bounded by the job timeout plus the grace. Processes are always
stopped and the temporary directory removed (unless --keep).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench.common import free_port, log_dir, log_path, spawn, stop, wait_for
from zfab import Client, JobFuture, Settings, ZfabError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
GRACE_S = 10.0  # beyond a job's own timeout before an unresolved future counts as lost
EXECUTED_STATES = ("completed", "failed")  # a job store row that ran to an end


@dataclass(slots=True)
class Record:
    """One submitted job and what the audit needs to check its answer."""

    future: JobFuture
    kind: str
    data: str | None
    deadline: float  # monotonic: resolved by then, or lost


@dataclass
class Outcome:
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    multi_entry: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    retried: set[str] = field(default_factory=set)
    failed_uuids: dict[str, list[str]] = field(default_factory=dict)

    def fail(self, reason: str, uuid: str) -> None:
        self.failed[reason] += 1
        self.failed_uuids.setdefault(reason, []).append(uuid)


class Fabric:
    """The broker and workers as processes; a worker can be killed and restarted by name."""

    def __init__(self, tmp: Path, n_workers: int, interval: float, multiplier: int, log_level: str) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.data_dir = tmp / "data"
        paths = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env = {
            "ZFAB_BROKER": self.endpoint,
            "ZFAB_DATA_DIR": str(self.data_dir),
            "ZFAB_KEEPALIVE_INTERVAL": str(interval),
            "ZFAB_KEEPALIVE_MULTIPLIER": str(multiplier),
            "ZFAB_LOG_LEVEL": log_level,
            "PYTHONPATH": os.pathsep.join(paths),
            "PYTHONUNBUFFERED": "1",
        }
        self.names = [f"soak-w{i}" for i in range(n_workers)]
        self.broker: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.spawned: list[subprocess.Popen[bytes]] = []  # every process ever started, for cleanup
        self.lock = threading.Lock()
        self.closing = False

    def _cli(self, *args: str) -> subprocess.Popen[bytes]:
        proc = spawn([sys.executable, "-m", "zfab.cli", *args], self.env)
        self.spawned.append(proc)
        return proc

    def start(self) -> None:
        self.broker = self._cli("broker", "--endpoint", self.endpoint)
        for name in self.names:
            self.start_worker(name)

    def start_worker(self, name: str) -> None:
        with self.lock:
            self._start_worker(name)

    def _start_worker(self, name: str) -> None:
        if not self.closing:
            self.workers[name] = self._cli("worker", "--service", "demo", "--name", name)

    def kill_and_restart(self, name: str) -> None:
        # Under the lock from kill to restart, so dead() never mistakes the victim for a crash.
        with self.lock:
            if self.closing:
                return
            proc = self.workers[name]
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # spawn() made it a group leader
            except ProcessLookupError:
                pass
            proc.wait()
            self._start_worker(name)

    def dead(self) -> list[str]:
        """Processes that exited on their own (not by our kill)."""
        with self.lock:
            procs = {"broker": self.broker, **self.workers}
            return [n for n, p in procs.items() if p is not None and p.poll() is not None]

    def stop(self) -> None:
        with self.lock:
            self.closing = True
        stop(self.spawned, timeout=15.0)

    def store_path(self, name: str) -> Path:
        return self.data_dir / "workers" / f"{name}.sqlite"

    def log_tail(self, lines: int = 10) -> str:
        out = ""
        with self.lock:
            procs = [p for p in (self.broker, *self.workers.values()) if p is not None]
        for proc in procs:
            path = log_path(proc)
            if path is not None and path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out += f"\n--- {path} ---\n" + "\n".join(tail)
        return out


class Killer(threading.Thread):
    """Every `every` seconds: SIGKILL a random worker and start it again under the same name."""

    def __init__(self, fabric: Fabric, every: float, rng: random.Random) -> None:
        super().__init__(name="soak-killer", daemon=True)
        self.fabric = fabric
        self.every = every
        self.rng = rng
        self.halt = threading.Event()
        self.kills: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(self.every):
                name = self.rng.choice(self.fabric.names)
                self.fabric.kill_and_restart(name)
                self.kills[name] += 1
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def _alive_workers(c: Client) -> set[str]:
    try:
        return {str(w["name"]) for w in c.mmi("show_workers", timeout=1) if w.get("alive")}
    except Exception:
        return set()


def _submit_all(
    c: Client, ns: argparse.Namespace, rng: random.Random, fabric: Fabric, killer: Killer, until: float
) -> tuple[list[Record], Counter[str]]:
    """Submit up to ns.jobs jobs with at most ns.window in flight, until the time budget ends."""
    window = threading.BoundedSemaphore(ns.window)
    records: list[Record] = []
    refused: Counter[str] = Counter()  # submit() raised: the job was not submitted, and is tried again
    started = last_report = time.monotonic()

    def release(_: Any) -> None:
        window.release()

    i = 0
    while i < ns.jobs:
        now = time.monotonic()
        if now >= until:
            print(f"soak: time budget of {ns.max_seconds:.0f} s spent; {ns.jobs - i} jobs not submitted", flush=True)
            break
        if now - last_report >= 5.0:
            last_report = now
            done = sum(1 for r in records if r.future.done())
            print(
                f"[{now - started:6.0f}s] submitted {len(records)}  done {done}  in flight {len(records) - done}  "
                f"kills {sum(killer.kills.values())}  refused {sum(refused.values())}",
                flush=True,
            )
            if dead := fabric.dead():
                raise RuntimeError(f"process(es) exited on their own: {', '.join(dead)}{fabric.log_tail()}")
        if not window.acquire(timeout=1.0):
            continue
        data: str | None
        kwargs: dict[str, Any]
        if rng.random() < ns.echo_share:
            kind, data = "echo", f"{i}-{rng.getrandbits(32):08x}"
            task, kwargs = "echo", {"data": data}
        else:
            kind, data = "sleep", None
            task, kwargs = "sleep", {"seconds": round(rng.uniform(0.0, ns.sleep_max), 4)}
        try:
            fut = c.submit("demo", task, kwargs=kwargs, timeout=ns.timeout, retries=1)
        except ZfabError as exc:
            window.release()
            refused[type(exc).__name__] += 1
            time.sleep(0.05)
            continue
        records.append(Record(fut, kind, data, time.monotonic() + ns.timeout + GRACE_S))
        fut.add_done_callback(release)
        i += 1
    return records, refused


def _audit_futures(records: list[Record]) -> Outcome:
    out = Outcome()
    for rec in records:
        fut = rec.future
        try:
            result = fut.result(timeout=max(0.0, rec.deadline - time.monotonic()))
        except TimeoutError:
            out.lost.append(fut.uuid)
            continue
        except ZfabError as exc:
            out.fail(type(exc).__name__, fut.uuid)
            continue
        if "retried" in fut.timings:
            out.retried.add(fut.uuid)
        if not isinstance(result, dict) or len(result) != 1:
            out.multi_entry.append(fut.uuid)
            continue
        (entry,) = result.values()
        if not isinstance(entry, dict):
            out.wrong.append(fut.uuid)
            continue
        if entry.get("failed"):
            errors = entry.get("errors") or [""]
            why = str(errors[0]).split(":", 1)[0] if entry.get("status") == "error" else ""
            out.fail(f"result status {entry.get('status')}{': ' + why if why else ''}", fut.uuid)
            continue
        if entry.get("juuid") != fut.uuid or (rec.kind == "echo" and entry.get("result") != rec.data):
            out.wrong.append(fut.uuid)
            continue
        out.completed += 1
    return out


def _audit_stores(fabric: Fabric, uuids: set[str]) -> tuple[dict[str, list[tuple[str, str]]], Counter[str]]:
    """uuid -> [(worker, state)] for every submitted uuid found in a worker's job store; rows by state."""
    where: dict[str, list[tuple[str, str]]] = {}
    states: Counter[str] = Counter()
    for name in fabric.names:
        path = fabric.store_path(name)
        if not path.exists():
            continue
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for uuid, state in db.execute("SELECT uuid, state FROM jobs"):
                if uuid in uuids:
                    where.setdefault(uuid, []).append((name, state))
                    states[state] += 1
        finally:
            db.close()
    return where, states


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak", description="Jobs through a fabric whose workers keep being killed; then an audit."
    )
    p.add_argument("--jobs", type=int, default=100_000, help="jobs to submit")
    p.add_argument("--workers", type=int, default=3, help="demo worker processes")
    p.add_argument("--kill-every", type=float, default=5.0, help="seconds between worker kills (0: no kills)")
    p.add_argument("--window", type=int, default=300, help="jobs in flight at most")
    p.add_argument("--max-seconds", type=float, default=1800.0, help="stop submitting after this long")
    p.add_argument("--timeout", type=float, default=60.0, help="each job's timeout, seconds")
    p.add_argument("--sleep-max", type=float, default=0.1, help="demo.sleep jobs sleep uniformly 0..this")
    p.add_argument("--echo-share", type=float, default=0.5, help="share of demo.echo among the jobs")
    p.add_argument("--keepalive-interval", type=float, default=0.5, help="ZFAB_KEEPALIVE_INTERVAL for all roles")
    p.add_argument("--keepalive-multiplier", type=int, default=4, help="ZFAB_KEEPALIVE_MULTIPLIER for all roles")
    p.add_argument(
        "--poll-after",
        type=float,
        default=None,
        help="client: seconds of quiet before it polls a job (default: its own)",
    )
    p.add_argument("--log-level", default="WARNING", help="ZFAB_LOG_LEVEL of the broker and workers")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--strict-stores", action="store_true", help="any uuid in more than one store is a duplicate")
    p.add_argument("--keep", action="store_true", help="keep the data directory and logs, and print where")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.jobs < 1 or ns.workers < 1 or ns.window < 1 or ns.timeout <= 0 or ns.max_seconds <= 0:
        raise SystemExit("--jobs, --workers, --window, --timeout and --max-seconds must be positive")
    seed = ns.seed if ns.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    signal.signal(signal.SIGTERM, _on_sigterm)
    tmp = Path(tempfile.mkdtemp(prefix="zfab-soak-"))
    fabric = Fabric(tmp, ns.workers, ns.keepalive_interval, ns.keepalive_multiplier, ns.log_level)
    killer = Killer(fabric, ns.kill_every, rng)
    print(
        f"soak: {ns.jobs} jobs, {ns.workers} workers, kill every {ns.kill_every:g} s, window {ns.window}, "
        f"retries=1, timeout {ns.timeout:g} s, keepalive {ns.keepalive_interval:g} s x{ns.keepalive_multiplier}, "
        f"seed {seed}, data {fabric.data_dir}",
        flush=True,
    )
    t0 = time.monotonic()
    settings = Settings(
        broker=fabric.endpoint,
        keepalive_interval=ns.keepalive_interval,
        keepalive_multiplier=ns.keepalive_multiplier,
    )
    records: list[Record] = []
    refused: Counter[str] = Counter()
    try:
        fabric.start()
        with Client(settings=settings, name="soak", poll_after=ns.poll_after) as c:
            want = set(fabric.names)
            if not wait_for(lambda: _alive_workers(c) >= want, 60, interval=0.2):
                print(f"soak: the workers did not register within 60 s{fabric.log_tail()}", file=sys.stderr)
                return 2
            if ns.kill_every > 0:
                killer.start()
            try:
                records, refused = _submit_all(c, ns, rng, fabric, killer, t0 + ns.max_seconds)
                submitted_in = time.monotonic() - t0
                outcome = _audit_futures(records)
            finally:
                killer.halt.set()
                if killer.is_alive():
                    killer.join(30)
            elapsed = time.monotonic() - t0
            # Let the workers settle (a last restart registers, job stores commit) before stopping them.
            wait_for(lambda: _alive_workers(c) >= want, 15, interval=0.2)
            client_counts = dict(c.counts)
            try:
                broker_counts = c.mmi("show_broker", timeout=5).get("counts", {})
            except Exception as exc:
                broker_counts = {"unavailable": repr(exc)}
        fabric.stop()  # SIGTERM: workers drain and close their job stores
        if killer.error is not None:
            print(f"soak: the killer thread failed: {killer.error!r}", file=sys.stderr)
        uuids = {r.future.uuid for r in records}
        where, states = _audit_stores(fabric, uuids)
        multi = {u: rows for u, rows in where.items() if len(rows) > 1}
        ran_twice = {u: rows for u, rows in multi.items() if sum(s in EXECUTED_STATES for _, s in rows) > 1}
        duplicated_stores = multi if ns.strict_stores else ran_twice
        duplicated = len(duplicated_stores) + len(outcome.multi_entry)
        lost = len(outcome.lost)
        n_failed = sum(outcome.failed.values())

        print("== soak result")
        print(f"submitted                 {len(records):>8}   in {submitted_in:.1f} s")
        print(f"completed                 {outcome.completed:>8}   ({len(records) / elapsed:.0f} jobs/s overall)")
        print(f"failed                    {n_failed:>8}")
        for reason, n in outcome.failed.most_common():
            print(f"  {reason:<40} {n:>8}")
        if outcome.wrong:
            print(f"wrong result              {len(outcome.wrong):>8}   e.g. {outcome.wrong[:3]}")
        rerun_same = sum(1 for u in outcome.retried if len(where.get(u, [])) == 1)
        print(
            f"retried after a loss      {len(outcome.retried):>8}   (answered; {rerun_same} in one store only: never "
            "stored by the lost worker, or run again by it after its restart)"
        )
        print(f"submit refused, re-tried  {sum(refused.values()):>8}   {dict(refused) or ''}")
        print(f"worker kills              {sum(killer.kills.values()):>8}   {dict(sorted(killer.kills.items()))}")
        print(f"client counters           {client_counts}")
        print(f"broker counters           {broker_counts}")
        print(f"job store rows by state   {dict(states.most_common())}")
        print(f"found in no job store     {len(uuids) - len(where):>8}")
        print(f"in more than one store    {len(multi):>8}   (ran to an end in more than one: {len(ran_twice)})")
        for u, rows in list(duplicated_stores.items())[:10]:
            print(f"  {u} {rows}")
        failed_but_ran: Counter[str] = Counter()
        for reason, failed_uuids in outcome.failed_uuids.items():
            for u in failed_uuids:
                if any(state == "completed" for _, state in where.get(u, [])):
                    failed_but_ran[reason] += 1
        print(f"failed, yet completed     {sum(failed_but_ran.values()):>8}   (in a job store) {dict(failed_but_ran)}")
        print(f"multi-entry results       {len(outcome.multi_entry):>8}")
        print(f"duplicated                {duplicated:>8}")
        print(f"lost                      {lost:>8}")
        for u in outcome.lost[:10]:
            print(f"  {u}")
        if ns.keep:
            findings = {
                "duplicated": {u: where.get(u, []) for u in [*duplicated_stores, *outcome.multi_entry]},
                "lost": {u: where.get(u, []) for u in outcome.lost},
                "failed": {r: {u: where.get(u, []) for u in us} for r, us in outcome.failed_uuids.items()},
            }
            (tmp / "soak-findings.json").write_text(json.dumps(findings, indent=1))
        if duplicated or lost:
            print("soak: FAILED (duplicated or lost jobs)", flush=True)
            return 1
        print("soak: OK", flush=True)
        return 0
    except RuntimeError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    finally:
        killer.halt.set()
        fabric.stop()
        if ns.keep:
            logs = sorted({str(p.parent) for p in map(log_path, fabric.spawned) if p is not None})
            print(f"soak: kept {tmp} and the logs in {', '.join(logs)}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            for proc in fabric.spawned:
                path = log_path(proc)
                if path is not None:
                    path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                log_dir().rmdir()  # only when empty: this process spawned nothing else


if __name__ == "__main__":
    raise SystemExit(main())
