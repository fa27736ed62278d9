"""`zfab broker|worker|up|run|mmi|api|healthcheck`: every flag is also a ZFAB_* environment variable."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .settings import Settings, settings_from

log = logging.getLogger("zfab")


def _settings(ns: argparse.Namespace, **extra: Any) -> Settings:
    return settings_from(ns, Settings, **extra)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", help="broker endpoint to connect to (ZFAB_BROKER)")
    p.add_argument(
        "--keepalive-interval", dest="keepalive_interval", type=float, help="seconds (ZFAB_KEEPALIVE_INTERVAL)"
    )
    p.add_argument("--keepalive-multiplier", dest="keepalive_multiplier", type=int, help="(ZFAB_KEEPALIVE_MULTIPLIER)")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO, WARNING (ZFAB_LOG_LEVEL)")


def _curve_flags(p: argparse.ArgumentParser, broker: bool = False) -> None:
    p.add_argument("--curve-secret", dest="curve_secret", help="own CURVE secret certificate (ZFAB_CURVE_SECRET)")
    if broker:
        p.add_argument("--curve-clients", dest="curve_clients", help="directory of accepted public certificates")
        p.add_argument(
            "--insecure", action="store_const", const=True, help="allow a non-loopback endpoint without CURVE"
        )
    else:
        p.add_argument("--curve-server-key", dest="curve_server_key", help="the broker's public certificate")


def _metrics_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", dest="metrics_port", type=int, help="port for /metrics and /healthz, 0 = off")
    p.add_argument("--metrics-host", dest="metrics_host", help="address for the metrics port")


def load_worker_class(spec: str | None, service: str) -> type[Any]:
    """`module:Class` for user code, else a built-in service by name."""
    if spec:
        mod_name, _, cls_name = spec.partition(":")
        if not cls_name:
            raise SystemExit(f"--worker must look like module:Class, got {spec!r}")
        return getattr(importlib.import_module(mod_name), cls_name)  # type: ignore[no-any-return]
    if service == "demo":
        from .workers.demo import DemoWorker

        return DemoWorker
    if service == "files":
        try:
            from .workers.files import FilesWorker  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise SystemExit("the files service is not available in this version") from None
        return FilesWorker  # type: ignore[no-any-return, unused-ignore]
    raise SystemExit(f"no built-in service {service!r}; use --worker module:Class for your own")


def cmd_broker(ns: argparse.Namespace) -> int:
    from .broker.broker import Broker

    s = _settings(ns)
    _setup_logging(s.log_level)
    broker = Broker(s, endpoint=ns.endpoint).start()
    server = _maybe_metrics(s, broker=broker)
    print(f"zfab broker listening on {broker.bound_endpoint}", flush=True)
    try:
        _wait_for_signal()
    finally:
        if server is not None:
            server.shutdown()
        broker.stop()
    return 0


def cmd_worker(ns: argparse.Namespace) -> int:
    s = _settings(ns)
    _setup_logging(s.log_level)
    cls = load_worker_class(ns.worker, ns.service)
    kwargs: dict[str, Any] = {"broker": s.broker, "name": ns.name, "settings": s}
    if ns.service and not ns.worker:
        kwargs["service"] = ns.service
    if ns.root is not None:
        kwargs["root"] = ns.root
    worker = cls(**kwargs).start()
    server = _maybe_metrics(s, worker=worker)
    print(f"zfab worker {worker.name} serving '{worker.service_name}' via {s.broker}", flush=True)
    try:
        _wait_for_signal()
    finally:
        if server is not None:
            server.shutdown()
        worker.stop()
    return 0


def _maybe_metrics(s: Settings, **roles: Any) -> Any:
    if not s.metrics_port:
        return None
    from .metrics import serve_metrics

    return serve_metrics(s.metrics_host, s.metrics_port, **roles)


def cmd_up(ns: argparse.Namespace) -> int:
    """A broker, N demo workers and the API as child processes; Ctrl-C stops them all."""
    s = _settings(ns)
    _setup_logging(s.log_level)
    exe = [sys.executable, "-m", "service.cli"]
    env = dict(os.environ)
    env["ZFAB_BROKER"] = s.broker
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(args: list[str]) -> None:
        procs.append(subprocess.Popen(exe + args, env=env))

    spawn(["broker", "--endpoint", s.bind_endpoint])
    for i in range(1, ns.workers + 1):
        spawn(["worker", "--service", "demo", "--name", f"demo-{i}"])
    if ns.api_port:
        spawn(["api", "--host", ns.api_host, "--port", str(ns.api_port)])
    print(f"zfab up: broker {s.bind_endpoint}, {ns.workers} demo worker(s)", flush=True)
    if ns.api_port:
        base = f"http://{ns.api_host}:{ns.api_port}"
        print(f"  API      {base}/docs   health {base}/healthz   metrics {base}/metrics", flush=True)
        print(
            f"  try:     curl -s -XPOST '{base}/jobs?wait=5' -H 'content-type: application/json' "
            f'-d \'{{"service":"demo","task":"echo","kwargs":{{"data":"hi"}}}}\'',
            flush=True,
        )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                log.error("a fabric process exited (code %s); stopping the rest", dead[0].returncode)
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


def cmd_run(ns: argparse.Namespace) -> int:
    from .client.client import Client
    from .errors import ZfabError

    s = _settings(ns)
    _setup_logging(s.log_level if ns.log_level else "WARNING")
    try:
        kwargs = json.loads(ns.kwargs) if ns.kwargs else {}
        args = json.loads(ns.args) if ns.args else []
    except ValueError as exc:
        print(f"--kwargs/--args must be JSON: {exc}", file=sys.stderr)
        return 2
    workers: str | list[str] = ns.workers
    if ns.workers.startswith("["):
        workers = json.loads(ns.workers)
    with Client(settings=s, name="cli") as c:
        try:
            result = c.run_job(ns.service, ns.task, args=args, kwargs=kwargs, workers=workers, timeout=ns.timeout)
        except ZfabError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(result, indent=2, default=str))
    return 1 if any(isinstance(v, dict) and v.get("failed") for v in result.values()) else 0


def cmd_mmi(ns: argparse.Namespace) -> int:
    from .client.client import Client
    from .errors import ZfabError

    s = _settings(ns)
    _setup_logging(s.log_level if ns.log_level else "WARNING")
    kwargs = json.loads(ns.kwargs) if ns.kwargs else {}
    with Client(settings=s, name="cli-mmi") as c:
        try:
            print(json.dumps(c.mmi(ns.task, timeout=ns.timeout, **kwargs), indent=2, default=str))
        except ZfabError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_healthcheck(ns: argparse.Namespace) -> int:
    """Exit 0 when healthy: for container HEALTHCHECKs (slim images have no curl)."""
    if ns.url:
        import urllib.request

        try:
            with urllib.request.urlopen(ns.url, timeout=ns.timeout) as r:
                return 0 if 200 <= r.status < 300 else 1
        except Exception as exc:
            print(f"unhealthy: {ns.url}: {exc}", file=sys.stderr)
            return 1
    from .client.client import Client
    from .errors import ZfabError

    s = _settings(ns)
    logging.basicConfig(level=logging.ERROR)
    with Client(settings=s, name="healthcheck") as c:
        try:
            c.mmi("show_broker", timeout=ns.timeout)
        except ZfabError as exc:
            print(f"unhealthy: broker {s.broker}: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_keys(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from .transport.security import create_keys

    public, secret = create_keys(Path(ns.dir), ns.name, ns.worker)
    print(f"public key:  {public}   (copy into the broker's ZFAB_CURVE_CLIENTS directory)")
    print(f"secret key:  {secret}   (keep private: ZFAB_CURVE_SECRET of the process it belongs to)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zfab", description="zfab: a job fabric on ZeroMQ")
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("broker", help="run the broker")
    _common(b)
    _metrics_flags(b)
    b.add_argument("--endpoint", help="endpoint to bind (ZFAB_ENDPOINT; default ZFAB_BROKER)")
    _curve_flags(b, broker=True)
    b.set_defaults(fn=cmd_broker)

    w = sub.add_parser("worker", help="run a worker")
    _common(w)
    _metrics_flags(w)
    w.add_argument("--service", default="demo", help="built-in service (demo, files) or the service name")
    w.add_argument("--worker", help="module:Class of your own Worker subclass")
    w.add_argument("--name", help="worker name (default: SERVICE-HOST-PID)")
    w.add_argument("--root", help="files service: directory to serve")
    w.add_argument("--data-dir", dest="data_dir", help="where the job store lives (ZFAB_DATA_DIR)")
    _curve_flags(w)
    w.set_defaults(fn=cmd_worker)

    u = sub.add_parser("up", help="broker + N demo workers (+ API) in one command")
    _common(u)
    u.add_argument("--workers", type=int, default=2)
    u.add_argument("--api-port", dest="api_port", type=int, default=8000, help="0 = no API")
    u.add_argument("--api-host", dest="api_host", default="127.0.0.1")
    u.add_argument("--endpoint", help="endpoint the broker binds")
    u.set_defaults(fn=cmd_up)

    r = sub.add_parser("run", help="run one job and print its result dictionary")
    _common(r)
    r.add_argument("service")
    r.add_argument("task")
    r.add_argument("--kwargs", help="JSON object")
    r.add_argument("--args", help="JSON list")
    r.add_argument("--workers", default="any", help="any, all, a worker name, or a JSON list of names")
    r.add_argument("--timeout", type=float, default=60.0)
    _curve_flags(r)
    r.set_defaults(fn=cmd_run)

    m = sub.add_parser("mmi", help="ask the broker's management interface (show_workers, show_broker, ...)")
    _common(m)
    m.add_argument("task")
    m.add_argument("--kwargs", help="JSON object")
    m.add_argument("--timeout", type=float, default=5.0)
    _curve_flags(m)
    m.set_defaults(fn=cmd_mmi)

    # Commands from other installed packages (the HTTP API registers `zfab api` this way), so
    # the fabric never imports them: entry points of group "zfab.commands", each a
    # register(subparsers, common_flags) function.
    for ep in importlib.metadata.entry_points(group="zfab.commands"):
        try:
            ep.load()(sub, _common)
        except ImportError as exc:
            log.debug("zfab command %s unavailable: %s", ep.name, exc)

    k = sub.add_parser("keys", help="create a CURVE key pair (NAME.key public, NAME.key_secret secret)")
    k.add_argument("--dir", required=True, help="directory for the certificates")
    k.add_argument("--name", required=True, help="certificate name (the ZAP user id)")
    k.add_argument("--worker", help="bind this worker name to the key: only it may register as that worker")
    k.set_defaults(fn=cmd_keys)

    h = sub.add_parser("healthcheck", help="exit 0 if the broker answers MMI (or --url answers 2xx)")
    _common(h)
    _curve_flags(h)
    h.add_argument("--url", help="check this HTTP URL instead, e.g. http://127.0.0.1:8000/readyz")
    h.add_argument("--timeout", type=float, default=3.0)
    h.set_defaults(fn=cmd_healthcheck)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    from .errors import SecurityError

    if os.environ.get("ZFAB_SWITCH"):
        sys.setswitchinterval(float(os.environ["ZFAB_SWITCH"]))
    try:
        code: int = ns.fn(ns)
    except KeyboardInterrupt:
        code = 130
    except SecurityError as exc:
        print(f"zfab: {exc}", file=sys.stderr)
        code = 2
    return code


if __name__ == "__main__":
    sys.exit(main())
