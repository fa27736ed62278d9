"""Trust, second round, the fabric's part (issue 38 items 1, 4, 5): what a hostile peer on the same host
did to the shared-memory tier, and a delay longer than a timeout, reproduced with real processes and
shown fixed. (The limits' findings need the broker's 60 s housekeeping and a 10,000-bucket table: they
are proven on the stub broker, tests/unit/test_broker_limits.py, and end to end by
../shared/acceptance/trust2.py part 4; the publisher's per-peer slots in test_topic_events.py.)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from fabric import Fabric, fabric, wait_for, wait_workers
from test_api import start_api

from zfab import Client, Settings
from zfab.core import protocol as nfp
from zfab.core import shmhandle
from zfab.transport.shm import host_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def reported(c: Client, worker: str) -> dict[str, Any]:
    for w in c.mmi("show_workers", timeout=2):
        if w["name"] == worker:
            stats: dict[str, Any] = w["reported"]
            return stats
    return {}


# ---- delay and timeout ---------------------------------------------------------------------------------


def test_a_job_delayed_longer_than_its_timeout_completes_through_the_client_and_the_api(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        base = start_api(f)
        with f.client() as c, httpx.Client(base_url=base, timeout=30) as http:
            wait_workers(c, {"w1"})
            c.run_job("demo", "echo", kwargs={"data": 0}, timeout=10)
            wait_for(lambda: reported(c, "w1").get("jobs_completed") == 1, 10, what="the worker's figures")
            # Given delay 3 s and timeout 1.5 s (the timeout counts from the end of the delay)
            t = time.monotonic()
            fut = c.submit("demo", "echo", kwargs={"data": "late-client"}, delay=3, timeout=1.5)
            r = http.post(
                "/jobs?wait=15",
                json={"service": "demo", "task": "echo", "kwargs": {"data": "late-api"}, "delay": 3, "timeout": 1.5},
            )
            # Then the client and the API report each job completed, as the broker ran it
            assert fut.result(15)["w1"]["result"] == "late-client" and fut.state == "completed"
            assert time.monotonic() - t >= 2.9  # held for its delay, not run early
            assert r.status_code == 200 and r.json()["state"] == "completed", r.text
            # And the worker ran each once (no dead letter to run again)
            wait_for(lambda: reported(c, "w1").get("jobs_completed") == 3, 10, what="three runs in all")


# ---- shared memory against a hostile peer on the same host ---------------------------------------------


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    d = Path("/dev/shm") / f"zfab-test-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class HostileBlock:
    """A block of the peer's own, named as zfab names blocks, holding `payload` or (sparse) claiming
    `claim` bytes it never wrote: the peer owns the file, so it may cut it whenever it likes."""

    def __init__(self, d: Path, payload: bytes | None = None, claim: int = 0) -> None:
        ns = f"{os.stat('/proc/self/ns/pid').st_ino & 0xFFFFFFFF:08x}"
        start = Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19]
        self.name = f"zfab-{ns}-{os.getpid()}-{start}-{secrets.token_hex(8)}"
        self.path = d / self.name
        self.payload = payload
        self.length = len(payload) if payload is not None else claim
        self.token = secrets.token_bytes(16)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.fill()

    def fill(self) -> None:
        os.ftruncate(self.fd, 64 + self.length)
        os.pwrite(self.fd, struct.pack("<8s16sQ", b"ZFABSHM1", self.token, self.length).ljust(64, b"\0"), 0)
        if self.payload is not None:
            os.pwrite(self.fd, self.payload, 64)

    def handle(self) -> bytes:
        return shmhandle.MARK + json.dumps({"shm": self.name, "len": self.length, "tok": self.token.hex()}).encode()

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def test_a_same_host_peers_sparse_and_shrinking_blocks_kill_nothing(tmp_path: Path, shm_dir: Path) -> None:
    f = Fabric(tmp_path)
    f.env["ZFAB_SHM_DIR"] = str(shm_dir)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    blocks: list[HostileBlock] = []
    try:
        f.broker()
        f.worker("wshm")
        f.worker("wplain", env={"ZFAB_SHM": "false"})  # the broker copies a block's bytes for this one
        s = Settings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier)
        with Client(settings=s, name="watch").start() as c:
            wait_workers(c, {"wshm", "wplain"})
            sock.connect(f.endpoint)
            host = host_id(str(shm_dir))
            flags = json.dumps({"push": True, "ack": False, "task": "echo", "timeout": 5, "host": host}).encode()

            def answer(target: bytes, job: bytes, body: bytes) -> tuple[bytes, dict[str, Any]]:
                sock.send_multipart([b"", nfp.CLIENT, nfp.POST, b"demo", target, job, body, flags])
                while True:
                    fr = sock.recv_multipart()  # [b"", NFPB01, command, service, uuid, status, payload]
                    if fr[2] == nfp.RESPONSE and fr[4] == job and fr[5] not in (nfp.ST_DISPATCHED, nfp.ST_QUEUED):
                        # (a large result of a worker on this host comes back as a handle of its own)
                        return fr[5], {} if shmhandle.is_handle(fr[6]) else json.loads(fr[6])

            # Given a 150-byte handle to an empty sparse block claiming 320 MiB (a message carries 64 MiB)
            sparse = HostileBlock(shm_dir, claim=320 << 20)
            blocks.append(sparse)
            for target in (b"wshm", b"wplain"):
                status, body = answer(target, b"sparse-" + target, sparse.handle())
                # Then the broker refuses it unread, naming the limit, and counts it
                assert status == nfp.ST_BAD_REQUEST and "ZFAB_MAX_MESSAGE_BYTES" in body["errors"][0], body
            assert c.mmi("show_broker")["counts"]["shm_refused"] == 2

            # Given a 4 MB body in a block its owner keeps cutting to 1 MiB and writing back
            payload = b'{"task":"echo","args":[],"kwargs":{"data":"' + b"B" * 4_000_000 + b'"},"timeout":5}'
            cut = HostileBlock(shm_dir, payload)
            blocks.append(cut)
            stop = threading.Event()

            def cutter() -> None:
                while not stop.is_set():
                    os.ftruncate(cut.fd, 64 + (1 << 20))
                    time.sleep(0.0005)
                    cut.fill()
                    time.sleep(0.0005)

            thread = threading.Thread(target=cutter, daemon=True)
            thread.start()
            try:
                # When the tier-on worker reads it, and the broker copies it for the tier-off worker
                seen: set[bytes] = set()
                for i in range(12):
                    for target in (b"wshm", b"wplain"):
                        status, body = answer(target, b"cut-%d-" % i + target, cut.handle())
                        seen.add(status)
                        if status != nfp.ST_OK:  # refused whole (cut, reused) or, for wplain, the handle forwarded
                            assert status == nfp.ST_BAD_REQUEST, body
            finally:
                stop.set()
                thread.join(5)
            # Then every job was answered, and nobody died of a SIGBUS
            for name in ("broker", "wshm", "wplain"):
                assert f.procs[name].poll() is None, f"{name} died: {f.procs[name].returncode}"
            wait_for(lambda: {"wshm", "wplain"} <= {w["name"] for w in c.mmi("show_workers") if w["alive"]}, 10)
            # And a block the broker cannot read for a worker that takes no handle fails its job at the broker
            gone = HostileBlock(shm_dir, b'{"task":"echo","args":[],"kwargs":{"data":"g"}}')
            handle = gone.handle()
            gone.close()
            status, body = answer(b"wplain", b"gone", handle)
            assert status == nfp.ST_BAD_REQUEST and "target" in body, body
            assert "could not read the job's body from shared memory for worker wplain" in body["errors"][0]
            assert "is gone" in body["errors"][0]
            assert c.mmi("show_broker")["counts"]["shm_unreadable"] >= 1
            # And a good handle still goes through afterwards
            cut.fill()
            assert answer(b"wshm", b"whole", cut.handle())[0] == nfp.ST_OK
            status, body = answer(b"wplain", b"whole-copied", cut.handle())
            assert status == nfp.ST_OK and len(body["wplain"]["result"]) == 4_000_000
    finally:
        sock.close(0)
        ctx.term()
        for b in blocks:
            b.close()
        f.stop()
