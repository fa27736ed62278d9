"""A NorFab worker reconnects under its own name (its identity) while its old connection is still
open at the broker: its READY must not be lost (issue 44, D1). Raw DEALERs play the NorFab worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zmq
from fabric import fabric, wait_for

from zfab.core import protocol as nfp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _norfab_worker(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, name: bytes) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, name)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 200)
    sock.connect(endpoint)
    sock.send_multipart([b"", nfp.WORKER, nfp.READY, b"nfsvc"])
    return sock


def _wait_post(sock: zmq.Socket[bytes], uuid: bytes, timeout: float = 10) -> bool:
    """True once the broker sent this socket the job's POST."""
    seen: list[bool] = []

    def got() -> bool:
        try:
            frames = sock.recv_multipart()
        except zmq.Again:
            return False
        # [b"", NFPB01, command, ...]: a job is [.., POST, client, b"", uuid, body]
        if frames[2] == nfp.KEEPALIVE:
            sock.send_multipart([b"", nfp.WORKER, nfp.KEEPALIVE, b"nfsvc"])
        seen.append(frames[2] == nfp.POST and frames[5] == uuid)
        return seen[-1]

    try:
        wait_for(got, timeout, what="the job's POST")
    except AssertionError:
        return False
    return True


def test_a_norfab_workers_reconnect_under_its_name_is_registered_at_once(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.5, multiplier=6) as f:
        f.broker()
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            old = _norfab_worker(ctx, f.endpoint, b"nf-worker-1")
            with f.client("probe") as c:
                wait_for(
                    lambda: any(w["name"] == "nf-worker-1" for w in c.mmi("show_workers", timeout=2)),
                    20,
                    what="the first connection registered",
                )
                # NorFab reconnects with a new socket under the same identity, before the broker saw
                # the old connection go (here: it is still open).
                new = _norfab_worker(ctx, f.endpoint, b"nf-worker-1")
                client = ctx.socket(zmq.DEALER)
                client.setsockopt(zmq.LINGER, 0)
                client.connect(f.endpoint)
                body = json.dumps({"task": "echo", "args": [], "kwargs": {}}).encode()
                for i in range(20):  # the job reaches the new connection, not the old one
                    uuid = f"j{i}".encode()
                    client.send_multipart([b"", nfp.CLIENT, nfp.POST, b"nfsvc", b"nf-worker-1", uuid, body])
                    if _wait_post(new, uuid, timeout=1):
                        break
                else:
                    pytest.fail("the reconnected NorFab worker never got a job: its READY was lost")
        finally:
            ctx.destroy(linger=0)
