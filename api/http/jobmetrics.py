"""The API's own tables in its /metrics: the job table (entries and bytes, against their bounds), the
callers' shares of the jobs in flight (api/jobs/shares.py) and the audit log's entries waiting for the
database (api/http/audit.py), merged with the client's families."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..jobs.shares import BOUNDS, CallerShares
from ..jobs.table import JobTable
from .audit import AuditLog


class JobTableCollector(Collector):
    def __init__(self, table: JobTable, shares: CallerShares, audit: AuditLog | None = None) -> None:
        self.table = table
        self.shares = shares
        self.audit = audit

    def collect(self) -> Iterator[Metric]:
        t, sh = self.table, self.shares
        size = GaugeMetricFamily("zfab_table_size", "Entries in a bounded table", labels=["table"])
        size.add_metric(["api_jobs"], len(t))
        size.add_metric(["api_callers"], len(sh))
        cap = GaugeMetricFamily("zfab_table_capacity", "Bound of a table", labels=["table"])
        cap.add_metric(["api_jobs"], t.capacity)
        if self.audit is not None:
            size.add_metric(["api_audit_pending"], self.audit.pending)
            cap.add_metric(["api_audit_pending"], self.audit.MAX_PENDING)
            dropped = CounterMetricFamily(
                "zfab_api_audit_dropped",
                "Audit entries not written to the database: too many were waiting for it (kept in memory only)",
            )
            dropped.add_metric([], self.audit.dropped)
            yield dropped
            errors = CounterMetricFamily(
                "zfab_api_audit_write_errors", "Batches of audit entries the database refused (kept in memory only)"
            )
            errors.add_metric([], self.audit.write_errors)
            yield errors
        yield size
        yield cap
        # Requests (as JSON), results (as JSON) and events (as objects) of the jobs it holds.
        tbytes = GaugeMetricFamily("zfab_table_bytes", "Bytes held by a bounded table", labels=["table"])
        tbytes.add_metric(["api_jobs"], t.bytes)
        yield tbytes
        tbcap = GaugeMetricFamily("zfab_table_bytes_capacity", "Byte bound of a table", labels=["table"])
        tbcap.add_metric(["api_jobs"], t.max_bytes)
        yield tbcap
        refused = CounterMetricFamily(
            "zfab_api_caller_share_refused",
            "Jobs refused (429) because their caller held its share of the jobs in flight (ZFAB_API_CALLER_SHARE)",
            labels=["bound"],
        )
        for bound in BOUNDS:
            refused.add_metric([bound], sh.refused[bound])
        yield refused
