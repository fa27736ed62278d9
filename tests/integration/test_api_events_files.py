"""Events (SSE), file downloads and interactive input over HTTP, with a real broker and workers.

The app runs under uvicorn on a real socket (in a thread of the test, so a test can look at
what it holds after a caller hangs up): SSE and file streams need a server that streams.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fabric import Fabric, fabric, free_port, wait_for
from fastapi import FastAPI

from zfab.api.errors import ProblemError
from zfab.api.http.app import create_app
from zfab.api.http.routes.files import byte_range
from zfab.api.jobs.inputs import is_open, pending_input
from zfab.api.settings import ApiSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PROBLEM = "application/problem+json"


@dataclass
class Sse:
    """What an SSE stream carried: events (id, event, data) and comment lines, in order."""

    events: list[dict[str, Any]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def data(self) -> list[dict[str, Any]]:
        return [json.loads(e["data"]) for e in self.events if e.get("event") is None]

    @property
    def end(self) -> dict[str, Any] | None:
        ends = [json.loads(e["data"]) for e in self.events if e.get("event") == "end"]
        return ends[-1] if ends else None


def read_sse(response: httpx.Response | Iterator[str], deadline: float, stop: Any = None) -> Sse:
    """Parse an event stream until the server closes it, `stop(sse)` holds, or the deadline passes.

    To read on after stopping, pass the same `iter_lines()` iterator again: dropping one closes
    the connection.
    """
    out, current = Sse(), {}
    lines = response.iter_lines() if isinstance(response, httpx.Response) else response
    for line in lines:
        if line.startswith(":"):
            out.comments.append(line)
        elif line == "":
            if current:
                out.events.append(current)
                current = {}
        else:
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
        if stop is not None and stop(out):
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"the stream did not end in time: {out}")
    out.closed = True
    return out


@contextmanager
def served(settings: ApiSettings) -> Iterator[tuple[str, FastAPI]]:
    """The app under uvicorn in a thread of this process, on an ephemeral port."""
    app = create_app(settings)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 20, what="uvicorn started")
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(20)
        assert not thread.is_alive(), "uvicorn did not stop"


def settings_for(f: Fabric, **kw: Any) -> ApiSettings:
    return ApiSettings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier, **kw)


def workers_alive(c: httpx.Client, names: set[str]) -> None:
    wait_for(
        lambda: names <= {w["name"] for w in c.get("/mmi/workers", params={"status": "alive"}).json()},
        20,
        what=f"workers {names} alive",
    )


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"]
    return body


# ---- pure pieces -------------------------------------------------------------------------


def test_byte_ranges_follow_rfc_9110() -> None:
    assert byte_range(None, 100) is None and byte_range("items=0-5", 100) is None
    assert byte_range("bytes=0-9", 100) == (0, 10) and byte_range("bytes=90-", 100) == (90, 100)
    assert byte_range("bytes=-10", 100) == (90, 100) and byte_range("bytes=-500", 100) == (0, 100)
    assert byte_range("bytes=50-5000", 100) == (50, 100)
    # malformed or several ranges: ignored (the whole file is served), as the RFC allows
    for header in ("bytes=9-0", "bytes=a-b", "bytes=--5", "bytes=0-1,5-6", "bytes=-"):
        assert byte_range(header, 100) is None, header
    for header in ("bytes=100-", "bytes=-0"):
        with pytest.raises(ProblemError) as err:
            byte_range(header, 100)
        assert err.value.status == 416 and err.value.headers["Content-Range"] == "bytes */100"


def test_the_open_input_request_is_the_latest_unanswered_one() -> None:
    def ask(rid: str, timeout: float = 60) -> dict[str, Any]:
        req = {"id": rid, "question": "q", "schema": {}, "timeout": timeout}
        return {"event_type": "input_request", "worker": "w1", "timestamp": "2099-01-01T00:00:00+00:00",
                "extras": {"input_request": req}}  # fmt: skip

    def answer(rid: str, accepted: bool) -> dict[str, Any]:
        return {"event_type": "input_response", "extras": {"input_response": {"input_id": rid, "accepted": accepted}}}

    progress = {"event_type": "progress", "message": "x"}
    assert pending_input([progress]) is None
    req = pending_input([progress, ask("a")])
    assert req is not None and req["id"] == "a" and req["worker"] == "w1"
    assert pending_input([ask("a"), answer("a", False)])["id"] == "a"  # type: ignore[index]
    assert pending_input([ask("a"), answer("a", True)]) is None
    assert pending_input([ask("a"), answer("a", True), ask("b")])["id"] == "b"  # type: ignore[index]
    old = {**ask("a"), "timestamp": "2000-01-01T00:00:00+00:00"}
    stale = pending_input([old])
    assert stale is not None and not is_open(stale) and is_open(req)


# ---- over HTTP ----------------------------------------------------------------------------


def test_sse_streams_a_jobs_events_in_order_resumes_and_ends_with_the_job(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with served(settings_for(f)) as (base, _), httpx.Client(base_url=base, timeout=20) as c:
            workers_alive(c, {"w1"})
            # Given a running progress job, when a caller follows its events
            r = c.post("/jobs", json={"service": "demo", "task": "progress", "kwargs": {"steps": 5, "delay": 0.3}})
            uuid = r.json()["uuid"]
            first_at: list[float] = []
            with c.stream("GET", f"/jobs/{uuid}/events") as resp:
                assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
                assert resp.headers["cache-control"] == "no-cache"

                def note_first(sse: Sse) -> bool:
                    if sse.events and not first_at:
                        first_at.append(time.monotonic())
                    return False

                sse = read_sse(resp, time.monotonic() + 30, note_first)
            ended_at = time.monotonic()
            # Then each event arrives as it happens, in order, numbered, and the stream ends by itself
            assert sse.closed
            assert [e["id"] for e in sse.events[:-1]] == [str(i) for i in range(1, 6)]
            assert [d["message"] for d in sse.data] == [f"step {i} of 5" for i in range(1, 6)]
            assert ended_at - first_at[0] > 0.6, "the first event came only with the end: not streamed"
            end = sse.end
            assert end is not None and end["state"] == "completed" and end["uuid"] == uuid
            assert end["results"]["w1"]["result"] == {"steps": 5}
            assert sse.events[-1] == {"event": "end", "id": "end", "data": sse.events[-1]["data"]}

            # A finished job streams what is left after Last-Event-ID, then the end, at once
            with c.stream("GET", f"/jobs/{uuid}/events", headers={"Last-Event-ID": "3"}) as resp:
                again = read_sse(resp, time.monotonic() + 10)
            assert [e["id"] for e in again.events] == ["4", "5", "end"]
            assert [d["message"] for d in again.data] == ["step 4 of 5", "step 5 of 5"]
            # A caller that saw the end is told there is nothing more (an EventSource stops reconnecting)
            assert c.get(f"/jobs/{uuid}/events", headers={"Last-Event-ID": "end"}).status_code == 204
            assert_problem(c.get(f"/jobs/{uuid}/events", headers={"Last-Event-ID": "x1"}), 422)
            assert_problem(c.get("/jobs/0123456789abcdef/events"), 404)


def test_idle_streams_get_pings_and_a_caller_that_hangs_up_releases_its_stream(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with (
            served(settings_for(f, sse_ping_seconds=0.2)) as (base, app),
            httpx.Client(base_url=base, timeout=20) as c,
        ):
            workers_alive(c, {"w1"})
            uuid = c.post("/jobs", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 30}}).json()["uuid"]
            table = app.state.zfab.jobs
            # Given callers following a job that emits nothing for a long while
            streams = [c.stream("GET", f"/jobs/{uuid}/events") for _ in range(5)]
            readers = []
            for cm in streams:
                readers.append(cm.__enter__().iter_lines())
                sse = read_sse(readers[-1], time.monotonic() + 10, lambda s: len(s.comments) >= 2)
                assert sse.comments[:2] == [": ping", ": ping"] and not sse.events
            assert len(table._listeners.get(uuid, ())) == 5
            # When they hang up mid-stream
            for cm in streams:
                cm.__exit__(None, None, None)
            readers.clear()
            # Then the API lets go of every stream, and keeps answering at once
            wait_for(lambda: uuid not in table._listeners, 10, what="the streams' listeners released")
            assert c.get("/healthz").status_code == 200
            assert c.get(f"/jobs/{uuid}").json()["state"] in ("queued", "running")
            assert c.delete(f"/jobs/{uuid}").status_code == 202
            r = c.get(f"/jobs/{uuid}", params={"wait": 10})
            assert r.json()["state"] == "cancelled" and r.json()["results"]["w1"]["status"] == "cancelled"


def test_files_download_over_http_intact_and_bad_paths_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    data = os.urandom(5 * 1024 * 1024 + 123)
    (root / "blob.bin").write_bytes(data)
    (root / "empty.txt").write_bytes(b"")
    (root / "sub").mkdir()
    os.symlink("/etc/passwd", root / "escape")
    sha = hashlib.sha256(data).hexdigest()
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("f1", "files", "--root", str(root))
        with served(settings_for(f)) as (base, _), httpx.Client(base_url=base, timeout=30) as c:
            workers_alive(c, {"w1", "f1"})
            # The whole file, its size and checksum announced up front
            r = c.get("/files/files/blob.bin")
            assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
            assert int(r.headers["content-length"]) == len(data) and r.headers["x-checksum-sha256"] == sha
            assert r.headers["etag"] == f'"{sha}"' and hashlib.sha256(r.content).hexdigest() == sha
            # resume from an offset, byte ranges, conditional requests
            r = c.get("/files/files/blob.bin", params={"offset": 4_000_000})
            assert r.status_code == 200 and r.content == data[4_000_000:]
            r = c.get("/files/files/blob.bin", headers={"Range": "bytes=1000-1999"})
            assert r.status_code == 206 and r.content == data[1000:2000]
            assert r.headers["content-range"] == f"bytes 1000-1999/{len(data)}"
            r = c.get("/files/files/blob.bin", headers={"Range": "bytes=-300000"})
            assert r.status_code == 206 and r.content == data[-300000:]
            assert c.get("/files/files/blob.bin", headers={"If-None-Match": f'"{sha}"'}).status_code == 304
            assert_problem(c.get("/files/files/blob.bin", headers={"Range": f"bytes={len(data)}-"}), 416)
            assert_problem(c.get("/files/files/blob.bin", params={"offset": len(data) + 1}), 416)
            r = c.get("/files/files/empty.txt")
            assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "0"
            # Errors are problems with the worker's reason, never a 200
            assert "does not exist" in assert_problem(c.get("/files/files/missing.bin"), 404)["detail"]
            assert "not a regular file" in assert_problem(c.get("/files/files/sub"), 400)["detail"]
            assert "outside the service root" in assert_problem(c.get("/files/files/escape"), 400)["detail"]
            for path in ("%2E%2E/%2E%2E/etc/passwd", "/etc/passwd", "sub/%2E%2E/%2E%2E/x"):
                assert_problem(c.get(f"/files/files/{path}"), 400)
            raw = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=10)
            raw.request("GET", "/files/files/../../etc/passwd")  # not normalised by the client
            resp = raw.getresponse()
            assert resp.status in (400, 404) and b"root:" not in resp.read()
            raw.close()
            assert "file_details" in assert_problem(c.get("/files/demo/x"), 400)["detail"]
            r = c.get("/files/nosuchservice/x")
            assert_problem(r, 503)
            assert r.headers["retry-after"] == "1"


def test_a_caller_that_stops_reading_holds_the_worker_back_and_hanging_up_frees_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(64 * 1024 * 1024))
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("f1", "files", "--root", str(root))
        with served(settings_for(f)) as (base, _), httpx.Client(base_url=base, timeout=30) as c:
            workers_alive(c, {"f1"})

            def in_flight() -> int:
                (w,) = c.get("/mmi/workers", params={"status": "alive"}).json()
                return int(w["jobs_in_flight"])

            with c.stream("GET", "/files/files/big.bin") as resp:
                assert resp.status_code == 200
                raw = resp.iter_raw(64 * 1024)  # kept: dropping the iterator would close the connection
                assert next(raw)
                # Given a caller that stops reading: the worker's stream waits for credits instead of finishing
                wait_for(lambda: in_flight() == 1, 10, what="the stream job in flight")
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:
                    assert in_flight() == 1, "the file went out faster than the caller read it"
                    time.sleep(0.05)
            # When it hangs up, the API cancels the stream at the worker
            wait_for(lambda: in_flight() == 0, 10, what="the stream job cancelled after the hang-up")
            assert c.get("/healthz").status_code == 200


def test_input_round_trip_over_http(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with served(settings_for(f)) as (base, _), httpx.Client(base_url=base, timeout=20) as c:
            workers_alive(c, {"w1"})
            r = c.post("/jobs", json={"service": "demo", "task": "ask", "kwargs": {"question": "name?"}})
            uuid = r.json()["uuid"]
            # Given a job waiting for input: its body and its events say what it asks
            wait_for(lambda: c.get(f"/jobs/{uuid}").json()["state"] == "waiting", 10, what="state waiting")
            job = c.get(f"/jobs/{uuid}").json()
            asked = job["input_request"]
            assert asked["question"] == "name?" and asked["schema"]["type"] == "string" and asked["worker"] == "w1"
            with c.stream("GET", f"/jobs/{uuid}/events") as resp:
                sse = read_sse(resp, time.monotonic() + 10, lambda s: bool(s.events))
            (event,) = sse.data
            assert event["event_type"] == "input_request" and event["extras"]["input_request"]["id"] == asked["id"]
            # When the answer does not match the schema: 400 with the worker's reason, and it still waits
            assert "shorter than 1" in assert_problem(c.post(f"/jobs/{uuid}/input", json={"value": ""}), 400)["detail"]
            assert "expected string" in assert_problem(c.post(f"/jobs/{uuid}/input", json={"value": 42}), 400)["detail"]
            assert_problem(c.post(f"/jobs/{uuid}/input", json={"value": "Ada", "input_id": "other"}), 409)
            assert_problem(c.post(f"/jobs/{uuid}/input", json={"valu": "Ada"}), 422)
            assert c.get(f"/jobs/{uuid}").json()["state"] == "waiting"
            # Then a good answer completes the job with it
            r = c.post(f"/jobs/{uuid}/input", json={"value": "Ada", "input_id": asked["id"]})
            assert r.status_code == 202, r.text
            done = c.get(f"/jobs/{uuid}", params={"wait": 10}).json()
            assert done["state"] == "completed" and done["input_request"] is None
            assert done["results"]["w1"]["result"] == {"question": "name?", "answer": "Ada"}
            assert_problem(c.post(f"/jobs/{uuid}/input", json={"value": "again"}), 409)
            assert_problem(c.post("/jobs/0123456789abcdef/input", json={"value": 1}), 404)
            # a running job that asked nothing is not waiting for input
            sleeper = c.post("/jobs", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 5}}).json()
            assert_problem(c.post(f"/jobs/{sleeper['uuid']}/input", json={"value": 1}), 409)
            c.delete(f"/jobs/{sleeper['uuid']}")
