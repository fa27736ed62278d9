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


@pytest.mark.parametrize("handover", [True, False])
def test_a_norfab_workers_reconnect_under_its_name_is_registered_at_once_with_handover(
    tmp_path: Path, handover: bool
) -> None:
    """With ZFAB_BROKER_HANDOVER the new connection takes the route; without it (the default, where
    no live identity can be taken over) the new connection's READY is lost, as the docs say."""
    with fabric(tmp_path, interval=0.5, multiplier=6) as f:
        f.env["ZFAB_BROKER_HANDOVER"] = "true" if handover else "false"
        f.broker()
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            _norfab_worker(ctx, f.endpoint, b"nf-worker-1")  # the first connection, left open
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
                reached = False
                for i in range(20 if handover else 3):  # the job reaches the new connection
                    uuid = f"j{i}".encode()
                    client.send_multipart([b"", nfp.CLIENT, nfp.POST, b"nfsvc", b"nf-worker-1", uuid, body])
                    if _wait_post(new, uuid, timeout=1):
                        reached = True
                        break
                assert reached is handover, "with handover the reconnected worker gets jobs; without, its READY is lost"
        finally:
            ctx.destroy(linger=0)
