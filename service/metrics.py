"""Prometheus metrics: collectors for the fabric (as the broker sees it), workers and clients,
and a small /metrics + /healthz HTTP server for the broker and worker processes.

Names follow Prometheus conventions: `zfab_` prefix, base units, `_total` counters,
bounded labels (service, worker, hop, outcome, reason; never a job id).
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .broker.broker import Broker
    from .client.client import Client
    from .client.clientjob import JobFuture
    from .worker.worker import Worker

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HOPS = ("client_to_broker", "broker_to_worker", "worker_queue", "worker_run", "worker_to_client")


def version() -> str:
    try:
        return importlib.metadata.version("zfab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_info(role: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily("zfab_build_info", "zfab version and process role", labels=["version", "role"])
    g.add_metric([version(), role], 1.0)
    return g


def fabric_families(broker: dict[str, Any], workers: list[dict[str, Any]]) -> list[Metric]:
    """The fabric as the broker's MMI (show_broker + show_workers) describes it."""
    up = GaugeMetricFamily("zfab_broker_up", "1 when the broker answered MMI for this scrape")
    up.add_metric([], 1.0 if broker else 0.0)
    out: list[Metric] = [up]
    if not broker:
        return out
    per_service: dict[tuple[str, str], int] = {}
    wk = [
        ("keepalives_sent", "zfab_worker_keepalives_sent_total", "Keepalives the broker sent to the worker", True),
        ("keepalives_received", "zfab_worker_keepalives_received_total", "Keepalives the broker got from it", True),
        ("holdtime_left_s", "zfab_worker_holdtime_left_seconds", "Seconds until the broker purges the worker", False),
        ("alive_for_s", "zfab_worker_alive_seconds", "Seconds since the worker registered", False),
        (
            "jobs_in_flight",
            "zfab_worker_jobs_in_flight",
            "Jobs the broker routed to the worker, not yet answered",
            False,
        ),
    ]
    fams: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for key, name, doc, counter in wk:
        fam_cls = CounterMetricFamily if counter else GaugeMetricFamily
        fams[key] = fam_cls(name, doc, labels=["service", "worker"])
    reported = {
        "reconnects": CounterMetricFamily(
            "zfab_worker_reconnects_total", "Reconnects the worker reported", labels=["service", "worker"]
        ),
        "frames_rejected": CounterMetricFamily(
            "zfab_worker_frames_rejected_total", "Malformed frames the worker dropped", labels=["service", "worker"]
        ),
    }
    jobs = CounterMetricFamily("zfab_jobs_total", "Jobs finished by workers", labels=["service", "worker", "outcome"])
    depth = GaugeMetricFamily("zfab_queue_depth", "Items waiting in a bounded queue", labels=["hop", "worker"])
    cap = GaugeMetricFamily("zfab_queue_capacity", "Bound of a queue", labels=["hop", "worker"])
    depth.add_metric(["broker_outbound", ""], broker.get("outbound_queue_depth", 0))
    cap.add_metric(["broker_outbound", ""], broker.get("outbound_queue_capacity", 0))
    depth.add_metric(["broker_jobs_in_flight", ""], broker.get("jobs_in_flight", 0))
    cap.add_metric(["broker_jobs_in_flight", ""], broker.get("jobs_in_flight_capacity", 0))
    for w in workers:
        if not w.get("name"):
            continue
        labels = [str(w.get("service", "")), str(w["name"])]
        state = "alive" if w.get("alive", w.get("status") == "alive") else "dead"
        per_service[(labels[0], state)] = per_service.get((labels[0], state), 0) + 1
        for key, *_ in wk:
            fams[key].add_metric(labels, float(w.get(key, 0) or 0))
        rep = w.get("reported") or {}
        for key, fam in reported.items():
            fam.add_metric(labels, float(rep.get(key, 0) or 0))
        jobs.add_metric([*labels, "completed"], float(rep.get("jobs_completed", 0) or 0))
        jobs.add_metric([*labels, "failed"], float(rep.get("jobs_failed", 0) or 0))
        jobs.add_metric([*labels, "busy"], float(rep.get("jobs_busy", 0) or 0))
        for hop, d, c in (
            ("worker_jobs", "job_queue_depth", "job_queue_capacity"),
            ("worker_outbound", "outbound_queue_depth", "outbound_queue_capacity"),
            ("worker_store", "store_queue_depth", "store_queue_capacity"),
        ):
            if d in rep:
                depth.add_metric([hop, labels[1]], float(rep.get(d, 0) or 0))
                cap.add_metric([hop, labels[1]], float(rep.get(c, 0) or 0))
    count = GaugeMetricFamily("zfab_workers", "Workers registered with the broker", labels=["service", "state"])
    for (svc, state), n in sorted(per_service.items()):
        count.add_metric([svc, state], n)
    out += [count, *fams.values(), *reported.values(), jobs, depth, cap]
    frames = CounterMetricFamily("zfab_broker_frames_total", "Messages through the broker socket", labels=["direction"])
    frames.add_metric(["received"], broker.get("frames_received", 0))
    frames.add_metric(["sent"], broker.get("frames_sent", 0))
    frames.add_metric(["dropped"], broker.get("frames_send_dropped", 0))
    rejected = CounterMetricFamily(
        "zfab_frames_rejected_total", "Malformed messages dropped by the broker", labels=["reason"]
    )
    for reason, n in sorted((broker.get("frames_rejected") or {}).items()):
        rejected.add_metric([reason], n)
    events = CounterMetricFamily("zfab_broker_requests_total", "Broker routing outcomes", labels=["kind"])
    for kind, n in sorted((broker.get("counts") or {}).items()):
        events.add_metric([kind], n)
    purged = CounterMetricFamily(
        "zfab_workers_purged_total", "Workers purged after missed keepalives", labels=["service"]
    )
    for svc, n in sorted((broker.get("workers_purged") or {}).items()):
        purged.add_metric([svc], n)
    clients = GaugeMetricFamily("zfab_broker_clients", "Clients the broker remembers")
    clients.add_metric([], broker.get("clients", 0))
    tables = GaugeMetricFamily("zfab_table_size", "Entries in a bounded table", labels=["table"])
    table_caps = GaugeMetricFamily("zfab_table_capacity", "Bound of a table", labels=["table"])
    for table, size, capacity in (
        ("broker_clients", "clients", "clients_capacity"),
        ("broker_finished_jobs", "jobs_finished_remembered", "jobs_finished_capacity"),
        ("broker_unknown_workers", "unknown_workers_remembered", "unknown_workers_capacity"),
    ):
        tables.add_metric([table], broker.get(size, 0))
        table_caps.add_metric([table], broker.get(capacity, 0))
    uptime = GaugeMetricFamily("zfab_broker_uptime_seconds", "Seconds since the broker started")
    uptime.add_metric([], broker.get("uptime_s", 0))
    return [*out, frames, rejected, events, purged, clients, tables, table_caps, uptime]


class FabricCollector(Collector):
    """Exports the fabric from a function that returns (show_broker, show_workers)."""

    def __init__(self, fetch: Callable[[], tuple[dict[str, Any], list[dict[str, Any]]]], role: str) -> None:
        self.fetch = fetch
        self.role = role

    def collect(self) -> Iterable[Metric]:
        try:
            broker, workers = self.fetch()
        except Exception as exc:  # a scrape must still answer: broker_up says 0
            log.debug("fabric metrics unavailable: %s", exc)
            broker, workers = {}, []
        yield build_info(self.role)
        yield from fabric_families(broker, workers)


def broker_collector(broker: Broker) -> FabricCollector:
    return FabricCollector(lambda: (broker.snapshot("show_broker"), broker.snapshot("show_workers")), "broker")


class WorkerCollector(Collector):
    """A worker's own view: its queues, jobs and connection."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        st = w.stats()
        labels = [w.service_name, w.name]
        yield build_info("worker")
        depth = GaugeMetricFamily("zfab_queue_depth", "Items waiting in a bounded queue", labels=["hop", "worker"])
        cap = GaugeMetricFamily("zfab_queue_capacity", "Bound of a queue", labels=["hop", "worker"])
        for hop, d, c in (
            ("worker_jobs", "job_queue_depth", "job_queue_capacity"),
            ("worker_outbound", "outbound_queue_depth", "outbound_queue_capacity"),
            ("worker_store", "store_queue_depth", "store_queue_capacity"),
        ):
            depth.add_metric([hop, w.name], st[d])
            cap.add_metric([hop, w.name], st[c])
        yield depth
        yield cap
        jobs = CounterMetricFamily(
            "zfab_jobs_total", "Jobs finished by workers", labels=["service", "worker", "outcome"]
        )
        jobs.add_metric([*labels, "completed"], st["jobs_completed"])
        jobs.add_metric([*labels, "failed"], st["jobs_failed"])
        jobs.add_metric([*labels, "busy"], st["jobs_busy"])
        yield jobs
        tables = GaugeMetricFamily("zfab_table_size", "Entries in a bounded table", labels=["table"])
        tables.add_metric(["worker_recent_jobs"], st["jobs_remembered"])
        yield tables
        table_caps = GaugeMetricFamily("zfab_table_capacity", "Bound of a table", labels=["table"])
        table_caps.add_metric(["worker_recent_jobs"], st["jobs_remembered_capacity"])
        yield table_caps
        running = GaugeMetricFamily(
            "zfab_worker_jobs_running", "Jobs a pool thread runs now", labels=["service", "worker"]
        )
        running.add_metric(labels, st["jobs_running"])
        yield running
        ka = w.keepalive
        for name, doc, value, counter in (
            ("zfab_worker_broker_keepalives_sent_total", "Keepalives the worker sent to the broker", ka.sent, True),
            ("zfab_worker_broker_keepalives_received_total", "Keepalives the worker got", ka.received, True),
            (
                "zfab_worker_broker_holdtime_left_seconds",
                "Seconds until the worker reconnects",
                ka.hold_time_left(),
                False,
            ),
            ("zfab_worker_reconnects_total", "Reconnects to the broker", st["reconnects"], True),
            ("zfab_worker_frames_rejected_total", "Malformed frames the worker dropped", st["frames_rejected"], True),
        ):
            fam = (CounterMetricFamily if counter else GaugeMetricFamily)(name, doc, labels=["service", "worker"])
            fam.add_metric(labels, float(value))
            yield fam


class ClientMetrics(Collector):
    """A client's queues and connection, plus job latency histograms it observes."""

    def __init__(self, client: Client, registry: CollectorRegistry, *, register: bool = True) -> None:
        """`register=False` leaves this collector out of `registry` (the histograms still go in), for a
        caller that merges its families with another collector's, as the API does with the fabric's."""
        self.client = client
        self.duration = Histogram(
            "zfab_job_duration_seconds",
            "Submit to result, as the client sees it",
            ["service", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.hop = Histogram(
            "zfab_job_hop_seconds",
            "Time between a job's hops (clocks of different hosts may differ)",
            ["hop"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        if register:
            registry.register(self)
        client.on_complete = self.observe

    def observe(self, fut: JobFuture, service: str, outcome: str, results: dict[str, Any] | None) -> None:
        t = fut.timings
        if "submitted" in t and "completed" in t:
            self.duration.labels(service, outcome).observe(max(0.0, t["completed"] - t["submitted"]))
        for entry in (results or {}).values():
            ts = entry.get("timestamps") if isinstance(entry, dict) else None
            if not ts or not all(ts.get(k) for k in ("received", "started", "completed")):
                continue
            sub, disp = t.get("submitted"), t.get("dispatched")
            if sub is not None and disp is not None:
                self.hop.labels("client_to_broker").observe(max(0.0, disp - sub))
                self.hop.labels("broker_to_worker").observe(max(0.0, ts["received"] - disp))
            self.hop.labels("worker_queue").observe(max(0.0, ts["started"] - ts["received"]))
            self.hop.labels("worker_run").observe(max(0.0, ts["completed"] - ts["started"]))
            if "completed" in t:
                self.hop.labels("worker_to_client").observe(max(0.0, t["completed"] - ts["completed"]))

    def collect(self) -> Iterator[Metric]:
        c = self.client
        depth = GaugeMetricFamily("zfab_queue_depth", "Items waiting in a bounded queue", labels=["hop", "worker"])
        depth.add_metric(["client_outbound", ""], c.loop.queue_depth())
        depth.add_metric(["client_jobs", ""], c.jobs_in_flight())
        yield depth
        cap = GaugeMetricFamily("zfab_queue_capacity", "Bound of a queue", labels=["hop", "worker"])
        cap.add_metric(["client_outbound", ""], c.loop.outbound_size)
        cap.add_metric(["client_jobs", ""], c.max_jobs)
        yield cap
        alive = GaugeMetricFamily("zfab_client_broker_alive", "1 while the broker answers the client's keepalives")
        alive.add_metric([], 1.0 if c.broker_alive else 0.0)
        yield alive
        ka = CounterMetricFamily("zfab_client_keepalives_total", "Client keepalives", labels=["direction"])
        ka.add_metric(["sent"], c.keepalive.sent)
        ka.add_metric(["received"], c.keepalive.received)
        yield ka
        rej = CounterMetricFamily("zfab_client_frames_rejected_total", "Malformed frames the client dropped")
        rej.add_metric([], c.counts["rejected_frames"])
        yield rej


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    healthy: Callable[[], bool]

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/metrics":
            body, ctype, code = generate_latest(self.registry), CONTENT_TYPE, 200
        elif self.path.split("?")[0] == "/healthz":
            ok = self.healthy()
            body, ctype, code = (b"ok\n" if ok else b"unhealthy\n"), "text/plain", (200 if ok else 503)
        else:
            body, ctype, code = b"not found: try /metrics or /healthz\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the log


def serve_metrics(
    host: str, port: int, *, broker: Broker | None = None, worker: Worker | None = None
) -> ThreadingHTTPServer:
    """Serve /metrics and /healthz for a broker or worker process on a background thread."""
    registry = CollectorRegistry()
    if broker is not None:
        registry.register(broker_collector(broker))
        loop = broker.loop
    elif worker is not None:
        registry.register(WorkerCollector(worker))
        loop = worker.loop
    else:
        raise ValueError("serve_metrics needs a broker or a worker")

    handler = type(
        "Handler", (_Handler,), {"registry": registry, "healthy": staticmethod(lambda: not loop.stopped.is_set())}
    )
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="zfab-metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return server
