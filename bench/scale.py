"""1,000 workers on one broker: idle CPU, dispatch latency and MMI with a fleet connected.

A harness of DEALER peers speaking the zfab worker protocol (docs/protocol.md), a few
processes of a few hundred sockets each, every process one single-threaded poll loop:

    READY      [b"", NFPW01, 0x01, service, {"v": 2, "name", "credits", "tasks": {"echo": {}}}]
    KEEPALIVE  [b"", NFPW01, 0x02, service, stats]   as a zfab worker sends it: in answer to the
               broker's keepalive when its own is due within half an interval, else on its own
               clock of 1.2 intervals (staggered at start); --own-clock: on a clock of one
               interval only, as NorFab's workers do
    POST  ->   [b"", NFPW01, 0x05, client, b"", uuid, b"200", {name: result entry}]   (an echo)

against a real `zfab broker` process. Measured with 1 peer and with 1,000 (the baseline is the
one-worker broker, started the same way in the same run):

- broker CPU over a window with every peer connected and keepalives flowing (% of one core,
  from /proc/PID/stat), and its RSS;
- dispatch p50/p99 through the broker: a zfab Client running sequential echo jobs (target any);
- pipelined echo jobs/s from one client (window 200), for scale;
- MMI show_workers answer time (and size) with the whole fleet listed;
- the keepalive floor: the CPU a bare pyzmq ROUTER (run_router) spends on the same fleet's
  keepalives, receiving each and sending one back per interval, and nothing else;
- (full run) the broker's CPU with the fleet keeping alive on clocks of its own (--own-clock),
  as workers that do not answer the broker's wave do.

    python -m bench.scale [--quick] [--workers 1000] [--procs 4]
    python -m bench.scale peers ...   (a child: the peer harness)
    python -m bench.scale router ...  (a child: the bare ROUTER of the keepalive floor)
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import select
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import zmq

from bench.common import cpu_seconds, free_port, percentile, pipelined, report, stop, wait_for
from bench.harness import Fabric, log_tail, rss_bytes, wait_mmi_workers

SERVICE = "scale"
HEADER_W = b"NFPW01"
READY, KEEPALIVE, DISCONNECT, POST, RESPONSE = b"0x01", b"0x02", b"0x03", b"0x04", b"0x05"
GET, DELETE, PUT = b"0x06", b"0x07", b"0x10"


# ------------------------------------------------------------------ the peer harness


class _Peer:
    __slots__ = ("announce", "index", "jobs", "name", "next_ka", "sock")

    def __init__(self, index: int, name: str, sock: zmq.Socket[bytes], next_ka: float, credits: int) -> None:
        self.index = index  # in the peers list, as the keepalive heap names it
        self.name = name
        self.sock = sock
        self.next_ka = next_ka
        self.jobs = 0
        self.announce = json.dumps({"v": 2, "name": name, "credits": credits, "tasks": {"echo": {}}}).encode()


def _sigterm_flag() -> list[bool]:
    """A flag that SIGTERM sets; a child's loop looks at it every turn and ends cleanly."""
    flag = [False]

    def on_term(signum: int, frame: FrameType | None) -> None:
        flag[0] = True

    signal.signal(signal.SIGTERM, on_term)
    return flag


def run_peers(
    endpoint: str,
    count: int,
    prefix: str,
    interval: float,
    credits: int,
    own_clock: bool,
    max_seconds: float,
    parent: int | None,
    use_poller: bool = False,
) -> None:
    """``count`` DEALER peers in one thread until SIGTERM, the parent's exit or ``max_seconds``."""
    stopping = _sigterm_flag()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, count + 64)
    peers: list[_Peer] = []
    service = SERVICE.encode()
    started = time.monotonic()
    counts = {"posts": 0, "keepalives_rx": 0, "keepalives_tx": 0, "disconnects": 0, "other": 0}
    try:
        for i in range(count):
            name = f"{prefix}-{i:04d}"
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 500)
            sock.setsockopt(zmq.IDENTITY, f"{name}~{os.urandom(4).hex()}".encode())
            sock.setsockopt(zmq.SNDHWM, 10_000)
            sock.setsockopt(zmq.RCVHWM, 10_000)
            sock.connect(endpoint)
            peer = _Peer(i, name, sock, started + random.uniform(0, interval), credits)
            peers.append(peer)
        for p in peers:
            p.sock.send_multipart([b"", HEADER_W, READY, service, p.announce])
        print(f"peers {prefix}: {count} connected to {endpoint}", flush=True)
        # zmq_poll asks every socket for its events on each call: 277 us with 250 sockets and
        # 1.1 ms with 1,000 on this machine, twice per job (before the sleep and after the wake),
        # which the harness would add to every dispatch it answers. epoll on each socket's
        # ZMQ_FD costs per ready socket instead. That fd only says "look at ZMQ_EVENTS", and a
        # send may take the signal of a message that arrived meanwhile, so a socket is drained
        # after every send too (the pattern zmq_getsockopt(3) documents for ZMQ_FD).
        wait = _zmq_poll_waiter(peers) if use_poller else _epoll_waiter(peers)
        # Keepalives due are kept in a heap: a wake-up costs O(log n), not a scan of every peer.
        # An answer moves a peer's next one later; its old entry is skipped when it comes up.
        due = [(p.next_ka, i) for i, p in enumerate(peers)]
        heapq.heapify(due)

        def answer(p: _Peer) -> None:
            """service/core/keepalive.py's rule: answer when ours is due within half an interval;
            our own clock runs 1.2 intervals, so a peer out of phase drifts into the wave."""
            now = time.monotonic()
            if own_clock or now + interval * 0.5 < p.next_ka:
                return
            p.sock.send_multipart([b"", HEADER_W, KEEPALIVE, service, _stats(p)])
            counts["keepalives_tx"] += 1
            p.next_ka = now + interval * 1.2
            heapq.heappush(due, (p.next_ka, p.index))

        ready: list[_Peer] = list(peers)
        while not stopping[0]:
            now = time.monotonic()
            if now - started > max_seconds:
                print(f"peers {prefix}: max {max_seconds:.0f} s reached", flush=True)
                break
            if parent is not None and os.getppid() != parent:
                print(f"peers {prefix}: parent gone", flush=True)
                break
            while due and due[0][0] <= now:
                at, i = heapq.heappop(due)
                p = peers[i]
                if at != p.next_ka:
                    continue  # moved by an answer
                p.sock.send_multipart([b"", HEADER_W, KEEPALIVE, service, _stats(p)])
                counts["keepalives_tx"] += 1
                p.next_ka = now + interval * (1.0 if own_clock else 1.2)
                heapq.heappush(due, (p.next_ka, i))
                ready.append(p)
            # A socket left with messages after its batch is taken again next turn, at once.
            ready = [p for p in ready if _drain(p, service, counts, answer)]
            next_due = min(due[0][0] if due else now + 1.0, now + 1.0)
            timeout_ms = 0 if ready else max(0, int((next_due - time.monotonic()) * 1000) + 1)
            ready += wait(timeout_ms)
    finally:
        for p in peers:
            try:
                p.sock.send_multipart([b"", HEADER_W, DISCONNECT, service], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        print(f"peers {prefix}: {counts}", flush=True)
        for p in peers:
            p.sock.close(linger=200)
        ctx.term()


def _epoll_waiter(peers: list[_Peer]) -> Callable[[int], list[_Peer]]:
    ep = select.epoll()
    by_fd: dict[int, _Peer] = {}
    for p in peers:
        fd = p.sock.getsockopt(zmq.FD)
        by_fd[fd] = p
        ep.register(fd, select.EPOLLIN)
    return lambda timeout_ms: [by_fd[fd] for fd, _ in ep.poll(timeout_ms / 1000)]


def _zmq_poll_waiter(peers: list[_Peer]) -> Callable[[int], list[_Peer]]:
    poller = zmq.Poller()
    by_sock: dict[zmq.Socket[bytes], _Peer] = {}
    for p in peers:
        poller.register(p.sock, zmq.POLLIN)
        by_sock[p.sock] = p
    return lambda timeout_ms: [by_sock[sock] for sock, _ in poller.poll(timeout_ms)]


def _stats(p: _Peer) -> bytes:
    return b'{"job_queue_depth":0,"jobs_running":0,"jobs_completed":%d}' % p.jobs


def _drain(p: _Peer, service: bytes, counts: dict[str, int], answer_ka: Callable[[_Peer], None]) -> bool:
    """A bounded batch of what the socket holds; True when more is left. ZMQ_EVENTS is asked
    before each message, so what arrived during _handle's own sends is not missed."""
    sock = p.sock
    for _ in range(64):
        if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return False
        _handle(p, sock.recv_multipart(zmq.NOBLOCK), service, counts, answer_ka)
    return bool(sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)


def _handle(
    p: _Peer, frames: list[bytes], service: bytes, counts: dict[str, int], answer_ka: Callable[[_Peer], None]
) -> None:
    # broker -> worker, as a DEALER sees it: [b"", NFPB01, CMD, ...]
    if len(frames) < 3:
        counts["other"] += 1
        return
    cmd = frames[2]
    if cmd == KEEPALIVE:
        counts["keepalives_rx"] += 1
        answer_ka(p)
        return
    if cmd == DISCONNECT:
        counts["disconnects"] += 1
        p.sock.send_multipart([b"", HEADER_W, READY, service, p.announce])
        return
    if cmd in (POST, GET, DELETE, PUT) and len(frames) >= 7:
        client, uuid, body = frames[3], frames[5], frames[6]
        data: Any = None
        if cmd == POST:
            counts["posts"] += 1
            p.jobs += 1
            try:
                data = json.loads(body).get("kwargs", {}).get("data")
            except (ValueError, AttributeError):
                data = None
        uid = uuid.decode(errors="replace")
        now = time.time()
        entry = {
            p.name: {
                "result": data,
                "failed": False,
                "errors": [],
                "messages": [],
                "juuid": uid.split("~")[0],
                "task": f"{p.name}:echo",
                "status": "completed",
                "resources": [],
                "resources_failed": [],
                "task_started": "",
                "task_completed": "",
                "service": SERVICE,
                "worker": p.name,
                "timestamps": {"received": now, "started": now, "completed": now},
            }
        }
        p.sock.send_multipart([b"", HEADER_W, RESPONSE, client, b"", uuid, b"200", json.dumps(entry).encode()])
        return
    counts["other"] += 1


# ---------------------------------------------------------------- the keepalive floor


def run_router(endpoint: str, interval: float, status: str, max_seconds: float, parent: int | None) -> None:
    """A bare pyzmq ROUTER carrying the same keepalive traffic as the broker: a peer is known from
    its READY, each KEEPALIVE is received and timestamped, and one KEEPALIVE goes back to every
    peer per interval (in waves, like the broker's tend_workers). No parsing, no state beyond
    that: what any Python broker on this machine must spend on 1,000 peers before it does a thing.
    The number of peers it knows is written to ``status`` as it changes."""
    stopping = _sigterm_flag()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    sock.bind(endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    heard: dict[bytes, float] = {}
    due: list[tuple[float, bytes]] = []
    started = time.monotonic()
    known = -1
    try:
        while not stopping[0] and time.monotonic() - started < max_seconds:
            if parent is not None and os.getppid() != parent:
                break
            now = time.monotonic()
            while due and due[0][0] <= now + interval / 2:
                _, ident = heapq.heappop(due)
                sock.send_multipart([ident, b"", b"NFPB01", KEEPALIVE, SERVICE.encode()], zmq.NOBLOCK)
                heapq.heappush(due, (now + interval, ident))
            if known != len(heard):
                known = len(heard)
                with open(status, "w") as f:
                    f.write(str(known))
            timeout = max(0.0, (due[0][0] - interval / 2 - time.monotonic())) if due else 1.0
            if not poller.poll(int(min(timeout, 10.0) * 1000) + 1):  # no tick: its wake-ups are the traffic
                continue
            # ZMQ_EVENTS before each message, not an Again at the end of each batch: pyzmq builds
            # that exception and its errno enum, the broker's trick too (transport/loop.py).
            for _ in range(256):
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    break
                frames = sock.recv_multipart(zmq.NOBLOCK)
                ident = frames[0]
                if ident not in heard and len(frames) > 3 and frames[3] == READY:
                    heapq.heappush(due, (time.monotonic() + interval, ident))
                heard[ident] = time.monotonic()
    finally:
        sock.close(0)
        ctx.term()


def _split(n_workers: int, n_procs: int) -> list[int]:
    """Peers per harness process: as even as they go, no empty process."""
    per = [n_workers // n_procs + (1 if i < n_workers % n_procs else 0) for i in range(n_procs)]
    return [k for k in per if k > 0]


def _router_floor(tmp: str, n_workers: int, n_procs: int, idle_s: float) -> dict[str, float]:
    """CPU of run_router with the same fleet of peers, over the same idle window as the broker's."""
    out: dict[str, float] = {}
    with Fabric(tmp) as fab:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        status = os.path.join(tmp, "router.status")
        router = fab.spawn(
            [
                sys.executable,
                "-m",
                "bench.scale",
                "router",
                "--endpoint",
                endpoint,
                "--status",
                status,
                "--parent",
                str(os.getpid()),
                "--max-seconds",
                "600",
            ]
        )
        peers = []
        try:
            if not wait_for(lambda: os.path.exists(status), 30):
                raise RuntimeError("the bare router did not start" + log_tail([router]))
            for i, k in enumerate(_split(n_workers, n_procs)):
                peers.append(
                    fab.spawn(
                        [
                            sys.executable,
                            "-m",
                            "bench.scale",
                            "peers",
                            "--endpoint",
                            endpoint,
                            "--count",
                            str(k),
                            "--prefix",
                            f"f{i}",
                            "--parent",
                            str(os.getpid()),
                            "--max-seconds",
                            "600",
                        ]
                    )
                )

            def registered() -> bool:
                with open(status) as f:
                    return f.read().strip() == str(n_workers)

            if not wait_for(registered, 60 + n_workers / 20, 0.2):
                raise RuntimeError("peers did not all reach the bare router" + log_tail([router, *peers]))
            time.sleep(min(3.0, idle_s))  # every peer's first keepalive round, as for the broker
            r0, t0 = cpu_seconds(router.pid), time.monotonic()
            time.sleep(idle_s)
            out["router_cpu_pct"] = 100 * (cpu_seconds(router.pid) - r0) / (time.monotonic() - t0)
        finally:
            stop(peers)
    return out


# ------------------------------------------------------------------------ measuring


def _sequential(c: Any, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t = time.perf_counter()
        c.run_job(SERVICE, "echo", kwargs={"data": i}, timeout=10)
        lat.append(time.perf_counter() - t)
    return lat


def _fleet(
    tmp: str,
    n_workers: int,
    n_procs: int,
    quick: bool,
    own_clock: bool,
    zmq_poll: bool = False,
) -> dict[str, float]:
    from zfab import Client, Settings

    seq_n, pipe_n, idle_s, mmi_n = (300, 2000, 5.0, 10) if quick else (1000, 5000, 10.0, 20)
    out: dict[str, float] = {}
    with Fabric(tmp) as fab:
        broker = fab.start_broker()
        per = _split(n_workers, n_procs)
        peers = []
        for i, k in enumerate(per):
            args = [
                sys.executable,
                "-m",
                "bench.scale",
                "peers",
                "--endpoint",
                fab.endpoint,
                "--count",
                str(k),
                "--prefix",
                f"p{i}",
                "--parent",
                str(os.getpid()),
                "--max-seconds",
                "900",
            ]
            if own_clock:
                args.append("--own-clock")
            if zmq_poll:
                args.append("--zmq-poll")
            peers.append(fab.spawn(args))
        try:
            with Client(settings=Settings(broker=fab.endpoint), name="scale") as c:
                t0 = time.monotonic()
                wait_mmi_workers(c, n_workers, timeout=60 + n_workers / 20, service=SERVICE)
                out["register_s"] = time.monotonic() - t0
                _sequential(c, 50)  # warm-up
                time.sleep(min(3.0, idle_s))  # let every peer's first keepalive round pass
                pids = [broker.pid]
                b0, h0, t0 = cpu_seconds(broker.pid), sum(cpu_seconds(p.pid) for p in peers), time.monotonic()
                time.sleep(idle_s)
                dt = time.monotonic() - t0
                out["broker_cpu_pct"] = 100 * (cpu_seconds(pids[0]) - b0) / dt
                out["harness_cpu_pct"] = 100 * (sum(cpu_seconds(p.pid) for p in peers) - h0) / dt
                out["broker_rss_mb"] = rss_bytes(broker.pid) / 1e6
                lat = _sequential(c, seq_n)
                out["seq_p50_ms"] = percentile(lat, 50) * 1000
                out["seq_p99_ms"] = percentile(lat, 99) * 1000
                out["pipe_jps"] = pipelined(c, pipe_n, 200, SERVICE, 60)
                mmi_lat, size = [], 0
                for _ in range(mmi_n):
                    t = time.perf_counter()
                    ws = c.mmi("show_workers", timeout=10)
                    mmi_lat.append(time.perf_counter() - t)
                    size = len(json.dumps(ws))
                out["mmi_p50_ms"] = percentile(mmi_lat, 50) * 1000
                out["mmi_max_ms"] = max(mmi_lat) * 1000
                out["mmi_kb"] = size / 1000
                alive = [w for w in c.mmi("show_workers", timeout=10) if w.get("alive")]
                out["alive_at_end"] = len(alive)
        except Exception as exc:
            raise RuntimeError(f"{exc}{log_tail([broker, *peers])}") from exc
        finally:
            stop(peers)
    return out


def run(quick: bool = False, workers: int = 1000, procs: int = 4, zmq_poll: bool = False) -> dict[str, Any]:
    """Measure with 1 peer and with ``workers`` peers, print both with ratios."""
    print(
        f"-- {workers:,} workers on one broker (harness: {procs} processes, one poll loop each); "
        f"baseline: the same broker with 1 worker",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="zfab-bench-scale-") as tmp:
        one = _fleet(tmp + "/one", 1, 1, quick, False, zmq_poll)
        many = _fleet(tmp + "/many", workers, procs, quick, False, zmq_poll)
        floor = _router_floor(tmp + "/floor", workers, procs, 5.0 if quick else 10.0)
        own = None
        if not quick:
            own = _fleet(tmp + "/own", workers, procs, True, True)
    label = f"{workers:,} workers"
    report("broker cpu, 1 worker", one["broker_cpu_pct"], "%core")
    report(f"broker cpu, {label}", many["broker_cpu_pct"], "%core")
    print(f"   target < 2 % of a core with {label}; {many['broker_cpu_pct']:.2f} %", flush=True)
    report(f"bare ROUTER cpu, {label}", floor["router_cpu_pct"], "%core")
    if floor["router_cpu_pct"] > 0:
        print(
            f"   the keepalive floor: a pyzmq ROUTER that only receives their keepalives and sends one back per "
            f"interval; broker / floor = {many['broker_cpu_pct'] / floor['router_cpu_pct']:.1f}x",
            flush=True,
        )
    if own is not None:
        report(f"broker cpu, {label} on own clocks", own["broker_cpu_pct"], "%core")
        print(
            "   (on own clocks: each peer sends its keepalives on a clock of its own, staggered, and does not "
            "answer the broker's wave: as NorFab's workers, and zfab's before they answered)",
            flush=True,
        )
    report("harness cpu (all peers)", many["harness_cpu_pct"], "%core")
    report("broker rss, 1 worker", one["broker_rss_mb"], "MB")
    report(f"broker rss, {label}", many["broker_rss_mb"], "MB")
    report("dispatch p50, 1 worker", one["seq_p50_ms"], "ms")
    report(f"dispatch p50, {label}", many["seq_p50_ms"], "ms", one["seq_p50_ms"], False, vs="1 worker")
    ratio = many["seq_p50_ms"] / one["seq_p50_ms"]
    print(f"   dispatch p50 {label} / 1 worker = {ratio:.2f}x (target <= 1.5x)", flush=True)
    report("dispatch p99, 1 worker", one["seq_p99_ms"], "ms")
    report(f"dispatch p99, {label}", many["seq_p99_ms"], "ms", one["seq_p99_ms"], False, vs="1 worker")
    report("pipelined jobs/s, 1 worker", one["pipe_jps"], "/s")
    report(f"pipelined jobs/s, {label}", many["pipe_jps"], "/s", one["pipe_jps"], vs="1 worker")
    report(f"mmi show_workers p50, {label}", many["mmi_p50_ms"], "ms")
    report(f"mmi show_workers max, {label}", many["mmi_max_ms"], "ms")
    print(f"   target < 100 ms; answer {many['mmi_kb']:.0f} kB; 1 worker: {one['mmi_p50_ms']:.1f} ms", flush=True)
    report(f"registration of {label}", many["register_s"], "s")
    print(f"   alive at the end: {many['alive_at_end']:.0f} of {workers}", flush=True)
    return {"one": one, "many": many, "own_clock": own, "floor": floor}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument(
        "--zmq-poll",
        action="store_true",
        help="peers wait in zmq_poll over all their sockets (the harness before epoll), for comparison",
    )
    sub = p.add_subparsers(dest="role")
    pe = sub.add_parser("peers")
    pe.add_argument("--endpoint", required=True)
    pe.add_argument("--count", type=int, required=True)
    pe.add_argument("--prefix", required=True)
    pe.add_argument("--interval", type=float, default=float(os.environ.get("ZFAB_KEEPALIVE_INTERVAL", "2.5")))
    pe.add_argument("--credits", type=int, default=8)
    pe.add_argument(
        "--own-clock",
        action="store_true",
        help="keep alive on the peer's own clock only; do not answer the broker's keepalives",
    )
    pe.add_argument("--max-seconds", type=float, default=900)
    pe.add_argument("--parent", type=int)
    pe.add_argument("--zmq-poll", action="store_true", help="zmq_poll over all sockets (the old harness)")
    ro = sub.add_parser("router")
    ro.add_argument("--endpoint", required=True)
    ro.add_argument("--status", required=True)
    ro.add_argument("--interval", type=float, default=float(os.environ.get("ZFAB_KEEPALIVE_INTERVAL", "2.5")))
    ro.add_argument("--max-seconds", type=float, default=600)
    ro.add_argument("--parent", type=int)
    ns = p.parse_args(argv)
    if ns.role == "router":
        run_router(ns.endpoint, ns.interval, ns.status, ns.max_seconds, ns.parent)
        return 0
    if ns.role == "peers":
        run_peers(
            ns.endpoint,
            ns.count,
            ns.prefix,
            ns.interval,
            ns.credits,
            ns.own_clock,
            ns.max_seconds,
            ns.parent,
            ns.zmq_poll,
        )
        return 0
    run(ns.quick, ns.workers, ns.procs, ns.zmq_poll)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
