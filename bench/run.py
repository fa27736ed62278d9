"""`make bench`: the raw pyzmq floor and zfab in one run, every figure with its ratio."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

from bench.common import dump_json, report
from bench.fabric import measure_fabric
from bench.floor import measure_floor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    p.add_argument("--json", help="also write the figures to this file")
    ns = p.parse_args(argv)
    q = ns.quick
    print("== raw pyzmq floor: DEALER -> Python ROUTER forwarder -> echo DEALER (3 processes, TCP loopback)")
    fl = measure_floor(seq_n=1000 if q else 5000, pipe_n=10_000 if q else 50_000, bulk_mib=16 if q else 64,
                       trials=1 if q else 3)
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
    for name in ("bench.api", "bench.files"):
        if importlib.util.find_spec(name) is not None:
            mod = importlib.import_module(name)
            print(f"== {name}")
            mod.run(quick=q)
    if ns.json:
        dump_json(ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
