"""Plumbing of the real-engine compose test: the engine, the local images, one compose project.

- `Engine.acquire()` reuses an engine that answers `docker info`; as root it runs
  tools/ci/docker-engine.sh (installs docker.io and the compose plugin if missing, starts dockerd)
  and tools/ci/images.sh (local stand-ins for the registry images). `release()` stops only a
  dockerd this process started.
- `Project` is one `docker compose -p <unique>` project run from `git archive HEAD` in a temporary
  directory, with its own free host ports on 127.0.0.1, its own API token and image tag.
Every wait is a bounded poll on a condition; every subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_TOOLS = ROOT / "tools" / "ci"
IN_CI = os.environ.get("CI") == "true"
ZFAB_SERVICES = ("broker", "worker", "api")
IMAGE_TAG = "zfab-compose-test:local"  # not zfab:local: a user's own build stays untouched
T = TypeVar("T")

# Compose interpolation variables a developer's shell may carry: removed so only ours apply.
_COMPOSE_VARS = re.compile(r"^(ZFAB_|GRAFANA_|PROMETHEUS_|COMPOSE_)")
# Test traffic goes to 127.0.0.1 only, never through a proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def unavailable(reason: str) -> NoReturn:
    """Skip where no engine can be had; under CI=true the compose test must run, so fail."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the real-engine compose test must run)")
    pytest.skip(reason)


def state_dir() -> Path:
    """Where the CI scripts keep the dockerd PID, the debootstrap root and their logs (kept across runs)."""
    if explicit := os.environ.get("ZFAB_CI_STATE"):
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "zfab" / "ci"


def run(args: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        pytest.fail(f"`{' '.join(args[:6])}` ran past {timeout:.0f} s: {text[-500:]}")


def tail(r: subprocess.CompletedProcess[str], lines: int = 12) -> str:
    return "\n".join((r.stdout + r.stderr).strip().splitlines()[-lines:])


def poll(what: str, timeout: float, probe: Callable[[], T | None], interval: float = 1.0) -> T:
    """`probe()` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port


def show_report(request: pytest.FixtureRequest, path: Path, lines: list[str]) -> None:
    """A real-engine test's timings: kept in `path` and printed past pytest's capture."""
    try:
        path.write_text("\n".join(lines) + "\n")
    except OSError:
        pass
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and tr is not None:
        with capture.global_and_fixture_disabled():
            tr.write_line("")
            for line in lines:
                tr.write_line(line)
    else:
        print("\n".join(lines))


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def http(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 20.0) -> Response:
    """One request to 127.0.0.1; status 0 when the connection itself failed."""
    assert urllib.parse.urlsplit(url).hostname == "127.0.0.1", f"test traffic only to 127.0.0.1, not {url}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return Response(int(r.status), dict(r.headers), bytes(r.read()))
    except urllib.error.HTTPError as e:
        try:
            return Response(int(e.code), dict(e.headers), bytes(e.read()))
        finally:
            e.close()
    except (OSError, urllib.error.URLError) as e:
        return Response(0, {}, str(e).encode())


# ---- the engine -------------------------------------------------------------------------------------


@dataclass
class Engine:
    state: Path
    started: bool = False
    notes: list[str] = field(default_factory=list)

    @staticmethod
    def answers() -> bool:
        if shutil.which("docker") is None:
            return False
        try:
            r = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    @classmethod
    def acquire(cls) -> Engine:
        eng = cls(state_dir())
        root = os.geteuid() == 0
        if root:
            eng.state.mkdir(parents=True, exist_ok=True)
            t = time.monotonic()
            r = run(["bash", str(CI_TOOLS / "docker-engine.sh"), "start", str(eng.state)], timeout=900)
            if r.returncode != 0:
                unavailable(f"cannot get a Docker engine (tools/ci/docker-engine.sh start): {tail(r, 6)}")
            eng.started = "engine=started" in r.stdout
            eng.notes.append(f"engine: {r.stdout.strip()} in {time.monotonic() - t:.0f} s")
        elif not cls.answers():
            unavailable("no Docker engine answers `docker info`, and not root to start one (tools/ci/docker-engine.sh)")
        r = run(["docker", "compose", "version"], timeout=30)
        if r.returncode != 0:
            unavailable(
                f"`docker compose` plugin missing (tools/ci/docker-engine.sh installs it as root): {tail(r, 2)}"
            )
        return eng

    def images(self, compose_file: Path, *overlays: Path) -> str:
        """Build the local stand-ins (tools/ci/images.sh) for compose_file and its overlays; returns its report."""
        t = time.monotonic()
        files = [str(compose_file), *map(str, overlays)]
        r = run(["bash", str(CI_TOOLS / "images.sh"), str(self.state), *files], timeout=900)
        if r.returncode != 0:
            unavailable(f"cannot build the local base/stand-in images (tools/ci/images.sh): {tail(r, 6)}")
        report = " ".join(r.stdout.split())
        self.notes.append(f"images in {time.monotonic() - t:.0f} s: {report}")
        return report

    def release(self) -> None:
        if self.started:
            run(["bash", str(CI_TOOLS / "docker-engine.sh"), "stop", str(self.state)], timeout=120)


# ---- one compose project --------------------------------------------------------------------------------


@dataclass
class Project:
    """`docker compose -p NAME` in a copy of the committed tree, its ports on 127.0.0.1."""

    src: Path
    name: str
    env: dict[str, str]
    ports: dict[str, int]
    token: str
    log: list[str] = field(default_factory=list)

    @classmethod
    def from_head(cls, tmp: Path) -> Project:
        src = tmp / "src"
        src.mkdir(parents=True)
        archive = tmp / "head.tar"
        r = run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), "HEAD"], timeout=120)
        if r.returncode != 0:
            pytest.fail(f"git archive HEAD: {tail(r, 4)}")
        r = run(["tar", "-xf", str(archive), "-C", str(src)], timeout=120)
        assert r.returncode == 0, tail(r)
        archive.unlink()
        taken: set[int] = set()
        ports = {
            var: free_port(taken) for var in ("ZFAB_API_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT", "ZFAB_BROKER_PORT")
        }
        token = "compose-" + secrets.token_urlsafe(18)
        env = {k: v for k, v in os.environ.items() if not _COMPOSE_VARS.match(k)}
        env.update({k: str(v) for k, v in ports.items()})
        env.update(
            ZFAB_PUBLISH_HOST="127.0.0.1",
            ZFAB_BROKER_PUBLISH_HOST="127.0.0.1",
            ZFAB_API_TOKENS=token,
            ZFAB_IMAGE=IMAGE_TAG,
            GRAFANA_ADMIN_PASSWORD=secrets.token_urlsafe(12),
        )
        name = f"zfabtest{os.getpid()}{secrets.token_hex(2)}"
        return cls(src, name, env, ports, token)

    # -- compose commands
    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", "compose", "--ansi", "never", "-p", self.name, *args]
        t = time.monotonic()
        r = run(cmd, timeout=timeout, cwd=self.src, env=self.env)
        self.log.append(f"$ docker compose {' '.join(args)}  -> rc {r.returncode} in {time.monotonic() - t:.1f} s")
        if check and r.returncode != 0:
            pytest.fail(f"`docker compose {' '.join(args)}` failed (rc {r.returncode}):\n{tail(r, 25)}")
        return r

    def config(self) -> dict[str, Any]:
        r = self.compose("config", "--format", "json", timeout=60)
        data: dict[str, Any] = json.loads(r.stdout)
        return data

    def ps(self) -> list[dict[str, Any]]:
        r = self.compose("ps", "-a", "--format", "json", timeout=30, check=False)
        text = r.stdout.strip()
        if r.returncode != 0 or not text:
            return []
        if text.startswith("["):
            rows: list[dict[str, Any]] = json.loads(text)
            return rows
        return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]

    def containers(self, service: str, running: bool = True) -> list[dict[str, Any]]:
        return [c for c in self.ps() if c.get("Service") == service and (not running or c.get("State") == "running")]

    def health_counts(self) -> dict[str, int]:
        good = dict.fromkeys(ZFAB_SERVICES, 0)
        for c in self.ps():
            if c.get("Service") in good and c.get("State") == "running" and c.get("Health") == "healthy":
                good[c["Service"]] += 1
        return good

    def wait_healthy(self, workers: int, timeout: float = 180) -> float:
        """Seconds until broker, api and exactly `workers` workers are running and healthy."""
        t = time.monotonic()
        deadline = t + timeout
        while True:
            good = self.health_counts()
            if good["broker"] >= 1 and good["api"] >= 1 and good["worker"] == workers:
                return time.monotonic() - t
            if time.monotonic() >= deadline:
                states = [
                    f"{c.get('Name')}: {c.get('State')}/{c.get('Health') or '-'}"
                    for c in self.ps()
                    if c.get("Service") in ZFAB_SERVICES
                ]
                logs = tail(self.compose("logs", "--no-color", "--tail", "15", timeout=60, check=False), 60)
                pytest.fail(f"not healthy ({workers} workers) within {timeout:.0f} s: {states}\n{logs}")
            time.sleep(1)

    def kill(self, container_ids: list[str]) -> None:
        """SIGKILL containers, as a crash or the OOM killer would."""
        r = run(["docker", "kill", "--signal", "KILL", *container_ids], timeout=60)
        assert r.returncode == 0, tail(r)

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=180, check=False)

    # -- the published services, on 127.0.0.1
    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['ZFAB_API_PORT']}"

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.ports['PROMETHEUS_PORT']}"

    @property
    def grafana(self) -> str:
        return f"http://127.0.0.1:{self.ports['GRAFANA_PORT']}"

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Response:
        return http(method, self.api + path, body, token=self.token, timeout=timeout)

    def alive_workers(self, service: str = "demo") -> list[str] | None:
        """Names of the alive workers of `service` in GET /mmi/workers; None when MMI did not answer."""
        r = self.call("GET", f"/mmi/workers?service={service}", timeout=15)
        rows = r.json()
        if r.status != 200 or not isinstance(rows, list):
            return None
        return sorted(str(w["name"]) for w in rows if w.get("alive") or w.get("status") == "alive")

    def mmi_workers(self) -> list[dict[str, Any]]:
        r = self.call("GET", "/mmi/workers?service=demo", timeout=15)
        rows = r.json()
        return rows if r.status == 200 and isinstance(rows, list) else []

    def query(self, promql: str) -> dict[str, Any]:
        url = self.prometheus + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        r = http("GET", url, timeout=20)
        body = r.json()
        return body if isinstance(body, dict) else {"status": "error", "error": f"HTTP {r.status}: {r.body[:200]!r}"}

    def container_of_worker(self, worker: str) -> str | None:
        """The id of the worker container whose hostname (the short container id) the worker name carries."""
        for c in self.containers("worker"):
            cid = str(c.get("ID") or "")
            if cid and cid[:12] in worker:
                return cid
        return None
