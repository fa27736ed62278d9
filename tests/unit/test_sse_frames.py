"""api/http/sse.py, the API's one writer of server-sent events: what a reader (an EventSource, or
apiclient's parser) gets back from each frame."""

from __future__ import annotations

import json
from typing import Any

from zfab.api.http.sse import HEADERS, MEDIA_TYPE, PING, EventStreamResponse, comment, frame, json_frame


def parse(raw: bytes) -> list[dict[str, Any]]:
    """The events of a stream as the SSE spec reads them: fields per block, data lines joined by newlines."""
    out: list[dict[str, Any]] = []
    for block in raw.decode().split("\n\n"):
        ev: dict[str, Any] = {}
        data: list[str] = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            if name == "data":
                data.append(value)
            else:
                ev[name] = value
        if data:
            ev["data"] = "\n".join(data)
            out.append(ev)
    return out


def test_a_json_event_is_one_data_line_with_its_id_and_type() -> None:
    raw = json_frame({"text": "two\nlines", "n": 1}, id=7, event="gap")
    assert raw.count(b"\ndata: ") == 1 and raw.endswith(b"\n\n")
    (ev,) = parse(raw)
    assert ev["event"] == "gap" and ev["id"] == "7" and json.loads(ev["data"]) == {"text": "two\nlines", "n": 1}


def test_data_with_line_breaks_reads_back_whole() -> None:
    (ev,) = parse(frame("first\nsecond\r\nthird", id="end", event="end"))
    assert ev == {"event": "end", "id": "end", "data": "first\nsecond\nthird"}


def test_pings_and_comments_are_skipped_by_readers_and_stay_one_line() -> None:
    raw = PING + comment("worker w1: not\navailable") + json_frame({"a": 1}, id=1)
    assert comment("worker w1: not\navailable") == b": worker w1: not available\n\n"
    assert [e["id"] for e in parse(raw)] == ["1"]


def test_the_response_is_an_event_stream_never_cached_nor_buffered() -> None:
    async def body() -> Any:
        yield PING

    r = EventStreamResponse(body(), headers={"X-Extra": "1"})
    assert r.media_type == MEDIA_TYPE == "text/event-stream"
    assert r.headers["cache-control"] == HEADERS["Cache-Control"] and r.headers["x-accel-buffering"] == "no"
    assert r.headers["x-extra"] == "1" and r.headers["content-type"].startswith("text/event-stream")
