"""10 MB payloads: echo jobs of a 10 MB string through broker + worker, beside the raw pyzmq floor.

    floor bulk: bench/floor.py's bulk transfer (256 KiB chunks, 8 unacknowledged, one way)
    floor echo: the same floor processes, one 7-frame message with a 10 MB body echoed back
    zfab:       demo echo with data = a 10 MB string, client DEALER -> broker -> worker -> back, with
                ZFAB_SHM=false (the bytes cross the broker; bench/shm.py measures the same-host tier)

MB/s counts the payload bytes that cross the broker, both ways for an echo (request + result,
2 x 10 MB per job), so it reads against the floor's bytes per second. Memory: the client runs
in a child process of its own; before each phase the peak RSS (VmHWM) of worker, broker and
client is reset (/proc/PID/clear_refs), and the growth of the peak over the RSS before the
phase, divided by the jobs in flight, is the memory per in-flight job (target about one
payload). The worker keeps finished jobs in memory up to ZFAB_WORKER_RECENT_BYTES (64 MiB):
the warm-up runs enough jobs to fill that table first, so its one-time growth to its bound is
not counted per job (it was, until 2026-12-02: 6-7 payloads per job at 1 in flight), and the
client process drops each result once checked, so what is left is the library's.

    python -m bench.large [--quick] [--mb 10]
    python -m bench.large client ...   (a child)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import zmq

from bench.common import report, stop, wait_for
from bench.floor import _Client, measure_floor
from bench.harness import Fabric, log_tail, rss_bytes, wait_mmi_workers

JOB_TIMEOUT = 60.0


def reset_peak(pid: int) -> bool:
    """Reset VmHWM of ``pid`` to its current RSS (Linux >= 4.0; needs to own the process or root)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(pid)


# ----------------------------------------------------------------- the floor's echo


def floor_echo(size: int, n: int) -> float:
    """MB/s (both ways) of ``n`` sequential 10 MB echo round trips through bench.floor's processes."""
    from bench.common import free_port, spawn

    fport, bport = free_port(), free_port()
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PYTHONUNBUFFERED": "1"}
    role = [sys.executable, "-m", "bench.floor"]
    parent = str(os.getpid())
    procs = [
        spawn([*role, "forwarder", "--frontend", str(fport), "--backend", str(bport), "--parent", parent], env),
        spawn([*role, "echo", "--backend", str(bport), "--parent", parent], env),
    ]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        c = _Client(ctx, fport)
        c.sock.setsockopt(zmq.RCVTIMEO, 30_000)
        c.await_path(procs, 20)
        body = b'{"task":"echo","kwargs":{"data":"' + os.urandom(size // 2).hex().encode() + b'"}}'
        times = []
        for i in range(n + 1):
            job = [b"", b"NFPC01", b"0x04", b"floor", b"any", b"%032x" % i, body]
            t = time.perf_counter()
            c.wire.send(job, copy_last=False)
            reply = c.wire.recv()
            if len(reply[-1]) != len(body):
                raise RuntimeError("floor echo came back short")
            if i:
                times.append(time.perf_counter() - t)
        c.close()
        return 2 * len(body) / statistics.median(times) / 1e6
    finally:
        stop(procs)
        ctx.destroy(linger=0)


# ------------------------------------------------------------------- client child


def run_client(endpoint: str, size: int, phases: list[tuple[int, int]], out_path: str) -> None:
    """For each (in_flight, jobs): reset own peak RSS, run the jobs with that window, record."""
    from zfab import Client, Settings
    from zfab.core.tuning import tune

    tune()  # set up as a zfab process is (the API's client runs in one): malloc keeps 10 MB blocks in its heap
    data = os.urandom(size // 2).hex()
    me = os.getpid()
    results = []
    with Client(settings=Settings(broker=endpoint), name="large") as c:
        if not wait_for(lambda: c.broker_alive, 30):
            raise SystemExit("no broker")
        # Warm-up: a few windows of the most jobs in flight of any phase, so what a process keeps
        # for that many at once (the shared-memory tier's pooled blocks, malloc's heaps) is made
        # before the phases; then enough large jobs one at a time to fill the worker's bounded table
        # of recent results (ZFAB_WORKER_RECENT_BYTES, 64 MiB by default), so its one-time growth to
        # that bound is not counted as memory per in-flight job in the first phase. In that order:
        # results of the windows' pool threads left in the table, evicted during a one-at-a-time
        # phase, free memory in those threads' malloc arenas that the next thread cannot reuse, and
        # that read as 2-6 payloads per job in the first phase (MALLOC_ARENA_MAX=1 showed it).
        most = max(k for k, _ in phases)
        for _ in range(3):
            futs = [c.submit("demo", "echo", kwargs={"data": data}, timeout=JOB_TIMEOUT) for _ in range(most)]
            for fut in futs:
                fut.result(JOB_TIMEOUT + 5)
            del futs
        for _ in range(Settings().worker_recent_bytes // size + 2):
            c.run_job("demo", "echo", kwargs={"data": data}, timeout=JOB_TIMEOUT)
        ctl = Path(out_path + ".ctl")
        ctl.write_text("idle")
        give_up = time.monotonic() + 300
        for k, n in phases:
            # The parent resets the fabric's peaks and says go by writing the phase number.
            while ctl.read_text() != str(k):
                if time.monotonic() > give_up:
                    raise SystemExit("the parent never said go")
                time.sleep(0.05)
            rss0 = rss_bytes(me)
            reset_peak(me)
            q: deque[tuple[float, Any]] = deque()
            lat = []
            t0 = time.perf_counter()
            for _ in range(n):
                if len(q) >= k:
                    t, fut = q.popleft()
                    r = fut.result(JOB_TIMEOUT + 5)
                    lat.append(time.perf_counter() - t)
                    if len(next(iter(r.values()))["result"]) != len(data):
                        raise RuntimeError("echo came back short")
                    del r, fut  # the measured process holds no result of its own past this point
                q.append((time.perf_counter(), c.submit("demo", "echo", kwargs={"data": data}, timeout=JOB_TIMEOUT)))
            while q:
                t, fut = q.popleft()
                fut.result(JOB_TIMEOUT + 5)
                lat.append(time.perf_counter() - t)
            elapsed = time.perf_counter() - t0
            results.append({"k": k, "n": n, "seconds": elapsed, "lat": lat, "rss0": rss0, "peak": peak_bytes(me)})
            Path(out_path).write_text(json.dumps(results))
            ctl.write_text(f"done {k}")


def measure_zfab(
    size: int, phases: list[tuple[int, int]], **env: str
) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    """Broker, one demo worker and a client process (with ``env``): per phase (in flight, jobs) the
    client's figures, and the fabric's RSS before, peak and after."""
    with tempfile.TemporaryDirectory(prefix="zfab-bench-large-") as tmp, Fabric(tmp, **env) as fab:
        fab.start_broker()
        worker = fab.start_worker("bench-large")
        from zfab import Client, Settings

        with Client(settings=Settings(broker=fab.endpoint), name="probe") as c:
            wait_mmi_workers(c, 1, service="demo")
        path = Path(tmp) / "client.json"
        ctl = Path(str(path) + ".ctl")
        client = fab.spawn(
            [
                sys.executable,
                "-m",
                "bench.large",
                "client",
                "--endpoint",
                fab.endpoint,
                "--size",
                str(size),
                "--phases",
                json.dumps(phases),
                "--out",
                str(path),
            ]
        )
        pids = {"worker": worker.pid, "broker": fab.broker.pid if fab.broker else 0}
        fabric_mem: list[dict[str, int]] = []
        deadline = time.monotonic() + 60 + len(phases) * 120
        try:
            time.sleep(1.0)
            want = "idle"
            for k, _ in phases:
                ok = wait_for(
                    lambda w=want: client.poll() is not None or (ctl.exists() and ctl.read_text() == w),
                    max(1.0, deadline - time.monotonic()),
                    0.1,
                )
                if not ok or client.poll() is not None:
                    raise RuntimeError("the large-payload client stopped" + log_tail([client, worker]))
                want = f"done {k}"
                time.sleep(1.5)  # the warm-up's (or last phase's) result leaves the worker's queues
                mem = {f"{r}_rss0": rss_bytes(pid) for r, pid in pids.items()}
                for pid in pids.values():
                    reset_peak(pid)
                ctl.write_text(str(k))
                done = wait_for(
                    lambda w=want: client.poll() is not None or ctl.read_text() == w,
                    max(1.0, deadline - time.monotonic()),
                    0.05,
                )
                if not done or ctl.read_text() != want:  # the client exits right after its last phase
                    raise RuntimeError(f"phase {k} did not finish" + log_tail([client, worker]))
                mem.update({f"{r}_peak": peak_bytes(pid) for r, pid in pids.items()})
                mem.update({f"{r}_rss1": rss_bytes(pid) for r, pid in pids.items()})
                fabric_mem.append(mem)
            client.wait(30)
        finally:
            stop([client])
        phases_out = json.loads(path.read_text())
    return phases_out, fabric_mem


def figures(size: int, phases_out: list[dict[str, Any]], fabric_mem: list[dict[str, int]]) -> dict[str, Any]:
    """Per phase: MB/s both ways, p50, and each process's peak RSS growth per in-flight job in payloads."""
    out: dict[str, Any] = {}
    for ph, mem in zip(phases_out, fabric_mem, strict=True):
        k = ph["k"]
        moved = 2 * size * ph["n"]
        out[f"k{k}_mbps"] = moved / ph["seconds"] / 1e6
        out[f"k{k}_p50_s"] = statistics.median(ph["lat"])
        out[f"k{k}_client_per_job"] = (ph["peak"] - ph["rss0"]) / k / size
        out[f"k{k}_client_rss0_mb"] = ph["rss0"] / 1e6
        for r in ("worker", "broker"):
            out[f"k{k}_{r}_rss0_mb"] = mem[f"{r}_rss0"] / 1e6
            out[f"k{k}_{r}_per_job"] = (mem[f"{r}_peak"] - mem[f"{r}_rss0"]) / k / size
            out[f"k{k}_{r}_kept_mb"] = (mem[f"{r}_rss1"] - mem[f"{r}_rss0"]) / 1e6
    return out


def run(quick: bool = False, mb: int = 10) -> dict[str, Any]:
    size = mb * 1_000_000
    n_seq, n_par = (6, 8) if quick else (20, 24)
    phases = [(1, n_seq), (4, n_par)]
    print(
        f"-- {mb} MB payloads: floor first, then zfab (broker + 1 demo worker; client in its own process)", flush=True
    )
    fl = measure_floor(seq_n=200, pipe_n=2000, bulk_mib=64 if quick else 256, trials=1 if quick else 3)
    fe = floor_echo(size, 5 if quick else 10)
    out: dict[str, Any] = {"floor_bulk_mbps": fl["bulk_mbps"], "floor_echo_mbps": fe}
    # The socket path, as this section has always measured it: bench/shm.py runs the shared-memory tier.
    out.update(figures(size, *measure_zfab(size, phases, ZFAB_SHM="false")))
    report("floor bulk (one way)", out["floor_bulk_mbps"], "MB/s")
    report(f"floor {mb} MB echo (both ways)", out["floor_echo_mbps"], "MB/s")
    for k, _ in phases:
        report(f"zfab {mb} MB echo, {k} in flight", out[f"k{k}_mbps"], "MB/s", out["floor_bulk_mbps"], vs="floor bulk")
        print(
            f"   vs floor {mb} MB echo: {out[f'k{k}_mbps'] / out['floor_echo_mbps']:.2f}x; "
            f"p50 per job {out[f'k{k}_p50_s'] * 1000:.0f} ms (target >= 0.5x the bulk floor)",
            flush=True,
        )
    for k, _ in phases:
        for r in ("client", "worker", "broker"):
            report(f"{r} peak rss / job, {k} in flight", out[f"k{k}_{r}_per_job"], "pay")
        kept_w, kept_b = out[f"k{k}_worker_kept_mb"], out[f"k{k}_broker_kept_mb"]
        print(
            f"   ('pay' = payloads of {mb} MB; target about 1 payload per in-flight job; "
            f"RSS kept after the phase: worker {kept_w:+.0f} MB, broker {kept_b:+.0f} MB)",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.large", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--mb", type=int, default=10)
    sub = p.add_subparsers(dest="role")
    cl = sub.add_parser("client")
    cl.add_argument("--endpoint", required=True)
    cl.add_argument("--size", type=int, required=True)
    cl.add_argument("--phases", required=True)
    cl.add_argument("--out", required=True)
    ns = p.parse_args(argv)
    if ns.role == "client":
        with contextlib.suppress(KeyboardInterrupt):
            run_client(ns.endpoint, ns.size, [tuple(x) for x in json.loads(ns.phases)], ns.out)
        return 0
    run(ns.quick, ns.mb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
