"""The trust figures of issue 10, measured through the CLI, HTTP and a raw socket only, so the same
module measures any checkout of zfab (an older commit's venv too):

    python -m bench.trust --zfab /path/to/venv/bin/zfab --python /path/to/venv/bin/python [--json out.json]

(a) /metrics of `zfab api` after 6,000 POST /jobs with distinct bogus service names: bytes, lines;
(b) broker RSS after 100,000 READY frames with new service names from one raw DEALER
    ([b"", b"NFPW01", b"0x01", b"svc-<i>"]), beside its RSS before;
(c) API RSS after 30 jobs that each emit 10,000 events (demo progress, steps=10000, delay=0, the
    task's cap), one at a time through POST /jobs?wait;
(d) worker RSS after 40 jobs with 4 MB results (demo echo of a 4 MB string, one at a time, from
    a zfab Client run by --python);
(e) time for a zfab Client (run by --python) to get an answer for an echo whose result is just
    over ZFAB_MAX_MESSAGE_BYTES=1 MiB (data of limit - 300 bytes), with the job's timeout 30 s.

Each step runs on a fresh fabric of that checkout's processes and is bounded in time; a step that
fails or hangs is reported as such and the others go on. Children run with the checkout's own
interpreter, outside this tree (cwd is a temporary directory, `python -I`), so an older checkout
measures its own code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import zmq

from bench.common import cpu_seconds, dump_json, report
from bench.harness import Fabric, http_json, log_tail, rss_bytes

LIMIT = 1024 * 1024
#: Run by the checkout's python (-I, cwd outside any tree): a zfab Client doing one kind of job.
CLIENT_SNIPPET = r"""
import json, sys, time
from zfab import Client
mode, ep, arg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
with Client(broker=ep, name="trust") as c:
    deadline = time.monotonic() + 30
    while True:
        try:
            c.run_job("demo", "echo", kwargs={"data": "warm"}, timeout=5)
            break
        except Exception as exc:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    if mode == "big-results":
        data = "r" * arg["size"]
        times = []
        for i in range(arg["jobs"]):
            t = time.perf_counter()
            r = c.run_job("demo", "echo", kwargs={"data": data}, timeout=60)
            times.append(time.perf_counter() - t)
            assert len(next(iter(r.values()))["result"]) == len(data)
        out["seconds"] = times
    elif mode == "oversize":
        data = "o" * arg["size"]
        t = time.perf_counter()
        try:
            r = c.run_job("demo", "echo", kwargs={"data": data}, timeout=arg["timeout"])
            entry = next(iter(r.values()))
            out["outcome"] = "failed result" if entry.get("failed") else "result delivered"
            out["detail"] = " ".join(str(e) for e in (entry.get("errors") or []))[:200]
        except Exception as exc:
            out["outcome"] = type(exc).__name__
            out["detail"] = str(exc)[:200]
        out["seconds"] = time.perf_counter() - t
print("TRUSTJSON " + json.dumps(out), flush=True)
"""


def _client(python: str, fab: Fabric, mode: str, arg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(fab.env)
    env.pop("PYTHONPATH", None)
    r = subprocess.run(
        [python, "-I", "-c", CLIENT_SNIPPET, mode, fab.endpoint, json.dumps(arg)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=fab.tmp,
        env=env,
    )
    for line in r.stdout.splitlines():
        if line.startswith("TRUSTJSON "):
            out: dict[str, Any] = json.loads(line[len("TRUSTJSON ") :])
            return out
    raise RuntimeError(f"client {mode} exited {r.returncode}: {r.stderr[-800:]}")


def _settled_rss(pid: int, timeout: float = 60.0) -> int:
    """RSS once the process has stopped using CPU (two quiet 0.5 s windows in a row)."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline and quiet < 2:
        c0 = cpu_seconds(pid)
        time.sleep(0.5)
        quiet = quiet + 1 if cpu_seconds(pid) - c0 < 0.02 else 0
    return rss_bytes(pid)


def _fabric(tmp: Path, zfab: str, tag: str, **env: str) -> Fabric:
    fab = Fabric(tmp / tag, zfab=zfab, **env)
    fab.env["PYTHONPATH"] = ""
    return fab


# ------------------------------------------------------------------------ the steps


def metrics_after_bogus(tmp: Path, zfab: str, n: int) -> dict[str, Any]:
    with _fabric(tmp, zfab, "a") as fab:
        fab.start_broker()
        fab.start_worker("trust-w1")
        fab.start_api()
        fab.wait_api_workers(1)
        time.sleep(7.0)  # past a broker's startup grace, so unknown services are unknown
        st, _, before = http_json(fab.api_url + "/metrics")
        statuses: dict[int, int] = {}
        lock = threading.Lock()
        stop_at = time.monotonic() + 300

        def post(i: int) -> None:
            if time.monotonic() > stop_at:
                return
            s, _, _ = http_json(
                fab.api_url + "/jobs", {"service": f"bogus-{i}", "task": "echo", "kwargs": {}}, timeout=20
            )
            with lock:
                statuses[s] = statuses.get(s, 0) + 1

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(post, range(n)))
        post_s = time.monotonic() - t0
        time.sleep(3.0)
        st, _, after = http_json(fab.api_url + "/metrics", timeout=60)
        assert fab.api is not None
        api_rss = rss_bytes(fab.api.pid)
    return {
        "metrics_bytes_before": len(before),
        "metrics_bytes": len(after),
        "metrics_status": st,
        "metrics_lines": after.count(b"\n"),
        "post_statuses": statuses,
        "post_s": post_s,
        "api_rss": api_rss,
    }


def broker_after_readys(tmp: Path, zfab: str, n: int) -> dict[str, Any]:
    with _fabric(tmp, zfab, "b") as fab:
        broker = fab.start_broker()
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.SNDTIMEO, 5000)
            sock.setsockopt(zmq.IDENTITY, b"trust-flood")
            sock.connect(fab.endpoint)
            time.sleep(1.5)
            rss0 = _settled_rss(broker.pid)
            t0 = time.monotonic()
            for i in range(n):
                sock.send_multipart([b"", b"NFPW01", b"0x01", b"svc-%d" % i])
                if time.monotonic() - t0 > 120:
                    break
            sent = i + 1
            # Drain what the broker answered (DISCONNECTs, keepalives) until it has been quiet for 0.5 s.
            end = time.monotonic() + 120
            got = 0
            while time.monotonic() < end and sock.poll(500):
                while True:
                    try:
                        sock.recv_multipart(zmq.NOBLOCK)
                        got += 1
                    except zmq.Again:
                        break
            rss1 = _settled_rss(broker.pid, 120)
            flood_s = time.monotonic() - t0
        finally:
            sock.close(0)
            ctx.term()
        services = None
        try:
            r = subprocess.run(
                [*fab.cli, "mmi", "show_services", "--timeout", "20"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **fab.env},
                cwd=fab.tmp,
            )
            services = len(json.loads(r.stdout)) if r.returncode == 0 else f"exit {r.returncode}"
        except (ValueError, subprocess.TimeoutExpired) as exc:
            services = f"unreadable: {type(exc).__name__}"
        if broker.poll() is not None:
            raise RuntimeError("the broker died under the flood" + log_tail([broker]))
    return {
        "broker_rss_before": rss0,
        "broker_rss": rss1,
        "sent": sent,
        "answers": got,
        "flood_s": flood_s,
        "services_listed": services,
    }


def api_after_events(tmp: Path, zfab: str, jobs: int, steps: int) -> dict[str, Any]:
    with _fabric(tmp, zfab, "c") as fab:
        fab.start_broker()
        fab.start_worker("trust-w1")
        api = fab.start_api()
        fab.wait_api_workers(1)
        http_json(fab.api_url + "/jobs?wait=10", {"service": "demo", "task": "echo", "kwargs": {"data": 1}})
        rss0 = _settled_rss(api.pid)
        states: dict[str, int] = {}
        t0 = time.monotonic()
        for _ in range(jobs):
            if time.monotonic() - t0 > 400:
                break
            st, body, _ = http_json(
                fab.api_url + "/jobs?wait=60",
                {"service": "demo", "task": "progress", "kwargs": {"steps": steps, "delay": 0}, "timeout": 120},
                timeout=90,
            )
            key = f"{st} {body.get('state') if isinstance(body, dict) else ''}"
            states[key] = states.get(key, 0) + 1
        run_s = time.monotonic() - t0
        rss1 = _settled_rss(api.pid)
    return {"api_rss_before": rss0, "api_rss": rss1, "answers": states, "run_s": run_s}


def worker_after_big_results(tmp: Path, zfab: str, python: str, jobs: int, size: int) -> dict[str, Any]:
    with _fabric(tmp, zfab, "d") as fab:
        fab.start_broker()
        worker = fab.start_worker("trust-w1")
        time.sleep(1.0)
        rss0 = _settled_rss(worker.pid)
        out = _client(python, fab, "big-results", {"jobs": jobs, "size": size}, timeout=jobs * 60 + 60)
        rss1 = _settled_rss(worker.pid)
    return {"worker_rss_before": rss0, "worker_rss": rss1, "seconds": sum(out["seconds"])}


def oversize_answer(tmp: Path, zfab: str, python: str, timeout: float) -> dict[str, Any]:
    with _fabric(tmp, zfab, "e", ZFAB_MAX_MESSAGE_BYTES=str(LIMIT)) as fab:
        fab.start_broker()
        fab.start_worker("trust-w1")
        out = _client(python, fab, "oversize", {"size": LIMIT - 300, "timeout": timeout}, timeout=timeout + 90)
    return out


def measure(zfab: str, python: str, quick: bool = False, label: str = "") -> dict[str, Any]:
    """Every step, each on a fresh fabric; a failed step is recorded with its error."""
    n_bogus, n_ready, n_ev, steps, n_big = (1000, 20_000, 5, 10_000, 10) if quick else (6000, 100_000, 30, 10_000, 40)
    results: dict[str, Any] = {"zfab": zfab, "label": label}
    tag = f" [{label}]" if label else ""
    with tempfile.TemporaryDirectory(prefix="zfab-bench-trust-") as tmpd:
        tmp = Path(tmpd)
        steps_run = [
            ("a", lambda: metrics_after_bogus(tmp, zfab, n_bogus)),
            ("b", lambda: broker_after_readys(tmp, zfab, n_ready)),
            ("c", lambda: api_after_events(tmp, zfab, n_ev, steps)),
            ("d", lambda: worker_after_big_results(tmp, zfab, python, n_big, 4 * 1024 * 1024)),
            ("e", lambda: oversize_answer(tmp, zfab, python, 30.0)),
        ]
        for key, fn in steps_run:
            t0 = time.monotonic()
            try:
                results[key] = fn()
            except Exception as exc:
                results[key] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
                print(f"   ({key}) failed: {results[key]['error']}", flush=True)
            print(f"   ({key}) took {time.monotonic() - t0:.0f} s", flush=True)
    a, b, c, d, e = (results.get(k, {}) for k in "abcde")
    mb = 1e6
    if "metrics_bytes" in a:
        report(f"(a) /metrics after {n_bogus:,} bogus{tag}", a["metrics_bytes"] / 1000, "kB")
        print(
            f"    {a['metrics_lines']:,} lines (before: {a['metrics_bytes_before'] / 1000:.0f} kB); POST answers "
            f"{a['post_statuses']}; API RSS {a['api_rss'] / mb:.0f} MB",
            flush=True,
        )
    if "broker_rss" in b:
        report(f"(b) broker rss after {b['sent']:,} READY{tag}", b["broker_rss"] / mb, "MB")
        grew = (b["broker_rss"] - b["broker_rss_before"]) / mb
        print(
            f"    before {b['broker_rss_before'] / mb:.0f} MB (+{grew:.0f} MB); "
            f"services listed after: {b['services_listed']}",
            flush=True,
        )
    if "api_rss" in c:
        report(f"(c) api rss after {n_ev} x {steps:,} events{tag}", c["api_rss"] / mb, "MB")
        print(
            f"    before {c['api_rss_before'] / mb:.0f} MB (+{(c['api_rss'] - c['api_rss_before']) / mb:.0f} MB, "
            f"{(c['api_rss'] - c['api_rss_before']) / mb / n_ev:.1f} MB/job); answers {c['answers']}",
            flush=True,
        )
    if "worker_rss" in d:
        report(f"(d) worker rss after {n_big} x 4 MB{tag}", d["worker_rss"] / mb, "MB")
        grew = (d["worker_rss"] - d["worker_rss_before"]) / mb
        print(
            f"    before {d['worker_rss_before'] / mb:.0f} MB (+{grew:.0f} MB, {grew / n_big:.1f} MB/job)", flush=True
        )
    if "seconds" in e:
        report(f"(e) answer to an oversize result{tag}", e["seconds"], "s")
        print(f"    outcome: {e['outcome']}: {e['detail'][:160]}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.trust", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(sys.executable).parent
    p.add_argument("--zfab", default=str(here / "zfab"), help="the checkout's zfab (default: this venv's)")
    p.add_argument("--python", default=sys.executable, help="the checkout's python (default: this one)")
    p.add_argument("--label", default="", help="a name for this checkout in the output")
    p.add_argument("--quick", action="store_true", help="smaller counts")
    p.add_argument("--json", help="also write the figures here")
    ns = p.parse_args(argv)
    print(f"-- trust figures of {ns.zfab}", flush=True)
    res = measure(ns.zfab, ns.python, ns.quick, ns.label)
    if ns.json:
        Path(ns.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
        dump_json(ns.json + ".report.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
