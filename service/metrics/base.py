"""What every zfab metric shares: names, buckets, the build info family, histogram export."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HOPS = ("client_to_broker", "broker_to_worker", "worker_queue", "worker_run", "worker_to_client")
OTHER = "other"  # the label value for anything the fabric did not register (a request's made-up name)


def version() -> str:
    try:
        return importlib.metadata.version("zfab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_info(role: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily("zfab_build_info", "zfab version and process role", labels=["version", "role"])
    g.add_metric([version(), role], 1.0)
    return g


def add_histogram(fam: HistogramMetricFamily, labels: list[str], snapshot: dict[str, Any] | None) -> None:
    """One labelled histogram from a core.histogram snapshot ({"buckets": [[le, n]...], "sum", "count"})."""
    if not snapshot:
        return
    buckets: Iterable[Any] = snapshot.get("buckets") or []
    fam.add_metric(
        labels,
        [(str(le) if le != "+Inf" else "+Inf", float(n)) for le, n in buckets],
        sum_value=float(snapshot.get("sum") or 0.0),
    )
