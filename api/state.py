"""What the app's lifespan owns, read by handlers through `api_state(request)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from service import Client

from .admission import TaskSchemas
from .fabric import FabricView
from .jobtable import JobTable
from .problems import ProblemError, unavailable
from .settings import ApiSettings

if TYPE_CHECKING:
    from .persister import Persister
    from .replicas import Replicas
    from .store import JobStore, ScheduleBackend


@dataclass(slots=True)
class ApiState:
    settings: ApiSettings
    client: Client
    jobs: JobTable
    fabric: FabricView
    schemas: TaskSchemas = field(default_factory=TaskSchemas)  # task argument schemas, from the broker
    store: JobStore | None = None  # the job table beyond memory (ZFAB_API_DB), if any
    persister: Persister | None = None
    schedules: ScheduleBackend | None = None  # where the scheduler keeps schedules (None: its own SQLite/memory)
    replicas: Replicas | None = None  # PostgreSQL: the other replicas sharing the database


def api_state(request: Request) -> ApiState:
    """The lifespan's state; a plain call rather than a FastAPI dependency, which costs more per request."""
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    if st is None:  # outside the lifespan: starting up or shutting down
        raise unavailable("the API is starting or stopping; retry shortly")
    return st


def database_unavailable(detail: str) -> ProblemError:
    """503 for a request the shared database must answer while it does not (api/replicas.py)."""
    return ProblemError(
        503,
        "database-unavailable",
        "Database unavailable",
        f"the API database does not answer: {detail}",
        {"Retry-After": "1"},
    )
