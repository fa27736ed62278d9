"""The lean and kept roles `bench/swap.py` runs in place of zfab's, each in a process of its own:
nfp_floor's broker, worker and client served to zfab's peers, and the kept broker and worker (the lean
ones keeping zfab's per-job promises). `bench/flatroles.py` has those on zfab's own parts;
`bench/swap.py` says what each measures (issue 40)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from bench.common import percentile
from bench.versus import _load

LEAN_SERVICE = "svc"  # what nfp_floor's worker registers; zfab's serves its built-in "demo"
FIRST_ANSWER_S = 20.0


# ---------------------------------------------------------------- child roles


def lean_broker(path: str, port: int) -> None:
    """nfp_floor's broker, but a POST before any worker is READY is dropped (its sender tries again)."""
    import zmq

    m = _load(path)
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.bind(f"tcp://127.0.0.1:{port}")
    workers: list[bytes] = []
    services: dict[bytes, bytes] = {}  # a job's service, named in its answers (a zfab client checks it)
    rr = 0
    while True:
        f = r.recv_multipart()
        ident, hdr, cmd = f[0], f[2], f[3]
        if hdr == m.W:
            if cmd == m.READY:
                workers.append(ident)
            elif cmd == m.RESPONSE:
                svc = services.pop(f[6], LEAN_SERVICE.encode()) if f[7] == b"200" else services.get(f[6], b"")
                r.send_multipart([f[4], b"", m.B, m.RESPONSE, svc, f[6], f[7], f[8]])
        elif hdr == m.C and cmd == m.POST and workers:
            w = workers[rr % len(workers)]
            rr += 1
            services[f[6]] = f[4]
            # A zfab worker's identity is its name, "~" and a nonce: the 202 names the worker.
            body = {"workers": [w.split(b"~")[0].decode()], "uuid": f[6].decode(), "status": "DISPATCHED"}
            r.send_multipart([ident, b"", m.B, m.RESPONSE, f[4], f[6], b"202", json.dumps(body).encode()])
            r.send_multipart([w, b"", m.B, m.POST, ident, b"", f[6], f[7]])


def kept_broker(path: str, port: int) -> None:
    """The lean broker with what zfab's keeps per job, written as lean as it goes: a POST
    de-duplicated by uuid (waiting, in flight, or among the last finished), a route per job (its
    client, worker and deadline) until its final answer, a deadline heap, the worker's credit taken and
    given back, the least loaded worker chosen, a meta frame (what is left of the deadline, the time
    queued) on the POST. What it leaves out: queues (a worker is always free here), refusals, hooks,
    metrics, hop traces. With `kept_worker`, how lean a fabric that keeps zfab's promises can be."""
    import heapq
    from collections import OrderedDict

    import zmq

    m = _load(path)
    r = zmq.Context().socket(zmq.ROUTER)
    r.bind(f"tcp://127.0.0.1:{port}")
    inflight: dict[bytes, int] = {}  # worker identity -> jobs in flight (its credit)
    routes: dict[bytes, tuple[bytes, bytes, bytes, float]] = {}  # uuid -> client, worker, service, deadline
    finished: OrderedDict[bytes, bytes] = OrderedDict()  # uuid -> worker, the last ones, bounded
    deadlines: list[tuple[float, bytes]] = []
    while True:
        f = r.recv_multipart()
        ident, hdr, cmd = f[0], f[2], f[3]
        now = time.monotonic()
        if hdr == m.W:
            if cmd == m.READY:
                inflight.setdefault(ident, 0)
            elif cmd == m.RESPONSE:
                route = routes.get(f[6])
                if f[7] == b"200" and route is not None:
                    del routes[f[6]]
                    inflight[ident] -= 1
                    finished[f[6]] = ident
                    if len(finished) > 10_000:
                        finished.popitem(last=False)
                svc = route[2] if route is not None else LEAN_SERVICE.encode()
                client = route[0] if route is not None else f[4]
                r.send_multipart([client, b"", m.B, m.RESPONSE, svc, f[6], f[7], f[8]])
        elif hdr == m.C and cmd == m.POST and inflight:
            uuid = f[6]
            if uuid in routes or uuid in finished:
                continue  # a POST again: zfab's answers from what it holds; not on this path
            w = min(inflight, key=inflight.__getitem__)
            inflight[w] += 1
            deadline = now + 60.0
            routes[uuid] = (ident, w, f[4], deadline)
            heapq.heappush(deadlines, (deadline, uuid))
            while deadlines and deadlines[0][0] <= now:
                heapq.heappop(deadlines)
            meta = json.dumps({"deadline": round(deadline - now, 3), "queued": round(time.monotonic() - now, 6)})
            body = {"workers": [w.split(b"~")[0].decode()], "uuid": uuid.decode(), "status": "DISPATCHED"}
            r.send_multipart([ident, b"", m.B, m.RESPONSE, f[4], uuid, b"202", json.dumps(body).encode()])
            r.send_multipart([w, b"", m.B, m.POST, ident, b"", uuid, f[7], meta.encode()])


def lean_worker(path: str, port: int) -> None:
    m = _load(path)
    m.EP = f"tcp://127.0.0.1:{port}"
    m.worker()


def _timed(submit: Any, n: int) -> None:
    """The first job until the path answers, then n one at a time: prints p50_ms."""
    deadline = time.monotonic() + FIRST_ANSWER_S
    while True:
        try:
            submit(0, 3.0)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise  # the last try's own failure
            time.sleep(0.1)  # a refusal comes at once: not a loop of them while the worker registers
    for i in range(200):  # warm
        submit(i, 5.0)
    lat = []
    for i in range(n):
        t = time.perf_counter()
        submit(i, 5.0)
        lat.append(time.perf_counter() - t)
    print(f"p50_ms={percentile(lat, 50) * 1e3:.3f} p99_ms={percentile(lat, 99) * 1e3:.3f}", flush=True)


def kept_worker(path: str, port: int, folder: str) -> None:
    """nfp_floor's worker with what a zfab worker keeps per job, written as lean as it goes: a POST's
    frames checked, its uuid looked up among the last jobs (de-duplication) and its body read and
    its task looked up on the owner; its receipt appended to a journal (MessagePack, a CRC, one
    write(2)) before the job thread may start it; the job thread runs it, builds zfab's result entry
    (timestamps and all), appends the result to the journal, then hands the answer to the owner.
    What it leaves out: the 201 (zfab's worker holds it 10 ms and drops it when the result comes
    first), credits, deadline checks (it reads the meta frame's deadline), hop traces, metrics. It says
    how lean a path that keeps zfab's exactly-once promises can be (issue 40)."""
    import queue
    import struct
    import zlib
    from collections import OrderedDict

    import msgspec
    import zmq

    from zfab.core.payloads import result_entry  # zfab's own: the entry its worker answers with

    m = _load(path)
    m.EP = f"tcp://127.0.0.1:{port}"
    head, encode, decode = struct.Struct("<BII"), msgspec.msgpack.Encoder().encode, msgspec.json.Decoder().decode
    fd = os.open(os.path.join(folder, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    tasks = {"echo": lambda data=None: data}
    seen: OrderedDict[bytes, bool] = OrderedDict()  # the last jobs, bounded
    jobs: queue.SimpleQueue[tuple[bytes, bytes, Any, float]] = queue.SimpleQueue()

    def append(kind: int, row: tuple[Any, ...]) -> None:
        body = encode([row])
        os.writev(fd, [head.pack(kind, len(body), zlib.crc32(body)), body])

    def on_msg(f: list[bytes]) -> None:  # ["", B, POST, client, "", uuid, body]
        if len(f) < 7 or f[1] != m.B or f[2] != m.POST or f[5] in seen:
            return
        req = decode(f[6])
        if not isinstance(req, dict) or req.get("task") not in tasks:
            return
        meta = decode(f[7]) if len(f) > 7 else {}  # zfab's broker: what is left of the deadline
        req["deadline"] = time.monotonic() + float(meta.get("deadline", 60.0))
        seen[f[5]] = True
        if len(seen) > 10_000:
            seen.popitem(last=False)
        received = time.time()
        append(3, (f[5].decode(), f[3], req["task"], f[6], received))
        jobs.put((f[3], f[5], req, received))

    own = m.Owner(zmq.Context(), b"w1", on_msg)
    own.send([b"", m.W, m.READY, LEAN_SERVICE.encode()])
    while True:
        client, juuid, req, received = jobs.get()
        started = time.time()
        result = tasks[req["task"]](*req.get("args") or [], **req.get("kwargs") or {})
        done = time.time()
        entry = result_entry(
            worker="w1", service=LEAN_SERVICE, uuid=juuid.decode(), task=req["task"], result=result, failed=False,
            status="completed", errors=[], received=received, started=started, completed=done,
        )  # fmt: skip
        payload = msgspec.json.encode({"w1": entry})
        append(4, (juuid.decode(), "completed", "200", payload, done))
        own.send([b"", m.W, m.RESPONSE, client, b"", juuid, b"200", payload])


def lean_submitter(m: Any, service: str) -> Callable[[int, float], None]:
    """nfp_floor's client (its Owner, its frames, a Future per job) on module `m` (its EP set): a function
    that runs one echo job to `service` and waits up to `timeout` for its result."""
    import zmq

    futs: dict[bytes, Future[Any]] = {}

    def on_msg(f: list[bytes]) -> None:
        if f[5] == b"200":
            fut = futs.pop(f[4], None)
            if fut:
                fut.set_result(json.loads(f[6]))

    own = m.Owner(zmq.Context(), b"c1", on_msg)

    def submit(i: int, timeout: float) -> None:
        u = uuid.uuid4().hex.encode()
        fut: Future[Any] = Future()
        futs[u] = fut
        body = json.dumps({"task": "echo", "args": [], "kwargs": {"data": i}}).encode()
        own.send([b"", m.C, m.POST, service.encode(), b"any", u, body])
        try:
            fut.result(timeout)
        finally:
            futs.pop(u, None)

    return submit


def lean_client(path: str, port: int, service: str, n: int) -> None:
    """nfp_floor's client, sequential only."""
    m = _load(path)
    m.EP = f"tcp://127.0.0.1:{port}"
    _timed(lean_submitter(m, service), n)


def zfab_client(endpoint: str, service: str, n: int) -> None:
    from zfab import Client

    with Client(broker=endpoint, name="swap") as c:
        _timed(lambda i, timeout: c.run_job(service, "echo", kwargs={"data": i}, timeout=timeout), n)
