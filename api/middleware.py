"""Pure ASGI middleware: HTTP request metrics and the request body bound.

Pure ASGI rather than BaseHTTPMiddleware: it runs on every request, including the job
submissions the API is measured by, and costs a few microseconds this way.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import LATENCY_BUCKETS

from .problems import problem

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

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        # The route template ("/jobs/{uuid}"), never the raw path: labels must stay bounded.
        route = getattr(scope.get("route"), "path", None) or UNMATCHED
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        self.requests.labels(route, method, str(status)).inc()
        self.duration.labels(route, method).observe(seconds)


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
