"""Which routes serve a request's path, across FastAPI versions.

FastAPI 0.160+ keeps included routers as lazy branches in `app.router.routes`; older versions
copy every route there. `flat_routes` gives the routes either way, each with `matches(scope)`,
`methods` and, for API routes, `body_field`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fastapi.routing
from starlette.routing import BaseRoute, Match

METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def flat_routes(routes: Sequence[BaseRoute]) -> Iterable[Any]:
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    return flatten(routes) if flatten is not None else routes


def full_match(routes: Sequence[BaseRoute], scope: Mapping[str, Any]) -> Any | None:
    """The route that serves this method at this path, if any."""
    for route in flat_routes(routes):
        match, _ = route.matches(dict(scope))
        if match is Match.FULL:
            return route
    return None


def methods_at(routes: Sequence[BaseRoute], scope: Mapping[str, Any]) -> list[str]:
    """Every method some route serves at this path, in the usual order (HEAD wherever GET is:
    see middleware.HeadMiddleware)."""
    found: set[str] = set()
    for route in flat_routes(routes):
        methods = getattr(route, "methods", None)
        if methods and route.matches(dict(scope))[0] is not Match.NONE:
            found |= set(methods)
    if "GET" in found:
        found.add("HEAD")
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    return sorted(found, key=lambda m: (rank.get(m, len(rank)), m))
