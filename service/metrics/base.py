"""What every zfab metric shares: names, buckets, the build info family, histogram export."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

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


SHM_WAYS = ("sent", "received", "fallbacks", "refused", "expired", "reclaimed")


def shm_families(st: dict[str, int]) -> Iterator[Metric]:
    """The shared-memory tier of a client or worker (transport/shm.py): payloads by way, blocks held."""
    ways = CounterMetricFamily(
        "zfab_shm_payloads_total",
        "Large payloads by the same-host shared-memory tier: sent or received as a handle, sent through the "
        "sockets instead (fallbacks), handles refused; blocks expired or reclaimed from dead processes",
        labels=["way"],
    )
    for way in SHM_WAYS:
        ways.add_metric([way], st[f"shm_{way}"])
    yield ways
    blocks = GaugeMetricFamily("zfab_shm_blocks", "Shared-memory blocks this process made and holds (busy or pooled)")
    blocks.add_metric([], st["shm_blocks"])
    yield blocks
