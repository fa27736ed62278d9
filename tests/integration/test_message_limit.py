"""The message limit with real processes: a payload over ZFAB_MAX_MESSAGE_BYTES fails at once naming the
limit (by the client before sending, whatever tier would carry it), and a peer whose own limit is larger
is answered by the broker, not disconnected."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq
from fabric import fabric, wait_for, wait_workers

from zfab import Client, PayloadTooLargeError, Settings
from zfab.core import protocol as nfp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MIB = 1024 * 1024
LIMIT = 4 * MIB


def test_a_payload_over_the_limit_fails_in_well_under_two_seconds_naming_the_limit(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_MAX_MESSAGE_BYTES"] = str(LIMIT)
        f.broker()
        f.worker("w1")
        for own in (LIMIT, 64 * MIB):  # the client's own limit, or a larger one: then the broker's counts
            s = Settings(broker=f.endpoint, max_message_bytes=own, keepalive_interval=0.3, keepalive_multiplier=3)
            with Client(settings=s, name="big").start() as c:
                wait_workers(c, {"w1"})
                assert c.run_job("demo", "echo", kwargs={"data": "warm"}, timeout=10)["w1"]["result"] == "warm"
                t = time.monotonic()
                with pytest.raises(PayloadTooLargeError) as exc:
                    c.run_job("demo", "echo", kwargs={"data": "x" * (6 * MIB)}, timeout=8)
                took = time.monotonic() - t
                assert took < 2.0 and "ZFAB_MAX_MESSAGE_BYTES = 4194304 bytes" in str(exc.value), (took, exc.value)
                # the fabric is unharmed: the next job runs
                assert c.run_job("demo", "echo", kwargs={"data": "after"}, timeout=10)["w1"]["result"] == "after"


def test_the_broker_answers_a_peer_that_sends_over_its_limit_instead_of_dropping_its_connection(
    tmp_path: Path,
) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_MAX_MESSAGE_BYTES"] = str(LIMIT)
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)  # a peer that does not check (a NorFab client, another limit)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.setsockopt(zmq.SNDTIMEO, 5000)
            try:
                sock.connect(f.endpoint)
                body = nfp.dumps({"task": "echo", "args": [], "kwargs": {"data": "x" * (5 * MIB)}})
                sock.send_multipart([b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"big-1", body])
                answer = sock.recv_multipart()
                payload = json.loads(answer[6])
                assert answer[5] == nfp.ST_BAD_REQUEST and payload["status"] == "TOO LARGE"
                assert "ZFAB_MAX_MESSAGE_BYTES = 4194304" in payload["errors"][0]
                # the same connection still works: it was answered, not cut off
                small = nfp.dumps({"task": "echo", "args": [], "kwargs": {"data": "small"}})
                sock.send_multipart([b"", nfp.CLIENT, nfp.POST, b"demo", b"any", b"small-1", small])
                statuses = set()
                deadline = time.monotonic() + 10
                while nfp.ST_OK not in statuses and time.monotonic() < deadline:
                    statuses.add(sock.recv_multipart()[5])
                assert nfp.ST_DISPATCHED in statuses or nfp.ST_OK in statuses
            finally:
                sock.close()
                ctx.term()
            wait_for(lambda: c.mmi("show_broker")["frames_rejected"].get("oversize", 0) >= 1, 5, what="counted")
