"""10 MB echo on one host: the shared-memory tier beside the socket path, and peak RSS per process.

    socket: ZFAB_SHM=false in broker, worker and client: the bytes cross the broker both ways
    shm:    the default: client and worker on this host pass handles to /dev/shm blocks, and the
            broker forwards the handles

Each run is bench/large.py's: broker, one demo worker, the client in a process of its own; a
warm-up that fills the worker's table of recent results; then 1 and 4 jobs in flight, with the
peak RSS (VmHWM) of client, worker and broker reset before each phase. MB/s counts the payload
both ways (2 x 10 MB per job); "per job" is the growth of a process's peak over its RSS before
the phase, per job in flight, in payloads (target: at most 1 in every process). A shared-memory
block counts in the RSS of each process that has it mapped: its creator keeps its pooled blocks
mapped, a reader up to 8 of its peers'. The runs alternate (socket, shm, socket, shm...) and each
figure is the median over the rounds. Last, the codec floor: what encoding and decoding the job's
JSON costs in one process (the client's request, the worker's read of it, its result, the client's
read of that), which no transport removes: the socket path's time per job over it bounds the ratio.

    python -m bench.shm [--quick] [--mb 10] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.common import report
from bench.large import figures, measure_zfab

MODES = {"socket": {"ZFAB_SHM": "false"}, "shm": {"ZFAB_SHM": "true"}}


def run(quick: bool = False, mb: int = 10, rounds: int | None = None) -> dict[str, Any]:
    size = mb * 1_000_000
    n_seq, n_par = (6, 8) if quick else (20, 24)
    phases = [(1, n_seq), (4, n_par)]
    rounds = rounds or (1 if quick else 3)
    print(f"-- {mb} MB echo on one host: socket path vs shared memory, {rounds} round(s), alternating", flush=True)
    seen: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode, env in MODES.items():
            seen[mode].append(figures(size, *measure_zfab(size, phases, **env)))
    med = {m: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for m, runs in seen.items()}
    out: dict[str, Any] = {"rounds": rounds, **{f"{m}_{k}": v for m, f in med.items() for k, v in f.items()}}
    for k, _ in phases:
        sock, shm = med["socket"][f"k{k}_mbps"], med["shm"][f"k{k}_mbps"]
        report(f"socket path {mb} MB echo, {k} in flight", sock, "MB/s")
        report(f"shared memory {mb} MB echo, {k} in flight", shm, "MB/s", sock, vs="socket path")
        print(
            f"   p50 per job: socket {med['socket'][f'k{k}_p50_s'] * 1000:.0f} ms, "
            f"shm {med['shm'][f'k{k}_p50_s'] * 1000:.0f} ms (target: shm >= 2x the socket path)",
            flush=True,
        )
    for k, _ in phases:
        for r in ("client", "worker", "broker"):
            report(f"{r} peak rss / job, {k} in flight, socket", med["socket"][f"k{k}_{r}_per_job"], "pay")
            report(f"{r} peak rss / job, {k} in flight, shm", med["shm"][f"k{k}_{r}_per_job"], "pay")
    print(
        f"   ('pay' = payloads of {mb} MB; target with shm: at most 1 payload per in-flight job in every process)",
        flush=True,
    )
    k = phases[-1][0]
    for r in ("client", "worker", "broker"):
        print(
            f"   {r} RSS before the {k}-in-flight phase: socket {med['socket'][f'k{k}_{r}_rss0_mb']:.0f} MB, "
            f"shm {med['shm'][f'k{k}_{r}_rss0_mb']:.0f} MB",
            flush=True,
        )
    print(
        "   (with shm a process's RSS includes the pages of its pooled blocks and of the peers' blocks it keeps\n"
        "    mapped: shared pages, in memory once for both processes; growth per job is over that)",
        flush=True,
    )
    floor = codec_floor(size)
    ceiling = med["socket"]["k1_p50_s"] / floor
    report("codec floor: a 10 MB job's JSON, encoded and decoded both ways", floor * 1000, "ms")
    print(
        f"   the most any transport can gain here: socket p50 / codec floor = {ceiling:.2f}x "
        f"(shm p50 is {med['shm']['k1_p50_s'] / floor:.2f}x the floor)",
        flush=True,
    )
    out.update(codec_floor_s=floor, ceiling=ceiling)
    return out


def codec_floor(size: int, trials: int = 5) -> float:
    """Seconds of msgspec JSON work a `size` echo job needs in all, however its bytes travel: the
    client encodes the request and decodes the result, the worker decodes the request and encodes the
    result (the same hex payload bench/large.py sends). The fastest of `trials`."""
    import os
    import time

    import msgspec

    data = os.urandom(size // 2).hex()
    enc, dec = msgspec.json.Encoder(), msgspec.json.Decoder()
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        body = enc.encode({"task": "echo", "args": [], "kwargs": {"data": data}, "timeout": 60})
        req = dec.decode(body)
        result = enc.encode({"w1": {"result": req["kwargs"]["data"], "failed": False}})
        dec.decode(result)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.shm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--mb", type=int, default=10)
    p.add_argument("--rounds", type=int, default=None)
    ns = p.parse_args(argv)
    run(ns.quick, ns.mb, ns.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
