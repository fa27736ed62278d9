"""A NorFab fabric (NorFab's client, two NorFab filesharing workers) on a broker: latency and losses.

With ``--zfab-workers`` the two workers are zfab demo workers instead (a NorFab client of zfab
workers); the broker is then zfab's.

Runs inside the NorFab suite virtualenv (run.py makes it). With ``--broker zfab`` it starts
``zfab broker`` (``--zfab``, the executable) serving the fabric's inventory; with ``--broker norfab``
NorFab starts its own broker. It then measures:

- ``latency``: ``--latency`` jobs one after another, NorFab's ``echo`` task on one worker (``any``),
  each job's ``run_job`` time;
- ``fanout``: ``--jobs`` two-worker jobs (``all``), ``--window`` in flight at once, and counts every
  job whose result lacks either worker's answer.

Prints one JSON line. Exit 1 when an answer is missing or a job failed.

    python norfab_load.py --broker zfab --zfab .venv/bin/zfab --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKERS = ["filesharing-worker-1", "filesharing-worker-2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, deadline: float) -> None:
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise SystemExit(f"broker did not bind port {port} (last: {last!r})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broker", choices=("zfab", "norfab"), default="zfab")
    p.add_argument("--zfab", default="zfab", help="the zfab executable")
    p.add_argument("--latency", type=int, default=50)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--timeout", type=int, default=60, help="per job, seconds")
    p.add_argument("--zfab-workers", action="store_true", help="two zfab demo workers instead of NorFab's")
    opts = p.parse_args()
    logging.basicConfig(level=logging.CRITICAL)

    from norfab.core.nfapi import NorFab

    base = Path(tempfile.mkdtemp(prefix="zfab-norfab-load-"))
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    inventory = {
        "broker": {"endpoint": endpoint, "zmq_auth": False},
        "logging": {"handlers": {"terminal": {"level": "CRITICAL"}, "file": {"level": "CRITICAL"}}},
        "topology": {"broker": opts.broker == "norfab", "workers": WORKERS},
        "workers": {"filesharing-worker-*": [{"service": "filesharing", "base_dir": str(base)}]},
    }
    (base / "inventory.yaml").write_text(json.dumps(inventory))  # JSON is YAML
    broker = None
    if opts.broker == "zfab":
        env = dict(
            os.environ,
            ZFAB_BROKER_INVENTORY=str(base / "inventory.yaml"),
            ZFAB_BROKER_HANDOVER="true",
            ZFAB_DATA_DIR=str(base / "zfab"),
        )
        broker = subprocess.Popen(
            [opts.zfab, "broker", "--endpoint", endpoint, "--metrics-port", "0"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(base / "zfab-broker.log", "wb"),  # noqa: SIM115
        )
        wait_port(port, time.monotonic() + 20)
    workers, service, procs = WORKERS, "filesharing", []
    if opts.zfab_workers:
        workers, service = ["demo-1", "demo-2"], "demo"
        inventory["topology"]["workers"] = []
        (base / "inventory.yaml").write_text(json.dumps(inventory))
        for name in workers:
            env = dict(os.environ, ZFAB_BROKER=endpoint, ZFAB_DATA_DIR=str(base / name))
            procs.append(
                subprocess.Popen(
                    [opts.zfab, "worker", "--service", "demo", "--name", name, "--metrics-port", "0"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    nf = NorFab(inventory=str(base / "inventory.yaml"))
    out: dict[str, Any] = {"broker": opts.broker, "workers": "zfab" if opts.zfab_workers else "norfab"}
    try:
        t0 = time.monotonic()
        nf.start()
        out["start_s"] = round(time.monotonic() - t0, 2)
        client = nf.make_client()
        # the workers' READY reached the broker
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names = {w.get("name") for w in client.mmi("mmi.service.broker", "show_workers")["results"] or []}
            if set(workers) <= names:
                break
            time.sleep(0.2)
        times = []
        for _ in range(opts.latency):
            t = time.monotonic()
            res = client.run_job(service, "echo", workers="any", timeout=opts.timeout)
            times.append(time.monotonic() - t)
            if not res or len(res) != 1:
                out.setdefault("latency_failures", 0)
                out["latency_failures"] += 1
        out["latency_ms"] = {
            "median": round(1000 * statistics.median(times), 1),
            "p90": round(1000 * sorted(times)[int(0.9 * len(times))], 1),
            "max": round(1000 * max(times), 1),
        }
        lost = failed = 0
        t = time.monotonic()
        pending: list[Any] = []

        def collect(fut: Any) -> None:
            nonlocal lost, failed
            res = fut.result(timeout=opts.timeout)
            if res is None:
                failed += 1
            else:
                lost += len(set(workers) - set(res))

        for i in range(opts.jobs):
            kwargs = {"data": i} if opts.zfab_workers else {"i": i}
            pending.append(client.submit_job(service, "echo", kwargs=kwargs, workers="all", timeout=opts.timeout))
            if len(pending) >= opts.window:
                collect(pending.pop(0))
        for fut in pending:
            collect(fut)
        wall = time.monotonic() - t
        out["fanout"] = {"jobs": opts.jobs, "answers_missing": lost, "jobs_failed": failed, "seconds": round(wall, 1)}
        out["fanout"]["jobs_per_s"] = round(opts.jobs / wall, 1)
    finally:
        nf.destroy()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        if broker is not None:
            broker.terminate()
            broker.wait(timeout=10)
    print(json.dumps(out))
    ok = not out["fanout"]["answers_missing"] and not out["fanout"]["jobs_failed"] and "latency_failures" not in out
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
