"""Server-sent events, written in one place: an event's frame (`id:`, `event:`, `data:` lines), the
comment line that keeps an idle stream open, and the response that carries them.

A field ends at a line break, so data that holds one is sent as one `data:` line per line (a reader
joins them back with newlines); the JSON the API sends is compact and never does, so its events are
one line each. The response is never cached, nor buffered by a proxy (nginx reads X-Accel-Buffering).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PING = b": ping\n\n"


def frame(data: str, *, id: int | str | None = None, event: str | None = None) -> bytes:
    """One event: its type (when not the default `message`), its id, and its data."""
    head = (f"event: {event}\n" if event else "") + (f"id: {id}\n" if id is not None else "")
    if "\n" in data or "\r" in data:
        data = "\ndata: ".join(data.splitlines())
    return f"{head}data: {data}\n\n".encode()


def json_frame(obj: Any, *, id: int | str | None = None, event: str | None = None) -> bytes:
    """One event whose data is `obj` as compact JSON (what JSON cannot carry, as its str())."""
    return frame(json.dumps(obj, separators=(",", ":"), default=str), id=id, event=event)


def comment(text: str) -> bytes:
    """A comment line: readers skip it; it says something to whoever watches the raw stream."""
    return f": {' '.join(text.splitlines())}\n\n".encode()


class EventStreamResponse(StreamingResponse):
    """A stream of events (text/event-stream), not cached and not buffered on its way."""

    media_type = MEDIA_TYPE

    # StreamingResponse's signature: FastAPI reads the default status_code from it for the OpenAPI document.
    def __init__(
        self,
        content: Any,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        super().__init__(content, status_code, {**HEADERS, **(headers or {})}, media_type, background)
