"""`zfab up`'s restart rule and the CLI's pure helpers: no processes, no sockets beyond a bind."""

from __future__ import annotations

import io
import socket
import sys
from pathlib import Path

import pytest

from zfab.apiclient.jobs import show_job
from zfab.cli import UsageError, failure_lines, load_worker_class
from zfab.cli.local import banner, check_ports, connect_to, endpoint_port
from zfab.cli.supervise import RestartPolicy, exit_text

TRACEBACK = (
    'Traceback (most recent call last):\n  File "/w/demo.py", line 9, in fail\n    raise RuntimeError(m)\n'
    "RuntimeError: boom"
)


def test_a_dying_child_waits_longer_each_time_then_is_left_down() -> None:
    policy = RestartPolicy()
    streak, waits = 0, []
    for _ in range(6):
        streak = policy.streak_after(streak, lived=1.0)  # each death soon after its start
        waits.append(policy.delay(streak))
    assert waits == [0.5, 1.0, 2.0, 4.0, None, None]


def test_a_child_that_lived_long_starts_a_new_streak() -> None:
    policy = RestartPolicy(max_streak=3, stable_after=30.0)
    assert policy.streak_after(2, lived=29.0) == 3 and policy.delay(3) is None
    assert policy.streak_after(2, lived=30.0) == 1 and policy.delay(1) == 0.5


def test_exit_text_names_the_signal() -> None:
    assert exit_text(-9) == "killed by SIGKILL" and exit_text(3) == "code 3"


def test_endpoint_port_reads_tcp_endpoints_only() -> None:
    assert endpoint_port("tcp://127.0.0.1:5555") == ("127.0.0.1", 5555)
    assert endpoint_port("tcp://*:5555") == ("0.0.0.0", 5555)
    assert endpoint_port("ipc:///tmp/zfab") is None and endpoint_port("tcp://127.0.0.1:*") is None


def test_a_taken_port_is_a_usage_error_naming_it_and_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"127.0.0.1:{port}: .*in use.*--api-port"):
            check_ports("ipc:///nowhere", "127.0.0.1", port)
        with pytest.raises(UsageError, match=rf"tcp://127.0.0.1:{port}: .*in use.*--endpoint"):
            check_ports(f"tcp://127.0.0.1:{port}", "127.0.0.1", 0)
    check_ports(f"tcp://127.0.0.1:{port}", "127.0.0.1", port)  # free again: no error


def test_the_banner_names_the_api_url_only_when_it_is_not_the_default() -> None:
    ep = "tcp://127.0.0.1:5555"
    default = "\n".join(banner(ep, ep, ["demo-1"], "http://127.0.0.1:8000", 10))
    assert "ZFAB_API_URL" not in default and "ZFAB_BROKER" not in default and "zfab submit demo echo" in default
    other = "\n".join(banner("tcp://0.0.0.0:5601", "tcp://127.0.0.1:5601", ["demo-1"], "http://127.0.0.1:8123", 10))
    assert "ZFAB_API_URL=http://127.0.0.1:8123 zfab submit" in other
    assert "ZFAB_BROKER=tcp://127.0.0.1:5601 zfab run" in other


def test_a_wildcard_endpoint_is_reached_on_this_host() -> None:
    assert connect_to("tcp://0.0.0.0:5601") == "tcp://127.0.0.1:5601" == connect_to("tcp://*:5601")
    assert connect_to("tcp://127.0.0.2:5601") == "tcp://127.0.0.2:5601"


def test_failure_lines_print_a_traceback_as_its_lines() -> None:
    results = {"w1": {"failed": True, "status": "failed", "errors": [TRACEBACK]}, "w2": {"failed": False}}
    assert failure_lines(results) == ["worker w1 failed:", *("  " + line for line in TRACEBACK.splitlines())]
    assert failure_lines({"w2": {"failed": False}}) == [] and failure_lines(None) == []


def test_status_shows_an_exposed_traceback_as_lines_and_a_one_line_error_once() -> None:
    job = {"uuid": "u1", "state": "failed", "results": {"w1": {"failed": True, "errors": [TRACEBACK]}}}
    out = io.StringIO()
    show_job(job, out)
    assert '    File "/w/demo.py", line 9, in fail' in out.getvalue().splitlines()
    short = {"uuid": "u1", "state": "failed", "results": {"w1": {"failed": True, "errors": ["RuntimeError: boom"]}}}
    out = io.StringIO()
    show_job(short, out)
    assert out.getvalue().count("RuntimeError: boom") == 1


def test_a_worker_module_is_found_in_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd_tasks_x1.py").write_text(
        "from zfab import Worker, task\n\nclass Inv(Worker):\n    service = 'inv'\n\n    @task\n"
        "    def n(self) -> int:\n        return 1\n\nclass NoName(Worker):\n    pass\n"
    )
    (tmp_path / "cwd_broken_x1.py").write_text("import nosuchdependency_x1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_worker_class("cwd_tasks_x1:Inv", None).service == "inv"
    with pytest.raises(UsageError, match="NoName has no service name"):
        load_worker_class("cwd_tasks_x1:NoName", None)
    assert load_worker_class("cwd_tasks_x1:NoName", "given").__name__ == "NoName"  # --service names it
    with pytest.raises(UsageError, match=rf"no module 'cwd_absent_x1': looked for cwd_absent_x1.py .* in {tmp_path}"):
        load_worker_class("cwd_absent_x1:X", None)
    with pytest.raises(UsageError, match="cwd_broken_x1 imports 'nosuchdependency_x1', which is not installed"):
        load_worker_class("cwd_broken_x1:X", None)
