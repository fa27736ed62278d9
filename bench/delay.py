"""A delaying TCP proxy: every byte reaches the other side `ms` milliseconds after it arrived.

This kernel has no `tc netem`; the proxy stands in for `tc qdisc add dev lo root netem delay 1ms`,
which delays each packet once on its way out, so a round trip over a link gains 2 x `ms`. Each
direction of each connection is one reader thread that stamps what it read and one writer thread
that holds it until its stamp + `ms`: order is kept, bytes are never merged across directions, and
a slow peer backs the reader up (at most MAX_QUEUED chunks wait per direction). Threads, not
asyncio: an event loop's timers wait in whole milliseconds (epoll), which made a 1 ms delay 1-2 ms;
`time.sleep` holds it to tens of microseconds.

    python -m bench.delay --ms 1 LISTEN_PORT:TARGET_PORT [LISTEN_PORT:TARGET_PORT ...]

It runs as a process of its own (bench/versus.py starts it), so its CPU is not the measured
process's; it prints "delay: ready" once every listener is bound, and stops on SIGTERM or when
its parent is gone.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import socket
import threading
import time

CHUNK = 256 * 1024
MAX_QUEUED = 1024  # chunks in flight per direction before the reader waits
ACCEPT_POLL_S = 1.0  # how often the listeners look for a gone parent or a stop


def _direction(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """src -> dst, each chunk held until `delay` after it was read; dst is shut for writing at src's end."""
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    cond = threading.Condition()
    done = False

    def write() -> None:
        try:
            while True:
                with cond:
                    while not held and not done:
                        cond.wait()
                    if not held:
                        break
                    due, data = held[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                with cond:
                    held.popleft()
                    cond.notify_all()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            with cond:
                while len(held) >= MAX_QUEUED:
                    cond.wait()
                held.append((time.monotonic() + delay, data))
                cond.notify_all()
    except OSError:
        pass
    finally:
        with cond:
            done = True
            cond.notify_all()
    writer.join()


def _connection(client: socket.socket, target: int, delay: float) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", target), timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_direction, args=(upstream, client, delay), daemon=True)
    back.start()
    _direction(client, upstream, delay)
    back.join()
    client.close()
    upstream.close()


def _listen(listen: int, target: int, delay: float, stop: threading.Event) -> socket.socket:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen))
    srv.listen(64)
    srv.settimeout(ACCEPT_POLL_S)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=_connection, args=(client, target, delay), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.delay", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--ms", type=float, default=1.0, help="one-way delay in milliseconds")
    p.add_argument("--parent", type=int, default=None, help="exit when this parent is gone")
    p.add_argument("pairs", nargs="+", help="LISTEN_PORT:TARGET_PORT on 127.0.0.1")
    ns = p.parse_args(argv)
    pairs = [(int(a), int(b)) for a, b in (x.split(":", 1) for x in ns.pairs)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    servers = [_listen(listen, target, ns.ms / 1000.0, stop) for listen, target in pairs]
    print("delay: ready", flush=True)
    while not stop.wait(ACCEPT_POLL_S):
        if ns.parent is not None and os.getppid() != ns.parent:
            break
    for srv in servers:
        srv.close()
    return 0  # daemon threads end with the process


if __name__ == "__main__":
    raise SystemExit(main())
