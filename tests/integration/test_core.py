"""The fabric core with real processes: routing, failures, faults and bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from fabric import ROOT, fabric, free_port, wait_for, wait_workers

from zfab import (
    BackpressureError,
    BadRequestError,
    Client,
    ClosedError,
    NoWorkersError,
    PayloadTooLargeError,
    Settings,
    WorkerLostError,
)

pytestmark = pytest.mark.integration


def test_jobs_reach_all_any_and_failures_come_back_as_data(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_workers(c, {"w1", "w2"})
            # all: one entry per worker, each carrying the result shape
            r = c.run_job("demo", "echo", kwargs={"data": "hello"}, workers="all", timeout=10)
            assert set(r) == {"w1", "w2"}
            for name, entry in r.items():
                assert entry["result"] == "hello" and entry["failed"] is False and entry["errors"] == []
                for key in ("messages", "juuid", "task", "status", "task_started", "task_completed", "service"):
                    assert key in entry
                assert entry["task"] == f"{name}:echo" and entry["service"] == "demo"
            # any: exactly one worker; a name or a list picks those workers
            assert len(c.run_job("demo", "echo", kwargs={"data": 1}, timeout=10)) == 1
            assert set(c.run_job("demo", "add", kwargs={"a": 1, "b": 2}, workers="w2", timeout=10)) == {"w2"}
            r = c.run_job("demo", "add", args=[2, 3], workers=["w1", "w2"], timeout=10)
            assert {v["result"] for v in r.values()} == {5}
            # a task that raises is a failed result with its traceback, not a client exception
            r = c.run_job("demo", "fail", kwargs={"message": "boom"}, timeout=10)
            (entry,) = r.values()
            assert entry["failed"] is True and "RuntimeError: boom" in entry["errors"][0]


def test_unknown_service_task_and_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            with pytest.raises(NoWorkersError, match="service 'nope' is unknown"):
                c.run_job("nope", "echo", timeout=5)
            with pytest.raises(NoWorkersError, match="no worker named ghost"):
                c.run_job("demo", "echo", workers="ghost", timeout=5)
            with pytest.raises(BadRequestError, match="task 'nosuch' is not a task of service 'demo'"):
                c.run_job("demo", "nosuch", timeout=5)
            with pytest.raises(BadRequestError, match=r"bad arguments for task 'add'.*a:"):
                c.run_job("demo", "add", kwargs={"a": "not a number", "b": 1}, timeout=5)
            with pytest.raises(BadRequestError, match="b"):
                c.run_job("demo", "add", kwargs={"a": 1}, timeout=5)
            tasks = c.run_job("demo", "list_tasks", timeout=5)["w1"]["result"]
            add = next(t for t in tasks if t["name"] == "add")
            assert set(add["inputSchema"]["required"]) == {"a", "b"}


def test_killed_worker_is_purged_and_its_job_fails_with_worker_lost(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=3) as f:
        f.broker()
        f.worker("victim")
        f.worker("other")
        with f.client() as c:
            wait_workers(c, {"victim", "other"})
            fut = c.submit("demo", "sleep", kwargs={"seconds": 30}, workers="victim", timeout=60)
            wait_for(lambda: fut.timings.get("dispatched") is not None, 5, what="job dispatched")
            t0 = time.monotonic()
            f.kill("victim")
            with pytest.raises(WorkerLostError, match="victim"):
                fut.result(20)
            took = time.monotonic() - t0
            assert took <= f.hold_time + 2.0, f"worker lost reported after {took:.2f} s"
            assert "victim" not in {w["name"] for w in c.mmi("show_workers")}
            # the service goes on with the remaining worker
            assert set(c.run_job("demo", "echo", kwargs={"data": 1}, timeout=5)) == {"other"}


def test_workers_reregister_quickly_after_a_broker_restart(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker("broker1")
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_workers(c, {"w1", "w2"})
            f.kill("broker1")
            f.broker("broker2")
            wait_for(lambda: c.mmi("show_broker", timeout=1) is not None, 20, what="new broker answers")
            t0 = time.monotonic()
            wait_workers(c, {"w1", "w2"}, timeout=f.hold_time)
            took = time.monotonic() - t0
            # far sooner than a hold time (3 s here): within about one keepalive interval
            assert took < f.interval * 3 + 0.5, f"re-registered after {took:.2f} s"
            assert c.run_job("demo", "echo", kwargs={"data": 7}, workers="all", timeout=5).keys() == {"w1", "w2"}


def test_an_idle_fabric_keeps_alive_in_one_wave_and_a_closing_client_leaves_it(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker()
        names = {"w1", "w2", "w3"}
        with f.client() as c:
            for n in sorted(names):  # one after the other: their own clocks start at random phases
                f.worker(n)
                wait_workers(c, {n} | {m for m in names if m < n})

            def one_wave() -> bool:
                # The broker heard every worker within a few ms: they answered the same wave
                # (on clocks of their own they would be spread over the 0.3 s interval).
                ws = [w for w in c.mmi("show_workers", timeout=2) if w["alive"]]
                left = [w["holdtime_left_s"] for w in ws]
                return len(ws) == 3 and max(left) - min(left) < 0.05 and min(w["keepalives_received"] for w in ws) >= 5

            wait_for(one_wave, 15, what="the workers answering one keepalive wave")

            def broker() -> dict[str, Any]:
                answer: dict[str, Any] = c.mmi("show_broker", timeout=2)
                return answer

            assert broker()["client_keepalives"] == 1  # this client, in the wave too
            other = f.client("other")
            wait_for(lambda: broker()["client_keepalives"] == 2, 5, what="a second client in the wave")
            other.close()
            wait_for(lambda: broker()["client_keepalives"] == 1, 5, what="the closed client out of the wave")
            dropped = broker()["frames_send_dropped"]
            sent = {w["name"]: w["keepalives_sent"] for w in c.mmi("show_workers", timeout=2)}
            wait_for(
                lambda: all(w["keepalives_sent"] >= sent[w["name"]] + 2 for w in c.mmi("show_workers", timeout=2)),
                5,
                what="two more waves",
            )
            assert broker()["frames_send_dropped"] == dropped  # no wave went to the closed client


def test_job_in_flight_across_a_broker_restart_still_returns_its_result(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker("broker1")
        f.worker("w1")
        with f.client(poll_after=0.5) as c:
            wait_workers(c, {"w1"})
            fut = c.submit("demo", "sleep", kwargs={"seconds": 1.5}, timeout=30)
            wait_for(lambda: fut.timings.get("dispatched") is not None, 5, what="job dispatched")
            f.kill("broker1")
            f.broker("broker2")
            r = fut.result(25)
            assert r["w1"]["failed"] is False and r["w1"]["result"] >= 1.5


def test_a_retried_post_with_the_same_uuid_runs_once(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client(name="a") as a, f.client(name="b") as b:
            wait_workers(a, {"w1", "w2"})
            first = a.submit("demo", "sleep", kwargs={"seconds": 0.5}, uuid="same-job-1", timeout=10)
            wait_for(lambda: first.timings.get("dispatched") is not None, 5, what="first dispatch")
            again = b.submit("demo", "sleep", kwargs={"seconds": 0.5}, uuid="same-job-1", timeout=10)
            r1, r2 = first.result(10), again.result(10)
            assert r1.keys() == r2.keys()
            (w,) = r1
            assert r1[w]["task_started"] == r2[w]["task_started"]


def test_malformed_frames_never_stop_the_broker(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(f.endpoint)
        garbage = [
            [os.urandom(7)],
            [b"", b"HTTP/1.1", b"0x04"],
            [b"", b"NFPC01", b"0x99", b"demo", b"any", b"u1", b"{}"],
            [b"NFPC01", b"0x04", b"demo", b"any", b"u1", b"{}", b""],
            [b"", b"NFPC01", b"0x04", b"demo", b"any", b"u1", b"{}", b"not json"],
            [b"", b"NFPC01", b"0x11", b"mmi.service.broker", b"any", b"u2", b"[1,2"],
            [b"", b"NFPW01", b"0x05", b"client"],
            [b"", b"NFPC01", b"0x04", b"demo", b"[bad", b"u3", b"{}"],
            [b"", b"NFPC01", b"0x04", b"demo", b"any", b"u4", b"\xff\xfe"],
        ]
        try:
            with f.client() as c:
                wait_workers(c, {"w1"})
                for frames in garbage * 20:
                    raw.send_multipart(frames)
                wait_for(
                    lambda: sum(c.mmi("show_broker")["frames_rejected"].values()) >= 160, 10, what="rejections counted"
                )
                assert (
                    c.run_job("demo", "echo", kwargs={"data": "still here"}, timeout=10)["w1"]["result"] == "still here"
                )
                rejected = c.mmi("show_broker")["frames_rejected"]
                assert {"header", "command", "json", "target", "frame_count"} <= set(rejected)
        finally:
            raw.close(0)
            ctx.term()
        assert f.procs["broker"].poll() is None


def test_malformed_frames_never_stop_a_worker(tmp_path: Path) -> None:
    # A raw ROUTER plays the broker so it can send the worker anything.
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    fake.setsockopt(zmq.RCVTIMEO, 10_000)
    fake.bind(ep)
    with fabric(tmp_path) as f:
        f.env["ZFAB_BROKER"] = ep
        f.worker("w1")
        try:
            ident, *ready_msg = fake.recv_multipart()
            assert ready_msg[:3] == [b"", b"NFPW01", b"0x01"]
            for frames in (
                [b"junk"],
                [b"", b"NFPB01", b"0x04", b"c1", b"", b"u1"],
                [b"", b"NFPB01", b"0x04", b"c1", b"X", b"u1", b"{}"],
                [b"", b"NFPB01", b"0x77", b"demo"],
                [b"", b"NFPB01", b"0x04", b"c1", b"", b"u2", b"{not json"],
            ):
                fake.send_multipart([ident, *frames])
            body = json.dumps({"task": "echo", "kwargs": {"data": "ok"}, "push": True, "ack": False}).encode()
            fake.send_multipart([ident, b"", b"NFPB01", b"0x04", b"c1", b"", b"u3", body])
            deadline = time.monotonic() + 10
            replies = {}
            while time.monotonic() < deadline and "u3" not in replies:
                msg = fake.recv_multipart()[1:]
                if msg[2] == b"0x05":
                    replies[msg[5].decode()] = (msg[6], json.loads(msg[7]))
            assert replies["u2"][0] == b"400"  # bad JSON body is answered, not fatal
            assert replies["u3"] == (b"200", replies["u3"][1]) and replies["u3"][1]["w1"]["result"] == "ok"
            assert f.procs["w1"].poll() is None
        finally:
            fake.close(0)
            ctx.term()


def test_full_outbound_queue_gives_backpressure_and_closed_client_rejects() -> None:
    # Nobody listens: ZeroMQ's own pipe fills to its high-water mark, then ours.
    s = Settings(
        broker=f"tcp://127.0.0.1:{free_port()}", outbound_queue_size=10, submit_timeout=0.05, max_client_jobs=100_000
    )
    c = Client(settings=s, name="bp").start()
    try:
        with pytest.raises(BackpressureError, match="outbound queue full"):
            for i in range(50_000):
                c.submit("demo", "echo", kwargs={"data": i}, timeout=30)
    finally:
        c.close()
    with pytest.raises(ClosedError):
        c.submit("demo", "echo", timeout=1)


def test_cli_run_and_mmi_print_json(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
        env = dict(f.env)
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "zfab.cli",
                "run",
                "demo",
                "echo",
                "--kwargs",
                '{"data": "cli"}',
                "--workers",
                "all",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["w1"]["result"] == "cli"
        mmi = subprocess.run(
            [sys.executable, "-m", "zfab.cli", "mmi", "show_workers"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert mmi.returncode == 0, mmi.stderr
        assert [w["name"] for w in json.loads(mmi.stdout)] == ["w1"]
        bad = subprocess.run(
            [sys.executable, "-m", "zfab.cli", "run", "nope", "echo"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 1 and "NoWorkersError" in bad.stderr


def test_sigterm_stops_a_worker_cleanly_and_the_broker_forgets_it(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=20) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            # At once after READY: the worker may not have printed "ready" yet, and a SIGTERM
            # then must still stop it cleanly, not kill it under the default action.
            f.signal("w1", signal.SIGTERM)
            assert f.procs["w1"].wait(10) == 0, f.log("w1")
            assert "zfab worker w1 stopped" in f.log("w1")
            # DISCONNECT on the way out: gone at once, not after the 6 s hold time
            wait_for(lambda: "w1" not in {w["name"] for w in c.mmi("show_workers")}, 3, what="w1 forgotten")


def test_zfab_up_starts_a_fabric_and_ctrl_c_stops_it_all(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        up = f.start("up", "up", "--workers", "2", "--api-port", "0", "--endpoint", f.endpoint)
        with f.client() as c:
            wait_workers(c, {"demo-1", "demo-2"})
            assert set(c.run_job("demo", "echo", kwargs={"data": 1}, workers="all", timeout=10)) == {"demo-1", "demo-2"}
        f.signal("up", signal.SIGINT)
        assert up.wait(20) == 0
        # no child is left behind: nothing listens on the broker's port any more

        def port_closed() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", f.port)) != 0

        wait_for(port_closed, 10, what="broker gone")


def test_messages_over_the_size_limit_are_refused_and_counted(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_MAX_MESSAGE_BYTES"] = str(64 * 1024)
        f.broker()
        f.worker("w1")
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(f.endpoint)
        try:
            # Each frame is under ZeroMQ's per-frame limit, the whole message is over ours.
            big = b"x" * (40 * 1024)
            raw.send_multipart([b"", b"NFPC01", b"0x04", b"demo", b"any", b"u-big", big, big])
            with f.client() as c:
                wait_workers(c, {"w1"})
                wait_for(lambda: c.mmi("show_broker")["frames_rejected"].get("oversize", 0) == 1, 10, what="counted")
                assert c.run_job("demo", "echo", kwargs={"data": "small"}, timeout=10)["w1"]["result"] == "small"
                t = time.monotonic()
                with pytest.raises(PayloadTooLargeError, match="ZFAB_MAX_MESSAGE_BYTES = 65536"):
                    # a client's own oversize job is refused at once, with the broker's limit it heard
                    c.run_job("demo", "echo", kwargs={"data": "y" * 100_000}, timeout=10)
                assert time.monotonic() - t < 1.0
        finally:
            raw.close(0)
            ctx.term()
