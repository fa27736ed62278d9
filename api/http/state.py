"""How a handler finds the lifespan's `ApiState`."""

from __future__ import annotations

from fastapi import Request

from ..errors import unavailable
from ..state import ApiState


def api_state(request: Request) -> ApiState:
    """The lifespan's state; a plain call rather than a FastAPI dependency, which costs more per request."""
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    if st is None:  # outside the lifespan: starting up or shutting down
        raise unavailable("the API is starting or stopping; retry shortly")
    return st
