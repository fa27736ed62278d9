"""The `zfab` command as a user at a shell runs it: subprocesses, their output read, their exit codes.

Job commands go through a real `zfab api`; `zfab run` straight to a real broker. Progress bars are
drawn only for terminals, so those commands get a pseudo-terminal, as at a user's shell.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fabric import ROOT, Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Run:
    rc: int | None
    out: str
    err: str
    secs: float

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def zfab(args: list[str], env: dict[str, str], timeout: float = 30) -> Run:
    """`zfab ARGS` as a subprocess; on timeout its process group is killed and rc is None."""
    t = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "zfab.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
        rc: int | None = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    return Run(rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t)


def zfab_on_terminal(
    args: list[str], env: dict[str, str], timeout: float = 30
) -> tuple[int | None, list[tuple[float, str]]]:
    """`zfab ARGS` with stdout and stderr on one pseudo-terminal: (rc, [(time, text)] as it came)."""
    master, slave = os.openpty()
    p = subprocess.Popen(
        [sys.executable, "-m", "zfab.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(slave)
    got: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal closed: every writer is gone
                    break
                if not data:
                    break
                got.append((time.monotonic(), data.decode(errors="replace")))
        rc = p.wait(timeout=max(0.5, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        rc = None
    finally:
        os.close(master)
    return rc, got


def progress_segments(chunks: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """Distinct pieces of terminal output (split at CR/LF and escapes) that show a percentage, in order."""
    seen: dict[str, float] = {}
    for t, text in chunks:
        for seg in re.split(r"[\r\n]+", ANSI.sub("\n", text)):
            seg = seg.strip()
            if re.search(r"\d+%", seg) and seg not in seen:
                seen[seg] = t
    return sorted(((t, s) for s, t in seen.items()), key=lambda x: x[0])


@dataclass
class Stack:
    fabric: Fabric
    api: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    f = Fabric(tmp_path_factory.mktemp("cli"))
    try:
        f.broker()
        f.worker("w1")
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_API_DB": ""})
        base = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.post(base + "/jobs?wait=5", json={"service": "demo", "task": "echo"}).status_code == 200,
            30,
            what="a demo job through the API",
        )
        yield Stack(f, base, {**f.env, "ZFAB_API_URL": base})
    finally:
        f.stop()


def test_version_prints_the_version() -> None:
    r = zfab(["--version"], dict(os.environ))
    assert r.rc == 0 and re.fullmatch(r"zfab \d+\.\d+\.\d+\S*\n", r.out), r


def test_submit_prints_a_uuid_and_result_status_and_jobs_read_it_back(stack: Stack) -> None:
    # When a job is submitted from the command line
    r = zfab(["submit", "demo", "echo", "--kwargs", '{"data": "from-cli"}'], stack.env)
    assert r.rc == 0, r
    uuid = r.out.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", uuid), r.out
    # Then `result --wait` prints its results as JSON
    r = zfab(["result", uuid, "--wait", "10"], stack.env)
    assert r.rc == 0 and '"from-cli"' in r.out, r
    # And `status` says it completed
    r = zfab(["status", uuid], stack.env)
    assert r.rc == 0 and re.search(r"^state:\s+completed$", r.out, re.M), r.out
    # And `jobs` lists it in a table, filtered by state and service
    r = zfab(["jobs", "--state", "completed", "--service", "demo"], stack.env)
    assert r.rc == 0 and r.out.splitlines()[0].split()[:4] == ["UUID", "STATE", "SERVICE", "TASK"], r.out
    row = next(line for line in r.out.splitlines() if line.startswith(uuid))
    assert row.split()[1:4] == ["completed", "demo", "echo"]
    r = zfab(["jobs", "--service", "nosuch"], stack.env)
    assert r.rc == 0 and uuid not in r.out


def test_jobs_dead_lists_a_failed_job_and_retry_submits_it_again_linked_to_it(stack: Stack) -> None:
    # Given a job that fails its only attempt
    old = zfab(["submit", "demo", "flaky", "--kwargs", '{"failures": 1}', "--retries", "0"], stack.env).out.strip()
    assert zfab(["result", old, "--wait", "10"], stack.env).rc == 1
    # Then `jobs --dead` lists it, and `status` calls it a dead letter
    r = zfab(["jobs", "--dead"], stack.env)
    assert r.rc == 0 and any(line.startswith(old) for line in r.out.splitlines()), r.out
    assert re.search(r"^dead letter:\s+yes", zfab(["status", old], stack.env).out, re.M)
    # When `retry` submits it again (the same request: it fails again, so --wait exits 1)
    r = zfab(["retry", old, "--wait", "10"], stack.env)
    new = r.out.strip()
    assert r.rc == 1 and re.fullmatch(r"[0-9a-f]{32}", new) and new != old, r
    # And says why it failed, in one line: the reason `status` gives
    reason = re.search(r"^reason:\s+(.+)$", zfab(["status", new], stack.env).out, re.M)
    assert reason and r.err_lines == [f"zfab retry: job {new} failed: {reason.group(1)}"], (r, reason)
    # Then each names the other, and the old one is no dead letter any more
    assert re.search(rf"^retry of:\s+{old}$", zfab(["status", new], stack.env).out, re.M)
    assert re.search(rf"^retried as:\s+{new}$", zfab(["status", old], stack.env).out, re.M)
    listed = zfab(["jobs", "--dead"], stack.env).out
    assert new in listed and old not in listed
    # And a second retry of the old one is refused, naming the new one
    r = zfab(["retry", old], stack.env)
    assert r.rc == 1 and new in r.err, r


def test_result_of_an_unfinished_job_exits_3_and_cancel_stops_it(stack: Stack) -> None:
    uuid = zfab(["submit", "demo", "sleep", "--kwargs", '{"seconds": 30}'], stack.env).out.strip()
    r = zfab(["result", uuid], stack.env)
    assert r.rc == 3 and "not finished" in r.err, r
    r = zfab(["cancel", uuid], stack.env)
    assert r.rc == 0 and "cancel requested" in r.out, r

    def cancelled() -> bool:
        return bool(re.search(r"cancell?ed", zfab(["status", uuid], stack.env).out))

    wait_for(cancelled, 15, interval=0.3, what="`zfab status` to say cancelled")
    r = zfab(["result", uuid, "--wait", "5"], stack.env)
    assert r.rc == 1, r
    # Cancelling a finished job is refused, as one line
    r = zfab(["cancel", uuid], stack.env)
    assert r.rc == 1 and len(r.err_lines) == 1 and "409" in r.err, r


def test_watch_prints_events_as_they_happen_with_a_progress_bar(stack: Stack) -> None:
    # 3 s of steps: `zfab watch` starting (a second on a loaded machine) still sees most of them come
    uuid = zfab(["submit", "demo", "progress", "--kwargs", '{"steps": 5, "delay": 0.6}'], stack.env).out.strip()
    rc, chunks = zfab_on_terminal(["watch", uuid], stack.env)
    text = ANSI.sub("", "".join(c for _, c in chunks))
    assert rc == 0, text
    assert [f"step {i} of 5" in text for i in range(1, 6)] == [True] * 5, text
    assert "[" in text and "100%" in text and text.rstrip().endswith("completed"), text
    # As they happen: the steps arrive spread over the job's 3 s, not all at the end
    segs = progress_segments(chunks)
    assert len(segs) >= 5 and segs[-1][0] - segs[0][0] > 0.6, segs


def test_watch_without_a_terminal_prints_lines_only(stack: Stack) -> None:
    uuid = zfab(["submit", "demo", "progress", "--kwargs", '{"steps": 2, "delay": 0.05}'], stack.env).out.strip()
    r = zfab(["watch", uuid, "--json"], stack.env)
    assert r.rc == 0 and r.err == "", r
    lines = r.out.splitlines()
    assert len(lines) == 3 and '"event": "end"' in lines[-1], r.out


def test_client_commands_report_an_unreachable_api_in_one_line(stack: Stack) -> None:
    nowhere = {**stack.env, "ZFAB_API_URL": f"http://127.0.0.1:{free_port()}"}
    for args in (["status", "abc"], ["jobs"], ["submit", "demo", "echo"], ["schedules", "list"]):
        r = zfab(args, nowhere)
        assert r.rc == 1 and len(r.err_lines) == 1 and "cannot reach the API" in r.err, (args, r)
    r = zfab(["status", "nosuchjob"], stack.env)
    assert r.rc == 1 and len(r.err_lines) == 1 and "404" in r.err, r
    r = zfab(["submit", "demo", "echo", "--kwargs", "{nope"], stack.env)
    want = "zfab submit: --kwargs is not JSON: Expecting property name enclosed in double quotes at line 1, column 2"
    assert r.rc == 2 and r.err_lines == [want], r


def test_run_shows_live_progress_on_stderr(stack: Stack) -> None:
    rc, chunks = zfab_on_terminal(
        ["run", "demo", "progress", "--kwargs", '{"steps": 5, "delay": 0.4}'], stack.env, timeout=40
    )
    segs = progress_segments(chunks)
    done = chunks[-1][0]
    assert rc == 0 and len(segs) >= 5, chunks
    # Live: the first step shows while the 2 s job still runs
    assert done - segs[0][0] > 1.0, (segs, done)
    assert '"steps": 5' in "".join(c for _, c in chunks)


def test_run_reports_a_silent_broker_within_its_hold_time(stack: Stack) -> None:
    dead = f"tcp://127.0.0.1:{free_port()}"
    hold = stack.fabric.hold_time
    r = zfab(["run", "demo", "echo", "--broker", dead, "--timeout", "60"], stack.env)
    assert r.rc == 1 and dead in r.err and "hold time" in r.err and len(r.err_lines) == 1, r
    # An order, not a time window: the broker's silence ended it, before the job's own 60 s timeout did
    assert r.secs < 60, f"took {r.secs:.1f} s for a hold time of {hold:g} s: it waited out the timeout"


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["worker"], {"ZFAB_POOL_SIZE": "abc"}, r"^zfab worker: bad setting ZFAB_POOL_SIZE='abc': Input should be"),
        (["broker", "--keepalive-interval", "-1"], {}, r"^zfab broker: bad setting --keepalive-interval=-1.0: "),
        (
            ["worker", "--worker", "nomod:X"],
            {},
            r"^zfab worker: --worker nomod:X: no module 'nomod': looked for",
        ),
        (["worker", "--worker", "json:nothing"], {}, r"module 'json' has no 'nothing'"),
        (["worker", "--worker", "json:loads"], {}, r"not a subclass of zfab.Worker"),
        (["worker", "--worker", "nocolon"], {}, r"--worker must look like module:Class"),
        (["run", "demo", "echo", "--args", '{"a": 1}'], {}, r"--args must be a JSON list"),
        (["mmi", "show_workers", "--kwargs", "[1"], {}, r"--kwargs is not JSON"),
        (["api", "--port", "70000"], {}, r"^zfab api: bad setting --port=70000: Input should be less than"),
        (["up", "--workers", "-1"], {}, r"^zfab up: --workers must be 0 or more, got -1$"),
        (["up", "--grace", "-1"], {}, r"^zfab up: --grace must be 0 or more seconds, got -1$"),
        (
            ["broker", "--endpoint", "tcp://127.0.0.1:0", "--inventory", "/nonexistent/inventory.yaml"],
            {},
            r"^zfab broker: cannot load the NorFab inventory /nonexistent/inventory.yaml: .*ZFAB_BROKER_INVENTORY",
        ),
    ],
)
def test_bad_settings_and_arguments_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    e = {**os.environ, "ZFAB_BROKER": nowhere, "ZFAB_DATA_DIR": str(tmp_path), **env}
    r = zfab(args, e, timeout=15)
    assert r.rc == 2 and len(r.err_lines) == 1 and re.search(says, r.err), r


def test_a_port_in_use_is_one_line_and_exit_2(stack: Stack) -> None:
    f = stack.fabric
    r = zfab(["broker", "--endpoint", f.endpoint], f.env)
    assert r.rc == 2 and len(r.err_lines) == 1 and "Address already in use" in r.err, r
    api_port = stack.api.rsplit(":", 1)[1]
    r = zfab(["api", "--port", api_port], f.env)
    assert r.rc == 2 and len(r.err_lines) == 1 and f"cannot listen on 127.0.0.1:{api_port}" in r.err, r
    busy = f.endpoint.rsplit(":", 1)[1]  # a port something already listens on
    r = zfab(["worker", "--metrics-port", busy, "--name", "m1"], f.env)
    assert r.rc == 2 and len(r.err_lines) == 1 and f"cannot serve metrics on 127.0.0.1:{busy}" in r.err, r


def test_keys_refuse_to_replace_a_pair_without_force(tmp_path: Path) -> None:
    env = dict(os.environ)
    d = tmp_path / "keys"

    def snapshot() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(d.iterdir())}

    assert zfab(["keys", "--dir", str(d), "--name", "k"], env).rc == 0
    first = snapshot()
    assert set(first) == {"k.key", "k.key_secret"}
    r = zfab(["keys", "--dir", str(d), "--name", "k"], env)
    assert r.rc == 1 and "--force" in r.err and len(r.err_lines) == 1, r
    assert snapshot() == first
    r = zfab(["keys", "--dir", str(d), "--name", "k", "--force"], env)
    assert r.rc == 0 and snapshot() != first


def test_processes_print_one_ready_line_and_one_stopped_line(tmp_path: Path) -> None:
    f = Fabric(tmp_path)
    try:
        f.broker()
        f.worker("w1")
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_API_DB": ""})
        wait_for(lambda: "zfab api ready" in f.log("api"), 30, what="the API's ready line")
        wait_for(lambda: "zfab worker w1 ready" in f.log("w1"), 30, what="the worker's ready line")
        assert f.log("broker").count("zfab broker ready on tcp://127.0.0.1:") == 1, f.log("broker")
        assert "listening on" not in f.log("broker")  # no log line repeating the ready line
        assert f.log("api").count(f"zfab api ready on http://127.0.0.1:{port}") == 1, f.log("api")
        # uvicorn's own startup lines would only repeat it
        assert "Uvicorn running" not in f.log("api") and "Application startup" not in f.log("api")
        for name in ("api", "w1", "broker"):
            f.signal(name, signal.SIGTERM)
            f.procs[name].wait(20)
    finally:
        f.stop()
    assert f.log("api").count("zfab api stopped") == 1
    assert re.search(r"^zfab worker w1 stopped \(drained \d+ jobs, 0 unfinished\)$", f.log("w1"), re.M), f.log("w1")
    assert re.search(r"^zfab broker stopped", f.log("broker"), re.M), f.log("broker")


def test_up_prints_its_banner_once_the_api_answers(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "ZFAB_BROKER": f"tcp://127.0.0.1:{free_port()}",
        "ZFAB_DATA_DIR": str(tmp_path),
        "ZFAB_API_DB": "",
        "PYTHONUNBUFFERED": "1",
    }
    p = subprocess.Popen(
        [sys.executable, "-m", "zfab.cli", "up", "--workers", "1", "--api-port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert p.stdout is not None
    try:
        deadline = time.monotonic() + 60
        banner_at = None
        while time.monotonic() < deadline and banner_at is None:
            line = p.stdout.readline().decode(errors="replace")
            if not line:
                break
            if line.startswith("zfab up: broker"):
                banner_at = time.monotonic()
                # At the moment the banner shows, the API answers where it says
                assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        assert banner_at is not None, "no banner within 60 s"
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    assert b"zfab up: stopped" in out


# ---- user code, tracebacks, input, pipes and tokens (issue 37) ----------------------------------------

ZFAB_SCRIPT = Path(sys.executable).parent / "zfab"  # the console script, as a user types it


def zfab_script(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 30) -> Run:
    """The `zfab` console script (not `python -m`, which would put the cwd on sys.path) run from `cwd`."""
    if not ZFAB_SCRIPT.exists():
        pytest.skip(f"no zfab console script beside {sys.executable}")
    t = time.monotonic()
    r = subprocess.run(
        [str(ZFAB_SCRIPT), *args], env=env, cwd=cwd, capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout
    )
    return Run(r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"), time.monotonic() - t)


USER_WORKER = """
import service  # the project's own service.py, beside this file

from zfab import Worker, task


class Inventory(Worker):
    service = "inventory-cwd"

    @task
    def whoami(self) -> str:
        return service.GREETING


class Nameless(Worker):
    @task
    def noop(self) -> None:
        return None
"""


def user_project(tmp_path: Path) -> Path:
    """A project holding its own service.py and api/ package, and a worker module."""
    d = tmp_path / "myproject"
    (d / "api").mkdir(parents=True)
    (d / "api" / "__init__.py").write_text("ROUTES = ['/users']\n")
    (d / "service.py").write_text("GREETING = 'the project s own service module'\n")
    (d / "mytasks.py").write_text(USER_WORKER)
    return d


def test_worker_imports_user_code_from_the_current_directory_without_pythonpath(stack: Stack, tmp_path: Path) -> None:
    # Given a project with its own service.py and api/, and no PYTHONPATH
    proj = user_project(tmp_path)
    env = {k: v for k, v in stack.env.items() if k != "PYTHONPATH"}
    env["ZFAB_DATA_DIR"] = str(tmp_path / "data")
    # When its worker is started from that directory with the console script
    p = subprocess.Popen(
        [str(ZFAB_SCRIPT), "worker", "--worker", "mytasks:Inventory", "--name", "inv-cwd"],
        env=env,
        cwd=proj,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        got: dict[str, object] = {}

        def served() -> bool:
            if p.poll() is not None:
                raise AssertionError(f"the worker exited {p.returncode}: {p.communicate()[0]!r}")
            r = httpx.post(stack.api + "/jobs?wait=5", json={"service": "inventory-cwd", "task": "whoami"}, timeout=15)
            got.update(r.json())
            return r.status_code == 200 and got.get("state") == "completed"

        wait_for(served, 30, interval=0.5, what="a job on the user's worker")
        # Then its `import service` is the project's own module, not anything of zfab's
        results = got["results"]
        assert isinstance(results, dict) and results["inv-cwd"]["result"] == "the project s own service module"
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.communicate(timeout=30)


def test_a_worker_module_not_found_says_where_it_looked_and_how_to_fix_it(tmp_path: Path) -> None:
    env = {**os.environ, "ZFAB_BROKER": f"tcp://127.0.0.1:{free_port()}", "ZFAB_DATA_DIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    r = zfab_script(["worker", "--worker", "nosuchmod:Inventory"], env, tmp_path)
    assert r.rc == 2 and len(r.err_lines) == 1, r
    assert str(tmp_path) in r.err and "PYTHONPATH" in r.err and "run zfab worker from the directory" in r.err, r


def test_a_worker_class_without_a_service_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proj = user_project(tmp_path)
    env = {**os.environ, "ZFAB_BROKER": f"tcp://127.0.0.1:{free_port()}", "ZFAB_DATA_DIR": str(tmp_path / "d")}
    r = zfab_script(["worker", "--worker", "mytasks:Nameless"], env, proj)
    assert r.rc == 2 and len(r.err_lines) == 1 and "Nameless has no service name" in r.err, r
    assert "Traceback" not in r.err


def test_run_prints_a_failed_tasks_traceback_as_lines(stack: Stack) -> None:
    r = zfab(["run", "demo", "fail", "--kwargs", '{"message": "boom-lines"}'], stack.env)
    assert r.rc == 1, r
    result = json.loads(r.out)  # stdout stays the result dictionary, for scripts
    assert any(v["failed"] for v in result.values()), r.out
    lines = r.err.splitlines()
    assert any(line.strip() == "Traceback (most recent call last):" for line in lines), r.err
    assert any(re.fullmatch(r'\s+File ".*", line \d+, in \w+', line) for line in lines), r.err
    assert "\\n" not in r.err, r.err


def test_input_answers_a_jobs_input_request_from_the_command_line(stack: Stack) -> None:
    uuid = zfab(["submit", "demo", "ask", "--kwargs", '{"question": "name?"}'], stack.env).out.strip()

    def waiting() -> bool:
        return bool(re.search(r"^waiting for input:\s+name\?", zfab(["status", uuid], stack.env).out, re.M))

    wait_for(waiting, 20, interval=0.3, what="the job to wait for input")
    assert f"zfab input {uuid} VALUE" in zfab(["status", uuid], stack.env).out
    r = zfab(["input", uuid, "Ada"], stack.env)
    assert r.rc == 0 and r.out.startswith(f"answered {uuid}"), r
    r = zfab(["result", uuid, "--wait", "10"], stack.env)
    assert r.rc == 0 and "Ada" in r.out, r
    # A job that waits for nothing: one line, exit 1
    r = zfab(["input", uuid, "again"], stack.env)
    assert r.rc == 1 and len(r.err_lines) == 1 and "409" in r.err, r


def test_output_into_a_closed_pipe_exits_quietly(stack: Stack) -> None:
    uuid = zfab(["submit", "demo", "echo"], stack.env).out.strip()
    zfab(["result", uuid, "--wait", "10"], stack.env)
    for args in (["status", uuid], ["jobs", "--limit", "200"], ["result", uuid]):
        read, write = os.pipe()
        os.close(read)  # as `| head` does once it has its lines: every write now fails with EPIPE
        try:
            p = subprocess.run(
                [sys.executable, "-m", "zfab.cli", *args],
                env=stack.env,
                stdout=write,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                timeout=30,
            )
        finally:
            os.close(write)
        assert p.returncode == 141 and p.stderr == b"", (args, p.returncode, p.stderr)


def test_a_401_names_the_token_variable_and_the_token_flag_works(stack: Stack) -> None:
    f = stack.fabric
    port = free_port()
    f.start("api-auth", "api", "--port", str(port), env={"ZFAB_API_DB": "", "ZFAB_API_TOKENS": "s3cret"})
    env = {**stack.env, "ZFAB_API_URL": f"http://127.0.0.1:{port}"}
    env.pop("ZFAB_API_TOKEN", None)

    def answers() -> bool:
        return zfab(["jobs", "--token", "s3cret"], env).rc == 0

    wait_for(answers, 30, interval=0.5, what="the API with a token")
    r = zfab(["jobs"], env)
    assert r.rc == 1 and len(r.err_lines) == 1 and "401" in r.err, r
    assert "ZFAB_API_TOKEN" in r.err and "--token" in r.err, r
    assert zfab(["jobs"], {**env, "ZFAB_API_TOKEN": "s3cret"}).rc == 0
