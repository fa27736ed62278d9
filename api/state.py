"""What the app's lifespan owns, read by handlers through `api_state(request)`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from service import Client

from .admission import TaskSchemas
from .fabric import FabricView
from .jobtable import JobTable
from .problems import unavailable
from .settings import ApiSettings


@dataclass(slots=True)
class ApiState:
    settings: ApiSettings
    client: Client
    jobs: JobTable
    fabric: FabricView
    schemas: TaskSchemas = field(default_factory=TaskSchemas)  # task argument schemas, from the broker


def api_state(request: Request) -> ApiState:
    """The lifespan's state; a plain call rather than a FastAPI dependency, which costs more per request."""
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    if st is None:  # outside the lifespan: starting up or shutting down
        raise unavailable("the API is starting or stopping; retry shortly")
    return st
