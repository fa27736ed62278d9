"""Process helpers for the scale benchmarks (bench/scale.py, clients.py, large.py, wrk.py, idle.py,
queue.py): start a fabric as `zfab` processes, read a process's memory and wake-ups from /proc.

Only the standard library and bench.common here, so bench/trust.py (which must run against any
checkout through its CLI) can use it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import free_port, log_path, spawn, stop, wait_for

__all__ = [
    "Fabric",
    "ctx_switches",
    "http_json",
    "log_tail",
    "rss_bytes",
    "threads_of",
]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
Proc = subprocess.Popen[bytes]


# ------------------------------------------------------------------------- /proc


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(f"no VmRSS for {pid}")


def threads_of(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        raise ProcessLookupError(f"no process {pid}") from None


def ctx_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of ALL threads of ``pid``, summed over
    /proc/PID/task/*/status (/proc/PID/status alone counts only the main thread). A voluntary
    switch is a thread going to sleep: each one is a wake-up later."""
    vol = invol = 0
    for tid in threads_of(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    invol += int(line.split()[1])
    return vol, invol


# --------------------------------------------------------------------------- HTTP


def http_json(url: str, body: Any = None, method: str | None = None, timeout: float = 10.0) -> tuple[int, Any, bytes]:
    """(status, parsed JSON or None, raw body) of one request; status 0 when nothing answered."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, None, b""
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    return status, parsed, raw


def log_tail(procs: list[Proc], lines: int = 15) -> str:
    out = ""
    for proc in procs:
        path = log_path(proc)
        if path is not None and path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out += f"\n--- {path} ---\n" + "\n".join(tail)
    return out


# ------------------------------------------------------------------------- fabric


class Fabric:
    """A broker, workers and an API as processes of one `zfab` (this checkout by default, or
    ``zfab=/path/to/venv/bin/zfab``), on 127.0.0.1 ports picked here. Use as a context manager:
    every process it started is stopped on the way out."""

    def __init__(self, tmp: str | os.PathLike[str], zfab: str | None = None, **env: str) -> None:
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.cli = [zfab] if zfab else [sys.executable, "-m", "zfab.cli"]
        self.env = {
            "ZFAB_BROKER": self.endpoint,
            "ZFAB_DATA_DIR": str(self.tmp / "data"),
            "ZFAB_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        if zfab is None:
            paths = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            self.env["PYTHONPATH"] = os.pathsep.join(paths)
        self.env.update(env)
        self.procs: list[Proc] = []
        self.broker: Proc | None = None
        self.workers: dict[str, Proc] = {}
        self.api: Proc | None = None
        self.api_url = ""

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        stop(self.procs)

    def spawn(self, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = spawn(args, {**self.env, **(env or {})})
        self.procs.append(proc)
        return proc

    def start_broker(self, **env: str) -> Proc:
        self.broker = self.spawn([*self.cli, "broker", "--endpoint", self.endpoint], env)
        return self.broker

    def start_worker(self, name: str, service: str = "demo", **env: str) -> Proc:
        proc = self.spawn([*self.cli, "worker", "--service", service, "--name", name], env)
        self.workers[name] = proc
        return proc

    def stop_worker(self, name: str) -> None:
        proc = self.workers.pop(name)
        stop([proc])

    def start_api(self, port: int | None = None, extra_path: str | None = None, **env: str) -> Proc:
        port = port or free_port()
        api_env = {"ZFAB_API_DB": "", **env}
        if extra_path:
            api_env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, self.env.get("PYTHONPATH", "")]))
        self.api = self.spawn([*self.cli, "api", "--host", "127.0.0.1", "--port", str(port)], api_env)
        self.api_url = f"http://127.0.0.1:{port}"
        return self.api

    def wait_api_workers(self, n: int, timeout: float = 40.0, service: str = "demo") -> None:
        """Until the API answers and its /mmi/workers lists ``n`` alive workers of ``service``."""

        def ok() -> bool:
            self.check_alive()
            st, ws, _ = http_json(self.api_url + "/mmi/workers", timeout=2)
            if st != 200 or not isinstance(ws, list):
                return False
            return len([w for w in ws if w.get("alive") and w.get("service") == service]) >= n

        if not wait_for(ok, timeout, 0.2):
            raise RuntimeError(
                f"the API did not see {n} live {service} workers within {timeout:.0f} s" + log_tail(self.procs)
            )

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None and proc in self._expected_alive():
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}" + log_tail([proc]))

    def _expected_alive(self) -> list[Proc]:
        alive = [p for p in (self.broker, self.api) if p is not None]
        return alive + list(self.workers.values())

    def pids(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.broker is not None:
            out["broker"] = self.broker.pid
        for name, proc in self.workers.items():
            out[name] = proc.pid
        if self.api is not None:
            out["api"] = self.api.pid
        return out


def wait_mmi_workers(client: Any, n: int, timeout: float = 40.0, service: str | None = None) -> None:
    """Until the broker's show_workers lists at least ``n`` alive workers (of ``service``)."""

    def ok() -> bool:
        try:
            ws = client.mmi("show_workers", timeout=2)
        except Exception:
            return False
        return len([w for w in ws if w.get("alive") and (service is None or w.get("service") == service)]) >= n

    if not wait_for(ok, timeout, 0.25):
        raise RuntimeError(f"{n} workers did not register within {timeout:.0f} s")


@contextlib.contextmanager
def section_timer(label: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        print(f"   ({label}: {time.monotonic() - t0:.1f} s)", flush=True)
