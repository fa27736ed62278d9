"""`zfab up`: a whole fabric on this machine (broker, demo workers, API) as supervised child processes.

It refuses to start when its broker or API port is taken (one line, exit 2), prints its banner only
once the API it started answers /readyz, restarts a child that dies (supervise.py), and stops the
stack in order at Ctrl-C or SIGTERM: workers (draining their jobs for up to --grace), the broker,
the API.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from ..settings import Settings
from .common import UsageError, settings_of, setup_logging
from .supervise import Stage, Supervisor, exit_text

log = logging.getLogger("zfab")


UP_READY_DEADLINE = 60.0  # then a note that it is still waiting
DEFAULT_API = "http://127.0.0.1:8000"  # where `zfab submit` goes without ZFAB_API_URL (apiclient/http.py)
UP_GRACE = 10.0  # seconds running jobs get when the stack stops, unless --grace or ZFAB_DRAIN_TIMEOUT says
STOP_MARGIN = 5.0  # beyond a worker's drain: flushing its results, closing its store, exiting
BROKER_STOP_SECONDS = 5.0
API_STOP_SECONDS = 10.0  # the API's own graceful shutdown is 8 s (api/server.py)


def _answers(url: str, timeout: float = 1.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= int(r.status) < 300
    except Exception:
        return False


def port_taken(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on now (in use, no such address), or None when it can.

    Bound as the broker and the API bind (SO_REUSEADDR), so a port in TIME_WAIT is not taken."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return str(exc.strerror or exc)
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            return str(exc.strerror or exc)
    return None


def endpoint_port(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of a tcp:// endpoint with a fixed port; None for ipc://, inproc:// or a wildcard port."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp":
        return None
    host, _, port = parts.netloc.rpartition(":")
    if not port.isdigit():
        return None
    host = host.strip("[]")
    return ("0.0.0.0" if host in ("*", "") else host), int(port)


def connect_to(endpoint: str) -> str:
    """Where the stack's workers and API reach a broker bound at `endpoint` (a wildcard is this host)."""
    where = endpoint_port(endpoint)
    if where is None or where[0] not in ("0.0.0.0", "::"):
        return endpoint
    return f"tcp://127.0.0.1:{where[1]}"


def check_ports(endpoint: str, api_host: str, api_port: int) -> None:
    """UsageError naming the first port `zfab up` would need that is already taken."""
    broker = endpoint_port(endpoint)
    if broker is not None:
        why = port_taken(*broker)
        if why:
            raise UsageError(
                f"the broker cannot listen on {endpoint}: {why} (another zfab up or broker?); "
                "choose another with --endpoint or ZFAB_BROKER"
            )
    if api_port:
        why = port_taken(api_host, api_port)
        if why:
            raise UsageError(
                f"the API cannot listen on {api_host}:{api_port}: {why} (another zfab up or API?); "
                "choose another with --api-port (make run PORT=...)"
            )


def cli_hint() -> str:
    """How to type `zfab` in another terminal: nothing to do when this one is on PATH already."""
    script = Path(sys.prefix) / "bin" / "zfab"
    on_path = shutil.which("zfab")
    if not script.exists() or (on_path and Path(on_path).resolve() == script.resolve()):
        return "zfab is on your PATH"
    try:
        shown = Path(os.path.relpath(script, Path.cwd()))
        if shown.parts and shown.parts[0] == "..":
            shown = script
    except ValueError:
        shown = script
    return f"in another terminal here: source {shown.parent / 'activate'}   (or call {shown} directly)"


def banner(endpoint: str, connect: str, workers: list[str], base: str | None, grace: float) -> list[str]:
    """What `zfab up` prints once its stack is ready: where to look, and commands that work as shown."""
    names = f" ({', '.join(workers)})" if workers else ""
    lines = [f"zfab up: broker {endpoint}, {len(workers)} demo worker(s){names}"]
    if base:
        lines += [
            f"  console  {base}/ui   (jobs, queues, workers, schedules in a browser)",
            f"  API      {base}/docs   health {base}/healthz   metrics {base}/metrics",
        ]
    lines.append(f"  CLI      {cli_hint()}")
    broker_env = "" if connect == Settings.model_fields["broker"].default else f"ZFAB_BROKER={connect} "
    lines.append(f'  try:     {broker_env}zfab run demo echo --kwargs \'{{"data": "hi"}}\'')
    if base:
        api_env = "" if base == DEFAULT_API else f"ZFAB_API_URL={base} "
        lines += [
            f'           {api_env}zfab submit demo echo --kwargs \'{{"data": "hi"}}\'',
            f"           curl -s -XPOST '{base}/jobs?wait=5' -H 'content-type: application/json' "
            '-d \'{"service":"demo","task":"echo","kwargs":{"data":"hi"}}\'',
        ]
    lines.append(f"  Ctrl-C stops it all (running jobs get {grace:g} s to finish)")
    return lines


def stop_signals() -> tuple[threading.Event, threading.Event]:
    """(stop, hurry): the first SIGINT/SIGTERM/SIGHUP sets stop, a second one hurry."""
    stop, hurry = threading.Event(), threading.Event()

    def on_signal(*_: object) -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return stop, hurry


def cmd_up(ns: argparse.Namespace) -> int:
    """A broker, N demo workers and the API as supervised child processes; Ctrl-C stops them in order."""
    s = settings_of(ns)
    setup_logging(s.log_level)
    if ns.workers < 0:
        raise UsageError(f"--workers must be 0 or more, got {ns.workers}")
    if ns.grace is not None and ns.grace < 0:
        raise UsageError(f"--grace must be 0 or more seconds, got {ns.grace:g}")
    grace = (
        ns.grace if ns.grace is not None else (s.drain_timeout if os.environ.get("ZFAB_DRAIN_TIMEOUT") else UP_GRACE)
    )
    check_ports(s.bind_endpoint, ns.api_host, ns.api_port)
    env = dict(os.environ)
    env["ZFAB_BROKER"] = connect = connect_to(s.bind_endpoint) if ns.endpoint else s.broker
    stop, hurry = stop_signals()  # before the first start: a Ctrl-C from now on stops them all
    sup = Supervisor([sys.executable, "-m", "zfab.cli"])
    try:
        sup.add("broker", Stage.BROKER, ["broker", "--endpoint", s.bind_endpoint], env)
        names = [f"demo-{i}" for i in range(1, ns.workers + 1)]
        for name in names:
            worker_env = {**env, "ZFAB_DRAIN_TIMEOUT": f"{grace:g}"}
            sup.add(f"worker {name}", Stage.WORKERS, ["worker", "--service", "demo", "--name", name], worker_env)
        base = None
        if ns.api_port:
            sup.add("api", Stage.API, ["api", "--host", ns.api_host, "--port", str(ns.api_port)], env)
            local = "127.0.0.1" if ns.api_host in ("0.0.0.0", "", "::") else ns.api_host
            base = f"http://{local}:{ns.api_port}"
        code = _until_ready(sup, base, s.bind_endpoint, stop)
        if code is not None:
            return code
        print("\n".join(banner(s.bind_endpoint, connect, names, base, grace)), flush=True)
        while not stop.wait(0.2):
            for child in sup.watch():
                if child.stage != Stage.WORKERS:
                    print(f"zfab up: the {child.name} keeps dying; stopping the stack", file=sys.stderr, flush=True)
                    return 1
        return 0
    finally:
        print("zfab up: stopping (workers, then broker, then API)", flush=True)
        sup.stop(
            {Stage.WORKERS: grace + STOP_MARGIN, Stage.BROKER: BROKER_STOP_SECONDS, Stage.API: API_STOP_SECONDS},
            hurry,
        )
        restarts = sup.restarts()
        print(f"zfab up: stopped ({restarts} restart{'s' if restarts != 1 else ''})", flush=True)


def _until_ready(sup: Supervisor, base: str | None, endpoint: str, stop: threading.Event) -> int | None:
    """None once the stack it started is ready (its API answers /readyz, or its broker's port accepts
    connections), else the exit code: a child that could not start at all stops `zfab up`."""
    broker = endpoint_port(endpoint)
    deadline: float | None = time.monotonic() + UP_READY_DEADLINE
    while True:
        if stop.is_set():
            return 130
        for child in sup.children:
            # Before the stack is ready a child that exits is a setting or a port, not bad luck:
            # starting it again would say the same.
            if child.proc is not None and child.proc.poll() is not None:
                print(
                    f"zfab up: the {child.name} exited ({exit_text(child.proc.returncode)}) before the stack "
                    "was ready; stopping (its error is above)",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
        # Ready only while every child it started still runs: what answered is then its own.
        ready = _answers(base + "/readyz") if base is not None else (broker is None or _connects(*broker))
        if ready and all(child.running for child in sup.children):
            return None
        if deadline is not None and time.monotonic() > deadline:
            # A loaded machine can be this slow: say so once and keep waiting (Ctrl-C stops).
            what = f"the API has not answered {base}/readyz" if base else f"the broker does not listen on {endpoint}"
            print(f"zfab up: {what} after {UP_READY_DEADLINE:g} s; still waiting", file=sys.stderr, flush=True)
            deadline = None
        stop.wait(0.2)


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1" if host == "0.0.0.0" else host, port), timeout=1):
            return True
    except OSError:
        return False
