"""`zfab up` as a supervisor: a child that dies comes back while the API stays up; Ctrl-C (SIGINT to the
terminal's process group) stops workers, then the broker, then the API, without SIGKILL; a taken port
is refused before anything starts; no child outlives a killed `zfab up`.

Each test starts `zfab up` in a session of its own on free ports and signals its process group, as a
terminal would.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fabric import ROOT, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    api: str
    log: Path
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> dict[int, list[str]]:
        """pid -> argv of the live (not zombie) children of `zfab up`."""
        found = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                rest = stat[stat.rindex(")") + 2 :].split()
                argv = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except (OSError, ValueError):
                continue
            if int(rest[1]) == self.proc.pid and rest[0] != "Z":
                found[int(d)] = [a for a in argv if a]
        return found

    def pid_of(self, role: str) -> int:
        """The child whose argv holds `role` (e.g. "demo-1", "broker")."""
        pids = [pid for pid, argv in self.children().items() if role in argv]
        assert len(pids) == 1, (role, self.children())
        return pids[0]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def start_up(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Up:
    port = free_port()
    log = tmp / "up.log"
    e = {
        **os.environ,
        "ZFAB_BROKER": f"tcp://127.0.0.1:{free_port()}",
        "ZFAB_DATA_DIR": str(tmp / "data"),
        "ZFAB_API_DB": "",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    with log.open("ab") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "zfab.cli", "up", "--workers", "2", "--api-port", str(port), *args],
            env=e,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: a signal to it is the terminal's Ctrl-C
        )
    return Up(p, f"http://127.0.0.1:{port}", log)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    u = start_up(tmp_path)
    try:
        wait_for(lambda: "zfab up: broker" in u.text() or u.proc.poll() is not None, 60, what="the banner")
        assert u.proc.poll() is None, u.text()
        yield u
    finally:
        kids = u.children()
        if u.proc.poll() is None:
            os.killpg(u.proc.pid, signal.SIGINT)
            try:
                u.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(u.proc.pid, signal.SIGKILL)
        for pid in kids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def job(api: str, body: dict[str, object], wait: float = 5) -> dict[str, object]:
    r = httpx.post(f"{api}/jobs?wait={wait:g}", json=body, timeout=wait + 10)
    return dict(r.json()) if r.status_code == 200 else {}


def test_a_killed_worker_is_restarted_while_the_api_stays_up(up: Up) -> None:
    body: dict[str, object] = {"service": "demo", "task": "echo", "workers": ["demo-1"], "timeout": 5}
    wait_for(lambda: job(up.api, body).get("state") == "completed", 30, what="demo-1 serving")
    victim = up.pid_of("demo-1")
    health: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                health.append(httpx.get(up.api + "/healthz", timeout=5).status_code)
            except httpx.HTTPError:
                health.append(0)
            done.wait(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        # When demo-1 is killed outright
        os.kill(victim, signal.SIGKILL)
        # Then a demo-1 serves jobs again, and the API answered all along
        wait_for(lambda: job(up.api, body, 3).get("state") == "completed", 30, what="demo-1 serving again")
    finally:
        done.set()
        poller.join(10)
    assert health and set(health) == {200}, health
    assert up.pid_of("demo-1") != victim
    # And the restart was logged once, counted
    restarts = re.findall(
        r"zfab up: worker demo-1 exited \(killed by SIGKILL\).*restarting it in .* \(restart 1\)", up.text()
    )
    assert len(restarts) == 1, up.text()


def test_ctrl_c_stops_workers_then_broker_then_api_without_sigkill(up: Up) -> None:
    # Given a job running and a client waiting for another
    sleep: dict[str, object] = {"service": "demo", "task": "sleep", "kwargs": {"seconds": 1}, "timeout": 30}
    assert httpx.post(up.api + "/jobs", json=sleep, timeout=10).status_code in (200, 202)
    answer: dict[str, object] = {}
    waiter = threading.Thread(target=lambda: answer.update(job(up.api, sleep, 10)), daemon=True)
    waiter.start()
    kids = up.children()
    assert len(kids) == 4, kids  # broker, demo-1, demo-2, api
    time.sleep(0.3)  # the waiting client's job reaches a worker (the wait is not what is checked)
    # When the terminal's Ctrl-C reaches zfab up's process group
    os.killpg(up.proc.pid, signal.SIGINT)
    up.proc.wait(60)
    waiter.join(30)
    # Then every child is gone, none of them SIGKILLed
    assert not [pid for pid in kids if alive(pid)]
    text = up.text()
    assert "killing it" not in text, text
    # In order: both workers drained (to a broker still there), then the broker, then the API
    at = {
        name: m.start()
        for name, rx in (
            ("demo-1", r"zfab worker demo-1 stopped \(drained \d+ jobs, 0 unfinished\)"),
            ("demo-2", r"zfab worker demo-2 stopped \(drained \d+ jobs, 0 unfinished\)"),
            ("broker", r"zfab broker stopped"),
            ("api", r"zfab api stopped"),
            ("up", r"zfab up: stopped"),
        )
        if (m := re.search(rx, text))
    }
    assert len(at) == 5, text
    assert max(at["demo-1"], at["demo-2"]) < at["broker"] < at["api"] < at["up"], text
    # And the client waiting on POST ?wait got its job's end
    assert answer.get("state") == "completed", answer
    assert up.proc.returncode == 0


def test_no_child_outlives_a_killed_zfab_up(up: Up) -> None:
    kids = up.children()
    assert len(kids) == 4, kids
    os.kill(up.proc.pid, signal.SIGKILL)
    up.proc.wait(10)
    wait_for(lambda: not [pid for pid in kids if alive(pid)], 40, interval=0.2, what="every child gone")


@pytest.mark.parametrize("which", ["api", "broker"])
def test_up_refuses_a_taken_port_in_one_line(tmp_path: Path, which: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        args, env = (
            (["--api-port", str(port)], {}) if which == "api" else ([], {"ZFAB_BROKER": f"tcp://127.0.0.1:{port}"})
        )
        u = start_up(tmp_path, *args, env=env)
        try:
            u.proc.wait(30)
        finally:
            if u.proc.poll() is None:
                os.killpg(u.proc.pid, signal.SIGKILL)
    text = u.text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert u.proc.returncode == 2 and len(lines) == 1, text
    assert f":{port}" in lines[0] and "Address already in use" in lines[0], text
    assert "zfab up: broker" not in text  # no banner, nothing started


def test_the_banner_says_how_to_type_zfab(up: Up) -> None:
    text = up.text()
    assert re.search(r"^  CLI +.*(source \S+/bin/activate|zfab is on your PATH)", text, re.M), text


def test_a_child_that_keeps_dying_is_reported_and_left_down_while_the_rest_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from zfab.cli.supervise import RestartPolicy, Stage, Supervisor
    from zfab.core.retries import Backoff

    policy = RestartPolicy(backoff=Backoff(base=0.01, factor=2, cap=0.05, jitter=0), max_streak=3)
    sup = Supervisor([sys.executable, "-c"], policy=policy)
    env = dict(os.environ)
    steady = sup.add("api", Stage.API, ["import time; time.sleep(60)"], env)
    dying = sup.add("worker w9", Stage.WORKERS, ["import sys; sys.exit(3)"], env)
    gave_up: list[object] = []
    try:
        deadline = time.monotonic() + 30
        while not gave_up and time.monotonic() < deadline:
            gave_up += sup.watch()
            time.sleep(0.01)
        assert gave_up == [dying] and dying.restarts == 2 and dying.given_up, dying
        assert steady.running and steady.restarts == 0
        said = [r.getMessage() for r in caplog.records if "worker w9" in r.getMessage()]
        assert len(said) == 3 and "3 times in a row" in said[-1] and "not restarting" in said[-1], said
        assert all("exited (code 3)" in s for s in said), said
    finally:
        sup.stop({stage: 10.0 for stage in Stage}, threading.Event())
    assert not steady.running and steady.proc is not None and steady.proc.returncode == -signal.SIGTERM


def ignores_sigterm(pid: int) -> bool:
    ignored = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("hurried", [False, True])
def test_a_child_that_ignores_sigterm_is_killed_past_its_deadline_or_a_second_ctrl_c(
    caplog: pytest.LogCaptureFixture, hurried: bool
) -> None:
    from zfab.cli.supervise import Stage, Supervisor

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    sup = Supervisor([sys.executable, "-c"])
    child = sup.add("worker stubborn", Stage.WORKERS, [stubborn], dict(os.environ))
    assert child.proc is not None
    wait_for(lambda: ignores_sigterm(child.proc.pid), 20, what="the child ignoring SIGTERM")
    hurry = threading.Event()
    if hurried:
        hurry.set()  # a second Ctrl-C: the 60 s below are cut to about a second
    sup.stop({Stage.WORKERS: 60.0 if hurried else 0.5, Stage.BROKER: 1.0, Stage.API: 1.0}, hurry)
    assert child.proc is not None and child.proc.returncode == -signal.SIGKILL
    why = "after a second Ctrl-C" if hurried else "after 0.5 s"
    assert [r.getMessage() for r in caplog.records] == [f"zfab up: worker stubborn had not stopped {why}; killing it"]
