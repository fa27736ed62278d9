"""zfab's own figures: sequential round trip, pipelined jobs/s, idle CPU.

Broker and workers run as `zfab` processes; the client runs here. Every figure is
printed beside the raw pyzmq floor measured in the same run (see bench/run.py).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import deque
from typing import Any

from bench.common import free_port, idle_cpu_percent, percentile, spawn, stop, wait_for
from zfab import Client, Settings


def _start(n_workers: int, tmp: str) -> tuple[str, list[Any]]:
    ep = f"tcp://127.0.0.1:{free_port()}"
    env = {"ZFAB_BROKER": ep, "ZFAB_DATA_DIR": tmp, "ZFAB_LOG_LEVEL": "WARNING"}
    cli = [sys.executable, "-m", "zfab.cli"]
    procs = [spawn([*cli, "broker", "--endpoint", ep], env)]
    procs += [spawn([*cli, "worker", "--service", "demo", "--name", f"bench-{i}"], env) for i in range(n_workers)]
    return ep, procs


def _ready(c: Client, n: int) -> None:
    def ok() -> bool:
        try:
            return len([w for w in c.mmi("show_workers", timeout=1) if w.get("alive")]) >= n
        except Exception:
            return False

    if not wait_for(ok, 30):
        raise RuntimeError(f"{n} workers did not register within 30 s")


def pipelined(c: Client, n: int, window: int) -> float:
    """Jobs per second with up to `window` jobs in flight from one client."""
    q: deque[Any] = deque()
    t0 = time.perf_counter()
    for i in range(n):
        if len(q) >= window:
            q.popleft().result(60)
        q.append(c.submit("demo", "echo", kwargs={"data": i}, timeout=60))
    while q:
        q.popleft().result(60)
    return n / (time.perf_counter() - t0)


def sequential(c: Client, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t = time.perf_counter()
        c.run_job("demo", "echo", kwargs={"data": i}, timeout=10)
        lat.append(time.perf_counter() - t)
    return lat


def _settle(c: Client, seconds: float = 3.0) -> None:
    """Let the worker's job store catch up with the previous phase, so phases do not overlap."""
    time.sleep(seconds)


def measure_fabric(quick: bool = False) -> dict[str, float]:
    seq_n, pipe_n, window, idle_s = (500, 3000, 200, 3.0) if quick else (3000, 20_000, 500, 10.0)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="zfab-bench-") as tmp:
        # Idle first, on a fresh fabric: broker + worker + this client with nothing to do.
        ep, procs = _start(1, tmp + "/idle")
        try:
            with Client(settings=Settings(broker=ep), name="idle") as c:
                _ready(c, 1)
                sequential(c, 100)
                _settle(c)
                out["idle_cpu_pct"] = idle_cpu_percent([p.pid for p in procs] + [os.getpid()], idle_s)
        finally:
            stop(procs)
        for n_workers in (1, 2):
            ep, procs = _start(n_workers, tmp + f"/w{n_workers}")
            try:
                for acks in (True, False):
                    with Client(settings=Settings(broker=ep), name="bench", acks=acks) as c:
                        _ready(c, n_workers)
                        sequential(c, 100)  # warm-up
                        _settle(c)
                        tag = f"{n_workers}w_{'acks' if acks else 'noacks'}"
                        if n_workers == 1:
                            lat = sequential(c, seq_n)
                            out[f"seq_p50_ms_{tag}"] = percentile(lat, 50) * 1000
                            out[f"seq_p99_ms_{tag}"] = percentile(lat, 99) * 1000
                            _settle(c)
                        out[f"pipe_jps_{tag}"] = pipelined(c, pipe_n, window)
                        _settle(c)
            finally:
                stop(procs)
    return out
