"""`zfab broker` and `zfab worker`: the long-running roles, each until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import sys
import traceback
from types import ModuleType
from typing import Any

from ..core.tuning import tune as tune_process
from .common import UsageError, catch_stop_signals, metrics_server, settings_of, setup_logging, wait_for_signal

log = logging.getLogger("zfab")


def load_worker_class(spec: str | None, service: str | None) -> type[Any]:
    """`module:Class` for user code (imported from the current directory first, as Celery's -A and
    Dramatiq's --path . do), else a built-in service by name (UsageError when neither loads)."""
    if spec:
        return _user_worker_class(spec, service)
    service = service or "demo"
    if service == "demo":
        from ..workers.demo import DemoWorker

        return DemoWorker
    if service == "demo-async":
        from ..workers.demo import AsyncDemoWorker

        return AsyncDemoWorker
    if service == "files":
        try:
            from ..workers.files import FilesWorker  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise UsageError("the files service is not available in this version") from None
        return FilesWorker  # type: ignore[no-any-return, unused-ignore]
    raise UsageError(f"no built-in service {service!r} (demo, files); use --worker module:Class for your own")


def _user_worker_class(spec: str, service: str | None) -> type[Any]:
    mod_name, _, cls_name = spec.partition(":")
    if not mod_name or not cls_name:
        raise UsageError(f"--worker must look like module:Class, got {spec!r}")
    module = _import_user_module(spec, mod_name)
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise UsageError(f"--worker {spec}: module {mod_name!r} has no {cls_name!r} (read from {module.__file__})")
    from ..worker.worker import Worker

    if not (isinstance(cls, type) and issubclass(cls, Worker)):
        raise UsageError(f"--worker {spec}: {cls_name} is not a subclass of zfab.Worker")
    if not (service or cls.service):
        raise UsageError(
            f'--worker {spec}: {cls_name} has no service name; set `service = "..."` in the class '
            "(or pass --service NAME)"
        )
    return cls


def _import_user_module(spec: str, mod_name: str) -> ModuleType:
    """The user's module, looked for in the current directory first (a console script's sys.path
    starts at its own bin/ folder, not where the user is), then wherever Python looks."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if mod_name == missing or mod_name.startswith(missing + "."):
            top = mod_name.split(".")[0]
            raise UsageError(
                f"--worker {spec}: no module {missing!r}: looked for {top}.py or {top}/ in {cwd} (the current "
                "directory), then on PYTHONPATH and in site-packages; run zfab worker from the directory that holds "
                "it, or set PYTHONPATH=/path/to/that/directory"
            ) from None
        raise UsageError(f"--worker {spec}: {mod_name} imports {missing!r}, which is not installed: {exc}") from None
    except SyntaxError as exc:
        raise UsageError(f"--worker {spec}: {exc.filename}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except Exception as exc:  # the module's own code raised: say where, in one line
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise UsageError(f"--worker {spec}: importing {mod_name} raised {type(exc).__name__}: {exc}{where}") from None


def bind_error(exc: Exception) -> bool:
    """An error from binding a socket: a port in use, an address this host does not have."""
    import zmq

    return isinstance(exc, OSError | zmq.ZMQError)


def cmd_broker(ns: argparse.Namespace) -> int:
    from ..broker.broker import Broker
    from ..broker.inventory import InventoryError
    from ..core.access import AccessError
    from ..errors import ZfabError

    s = settings_of(ns)
    setup_logging(s.log_level)
    endpoint = ns.endpoint or s.bind_endpoint
    if "," in endpoint:  # ZFAB_BROKER lists every broker for the peers: which one is this?
        raise UsageError(f"ZFAB_BROKER lists several brokers ({endpoint}): give this one its own with --endpoint")
    stop = catch_stop_signals()
    try:  # a broker that lost its lease exits: a supervisor starts a fresh standby
        broker = Broker(s, endpoint=ns.endpoint, on_deposed=stop.set)
    except InventoryError as exc:
        raise UsageError(f"cannot load the NorFab inventory {exc} (--inventory, ZFAB_BROKER_INVENTORY)") from None
    except ZfabError as exc:  # a lease setting (--lease, ZFAB_BROKER_LEASE_*)
        raise UsageError(str(exc)) from None
    server = metrics_server(s, broker=broker)  # bound first: a port in use fails before anything starts
    try:
        broker.start()
    except Exception as exc:
        server.shutdown()
        if bind_error(exc):
            raise UsageError(f"cannot bind {endpoint}: {exc} (--endpoint, ZFAB_ENDPOINT)") from None
        if isinstance(exc, AccessError):
            raise UsageError(f"the access file: {exc} (ZFAB_ACCESS_FILE, docs/roles.md)") from None
        raise
    tune_process()
    curve = " (CURVE)" if s.curve_secret else ""
    if broker.term.serving:
        print(f"zfab broker ready on {broker.bound_endpoint}{curve}", flush=True)
    else:  # it binds once it holds the lease (docs/failover.md)
        print(f"zfab broker standby for {endpoint}{curve}: waiting for the lease", flush=True)
    if broker.events is not None:
        print(f"zfab broker events on {broker.events.bound_endpoint}", flush=True)
    try:
        wait_for_signal(stop)
    finally:
        server.shutdown()
        try:
            facts = broker.snapshot("show_broker")
            left = f" ({facts['jobs_in_flight']} jobs in flight, {facts['workers']} workers registered)"
        except Exception:  # a summary only: the stop matters more
            left = ""
        broker.stop()
        print(f"zfab broker stopped{left}", flush=True)
    if broker.term.role == "deposed":
        print("zfab broker lost its lease and stopped serving (exit 3: start it again as a standby)", flush=True)
        return 3
    return 0


def cmd_worker(ns: argparse.Namespace) -> int:
    from ..errors import ZfabError

    s = settings_of(ns)
    setup_logging(s.log_level)
    cls = load_worker_class(ns.worker, ns.service)
    kwargs: dict[str, Any] = {"broker": s.broker, "name": ns.name, "settings": s}
    if ns.service or not ns.worker:
        kwargs["service"] = ns.service or "demo"
    if ns.root is not None:
        kwargs["root"] = ns.root
    try:
        worker = cls(**kwargs)
    except (TypeError, ValueError, ZfabError) as exc:  # --root to a service without one, a name in use
        raise UsageError(f"cannot make worker {cls.__name__}: {exc}") from None
    server = metrics_server(s, worker=worker)  # bound first: a port in use fails before anything starts
    stop = catch_stop_signals()
    try:
        worker.start()
    except BaseException:
        server.shutdown()
        raise
    tune_process()
    print(f"zfab worker {worker.name} ready: serving '{worker.service_name}' via {s.broker}", flush=True)
    try:
        wait_for_signal(stop)
    finally:
        server.shutdown()
        held = worker.held()
        worker.stop()
        left = worker.held()
        print(f"zfab worker {worker.name} stopped (drained {held - left} jobs, {left} unfinished)", flush=True)
    return 0
