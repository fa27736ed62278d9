"""`make bench`: the raw pyzmq floor and zfab in one run, every figure with its ratio.

First the versus section (bench/versus.py): floor.py, nfp_floor.py and zfab interleaved round by
round, zfab's pipelined rate and sequential p50 as ratios to nfp_floor's of the same round, a
burn-down (a paused queue drained) and a 1 ms injected-latency round. Then the forked section
(bench/forked.py): the sequential p50 of nfp_floor and zfab with their broker and worker forked from
the measuring process (nfp_floor's way) or started as programs (zfab's, speed.py's). After the floor, the fabric,
the API and files sections come the scale sections (docs/benchmarks.md):
scale (1,000 workers), clients (100 clients), large (10 MB payloads), shm (the same on one host, shared
memory vs sockets), aio (1,000 async tasks), wrk,
idle, queue, console (the web console over 100,000 jobs), failover (a standby broker on a lease). Each one
runs on its own; one that fails prints
its error and the rest go on.
`--only NAME,...` runs some of them; `--trust` adds bench/trust.py (against this checkout) at the end.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.common import dump_json, report
from bench.fabric import measure_fabric
from bench.floor import measure_floor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    p.add_argument("--json", help="also write the figures to this file")
    names = ["versus", "forked", "floor", *BASE, *SECTIONS]
    p.add_argument("--only", help="comma-separated sections: " + ",".join(names))
    p.add_argument("--trust", action="store_true", help="also run bench/trust.py against this checkout")
    ns = p.parse_args(argv)
    q = ns.quick
    only = set(ns.only.split(",")) if ns.only else None
    failed: list[str] = []
    started = time.monotonic()
    if only is None or "versus" in only:
        from bench import versus

        print("== zfab beside nfp_floor (the lean NFP fabric) and floor.py, interleaved (bench/versus.py)", flush=True)
        _run_section("versus", lambda: versus.run(quick=q), failed)
    if only is None or "forked" in only:
        from bench import forked

        print("== the sequential p50, roles forked or started as programs (bench/forked.py)", flush=True)
        _run_section("forked", lambda: forked.run(quick=q), failed)
    if only is None or "floor" in only or "fabric" in only:
        _run_section("floor+fabric", lambda: _floor_and_fabric(q), failed)
    for name in BASE:
        if (only is None or name in only) and importlib.util.find_spec(f"bench.{name}") is not None:
            mod = importlib.import_module(f"bench.{name}")
            print(f"== bench.{name}", flush=True)
            _run_section(name, lambda m=mod: m.run(quick=q), failed)
    for name, title in SECTIONS.items():
        if only is None or name in only:
            mod = importlib.import_module(f"bench.{name}")
            print(f"== {title}", flush=True)
            _run_section(name, lambda m=mod: m.run(quick=q), failed)
    if ns.trust:
        from bench import trust

        print("== trust figures (issue 10), this checkout", flush=True)
        zfab = str(Path(sys.executable).parent / "zfab")
        _run_section("trust", lambda: trust.measure(zfab, sys.executable, q), failed)
    if ns.json:
        dump_json(ns.json)
    print(f"== done in {time.monotonic() - started:.0f} s; sections failed: {', '.join(failed) or 'none'}", flush=True)
    return 1 if failed else 0


#: Sections after the floor and fabric figures that existed first (each module's run(quick=)).
BASE = ("api", "files")
#: The scale sections, in the order they run.
SECTIONS = {
    "scale": "1,000 workers on one broker (bench/scale.py)",
    "clients": "100 clients at once (bench/clients.py)",
    "large": "10 MB payloads (bench/large.py)",
    "shm": "10 MB echo on one host: shared memory vs the socket path, peak RSS per process (bench/shm.py)",
    "aio": "1,000 async tasks on one worker (bench/aio.py)",
    "wrk": "HTTP under wrk (bench/wrk.py)",
    "idle": "a whole idle fabric (bench/idle.py)",
    "queue": "the job queue: head-of-line, a deep queue, the prefetch sweep (bench/queue.py)",
    "console": "the web console over a table of 100,000 jobs (bench/console.py)",
    "topics": "a slow event subscriber: pipelined jobs/s beside none (bench/topics.py)",
    "hops": "hop traces: pipelined jobs/s with them on and off, a job's time per hop (bench/hops.py)",
    "failover": "two brokers on a PostgreSQL lease, kill -9 of the active one (bench/failover.py)",
}


def _run_section(name: str, fn: Callable[[], object], failed: list[str]) -> None:
    t0 = time.monotonic()
    try:
        fn()
    except Exception:
        failed.append(name)
        print(f"!! section {name} failed:", flush=True)
        traceback.print_exc(limit=8, file=sys.stdout)
        sys.stdout.flush()
    print(f"   ({name}: {time.monotonic() - t0:.0f} s)", flush=True)


def _floor_and_fabric(q: bool) -> None:
    print("== raw pyzmq floor: DEALER -> Python ROUTER forwarder -> echo DEALER (3 processes, TCP loopback)")
    fl = measure_floor(
        seq_n=1000 if q else 5000, pipe_n=10_000 if q else 50_000, bulk_mib=16 if q else 64, trials=1 if q else 3
    )
    report("floor seq p50", fl["seq_p50_ms"], "ms")
    report("floor seq p99", fl["seq_p99_ms"], "ms")
    report("floor pipelined", fl["pipe_mps"], "/s")
    report("floor bulk", fl["bulk_mbps"], "MB/s")
    print("== zfab: broker + demo workers as processes, client here, demo echo")
    fa = measure_fabric(quick=q)
    for key, value in fa.items():
        if key.startswith("seq_p"):
            report(key.replace("_ms", ""), value, "ms", fl["seq_p50_ms" if "p50" in key else "seq_p99_ms"], False)
        elif key.startswith("pipe_"):
            report(key.replace("pipe_jps", "pipelined jobs/s"), value, "/s", fl["pipe_mps"])
        else:
            report("idle cpu (broker+worker+client)", value, "%core")


if __name__ == "__main__":
    raise SystemExit(main())
