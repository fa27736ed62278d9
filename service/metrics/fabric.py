"""The fabric as the broker's MMI describes it (show_broker, show_workers with gone ones,
show_services): exported by the broker's /metrics and, read through MMI, by the API's.

Every series a panel needs exists while its subject is known, 0 included: every known service
has alive and dead worker counts and its queue figures; a worker that left keeps its series
(state dead, gauges 0) for ZFAB_GONE_WORKER_SECONDS, so a dashboard shows 0 in red, not "No data".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .base import add_histogram, build_info

if TYPE_CHECKING:
    from ..broker.broker import Broker

log = logging.getLogger(__name__)

Snapshot = tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]  # broker, workers, services

WORKER_FIGURES = [
    ("keepalives_sent", "zfab_worker_keepalives_sent_total", "Keepalives the broker sent to the worker", True),
    ("keepalives_received", "zfab_worker_keepalives_received_total", "Keepalives the broker got from it", True),
    ("holdtime_left_s", "zfab_worker_holdtime_left_seconds", "Seconds until the broker purges the worker", False),
    ("alive_for_s", "zfab_worker_alive_seconds", "Seconds since the worker registered", False),
    ("jobs_in_flight", "zfab_worker_jobs_in_flight", "Jobs the broker sent the worker, not yet answered", False),
    ("credits", "zfab_worker_credits", "Jobs the worker said it can hold at once (pool size + prefetch)", False),
]
QUEUE_FIGURES = [
    ("queue_depth", "zfab_service_queue_depth", "Jobs waiting in the broker's queue for the service"),
    ("queue_capacity", "zfab_service_queue_capacity", "Bound of the service's queue (ZFAB_SERVICE_QUEUE_SIZE)"),
    ("queue_bytes", "zfab_service_queue_bytes", "Bytes of the request bodies queued for the service"),
    ("queue_oldest_age_s", "zfab_service_queue_oldest_age_seconds", "Age of the oldest queued job (0: none)"),
    ("paused", "zfab_service_paused", "1 while the service's queue is paused: jobs are queued, none is sent"),
]


def fabric_families(
    broker: dict[str, Any], workers: list[dict[str, Any]], services: list[dict[str, Any]]
) -> list[Metric]:
    up = GaugeMetricFamily("zfab_broker_up", "1 when the broker answered MMI for this scrape")
    up.add_metric([], 1.0 if broker else 0.0)
    if not broker:
        return [up]
    depth = GaugeMetricFamily("zfab_queue_depth", "Items waiting in a bounded queue", labels=["hop", "worker"])
    cap = GaugeMetricFamily("zfab_queue_capacity", "Bound of a queue", labels=["hop", "worker"])
    return [up, *_workers(workers, services, depth, cap), *_queues(broker, services), *_broker(broker, depth, cap)]


def _workers(
    workers: list[dict[str, Any]], services: list[dict[str, Any]], depth: GaugeMetricFamily, cap: GaugeMetricFamily
) -> list[Metric]:
    fams: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for key, name, doc, counter in WORKER_FIGURES:
        fams[key] = (CounterMetricFamily if counter else GaugeMetricFamily)(name, doc, labels=["service", "worker"])
    reported = {
        "reconnects": CounterMetricFamily(
            "zfab_worker_reconnects_total", "Reconnects the worker reported", labels=["service", "worker"]
        ),
        "frames_rejected": CounterMetricFamily(
            "zfab_worker_frames_rejected_total", "Malformed frames the worker dropped", labels=["service", "worker"]
        ),
    }
    jobs = CounterMetricFamily("zfab_jobs_total", "Jobs finished by workers", labels=["service", "worker", "outcome"])
    per_service = {(str(s.get("service", "")), state): 0 for s in services for state in ("alive", "dead")}
    for w in workers:
        if not w.get("name"):
            continue
        labels = [str(w.get("service", "")), str(w["name"])]
        alive = bool(w.get("alive", w.get("status") == "alive"))
        state = (labels[0], "alive" if alive else "dead")
        per_service[state] = per_service.get(state, 0) + 1
        for fig, *_ in WORKER_FIGURES:
            fams[fig].add_metric(labels, float(w.get(fig, 0) or 0))
        rep = w.get("reported") or {}
        for fig, fam in reported.items():
            fam.add_metric(labels, float(rep.get(fig, 0) or 0))
        for outcome, fig in (("completed", "jobs_completed"), ("failed", "jobs_failed"), ("busy", "jobs_busy")):
            jobs.add_metric([*labels, outcome], float(rep.get(fig, 0) or 0))
        for hop, d, c in (
            ("worker_jobs", "job_queue_depth", "job_queue_capacity"),
            ("worker_outbound", "outbound_queue_depth", "outbound_queue_capacity"),
            ("worker_store", "store_queue_depth", "store_queue_capacity"),
            ("worker_started_notices", "started_notices_waiting", "started_notices_capacity"),
        ):
            depth.add_metric([hop, labels[1]], float(rep.get(d, 0) or 0))
            cap.add_metric([hop, labels[1]], float(rep.get(c, 0) or 0))
    count = GaugeMetricFamily(
        "zfab_workers", "Workers the broker knows, alive or dead (lately gone)", labels=["service", "state"]
    )
    for (svc, st), n in sorted(per_service.items()):
        count.add_metric([svc, st], n)
    return [count, *fams.values(), *reported.values(), jobs]


def _queues(broker: dict[str, Any], services: list[dict[str, Any]]) -> list[Metric]:
    fams = {key: GaugeMetricFamily(name, doc, labels=["service"]) for key, name, doc in QUEUE_FIGURES}
    expired = CounterMetricFamily(
        "zfab_jobs_expired_total", "Jobs whose deadline passed at the broker", labels=["service", "where"]
    )
    dispatched = CounterMetricFamily(
        "zfab_service_jobs_dispatched_total", "Jobs the broker sent to the service's workers", labels=["service"]
    )
    queued = HistogramMetricFamily(
        "zfab_job_queued_seconds", "Time from admission to dispatch at the broker", labels=["service"]
    )
    limit_waiting = GaugeMetricFamily(
        "zfab_task_limit_waiting",
        "Jobs waiting in the broker's queue for their task's rate or concurrency limit",
        labels=["service", "task"],
    )
    limit_running = GaugeMetricFamily(
        "zfab_task_limit_running",
        "Jobs of a limited task dispatched and not yet ended (what its concurrency limit counts)",
        labels=["service", "task"],
    )
    for s in services:
        svc = str(s.get("service", ""))
        for key, *_ in QUEUE_FIGURES:
            fams[key].add_metric([svc], float(s.get(key, 0) or 0))
        expired.add_metric([svc, "queue"], float(s.get("expired_in_queue", 0) or 0))
        expired.add_metric([svc, "worker"], float(s.get("expired_in_flight", 0) or 0))
        dispatched.add_metric([svc], float(s.get("jobs_dispatched", 0) or 0))
        add_histogram(queued, [svc], s.get("queued_seconds") or {"buckets": [["+Inf", 0]], "sum": 0, "count": 0})
        limits = s.get("limits")
        for task, row in (limits if isinstance(limits, dict) else {}).items():
            if isinstance(row, dict):
                limit_waiting.add_metric([svc, str(task)], float(row.get("held", 0) or 0))
                limit_running.add_metric([svc, str(task)], float(row.get("running", 0) or 0))
    total = GaugeMetricFamily("zfab_broker_queue_bytes", "Bytes of request bodies queued at the broker, in all")
    total.add_metric([], float(broker.get("queue_bytes", 0) or 0))
    held = GaugeMetricFamily(
        "zfab_broker_dispatched_bytes",
        "Bytes of request bodies the broker keeps for jobs sent to workers, until they start or end",
    )
    held.add_metric([], float(broker.get("dispatched_bytes", 0) or 0))
    bound = GaugeMetricFamily(
        "zfab_broker_queue_bytes_capacity",
        "Bound of the request bodies the broker holds, queued and dispatched (ZFAB_BROKER_QUEUE_BYTES)",
    )
    bound.add_metric([], float(broker.get("queue_bytes_capacity", 0) or 0))
    return [*fams.values(), expired, dispatched, queued, limit_waiting, limit_running, total, held, bound]


def _broker(broker: dict[str, Any], depth: GaugeMetricFamily, cap: GaugeMetricFamily) -> list[Metric]:
    depth.add_metric(["broker_outbound", ""], broker.get("outbound_queue_depth", 0))
    cap.add_metric(["broker_outbound", ""], broker.get("outbound_queue_capacity", 0))
    depth.add_metric(["broker_jobs_in_flight", ""], broker.get("jobs_in_flight", 0))
    cap.add_metric(["broker_jobs_in_flight", ""], broker.get("jobs_in_flight_capacity", 0))
    frames = CounterMetricFamily("zfab_broker_frames_total", "Messages through the broker socket", labels=["direction"])
    frames.add_metric(["received"], broker.get("frames_received", 0))
    frames.add_metric(["sent"], broker.get("frames_sent", 0))
    frames.add_metric(["dropped"], broker.get("frames_send_dropped", 0))
    bundles = CounterMetricFamily(
        "zfab_broker_bundles_total", "Bundles (several messages as one) through the broker socket", labels=["direction"]
    )
    for direction in ("received", "sent", "rejected"):
        bundles.add_metric([direction], broker.get(f"bundles_{direction}", 0))
    idle = CounterMetricFamily(
        "zfab_broker_idle_polls_total",
        "Idle waits of the broker's owner that looked for work before sleeping (ZFAB_BROKER_IDLE_POLL_US), by "
        "whether the look found it (found) or ended in a sleep (slept)",
        labels=["outcome"],
    )
    for outcome in ("found", "slept"):
        idle.add_metric([outcome], broker.get(f"idle_polls_{outcome}", 0))
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
        ("broker_services", "services", "services_capacity"),
        ("broker_finished_jobs", "jobs_finished_remembered", "jobs_finished_capacity"),
        ("broker_unknown_workers", "unknown_workers_remembered", "unknown_workers_capacity"),
        ("broker_gone_workers", "gone_workers_remembered", "gone_workers_capacity"),
        ("broker_identities", "identities_bound", "identities_capacity"),
        ("broker_client_keepalives", "client_keepalives", "client_keepalives_capacity"),
        ("broker_queued_notices", "queued_notices", "queued_notices_capacity"),
        ("broker_bundle_peers", "bundle_peers", "bundle_peers_capacity"),
        ("broker_limit_buckets", "limit_buckets", "limit_buckets_capacity"),
        ("broker_mmi_audit", "mmi_audit_entries", "mmi_audit_capacity"),
    ):
        tables.add_metric([table], broker.get(size, 0))
        table_caps.add_metric([table], broker.get(capacity, 0))
    uptime = GaugeMetricFamily("zfab_broker_uptime_seconds", "Seconds since the broker started")
    uptime.add_metric([], broker.get("uptime_s", 0))
    # The broker's resident memory and its returns of freed memory to the OS (service/broker/memory.py):
    # what a flood of frames leaves behind shows here, not in any table (docs/broker-memory.md).
    rss = GaugeMetricFamily("zfab_broker_resident_bytes", "Resident memory of the broker process")
    rss.add_metric([], broker.get("rss_bytes", 0))
    trims = CounterMetricFamily(
        "zfab_broker_memory_trims", "Times the broker gave freed memory back to the OS (malloc_trim)"
    )
    trims.add_metric([], broker.get("memory_trims", 0))
    released = CounterMetricFamily("zfab_broker_memory_released_bytes", "Resident bytes those trims gave back")
    released.add_metric([], broker.get("memory_released_bytes", 0))
    own = [depth, cap, frames, bundles, idle, rejected, events, purged, clients, tables, table_caps]
    return [*own, uptime, rss, trims, released, *term_families(broker)]


def term_families(broker: dict[str, Any]) -> list[Metric]:
    """The broker's term (service/broker/term.py, docs/failover.md): role, epoch, lease age, take-overs."""
    active = GaugeMetricFamily(
        "zfab_broker_active", "1 while this broker serves (it holds the lease, or no lease is configured), else 0"
    )
    active.add_metric([], 1 if broker.get("role") in ("active", "single") else 0)
    epoch = GaugeMetricFamily("zfab_broker_epoch", "The highest lease generation this broker has seen (0: no lease)")
    epoch.add_metric([], broker.get("epoch") or 0)
    age = GaugeMetricFamily("zfab_broker_lease_age_seconds", "Seconds since this broker last read the lease")
    age.add_metric([], broker.get("lease_age") or 0)
    failovers = CounterMetricFamily("zfab_broker_failovers", "Times this broker took the lease over from another term")
    failovers.add_metric([], broker.get("failovers") or 0)
    errors = CounterMetricFamily("zfab_broker_lease_errors", "Lease round trips that found its engine unreachable")
    errors.add_metric([], broker.get("lease_errors") or 0)
    settling = GaugeMetricFamily(
        "zfab_broker_settling_jobs", "Resubmitted jobs a new term holds until their workers said what they hold"
    )
    settling.add_metric([], broker.get("settling") or 0)
    settling_bytes = GaugeMetricFamily("zfab_broker_settling_bytes", "Those jobs' bodies, in bytes")
    settling_bytes.add_metric([], broker.get("settling_bytes") or 0)
    return [active, epoch, age, failovers, errors, settling, settling_bytes]


class FabricCollector(Collector):
    """Exports the fabric from a function that returns (show_broker, show_workers, show_services)."""

    def __init__(self, fetch: Callable[[], Snapshot], role: str) -> None:
        self.fetch = fetch
        self.role = role

    def collect(self) -> Iterable[Metric]:
        try:
            broker, workers, services = self.fetch()
        except Exception as exc:  # a scrape must still answer: broker_up says 0
            log.debug("fabric metrics unavailable: %s", exc)
            broker, workers, services = {}, [], []
        yield build_info(self.role)
        yield from fabric_families(broker, workers, services)


def broker_collector(broker: Broker) -> FabricCollector:
    def fetch() -> Snapshot:
        return (
            broker.snapshot("show_broker"),
            broker.snapshot("show_workers", {"gone": True}),
            broker.snapshot("show_services"),
        )

    return FabricCollector(fetch, "broker")
