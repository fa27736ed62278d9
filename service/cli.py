"""`zfab broker|worker|up|run|mmi|keys|healthcheck` (and `api`, `submit`, `jobs`... from the api package):
every flag is also a ZFAB_* environment variable.

A mistake the user can fix (a bad setting, a module that does not import, a port in use) is one
line on stderr and exit code 2, never a traceback.
"""

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
from typing import Any, TextIO

from .settings import Settings, settings_from

log = logging.getLogger("zfab")

EXIT_USAGE = 2
UP_API_DEADLINE = 30.0


class UsageError(Exception):
    """A mistake in the command line or the settings: printed as one line, exit code 2."""


def _version() -> str:
    try:
        return importlib.metadata.version("zfab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _settings(ns: argparse.Namespace, **extra: Any) -> Settings:
    return settings_from(ns, Settings, **extra)


def _json_flag(flag: str, text: str | None, kind: type[Any], default: Any) -> Any:
    """The value of a JSON-valued flag, or a UsageError saying where the JSON is wrong."""
    if text is None:
        return default
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(value, kind):
        raise UsageError(f"{flag} must be a JSON {'object' if kind is dict else 'list'}, got {text!r}")
    return value


def _workers_flag(text: str) -> str | list[str]:
    return _json_flag("--workers", text, list, None) if text.startswith("[") else text


def setting_error(exc: Exception, ns: argparse.Namespace, parser: argparse.ArgumentParser | None) -> str:
    """One line naming each bad setting as the user gave it (flag or ZFAB_* variable) and what is wrong."""
    flags: dict[str, str] = {}
    if parser is not None:
        flags = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    parts = []
    for err in exc.errors():  # type: ignore[attr-defined]
        field = str(err["loc"][0]) if err.get("loc") else ""
        given = getattr(ns, field, None)
        name = flags.get(field, "--" + field.replace("_", "-")) if given is not None else f"ZFAB_{field.upper()}"
        parts.append(f"{name}={err.get('input')!r}: {err.get('msg')}")
    return "bad setting " + "; ".join(parts or [str(exc)])


class ProgressLine:
    """Shows a job's events on a stream as they come: a bar redrawn in place on a terminal,
    one line per event elsewhere (a log file or a pipe must stay readable)."""

    WIDTH = 24

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.drawn = False
        self.lock = threading.Lock()  # events arrive on the client's owner thread

    def event(self, ev: dict[str, Any]) -> None:
        message = str(ev.get("message") or ev.get("event_type") or "")
        worker = ev.get("worker")
        who = f"{worker}: " if worker else ""
        progress = ev.get("progress")
        with self.lock:
            if isinstance(progress, int | float):
                pct = max(0.0, min(1.0, float(progress)))
                fill = round(pct * self.WIDTH)
                bar = f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {pct * 100:3.0f}% {who}{message}"
                if self.tty:
                    self.out.write("\r\x1b[K" + bar)
                    self.drawn = True
                else:
                    self.out.write(bar + "\n")
            else:
                self._clear()
                self.out.write(f"{who}{message}\n")
            self.out.flush()

    def _clear(self) -> None:
        if self.drawn:
            self.out.write("\r\x1b[K")
            self.drawn = False

    def done(self) -> None:
        with self.lock:
            if self.drawn:
                self.out.write("\n")
                self.out.flush()
                self.drawn = False


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
    """`module:Class` for user code, else a built-in service by name (UsageError when neither loads)."""
    if spec:
        mod_name, _, cls_name = spec.partition(":")
        if not mod_name or not cls_name:
            raise UsageError(f"--worker must look like module:Class, got {spec!r}")
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise UsageError(f"--worker {spec}: cannot import {mod_name!r}: {exc}") from None
        cls = getattr(module, cls_name, None)
        if cls is None:
            raise UsageError(f"--worker {spec}: module {mod_name!r} has no {cls_name!r}") from None
        from .worker.worker import Worker

        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise UsageError(f"--worker {spec}: {cls_name} is not a subclass of service.Worker")
        return cls
    if service == "demo":
        from .workers.demo import DemoWorker

        return DemoWorker
    if service == "demo-async":
        from .workers.demo import AsyncDemoWorker

        return AsyncDemoWorker
    if service == "files":
        try:
            from .workers.files import FilesWorker  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise UsageError("the files service is not available in this version") from None
        return FilesWorker  # type: ignore[no-any-return, unused-ignore]
    raise UsageError(f"no built-in service {service!r} (demo, files); use --worker module:Class for your own")


def _bind_error(exc: Exception) -> bool:
    """An error from binding a socket: a port in use, an address this host does not have."""
    import zmq

    return isinstance(exc, OSError | zmq.ZMQError)


def cmd_broker(ns: argparse.Namespace) -> int:
    from .broker.broker import Broker

    s = _settings(ns)
    _setup_logging(s.log_level)
    endpoint = ns.endpoint or s.bind_endpoint
    broker = Broker(s, endpoint=ns.endpoint)
    server = _maybe_metrics(s, broker=broker)  # bound first: a port in use fails before anything starts
    try:
        broker.start()
    except Exception as exc:
        if server is not None:
            server.shutdown()
        if _bind_error(exc):
            raise UsageError(f"cannot bind {endpoint}: {exc} (--endpoint, ZFAB_ENDPOINT)") from None
        raise
    curve = " (CURVE)" if s.curve_secret else ""
    print(f"zfab broker ready on {broker.bound_endpoint}{curve}", flush=True)
    try:
        _wait_for_signal()
    finally:
        if server is not None:
            server.shutdown()
        try:
            facts = broker.snapshot("show_broker")
            left = f" ({facts['jobs_in_flight']} jobs in flight, {facts['workers']} workers registered)"
        except Exception:  # a summary only: the stop matters more
            left = ""
        broker.stop()
        print(f"zfab broker stopped{left}", flush=True)
    return 0


def _jobs_held(worker: Any) -> int:
    """Jobs a worker has admitted and not finished (queued for its pool or running)."""
    try:
        return int(worker.pool.depth() + worker.pool.running)
    except Exception:  # a summary only
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
    try:
        worker = cls(**kwargs)
    except TypeError as exc:  # e.g. --root given to a service that takes none
        raise UsageError(f"cannot make worker {cls.__name__}: {exc}") from None
    server = _maybe_metrics(s, worker=worker)  # bound first: a port in use fails before anything starts
    try:
        worker.start()
    except BaseException:
        if server is not None:
            server.shutdown()
        raise
    print(f"zfab worker {worker.name} ready: serving '{worker.service_name}' via {s.broker}", flush=True)
    try:
        _wait_for_signal()
    finally:
        if server is not None:
            server.shutdown()
        held = _jobs_held(worker)
        worker.stop()
        left = _jobs_held(worker)
        print(f"zfab worker {worker.name} stopped (drained {held - left} jobs, {left} unfinished)", flush=True)
    return 0


def _maybe_metrics(s: Settings, **roles: Any) -> Any:
    if not s.metrics_port:
        return None
    from .metrics import serve_metrics

    try:
        return serve_metrics(s.metrics_host, s.metrics_port, **roles)
    except OSError as exc:
        where = f"{s.metrics_host}:{s.metrics_port}"
        raise UsageError(f"cannot serve metrics on {where}: {exc.strerror or exc} (--metrics-port)") from None


def _api_answers(url: str, timeout: float = 1.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= int(r.status) < 300
    except Exception:
        return False


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

    def first_dead() -> subprocess.Popen[bytes] | None:
        return next((p for p in procs if p.poll() is not None), None)

    spawn(["broker", "--endpoint", s.bind_endpoint])
    for i in range(1, ns.workers + 1):
        spawn(["worker", "--service", "demo", "--name", f"demo-{i}"])
    if ns.api_port:
        spawn(["api", "--host", ns.api_host, "--port", str(ns.api_port)])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
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


def _await_job(c: Any, fut: Any, hold: float) -> Any:
    """The job's result; BrokerUnavailableError once the broker has been silent for its hold time
    (the job's own timeout can be much longer: nobody should wait 60 s for a typo in --broker)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from .errors import BrokerUnavailableError

    heard = time.monotonic()
    while True:
        try:
            return fut.result(timeout=min(0.25, hold / 4))
        except FutureTimeout:
            pass
        now = time.monotonic()
        if c.broker_alive:
            heard = now
        elif now - heard >= hold:
            raise BrokerUnavailableError(
                f"the broker at {c.broker} did not answer within its hold time ({hold:g} s); is it running? "
                "(--broker, ZFAB_BROKER)"
            )


def cmd_run(ns: argparse.Namespace) -> int:
    from .client.client import Client
    from .errors import ZfabError

    s = _settings(ns)
    _setup_logging(s.log_level if ns.log_level else "WARNING")
    kwargs = _json_flag("--kwargs", ns.kwargs, dict, {})
    args = _json_flag("--args", ns.args, list, [])
    workers = _workers_flag(ns.workers)
    if ns.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {ns.timeout:g}")
    progress = ProgressLine(sys.stderr)
    with Client(settings=s, name="cli") as c:
        try:
            fut = c.submit(
                ns.service, ns.task, args, kwargs, workers, ns.timeout, on_event=progress.event, retries=ns.retries
            )
            result = _await_job(c, fut, s.keepalive_interval * s.keepalive_multiplier)
        except ValueError as exc:  # e.g. retries with a target other than "any"
            raise UsageError(str(exc)) from None
        except ZfabError as exc:
            progress.done()
            print(f"zfab run: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        progress.done()
    print(json.dumps(result, indent=2, default=str))
    return 1 if any(isinstance(v, dict) and v.get("failed") for v in result.values()) else 0


def cmd_mmi(ns: argparse.Namespace) -> int:
    from .client.client import Client
    from .errors import ZfabError

    s = _settings(ns)
    _setup_logging(s.log_level if ns.log_level else "WARNING")
    kwargs = _json_flag("--kwargs", ns.kwargs, dict, {})
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

    key_dir = Path(ns.dir)
    existing = [p for p in (key_dir / f"{ns.name}.key", key_dir / f"{ns.name}.key_secret") if p.exists()]
    if existing and not ns.force:
        # A new pair would lock out every broker or worker that trusts the old public key.
        print(
            f"zfab keys: {existing[0]} already exists; not replacing the key pair (pass --force to replace it)",
            file=sys.stderr,
        )
        return 1
    public, secret = create_keys(key_dir, ns.name, ns.worker)
    print(f"public key:  {public}   (copy into the broker's ZFAB_CURVE_CLIENTS directory)")
    print(f"secret key:  {secret}   (keep private: ZFAB_CURVE_SECRET of the process it belongs to)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zfab", description="zfab: a job fabric on ZeroMQ")
    p.add_argument("--version", action="version", version=f"zfab {_version()}")
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
    w.add_argument("--service", default="demo", help="built-in service (demo, demo-async, files) or the service name")
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
    r.add_argument("--timeout", type=float, default=60.0, help="seconds the job may take (default 60)")
    r.add_argument("--retries", type=int, default=0, help="run again on another worker if its worker is lost")
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
    k.add_argument("--force", action="store_true", help="replace an existing key pair of that name")
    k.set_defaults(fn=cmd_keys)

    h = sub.add_parser("healthcheck", help="exit 0 if the broker answers MMI (or --url answers 2xx)")
    _common(h)
    _curve_flags(h)
    h.add_argument("--url", help="check this HTTP URL instead, e.g. http://127.0.0.1:8000/readyz")
    h.add_argument("--timeout", type=float, default=3.0)
    h.set_defaults(fn=cmd_healthcheck)
    return p


def _command_parser(parser: argparse.ArgumentParser, cmd: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(cmd or "")
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    parser = build_parser()
    ns = parser.parse_args(argv)
    from .core.memory import return_large_blocks
    from .errors import SecurityError

    return_large_blocks()  # a long-running process moving payloads (core/memory.py)
    try:
        code: int = ns.fn(ns)
    except KeyboardInterrupt:
        code = 130
    except (SecurityError, UsageError) as exc:
        print(f"zfab {ns.cmd}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except ValidationError as exc:
        if not exc.title.endswith("Settings"):
            raise
        print(f"zfab {ns.cmd}: {setting_error(exc, ns, _command_parser(parser, ns.cmd))}", file=sys.stderr)
        code = EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
