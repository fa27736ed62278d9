"""Helpers for integration tests: real zfab processes on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import wait_for as wait_for  # re-exported: the integration tests take it from here

from zfab import Client, Settings

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive_workers(c: Client) -> set[str]:
    """Names of the workers the broker holds alive."""
    return {w["name"] for w in c.mmi("show_workers", timeout=2) if w.get("alive")}


def wait_workers(c: Client, names: set[str], timeout: float = 20) -> None:
    """Wait until at least these workers are registered and alive."""
    wait_for(lambda: names <= alive_workers(c), timeout, what=f"workers {sorted(names)} registered")


class Fabric:
    """Starts broker/worker/api processes for one test and stops them all afterwards."""

    def __init__(self, tmp: Path, *, interval: float = 0.3, multiplier: int = 3, host: str = "127.0.0.1") -> None:
        self.tmp = tmp
        self.port = free_port()
        self.endpoint = f"tcp://{host}:{self.port}"
        self.env = dict(os.environ)
        self.env.update(
            ZFAB_BROKER=self.endpoint,
            ZFAB_DATA_DIR=str(tmp / "data"),
            ZFAB_KEEPALIVE_INTERVAL=str(interval),
            ZFAB_KEEPALIVE_MULTIPLIER=str(multiplier),
            ZFAB_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        self.interval = interval
        self.multiplier = multiplier
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def client(self, name: str = "test", **kw: Any) -> Client:
        """A started Client of this fabric with its keepalive settings."""
        s = Settings(broker=self.endpoint, keepalive_interval=self.interval, keepalive_multiplier=self.multiplier)
        return Client(settings=s, name=name, **kw).start()

    @property
    def hold_time(self) -> float:
        return self.interval * self.multiplier

    def start(
        self, name: str, *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        """`prefix`: what the command runs under (e.g. `ip netns exec NS`, tests/integration/netns.py)."""
        e = dict(self.env)
        e.update(env or {})
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "zfab.cli", *args],
            env=e,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = p
        return p

    def broker(self, name: str = "broker", *extra: str) -> subprocess.Popen[bytes]:
        return self.start(name, "broker", "--endpoint", self.endpoint, *extra)

    def worker(
        self, name: str, service: str = "demo", *extra: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.start(name, "worker", "--service", service, "--name", name, *extra, env=env)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        kill_group(self.procs[name])

    def stop(self) -> None:
        stop_groups(self.procs.values())


def kill_group(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started in a group of its own, and reap it."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)


def stop_groups(procs: Iterable[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM each process group (continued first, in case a test stopped it), then SIGKILL what is
    still there after `grace` seconds in all."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


@contextmanager
def fabric(tmp: Path, **kw: float | str) -> Iterator[Fabric]:
    f = Fabric(tmp, **kw)  # type: ignore[arg-type]
    try:
        yield f
    finally:
        f.stop()
