"""File transfer: zfab's `Client.fetch_file` beside the raw pyzmq bulk floor, same bytes, same run.

The floor (``bench.floor``) pushes 256 KiB chunks through a Python ROUTER forwarder
with 8 unacknowledged at most. zfab streams a file of the same size from a `files`
worker through the broker, under its credit window, into a file here, and checks its
sha256. The default (1 MiB chunks, window 8) is reported, then the best of a few
other shapes.

Run ``python -m bench.files [--quick]``; ``make bench`` calls :func:`run`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import free_port, log_path, report, spawn, stop, wait_for
from bench.floor import measure_floor
from zfab import Client, Settings

__all__ = ["run"]

KIB = 1024
MIB = 1024 * KIB
DEFAULT_CHUNK = 1 * MIB
DEFAULT_WINDOW = 8
#: (label, chunk size, window); the first is the client's default.
SHAPES: list[tuple[str, int, int]] = [
    ("default 1 MiB x8", DEFAULT_CHUNK, DEFAULT_WINDOW),
    ("256 KiB x8", 256 * KIB, 8),
    ("256 KiB x16", 256 * KIB, 16),
    ("1 MiB x16", MIB, 16),
]
FILE_NAME = "bench.bin"
WARMUP_NAME = "warmup.bin"
STARTUP_TIMEOUT_S = 30.0
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _write_random(path: Path, size: int) -> None:
    block = os.urandom(MIB)
    with path.open("wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, MIB)])
            left -= MIB


def _log_tail(procs: list[subprocess.Popen[bytes]], lines: int = 15) -> str:
    out = ""
    for proc in procs:
        path = log_path(proc)
        if path is not None and path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out += f"\n--- {path} ---\n" + "\n".join(tail)
    return out


def _start(tmp: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    ep = f"tcp://127.0.0.1:{free_port()}"
    paths = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {
        "ZFAB_BROKER": ep,
        "ZFAB_DATA_DIR": str(tmp / "data"),
        "ZFAB_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
    }
    cli = [sys.executable, "-m", "zfab.cli"]
    procs = [spawn([*cli, "broker", "--endpoint", ep], env)]
    procs.append(
        spawn([*cli, "worker", "--service", "files", "--name", "bench-files", "--root", str(tmp / "root")], env)
    )
    return ep, procs


def _wait_ready(c: Client, procs: list[subprocess.Popen[bytes]]) -> None:
    def ok() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}{_log_tail(procs)}")
        try:
            workers = c.mmi("show_workers", timeout=1)
        except Exception:
            return False
        return any(w.get("alive") and w.get("service") == "files" for w in workers)

    if not wait_for(ok, STARTUP_TIMEOUT_S, interval=0.1):
        raise RuntimeError(f"the files worker did not register within {STARTUP_TIMEOUT_S:.0f} s{_log_tail(procs)}")


def _fetch(c: Client, name: str, dest: Path, size: int, chunk: int, window: int) -> float:
    """Seconds to download `name` into `dest`; the file is verified (sha256 by the client, size here)."""
    t0 = time.perf_counter()
    details = c.fetch_file("files", name, dest, chunk_size=chunk, window=window, timeout=300)
    seconds = time.perf_counter() - t0
    if details.get("size") != size or dest.stat().st_size != size:
        raise RuntimeError(f"{name}: got {dest.stat().st_size} bytes, worker says {details.get('size')}, want {size}")
    dest.unlink()
    return seconds


def run(quick: bool = False) -> dict[str, float]:
    """Measure the raw bulk floor and zfab's file transfer of the same bytes; print and return MB/s.

    Each figure is the median of 1 (quick) or 3 runs: on a small VM single runs move by tens
    of percent. The children's logs are removed when everything went well and kept otherwise.
    """
    mib, trials = (16, 1) if quick else (64, 3)
    size = mib * MIB
    print(f"== file transfer: {mib} MiB, raw pyzmq bulk floor vs files worker -> broker -> Client.fetch_file")
    floor = measure_floor(seq_n=1, pipe_n=1, bulk_mib=mib, trials=trials)["bulk_mbps"]
    report(f"floor bulk {mib} MiB", floor, "MB/s")
    out: dict[str, float] = {"floor_bulk_mbps": floor}
    tmp = Path(tempfile.mkdtemp(prefix="zfab-bench-files-"))
    procs: list[subprocess.Popen[bytes]] = []
    ok = False
    try:
        root = tmp / "root"
        root.mkdir()
        _write_random(root / FILE_NAME, size)
        _write_random(root / WARMUP_NAME, 4 * MIB)
        ep, procs = _start(tmp)
        with Client(settings=Settings(broker=ep), name="bench-files") as c:
            _wait_ready(c, procs)
            _fetch(c, WARMUP_NAME, tmp / "warmup.out", 4 * MIB, DEFAULT_CHUNK, DEFAULT_WINDOW)
            best_label, best = "", 0.0
            for label, chunk, window in SHAPES:
                runs = [_fetch(c, FILE_NAME, tmp / "out.bin", size, chunk, window) for _ in range(trials)]
                mbps = size / statistics.median(runs) / 1e6
                out[f"files_{chunk // KIB}k_w{window}_mbps"] = mbps
                if mbps > best:
                    best_label, best = label, mbps
                if chunk == DEFAULT_CHUNK and window == DEFAULT_WINDOW:
                    out["files_default_mbps"] = mbps
                    report(f"fetch_file {label}", mbps, "MB/s", floor)
            out["files_best_mbps"] = best
            report(f"fetch_file best ({best_label})", best, "MB/s", floor)
        ok = True
    finally:
        try:
            stop(procs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if ok:
                for proc in procs:
                    path = log_path(proc)
                    if path is not None:
                        path.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.files", description="zfab file transfer vs the raw pyzmq bulk floor."
    )
    p.add_argument("--quick", action="store_true", help="16 MiB instead of 64 MiB")
    ns = p.parse_args(argv)
    figures = run(quick=ns.quick)
    for key, value in figures.items():
        print(f"  {key:<26} {value:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
