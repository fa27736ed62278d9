"""I/O-bound tasks at scale: 1,000 `async def` jobs that each await 1 s, on one worker.

    zfab:     broker + one `demo-async` worker (ZFAB_ASYNC_CONCURRENCY=1000, so its credits
              hold the whole wave); a Client here submits 1,000 `nap(seconds=1)` jobs at once
    baseline: the ideal, one job's own 1 s (all of them waiting at the same time)

Reported per wave (one wave with --quick, three otherwise, the median shown): the wall time
from the first submit to the last result (target < 3 s, #12), the seconds each job reports
it slept (each should be about 1 s: they waited side by side, not in turn), the worker's peak
RSS growth per waiting job (peak over the RSS before the wave; /proc/PID/clear_refs resets the
peak, as in bench/large.py), and the worker's thread count during the wave against before it
(an event loop, not a thread per job).

    python -m bench.aio [--quick] [--jobs 1000] [--seconds 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from bench.common import report
from bench.harness import Fabric, rss_bytes, threads_of, wait_mmi_workers
from bench.large import peak_bytes, reset_peak

SERVICE = "demo-async"
TARGET_SECONDS = 3.0


def _wave(c: Any, pid: int, jobs: int, seconds: float) -> dict[str, float]:
    before_rss, before_threads = rss_bytes(pid), len(threads_of(pid))
    reset_peak(pid)
    t0 = time.perf_counter()
    futs = [c.submit(SERVICE, "nap", kwargs={"seconds": seconds}, timeout=60) for _ in range(jobs)]
    time.sleep(seconds / 2)  # mid-wave: every job should be waiting now
    during_threads = len(threads_of(pid))
    slept: list[float] = []
    failed = 0
    for f in futs:
        for entry in f.result(60).values():
            if entry.get("failed"):
                failed += 1
            else:
                slept.append(float(entry["result"]))
    wall = time.perf_counter() - t0
    if failed or len(slept) != jobs:
        raise RuntimeError(f"{failed} of {jobs} nap jobs failed; {len(slept)} results")
    return {
        "wall_s": wall,
        "slept_min": min(slept),
        "slept_max": max(slept),
        "kib_per_job": max(0, peak_bytes(pid) - before_rss) / jobs / 1024,
        "threads_before": before_threads,
        "threads_during": during_threads,
    }


def run(quick: bool = False, jobs: int = 1000, seconds: float = 1.0) -> dict[str, Any]:
    from zfab import Client, Settings

    waves = 1 if quick else 3
    print(f"-- {jobs:,} async jobs that each await {seconds:g} s, on one {SERVICE} worker; {waves} wave(s)")
    with tempfile.TemporaryDirectory(prefix="zfab-bench-aio-") as tmp, Fabric(tmp) as fab:
        fab.start_broker()
        worker = fab.start_worker("aio-1", SERVICE, ZFAB_ASYNC_CONCURRENCY=str(jobs))
        with Client(settings=Settings(broker=fab.endpoint), name="bench-aio") as c:
            wait_mmi_workers(c, 1, service=SERVICE)
            for f in [c.submit(SERVICE, "nap", kwargs={"seconds": 0.01}, timeout=30) for _ in range(50)]:
                f.result(30)  # every lazy path taken, the credits announced
            out = [_wave(c, worker.pid, jobs, seconds) for _ in range(waves)]
    wall = statistics.median(w["wall_s"] for w in out)
    mid = sorted(out, key=lambda w: w["wall_s"])[len(out) // 2]
    report(f"{jobs:,} async jobs of {seconds:g} s", wall, "s", seconds, False, vs="ideal")
    print(
        f"   target < {TARGET_SECONDS:g} s: {wall:.2f} s; every wave: " + ", ".join(f"{w['wall_s']:.2f}" for w in out),
        flush=True,
    )
    report("each job slept, least", mid["slept_min"], "s")
    report("each job slept, most", mid["slept_max"], "s")
    report("worker peak rss / waiting job", mid["kib_per_job"], "KiB")
    report("worker threads, mid-wave", mid["threads_during"], "", mid["threads_before"], False, vs="idle")
    return {"wall_s": wall, "waves": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=1.0)
    ns = p.parse_args(argv)
    run(ns.quick, ns.jobs, ns.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
