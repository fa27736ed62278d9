"""Which POST /jobs requests the lean route takes (api/http/lean.py), and that it sits in front of the documented one.

What it answers is the documented route's answer (the integration tests of POST /jobs, its refusals
and its errors all pass through it); these pin the choice itself, which is pure.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.routing import Match

from zfab.api.http.app import create_app
from zfab.api.http.lean import PASSED, LeanSubmitRoute
from zfab.api.settings import ApiSettings


class Documented:
    path = "/jobs"

    @staticmethod
    def endpoint() -> None:
        return None


def scope(
    method: str = "POST", path: str = "/jobs", query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query,
        "headers": [(b"content-type", b"application/json"), *(headers or [])],
    }


ROUTE = LeanSubmitRoute(Documented())


@pytest.mark.parametrize("query", [b"", b"wait=10", b"wait=0", b"wait=2.5"])
def test_the_common_request_takes_the_lean_route(query: bytes) -> None:
    match, child = ROUTE.matches(scope(query=query, headers=[(b"authorization", b"Bearer t")]))
    assert match is Match.FULL
    assert child["route"] is ROUTE.documented  # metrics label it as the documented route's template


@pytest.mark.parametrize(
    "s",
    [
        scope(headers=[(b"idempotency-key", b"k1")]),
        scope(headers=[(b"prefer", b"wait=5")]),
        scope(headers=[(b"authorization", b"Basic dTpw")]),
        scope(query=b"wait=-1"),
        scope(query=b"wait=inf"),
        scope(query=b"wait=10&x=1"),
        scope(query=b"foo=1"),
        scope(method="GET"),
        scope(path="/jobs/abc"),
        {**scope(), PASSED: True},
        {**scope(), "type": "websocket"},
    ],
)
def test_everything_else_goes_to_the_documented_route(s: dict[str, Any]) -> None:
    assert ROUTE.matches(s)[0] is Match.NONE


def test_it_is_installed_in_front_of_the_documented_route() -> None:
    app = create_app(ApiSettings(broker="tcp://127.0.0.1:1"))
    first = app.router.routes[0]
    assert isinstance(first, LeanSubmitRoute)
    assert first.documented.path == "/jobs" and "POST" in first.documented.methods
    assert first.documented.endpoint.__name__ == "submit_job"
