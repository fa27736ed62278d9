"""Prometheus metrics: the fabric as the broker sees it (fabric.py), a worker's own view
(worker.py), a client's (client.py), and the small /metrics + /healthz + /readyz server of the
broker and worker processes (server.py).

Names follow Prometheus conventions: `zfab_` prefix, base units, `_total` counters, bounded
labels (service, task, worker, hop, outcome, reason; never a job id), taking only values the
fabric registered: anything else counts as `other`.
"""

from .base import CONTENT_TYPE, HOPS, LATENCY_BUCKETS, OTHER, build_info, version
from .client import ClientMetrics, JobMetrics
from .fabric import FabricCollector, broker_collector, fabric_families
from .server import health, serve_metrics
from .worker import WorkerCollector

__all__ = [
    "CONTENT_TYPE",
    "HOPS",
    "LATENCY_BUCKETS",
    "OTHER",
    "ClientMetrics",
    "FabricCollector",
    "JobMetrics",
    "WorkerCollector",
    "broker_collector",
    "build_info",
    "fabric_families",
    "health",
    "serve_metrics",
    "version",
]
