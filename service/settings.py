"""Settings for every role, from flags or `ZFAB_*` environment variables.

Nothing is read at import time: `Settings()` reads the environment when called.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> str:
    return str(Path.home() / ".local" / "share" / "zfab")


class Settings(BaseSettings):
    """Each field is also the environment variable ZFAB_<FIELD> (upper case)."""

    model_config = SettingsConfigDict(env_prefix="ZFAB_", extra="ignore")

    broker: str = Field("tcp://127.0.0.1:5555", description="Endpoint clients and workers connect to")
    endpoint: str | None = Field(None, description="Endpoint the broker binds (default: ZFAB_BROKER)")
    keepalive_interval: float = Field(2.5, gt=0, description="Seconds between keepalives")
    keepalive_multiplier: int = Field(6, ge=1, description="Missed keepalives before a peer is dead")
    outbound_queue_size: int = Field(10_000, ge=1, description="Frames a loop queues before backpressure")
    submit_timeout: float = Field(1.0, gt=0, description="Seconds a full outbound queue is waited on")
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest accepted message")
    max_inflight_per_worker: int = Field(1000, ge=1, description="Most credits the broker grants one worker")
    max_routes: int = Field(100_000, ge=1, description="Jobs in flight across the whole broker")
    job_queue_size: int = Field(1000, ge=1, description="Jobs a worker holds waiting for its pool")
    pool_size: int = Field(4, ge=1, description="Threads that run jobs in a worker")
    worker_prefetch: int | None = Field(
        None,
        ge=0,
        description="Jobs a worker takes beyond its pool (its credits are pool size + prefetch); unset: "
        "adaptive, 0-64, about 50 ms of waiting work per pool thread at its recent job run times",
    )
    async_concurrency: int = Field(100, ge=1, description="async def tasks a worker runs at once")
    default_worker_credits: int = Field(
        16, ge=1, description="Credits of a worker that announces none (a NorFab 0.25 worker)"
    )
    service_queue_size: int = Field(10_000, ge=1, description="Jobs the broker holds queued per service")
    broker_queue_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Bytes of request bodies the broker holds in all: queued, and sent to workers until they start",
    )
    default_job_timeout: float = Field(
        600.0, gt=0, description="Deadline of a job whose client gives none (NorFab clients), in seconds"
    )
    route_grace: float = Field(
        10.0, ge=0, description="Seconds past a job's deadline before the broker frees its slot, unanswered"
    )
    startup_grace: float | None = Field(
        None,
        ge=0,
        description="Seconds a new broker waits for workers before it calls a service unknown "
        "(default: 2 keepalive intervals + 1 s)",
    )
    max_services: int = Field(1000, ge=1, description="Services the broker remembers")
    service_memory_seconds: float = Field(
        86_400.0, gt=0, description="How long the broker remembers a service with no worker and no queued job"
    )
    gone_worker_seconds: float = Field(
        600.0, ge=0, description="How long metrics still show a worker that left (state dead, gauges 0)"
    )
    max_clients: int = Field(10_000, ge=1, description="Clients the broker remembers (for MMI)")
    worker_recent_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="Bytes of finished jobs a worker keeps in memory for GET (rest: store)"
    )
    worker_store_payload_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="Largest request body or result a worker writes to its job store; larger ones are kept "
        "in memory only (recent jobs) and a later GET says the result was not kept",
    )
    client_inflight_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="Bytes of request bodies and results one client holds at once"
    )
    shm: bool = Field(
        True,
        description="Same-host shared memory: a payload of ZFAB_SHM_THRESHOLD bytes or more travels as a handle "
        "to a block in ZFAB_SHM_DIR when sender and receiver share it (false: always through the sockets)",
    )
    shm_threshold: int = Field(256 * 1024, ge=1024, description="Smallest payload sent through shared memory")
    shm_bytes: int = Field(
        1024 * 1024 * 1024, ge=0, description="Bytes of shared-memory blocks one process may have made and not freed"
    )
    shm_dir: str = Field("/dev/shm", description="The shared-memory directory (a tmpfs) blocks are made in")
    max_events_per_job: int = Field(1000, ge=1, description="Events kept per job (worker store and client)")
    drain_timeout: float = Field(30.0, ge=0, description="Seconds a stopping worker lets admitted jobs finish")
    job_retention_seconds: float = Field(7 * 86400, gt=0, description="How long a worker keeps job records")
    job_retention_count: int = Field(100_000, ge=1, description="Most job records a worker keeps")
    max_client_jobs: int = Field(10_000, ge=1, description="Jobs one client tracks at once")
    data_dir: str = Field(default_factory=default_data_dir, description="Where workers keep job stores")
    metrics_port: int = Field(0, ge=0, le=65535, description="Port for /metrics and /healthz (0 = off)")
    metrics_host: str = Field("127.0.0.1", description="Address for the metrics port")
    log_level: str = Field("INFO", description="Logging level")
    curve_secret: str | None = Field(None, description="This process's CURVE secret certificate (.key_secret)")
    curve_server_key: str | None = Field(None, description="Clients/workers: the broker's public certificate")
    curve_clients: str | None = Field(None, description="Broker: directory of accepted public certificates")
    insecure: bool = Field(False, description="Broker: allow a non-loopback endpoint without CURVE")
    access_file: str | None = Field(
        None,
        description="The access file (TOML, docs/roles.md): bearer tokens by sha256 and CURVE keys by name, each with "
        "its role (viewer, operator, admin), service scope and payloads flag; read again when it changes",
    )
    sched_batch: bool = Field(
        False,
        description="Run the threads zfab starts for its sockets (owner loops, ZeroMQ's I/O threads) under "
        "SCHED_BATCH on Linux, for a host given to the fabric: a thread they wake waits for the waker to sleep "
        "instead of preempting it (a sequential job's p50 a fifth lower), but they no longer preempt CPU-bound "
        "work either (its tail several times higher on a busy host: service/transport/scheduling.py)",
    )
    broker_idle_poll_us: int = Field(
        500,
        ge=0,
        le=10_000,
        description="Broker: how long, in µs, its owner may look for the next message before it sleeps (0: it "
        "sleeps at once). The window adapts per wait, as KVM's halt polling does: it widens while messages come "
        "within it and closes while they do not or when a poll waits over 1 ms for its CPU, so an idle broker "
        "sleeps at once. A stream of sequential jobs then keeps one core busy and its p50 is about 30 % lower "
        "(service/transport/idlepoll.py)",
    )
    hop_traces: bool = Field(
        True,
        description="Time every job at each hop (its final answer carries the durations: docs/protocol.md, Hop "
        "traces); false: no trace frame is sent or added",
    )
    broker_events: str | None = Field(
        None,
        description="Endpoint of the broker's event publisher (XPUB, topics job.<service>.<task>.<state>, "
        "worker.<service>.<worker>.<state>, event.<service>.<worker>, queue.<service>, trace.<service>.<task>): the "
        "broker binds it, subscribers and the API connect to it; unset: no events are published",
    )
    broker_handover: bool = Field(
        False,
        description="ROUTER_HANDOVER: a new connection under an identity in use takes its route (a NorFab worker "
        "reconnecting under its name keeps its READY); lets any peer that knows an identity take its route, so "
        "refused with CURVE",
    )
    broker_inventory: str | None = Field(
        None,
        description="A NorFab inventory (its inventory.yaml, or the directory holding it) the broker serves to NorFab "
        "workers (sid.service.broker get_inventory) and shows (MMI show_broker_inventory); needs zfab[norfab]",
    )
    broker_events_hwm: int = Field(10_000, ge=1, description="Events one subscriber's pipe holds before it drops")
    broker_events_queue: int = Field(
        10_000, ge=1, description="Events the broker's loop hands its publisher thread before it drops them"
    )
    broker_events_subscriptions: int = Field(
        1000, ge=1, description="Subscriptions the broker's event publisher accepts at once"
    )
    broker_lease: str | None = Field(
        None,
        description="Broker: the lease that decides which of several brokers is active (postgresql://...[#NAME] or "
        "k8s://NAMESPACE/NAME, docs/failover.md); unset: this broker is the only one and always serves",
    )
    broker_lease_duration: float = Field(
        1.5, gt=0, description="Broker: seconds the lease is held without a renewal (a standby takes over after it)"
    )
    broker_lease_renew: float = Field(
        0.3, gt=0, description="Broker: seconds between renewals (the standby reads the lease as often)"
    )

    @property
    def bind_endpoint(self) -> str:
        return self.endpoint or self.broker

    @property
    def hold_time(self) -> float:
        return self.keepalive_interval * self.keepalive_multiplier

    @property
    def broker_startup_grace(self) -> float:
        return self.startup_grace if self.startup_grace is not None else 2 * self.keepalive_interval + 1.0


S = TypeVar("S", bound=Settings)


def settings_from(ns: argparse.Namespace, cls: type[S] = Settings, **extra: Any) -> S:  # type: ignore[assignment]
    """The one mapping from command-line flags to settings: environment first, then the flags the
    user actually gave. A flag's `dest` is the field's name (`--port` of `zfab api` is api_port)."""
    given = {k: v for k, v in vars(ns).items() if v is not None and k in cls.model_fields}
    given.update({k: v for k, v in extra.items() if v is not None})
    return cls(**given)
