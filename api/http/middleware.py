"""Pure ASGI middleware: HTTP request metrics, the request body bound, JSON-only bodies, HEAD.

Pure ASGI rather than BaseHTTPMiddleware: it runs on every request, including the job
submissions the API is measured by, and costs a few microseconds this way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zfab.metrics import LATENCY_BUCKETS

from .problems import problem
from .routeindex import full_match

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "<unmatched>"


class HttpMetrics:
    """zfab_http_requests_total and zfab_http_request_duration_seconds, labelled by route template."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "zfab_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=registry
        )
        self.duration = Histogram(
            "zfab_http_request_duration_seconds",
            "Time to answer an HTTP request (a ?wait= request includes its wait)",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        # The route template ("/jobs/{uuid}"), never the raw path: labels must stay bounded.
        route = getattr(scope.get("route"), "path", None) or UNMATCHED
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:
            # Looked up once per (route, method, status), all bounded: labels() locks and builds a key.
            children = self._children[key] = (
                self.requests.labels(route, method, str(status)),
                self.duration.labels(route, method),
            )
        children[0].inc()
        children[1].observe(seconds)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the server answers if the app raises before starting a response

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe(scope, status, time.perf_counter() - start)


class BodyLimitMiddleware:
    """Refuse request bodies over `max_bytes` with 413, before they are buffered whole.

    A declared Content-Length is refused at once; a chunked body is counted as it arrives
    (the HTTPException raised from `receive` reaches the app's 413 problem handler).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> str:
        return f"request body larger than {self.max_bytes} bytes (ZFAB_MAX_REQUEST_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                response = problem(413, "too-large", "Request body too large", self._too_large())
                await response(scope, receive, send)
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, counted, send)


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON = "application/json"


def is_json(content_type: str) -> bool:
    """application/json or any application/*+json, whatever its parameters (charset)."""
    media = content_type.partition(";")[0].strip().lower()  # cheap: every POST /jobs passes here
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


class ContentTypeMiddleware:
    """415 for a body that is not JSON, sent to a route that takes a JSON body.

    FastAPI reads such a body as bytes and answers 422 "Input should be a valid dictionary",
    which sends the caller looking at their fields instead of at their Content-Type header.
    Only requests with a body to a route that has a body parameter are checked, so a wrong
    method still gets its 405 and a bodiless POST its 422 "field required".
    """

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # the app's live route list: routers included later are seen too

    def _takes_json(self, scope: Scope) -> bool:
        return getattr(full_match(self.routes, scope), "body_field", None) is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        length, ctype_raw, chunked = b"", b"", False
        for name, value in scope["headers"]:  # one pass, no dict: every POST /jobs comes through here
            if name == b"content-type":
                ctype_raw = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        if ctype_raw == b"application/json":
            await self.app(scope, receive, send)
            return
        has_body = chunked or (length.isdigit() and int(length) > 0)
        ctype = ctype_raw.decode("latin-1")
        if has_body and not is_json(ctype) and self._takes_json(scope):  # route lookup only when not JSON
            method = scope["method"]
            got = f"Content-Type {ctype}" if ctype else "no Content-Type"
            response = problem(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                f"{method} {scope['path']} takes a JSON body: send it with Content-Type: {JSON} (got {got})",
                {f"Accept-{method.title()}": JSON} if method != "PUT" else None,
                expected=JSON,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class HeadMiddleware:
    """HEAD wherever GET is: the GET answer's status and headers (Content-Length included), no body.

    FastAPI routes declared with @get do not serve HEAD (Starlette's plain routes would). The answer
    ends as soon as its headers are out and the handler is cancelled then, so a streamed answer (an
    event stream that has nothing to send yet, a download) never holds a HEAD open.
    """

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or full_match(self.routes, scope) is not None:
            await self.app(scope, receive, send)  # not HEAD, or a route of its own serves it (files)
            return
        ended = asyncio.Event()

        async def headers_only(message: Message) -> None:
            if ended.is_set():
                return
            if message["type"] == "http.response.start":
                # The server must see HEAD again before the answer starts: uvicorn's httptools
                # protocol reads the method from the scope to leave the body (and a chunked
                # terminator) out; h11 remembers the request's method itself.
                scope["method"] = "HEAD"
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                ended.set()

        # In place, so outer middleware (metrics) sees the route the GET matched; put back after.
        scope["method"] = "GET"
        try:
            handler = asyncio.ensure_future(self.app(scope, receive, headers_only))
            stop = asyncio.ensure_future(ended.wait())
            try:
                await asyncio.wait({handler, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                if not handler.done():
                    handler.cancel()
                    with suppress(asyncio.CancelledError):
                        await handler
            if not handler.cancelled() and not ended.is_set():
                handler.result()  # the handler failed before answering: let the server say 500
        finally:
            scope["method"] = "HEAD"
