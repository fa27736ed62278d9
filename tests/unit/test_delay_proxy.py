"""bench/delay.py, the delaying TCP proxy the 1 ms latency benchmark runs through (no netem here):
bytes arrive whole, in order, and never before the delay on each crossing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DELAY_MS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def echo_port() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(10)

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        conn.settimeout(10)
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    srv.close()
    t.join(10)


@pytest.fixture
def proxy(echo_port: int) -> Iterator[int]:
    listen = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "bench.delay", "--ms", str(DELAY_MS), f"{listen}:{echo_port}"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "delay: ready"
        yield listen
    finally:
        proc.terminate()
        proc.wait(10)


def _read(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "the proxy closed the connection"
        got += chunk
    return got


def test_the_proxy_delays_each_crossing_and_keeps_bytes_whole_and_in_order(proxy: int) -> None:
    payload = b"".join(i.to_bytes(4, "big") for i in range(50_000))  # 200 KB: several chunks
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as c:
        t0 = time.monotonic()
        c.sendall(b"ping")
        assert _read(c, 4) == b"ping"
        # out and back through the proxy: at least the delay each way, however quiet the machine
        assert time.monotonic() - t0 >= 2 * DELAY_MS / 1000
        c.sendall(payload)
        assert _read(c, len(payload)) == payload


def test_a_closed_client_closes_the_proxys_connection_to_the_target(proxy: int, echo_port: int) -> None:
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as c:
        c.sendall(b"x")
        assert _read(c, 1) == b"x"
        c.shutdown(socket.SHUT_WR)
        # the echo server sees the end, ends its side, and the proxy passes that back
        assert c.recv(1) == b""
