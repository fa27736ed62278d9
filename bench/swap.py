"""Where zfab's sequential p50 goes, role by role, and how lean zfab's promises can be (issue 40).

The lean NFP fabric (`../shared/acceptance/nfp_floor.py`) and zfab speak the same wire, so each of
zfab's three roles can stand in for the lean one's, one at a time. Twelve setups, interleaved round after
round so a noisy moment of the machine hurts one round rather than one setup, each timing `--n`
sequential echo jobs (one in flight, as speed.py's p50):

- zfab: `zfab broker`, one `zfab worker`, a `Client`;
- lean client / lean broker / lean worker: that role nfp_floor's, the other two zfab's;
- kept broker / kept worker: that role lean but keeping what zfab's keeps per job (below), the other
  two zfab's;
- kept: the kept broker and the kept worker, with the lean client;
- kept worker (zfab's parts): the kept worker's handlers on zfab's own owner loop, pool, job store,
  `Job` and recent-jobs table, announced as zfab's (`v: 2`, hop traces), the other two roles zfab's:
  against zfab, what its worker's handlers cost beyond the promises; against the kept worker, what its
  parts cost;
- flat worker: zfab's worker's per-job features, every one, written flat on the same parts (`flat_worker`),
  the other two roles zfab's: against zfab, what a rewrite of its handlers keeping every feature could
  reach;
- flat worker, the rest kept: that worker with the kept broker and the lean client: the floor of a
  fabric whose worker keeps every feature (a client and a broker cannot do with less than those);
- kept (zfab client): the kept broker and the kept worker, with zfab's client (what a rewrite of the
  broker's and the worker's paths alone could reach);
- lean: all three nfp_floor's.

`--mix CLIENT/BROKER/WORKER` runs any other triple (a client zfab's or lean; a broker zfab's, lean,
kept or flat (`flat_broker`: every per-job feature of zfab's, flat); a worker zfab's, lean, kept, parts
or flat). A role swapped alone and the same role swapped beside others need not gain the same: the
roles share two cores.

A role's share of the gap is the p50 of all-zfab less the p50 with that role lean. The shares need not
add up to the whole gap: a role's Python also competes for the two cores with the others' while it runs.
"kept" against "lean" is what zfab's per-job promises cost when written as lean as they go: the floor
for a fabric that keeps them.

The lean roles are nfp_floor's own functions (its `Owner`, its `worker`, its frames), with what it
takes to serve a zfab peer: every role gets its endpoint from here; the lean broker drops a POST that
comes before any worker is READY (nfp_floor's would divide by zero; here a zfab worker may register
after the first job is sent), names a zfab worker in its 202 by its name (its identity is the name, "~"
and a nonce), and keeps each job's service to name it in the answers (a zfab client checks it). So
all-lean here is slower than nfp_floor's own run (0.53-0.61 ms against 0.51-0.54 on the 2-core VM).
The kept roles are those, with the promises `kept_broker` and `kept_worker` list. The lean and kept
workers and brokers send no keepalives; a zfab peer holds them alive for its hold time (15 s by
default), longer than a round.

    python -m bench.swap [--rounds 3] [--n 2000] [--only "kept worker" ...] [--mix zfab/kept/flat ...]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from bench.common import spawn, stop, wait_for
from bench.harness import Fabric
from bench.versus import ROOT, _child, _load, shared_file

# Each setup's roles: (client, broker, worker). A client is zfab's or lean; a broker zfab's, lean or kept; a
# worker zfab's, lean, kept, "parts" (kept on zfab's parts) or "flat" (every feature, flat on those parts).
SETUPS: dict[str, tuple[str, str, str]] = {
    "zfab": ("zfab", "zfab", "zfab"),
    "lean client": ("lean", "zfab", "zfab"),
    "lean broker": ("zfab", "lean", "zfab"),
    "lean worker": ("zfab", "zfab", "lean"),
    "kept broker": ("zfab", "kept", "zfab"),
    "kept worker": ("zfab", "zfab", "kept"),
    "kept worker (zfab's parts)": ("zfab", "zfab", "parts"),
    "flat worker": ("zfab", "zfab", "flat"),
    "flat worker, the rest kept": ("lean", "kept", "flat"),
    "kept": ("lean", "kept", "kept"),
    "kept (zfab client)": ("zfab", "kept", "kept"),
    "lean": ("lean", "lean", "lean"),
}
CLIENTS, BROKERS, WORKERS = (
    ("zfab", "lean"),
    ("zfab", "lean", "kept", "flat"),
    ("zfab", "lean", "kept", "parts", "flat"),
)
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


def flat_broker(path: str, port: int) -> None:
    """zfab's broker's per-job features for a POST to `any` and its final answer, written flat on its
    own owner loop: what a rewrite of its handlers that keeps every feature could reach (issue 40).
    A POST: zfab's decoder, the client touched, the MMI check, de-duplication (waiting, in flight,
    finished lately), `read_job` (the flags), the task checked against the service's, the byte bound,
    the limits' rule looked up, pauses and the route bound, the least loaded worker by level, a route with
    its expiry in a heap, the worker's credit, the 202 (`payloads.dispatched`), the POST with its meta
    frame, the queued-time histogram, the counts. Its final answer: zfab's decoder, the worker heard,
    the route, the credit freed, the finished table (bounded), the hop trace (`hoptrace.broker_frame`),
    the forward, the counts, the pump's check. Each turn of the loop: a timer pass over the heap tops,
    the keepalive and housekeeping times. No error paths, no keepalives sent, no term or memory-keeper
    hooks, a `min` over the workers for their levels: a floor, not a broker."""
    import heapq
    import threading
    from collections import Counter, OrderedDict

    import zmq

    from zfab.broker.admission import read_job
    from zfab.broker.jobqueue import QueuedJob
    from zfab.core import hoptrace, payloads
    from zfab.core import protocol as nfp
    from zfab.core.histogram import Histogram
    from zfab.core.keepalive import KeepAlive
    from zfab.transport.base import Frames
    from zfab.transport.loop import OwnerLoop

    del path  # nfp_floor's frames are not needed: zfab's own are used
    max_bytes, max_routes, seq = 64 << 20, 100_000, iter(range(1 << 62))
    workers: dict[bytes, dict[str, Any]] = {}  # identity -> name, service, credits, inflight, keepalive
    services: dict[bytes, dict[str, Any]] = {}  # name -> tasks, workers, queued histogram
    clients: dict[bytes, float] = {}
    routes: dict[bytes, tuple[QueuedJob, bytes, float]] = {}  # uuid -> job, worker identity, deadline
    route_expiry: list[tuple[float, bytes]] = []
    finished: OrderedDict[bytes, bytes] = OrderedDict()
    queued: dict[bytes, QueuedJob] = {}
    limits: dict[tuple[bytes, str], Any] = {}
    paused: set[bytes] = set()
    counts: Counter[str] = Counter()
    held_bytes = [0]
    dirty: set[bytes] = set()
    next_keepalive, next_housekeeping = [time.monotonic() + 2.5], [time.monotonic() + 60.0]

    def post(sender: bytes, req: nfp.ClientRequest) -> None:
        clients[sender] = time.monotonic()
        if req.service == nfp.MMI_SERVICE:
            return
        if queued.get(req.uuid) is not None or req.uuid in routes or req.uuid in finished:
            return
        now = time.monotonic()
        job = read_job(sender, req, now=now, seq=next(seq), default_timeout=600.0)
        svc = services.get(req.service)
        if svc is None or (job.task and svc["tasks"] is not None and job.task not in svc["tasks"]):
            return
        if held_bytes[0] + job.size > max_bytes or len(routes) >= max_routes or req.service in paused:
            return
        limits.get((req.service, job.task))
        free = [w for w in svc["workers"] if len(w["inflight"]) < w["credits"] and w["keepalive"].is_alive()]
        if not free:
            return
        w = min(free, key=lambda w: len(w["inflight"]))
        deadline = job.deadline + 1.0
        heapq.heappush(route_expiry, (deadline, job.uuid))
        routes[job.uuid] = (job, w["ident"], deadline)
        w["inflight"][job.uuid] = sender
        held_bytes[0] += job.size
        if job.ack:
            body = payloads.dispatched(job.uuid, job.target, job.service, [w["name"]])
            loop.send_now(
                nfp.broker_reply(sender, nfp.RESPONSE, job.service, job.uuid, nfp.ST_DISPATCHED, nfp.dumps(body))
            )
        frames = nfp.broker_job(w["ident"], nfp.POST, sender, job.uuid, job.body)
        job.sent_at = now
        frames.append(
            nfp.dumps({"deadline": round(max(0.0, job.deadline - now), 3), "queued": round(now - job.queued_at, 6)})
        )
        loop.send_now(frames)
        svc["queued"].observe(max(0.0, now - job.queued_at))
        counts["post"] += 1

    def answer(ident: bytes, msg: nfp.WorkerReply) -> None:
        w = workers.get(ident)
        if w is None:
            return
        w["keepalive"].heard(keepalive=False)
        entry = routes.get(msg.uuid)
        client = msg.client if entry is None else entry[0].client
        if msg.command == nfp.RESPONSE and msg.status in nfp.FINAL_STATUSES and w["inflight"].pop(msg.uuid, None):
            if entry is not None:
                del routes[msg.uuid]
                held_bytes[0] -= entry[0].size
            finished[msg.uuid] = w["name"].encode()
            if len(finished) > 10_000:
                finished.popitem(last=False)
            dirty.add(w["service"])
        counts["forwarded"] += 1
        frames = nfp.broker_reply(client, msg.command, w["service"], msg.uuid, msg.status, msg.payload)
        if entry is not None and entry[0].push:
            trace = msg.trace if msg.trace is None or type(msg.trace) is bytes else bytes(msg.trace)
            frames.append(hoptrace.broker_frame(trace, entry[0].queued_at, entry[0].sent_at, time.monotonic()))
        loop.send_now(frames)

    def ready(ident: bytes, msg: nfp.WorkerControl) -> None:
        facts = msg.stats or {}
        svc = services.setdefault(
            msg.service, {"tasks": facts.get("tasks"), "workers": [], "queued": Histogram((0.001, 0.01, 0.1, 1.0))}
        )
        w = {
            "ident": ident, "name": str(facts.get("name", ident.decode())), "service": msg.service,
            "credits": int(facts.get("credits", 1)), "inflight": {}, "keepalive": KeepAlive(2.5, 6),
        }  # fmt: skip
        workers[ident] = w
        svc["workers"].append(w)

    class Flat:
        def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
            sock = ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(f"tcp://127.0.0.1:{port}")
            return sock

        def on_connected(self) -> None:
            pass

        def on_frames(self, f: Frames) -> None:
            sender, header = bytes(f[0]), f[2]
            if header == nfp.CLIENT:
                req = nfp.decode_client(f[1:], max_bytes)
                if req.command == nfp.POST:
                    post(sender, req)
            elif header == nfp.WORKER:
                msg = nfp.decode_worker(f[1:], max_bytes)
                if isinstance(msg, nfp.WorkerReply):
                    answer(sender, msg)
                elif msg.command == nfp.READY:
                    ready(sender, msg)

        def on_batch_end(self) -> None:
            if dirty:
                dirty.clear()  # the queue is empty here: a pump finds nothing

        def on_timer(self, now: float) -> float | None:
            while route_expiry and route_expiry[0][0] <= now:
                heapq.heappop(route_expiry)
            if now >= next_keepalive[0]:
                next_keepalive[0] = now + 2.5  # zfab's broker sends its keepalive wave here
            if now >= next_housekeeping[0]:
                next_housekeeping[0] = now + 60.0
            wake = min(next_keepalive[0], next_housekeeping[0])
            if route_expiry and route_expiry[0][0] < wake:
                wake = route_expiry[0][0]
            return wake

        def on_closing(self) -> None:
            pass

    loop = OwnerLoop(Flat(), name="flat broker", submit_timeout=5.0)
    loop.start()
    threading.Event().wait()  # until the harness stops it


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
                raise
    for i in range(200):  # warm
        submit(i, 5.0)
    lat = []
    for i in range(n):
        t = time.perf_counter()
        submit(i, 5.0)
        lat.append(time.perf_counter() - t)
    lat.sort()
    print(f"p50_ms={lat[len(lat) // 2] * 1e3:.3f} p99_ms={lat[int(len(lat) * 0.99)] * 1e3:.3f}", flush=True)


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
    own: Any = None

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


def kept_worker_on_zfab(path: str, port: int, folder: str) -> None:
    """`kept_worker`'s handlers on zfab's own parts: the `OwnerLoop` owns its DEALER, a `JobPool` of
    four threads runs the jobs, a `JobStore` journals each receipt before the start and each result
    before the report (and folds them into SQLite), a `Job` is made and kept in `RecentJobs` (uuids
    seen there are not run again), its READY says `v: 2` and each result carries its hop-trace frame,
    so the broker treats it as a zfab worker. What it leaves out is what `kept_worker` leaves out. So it
    tells zfab's machinery from its handlers' code (issue 40)."""
    import threading

    import msgspec
    import zmq

    from zfab.core import hoptrace
    from zfab.core.payloads import result_entry
    from zfab.transport.base import Frames
    from zfab.transport.loop import OwnerLoop
    from zfab.worker.job import Job, JobState
    from zfab.worker.jobstore import JobStore
    from zfab.worker.pool import JobPool
    from zfab.worker.recent import RecentJobs

    m = _load(path)
    endpoint, decode = f"tcp://127.0.0.1:{port}", msgspec.json.Decoder().decode
    tasks = {"echo": lambda data=None: data}
    store = JobStore(Path(folder) / "kept.sqlite", failure_payload=lambda uuid, task, why: b"{}")
    recent = RecentJobs(max_count=10_000, max_bytes=64 << 20)
    announce = json.dumps({"v": 2, "name": "w1", "credits": 8, "tasks": {"echo": {}}}).encode()

    def run(job: Job) -> None:  # a pool thread
        if not job.claim():
            return
        job.started_at, job.started_mono = time.time(), time.monotonic()
        kwargs, job.args, job.kwargs = job.kwargs, [], {}
        job.state = JobState.RUNNING
        result = tasks[job.task](**kwargs)
        job.completed_at = time.time()
        entry = result_entry(
            worker="w1", service=LEAN_SERVICE, uuid=job.uuid, task=job.task, result=result, failed=False,
            status="completed", errors=[], received=job.received_at, started=job.started_at,
            completed=job.completed_at,
        )  # fmt: skip
        job.result_payload, job.status_code = msgspec.json.encode({"w1": entry}), b"200"
        recent.result_made(job)
        job.state = JobState.COMPLETED
        now = time.monotonic()
        trace = hoptrace.worker_frame(job.received_mono, job.started_mono, now, now, hoptrace.OUTCOME_COMPLETED)
        frames = [b"", m.W, m.RESPONSE, job.client, b"", job.uuid.encode(), b"200", job.result_payload, trace]
        store.write(store.result_op(job, "200"), lambda: loop.submit(frames, timeout=0), timeout=0)

    pool: JobPool[Job] = JobPool(run, size=4, capacity=1000, name="kept")

    class Kept:
        def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, b"w1~kept")
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            return sock

        def on_connected(self) -> None:
            loop.send_now([b"", m.W, m.READY, LEAN_SERVICE.encode(), announce])

        def on_frames(self, f: Frames) -> None:  # ["", B, POST, client, "", uuid, body, meta]
            if len(f) < 7 or f[1] != m.B or f[2] != m.POST:
                return
            uuid = bytes(f[5]).decode()
            req = decode(f[6])
            if recent.get(uuid) is not None or not isinstance(req, dict) or req.get("task") not in tasks:
                return
            meta = decode(f[7]) if len(f) > 7 else {}  # zfab's broker: what is left of the deadline
            job = Job(
                uuid=uuid, client=bytes(f[3]), task=req["task"], args=req.get("args") or [],
                kwargs=req.get("kwargs") or {}, timeout=float(meta.get("deadline", 60.0)), push=True, ack=False,
                request=bytes(f[6]),
            )  # fmt: skip
            recent.add(job)
            store.write(store.insert_op([(uuid, job.client, job.task, job.request, job.received_at)]), timeout=0.5)
            pool.put(job)

        def on_batch_end(self) -> None:
            pass

        def on_timer(self, now: float) -> float | None:
            return now + 10.0

        def on_closing(self) -> None:
            pass

    store.open()
    pool.start()
    loop = OwnerLoop(Kept(), name="kept worker", submit_timeout=5.0)
    loop.start()
    threading.Event().wait()  # until the harness stops it


def flat_worker(path: str, port: int, folder: str) -> None:
    """zfab's worker's per-job features, written flat on zfab's own parts: what a rewrite of its
    handlers that keeps every feature could reach (issue 40). On the owner, a POST is checked as the
    decoder checks it, heard (the keepalive), looked up among the recent and the stored jobs, tested
    for a shared-memory handle, read and checked (`payloads.read_post_body`), its task looked up, the
    room and the draining checked, its meta frame read (deadline, queued, trace context, host), its
    retry policy taken, its `Job` made whole and kept, its receipt journalled with its 201's gate,
    then started; each timer pass reads the keepalive and sends the 201s due. On a pool thread: the
    contact gate, the claim, the 201 (held as zfab's), the wait histogram, the deadline and cancel
    checks, the arguments bound (`TaskSpec.bind`), the run histogram and run-time average, the result
    entry, its size bound, the recent table's bytes, the outcome counts, the store's bound, the hop
    trace, the result journalled before the report. No error paths: a floor, not a worker."""
    import threading

    import msgspec
    import zmq

    from zfab.core import hoptrace, payloads, shmhandle, sizes
    from zfab.core.keepalive import KeepAlive
    from zfab.core.schemacheck import is_number
    from zfab.transport.base import Frames
    from zfab.transport.loop import OwnerLoop
    from zfab.worker.job import Job, JobState
    from zfab.worker.jobstore import JobStore
    from zfab.worker.notices import StartedNotices
    from zfab.worker.pool import JobPool
    from zfab.worker.recent import RecentJobs
    from zfab.worker.task import build_spec
    from zfab.worker.taskstats import TaskStats, outcome_label

    def echo(data: Any = None) -> Any:
        return data

    m = _load(path)
    endpoint, decode, encode = f"tcp://127.0.0.1:{port}", msgspec.json.Decoder().decode, msgspec.json.encode
    spec = build_spec("echo", echo, Job)
    tasks, stats = {"echo": spec}, {"echo": TaskStats()}
    max_bytes, store_bytes = 64 << 20, 1 << 20
    store = JobStore(Path(folder) / "flat.sqlite", failure_payload=lambda uuid, task, why: b"{}")
    recent = RecentJobs(max_count=10_000, max_bytes=64 << 20)
    keepalive = KeepAlive(2.5, 6, answering=True)
    touch, lock = threading.Event(), threading.Lock()
    touch.set()
    counts = {"completed": 0, "failed": 0, "finished": 0, "unreported": 0, "received": 0}
    unstored: list[Job] = []
    announce = json.dumps({"v": 2, "name": "w1", "credits": 8, "tasks": {"echo": {}}}).encode()
    run_time = [0.0]

    def emit(job: Job, payload: dict[str, Any]) -> None:
        pass

    def stream_out(job: Job, data: bytes) -> None:
        pass

    def run(job: Job) -> None:  # a pool thread
        if not touch.is_set() or not job.claim():
            return
        job.started_at, job.started_mono = time.time(), time.monotonic()
        if job.ack and job.ack_ready():
            notices.add(job)
        st = stats[job.task]
        st.wait.observe(job.queued_s + max(0.0, job.started_at - job.received_at))
        if job.cancelled or job.expired():
            return
        kwargs = tasks[job.task].bind(job.args, job.kwargs)
        job.args, job.kwargs = [], {}
        job.state = JobState.RUNNING
        t0 = time.monotonic()
        result = tasks[job.task].fn(**kwargs)
        took = time.monotonic() - t0
        st.run.observe(took)
        run_time[0] = took if not run_time[0] else 0.9 * run_time[0] + 0.1 * took
        job.completed_at = time.time()
        completed = time.monotonic()
        entry = payloads.result_entry(
            worker="w1", service=LEAN_SERVICE, uuid=job.uuid, task=job.task, result=result, failed=False,
            status="completed", errors=[], received=job.received_at, started=job.started_at,
            completed=job.completed_at,
        )  # fmt: skip
        payload = encode({"w1": entry})
        if not sizes.fits(len(payload) + len(job.client) + sizes.ENVELOPE_BYTES, max_bytes):
            return
        job.result_payload, job.status_code = payload, b"200"
        recent.result_made(job)
        job.state = JobState.COMPLETED
        outcome = outcome_label(b"200", entry)
        with lock:
            counts["finished"] += 1
            counts["completed"] += 1
            st.outcomes[outcome] += 1
        kept = payload if len(payload) <= store_bytes else b"{}"
        op = store.result_op(job, "200", kept)
        trace = hoptrace.worker_frame(
            job.received_mono, job.started_mono, completed, time.monotonic(), hoptrace.OUTCOME_COMPLETED
        )
        frames = [b"", m.W, m.RESPONSE, job.client, b"", job.uuid.encode(), b"200", payload, trace]

        def report() -> None:
            loop.submit(frames, timeout=0)
            with lock:
                counts["unreported"] -= 1

        with lock:
            counts["unreported"] += 1
        store.write(op, report, timeout=0)

    pool: JobPool[Job] = JobPool(run, size=4, capacity=1000, name="flat")

    class Flat:
        def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, b"w1~flat")
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            return sock

        def on_connected(self) -> None:
            loop.send_now([b"", m.W, m.READY, LEAN_SERVICE.encode(), announce])

        def on_frames(self, f: Frames) -> None:  # ["", B, POST, client, "", uuid, body, meta]
            if not (len(f) == 8 and f[0] == b"" and f[1] == m.B and f[2] == m.POST and f[4] == b""):
                return
            if sum(map(len, f)) > max_bytes:
                return
            keepalive.heard(keepalive=False)
            uuid, body = bytes(f[5]).decode(), f[6]
            if recent.get(uuid) is not None or uuid in store.stored_before or shmhandle.is_handle(body):
                return
            req = payloads.read_post_body(body)
            task = tasks.get(req.task)
            if task is None or task.is_async or pool.depth() + len(unstored) >= pool.capacity:
                return
            meta = decode(f[7])
            if type(meta) is not dict:
                return
            timeout, queued = req.timeout, 0.0
            left, held = meta.get("deadline"), meta.get("queued")
            if is_number(left) and left >= 0:
                timeout = max(1e-3, float(left))
            if is_number(held) and held >= 0:
                queued = float(held)
            if "traceparent" in meta:
                return
            shm_reply = meta.get("host") == "not ours"
            job = Job(
                uuid=uuid, client=bytes(f[3]), task=req.task, args=req.args, kwargs=req.kwargs, timeout=timeout,
                push=req.push, ack=req.ack, request=bytes(body) if len(body) <= store_bytes else b"",
                queued_s=queued, attempt=req.attempt, retry=task.retry_policy(req.retries, req.backoff),
                traced=True, shm_reply=shm_reply, emit=emit, stream_out=stream_out,
            )  # fmt: skip
            counts["received"] += 1
            unstored.append(job)
            recent.add(job)

        def on_batch_end(self) -> None:
            touch.set()
            if not unstored:
                return
            batch = unstored[:]
            unstored.clear()
            rows = [(j.uuid, j.client, j.task, j.request, j.received_at) for j in batch]
            acks = [j for j in batch if j.ack]

            def acknowledge() -> None:
                for job in acks:
                    if job.ack_ready():
                        notices.add(job)

            store.write(store.insert_op(rows), acknowledge if acks else None, timeout=0.5)
            for job in batch:
                pool.put(job)

        def on_timer(self, now: float) -> float | None:
            if keepalive.expired():
                return now + 1.0
            if keepalive.due():
                keepalive.mark_sent()  # zfab's worker sends its KEEPALIVE here; a deadline past would spin the loop
            due, nxt = notices.due(now)
            for job in due:
                if not job.state.final:
                    status = payloads.worker_status("w1", LEAN_SERVICE, job.uuid, "ACCEPTED", age=0.0)
                    loop.send_now([b"", m.W, m.RESPONSE, job.client, b"", job.uuid.encode(), b"201", encode(status)])
            at = keepalive.next_deadline()
            return at if nxt is None else min(at, nxt)

        def on_closing(self) -> None:
            pass

    store.open()
    pool.start()
    loop = OwnerLoop(Flat(), name="flat worker", submit_timeout=5.0)
    notices = StartedNotices(loop=loop, clock=time.monotonic)
    loop.start()
    threading.Event().wait()  # until the harness stops it


def lean_client(path: str, port: int, service: str, n: int) -> None:
    """nfp_floor's client (its Owner, its frames, a Future per job), sequential only."""
    import zmq

    m = _load(path)
    m.EP = f"tcp://127.0.0.1:{port}"
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

    _timed(submit, n)


def zfab_client(endpoint: str, service: str, n: int) -> None:
    from zfab import Client

    with Client(broker=endpoint, name="swap") as c:
        _timed(lambda i, timeout: c.run_job(service, "echo", kwargs={"data": i}, timeout=timeout), n)


# ---------------------------------------------------------------- one setup


def _me(*args: object) -> list[str]:
    return [sys.executable, "-m", "bench.swap", *map(str, args)]


def _client(*args: object) -> float:
    """A client role of this module in a child process: its p50, ms."""
    figures = _child([str(a) for a in args], module="bench.swap")
    if "p50_ms" not in figures:
        raise RuntimeError(f"{args[0]} printed no p50_ms: {figures}")
    return figures["p50_ms"]


def run_setup(setup: str, nfp: Path, tmp: str, n: int) -> float:
    """One setup's p50 in ms: a name of SETUPS, or "client/broker/worker" (`--mix`)."""
    env = {"PYTHONPATH": str(ROOT)}
    client, broker, worker = SETUPS[setup] if setup in SETUPS else setup.split("/")
    service = "demo" if worker == "zfab" else LEAN_SERVICE
    with Fabric(tmp) as fab:
        port = int(fab.endpoint.rsplit(":", 1)[1])
        procs: list[subprocess.Popen[bytes]] = []
        try:
            if broker == "zfab":
                fab.start_broker()
            else:
                procs.append(spawn(_me(f"{broker}-broker", nfp, port), env))
            if not wait_for(lambda: _listening(port), 20):
                raise RuntimeError(f"{setup}: no broker on port {port} within 20 s")
            if worker == "zfab":
                fab.start_worker("sw1")
            elif worker == "lean":
                procs.append(spawn(_me("lean-worker", nfp, port), env))
            else:
                procs.append(spawn(_me(f"{worker}-worker", nfp, port, tmp), env))
            if client == "lean":
                return _client("lean-client", nfp, port, service, n)
            return _client("zfab-client", fab.endpoint, service, n)
        finally:
            stop(procs)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def run(n_rounds: int, n: int, setups: tuple[str, ...] = tuple(SETUPS)) -> dict[str, list[float]]:
    nfp = shared_file("nfp_floor.py", "ZFAB_NFP_FLOOR")
    if nfp is None:
        raise RuntimeError("nfp_floor.py not found beside the checkout (set ZFAB_NFP_FLOOR)")
    out: dict[str, list[float]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory(prefix="zfab-swap-") as base:
        for r in range(n_rounds):
            for s in setups:
                out[s].append(run_setup(s, nfp, f"{base}/{r}-{s.replace(' ', '-')}", n))
            print(f"round {r + 1}: " + ", ".join(f"{s} {out[s][-1]:.3f}" for s in setups), flush=True)
    return out


def summarize(out: dict[str, list[float]]) -> None:
    """The medians, and what they say; a line whose setups did not run (`--only`) is left out."""
    med = {s: statistics.median(v) for s, v in out.items()}
    whole = med["zfab"] - med["lean"]
    print(f"sequential p50, medians of {len(out['zfab'])} rounds (ms):")
    ratio = med["zfab"] / med["lean"]
    print(f"  zfab {med['zfab']:.3f}   lean {med['lean']:.3f}   gap {whole * 1e3:.0f} us ({ratio:.2f}x)")
    for role in ("client", "broker", "worker"):
        if (lean := med.get(f"lean {role}")) is not None:
            print(f"  zfab's {role:6}: {(med['zfab'] - lean) * 1e3:4.0f} us  (p50 with a lean {role}: {lean:.3f} ms)")
    if (parts := med.get("kept worker (zfab's parts)")) is not None:
        gain = (parts - med["zfab"]) * 1e3
        print(f"  kept worker on zfab's parts: p50 {parts:.3f} ms, {gain:+.0f} us against zfab (the handlers' code)")
    if (flat := med.get("flat worker")) is not None:
        gain = (flat - med["zfab"]) * 1e3
        print(f"  flat worker (every feature): p50 {flat:.3f} ms, {gain:+.0f} us against zfab (layers, not features)")
    if (floor := med.get("flat worker, the rest kept")) is not None:
        print(f"  flat worker, kept broker, lean client: {floor:.3f} ms = {floor / med['lean']:.2f}x all lean")
    for role in ("broker", "worker"):
        if (kept := med.get(f"kept {role}")) is None:
            continue
        line = f"  a lean {role} keeping zfab's per-job promises: p50 {kept:.3f} ms = {kept / med['lean']:.2f}x lean"
        if (lean := med.get(f"lean {role}")) is not None:
            line += f", {(kept - lean) * 1e3:+.0f} us against the lean {role}"
        print(line)
    if (kept := med.get("kept")) is not None:
        print(f"  all of them kept, the client lean: {kept:.3f} ms = {kept / med['lean']:.2f}x all lean")
    if (both := med.get("kept (zfab client)")) is not None:
        print(f"  the broker and the worker kept, zfab's client: {both:.3f} ms = {both / med['lean']:.2f}x all lean")
    for setup, p50 in med.items():
        if "/" in setup:
            print(f"  client/broker/worker {setup}: {p50:.3f} ms = {p50 / med['lean']:.2f}x all lean")


def _mix(text: str) -> str:
    """A --mix: client, broker and worker among the roles each can be."""
    parts = text.split("/")
    if len(parts) != 3 or parts[0] not in CLIENTS or parts[1] not in BROKERS or parts[2] not in WORKERS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: CLIENT/BROKER/WORKER, a client of {CLIENTS}, a broker of {BROKERS}, a worker of {WORKERS}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    roles = {
        "lean-broker": lambda a: lean_broker(a[0], int(a[1])),
        "lean-worker": lambda a: lean_worker(a[0], int(a[1])),
        "kept-broker": lambda a: kept_broker(a[0], int(a[1])),
        "flat-broker": lambda a: flat_broker(a[0], int(a[1])),
        "kept-worker": lambda a: kept_worker(a[0], int(a[1]), a[2]),
        "parts-worker": lambda a: kept_worker_on_zfab(a[0], int(a[1]), a[2]),
        "flat-worker": lambda a: flat_worker(a[0], int(a[1]), a[2]),
        "lean-client": lambda a: lean_client(a[0], int(a[1]), a[2], int(a[3])),
        "zfab-client": lambda a: zfab_client(a[0], a[1], int(a[2])),
    }
    if argv and argv[0] in roles:
        roles[argv[0]](argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.swap", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=2000, help="sequential jobs per setup and round")
    p.add_argument(
        "--only",
        action="append",
        choices=tuple(SETUPS),
        metavar="SETUP",
        help="run this setup (repeatable; zfab, lean always run)",
    )
    p.add_argument(
        "--mix",
        action="append",
        type=_mix,
        metavar="CLIENT/BROKER/WORKER",
        help=f"run these roles, as {'/'.join(SETUPS['flat worker, the rest kept'])} (repeatable)",
    )
    a = p.parse_args(argv)
    chosen = ("zfab", *(a.only or ()), *(a.mix or ()), "lean")
    setups = tuple(SETUPS) if not (a.only or a.mix) else tuple(dict.fromkeys(chosen))
    summarize(run(a.rounds, a.n, setups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
