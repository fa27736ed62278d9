"""100 concurrent clients: throughput, p99 and fairness, beside one pipelined client in the same run.

    broker + 2 demo workers (processes)
    baseline: 1 zfab Client, window 200, for D seconds                     (one load process)
    load:     100 zfab Clients (threads; 10 processes x 10), window 4 each, for D seconds

The load is spread over 10 processes: 25 Clients to a process (an owner thread and a
submitting thread each, 50 threads on one GIL) cost 0.45-0.58 ms of the load generators' CPU
per job against 0.33-0.39 ms at 10 to a process, on 2 cores the fabric needs too.

Every client submits demo echo jobs for the same duration D, all starting at one instant; a
job's latency is submit to result. Reported: jobs/s of the 100 beside the one client (target
>= 0.8x), p50/p99 latency, and the starvation check: fewest and most jobs finished by one
client in D (and the slowest client's p99). Everything is bounded: each client stops
submitting at D and waits at most the jobs' timeout for what it has in flight.

    python -m bench.clients [--quick]
    python -m bench.clients load ...   (a child)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, percentile, report, stop, wait_for
from bench.harness import Fabric, log_tail, wait_mmi_workers

JOB_TIMEOUT = 30.0


def _lane(c: Any, start_at: float, duration: float, window: int, out: dict[str, Any]) -> None:
    lat: list[float] = []
    q: deque[tuple[float, Any]] = deque()
    errors = 0
    while time.time() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.time())))
    end = time.monotonic() + duration
    i = 0
    while time.monotonic() < end:
        while len(q) < window and time.monotonic() < end:
            q.append((time.perf_counter(), c.submit("demo", "echo", kwargs={"data": i}, timeout=JOB_TIMEOUT)))
            i += 1
        t, fut = q.popleft()
        try:
            fut.result(JOB_TIMEOUT + 5)
            lat.append(time.perf_counter() - t)
        except Exception:
            errors += 1
    done_in_window = len(lat)
    while q:  # drain what is in flight (counted for latency, not for throughput within D)
        t, fut = q.popleft()
        try:
            fut.result(JOB_TIMEOUT + 5)
            lat.append(time.perf_counter() - t)
        except Exception:
            errors += 1
    out.update(done=done_in_window, errors=errors, lat=lat)


def run_load(endpoint: str, clients: int, window: int, start_at: float, duration: float, out_path: str) -> None:
    from service import Client, Settings

    cs = [Client(settings=Settings(broker=endpoint), name=f"load{i}").start() for i in range(clients)]
    try:
        if not wait_for(lambda: all(c.broker_alive for c in cs), 30):
            raise SystemExit("clients did not hear the broker within 30 s")
        results: list[dict[str, Any]] = [{} for _ in cs]
        threads = [threading.Thread(target=_lane, args=(c, start_at, duration, window, r), daemon=True)
                   for c, r in zip(cs, results, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration + JOB_TIMEOUT + 60)
        Path(out_path).write_text(json.dumps(results))
    finally:
        for c in cs:
            c.close()


def _drive(fab: Fabric, tmp: Path, procs: int, per_proc: int, window: int, duration: float, tag: str) -> list[Any]:
    start_at = time.time() + 4.0 + 0.05 * procs * per_proc
    outs, loaders = [], []
    for i in range(procs):
        path = tmp / f"{tag}-{i}.json"
        outs.append(path)
        loaders.append(fab.spawn([sys.executable, "-m", "bench.clients", "load", "--endpoint", fab.endpoint,
                                  "--clients", str(per_proc), "--window", str(window), "--start-at", str(start_at),
                                  "--duration", str(duration), "--out", str(path)]))
    limit = start_at - time.time() + duration + JOB_TIMEOUT + 90
    cpu: dict[str, float] = {}
    try:
        fabric_pids = list(fab.pids().values())
        time.sleep(max(0.0, start_at - time.time()))
        f0, l0, t0 = _cpu(fabric_pids), _cpu([p.pid for p in loaders]), time.monotonic()
        time.sleep(duration)
        dt = time.monotonic() - t0
        cpu = {"fabric_pct": 100 * (_cpu(fabric_pids) - f0) / dt,
               "load_pct": 100 * (_cpu([p.pid for p in loaders]) - l0) / dt}
        if not wait_for(lambda: all(p.poll() is not None for p in loaders), limit, 0.2):
            raise RuntimeError(f"load processes still running after {limit:.0f} s" + log_tail(loaders))
        lanes: list[Any] = []
        for p, path in zip(loaders, outs, strict=True):
            if p.returncode != 0 or not path.exists():
                raise RuntimeError(f"load process exited {p.returncode}" + log_tail([p]))
            lanes += json.loads(path.read_text())
        lanes[0]["cpu"] = cpu
        return lanes
    finally:
        stop(loaders)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except ProcessLookupError:
            pass
    return total


def run(quick: bool = False, n_clients: int = 100, procs: int = 10) -> dict[str, float]:
    from service import Client, Settings

    duration = 5.0 if quick else 15.0
    with tempfile.TemporaryDirectory(prefix="zfab-bench-clients-") as tmpd, Fabric(tmpd) as fab:
        tmp = Path(tmpd)
        fab.start_broker()
        fab.start_worker("bench-1")
        fab.start_worker("bench-2")
        with Client(settings=Settings(broker=fab.endpoint), name="warm") as c:
            wait_mmi_workers(c, 2, service="demo")
            for i in range(200):
                c.run_job("demo", "echo", kwargs={"data": i}, timeout=10)
        one = _drive(fab, tmp, 1, 1, 200, duration, "one")
        time.sleep(2.0)
        many = _drive(fab, tmp, procs, n_clients // procs, 4, duration, "many")
    one_done = sum(r["done"] for r in one)
    many_done = [r["done"] for r in many]
    one_lat = [x for r in one for x in r["lat"]]
    many_lat = [x for r in many for x in r["lat"]]
    out = {
        "one_jps": one_done / duration,
        "many_jps": sum(many_done) / duration,
        "one_p50_ms": percentile(one_lat, 50) * 1000,
        "one_p99_ms": percentile(one_lat, 99) * 1000,
        "many_p50_ms": percentile(many_lat, 50) * 1000,
        "many_p99_ms": percentile(many_lat, 99) * 1000,
        "min_per_client": min(many_done),
        "max_per_client": max(many_done),
        "worst_client_p99_ms": max(percentile(r["lat"], 99) for r in many if r["lat"]) * 1000,
        "errors": sum(r["errors"] for r in many) + sum(r["errors"] for r in one),
        "one_fabric_cpu_pct": one[0]["cpu"]["fabric_pct"],
        "one_load_cpu_pct": one[0]["cpu"]["load_pct"],
        "many_fabric_cpu_pct": many[0]["cpu"]["fabric_pct"],
        "many_load_cpu_pct": many[0]["cpu"]["load_pct"],
    }
    out["one_fabric_ms_per_job"] = out["one_fabric_cpu_pct"] * 10 / out["one_jps"]
    out["many_fabric_ms_per_job"] = out["many_fabric_cpu_pct"] * 10 / out["many_jps"]
    out["one_client_ms_per_job"] = out["one_load_cpu_pct"] * 10 / out["one_jps"]
    out["many_client_ms_per_job"] = out["many_load_cpu_pct"] * 10 / out["many_jps"]
    n = len(many)
    print(f"-- {n} clients ({procs} processes x {n // procs} threads, window 4 each) vs 1 client "
          f"(window 200), {duration:.0f} s each, broker + 2 demo workers, echo", flush=True)
    report("1 client jobs/s", out["one_jps"], "/s")
    report(f"{n} clients jobs/s", out["many_jps"], "/s", out["one_jps"], vs="1 client")
    print(f"   {n} clients / 1 pipelined client = {out['many_jps'] / out['one_jps']:.2f}x (target >= 0.8x)")
    report("1 client p50", out["one_p50_ms"], "ms")
    report("1 client p99", out["one_p99_ms"], "ms")
    report(f"{n} clients p50", out["many_p50_ms"], "ms")
    report(f"{n} clients p99", out["many_p99_ms"], "ms")
    report(f"{n} clients worst client p99", out["worst_client_p99_ms"], "ms")
    report("1 client: fabric cpu/job", out["one_fabric_ms_per_job"], "ms")
    report(f"{n} clients: fabric cpu/job", out["many_fabric_ms_per_job"], "ms", out["one_fabric_ms_per_job"], False,
           vs="1 client")
    report("1 client: client cpu/job", out["one_client_ms_per_job"], "ms")
    report(f"{n} clients: client cpu/job", out["many_client_ms_per_job"], "ms", out["one_client_ms_per_job"], False,
           vs="1 client")
    print(f"   (fabric = broker + 2 workers; load generators used {out['one_load_cpu_pct']:.0f} % / "
          f"{out['many_load_cpu_pct']:.0f} % of a core, fabric {out['one_fabric_cpu_pct']:.0f} % / "
          f"{out['many_fabric_cpu_pct']:.0f} %, of 200 % on this machine)", flush=True)
    report("fewest jobs by one client", out["min_per_client"], "jobs")
    report("most jobs by one client", out["max_per_client"], "jobs")
    fair = out["min_per_client"] / out["max_per_client"] if out["max_per_client"] else 0.0
    print(f"   starvation check: min/max jobs per client = {fair:.2f} (1.0 = perfectly even; "
          f"0 = a client starved); errors {out['errors']:.0f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--clients", type=int, default=100)
    sub = p.add_subparsers(dest="role")
    ld = sub.add_parser("load")
    ld.add_argument("--endpoint", required=True)
    ld.add_argument("--clients", type=int, required=True)
    ld.add_argument("--window", type=int, required=True)
    ld.add_argument("--start-at", type=float, required=True)
    ld.add_argument("--duration", type=float, required=True)
    ld.add_argument("--out", required=True)
    ns = p.parse_args(argv)
    if ns.role == "load":
        os.environ.setdefault("ZFAB_LOG_LEVEL", "WARNING")
        run_load(ns.endpoint, ns.clients, ns.window, ns.start_at, ns.duration, ns.out)
        return 0
    run(ns.quick, ns.clients)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
