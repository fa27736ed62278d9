"""The raw pyzmq floor: what three Python processes on TCP loopback can do at best.

    client DEALER  ->  forwarder (frontend ROUTER | backend ROUTER)  ->  echo DEALER
                   <-                                                <-

The forwarder is the smallest broker-shaped loop there is: one thread, one
``zmq.Poller`` over both ROUTERs, bounded receive batches, identity envelopes
pushed on the way in and popped on the way out, no decoding. Messages are
job-shaped (seven frames, a ~60-byte JSON body), so the zfab benchmarks can be
read as a ratio to this floor.

Run ``python -m bench.floor`` for the figures; ``measure_floor()`` returns them.
The roles run as ``python -m bench.floor forwarder|echo ...`` children.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import zmq

from bench.common import dump_json, free_port, log_path, percentile, report, spawn, stop

__all__ = ["main", "measure_floor"]

ECHO_IDENTITY = b"echo"
READY = b"READY"
BULK = b"BULK"
ACK = b"ACK"
JOB_BODY = b'{"task": "echo", "args": [], "kwargs": {"data": "0123456789ab"}}'
CHUNK_SIZE = 256 * 1024
BULK_CREDIT = 8
BATCH = 256  # messages taken from one socket per poll wake-up
HWM = 100_000
IDLE_POLL_MS = 1000  # children check that their parent is still alive this often
CHILD_IO_TIMEOUT_MS = 1000
CLIENT_IO_TIMEOUT_MS = 10_000
STARTUP_TIMEOUT_S = 20.0
WARMUP = 1000
PROJECT_ROOT = Path(__file__).resolve().parent.parent

Socket = zmq.Socket[bytes]
Context = zmq.Context[Socket]


def _socket(ctx: Context, kind: int, io_timeout_ms: int) -> Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, io_timeout_ms)
    sock.setsockopt(zmq.SNDTIMEO, io_timeout_ms)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    return sock


class _Wire:
    """Multipart send/recv over one socket with the bound methods looked up once.

    Same frames and semantics as ``send_multipart``/``recv_multipart``, but those
    re-validate every frame and re-resolve attributes on every call: on a 2-core VM
    a 7-frame send+recv costs ~36 us through them and ~16 us through this. The
    floor is meant to be the best a careful pure-pyzmq loop can do, so every role
    uses it.
    """

    __slots__ = ("_get", "_recv", "_send")

    def __init__(self, sock: Socket) -> None:
        self._recv = sock.recv
        self._send = sock.send
        self._get = sock.getsockopt

    def recv(self, flags: int = 0) -> list[bytes]:
        """One whole multipart message; ``zmq.Again`` before its first frame only."""
        recv = self._recv
        frames = [recv(flags)]
        while self._get(zmq.RCVMORE):
            frames.append(recv(flags))
        return frames

    def send(self, frames: list[bytes], flags: int = 0, copy_last: bool = True) -> None:
        """One whole multipart message. ZeroMQ accepts a multipart message atomically,
        so ``zmq.Again``/``EHOSTUNREACH`` can only come from the first frame."""
        send = self._send
        more = flags | zmq.SNDMORE
        last = len(frames) - 1
        for i in range(last):
            send(frames[i], more)
        send(frames[last], flags, copy=copy_last)


# -------------------------------------------------------------------- child roles


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _orphaned(parent: int | None) -> bool:
    return parent is not None and os.getppid() != parent


def run_forwarder(frontend_port: int, backend_port: int, parent: int | None = None) -> None:
    """The minimal broker: clients on the frontend ROUTER, one echo peer on the backend."""
    ctx: Context = zmq.Context()
    frontend = _socket(ctx, zmq.ROUTER, CHILD_IO_TIMEOUT_MS)
    backend = _socket(ctx, zmq.ROUTER, CHILD_IO_TIMEOUT_MS)
    forwarded = dropped = 0
    try:
        for sock in (frontend, backend):
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        frontend.bind(f"tcp://127.0.0.1:{frontend_port}")
        backend.bind(f"tcp://127.0.0.1:{backend_port}")
        front, back = _Wire(frontend), _Wire(backend)
        poller = zmq.Poller()
        poller.register(frontend, zmq.POLLIN)
        poller.register(backend, zmq.POLLIN)
        print(f"forwarder: frontend {frontend_port}, backend {backend_port}", flush=True)
        echo_id: bytes | None = None
        while True:
            ready = dict(poller.poll(IDLE_POLL_MS))
            if not ready:
                if _orphaned(parent):
                    print("forwarder: parent gone, exiting", flush=True)
                    return
                continue
            if frontend in ready:
                for _ in range(BATCH):
                    try:
                        # [client_id, b"", *job] -> [echo_id, client_id, b"", *job]
                        frames = front.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if echo_id is None:
                        dropped += 1
                        continue
                    frames.insert(0, echo_id)
                    if _send(back, frames):
                        forwarded += 1
                    else:
                        dropped += 1
            if backend in ready:
                for _ in range(BATCH):
                    try:
                        # [echo_id, client_id, b"", *reply] -> [client_id, b"", *reply]
                        frames = back.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 3 and frames[1] == b"" and frames[2] == READY:
                        echo_id = frames[0]
                        print(f"forwarder: echo peer {echo_id!r} ready", flush=True)
                        continue
                    if len(frames) < 2 or not _send(front, frames[1:]):
                        dropped += 1
                    else:
                        forwarded += 1
    finally:
        print(f"forwarder: forwarded {forwarded}, dropped {dropped}", flush=True)
        ctx.destroy(linger=0)


def _send(wire: _Wire, frames: list[bytes]) -> bool:
    try:
        wire.send(frames)
    except zmq.Again:  # peer's queue full past SNDTIMEO
        return False
    except zmq.ZMQError as exc:  # EHOSTUNREACH: no such peer (ROUTER_MANDATORY)
        if exc.errno == zmq.EHOSTUNREACH:
            return False
        raise
    return True


def run_echo(backend_port: int, parent: int | None = None) -> None:
    """The echo peer: sends every job straight back; answers bulk chunks with an ACK."""
    ctx: Context = zmq.Context()
    sock = _socket(ctx, zmq.DEALER, CHILD_IO_TIMEOUT_MS)
    echoed = acked = 0
    try:
        sock.setsockopt(zmq.IDENTITY, ECHO_IDENTITY)
        sock.connect(f"tcp://127.0.0.1:{backend_port}")
        wire = _Wire(sock)
        wire.send([b"", READY])
        print(f"echo: connected to {backend_port}", flush=True)
        while True:
            if not sock.poll(IDLE_POLL_MS, zmq.POLLIN):
                if _orphaned(parent):
                    print("echo: parent gone, exiting", flush=True)
                    return
                continue
            for _ in range(BATCH):
                try:
                    # [client_id, b"", kind, ...]
                    frames = wire.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frames) >= 4 and frames[2] == BULK:
                    wire.send([frames[0], b"", ACK, frames[3]])
                    acked += 1
                else:
                    wire.send(frames)
                    echoed += 1
    finally:
        print(f"echo: echoed {echoed}, acked {acked}", flush=True)
        ctx.destroy(linger=0)


# ------------------------------------------------------------------------- client


class _Client:
    """The measuring side: one DEALER, used only by the calling thread."""

    def __init__(self, ctx: Context, port: int) -> None:
        self.sock = _socket(ctx, zmq.DEALER, CLIENT_IO_TIMEOUT_MS)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.wire = _Wire(self.sock)
        self._seq = 0
        # client->broker shape: [b"", NFPC01, POST, service, target, uuid, body]
        self._job = [b"", b"NFPC01", b"0x04", b"floor", b"any", b"", JOB_BODY]

    def close(self) -> None:
        self.sock.close(linger=0)

    def _next_job(self) -> list[bytes]:
        self._seq += 1
        job = self._job.copy()
        job[5] = b"%032x" % self._seq
        return job

    def await_path(self, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
        """Probe until a job makes the full round trip, then drop any late replies."""
        deadline = time.monotonic() + timeout
        while True:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}{_log_tail(proc)}")
            if time.monotonic() > deadline:
                tails = "".join(_log_tail(proc) for proc in procs)
                raise RuntimeError(f"no round trip through the forwarder within {timeout:.0f}s{tails}")
            # Probes sent before the echo peer registered are dropped by the forwarder;
            # any probe coming back proves the path.
            self.wire.send(self._next_job())
            if self.sock.poll(100, zmq.POLLIN):
                self.wire.recv()
                break
        while self.sock.poll(200, zmq.POLLIN):
            self.wire.recv()

    def sequential(self, n: int) -> tuple[list[float], float]:
        """``n`` one-at-a-time round trips: per-trip latencies in ms, and total seconds."""
        latencies: list[float] = []
        send, recv, clock = self.wire.send, self.wire.recv, time.perf_counter_ns
        started = time.perf_counter()
        for _ in range(n):
            job = self._next_job()
            t0 = clock()
            send(job)
            while True:
                reply = recv()
                if len(reply) == 7 and reply[5] == job[5]:
                    break
            latencies.append((clock() - t0) / 1e6)
        return latencies, time.perf_counter() - started

    def pipelined(self, n: int, window: int) -> float:
        """``n`` round trips with up to ``window`` in flight; seconds taken."""
        if window < 1:
            raise ValueError("window must be at least 1")
        wire = self.wire
        sent = received = 0
        started = time.perf_counter()
        while received < n:
            while sent < n and sent - received < window:
                wire.send(self._next_job())
                sent += 1
            reply = wire.recv()  # blocks up to RCVTIMEO, then zmq.Again
            while True:
                if len(reply) != 7:
                    raise RuntimeError(f"unexpected reply of {len(reply)} frames")
                received += 1
                if received == sent:
                    break
                try:
                    reply = wire.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
        return time.perf_counter() - started

    def bulk(self, total_bytes: int, chunk_size: int = CHUNK_SIZE, credit: int = BULK_CREDIT) -> float:
        """Send ``total_bytes`` in ``chunk_size`` chunks with ``credit`` chunks unacknowledged
        at most; seconds until the last acknowledgement."""
        chunks = max(1, total_bytes // chunk_size)
        payload = os.urandom(chunk_size)
        wire = self.wire
        sent = acked = 0
        started = time.perf_counter()
        while acked < chunks:
            while sent < chunks and sent - acked < credit:
                wire.send([b"", BULK, sent.to_bytes(8, "big"), payload], copy_last=False)
                sent += 1
            reply = wire.recv()
            if len(reply) != 3 or reply[1] != ACK or int.from_bytes(reply[2], "big") != acked:
                raise RuntimeError(f"unexpected bulk acknowledgement {reply[:3]!r}")
            acked += 1
        return time.perf_counter() - started


def _log_tail(proc: subprocess.Popen[bytes], lines: int = 20) -> str:
    path = log_path(proc)
    if path is None or not path.exists():
        return ""
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- {path} ---\n" + "\n".join(tail)


def _child_env() -> dict[str, str]:
    paths = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


def _two_ports() -> tuple[int, int]:
    first = free_port()
    second = free_port()
    while second == first:
        second = free_port()
    return first, second


def measure_floor(
    seq_n: int = 5000, pipe_n: int = 50000, window: int = 1000, bulk_mib: int = 64, trials: int = 3
) -> dict[str, float]:
    """Start the forwarder and echo children, measure from this process, stop them.

    Returns ``seq_p50_ms``, ``seq_p99_ms``, ``seq_rps`` (one run of ``seq_n``
    sequential round trips), ``pipe_mps`` (pipelined round trips per second) and
    ``bulk_mbps`` (10**6 bytes/s); those last two are the median of ``trials`` runs,
    because a small VM's scheduler noise moves single runs by tens of percent.
    """
    if min(seq_n, pipe_n, window, bulk_mib, trials) < 1:
        raise ValueError("every count must be at least 1")
    frontend_port, backend_port = _two_ports()
    parent = str(os.getpid())
    role = [sys.executable, "-m", "bench.floor"]
    env = _child_env()
    total_bytes = max(1, bulk_mib * 1024 * 1024 // CHUNK_SIZE) * CHUNK_SIZE
    procs: list[subprocess.Popen[bytes]] = []
    ctx: Context = zmq.Context()
    try:
        ports = ["--frontend", str(frontend_port), "--backend", str(backend_port)]
        procs.append(spawn([*role, "forwarder", *ports, "--parent", parent], env=env))
        procs.append(spawn([*role, "echo", *ports[2:], "--parent", parent], env=env))
        client = _Client(ctx, frontend_port)
        try:
            client.await_path(procs, STARTUP_TIMEOUT_S)
            client.sequential(WARMUP)
            client.pipelined(WARMUP * 5, window)
            latencies, seq_seconds = client.sequential(seq_n)
            pipe_seconds = [client.pipelined(pipe_n, window) for _ in range(trials)]
            client.bulk(min(total_bytes, 4 * 1024 * 1024))  # warm-up
            bulk_seconds = [client.bulk(total_bytes) for _ in range(trials)]
        except zmq.Again as exc:
            tails = "".join(_log_tail(proc) for proc in procs)
            raise RuntimeError(f"no reply within {CLIENT_IO_TIMEOUT_MS / 1000:.0f}s{tails}") from exc
        finally:
            client.close()
    finally:
        try:
            stop(procs)
        finally:
            ctx.destroy(linger=0)  # closes any socket an error left open; term() would wait on it
    return {
        "seq_p50_ms": percentile(latencies, 50),
        "seq_p99_ms": percentile(latencies, 99),
        "seq_rps": seq_n / seq_seconds,
        "pipe_mps": pipe_n / statistics.median(pipe_seconds),
        "bulk_mbps": total_bytes / statistics.median(bulk_seconds) / 1e6,
    }


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.floor", description="Raw pyzmq round-trip floor on TCP loopback."
    )
    parser.add_argument("--seq-n", type=int, default=5000, help="sequential round trips")
    parser.add_argument("--pipe-n", type=int, default=50000, help="pipelined round trips")
    parser.add_argument("--window", type=int, default=1000, help="pipelined messages in flight")
    parser.add_argument("--bulk-mib", type=int, default=64, help="bulk transfer size in MiB")
    parser.add_argument("--trials", type=int, default=3, help="pipelined and bulk runs (median reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    roles = parser.add_subparsers(dest="role")
    forwarder = roles.add_parser("forwarder", help="run the ROUTER/ROUTER forwarder (a child)")
    forwarder.add_argument("--frontend", type=int, required=True)
    forwarder.add_argument("--backend", type=int, required=True)
    forwarder.add_argument("--parent", type=int, default=None, help="exit when this parent is gone")
    echo = roles.add_parser("echo", help="run the echo DEALER (a child)")
    echo.add_argument("--backend", type=int, required=True)
    echo.add_argument("--parent", type=int, default=None, help="exit when this parent is gone")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.role in ("forwarder", "echo"):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        if args.role == "forwarder":
            run_forwarder(args.frontend, args.backend, args.parent)
        else:
            run_echo(args.backend, args.parent)
        return 0
    print(
        f"raw pyzmq floor: client DEALER -> ROUTER/ROUTER forwarder -> echo DEALER, TCP loopback, "
        f"{os.cpu_count()} CPUs, pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()}",
        flush=True,
    )
    figures = measure_floor(args.seq_n, args.pipe_n, args.window, args.bulk_mib, args.trials)
    report("sequential p50", figures["seq_p50_ms"], "ms", higher_is_better=False)
    report("sequential p99", figures["seq_p99_ms"], "ms", higher_is_better=False)
    report("sequential round trips/s", figures["seq_rps"], "/s")
    report(f"pipelined msgs/s (w={args.window})", figures["pipe_mps"], "/s")
    report(f"bulk {args.bulk_mib} MiB (256 KiB x{BULK_CREDIT})", figures["bulk_mbps"], "MB/s")
    if args.json:
        dump_json(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
