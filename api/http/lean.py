"""POST /jobs on a lean path: the request the API is measured by, without FastAPI's per-request machinery.

The documented route (routes/jobs.py) resolves a dependency for auth, four parameters and the body,
validates the body through `json.loads` and then the model, and re-validates the answer against its
response model: about a third of the API's CPU per job under wrk (profiled with py-spy). This route,
placed in front of it, serves the common request: no Idempotency-Key, no Prefer header, no query
but `wait`, a caller the auth rules accept. It reads the body, validates it once from its JSON
bytes (pydantic's Rust parser), runs the same `submit` as the documented route, and answers with
the same bytes. Anything else (a bad body, a missing token, an unusual header) goes to the
documented route, body replayed, so every refusal and error is the one that route gives.
"""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import ValidationError
from starlette.routing import BaseRoute, Match
from starlette.types import Message, Receive, Scope, Send

from zfab.core.access import Grant

from ..errors import ProblemError
from ..jobs.operations import submit
from ..models import JobRequest
from ..state import ApiState
from .auth import GRANT, TokenSet, caller_of
from .routeindex import flat_routes
from .routes.jobs import submitted

# `wait=N`, and nothing else, in the query (a number FastAPI's `ge=0, allow_inf_nan=False` accepts).
WAIT_ONLY = re.compile(rb"^wait=([0-9]{1,9}(?:\.[0-9]{1,9})?)$")
PASSED = "zfab.lean.passed"  # scope key: this request was handed to the documented route
SLOW_HEADERS = frozenset({b"idempotency-key", b"prefer"})


class LeanSubmitRoute(BaseRoute):
    """POST /jobs for the common request; `documented` is the route that serves the rest and the schema."""

    methods = {"POST"}
    body_field = True  # to ContentTypeMiddleware: this route takes a JSON body (415 otherwise)

    def __init__(self, documented: Any) -> None:
        self.documented = documented
        self.path = str(documented.path)  # the metrics' route label: the same template as the documented route

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != scope.get("root_path", "") + self.path
            or PASSED in scope
        ):
            return Match.NONE, {}
        query = scope.get("query_string", b"")
        if query and WAIT_ONLY.match(query) is None:
            return Match.NONE, {}
        for name, value in scope["headers"]:
            if name in SLOW_HEADERS or (name == b"authorization" and not value.startswith(b"Bearer ")):
                return Match.NONE, {}
        return Match.FULL, {"route": self.documented, "endpoint": self.documented.endpoint}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = scope["app"]
        st: ApiState | None = getattr(app.state, "zfab", None)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the caller hung up before its body arrived
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        began = time.monotonic()  # read: the job's `api` hop (its hop trace) starts
        req: JobRequest | None = None
        found = _caller(app.state.tokens, scope) if st is not None else None
        caller = found[0] if found is not None else None
        if found is not None and found[1].allows("submit"):
            try:
                req = JobRequest.model_validate_json(body)
            except ValidationError:
                req = None  # the documented route names each bad field, or the JSON's line and column
            # Outside the caller's scope: the documented route answers (a dict lookup per job, cached by name).
            if req is not None and not found[1].sees(req.service):
                req = None
        if st is None or req is None or found is None or caller is None:
            await self._documented(scope, receive, send, body)
            return
        query = scope.get("query_string", b"")
        bound = min(float(query[5:]), st.settings.default_wait_max) if query else None
        grant = found[1]
        # The audit log's actor, a refusal's too (auth.py's require_auth leaves it there on the other route).
        scope[GRANT] = grant
        # The coroutine holds the request until it has submitted it; this frame lets go of it now, so a
        # long ?wait does not pin its decoded arguments (the table holds its JSON, `body`, counted).
        submitting = submit(st, req, None, "", bound, began=began, raw=body, caller=caller, submitter=grant.name)
        del req
        rec, fresh = await submitting
        answer = await submitted(st, rec, fresh, bound, scope.get("root_path", ""), False, caller, grant.payloads)
        app.state.audit.submitted(scope, rec.uuid, answer.status_code)
        await answer(scope, receive, send)

    async def _documented(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        scope[PASSED] = True
        await scope["app"].router(scope, replay, send)


def _caller(tokens: TokenSet, scope: Scope) -> tuple[str, Grant] | None:
    """The principal and grant require_auth accepts (the same caller_of); None sends the request to the
    documented route, which gives the 401 or 403."""
    client = scope.get("client")
    token = next((v[7:].decode("latin-1").strip() for n, v in scope["headers"] if n == b"authorization"), None)
    try:
        return caller_of(tokens, client[0] if client else None, token)
    except ProblemError:
        return None


def install(app: Any) -> None:
    """Put the lean route in front of the documented POST /jobs (call after the routers are included)."""
    for route in flat_routes(app.router.routes):
        if getattr(route, "path", None) == "/jobs" and "POST" in (getattr(route, "methods", None) or ()):
            app.router.routes.insert(0, LeanSubmitRoute(route))
            return
    raise RuntimeError("no POST /jobs route to put the lean path in front of")
