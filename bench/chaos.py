"""`make chaos`: jobs through the API while workers are SIGKILLed at random, and the broker and the API
once each; then every job is audited against what the task itself counted (issue 39).

    python -m bench.chaos --jobs 20000 --workers 3 --kill-every 2

A broker, N workers (tests/integration/declared_workers.py's Counter: each run appends its token to a
file before it does anything else) and one API run as processes on 127.0.0.1. A pool of HTTP threads
POSTs `count.mark` jobs (`retries: 1`); a chaos thread SIGKILLs a random worker every --kill-every
seconds and starts it again under its name (its job store survives), SIGKILLs the broker once (at a
third of the jobs) and the API once (at two thirds), each started again at once. Then every accepted
job is read until final and checked:

- final, with a reason when not completed (never left `queued`/`running`);
- executed (lines in the marks file) no more often than its reported `attempt`, and completed only if
  it ran;
- asked to retry and cut short (`lost`, or failed `interrupted`) only with its retry spent;
- a refused POST (4xx, or 503 still after 60 s of sending it again) never ran.

POSTs go out with an Idempotency-Key (the job's token) and are sent again under it when unanswered
(the API killed under them) or refused with 503, as a careful client does. Also measured: POSTs never
answered, jobs answered 202 that the restarted API does not know (its crash window), and the
executions per state. Exit 1 on a violation.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import free_port, spawn, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
COUNTER = "tests.integration.declared_workers:Counter"
FINAL = {"completed", "failed", "cancelled", "expired", "lost"}


@dataclass
class Sent:
    token: str
    status: int | None = None  # None: no answer (the API was killed under it)
    uuid: str | None = None
    unknown: bool = False  # 202 with outcome_unknown
    job: dict[str, Any] | None = None  # as finally read


@dataclass
class Stack:
    tmp: Path
    workers: int
    history: int = 10_000  # jobs the API remembers (ZFAB_JOB_HISTORY): every job of the soak, to audit it
    interval: float = 0.3
    multiplier: int = 3
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.bport, self.aport = free_port(), free_port()
        self.env = {
            "ZFAB_BROKER": f"tcp://127.0.0.1:{self.bport}",
            "ZFAB_DATA_DIR": str(self.tmp / "data"),
            "ZFAB_KEEPALIVE_INTERVAL": str(self.interval),
            "ZFAB_KEEPALIVE_MULTIPLIER": str(self.multiplier),
            "ZFAB_TEST_MARKS": str(self.tmp / "marks"),
            "ZFAB_POOL_SIZE": "2",
            "ZFAB_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            "ZFAB_JOB_HISTORY": str(self.history),
        }
        self.api = f"http://127.0.0.1:{self.aport}"

    def start(self, name: str, *args: str) -> None:
        p = spawn([sys.executable, "-m", "zfab.cli", *args], env=self.env)
        with self.lock:
            self.procs[name] = p

    def kill(self, name: str) -> None:
        with self.lock:
            p = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(10)

    def broker(self) -> None:
        self.start("broker", "broker", "--endpoint", self.env["ZFAB_BROKER"])

    def worker(self, n: int) -> None:
        self.start(f"w{n}", "worker", "--worker", COUNTER, "--name", f"w{n}")

    def api_up(self, timeout: float = 40) -> bool:
        self.start("api", "api", "--host", "127.0.0.1", "--port", str(self.aport))
        return wait_for(lambda: _status(f"{self.api}/readyz") == 200, timeout, 0.1)

    def stop(self) -> None:
        stop(list(self.procs.values()))


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def marks(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def soak(
    tmp: Path,
    jobs: int,
    *,
    workers: int = 3,
    kill_every: float = 2.0,
    threads: int = 8,
    seed: int | None = None,
    worker_kills: int = 0,
) -> dict[str, Any]:
    """Run the soak in `tmp`; its figures and violations (an empty list when every promise held).

    A worker is killed every `kill_every` seconds and, with `worker_kills`, also at that many evenly
    spaced points of the submissions: a run that got faster still sees at least that many kills."""
    rng = random.Random(seed)
    st = Stack(tmp, workers, history=max(10_000, jobs + 1000))
    sent = [Sent(f"t{i}") for i in range(jobs)]
    done = threading.Event()
    progress = [0]
    kills: Counter[str] = Counter()
    started = time.monotonic()
    try:
        st.broker()
        for n in range(workers):
            st.worker(n)
        if not st.api_up():
            raise RuntimeError("the API did not get ready in 40 s")
        wait_for(lambda: _alive(st) >= workers, 30, 0.1)

        kill_at = [jobs * (k + 1) // (worker_kills + 1) for k in range(worker_kills)]

        def chaos() -> None:
            broker_at, api_at = jobs // 3, 2 * jobs // 3
            next_kill = time.monotonic() + kill_every
            while not done.wait(0.05) or kill_at:
                if broker_at is not None and progress[0] >= broker_at:
                    broker_at = None
                    st.kill("broker")
                    kills["broker"] += 1
                    time.sleep(0.5)
                    st.broker()
                if api_at is not None and progress[0] >= api_at:
                    api_at = None
                    st.kill("api")
                    kills["api"] += 1
                    st.api_up()
                marked = bool(kill_at) and progress[0] >= kill_at[0]
                if marked:
                    kill_at.pop(0)
                if marked or time.monotonic() >= next_kill:
                    next_kill = time.monotonic() + kill_every
                    n = rng.randrange(workers)
                    st.kill(f"w{n}")
                    kills["worker"] += 1
                    time.sleep(0.2)
                    st.worker(n)

        chaos_thread = threading.Thread(target=chaos, name="chaos", daemon=True)
        chaos_thread.start()
        local = threading.local()

        def post(s: Sent) -> None:
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = httpx.Client(timeout=30)
            body = {"service": "count", "task": "mark", "kwargs": {"token": s.token, "seconds": 0.02}, "retries": 1}
            # As a careful client does: a POST without an answer (the API died under it) or refused with
            # 503 is sent again under the same Idempotency-Key, so it names one job whatever happened.
            key = {"Idempotency-Key": s.token}
            give_up = time.monotonic() + 60
            while time.monotonic() < give_up:
                try:
                    r = c.post(f"{st.api}/jobs", json=body, headers=key)
                except httpx.HTTPError:
                    s.status = None
                    time.sleep(0.2)
                    continue
                s.status = r.status_code
                if r.status_code in (200, 202):
                    b = r.json()
                    s.uuid, s.unknown = b["uuid"], bool(b.get("outcome_unknown"))
                    break
                if r.status_code != 503:
                    break
                time.sleep(0.2)  # Retry-After says 1 s; the soak keeps its pace
            progress[0] += 1

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(post, sent))
        submitted_in = time.monotonic() - started
        done.set()
        chaos_thread.join(30)
        # Every worker back, then read every accepted job until final (bounded)
        for n in range(workers):
            if st.procs[f"w{n}"].poll() is not None:
                st.worker(n)
        deadline = time.monotonic() + 120 + jobs / 20  # a job's timeout (60 s) and a hold time are far inside

        def read(s: Sent) -> None:
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = httpx.Client(timeout=30)
            while s.uuid is not None and time.monotonic() < deadline:
                try:
                    r = c.get(f"{st.api}/jobs/{s.uuid}", params={"wait": 5})
                except httpx.HTTPError:
                    time.sleep(0.2)
                    continue
                if r.status_code == 404:
                    s.job = {"state": "unknown to the API"}
                    return
                if r.status_code == 200 and r.json().get("state") in FINAL:
                    s.job = r.json()
                    return
                if r.status_code != 200:
                    time.sleep(0.2)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, sent))
        time.sleep(2 * st.interval * st.multiplier)  # a late execution would show by now
        ran = marks(tmp / "marks")
        return audit(sent, ran, kills, submitted_in, time.monotonic() - started)
    finally:
        done.set()
        st.stop()


def _alive(st: Stack) -> int:
    try:
        found = httpx.get(f"{st.api}/mmi/workers", params={"status": "alive"}, timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return 0
    return len(found) if isinstance(found, list) else 0


def audit(sent: list[Sent], ran: Counter[str], kills: Counter[str], submit_s: float, total_s: float) -> dict[str, Any]:
    """The figures, and every broken promise."""
    violations: list[str] = []
    states: Counter[str] = Counter()
    runs_by_state: Counter[str] = Counter()
    retried = forgotten = unanswered_ran = 0
    for s in sent:
        n = ran.get(s.token, 0)
        if s.uuid is None:
            if s.status is None:
                states["unanswered"] += 1
                unanswered_ran += n > 0
            else:
                states[f"refused {s.status}"] += 1
                if n:
                    violations.append(f"{s.token}: refused {s.status} but ran {n}x")
            continue
        job = s.job or {"state": "not final in time"}
        state = str(job.get("state"))
        states[state] += 1
        runs_by_state[state] += n
        if state == "unknown to the API":
            forgotten += 1  # acknowledged, then not found: the API's crash window (a broken promise)
            violations.append(f"{s.token} ({s.uuid}): answered {s.status}, then unknown to the API")
            continue
        if state not in FINAL:
            violations.append(f"{s.token} ({s.uuid}): {state}")
            continue
        attempt = int(job.get("attempt", 1))
        retried += attempt > 1
        if n > attempt:
            violations.append(f"{s.token} ({s.uuid}): ran {n}x, reported attempt {attempt}")
        if state == "completed" and n == 0:
            violations.append(f"{s.token} ({s.uuid}): completed but never ran")
        reason = str(job.get("reason") or "")
        if state != "completed" and not reason:
            violations.append(f"{s.token} ({s.uuid}): {state} without a reason")
        cut = state == "lost" or (state == "failed" and "interrupted" in reason)
        if cut and attempt < 2:
            violations.append(f"{s.token} ({s.uuid}): {state} at attempt {attempt} with a retry asked: {reason[:120]}")
    return {
        "jobs": len(sent),
        "accepted": sum(1 for s in sent if s.uuid is not None),
        "outcome_unknown_answers": sum(1 for s in sent if s.unknown),
        "states": dict(states),
        "executions": sum(ran.values()),
        "executions_by_state": dict(runs_by_state),
        "retried_jobs": retried,
        "accepted_then_unknown_to_the_api": forgotten,
        "unanswered_that_ran": unanswered_ran,
        "kills": dict(kills),
        "submit_seconds": round(submit_s, 1),
        "total_seconds": round(total_s, 1),
        "violations": violations,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--kill-every", type=float, default=2.0, help="seconds between worker kills")
    p.add_argument("--threads", type=int, default=8, help="HTTP threads posting jobs")
    p.add_argument("--seed", type=int)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ns = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="zfab-chaos-"))
    try:
        figures = soak(tmp, ns.jobs, workers=ns.workers, kill_every=ns.kill_every, threads=ns.threads, seed=ns.seed)
    finally:
        if not ns.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    kinds = Counter(v.split(": ", 1)[1].split(" (")[0][:40] for v in figures["violations"])
    shown = {**figures, "violations": figures["violations"][:20], "violation_kinds": dict(kinds)}
    print(json.dumps(shown, indent=2))
    return 1 if figures["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
