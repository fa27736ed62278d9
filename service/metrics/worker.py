"""A worker's own view: its queues, tables, connection, and jobs per task (declared tasks only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .base import add_histogram, build_info, shm_families

if TYPE_CHECKING:
    from ..worker.worker import Worker


class WorkerCollector(Collector):
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
            ("worker_started_notices", "started_notices_waiting", "started_notices_capacity"),
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
        yield from self._tasks(w)
        tables = GaugeMetricFamily("zfab_table_size", "Entries in a bounded table", labels=["table"])
        tables.add_metric(["worker_recent_jobs"], st["jobs_remembered"])
        yield tables
        table_caps = GaugeMetricFamily("zfab_table_capacity", "Bound of a table", labels=["table"])
        table_caps.add_metric(["worker_recent_jobs"], st["jobs_remembered_capacity"])
        yield table_caps
        tbytes = GaugeMetricFamily("zfab_table_bytes", "Bytes held by a bounded table", labels=["table"])
        tbytes.add_metric(["worker_recent_jobs"], st["jobs_remembered_bytes"])
        tbytes.add_metric(["shm_blocks"], st["shm_bytes"])  # its shared-memory blocks, busy and pooled
        tbytes.add_metric(["worker_store_parked"], st["store_parked_bytes"])  # journaled, not in SQLite yet
        yield tbytes
        tbcap = GaugeMetricFamily("zfab_table_bytes_capacity", "Byte bound of a table", labels=["table"])
        tbcap.add_metric(["worker_recent_jobs"], st["jobs_remembered_bytes_capacity"])
        tbcap.add_metric(["shm_blocks"], st["shm_bytes_capacity"])
        tbcap.add_metric(["worker_store_parked"], st["store_parked_bytes_capacity"])
        yield tbcap
        yield from shm_families(st)
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
            (
                "zfab_worker_jobs_dropped_total",
                "Jobs dropped unstarted after the broker gave them up",
                st["jobs_dropped"],
                True,
            ),
            (
                "zfab_worker_results_oversize_total",
                "Results and events over the message limit",
                st["results_oversize"],
                True,
            ),
            (
                "zfab_worker_payloads_not_stored_total",
                "Request bodies and results over ZFAB_WORKER_STORE_PAYLOAD_BYTES, kept in memory only",
                st["payloads_not_stored"],
                True,
            ),
            (
                "zfab_worker_handler_errors_total",
                "Requests a handler failed on (answered 500)",
                st["handler_errors"],
                True,
            ),
        ):
            fam = (CounterMetricFamily if counter else GaugeMetricFamily)(name, doc, labels=["service", "worker"])
            fam.add_metric(labels, float(value))
            yield fam

    def _tasks(self, w: Worker) -> Iterator[Metric]:
        """Jobs by task and outcome, run time and wait: every declared task, every outcome, from 0."""
        jobs = CounterMetricFamily(
            "zfab_task_jobs_total", "Jobs a worker finished, by task and outcome", labels=["service", "task", "outcome"]
        )
        run = HistogramMetricFamily("zfab_task_run_seconds", "Task run time", labels=["service", "task"])
        wait = HistogramMetricFamily(
            "zfab_task_wait_seconds", "Time from the broker's admission to the task's start", labels=["service", "task"]
        )
        for task, stats in sorted(w.runner.task_stats.items()):
            for outcome, n in stats.outcomes.items():
                jobs.add_metric([w.service_name, task, outcome], float(n))
            add_histogram(run, [w.service_name, task], stats.run.snapshot())
            add_histogram(wait, [w.service_name, task], stats.wait.snapshot())
        yield jobs
        yield run
        yield wait
