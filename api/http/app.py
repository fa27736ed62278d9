"""The FastAPI app: `create_app()` builds it; its lifespan owns the one `service.Client`."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from zfab import AioTransport, Client
from zfab.core.access import AccessFile
from zfab.metrics import ClientMetrics, FabricCollector, JobMetrics, version

from ..fabric import FabricView
from ..jobs.admission import TaskSchemas
from ..jobs.recovery import recover_unfinished
from ..jobs.shares import CallerShares
from ..jobs.table import JobTable
from ..settings import ApiSettings
from ..state import ApiState
from ..store.persister import Persister
from ..stores import open_stores
from . import console, docs, lean, problems
from .audit import AuditLog, AuditMiddleware
from .auth import TokenSet
from .brokeraudit import BrokerAudit
from .jobmetrics import JobTableCollector
from .middleware import BodyLimitMiddleware, ContentTypeMiddleware, HeadMiddleware, HttpMetrics, MetricsMiddleware
from .origins import OriginGuardMiddleware
from .routes import access, audit, events, files, jobs, mmi, ops, schedules, topics

log = logging.getLogger(__name__)

# A full client queue blocks submit() for up to this long. On the event loop every request
# would stall with it, so the API waits briefly and answers 503 + Retry-After instead.
API_SUBMIT_TIMEOUT = 0.05

TAGS = [
    {"name": "jobs", "description": "Submit jobs, wait for them, read their results, cancel them"},
    {"name": "files", "description": "Download files from files-service workers"},
    {"name": "mmi", "description": "The broker's management interface: workers, services, tasks"},
    {"name": "schedules", "description": "Run a job periodically: every N seconds or on a cron expression"},
    {"name": "ops", "description": "Health, readiness and Prometheus metrics (no auth)"},
    {"name": "audit", "description": "Who changed what, when, from where, and the outcome (admins)"},
    {"name": "access", "description": "The caller's role and scope (docs/roles.md)"},
]


# FastAPI 0.16x traces requests with OpenTelemetry once an SDK is configured (an incoming
# `traceparent` continued). Its metrics and logs would duplicate zfab's own, and checking for their
# providers on every request cost 2 % of the API's CPU per job under wrk: tracing only.
TELEMETRY: dict[str, Any] = (
    {"telemetry": {"metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class MergedCollector(Collector):
    """Collects several collectors as one, merging families they share.

    The client and the fabric both report `zfab_queue_depth` (different hops); a
    registry that output the family twice would break the exposition format.
    """

    def __init__(self, collectors: Iterable[Collector]) -> None:
        self.collectors = list(collectors)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for collector in self.collectors:
            for family in collector.collect():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()


class ZfabAPI(FastAPI):
    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        problems.add_problem_schema(schema)
        return schema


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """A new app with its own metrics registry (so several can live in one process)."""
    s = settings or ApiSettings()
    # The access file's tokens, reloaded when it changes (zfab/core/access.py); ZFAB_API_TOKENS' are admins.
    tokens = TokenSet(s.token_list(), AccessFile(s.access_file) if s.access_file else None)
    tracebacks = TokenSet(s.traceback_token_list()).principals()
    # From here on only the digests: the settings the app keeps no longer carry the tokens.
    s = s.model_copy(update={"api_tokens": "", "api_traceback_tokens": ""})
    s._traceback_principals = tracebacks
    registry = CollectorRegistry()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        table = JobTable(s.job_history, asyncio.get_running_loop(), max_bytes=s.job_history_bytes)
        stores = await open_stores(s)
        store = stores.jobs
        audit_log.store = stores.audit  # None: memory only (no ZFAB_API_DB)
        if store is not None:
            for rec in await store.load(s.broker):
                table.add(rec, persist=False)
            log.info("zfab api: %d jobs from %s", len(table), store.label)
        client_settings = s.model_copy(update={"submit_timeout": min(s.submit_timeout, API_SUBMIT_TIMEOUT)})
        # queued_notice=0: a POST answers with the job's state, so the broker says "queued" at once.
        # The client's socket is owned by this event loop (service/transport/aioloop.py): a job is
        # queued from its handler and sent in one pass at the end of the loop's iteration, its replies
        # read here, so no thread is handed over to and no future bridged between threads.
        # encoded_results: a finished job's result is held as the JSON it came as (the table counts what it
        # holds: decoded, a nested result is many times its bytes) and decoded when read.
        job_metrics = JobMetrics(registry)  # the client's finished jobs feed its histograms
        client = Client(
            broker=s.broker,
            name="api",
            settings=client_settings,
            queued_notice=0,
            transport=AioTransport(),
            encoded_results=True,
            on_complete=(job_metrics.observe,),
        )
        client.start()
        # The MMI commands keys sent the broker directly, into the audit log (api/http/brokeraudit.py).
        broker_audit = asyncio.create_task(BrokerAudit(client, audit_log).run(), name="api broker audit")
        # Merged with the fabric's families: both export zfab_queue_depth, and a family may appear once.
        client_metrics = ClientMetrics(client, registry, jobs=job_metrics, register=False)
        view = FabricView(client, s.mmi_cache_seconds)
        shares = CallerShares(s.max_client_jobs, s.client_inflight_bytes, s.api_caller_share)
        merged = MergedCollector(
            [client_metrics, FabricCollector(view.snapshot, role="api"), JobTableCollector(table, shares, audit_log)]
        )
        registry.register(merged)
        persister = Persister(store, table, s.broker) if store is not None else None
        if persister is not None:
            persister.start()
        app.state.zfab = st = ApiState(
            settings=s,
            client=client,
            jobs=table,
            fabric=view,
            schemas=TaskSchemas(),
            store=store,
            persister=persister,
            schedules=stores.schedules,
            replicas=stores.replicas,
            shares=shares,
        )
        if stores.replicas is not None:
            # PostgreSQL only (psycopg is not imported otherwise): the job layer reaches the others
            # through the Cluster interface (api/jobs/cluster.py) this implements.
            from ..replicas.cluster import ReplicaCluster
            from ..replicas.remote import adopted, recover_pending, run_command
            from ..store.postgres import PgJobStore

            assert isinstance(store, PgJobStore)
            st.cluster = ReplicaCluster(st, stores.replicas, store)
            stores.replicas.on_command = lambda op, uuid, body: run_command(st, op, uuid, body)
            stores.replicas.on_adopted = lambda recs: adopted(st, recs)
            stores.replicas.on_beat = lambda: recover_pending(st)
            await stores.replicas.start()
            log.info("zfab api: replica %s of the API on %s", stores.replicas.id, store.label if store else "")
        # Jobs the database holds as unfinished are re-established without waiting for a read: a
        # queued one is submitted again, a running one asked of its workers (api/jobs/recovery.py).
        recovering = asyncio.create_task(recover_unfinished(st), name="api recovery")
        if not tokens:
            log.warning("no ZFAB_API_TOKENS configured: the API serves loopback clients only, without auth")
        log.info("zfab api: broker %s", s.broker)
        try:
            yield
        finally:
            recovering.cancel()
            broker_audit.cancel()
            app.state.zfab = None
            for collector in (merged, job_metrics.duration, job_metrics.hop):
                registry.unregister(collector)
            if persister is not None:
                # Before the client closes: closing fails its pending jobs, which must stay pending on disk.
                await persister.stop()
            if stores.replicas is not None:
                # After the last write: once deregistered, the other replicas adopt our unfinished jobs.
                await stores.replicas.stop()
            await client.aclose()  # flushes within the loop's linger bound, without blocking the loop
            await audit_log.drain()
            audit_log.store = None
            await stores.close()
            log.info("zfab api: fabric client closed")

    app = ZfabAPI(
        title="zfab",
        version=version(),
        summary="HTTP control plane of the zfab job fabric",
        description="Submit jobs to the fabric's workers and read their results as dictionaries keyed by worker "
        "name; inspect the fabric (MMI); scrape Prometheus metrics. Errors are `application/problem+json`.",
        openapi_tags=TAGS,
        lifespan=lifespan,
        docs_url=None,  # served from packaged assets instead of a CDN (api/http/docs.py)
        redoc_url=None,
        **TELEMETRY,
    )
    app.state.registry = registry
    app.state.tokens = tokens
    app.state.audit = audit_log = AuditLog(s.api_audit_count, s.api_audit_days * 86400)
    app.state.zfab = None
    problems.install(app)
    docs.install(app)
    app.include_router(jobs.router)
    app.include_router(events.router)
    app.include_router(files.router)
    app.include_router(mmi.router)
    app.include_router(ops.router)
    app.include_router(schedules.router)  # its lifespan (the scheduler) runs inside the one above
    app.include_router(topics.router)  # GET /events?topic=PREFIX; its lifespan closes the hub
    app.include_router(audit.router)  # GET /audit, admins only (zfab/core/access.py)
    app.include_router(access.router)  # GET /me: the caller's role, for the console
    app.include_router(console.router)  # /ui, and / leading to it (api/http/console/)
    lean.install(app)  # in front of the documented POST /jobs: its common request, without FastAPI's per-request work
    # The last middleware added is the outermost: metrics see every answer, 413s and 415s included.
    app.add_middleware(HeadMiddleware, routes=app.router.routes)
    app.add_middleware(ContentTypeMiddleware, routes=app.router.routes)
    app.add_middleware(BodyLimitMiddleware, max_bytes=s.max_request_bytes)
    # Before anything reads the request: a rebound Host or another origin's page gets nothing (api/http/origins.py).
    app.add_middleware(OriginGuardMiddleware, hosts=s.host_list(), origins=s.origin_list())
    app.add_middleware(MetricsMiddleware, metrics=HttpMetrics(registry))
    app.add_middleware(AuditMiddleware, log=audit_log)  # outermost: every state-changing call and its outcome
    return app
