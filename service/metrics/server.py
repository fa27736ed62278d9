"""The small HTTP server of broker and worker processes: /metrics, /healthz (alive), /readyz (ready).

Health has one JSON shape on every zfab process, the API's included:
    {"status": "ok" | "ready" | "not ready", "role": ..., "version": ..., "checks": {name: bool}}
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest

from .base import CONTENT_TYPE, version
from .events import EventsCollector
from .fabric import broker_collector
from .worker import WorkerCollector

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..worker.worker import Worker

log = logging.getLogger(__name__)

Checks = Callable[[], dict[str, bool]]


def health(role: str, checks: dict[str, bool], *, ready: bool) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of /healthz (ready=False) or /readyz."""
    ok = all(checks.values())
    word = ("ready" if ready else "ok") if ok else "not ready" if ready else "unhealthy"
    return (200 if ok else 503), {"status": word, "role": role, "version": version(), "checks": checks}


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    role: str
    alive: Checks
    ready: Checks

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?")[0]
        if path == "/metrics":
            payload, ctype, code = generate_latest(self.registry), CONTENT_TYPE, 200
        elif path in ("/healthz", "/readyz"):
            code, doc = health(self.role, (self.ready if path == "/readyz" else self.alive)(), ready=path == "/readyz")
            payload, ctype = json.dumps(doc).encode(), "application/json"
        else:
            payload, ctype, code = b"not found: try /metrics, /healthz or /readyz\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the log


def serve_metrics(
    host: str, port: int, *, broker: Broker | None = None, worker: Worker | None = None
) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz for a broker or worker process on a background thread."""
    registry = CollectorRegistry()
    if broker is not None:
        b = broker
        registry.register(broker_collector(b))
        registry.register(EventsCollector(b))
        role = "broker"

        def alive() -> dict[str, bool]:
            return {"loop": not b.loop.stopped.is_set()}

        def ready() -> dict[str, bool]:
            # Bound and serving: its loop answers (a snapshot round trip), past its startup grace.
            try:
                b.loop.call(lambda: None, timeout=1.0)
                answers = True
            except Exception:
                answers = False
            # Active: it holds the lease, or none is configured (a standby is alive, not ready: docs/failover.md).
            return {
                "loop": answers,
                "active": b.term.serving,
                "bound": bool(b.bound_endpoint),
                # a standby that took over serves at once: its startup grace only holds unknown services
                "started": b.requests.grace_until is None or b.term.role == "active",
            }

    elif worker is not None:
        w = worker
        registry.register(WorkerCollector(w))
        role = "worker"

        def alive() -> dict[str, bool]:
            return {"loop": not w.loop.stopped.is_set()}

        def ready() -> dict[str, bool]:
            return {
                "loop": not w.loop.stopped.is_set(),
                "registered": w.registered(),
                "accepting": not w.draining,
            }

    else:
        raise ValueError("serve_metrics needs a broker or a worker")
    handler = type(
        "Handler",
        (_Handler,),
        {"registry": registry, "role": role, "alive": staticmethod(alive), "ready": staticmethod(ready)},
    )
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="zfab-metrics", daemon=True).start()
    log.debug("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return server
