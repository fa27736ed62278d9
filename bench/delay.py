"""A delaying TCP proxy: every byte reaches the other side `ms` milliseconds after it arrived.

This kernel has no `tc netem`; the proxy stands in for `tc qdisc add dev lo root netem delay 1ms`,
which delays each packet once on its way out, so a round trip over a link gains 2 x `ms`. Each
direction of each connection is one reader that stamps what it read and one writer that holds
it until its stamp + `ms`: order is kept, bytes are never merged across directions, and a slow
peer backs the reader up through the writer's drain (bounded: at most MAX_QUEUED chunks wait).

    python -m bench.delay --ms 1 LISTEN_PORT:TARGET_PORT [LISTEN_PORT:TARGET_PORT ...]

It runs as a process of its own (bench/versus.py starts it), so its CPU is not the measured
process's; it prints "delay: ready" once every listener is bound, and stops on SIGTERM or when
its parent is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import socket
import time

CHUNK = 256 * 1024
MAX_QUEUED = 1024  # chunks in flight per direction before the reader waits


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    more = asyncio.Event()
    room = asyncio.Event()
    room.set()
    done = False

    async def read() -> None:
        nonlocal done
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                held.append((time.monotonic() + delay, data))
                more.set()
                if len(held) >= MAX_QUEUED:
                    room.clear()
                    await room.wait()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            more.set()

    async def write() -> None:
        try:
            while True:
                if not held:
                    if done:
                        break
                    more.clear()
                    await more.wait()
                    continue
                due, data = held[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                held.popleft()
                room.set()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    await asyncio.gather(read(), write())


async def _serve(listen: int, target: int, delay: float) -> asyncio.Server:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            t_reader, t_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            c_writer.close()
            return
        for w in (c_writer, t_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(c_reader, t_writer, delay), _pipe(t_reader, c_writer, delay))

    return await asyncio.start_server(handle, "127.0.0.1", listen)


async def _main(pairs: list[tuple[int, int]], delay: float, parent: int | None) -> None:
    servers = [await _serve(listen, target, delay) for listen, target in pairs]
    print("delay: ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if parent is not None and os.getppid() != parent:
            break
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.delay", description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", type=float, default=1.0, help="one-way delay in milliseconds")
    p.add_argument("--parent", type=int, default=None, help="exit when this parent is gone")
    p.add_argument("pairs", nargs="+", help="LISTEN_PORT:TARGET_PORT on 127.0.0.1")
    ns = p.parse_args(argv)
    pairs = [(int(a), int(b)) for a, b in (x.split(":", 1) for x in ns.pairs)]
    asyncio.run(_main(pairs, ns.ms / 1000.0, ns.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
