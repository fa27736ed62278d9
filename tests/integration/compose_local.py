"""The compose stack as plain local processes (no Docker engine on the development machines).

`LocalStack` reads the resolved compose config (`docker-compose config --format json`) and turns
each zfab service into processes on 127.0.0.1: one per replica, service hostnames mapped to
127.0.0.1, every container port to a free local port per replica (so the `--metrics-port 9100`
of two workers differ), volumes to directories under a temporary folder. Healthchecks are the
compose `test` commands with the same mapping; a Prometheus config is derived from
deploy/prometheus/prometheus.yml with each target replaced by the local processes.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
ZFAB_SERVICES = ("broker", "worker", "api")
T = TypeVar("T")


def wait_for(what: str, timeout: float, probe: Callable[[], T | None], interval: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items() if v is not None}


def argv_of(value: Any) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(a) for a in value or []]


_URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([\w.-]+):(\d+)")
_PORT_FLAGS = ("--port", "--metrics-port")
_PORT_ENV = ("ZFAB_PORT", "ZFAB_METRICS_PORT", "ZFAB_API_PORT")
_HOST_FLAGS = ("--host", "--metrics-host")
_HOST_ENV = ("ZFAB_METRICS_HOST", "ZFAB_HOST", "ZFAB_API_HOST")
_ANY = ("0.0.0.0", "::", "[::]")


def free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port


@dataclass
class Process:
    """One container of the compose stack, as a local process."""

    service: str
    replica: int
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str] | None
    ports: dict[int, int]  # container port -> 127.0.0.1 port
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.service}-{self.replica}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, cwd: Path) -> None:
        self._log_file = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv, env=self.env, cwd=cwd, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )

    def check_running(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.popen.returncode}: {self.argv}\n{self.log_tail()}")

    def stop(self, deadline: float) -> None:
        """SIGTERM the process group, SIGKILL it if it outlives `deadline`."""
        p = self.popen
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=max(0.5, deadline - time.monotonic()))
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()


def zfab_executable() -> tuple[list[str], dict[str, str]]:
    """The zfab of the interpreter running the tests (the image's /opt/zfab/bin/zfab, locally)."""
    script = Path(sys.executable).parent / "zfab"
    if script.exists():
        return [str(script)], {}
    return [sys.executable, "-m", "zfab.cli"], {"PYTHONPATH": str(ROOT)}


@dataclass
class LocalStack:
    """Maps compose services to local processes: service hostnames become 127.0.0.1, every
    container port a free local port (per replica), volumes directories under `tmp`."""

    config: dict[str, Any]
    tmp: Path
    taken: set[int] = field(default_factory=set)
    ports: dict[tuple[str, int], dict[int, int]] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)

    def port_map(self, service: str, replica: int = 1) -> dict[int, int]:
        return self.ports.setdefault((service, replica), {})

    def local_port(self, service: str, replica: int, host: str, port: int) -> int:
        owner = (host, 1) if host in self.config["services"] else (service, replica)
        mapping = self.port_map(*owner)
        if port not in mapping:
            mapping[port] = free_port(self.taken)
        return mapping[port]

    def rewrite(self, service: str, replica: int, value: str) -> str:
        value = _URL.sub(
            lambda m: f"{m[1]}://127.0.0.1:{self.local_port(service, replica, m[2], int(m[3]))}",
            value,
        )
        for target, source in self.volume_dirs(service).items():
            if value == target or value.startswith(target + "/"):
                value = str(source) + value[len(target) :]
        return value

    def volume_dirs(self, service: str) -> dict[str, Path]:
        out = {}
        for v in self.config["services"][service].get("volumes") or []:
            path = self.tmp / "volumes" / str(v.get("source") or f"{service}-{v['target'].strip('/')}").strip("/")
            path.mkdir(parents=True, exist_ok=True)
            out[str(v["target"])] = path
        return out

    def rewrite_argv(self, service: str, replica: int, argv: list[str]) -> list[str]:
        out = []
        for i, arg in enumerate(argv):
            prev = argv[i - 1] if i else ""
            if prev in _PORT_FLAGS and arg.isdigit():
                arg = str(self.local_port(service, replica, "127.0.0.1", int(arg)))
            elif prev in _HOST_FLAGS and arg in _ANY:
                arg = "127.0.0.1"
            out.append(self.rewrite(service, replica, arg))
        return out

    def rewrite_env(self, service: str, replica: int, env: dict[str, str]) -> dict[str, str]:
        out = {}
        for key, value in env.items():
            if key in _PORT_ENV and value.isdigit():
                value = str(self.local_port(service, replica, "127.0.0.1", int(value)))
            elif key in _HOST_ENV and value in _ANY:
                value = "127.0.0.1"
            out[key] = self.rewrite(service, replica, value)
        return out

    def build(self, exe: list[str], exe_env: dict[str, str]) -> None:
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("ZFAB_")}
        (self.tmp / "logs").mkdir(exist_ok=True)
        for service in ZFAB_SERVICES:
            svc = self.config["services"][service]
            replicas = int((svc.get("deploy") or {}).get("replicas") or svc.get("scale") or 1)
            for replica in range(1, replicas + 1):
                argv = self.rewrite_argv(service, replica, argv_of(svc["command"]))
                assert argv[0] == "zfab", f"{service}: command {argv} does not run zfab"
                env = {**base_env, **exe_env, **self.rewrite_env(service, replica, env_of(svc))}
                test = argv_of((svc.get("healthcheck") or {}).get("test"))
                check = None
                if test[:1] == ["CMD"]:
                    check = self.rewrite_argv(service, replica, test[1:])
                    check = exe + check[1:] if check[0] == "zfab" else check
                elif test[:1] == ["CMD-SHELL"]:
                    check = ["sh", "-c", self.rewrite(service, replica, test[1])]
                self.processes.append(
                    Process(
                        service,
                        replica,
                        exe + argv[1:],
                        env,
                        check,
                        self.port_map(service, replica),
                        self.tmp / "logs" / f"{service}-{replica}.log",
                    )
                )

    def of(self, service: str) -> list[Process]:
        return [p for p in self.processes if p.service == service]

    def healthy(self, p: Process) -> bool:
        p.check_running()
        assert p.healthcheck is not None
        r = subprocess.run(p.healthcheck, env=p.env, capture_output=True, timeout=30)
        return r.returncode == 0

    def start(self, service: str, timeout: float = 30.0) -> None:
        """Start a service's replicas; like `condition: service_healthy`, return once they are healthy."""
        for p in self.of(service):
            p.start(self.tmp)
        for p in self.of(service):
            if p.healthcheck is not None:
                wait_for(f"{p.name} healthcheck {p.healthcheck}", timeout, functools.partial(self.healthy, p))

    def stop(self) -> None:
        deadline = time.monotonic() + 15
        for p in reversed(self.processes):
            if p.popen is not None and p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.processes):
            p.stop(deadline)

    def prometheus_config(self, deploy: dict[str, Any], listen_port: int) -> dict[str, Any]:
        """deploy/prometheus/prometheus.yml with each target (static or DNS) replaced by the local processes."""
        self.port_map("prometheus")[9090] = listen_port
        jobs = []
        for job in deploy["scrape_configs"]:
            targets: list[str] = []
            for sc in job.get("static_configs") or []:
                for t in sc["targets"]:
                    host, _, port = t.rpartition(":")
                    service = "prometheus" if host in ("localhost", "127.0.0.1") else host
                    targets += self._targets(job["job_name"], service, int(port))
            for dns in job.get("dns_sd_configs") or []:
                for name in dns["names"]:
                    targets += self._targets(job["job_name"], name, int(dns["port"]))
            local = {k: v for k, v in job.items() if k not in ("static_configs", "dns_sd_configs")}
            jobs.append({**local, "static_configs": [{"targets": targets}]})
        glob = {
            **deploy.get("global", {}),
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        }
        return {"global": glob, "scrape_configs": jobs}

    def _targets(self, job: str, service: str, port: int) -> list[str]:
        replicas = [m for (s, _), m in sorted(self.ports.items()) if s == service]
        assert replicas, f"prometheus job {job} scrapes {service!r}, which is not a service this stack runs"
        missing = [m for m in replicas if port not in m]
        assert not missing, (
            f"prometheus job {job} scrapes {service}:{port}, but {service} listens on {sorted(replicas[0])}"
        )
        return [f"127.0.0.1:{m[port]}" for m in replicas]


def http(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 20.0) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        try:
            return int(e.code), bytes(e.read())
        finally:
            e.close()
