"""Roles `bench/swap.py` runs on zfab's own parts, each in a process of its own (issue 40): the kept
worker's handlers on zfab's owner loop, pool and job store (`kept_worker_on_zfab`), and the broker and
the worker with every per-job feature of zfab's, written flat (`flat_broker`, `flat_worker`): the
floor of a rewrite of their hot paths that keeps every feature. No error paths: floors, not roles."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import zmq

from bench.swaproles import LEAN_SERVICE
from bench.versus import _load


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, identity: bytes) -> zmq.Socket[bytes]:
    """A worker role's DEALER."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


# The worker roles' READY: a zfab worker's (`v: 2`), so the broker sends meta frames and reads hop traces.
ANNOUNCE = json.dumps({"v": 2, "name": "w1", "credits": 8, "tasks": {"echo": {}}}).encode()


class _Role:
    """What a role here does not need of the owner loop's contract: nothing on connect, batch end or close."""

    def on_connected(self) -> None:
        pass

    def on_batch_end(self) -> None:
        pass

    def on_closing(self) -> None:
        pass


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

    from zfab.broker.admission import read_job
    from zfab.broker.jobqueue import QueuedJob
    from zfab.core import hoptrace, payloads
    from zfab.core import protocol as nfp
    from zfab.core.histogram import Histogram
    from zfab.core.keepalive import KeepAlive
    from zfab.settings import Settings
    from zfab.transport.base import Frames
    from zfab.transport.loop import OwnerLoop

    del path  # nfp_floor's frames are not needed: zfab's own are used
    max_bytes, max_routes, seq = 64 << 20, 100_000, iter(range(1 << 62))
    workers: dict[bytes, dict[str, Any]] = {}  # identity -> name, service, credits, inflight, keepalive
    services: dict[bytes, dict[str, Any]] = {}  # name -> tasks, workers, queued histogram
    clients: dict[bytes, float] = {}  # zfab's is bounded; a setup has one client
    routes: dict[bytes, tuple[QueuedJob, bytes, float]] = {}  # uuid -> job, worker identity, deadline
    route_expiry: list[tuple[float, bytes]] = []
    finished: OrderedDict[bytes, bytes] = OrderedDict()
    # Looked up as zfab's broker looks them up on every POST; empty here: nothing queues, no limit, no pause.
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
        limits.get((req.service, job.task))  # the task's rule: none set
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

    class Flat(_Role):
        def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
            sock = ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(f"tcp://127.0.0.1:{port}")
            return sock

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

    poll = Settings().broker_idle_poll_us / 1e6  # as zfab's broker, from the same setting
    loop = OwnerLoop(Flat(), name="flat broker", submit_timeout=5.0, idle_poll=poll)
    loop.start()
    threading.Event().wait()  # until the harness stops it


def kept_worker_on_zfab(path: str, port: int, folder: str) -> None:
    """`kept_worker`'s handlers on zfab's own parts: the `OwnerLoop` owns its DEALER, a `JobPool` of
    four threads runs the jobs, a `JobStore` journals each receipt before the start and each result
    before the report (and folds them into SQLite), a `Job` is made and kept in `RecentJobs` (uuids
    seen there are not run again), its READY says `v: 2` and each result carries its hop-trace frame,
    so the broker treats it as a zfab worker. What it leaves out is what `kept_worker` leaves out. So it
    tells zfab's machinery from its handlers' code (issue 40)."""
    import threading

    import msgspec

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

    class Kept(_Role):
        def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
            return _dealer(ctx, endpoint, b"w1~kept")

        def on_connected(self) -> None:
            loop.send_now([b"", m.W, m.READY, LEAN_SERVICE.encode(), ANNOUNCE])

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

        def on_timer(self, now: float) -> float | None:
            return now + 10.0

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
    run_time = [0.0]
    shm_host: str | None = None  # no shared-memory tier here

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

    class Flat(_Role):
        def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
            return _dealer(ctx, endpoint, b"w1~flat")

        def on_connected(self) -> None:
            loop.send_now([b"", m.W, m.READY, LEAN_SERVICE.encode(), ANNOUNCE])

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
            shm_reply = shm_host is not None and meta.get("host") == shm_host  # zfab's rule
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

    store.open()
    pool.start()
    loop = OwnerLoop(Flat(), name="flat worker", submit_timeout=5.0)
    notices = StartedNotices(loop=loop, clock=time.monotonic)
    loop.start()
    threading.Event().wait()  # until the harness stops it
