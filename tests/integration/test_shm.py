"""The same-host shared-memory tier against real processes (docs/protocol.md, "Same-host shared
memory"): a 10 MB echo goes as handles both ways and leaves no block behind, over ipc:// and
tcp://127.0.0.1; a worker whose host id differs gets bytes; the cap sends payloads through the
sockets; a forged handle is refused with a clear error; a killed worker's blocks are reclaimed."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from fabric import Fabric, wait_for, wait_workers

from zfab import Client, Settings
from zfab.core import protocol as nfp
from zfab.core import shmhandle
from zfab.errors import WorkerLostError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TEN_MB = "x" * 10_000_000
HOLDER = "tests.integration.shm_workers:Holder"


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A directory of its own on the tmpfs: the test's blocks, and a host id only its processes share."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    d = Path("/dev/shm") / f"zfab-test-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def make_fabric(tmp: Path, shm_dir: Path, transport: str = "tcp") -> Fabric:
    f = Fabric(tmp)
    if transport == "ipc":
        f.endpoint = f"ipc://{tmp}/broker.sock"
        f.env["ZFAB_BROKER"] = f.endpoint
    f.env["ZFAB_SHM_DIR"] = str(shm_dir)
    return f


def client_of(f: Fabric, shm_dir: Path, **kw: Any) -> Client:
    s = Settings(
        broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier, shm_dir=str(shm_dir), **kw
    )
    c = Client(settings=s, name="shm").start()
    wait_for(lambda: c.broker_alive and c.session.link.host is not None, 20, what="the broker's keepalive answer")
    return c


def reported(c: Client, worker: str) -> dict[str, Any]:
    """The worker's last keepalive stats, as the broker shows them."""
    for w in c.mmi("show_workers", timeout=2):
        if w["name"] == worker:
            stats: dict[str, Any] = w["reported"]
            return stats
    raise AssertionError(f"no worker {worker}")


def blocks(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_10mb_echo_goes_by_shared_memory_both_ways_and_leaves_no_block(
    tmp_path: Path, shm_dir: Path, transport: str
) -> None:
    f = make_fabric(tmp_path, shm_dir, transport)
    try:
        f.broker()
        f.worker("w1")
        c = client_of(f, shm_dir)
        try:
            wait_workers(c, {"w1"})
            # When a 10 MB echo runs twice
            for _ in range(2):
                r = c.run_job("demo", "echo", kwargs={"data": TEN_MB}, timeout=30)
                assert r["w1"]["result"] == TEN_MB
            # Then both bodies and both results went as handles, and the broker read none of them
            assert c.shm.counts["sent"] == 2 and c.shm.counts["received"] == 2 and c.shm.counts["fallbacks"] == 0
            wait_for(lambda: reported(c, "w1").get("shm_sent") == 2, 10, what="the worker's stats")
            stats = reported(c, "w1")
            assert stats["shm_received"] == 2 and stats["shm_fallbacks"] == 0
            broker = c.mmi("show_broker")
            assert broker["shm_host"] == c.shm.host and "shm_materialized" not in broker["counts"]
            # The blocks were reused, not made per payload: one for the bodies, one for the results
            assert len(blocks(shm_dir)) == 2
        finally:
            c.close()
        f.signal("w1", 15)
        f.procs["w1"].wait(15)
        # And no block is left once client and worker are gone
        wait_for(lambda: blocks(shm_dir) == [], 10, what="no block left")
    finally:
        f.stop()


def test_a_worker_that_announced_another_host_id_gets_bytes(tmp_path: Path, shm_dir: Path) -> None:
    elsewhere = shm_dir / "elsewhere"  # another directory: another host id, as a container with its own /dev/shm
    elsewhere.mkdir()
    f = make_fabric(tmp_path, shm_dir)
    try:
        f.broker()
        f.worker("w2", env={"ZFAB_SHM_DIR": str(elsewhere)})
        c = client_of(f, shm_dir)
        try:
            wait_workers(c, {"w2"})
            r = c.run_job("demo", "echo", kwargs={"data": TEN_MB}, timeout=30)
            assert r["w2"]["result"] == TEN_MB
            # The client sent a handle to its broker (same host), which read the block for the worker
            assert c.shm.counts["sent"] == 1
            assert c.mmi("show_broker")["counts"].get("shm_materialized") == 1
            # and the result came back as bytes: the worker got no host id of its own in the meta frame
            assert c.shm.counts["received"] == 0
            wait_for(lambda: "shm_sent" in reported(c, "w2"), 10, what="the worker's stats")
            stats = reported(c, "w2")
            assert stats["shm_sent"] == 0 and stats["shm_received"] == 0
        finally:
            c.close()
        assert not [p for p in shm_dir.iterdir() if p.is_file()] and not list(elsewhere.iterdir())
    finally:
        f.stop()


def test_over_the_cap_payloads_go_through_the_sockets(tmp_path: Path, shm_dir: Path) -> None:
    f = make_fabric(tmp_path, shm_dir)
    try:
        f.broker()
        f.worker("w3", env={"ZFAB_SHM_BYTES": str(1024 * 1024)})  # below a 10 MB block
        c = client_of(f, shm_dir, shm_bytes=1024 * 1024)
        try:
            wait_workers(c, {"w3"})
            r = c.run_job("demo", "echo", kwargs={"data": TEN_MB}, timeout=30)
            assert r["w3"]["result"] == TEN_MB
            assert c.shm.counts["sent"] == 0 and c.shm.counts["fallbacks"] == 1 and c.shm.counts["received"] == 0
            wait_for(lambda: reported(c, "w3").get("shm_fallbacks") == 1, 10, what="the worker's fallback counted")
            assert reported(c, "w3")["shm_sent"] == 0
            # A payload that fits goes by shared memory again
            r = c.run_job("demo", "echo", kwargs={"data": "y" * 500_000}, timeout=30)
            assert r["w3"]["result"] == "y" * 500_000 and c.shm.counts["sent"] == 1 and c.shm.counts["received"] == 1
        finally:
            c.close()
    finally:
        f.stop()


def test_a_forged_handle_from_a_peer_is_refused_with_a_clear_error(tmp_path: Path, shm_dir: Path) -> None:
    secret = shm_dir / "secret"
    secret.write_bytes(b"s" * 4096)
    f = make_fabric(tmp_path, shm_dir)
    try:
        f.broker()
        f.worker("w4")
        c = client_of(f, shm_dir)
        try:
            wait_workers(c, {"w4"})
            # A real block, to forge a handle to (its name is guessable: it is in the directory)
            c.run_job("demo", "echo", kwargs={"data": "z" * 400_000}, timeout=30)
            real = next(p.name for p in shm_dir.iterdir() if p.name.startswith("zfab-"))
            host = c.shm.host
        finally:
            c.close()
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(f.endpoint)
        try:
            cases = {
                b"traversal": shmhandle.MARK + nfp.dumps({"shm": "../secret", "len": 10, "tok": "00" * 16}),
                b"token": shmhandle.MARK + nfp.dumps({"shm": real, "len": 10, "tok": "00" * 16}),
                b"bounds": shmhandle.MARK + nfp.dumps({"shm": real, "len": 2 << 20, "tok": "00" * 16}),
                b"claim": shmhandle.MARK + nfp.dumps({"shm": real, "len": 1 << 30, "tok": "00" * 16}),
                b"stale": shmhandle.MARK
                + nfp.dumps({"shm": "zfab-00000000-1-1-0123456789abcdef", "len": 10, "tok": "00" * 16}),
            }
            flags = json.dumps({"push": True, "ack": False, "task": "echo", "host": host}).encode()
            errors = {}
            for case, body in cases.items():
                sock.send_multipart([b"", nfp.CLIENT, nfp.POST, b"demo", b"w4", case, body, flags])
                while True:
                    frames = sock.recv_multipart()
                    # [b"", NFPB01, command, service, uuid, status, payload]
                    if frames[2] == nfp.RESPONSE and frames[4] == case and frames[5] != nfp.ST_DISPATCHED:
                        break
                assert frames[5] == nfp.ST_BAD_REQUEST
                answer = json.loads(frames[6])
                # A handle the broker can judge unread (its name, its claim) is refused there; the rest
                # by the worker that opens the block.
                errors[case] = (answer["errors"] if "target" in answer else answer["w4"]["errors"])[0]
        finally:
            sock.close()
            ctx.term()
        assert "not a zfab block" in errors[b"traversal"]
        assert "wrong token" in errors[b"token"]
        assert "nothing read past the block" in errors[b"bounds"]
        assert "over the message limit (ZFAB_MAX_MESSAGE_BYTES" in errors[b"claim"]
        assert "is gone" in errors[b"stale"]
        assert secret.read_bytes() == b"s" * 4096
    finally:
        f.stop()


def test_a_retried_job_sends_its_block_again_with_its_attempt(tmp_path: Path, shm_dir: Path) -> None:
    f = make_fabric(tmp_path, shm_dir)
    try:
        f.broker()
        f.start("h0", "worker", "--worker", HOLDER, "--name", "h0")
        c = client_of(f, shm_dir)
        try:
            wait_workers(c, {"h0"})
            # A 1 MB body whose task declares retries: the handle is small, so the client keeps it
            r = c.run_job("holder", "second_time", kwargs={"data": "r" * 1_000_000}, timeout=30)
            assert r["h0"]["result"] == 1_000_000 and r["h0"]["attempt"] == 2
            assert c.shm.counts["sent"] == 1 and c.shm.stats()["shm_busy_bytes"] == 0
            wait_for(lambda: reported(c, "h0").get("shm_received") == 2, 10, what="both attempts read the block")
        finally:
            c.close()
    finally:
        f.stop()


def test_a_worker_killed_mid_job_leaves_no_block_once_the_next_zfab_process_looks(
    tmp_path: Path, shm_dir: Path
) -> None:
    f = make_fabric(tmp_path, shm_dir)
    try:
        f.broker()
        f.start("h1", "worker", "--worker", HOLDER, "--name", "h1")
        c = client_of(f, shm_dir)
        try:
            wait_workers(c, {"h1"})
            # Given a worker that holds a block of its own (a result it sent, given back to its pool)
            assert c.run_job("holder", "big", kwargs={"n": 3_000_000}, timeout=30)["h1"]["result"] == "x" * 3_000_000
            # and runs a job whose 10 MB body is a block of the client's
            fut = c.submit("holder", "hold", kwargs={"data": TEN_MB, "seconds": 60}, timeout=60)
            wait_for(lambda: fut.state == "running", 20, what="the job running")
            assert len(blocks(shm_dir)) == 2
            # When the worker is killed
            f.kill("h1")
            with pytest.raises(WorkerLostError):
                fut.result(30)
            # Then the client's block is free again, and the dead worker's is reclaimed by the next
            # zfab process that starts
            f.start("h2", "worker", "--worker", HOLDER, "--name", "h2")
            wait_workers(c, {"h2"})
            wait_for(lambda: len(blocks(shm_dir)) == 1, 10, what="the dead worker's block reclaimed")
            assert c.shm.stats()["shm_busy_bytes"] == 0
        finally:
            c.close()
        assert blocks(shm_dir) == []
    finally:
        f.stop()


def test_the_apis_client_sends_and_reads_large_payloads_by_shared_memory(
    tmp_path: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from inprocess import in_process_api

    monkeypatch.setenv("ZFAB_SHM_DIR", str(shm_dir))  # the in-process API's settings read it
    f = make_fabric(tmp_path, shm_dir)
    data = "a" * 2_000_000

    async def go() -> None:
        async with in_process_api(f) as api:
            r = await api.post("/jobs?wait=20", json={"service": "demo", "task": "echo", "kwargs": {"data": data}})
            assert r.status_code == 200, r.text
            assert next(iter(r.json()["results"].values()))["result"] == data
            # The API holds the result as bytes of its own: a block given back and reused changes nothing
            again = await api.post(
                "/jobs?wait=20", json={"service": "demo", "task": "echo", "kwargs": {"data": "b" * len(data)}}
            )
            assert again.status_code == 200, again.text
            first = await api.get(f"/jobs/{r.json()['uuid']}")
            assert next(iter(first.json()["results"].values()))["result"] == data

    try:
        f.broker()
        f.worker("w5")
        c = client_of(f, shm_dir)
        try:
            wait_workers(c, {"w5"})
            asyncio.run(go())
            # The API's client (on its event loop) sent a handle and got one back
            wait_for(lambda: reported(c, "w5").get("shm_sent") == 2, 10, what="the worker's stats")
            assert reported(c, "w5")["shm_received"] == 2
        finally:
            c.close()
    finally:
        f.stop()
