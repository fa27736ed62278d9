"""A whole idle fabric: broker, 2 demo workers and the API, doing nothing, for a window of seconds.

Reported: CPU of the four together (% of one core, /proc/PID/stat; target < 0.5 %), and per
process its CPU and its wake-ups per second: voluntary context switches of all its threads
(/proc/PID/task/*/status; target <= 2/s each). /proc/PID/status alone counts only the main
thread, which in zfab mostly sleeps in a join or in uvicorn's loop; its figure is printed too.
The busiest threads of each process are listed, so a thread that ticks can be found.

Beside it, two floors: the same API server serving a bare FastAPI app, and a bare pyzmq ROUTER
keeping 3 peers alive (the broker's 2 workers and the API's client) at the same interval.

The fabric is fresh; before the window it runs a few jobs (so every lazy path has been taken)
and settles.

    python -m bench.idle [--quick] [--seconds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from bench.common import cpu_seconds, free_port, report, wait_for
from bench.harness import Fabric, ctx_switches, http_json, threads_of

JOB = {"service": "demo", "task": "echo", "kwargs": {"data": "x"}}


def _thread_switches(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for tid in threads_of(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    out[f"{tid}:{comm}"] = int(line.split()[1])
    return out


def _main_thread_switches(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def run(quick: bool = False, seconds: float | None = None) -> dict[str, float]:
    window = seconds or (10.0 if quick else 20.0)
    with tempfile.TemporaryDirectory(prefix="zfab-bench-idle-") as tmp, Fabric(tmp) as fab:
        fab.start_broker()
        fab.start_worker("idle-1")
        fab.start_worker("idle-2")
        fab.start_api()
        bare_port = free_port()
        bare = fab.spawn([sys.executable, "-m", "bench.bare_app", "--port", str(bare_port)])
        # The broker's floor: a bare pyzmq ROUTER with 3 peers (as many as the broker has: 2
        # workers and the API's client) keeping alive at the same interval (bench/scale.py).
        router_ep = f"tcp://127.0.0.1:{free_port()}"
        status = str(Path(tmp) / "router.status")
        router = fab.spawn(
            [
                sys.executable,
                "-m",
                "bench.scale",
                "router",
                "--endpoint",
                router_ep,
                "--status",
                status,
                "--max-seconds",
                "600",
            ]
        )
        if not wait_for(lambda: Path(status).exists(), 30):
            raise RuntimeError("the bare router did not start")
        fab.spawn(
            [
                sys.executable,
                "-m",
                "bench.scale",
                "peers",
                "--endpoint",
                router_ep,
                "--count",
                "3",
                "--prefix",
                "idle",
                "--max-seconds",
                "600",
            ]
        )
        fab.wait_api_workers(2)
        if not wait_for(lambda: http_json(f"http://127.0.0.1:{bare_port}/healthz")[0] == 200, 30):
            raise RuntimeError("bench.bare_app did not come up")
        if not wait_for(lambda: Path(status).read_text().strip() == "3", 30):
            raise RuntimeError("the 3 peers did not reach the bare router")
        for _ in range(10):
            http_json(fab.api_url + "/jobs?wait=10", JOB)
        time.sleep(5.0)  # job stores flushed, timers of the jobs passed
        pids = {**fab.pids(), "bare FastAPI (baseline)": bare.pid, "bare ROUTER (baseline)": router.pid}
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        vol0 = {n: ctx_switches(p)[0] for n, p in pids.items()}
        main0 = {n: _main_thread_switches(p) for n, p in pids.items()}
        thr0 = {n: _thread_switches(p) for n, p in pids.items()}
        t0 = time.monotonic()
        time.sleep(window)
        dt = time.monotonic() - t0
        cpu = {n: 100 * (cpu_seconds(p) - cpu0[n]) / dt for n, p in pids.items()}
        wake = {n: (ctx_switches(p)[0] - vol0[n]) / dt for n, p in pids.items()}
        main = {n: (_main_thread_switches(p) - main0[n]) / dt for n, p in pids.items()}
        thr1 = {n: _thread_switches(p) for n, p in pids.items()}
        threads = {n: len(threads_of(p)) for n, p in pids.items()}
    bare_cpu, bare_wake = cpu.pop("bare FastAPI (baseline)"), wake.pop("bare FastAPI (baseline)")
    router_cpu, router_wake = cpu.pop("bare ROUTER (baseline)"), wake.pop("bare ROUTER (baseline)")
    total = sum(cpu.values())
    print(
        f"-- idle fabric (broker, 2 demo workers, API), {window:.0f} s window, after 10 jobs and 5 s settling",
        flush=True,
    )
    report("idle cpu, whole fabric", total, "%core")
    print(f"   target < 0.5 % of a core together: {total:.2f} %", flush=True)
    out: dict[str, float] = {"total_cpu_pct": total}
    for n in cpu:
        report(f"idle cpu, {n}", cpu[n], "%core")
        report(f"wake-ups/s, {n}", wake[n], "/s")
        busiest = sorted(((thr1[n].get(t, 0) - c) / dt, t) for t, c in thr0[n].items())[-3:]
        desc = ", ".join(f"{t.split(':', 1)[1]} {r:.1f}/s" for r, t in reversed(busiest) if r > 0)
        print(
            f"   {threads[n]} threads; main thread {main[n]:.2f}/s; busiest: {desc or 'none'} (target <= 2/s)",
            flush=True,
        )
        out[f"{n}_cpu_pct"], out[f"{n}_wakeups"] = cpu[n], wake[n]
    report("idle cpu, bare FastAPI", bare_cpu, "%core")
    report("wake-ups/s, bare FastAPI", bare_wake, "/s")
    print(
        "   the same server setup (api/server.py: uvicorn without a main-loop tick; each request refreshes "
        "the Date header) serving bench/bare_app.py, no fabric: the API's floor",
        flush=True,
    )
    out["bare_cpu_pct"], out["bare_wakeups"] = bare_cpu, bare_wake
    report("idle cpu, bare ROUTER", router_cpu, "%core")
    report("wake-ups/s, bare ROUTER", router_wake, "/s")
    print(
        "   a pyzmq ROUTER that only keeps 3 peers alive (bench/scale.py router), as many as the broker has: "
        "the broker's floor",
        flush=True,
    )
    out["router_cpu_pct"], out["router_wakeups"] = router_cpu, router_wake
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.idle", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seconds", type=float)
    ns = p.parse_args(argv)
    run(ns.quick, ns.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
