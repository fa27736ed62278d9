"""`zfab broker` and `zfab worker`: the long-running roles, each until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
from typing import Any

from ..core.tuning import tune as tune_process
from .common import UsageError, catch_stop_signals, metrics_server, settings_of, setup_logging, wait_for_signal

log = logging.getLogger("zfab")


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
        from ..worker.worker import Worker

        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise UsageError(f"--worker {spec}: {cls_name} is not a subclass of service.Worker")
        return cls
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


def bind_error(exc: Exception) -> bool:
    """An error from binding a socket: a port in use, an address this host does not have."""
    import zmq

    return isinstance(exc, OSError | zmq.ZMQError)


def cmd_broker(ns: argparse.Namespace) -> int:
    from ..broker.broker import Broker

    s = settings_of(ns)
    setup_logging(s.log_level)
    endpoint = ns.endpoint or s.bind_endpoint
    broker = Broker(s, endpoint=ns.endpoint)
    server = metrics_server(s, broker=broker)  # bound first: a port in use fails before anything starts
    stop = catch_stop_signals()
    try:
        broker.start()
    except Exception as exc:
        server.shutdown()
        if bind_error(exc):
            raise UsageError(f"cannot bind {endpoint}: {exc} (--endpoint, ZFAB_ENDPOINT)") from None
        raise
    tune_process()
    curve = " (CURVE)" if s.curve_secret else ""
    print(f"zfab broker ready on {broker.bound_endpoint}{curve}", flush=True)
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
    return 0


def cmd_worker(ns: argparse.Namespace) -> int:
    s = settings_of(ns)
    setup_logging(s.log_level)
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
