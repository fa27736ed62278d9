"""A small HTTP client of the zfab API for the command line: JSON requests, problem documents as
errors, server-sent events. Standard library only, so `zfab submit` starts fast and needs nothing more.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
REQUEST_TIMEOUT = 30.0
# Longer than the API's SSE keep-alive comments (ZFAB_SSE_PING_SECONDS, 15 s by default): a read that
# outlasts it means the connection is gone, not that the job is quiet.
STREAM_READ_TIMEOUT = 60.0


class ApiUnreachable(Exception):
    """The API did not answer at all (refused, timed out, not HTTP)."""


class ApiError(Exception):
    """The API answered with an error status; `problem` is its problem document (or a stand-in)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        title = problem.get("title") or "HTTP error"
        detail = problem.get("detail") or ""
        super().__init__(f"{status} {title}" + (f": {detail}" if detail else ""))


@dataclass(slots=True)
class Event:
    """One server-sent event: its `event` name (default "message"), `id` and JSON `data`."""

    event: str = "message"
    id: str | None = None
    data: Any = None


@dataclass(slots=True)
class ApiClient:
    base: str = DEFAULT_URL
    token: str | None = None
    timeout: float = REQUEST_TIMEOUT
    headers: dict[str, str] = field(default_factory=dict)

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return self.base.rstrip("/") + path + (("?" + urllib.parse.urlencode(q, doseq=True)) if q else "")

    def _request(
        self, method: str, path: str, body: Any, query: Mapping[str, Any] | None, extra: Mapping[str, str]
    ) -> urllib.request.Request:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path, query), data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for k, v in {**self.headers, **extra}.items():
            req.add_header(k, v)
        return req

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The decoded JSON answer (None for an empty one); ApiError or ApiUnreachable otherwise."""
        req = self._request(method, path, body, query, {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _problem_of(exc.code, exc.read(), exc.reason)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiUnreachable(f"{self.base} answered something that is not JSON: {raw[:80]!r}") from None

    def events(self, path: str, last_event_id: str | None = None) -> Iterator[Event]:
        """The server-sent events of `path` as they arrive, until the server closes the stream."""
        extra = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            extra["Last-Event-ID"] = last_event_id
        req = self._request("GET", path, None, None, extra)
        try:
            resp = urllib.request.urlopen(req, timeout=STREAM_READ_TIMEOUT)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _problem_of(exc.code, exc.read(), exc.reason)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None
        with resp:
            if resp.status == 204:
                return
            ev = Event()
            data: list[str] = []
            while True:
                try:
                    raw = resp.readline()
                except OSError as exc:  # a timeout too (TimeoutError is an OSError)
                    raise self._unreachable(exc) from None
                if not raw:
                    return
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if not line:  # a blank line dispatches the event gathered so far
                    if data:
                        ev.data = _json_or_text("\n".join(data))
                        yield ev
                    ev, data = Event(), []
                    continue
                if line.startswith(":"):
                    continue  # a comment: the server's keep-alive
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    data.append(value)
                elif name == "event":
                    ev.event = value
                elif name == "id":
                    ev.id = value

    def _unreachable(self, exc: BaseException) -> ApiUnreachable:
        reason = getattr(exc, "reason", None) or exc
        return ApiUnreachable(f"cannot reach the API at {self.base}: {reason} (--api, ZFAB_API_URL)")


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _problem_of(status: int, raw: bytes, reason: Any) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        return doc
    return {"status": status, "title": str(reason or "HTTP error"), "detail": raw.decode(errors="replace")[:200]}
