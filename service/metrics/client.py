"""A client's queues and connection, plus job latency histograms it observes (the API's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core import hoptrace
from .base import LATENCY_BUCKETS, OTHER, shm_families

if TYPE_CHECKING:
    from ..client.client import Client
    from ..client.future import JobFuture

MAX_SERVICE_LABELS = 1000


HOPS = hoptrace.HOPS  # a closed label set: a trace names only these (core/hoptrace.py)


class JobMetrics:
    """Job latency histograms, fed by a client's finished jobs: `Client(on_complete=(m.observe,))`
    (its completion hook, given when the client is made), then `ClientMetrics(client, registry, jobs=m)`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "zfab_job_duration_seconds",
            "Submit to result, as the client sees it",
            ["service", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.hop = Histogram(
            "zfab_job_hop_seconds",
            "Time a job spent at each hop, from its hop trace (each process's own clock: docs/protocol.md)",
            ["hop"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        # Services the broker admitted a job for: only these become label values (a request may
        # name anything; the broker refuses names no worker registered), bounded.
        self.services: set[str] = set()
        # The histograms' children, looked up once: `labels()` takes a lock and builds a key on every
        # call, five to six times per finished job. Bounded like the label values themselves.
        self._hops = {h: self.hop.labels(h) for h in HOPS}
        self._durations: dict[tuple[str, str], Any] = {}
        self.trace_rejected = 0  # hop-trace figures that were no duration, in the traces observed

    def service_label(self, fut: JobFuture, service: str) -> str:
        if service in self.services:
            return service
        adm = fut.admission
        if adm.done() and adm.exception() is None and len(self.services) < MAX_SERVICE_LABELS:
            self.services.add(service)
            return service
        return OTHER

    def observe(self, fut: JobFuture, service: str, outcome: str, results: dict[str, Any] | None) -> None:
        t = fut.timings
        if "submitted" in t and "completed" in t:
            key = (self.service_label(fut, service), outcome)
            child = self._durations.get(key)
            if child is None:
                child = self._durations[key] = self.duration.labels(*key)
            child.observe(max(0.0, t["completed"] - t["submitted"]))
        trace = fut.trace  # built here, on its first read
        self.trace_rejected += fut.trace_rejected
        if trace is not None:
            hops = self._hops
            for view in trace["workers"].values() if "workers" in trace else (trace,):
                for hop, seconds in view["hops"].items():
                    hops[hop].observe(seconds)


class ClientMetrics(Collector):
    def __init__(
        self, client: Client, registry: CollectorRegistry, *, jobs: JobMetrics | None = None, register: bool = True
    ) -> None:
        """`jobs`: the JobMetrics the client's completion hook feeds (made here, and fed by nothing, when
        not given). `register=False` leaves this collector out of `registry` (the histograms still go in),
        for a caller that merges its families with another collector's, as the API does with the fabric's."""
        self.client = client
        self.jobs = jobs if jobs is not None else JobMetrics(registry)
        if register:
            registry.register(self)

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
        tbytes = GaugeMetricFamily("zfab_table_bytes", "Bytes held by a bounded table", labels=["table"])
        tbytes.add_metric(["client_jobs"], c.bytes_in_flight())
        tbytes.add_metric(["shm_blocks"], c.shm.bytes)  # its shared-memory blocks, busy and pooled
        yield tbytes
        tbcap = GaugeMetricFamily("zfab_table_bytes_capacity", "Byte bound of a table", labels=["table"])
        tbcap.add_metric(["client_jobs"], c.settings.client_inflight_bytes)
        tbcap.add_metric(["shm_blocks"], c.shm.cap)
        yield tbcap
        yield from shm_families(c.shm.stats())
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
        tr = CounterMetricFamily(
            "zfab_client_trace_rejected_total",
            "Hop-trace figures that were no duration, and trace frames of a wrong length",
        )
        tr.add_metric([], self.jobs.trace_rejected)
        yield tr
        big = CounterMetricFamily(
            "zfab_client_oversize_total",
            "Requests over the message limit refused before sending, and answers over it (ZFAB_MAX_MESSAGE_BYTES)",
        )
        big.add_metric([], c.counts["oversize"])
        yield big
        rc = CounterMetricFamily("zfab_client_reconnects_total", "New connections after the broker went silent")
        rc.add_metric([], c.counts["reconnects"])
        yield rc
