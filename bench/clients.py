"""100 concurrent clients: throughput, p99 and fairness, beside one pipelined client in the same run.

    broker + 2 demo workers (processes)
    baseline: 1 zfab Client, window 200, for D seconds                     (one load process)
    load:     100 zfab Clients (threads; 10 processes x 10), window 4 each, for D seconds
    and again with lean peers: 1 DEALER (window 200), then 100 DEALERs (window 4 each) in
          2 single-threaded processes speaking the client protocol (POST with the same body
          and flags a zfab Client sends, acks on; a job is done at its 200)

The zfab Clients measure the library as a program with 100 of them would use it; their load
generators need several times the fabric's CPU per job on the same 2 cores, so that figure
says more about the load than the broker. The lean peers cost a tenth of that, like
bench/scale.py's worker harness: their ratio is the fabric's with 100 connections against one.

The load is spread over 10 processes: 25 Clients to a process (an owner thread and a
submitting thread each, 50 threads on one GIL) cost 0.45-0.58 ms of the load generators' CPU
per job against 0.33-0.39 ms at 10 to a process, on 2 cores the fabric needs too.

Every client submits demo echo jobs for the same duration D, all starting at one instant; a
job's latency is submit to result. Reported: jobs/s of the 100 beside the one client (target
>= 0.8x), p50/p99 latency, and the starvation check: fewest and most jobs finished by one
client in D (and the slowest client's p99). Everything is bounded: each client stops
submitting at D and waits at most the jobs' timeout for what it has in flight.

    python -m bench.clients [--quick]
    python -m bench.clients load ...   (a child)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, percentile, report, stop, wait_for
from bench.harness import Fabric, log_tail, wait_mmi_workers

JOB_TIMEOUT = 30.0
LEAN_PROCS = 2  # lean peer processes for the 100 (one loop each)


def _lane(c: Any, start_at: float, duration: float, window: int, out: dict[str, Any]) -> None:
    lat: list[float] = []
    q: deque[tuple[float, Any]] = deque()
    errors = 0
    while time.time() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.time())))
    end = time.monotonic() + duration
    i = 0
    while time.monotonic() < end:
        while len(q) < window and time.monotonic() < end:
            q.append((time.perf_counter(), c.submit("demo", "echo", kwargs={"data": i}, timeout=JOB_TIMEOUT)))
            i += 1
        t, fut = q.popleft()
        try:
            fut.result(JOB_TIMEOUT + 5)
            lat.append(time.perf_counter() - t)
        except Exception:
            errors += 1
    done_in_window = len(lat)
    while q:  # drain what is in flight (counted for latency, not for throughput within D)
        t, fut = q.popleft()
        try:
            fut.result(JOB_TIMEOUT + 5)
            lat.append(time.perf_counter() - t)
        except Exception:
            errors += 1
    out.update(done=done_in_window, errors=errors, lat=lat)


def run_load(endpoint: str, clients: int, window: int, start_at: float, duration: float, out_path: str) -> None:
    from zfab import Client, Settings

    cs = [Client(settings=Settings(broker=endpoint), name=f"load{i}").start() for i in range(clients)]
    try:
        if not wait_for(lambda: all(c.broker_alive for c in cs), 30):
            raise SystemExit("clients did not hear the broker within 30 s")
        results: list[dict[str, Any]] = [{} for _ in cs]
        threads = [
            threading.Thread(target=_lane, args=(c, start_at, duration, window, r), daemon=True)
            for c, r in zip(cs, results, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration + JOB_TIMEOUT + 60)
        Path(out_path).write_text(json.dumps(results))
    finally:
        for c in cs:
            c.close()


def run_peers(endpoint: str, clients: int, window: int, start_at: float, duration: float, out_path: str) -> None:
    """``clients`` DEALER sockets in one thread, each keeping ``window`` echo jobs in flight from
    start_at for ``duration`` seconds; the same results file as run_load."""
    import select
    import uuid as uuidlib

    import zmq

    from zfab.core import payloads
    from zfab.core import protocol as nfp

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks: list[zmq.Socket[bytes]] = []
    for i in range(clients):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, f"lean{i}-{os.urandom(4).hex()}".encode())
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(endpoint)
        socks.append(sock)
    fields = {"push": True, "ack": True, "task": "echo", "timeout": JOB_TIMEOUT, "notice": 1.0}
    flags = nfp.dumps(fields)
    try:
        for sock in socks:  # each hears the broker before the clock starts (a keepalive answered)
            sock.send_multipart(nfp.client_request(nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""))
            sock.recv_multipart()
        ep = select.epoll()
        by_fd = {}  # ZMQ_FD -> the peer's index
        for k, sock in enumerate(socks):
            fd = sock.getsockopt(zmq.FD)
            by_fd[fd] = k
            ep.register(fd, select.EPOLLIN)
        state = [{"t": {}, "lat": [], "errors": 0, "done": 0, "i": 0} for _ in socks]
        time.sleep(max(0.0, start_at - time.time()))
        end = time.monotonic() + duration
        stop_at = end + JOB_TIMEOUT + 5

        def submit(k: int) -> None:
            st = state[k]
            wire = uuidlib.uuid4().hex.encode()
            body = payloads.post_body("echo", None, {"data": st["i"]}, timeout=JOB_TIMEOUT, push=True, ack=True)
            st["i"] += 1
            st["t"][wire] = time.perf_counter()
            socks[k].send_multipart(nfp.client_request(nfp.POST, b"demo", b"any", wire, body, flags))

        for k in range(len(socks)):
            for _ in range(window):
                submit(k)
        ready = list(range(len(socks)))
        while time.monotonic() < stop_at and any(st["t"] for st in state):
            more = []
            for k in ready:
                sock, st = socks[k], state[k]
                for _ in range(64):
                    if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                        break
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                    # [b"", NFPB01, RESPONSE, service, uuid, status, payload]
                    if len(frames) < 6 or frames[2] != nfp.RESPONSE:
                        continue
                    status = frames[5]
                    if status in (b"202", b"201", b"301", b"300"):
                        continue
                    t = st["t"].pop(frames[4], None)
                    if t is None:
                        continue
                    if status == b"200":
                        st["lat"].append(time.perf_counter() - t)
                        if time.monotonic() < end:
                            st["done"] += 1
                    else:
                        st["errors"] += 1
                    if time.monotonic() < end:
                        submit(k)
                else:
                    more.append(k)
                    continue
                if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    more.append(k)
            ready = more + [by_fd[fd] for fd, _ in ep.poll(0 if more else 0.05)]
        out = [{"done": st["done"], "errors": st["errors"] + len(st["t"]), "lat": st["lat"]} for st in state]
        Path(out_path).write_text(json.dumps(out))
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()


def _drive(
    fab: Fabric, tmp: Path, procs: int, per_proc: int, window: int, duration: float, tag: str, role: str = "load"
) -> list[Any]:
    start_at = time.time() + 4.0 + 0.05 * procs * per_proc
    outs, loaders = [], []
    for i in range(procs):
        path = tmp / f"{tag}-{i}.json"
        outs.append(path)
        loaders.append(
            fab.spawn(
                [
                    sys.executable,
                    "-m",
                    "bench.clients",
                    role,
                    "--endpoint",
                    fab.endpoint,
                    "--clients",
                    str(per_proc),
                    "--window",
                    str(window),
                    "--start-at",
                    str(start_at),
                    "--duration",
                    str(duration),
                    "--out",
                    str(path),
                ]
            )
        )
    limit = start_at - time.time() + duration + JOB_TIMEOUT + 90
    cpu: dict[str, float] = {}
    try:
        fabric_pids = list(fab.pids().values())
        time.sleep(max(0.0, start_at - time.time()))
        f0, l0, t0 = _cpu(fabric_pids), _cpu([p.pid for p in loaders]), time.monotonic()
        time.sleep(duration)
        dt = time.monotonic() - t0
        cpu = {
            "fabric_pct": 100 * (_cpu(fabric_pids) - f0) / dt,
            "load_pct": 100 * (_cpu([p.pid for p in loaders]) - l0) / dt,
        }
        if not wait_for(lambda: all(p.poll() is not None for p in loaders), limit, 0.2):
            raise RuntimeError(f"load processes still running after {limit:.0f} s" + log_tail(loaders))
        lanes: list[Any] = []
        for p, path in zip(loaders, outs, strict=True):
            if p.returncode != 0 or not path.exists():
                raise RuntimeError(f"load process exited {p.returncode}" + log_tail([p]))
            lanes += json.loads(path.read_text())
        lanes[0]["cpu"] = cpu
        return lanes
    finally:
        stop(loaders)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except ProcessLookupError:
            pass
    return total


def run(quick: bool = False, n_clients: int = 100, procs: int = 10) -> dict[str, float]:
    from zfab import Client, Settings

    duration = 5.0 if quick else 15.0
    with tempfile.TemporaryDirectory(prefix="zfab-bench-clients-") as tmpd, Fabric(tmpd) as fab:
        tmp = Path(tmpd)
        fab.start_broker()
        fab.start_worker("bench-1")
        fab.start_worker("bench-2")
        with Client(settings=Settings(broker=fab.endpoint), name="warm") as c:
            wait_mmi_workers(c, 2, service="demo")
            for i in range(200):
                c.run_job("demo", "echo", kwargs={"data": i}, timeout=10)
        one = _drive(fab, tmp, 1, 1, 200, duration, "one")
        time.sleep(2.0)
        many = _drive(fab, tmp, procs, n_clients // procs, 4, duration, "many")
        time.sleep(2.0)
        lean_one = _drive(fab, tmp, 1, 1, 200, duration, "lean-one", "peers")
        time.sleep(2.0)
        lean_many = _drive(fab, tmp, LEAN_PROCS, n_clients // LEAN_PROCS, 4, duration, "lean-many", "peers")
    n = len(many)
    print(f"-- {n} clients vs 1 client, {duration:.0f} s each, broker + 2 demo workers, echo, acks on", flush=True)
    print(
        f"   zfab Clients: {procs} processes x {n // procs} threads, window 4 each; 1 Client with window 200",
        flush=True,
    )
    out = _figures(one, many, duration)
    _print(out, n, "", "the zfab Client library")
    print(
        f"   lean peers: {LEAN_PROCS} processes x {n // LEAN_PROCS} DEALERs in one loop, window 4 each; 1 with "
        "window 200",
        flush=True,
    )
    lean = _figures(lean_one, lean_many, duration)
    _print(lean, n, "lean ", "lean peers")
    out.update({f"lean_{k}": v for k, v in lean.items()})
    return out


def _figures(one: list[Any], many: list[Any], duration: float) -> dict[str, float]:
    one_done = sum(r["done"] for r in one)
    many_done = [r["done"] for r in many]
    one_lat = [x for r in one for x in r["lat"]]
    many_lat = [x for r in many for x in r["lat"]]
    out = {
        "one_jps": one_done / duration,
        "many_jps": sum(many_done) / duration,
        "one_p50_ms": percentile(one_lat, 50) * 1000,
        "one_p99_ms": percentile(one_lat, 99) * 1000,
        "many_p50_ms": percentile(many_lat, 50) * 1000,
        "many_p99_ms": percentile(many_lat, 99) * 1000,
        "min_per_client": min(many_done),
        "max_per_client": max(many_done),
        "worst_client_p99_ms": max(percentile(r["lat"], 99) for r in many if r["lat"]) * 1000,
        "errors": sum(r["errors"] for r in many) + sum(r["errors"] for r in one),
        "one_fabric_cpu_pct": one[0]["cpu"]["fabric_pct"],
        "one_load_cpu_pct": one[0]["cpu"]["load_pct"],
        "many_fabric_cpu_pct": many[0]["cpu"]["fabric_pct"],
        "many_load_cpu_pct": many[0]["cpu"]["load_pct"],
    }
    out["one_fabric_ms_per_job"] = out["one_fabric_cpu_pct"] * 10 / out["one_jps"]
    out["many_fabric_ms_per_job"] = out["many_fabric_cpu_pct"] * 10 / out["many_jps"]
    out["one_client_ms_per_job"] = out["one_load_cpu_pct"] * 10 / out["one_jps"]
    out["many_client_ms_per_job"] = out["many_load_cpu_pct"] * 10 / out["many_jps"]
    return out


def _print(out: dict[str, float], n: int, tag: str, what: str) -> None:
    report(f"{tag}1 client jobs/s", out["one_jps"], "/s")
    report(f"{tag}{n} clients jobs/s", out["many_jps"], "/s", out["one_jps"], vs="1 client")
    print(
        f"   {n} clients / 1 pipelined client = {out['many_jps'] / out['one_jps']:.2f}x with {what} (target >= 0.8x)",
        flush=True,
    )
    report(f"{tag}1 client p50", out["one_p50_ms"], "ms")
    report(f"{tag}1 client p99", out["one_p99_ms"], "ms")
    report(f"{tag}{n} clients p50", out["many_p50_ms"], "ms")
    report(f"{tag}{n} clients p99", out["many_p99_ms"], "ms")
    report(f"{tag}{n} clients worst client p99", out["worst_client_p99_ms"], "ms")
    report(f"{tag}1 client: fabric cpu/job", out["one_fabric_ms_per_job"], "ms")
    report(
        f"{tag}{n} clients: fabric cpu/job",
        out["many_fabric_ms_per_job"],
        "ms",
        out["one_fabric_ms_per_job"],
        False,
        vs="1 client",
    )
    report(f"{tag}1 client: client cpu/job", out["one_client_ms_per_job"], "ms")
    report(
        f"{tag}{n} clients: client cpu/job",
        out["many_client_ms_per_job"],
        "ms",
        out["one_client_ms_per_job"],
        False,
        vs="1 client",
    )
    print(
        f"   (fabric = broker + 2 workers; load generators used {out['one_load_cpu_pct']:.0f} % / "
        f"{out['many_load_cpu_pct']:.0f} % of a core, fabric {out['one_fabric_cpu_pct']:.0f} % / "
        f"{out['many_fabric_cpu_pct']:.0f} %, of 200 % on this machine)",
        flush=True,
    )
    report(f"{tag}fewest jobs by one client", out["min_per_client"], "jobs")
    report(f"{tag}most jobs by one client", out["max_per_client"], "jobs")
    fair = out["min_per_client"] / out["max_per_client"] if out["max_per_client"] else 0.0
    print(
        f"   starvation check: min/max jobs per client = {fair:.2f} (1.0 = perfectly even; "
        f"0 = a client starved); errors {out['errors']:.0f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.clients", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--clients", type=int, default=100)
    sub = p.add_subparsers(dest="role")
    ld = sub.add_parser("load")
    ld.add_argument("--endpoint", required=True)
    ld.add_argument("--clients", type=int, required=True)
    ld.add_argument("--window", type=int, required=True)
    ld.add_argument("--start-at", type=float, required=True)
    ld.add_argument("--duration", type=float, required=True)
    ld.add_argument("--out", required=True)
    pe = sub.add_parser("peers")
    for a in ("--endpoint", "--out"):
        pe.add_argument(a, required=True)
    for a in ("--clients", "--window"):
        pe.add_argument(a, type=int, required=True)
    for a in ("--start-at", "--duration"):
        pe.add_argument(a, type=float, required=True)
    ns = p.parse_args(argv)
    if ns.role == "peers":
        run_peers(ns.endpoint, ns.clients, ns.window, ns.start_at, ns.duration, ns.out)
        return 0
    if ns.role == "load":
        os.environ.setdefault("ZFAB_LOG_LEVEL", "WARNING")
        run_load(ns.endpoint, ns.clients, ns.window, ns.start_at, ns.duration, ns.out)
        return 0
    run(ns.quick, ns.clients)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
