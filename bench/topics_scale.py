"""The full-scale checks of issue 30, part 1 (event subscriptions), each bounded to a few minutes.

    python -m bench.topics_scale sse [--jobs 100000]     (a)
    python -m bench.topics_scale slow [--seconds 60]     (b)

(a) `sse`: a broker with ZFAB_BROKER_EVENTS, two demo workers and one demo-async worker, and a real
`zfab api` process (bearer token on). A reader process streams `GET /events?topic=job.demo.` over
HTTP (stdlib http.client, so it costs the machine little) while this process pipelines `--jobs`
demo jobs (window 500) through a `Client`: echo, and one in 100 a 20 ms sleep (so `running` is
published too), with one demo-async `nap` for every 10 of them. The
reader checks, per job: `queued` first, then `running` (absent when the job ends within the
worker's 10 ms hold of its 201), then one final state, nothing after it; every job seen; no event
of another service; `event: gap` announcements and gaps in each topic's `tseq` counted.

(b) `slow`: a broker with events on, two demo workers, pipelined demo echo for fixed-length
trials, alternating: no subscriber, then a SUB to `job.` that reads nothing for the whole trial
(`--seconds`). Jobs/s and the broker's CPU per job of each trial; after each idle trial the SUB is
drained and its losses counted from the gaps in each topic's `tseq`, next to the broker's own
zfab_broker_events_dropped_total (its hand-off queue) and _published_total.

Both print the machine's load average at the start and the end (the machine may be shared).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, free_port, report
from bench.harness import Fabric, wait_mmi_workers

TOKEN = "bench-topics"
FINAL = frozenset({"completed", "failed", "cancelled", "expired", "lost"})
RANK = {"queued": 0, "running": 1, "waiting": 1}  # finals rank 2


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by `name/tid` (/proc/PID/task/*/stat; Python threads are all
    named `python` there: the broker's loop is the busiest, its event publisher the one idle without
    a subscriber)."""
    out: dict[str, float] = {}
    clk = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            raw = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / clk
    return out


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def metrics(port: int) -> dict[str, float]:
    """Prometheus text as {name{labels}: value} (enough for counters and gauges)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


# ---------------------------------------------------------------------------------- (a) the reader


class Check:
    """What the SSE reader saw, checked as it comes."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}  # uuid -> rank of its latest state
        self.events = self.finals = self.running = self.foreign = self.order = self.after_final = 0
        self.gap_events = self.gap_missed = self.tseq_missed = 0
        self.tseq: dict[str, int] = {}
        self.states: dict[str, int] = {}

    def event(self, kind: str, data: str) -> None:
        if kind == "gap":
            self.gap_events += 1
            self.gap_missed += int(json.loads(data).get("missed", 0))
            return
        e = json.loads(data)
        self.events += 1
        topic, state, uuid = e.get("topic", ""), e.get("state", ""), e.get("uuid", "")
        if e.get("service") != "demo" or not topic.startswith("job.demo."):
            self.foreign += 1
            return
        last_t = self.tseq.get(topic)
        if last_t is not None and e["tseq"] > last_t + 1:
            self.tseq_missed += e["tseq"] - last_t - 1
        self.tseq[topic] = e["tseq"]
        self.states[state] = self.states.get(state, 0) + 1
        rank = 2 if state in FINAL else RANK.get(state, -1)
        prev = self.last.get(uuid)
        if prev == 2:
            self.after_final += 1
        elif (prev is None and state != "queued") or (prev is not None and rank <= prev):
            self.order += 1
        self.last[uuid] = rank
        if rank == 2 and prev != 2:
            self.finals += 1
        self.running += state == "running"

    def summary(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "jobs_seen": len(self.last),
            "jobs_final": self.finals,
            "jobs_unfinished": sum(1 for r in self.last.values() if r != 2),
            "running_seen": self.running,
            "states": self.states,
            "foreign": self.foreign,
            "order_violations": self.order,
            "events_after_final": self.after_final,
            "gap_events": self.gap_events,
            "gap_missed": self.gap_missed,
            "tseq_missed": self.tseq_missed,
        }


def reader(port: int, prefix: str, expect: int, idle: float, deadline_s: float) -> None:
    """Streams GET /events?topic=prefix, prints `ready` once subscribed, then one JSON summary line."""
    check = Check()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=idle)
    conn.request("GET", f"/events?topic={prefix}", headers={"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    if resp.status != 200:
        print(json.dumps({"error": f"HTTP {resp.status}: {resp.read()[:500]!r}"}), flush=True)
        return
    deadline = time.monotonic() + deadline_s
    kind, data = "", ""
    why = "deadline"
    last_data = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if time.monotonic() - last_data > idle:  # (pings every ZFAB_SSE_PING_SECONDS wake the read)
                why = f"no event for {idle} s"
                break
            line = resp.readline()
            if not line:
                why = "stream ended"
                break
            s = line.rstrip(b"\r\n").decode()
            if not s:
                if data:
                    last_data = time.monotonic()
                    check.event(kind, data)
                    if check.finals >= expect:
                        why = "all final"
                        break
                kind, data = "", ""
            elif s.startswith("data: "):
                data = s[6:]
            elif s.startswith("event: "):
                kind = s[7:]
            elif s == ": subscribed":
                print("ready", flush=True)
    except TimeoutError:
        why = f"no event for {idle} s"
    finally:
        conn.close()
    print(json.dumps({"ended": why, **check.summary()}), flush=True)


def _pipelined(c: Any, n: int, other_every: int, window: int = 500) -> tuple[float, int]:
    """(demo jobs/s, other jobs) of n demo echo jobs, with a demo-async nap every `other_every`."""
    q: deque[Any] = deque()
    others = 0
    t0 = time.perf_counter()
    for i in range(n):
        while len(q) >= window:  # (a while: an iteration may add two)
            q.popleft().result(300)
        if i % 100 == 50:  # runs past the worker's 10 ms hold of its 201: `running` is published too
            q.append(c.submit("demo", "sleep", kwargs={"seconds": 0.02}, timeout=300))
        else:
            q.append(c.submit("demo", "echo", kwargs={"data": i}, timeout=300))
        if other_every and i % other_every == 0:
            q.append(c.submit("demo-async", "nap", kwargs={"seconds": 0}, timeout=300))
            others += 1
    while q:
        q.popleft().result(300)
    return n / (time.perf_counter() - t0), others


def run_sse(jobs: int) -> dict[str, Any]:
    from zfab import Client, Settings

    print(f"load average at start: {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="zfab-bench-topics-sse-") as tmp:
        events, mport = f"tcp://127.0.0.1:{free_port()}", free_port()
        with Fabric(tmp, ZFAB_BROKER_EVENTS=events) as fab:
            fab.start_broker(ZFAB_METRICS_PORT=str(mport))
            fab.start_worker("demo-1")
            fab.start_worker("demo-2")
            fab.start_worker("async-1", "demo-async")
            api_port = free_port()
            fab.start_api(api_port, ZFAB_API_TOKENS=TOKEN, ZFAB_SSE_PING_SECONDS="2")
            with Client(settings=Settings(broker=fab.endpoint), name="bench") as c:
                wait_mmi_workers(c, 3)
                _wait_api(api_port)
                cmd = [sys.executable, "-m", "bench.topics_scale", "reader", "--port", str(api_port)]
                cmd += ["--expect", str(jobs)]
                env = {**os.environ, "PYTHONPATH": fab.env.get("PYTHONPATH", "")}
                rd = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
                try:
                    assert rd.stdout is not None
                    first = rd.stdout.readline().strip()  # (the reader's own timeouts bound this)
                    if first != "ready":
                        raise RuntimeError(f"the SSE reader did not subscribe: {first!r}")
                    cpu0 = cpu_seconds(fab.pids()["broker"])
                    t0 = time.monotonic()
                    jps, others = _pipelined(c, jobs, 10)
                    took = time.monotonic() - t0
                    cpu = cpu_seconds(fab.pids()["broker"]) - cpu0
                    out_line = rd.stdout.readline()
                    rd.wait(30)
                finally:
                    if rd.poll() is None:
                        rd.kill()
                        rd.wait(5)
                seen = json.loads(out_line) if out_line else {"error": "no summary"}
                bm = metrics(mport)
                am = _api_metrics(api_port)
    res: dict[str, Any] = {
        "jobs": jobs,
        "other_jobs": others,
        "seconds": round(took, 1),
        "demo_jobs_per_s": round(jps),
        "broker_cpu_us_per_job": round(cpu / (jobs + others) * 1e6),
        "reader": seen,
        "broker_events_published": bm.get("zfab_broker_events_published_total"),
        "broker_events_dropped": bm.get("zfab_broker_events_dropped_total"),
        "api_events_missed": am.get("zfab_api_events_missed_total"),
    }
    print(json.dumps(res, indent=1))
    print(f"load average at end: {loadavg()}", flush=True)
    return res


def _wait_api(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)  # a bench's wait for a process it started, with its deadline above
    raise RuntimeError(f"the API on {port} was not ready within {timeout} s")


def _api_metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("zfab_api_events"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# ---------------------------------------------------------------------------- (b) reading nothing


def _for(c: Any, seconds: float, window: int = 500) -> float:
    """Jobs/s of pipelined demo echo for `seconds`."""
    q: deque[Any] = deque()
    done = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    i = 0
    while time.perf_counter() < end:
        if len(q) >= window:
            q.popleft().result(120)
            done += 1
        q.append(c.submit("demo", "echo", kwargs={"data": i}, timeout=120))
        i += 1
    while q:
        q.popleft().result(120)
        done += 1
    return done / (time.perf_counter() - t0)


def _read(sock: Any, quiet: float, limit: float, last: dict[str, int], first: list[int]) -> tuple[int, int]:
    """(messages, tseq gaps) read from a SUB until nothing came for `quiet` seconds (or `limit`)."""
    import zmq

    got = missed = 0
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not sock.poll(int(quiet * 1000)):
            break
        while True:
            try:
                _, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            e = json.loads(body)
            if "tseq" not in e:
                continue  # the welcome
            got += 1
            if not first:
                first.append(e["seq"])
            t = last.get(e["topic"])
            if t is not None and e["tseq"] > t + 1:
                missed += e["tseq"] - t - 1
            last[e["topic"]] = e["tseq"]
    return got, missed


def _losses(c: Any, sock: Any) -> tuple[int, int, int]:
    """(received, lost) of a SUB left unread: what its pipe held, read now, then the events of 100
    jobs run after it is empty, whose tseq shows how many of each topic never reached it."""
    last: dict[str, int] = {}
    first: list[int] = []
    got, missed = _read(sock, 0.5, 30, last, first)
    after = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(100)]
    for fut in after:
        fut.result(60)
    more, gaps = _read(sock, 0.5, 10, last, first)
    return got + more, missed + gaps, first[0] if first else -1


def _all_cpu(fab: Fabric) -> float:
    """CPU seconds so far of the fabric's processes and of this one (the client)."""
    t = os.times()
    return sum(cpu_seconds(p) for p in fab.pids().values()) + t.user + t.system


def run_slow(seconds: float, pairs: int) -> dict[str, Any]:
    import zmq

    from zfab import Client, Settings

    print(f"load average at start: {loadavg()}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="zfab-bench-topics-slow-") as tmp:
        events, mport = f"tcp://127.0.0.1:{free_port()}", free_port()
        with Fabric(tmp, ZFAB_BROKER_EVENTS=events) as fab:
            fab.start_broker(ZFAB_METRICS_PORT=str(mport))
            fab.start_worker("demo-1")
            fab.start_worker("demo-2")
            with Client(settings=Settings(broker=fab.endpoint), name="bench") as c:
                wait_mmi_workers(c, 2)
                _for(c, 3)  # warm up
                pid = fab.pids()["broker"]
                ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
                for _ in range(pairs):
                    for phase in ("none", "idle"):
                        idle = None
                        if phase == "idle":
                            idle = ctx.socket(zmq.SUB)  # owned by this thread; not read during the trial
                            idle.setsockopt(zmq.LINGER, 0)
                            idle.connect(events)
                            idle.setsockopt(zmq.SUBSCRIBE, b"job.")
                            if not idle.poll(5000):  # its welcome: subscribed (then left unread)
                                raise RuntimeError("the idle subscriber was not confirmed")
                            welcome = json.loads(idle.recv_multipart()[1])
                        m0, cpu0, th0, all0 = metrics(mport), cpu_seconds(pid), thread_cpu(pid), _all_cpu(fab)
                        t0 = time.monotonic()
                        jps = _for(c, seconds)
                        took = time.monotonic() - t0
                        m1, cpu, th1 = metrics(mport), cpu_seconds(pid) - cpu0, thread_cpu(pid)
                        all_cpu = _all_cpu(fab) - all0
                        row: dict[str, Any] = {"phase": phase, "jobs_per_s": round(jps), "seconds": round(took, 1)}
                        jobs = jps * took
                        row["broker_cpu_us_per_job"] = round(cpu / jobs * 1e6)
                        # Broker, workers and this client together: on a machine whose cores they fill,
                        # jobs/s goes as 1 / this, a steadier figure than jobs/s on a shared machine.
                        row["fabric_cpu_us_per_job"] = round(all_cpu / jobs * 1e6)
                        # by thread: the loop, the publisher, libzmq's I/O thread (ZMQbg/IO/0)...
                        row["by_thread_us_per_job"] = {
                            k: round((v - th0.get(k, 0.0)) / jobs * 1e6)
                            for k, v in th1.items()
                            if v - th0.get(k, 0.0) > 0
                        }
                        row["published"] = int(
                            m1["zfab_broker_events_published_total"] - m0.get("zfab_broker_events_published_total", 0)
                        )
                        row["handoff_dropped"] = int(
                            m1["zfab_broker_events_dropped_total"] - m0.get("zfab_broker_events_dropped_total", 0)
                        )
                        if idle is not None:
                            got, missed, first = _losses(c, idle)
                            # events offered between its welcome and the first it read: none lost there
                            row["idle_sub_welcome_seq"], row["idle_sub_first_seq"] = welcome["seq"], first
                            row["idle_sub_received"], row["idle_sub_missed_tseq"] = got, missed
                            idle.close(0)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    none = [r["jobs_per_s"] for r in rows if r["phase"] == "none"]
    idle_ = [r["jobs_per_s"] for r in rows if r["phase"] == "idle"]
    res = {"trials": rows, "none_median": statistics.median(none), "idle_median": statistics.median(idle_)}
    report(
        "pipelined jobs/s, a subscriber reading nothing",
        res["idle_median"],
        "/s",
        res["none_median"],
        vs="no subscriber",
    )
    cpu_none = statistics.median(r["fabric_cpu_us_per_job"] for r in rows if r["phase"] == "none")
    cpu_idle = statistics.median(r["fabric_cpu_us_per_job"] for r in rows if r["phase"] == "idle")
    report(
        "fabric CPU per job, a subscriber reading nothing",
        cpu_idle,
        "us",
        cpu_none,
        higher_is_better=False,
        vs="no subscriber",
    )
    print(f"load average at end: {loadavg()}", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("sse", help="(a) 100,000 demo jobs against an SSE subscriber to job.demo.")
    a.add_argument("--jobs", type=int, default=100_000)
    b = sub.add_parser("slow", help="(b) a subscriber reading nothing, alternating trials")
    b.add_argument("--seconds", type=float, default=60.0)
    b.add_argument("--pairs", type=int, default=2)
    r = sub.add_parser("reader", help="(the SSE reader process of `sse`)")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--prefix", default="job.demo.")
    r.add_argument("--expect", type=int, required=True)
    r.add_argument("--idle", type=float, default=30.0)
    r.add_argument("--deadline", type=float, default=600.0)
    args = p.parse_args()
    if args.mode == "sse":
        run_sse(args.jobs)
    elif args.mode == "slow":
        run_slow(args.seconds, args.pairs)
    else:
        reader(args.port, args.prefix, args.expect, args.idle, args.deadline)


if __name__ == "__main__":
    main()
