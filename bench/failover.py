"""Failover (issue 41, docs/failover.md): two brokers on a PostgreSQL lease, 2 demo workers, a client here that
lists both; a steady load of echo jobs (a window of jobs outstanding) and N times a kill -9 of the active
broker, then the killed one started again as the standby.

Reported: the time to serve again after each kill (the first probe job submitted after the kill that
completes: median and worst of N), the load's jobs/s in the 3 s before each kill, during the outage and in
the 3 s after it; then, idle, what the standby costs: its CPU (% of one core, /proc) beside the active
broker's, and the lease database's transactions per second (both brokers' round trips: the holder's renewals
and the standby's reads, pg_stat_database). Needs PostgreSQL's binaries (Debian package postgresql).

    python -m bench.failover [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from typing import Any

from bench.common import cpu_seconds, free_port, report, wait_for
from bench.harness import Fabric, http_json
from tests.integration import pgserver
from zfab import Client, Settings

WINDOW = 20  # jobs outstanding in the load
AROUND = 3.0  # s of load measured before and after each kill


class Load:
    """Keeps WINDOW echo jobs outstanding; notes each completion's time."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.done: list[float] = []
        self.stopping = threading.Event()
        self.slots = threading.Semaphore(WINDOW)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            if not self.slots.acquire(timeout=0.5):
                continue
            try:
                fut = self.client.submit("demo", "echo", kwargs={"data": "x"}, timeout=60)
            except Exception:  # busy, closing: try again
                self.slots.release()
                time.sleep(0.01)
                continue
            fut.add_done_callback(self._ended)

    def _ended(self, fut: Any) -> None:
        if fut.exception() is None:
            self.done.append(time.monotonic())
        self.slots.release()

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.done if start <= t < end) / max(1e-6, end - start)


def run(quick: bool = False) -> dict[str, float]:
    rounds = 3 if quick else 5
    pg = pgserver.started()
    try:
        lease = pg.create_database("bench")
        with tempfile.TemporaryDirectory(prefix="zfab-bench-fo-") as tmp, Fabric(tmp) as fab:
            ports = {n: (free_port(), free_port()) for n in ("a", "b")}
            eps = {n: f"tcp://127.0.0.1:{p}" for n, (p, _) in ports.items()}
            listing = ",".join(eps.values())
            procs: dict[str, Any] = {}

            def start(n: str) -> None:
                args = [*fab.cli, "broker", "--endpoint", eps[n], "--lease", lease, "--metrics-port", str(ports[n][1])]
                procs[n] = fab.spawn(args)

            def ready(n: str) -> bool:
                try:
                    return http_json(f"http://127.0.0.1:{ports[n][1]}/readyz", timeout=1.0)[0] == 200
                except Exception:
                    return False

            def active() -> str | None:
                up = [n for n in procs if procs[n].poll() is None and ready(n)]
                return up[0] if len(up) == 1 else None

            start("a")
            assert wait_for(lambda: active() == "a", 30), "broker a never became active"
            start("b")
            for w in ("fo-1", "fo-2"):
                fab.start_worker(w, ZFAB_BROKER=listing)
            serve: list[float] = []
            before: list[float] = []
            during: list[float] = []
            after: list[float] = []
            with Client(settings=Settings(broker=listing), name="bench-fo").start() as c:
                c.run_job("demo", "echo", kwargs={"data": "warm"}, timeout=60)
                load = Load(c)
                load.thread.start()
                try:
                    for _ in range(rounds):
                        time.sleep(AROUND)
                        victim = active()
                        assert victim is not None, "no single active broker"
                        t0 = time.monotonic()
                        os.killpg(procs[victim].pid, signal.SIGKILL)
                        procs[victim].wait(10)
                        served = None
                        while served is None and time.monotonic() - t0 < 30:
                            probe = c.submit("demo", "echo", kwargs={"data": "probe"}, timeout=30)
                            try:
                                probe.result(0.25)
                                served = time.monotonic() - t0
                            except Exception:
                                pass
                        assert served is not None, "no broker served within 30 s"
                        serve.append(served)
                        before.append(load.rate(t0 - AROUND, t0))
                        during.append(load.rate(t0, t0 + served))
                        time.sleep(AROUND)
                        after.append(load.rate(t0 + served, t0 + served + AROUND))
                        start(victim)  # the standby now
                finally:
                    load.stopping.set()
                    load.thread.join(5)
                time.sleep(3)  # idle from here
                idle = 10.0 if quick else 20.0
                now_active = active() or "a"
                standby = "b" if now_active == "a" else "a"
                db = lease.rsplit("/", 1)[1]
                q = f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{db}'"
                cpu0 = {n: cpu_seconds(procs[n].pid) for n in eps}
                x0 = int(pg.sql(pg.url(), q)[0][0])  # type: ignore[call-overload]
                time.sleep(idle)
                x1 = int(pg.sql(pg.url(), q)[0][0])  # type: ignore[call-overload]
                cpu = {n: 100.0 * (cpu_seconds(procs[n].pid) - cpu0[n]) / idle for n in eps}
    finally:
        pg.destroy()
    figures = {
        "failover_serve_median_s": statistics.median(serve),
        "failover_serve_worst_s": max(serve),
        "failover_jobs_per_s_before": statistics.median(before),
        "failover_jobs_per_s_during": statistics.median(during),
        "failover_jobs_per_s_after": statistics.median(after),
        "failover_idle_standby_cpu_pct": cpu[standby],
        "failover_idle_active_cpu_pct": cpu[now_active],
        "failover_idle_lease_db_tps": (x1 - x0) / idle,
    }
    print(f"   serve again after kill -9, each of {rounds}: " + " ".join(f"{s:.2f}" for s in serve) + " s")
    report("serve again (median)", figures["failover_serve_median_s"], "s")
    report("serve again (worst)", figures["failover_serve_worst_s"], "s")
    report("jobs/s before a kill", figures["failover_jobs_per_s_before"], "/s")
    report(
        "jobs/s during the outage",
        figures["failover_jobs_per_s_during"],
        "/s",
        figures["failover_jobs_per_s_before"],
        vs="before",
    )
    report(
        "jobs/s after", figures["failover_jobs_per_s_after"], "/s", figures["failover_jobs_per_s_before"], vs="before"
    )
    report("idle standby CPU", figures["failover_idle_standby_cpu_pct"], "%core")
    report("idle active CPU", figures["failover_idle_active_cpu_pct"], "%core")
    report("idle lease db xact/s", figures["failover_idle_lease_db_tps"], "/s")
    return figures


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    run(quick=p.parse_args().quick)
