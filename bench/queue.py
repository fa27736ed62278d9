"""The broker as a job queue: head-of-line blocking, draining a deep queue, and the prefetch default.

1. Head-of-line: two demo workers with one thread each (ZFAB_POOL_SIZE=1). One long job
   (sleep 3 s) goes first; once it runs, 6 short jobs (sleep 0.2 s) are submitted at once.
   Reported: the time until all 6 finished, with ZFAB_WORKER_PREFETCH=0 (credits 1: the
   broker holds the short jobs for the free worker; ideal 6 x 0.2 = 1.2 s) beside
   ZFAB_WORKER_PREFETCH=4 (credits 5: some short jobs can be sent to the busy worker and wait
   behind the long one, about 3 s).
2. A queue of 10,000: a worker registers the service and stops; 10,000 echo jobs are submitted
   with no live worker (they wait at the broker, ZFAB_SERVICE_QUEUE_SIZE raised to 20,000 so
   the bound is not what is measured); then a worker starts. Reported: jobs/s from its first
   result to the last (and from the worker's start), beside the same worker's pipelined
   jobs/s (window 200) with nothing queued, in the same run.
3. Prefetch sweep: one demo worker, pool 4, ZFAB_WORKER_PREFETCH = 0, 1, 4, 16, 64 (a fresh
   worker each), pipelined echo jobs/s (window 200) and sequential p50, so the default can be
   chosen from measurements.

    python -m bench.queue [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import wait as wait_futures
from typing import Any

from bench.common import percentile, pipelined, report, wait_for
from bench.harness import Fabric, wait_mmi_workers

PREFETCHES = (0, 1, 4, 16, 64, -1)  # -1: adaptive (ADAPTIVE, below)


def _client(fab: Fabric, name: str, **kw: Any) -> Any:
    from zfab import Client, Settings

    return Client(settings=Settings(broker=fab.endpoint, **kw), name=name)


def _alive(c: Any, name: str) -> bool:
    try:
        return any(w.get("name") == name and w.get("alive") for w in c.mmi("show_workers", timeout=2))
    except Exception:
        return True


# ------------------------------------------------------------------ head-of-line


def _short_burst(c: Any, n: int) -> list[float]:
    """Submit ``n`` sleep-0.2 jobs at once; each one's completion time, in seconds from the submit."""
    t0 = time.perf_counter()
    ends: list[float] = []
    shorts = [c.submit("demo", "sleep", kwargs={"seconds": 0.2}, timeout=30) for _ in range(n)]
    for f in shorts:
        f.add_done_callback(lambda _f: ends.append(time.perf_counter() - t0))
    for f in shorts:
        f.result(40)
    wait_for(lambda: len(ends) == n, 5, 0.01)
    return ends


ADAPTIVE = -1  # ZFAB_WORKER_PREFETCH unset: the worker sizes it from its run times (the default)


def _prefetch_env(prefetch: int) -> dict[str, str]:
    return {} if prefetch == ADAPTIVE else {"ZFAB_WORKER_PREFETCH": str(prefetch)}


def _label(prefetch: int) -> str:
    return "adaptive" if prefetch == ADAPTIVE else f"{prefetch:>2}"


def head_of_line(tmp: str, prefetch: int, trials: int) -> dict[str, float]:
    env = {"ZFAB_POOL_SIZE": "1", **_prefetch_env(prefetch)}
    times, long_first = [], []
    with Fabric(tmp) as fab:
        fab.start_broker()
        fab.start_worker("hol-a", **env)
        fab.start_worker("hol-b", **env)
        with _client(fab, "hol") as c:
            wait_mmi_workers(c, 2, service="demo")
            for _ in range(trials):
                long = c.submit("demo", "sleep", kwargs={"seconds": 3.0}, timeout=30)
                wait_for(lambda f=long: f.state == "running", 5, 0.01)
                time.sleep(0.1)
                ends = _short_burst(c, 6)
                times.append(max(ends))
                long.result(40)
                long_first.append(sum(1 for e in ends if e > 2.5))
    return {"s": statistics.median(times), "behind": statistics.median(long_first)}


# ------------------------------------------------------------------ deep queue


def deep_queue(tmp: str, n: int) -> dict[str, float]:
    broker_env = {"ZFAB_SERVICE_QUEUE_SIZE": str(2 * n)}
    with Fabric(tmp) as fab:
        fab.start_broker(**broker_env)
        fab.start_worker("q-1")
        with _client(fab, "queue", max_client_jobs=2 * n) as c:
            wait_mmi_workers(c, 1, service="demo")
            live = pipelined(c, min(n, 5000), 200)
            fab.stop_worker("q-1")
            if not wait_for(lambda: not _alive(c, "q-1"), 30, 0.2):
                raise RuntimeError("the stopped worker still shows alive")
            t_sub = time.perf_counter()
            futs = [c.submit("demo", "echo", kwargs={"data": i}, timeout=600) for i in range(n)]
            submit_s = time.perf_counter() - t_sub
            adm = [f.admission for f in futs]
            _, pending = wait_futures(adm, timeout=120)
            if pending:
                raise RuntimeError(f"{len(pending)} of {n} jobs not admitted within 120 s")
            hows: dict[str, int] = {}
            for f in adm:
                key = f.result() if f.exception() is None else type(f.exception()).__name__
                hows[key] = hows.get(key, 0) + 1
            queued = hows.get("queued", 0)
            shown = c.mmi("show_services", timeout=5)
            depth = next((s.get("queue_depth") for s in shown if s.get("service") == "demo"), None)
            firsts: list[float] = []
            t_start = time.perf_counter()
            fab.start_worker("q-2")
            first = futs[0]
            first.add_done_callback(lambda f: firsts.append(time.perf_counter()))
            _, failed = wait_futures(futs, timeout=600)
            t_end = time.perf_counter()
            errors = sum(1 for f in futs if f.done() and f.exception() is not None)
    if failed:
        raise RuntimeError(f"{len(failed)} queued jobs did not finish within 600 s")
    drain = t_end - (firsts[0] if firsts else t_start)
    return {
        "live_jps": live,
        "drain_jps": n / drain,
        "from_start_jps": n / (t_end - t_start),
        "startup_s": (firsts[0] - t_start) if firsts else 0.0,
        "queued": queued,
        "errors": errors,
        "submit_s": submit_s,
        "depth": float(depth) if isinstance(depth, int | float) else -1.0,
        "admitted": str(hows),
    }


# ------------------------------------------------------------------ prefetch sweep


def sweep(tmp: str, n: int, seq_n: int) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    with Fabric(tmp) as fab:
        fab.start_broker()
        with _client(fab, "sweep") as c:
            for p in PREFETCHES:
                name = f"pf-{p}"
                fab.start_worker(name, ZFAB_POOL_SIZE="4", **_prefetch_env(p))
                wait_mmi_workers(c, 1, service="demo")
                for i in range(100):
                    c.run_job("demo", "echo", kwargs={"data": i}, timeout=10)
                time.sleep(1.0)
                lat = []
                for i in range(seq_n):
                    t = time.perf_counter()
                    c.run_job("demo", "echo", kwargs={"data": i}, timeout=10)
                    lat.append(time.perf_counter() - t)
                rates = [pipelined(c, n, 200) for _ in range(2)]
                out[p] = {"jps": max(rates), "seq_p50_ms": percentile(lat, 50) * 1000}
                fab.stop_worker(name)
                wait_for(lambda nm=name: not _alive(c, nm), 30, 0.2)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zfab-bench-queue-") as tmp:
        print(
            "-- head-of-line: 6 short jobs (sleep 0.2) while a long one (sleep 3) holds one of two "
            "single-thread workers",
            flush=True,
        )
        trials = 1 if quick else 3
        kinds = (0, 4, ADAPTIVE) if quick else (0, 1, 4, ADAPTIVE)
        hol = {p: head_of_line(f"{tmp}/hol{p}", p, trials) for p in kinds}
        for p, r in hol.items():
            report(f"6 short jobs, prefetch {_label(p).strip()}", r["s"], "s", 1.2, False, vs="ideal 1.2 s")
            print(
                f"   short jobs that waited behind the long one: {r['behind']:.0f} of 6 "
                "(ideal: 6 x 0.2 s back to back on the free worker)",
                flush=True,
            )
        out["hol"] = hol
        n = 2000 if quick else 10_000
        print(f"-- a queue of {n:,} jobs waiting at the broker, then one worker (pool 4) drains it", flush=True)
        dq = deep_queue(f"{tmp}/deep", n)
        report("pipelined jobs/s, live worker", dq["live_jps"], "/s")
        report(f"drain of {n:,} queued, jobs/s", dq["drain_jps"], "/s", dq["live_jps"], vs="live")
        report("  counted from worker start", dq["from_start_jps"], "/s", dq["live_jps"], vs="live")
        print(
            f"   admitted {dq['admitted']}; broker queue depth shown {dq['depth']:.0f}; submit took "
            f"{dq['submit_s']:.2f} s; worker start to first result {dq['startup_s']:.2f} s; errors "
            f"{dq['errors']}",
            flush=True,
        )
        out["deep"] = dq
        print("-- prefetch sweep: one demo worker, pool 4, pipelined echo (window 200) and sequential p50", flush=True)
        sw = sweep(f"{tmp}/sweep", 2000 if quick else 8000, 200 if quick else 500)
        base = sw[0]["jps"]
        for p, r in sw.items():
            report(f"prefetch {_label(p)}: pipelined", r["jps"], "/s", base, vs="prefetch 0")
            report(f"prefetch {_label(p)}: sequential p50", r["seq_p50_ms"], "ms")
        print(
            "   the worker's credits are pool 4 + prefetch; adaptive (the default) sizes the prefetch from "
            "the worker's run times",
            flush=True,
        )
        out["sweep"] = sw
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.queue", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    run(p.parse_args(argv).quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
