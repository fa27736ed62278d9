"""`zfab up`: a whole fabric on this machine (broker, demo workers, API) as child processes."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time

from .common import catch_stop_signals, settings_of, setup_logging

log = logging.getLogger("zfab")


UP_API_DEADLINE = 30.0


def _api_answers(url: str, timeout: float = 1.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= int(r.status) < 300
    except Exception:
        return False


def cmd_up(ns: argparse.Namespace) -> int:
    """A broker, N demo workers and the API as child processes; Ctrl-C stops them all."""
    s = settings_of(ns)
    setup_logging(s.log_level)
    exe = [sys.executable, "-m", "zfab.cli"]
    env = dict(os.environ)
    env["ZFAB_BROKER"] = s.broker
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(args: list[str]) -> None:
        procs.append(subprocess.Popen(exe + args, env=env))

    def first_dead() -> subprocess.Popen[bytes] | None:
        return next((p for p in procs if p.poll() is not None), None)

    stop = catch_stop_signals()  # before the first spawn: a Ctrl-C from now on stops them all
    spawn(["broker", "--endpoint", s.bind_endpoint])
    for i in range(1, ns.workers + 1):
        spawn(["worker", "--service", "demo", "--name", f"demo-{i}"])
    if ns.api_port:
        spawn(["api", "--host", ns.api_host, "--port", str(ns.api_port)])
    try:
        if ns.api_port:
            # The banner tells the user where to go: only once the API answers there.
            local = "127.0.0.1" if ns.api_host in ("0.0.0.0", "", "::") else ns.api_host
            base = f"http://{local}:{ns.api_port}"
            deadline = time.monotonic() + UP_API_DEADLINE
            while not _api_answers(base + "/healthz"):
                if stop.is_set():
                    return 130
                dead = first_dead()
                if dead is not None:
                    print(f"zfab up: a fabric process exited (code {dead.returncode}); stopping", file=sys.stderr)
                    return 1
                if time.monotonic() > deadline:
                    print(f"zfab up: the API did not answer {base}/healthz in {UP_API_DEADLINE:g} s", file=sys.stderr)
                    return 1
                stop.wait(0.2)
        print(f"zfab up: broker {s.bind_endpoint}, {ns.workers} demo worker(s)", flush=True)
        if ns.api_port:
            print(f"  console  {base}/ui   (jobs, queues, workers, schedules in a browser)", flush=True)
            print(f"  API      {base}/docs   health {base}/healthz   metrics {base}/metrics", flush=True)
            print(
                f"  try:     curl -s -XPOST '{base}/jobs?wait=5' -H 'content-type: application/json' "
                f'-d \'{{"service":"demo","task":"echo","kwargs":{{"data":"hi"}}}}\'',
                flush=True,
            )
            print(f'           ZFAB_API_URL={base} zfab submit demo echo --kwargs \'{{"data": "hi"}}\'', flush=True)
        while not stop.wait(0.5):
            dead = first_dead()
            if dead is not None:
                log.error("a fabric process exited (code %s); stopping the rest", dead.returncode)
                return 1
        return 0
    finally:
        # Clients and workers first, the broker last: workers drain and say DISCONNECT to a
        # broker that is still there, instead of being told to re-register by a leaving one.
        for group in (procs[1:], procs[:1]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for p in group:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        print("zfab up: stopped", flush=True)
