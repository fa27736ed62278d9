"""Events, file streaming and interactive input through the client, with real processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fabric import ROOT, fabric, wait_for, wait_workers

from zfab import BadRequestError

pytestmark = pytest.mark.integration


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_progress_events_arrive_in_order_and_can_be_read_back(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            seen: list[str] = []
            fut = c.submit(
                "demo", "progress", kwargs={"steps": 20, "delay": 0.01}, on_event=lambda e: seen.append(e["message"])
            )
            streamed = [e for e in c.events(fut, timeout=20) if e["event_type"] == "progress"]
            assert fut.result(5)["w1"]["result"] == {"steps": 20}
            expected = [f"step {i} of 20" for i in range(1, 21)]
            assert [e["message"] for e in streamed] == expected
            assert [m for m in seen if m.startswith("step")] == expected
            assert [e["progress"] for e in streamed] == sorted(e["progress"] for e in streamed)
            stored = c.job_events("demo", fut.uuid, "w1")
            assert [e["message"] for e in stored if e["event_type"] == "progress"] == expected


def test_a_100_mb_file_arrives_intact_with_bounded_memory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    blob = root / "big.bin"
    h = hashlib.sha256()
    with blob.open("wb") as out:
        for _ in range(100):
            block = os.urandom(1 << 20)
            h.update(block)
            out.write(block)
    with fabric(tmp_path) as f:
        f.broker()
        w = f.worker("f1", "files", "--root", str(root))
        with f.client() as c:
            wait_workers(c, {"f1"})
        worker_before = peak_rss_kib(w.pid)
        # The client runs in its own process so its peak memory is its own.
        code = (
            "import json, resource, sys\n"
            "from zfab import Client\n"
            "def peak():\n"
            "    return [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
            f"with Client(broker={f.endpoint!r}, name='dl') as c:\n"
            "    before = peak()\n"
            f"    d = c.fetch_file('files', 'big.bin', {str(tmp_path / 'out.bin')!r}, timeout=120)\n"
            "    print(json.dumps({'details': d, 'before': before, 'after': peak()}))\n"
        )
        run = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=f.env, capture_output=True, text=True, timeout=180
        )
        assert run.returncode == 0, run.stderr[-2000:]
        out = json.loads(run.stdout.strip().splitlines()[-1])
        assert out["details"]["sha256"] == h.hexdigest() and out["details"]["size"] == 100 << 20
        assert hashlib.sha256((tmp_path / "out.bin").read_bytes()).hexdigest() == h.hexdigest()
        client_growth = (out["after"] - out["before"]) / 1024
        worker_growth = (peak_rss_kib(w.pid) - worker_before) / 1024
        assert client_growth < 25, f"client peak RSS grew {client_growth:.1f} MiB for a 100 MiB file"
        assert worker_growth < 25, f"worker peak RSS grew {worker_growth:.1f} MiB for a 100 MiB file"


def test_a_slow_reader_throttles_the_sender(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    data = os.urandom(64 * 1024 * 40)
    (root / "f.bin").write_bytes(data)
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("f1", "files", "--root", str(root))
        with f.client() as c:
            wait_workers(c, {"f1"})
            stream = c.open_stream("files", "f.bin", chunk_size=64 * 1024, window=3)
            chunks = stream.future.chunks
            assert chunks is not None
            wait_for(lambda: chunks.qsize() == 3, 10, what="the first window of chunks")
            # Given the reader takes nothing, no chunk beyond the window arrives
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                assert chunks.qsize() <= 3
                time.sleep(0.02)
            assert not stream.future.done()
            # When it reads, credits flow back and the rest arrives
            got = b"".join(stream)
            assert got == data and stream.details()["chunks"] == 40


def test_bad_paths_and_parameters_get_clear_answers(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "empty.txt").write_bytes(b"")
    (root / "sub").mkdir()
    os.symlink("/etc/passwd", root / "escape")
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("f1", "files", "--root", str(root))
        with f.client() as c:
            wait_workers(c, {"f1"})
            for path, why in [
                ("../../etc/passwd", "outside the service root"),
                ("/etc/passwd", "absolute"),
                ("escape", "outside the service root"),
                ("missing.bin", "does not exist"),
                ("sub", "not a regular file"),
            ]:
                with pytest.raises(BadRequestError, match=why):
                    c.fetch_file("files", path, tmp_path / "x.bin")
                assert not (tmp_path / "x.bin").exists()
            assert c.fetch_file("files", "empty.txt", tmp_path / "e.bin")["size"] == 0
            with pytest.raises(BadRequestError, match="chunk_size"):
                c.fetch_file("files", "empty.txt", tmp_path / "e.bin", chunk_size=10)
            with pytest.raises(BadRequestError, match="window"):
                c.fetch_file("files", "empty.txt", tmp_path / "e.bin", window=1000)
            names = {e["name"] for e in c.run_job("files", "list_files")["f1"]["result"]}
            assert names == {"empty.txt", "sub"}  # the symlink leading out is not listed
            details = c.run_job("files", "file_details", kwargs={"path": "empty.txt"})["f1"]["result"]
            assert details["sha256"] == hashlib.sha256(b"").hexdigest()


def test_input_round_trip_validation_and_timeout(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            fut = c.submit("demo", "ask", kwargs={"question": "name?"}, timeout=30)
            wait_for(lambda: any(e["event_type"] == "input_request" for e in fut.events), 10, what="input request")
            # while it waits, GET says 102 and the job is not finished
            assert not fut.done()
            with pytest.raises(BadRequestError, match="shorter than 1"):
                c.send_input(fut.uuid, "")
            with pytest.raises(BadRequestError, match="expected string"):
                c.send_input(fut.uuid, 42)
            c.send_input(fut.uuid, "Ada")
            assert fut.result(10)["w1"]["result"] == {"question": "name?", "answer": "Ada"}
            # no answer: the job fails with a clear timeout
            late = c.run_job("demo", "ask", kwargs={"timeout": 0.3}, timeout=10)["w1"]
            assert late["failed"] is True and late["status"] == "timeout" and "no input" in late["errors"][0]
