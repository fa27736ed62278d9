"""GET /events?topic=PREFIX (issue 30, part 1): the broker's events as SSE, under uvicorn, real broker and workers."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from fabric import fabric, free_port, wait_for
from test_api_events_files import assert_problem, read_sse, served, settings_for, workers_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FINAL = {"completed", "failed", "cancelled", "expired", "lost"}
AUTH = {"Authorization": "Bearer s3cret"}


def test_sse_streams_one_services_state_changes_in_order_with_auth_resume_and_bounds(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events = f"tcp://127.0.0.1:{free_port()}"
        f.env["ZFAB_BROKER_EVENTS"] = events
        f.broker()
        f.worker("w1", "demo")
        f.worker("a1", "demo-async")
        settings = settings_for(f, api_tokens="s3cret", broker_events=events, sse_ping_seconds=0.3)
        with served(settings) as (base, app), httpx.Client(base_url=base, timeout=30, headers=AUTH) as c:
            workers_alive(c, {"w1", "a1"})
            # Auth like every job route; a prefix over 256 characters is refused
            assert_problem(httpx.get(f"{base}/events", params={"topic": "job."}), 401)
            assert_problem(c.get("/events", params={"topic": "j" * 10_000}), 422)
            with c.stream("GET", "/events", params={"topic": "job.demo."}) as resp:
                assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
                lines = resp.iter_lines()
                read_sse(lines, time.monotonic() + 10, lambda s: ": subscribed" in s.comments)
                n = 200
                for i in range(n):
                    r = c.post("/jobs", json={"service": "demo", "task": "echo", "kwargs": {"data": i}})
                    assert r.status_code == 202, r.text
                for _ in range(20):
                    c.post("/jobs", json={"service": "demo-async", "task": "nap", "kwargs": {"seconds": 0}})

                def all_ended(s: object) -> bool:
                    return sum(d["state"] in FINAL for d in s.data) >= n  # type: ignore[attr-defined]

                sse = read_sse(lines, time.monotonic() + 60, all_ended)
                # and pings while idle
                read_sse(lines, time.monotonic() + 10, lambda s: ": ping" in s.comments)
            data = sse.data
            assert {d["service"] for d in data} == {"demo"}
            by_job: dict[str, list[str]] = defaultdict(list)
            for d in data:
                by_job[d["uuid"]].append(d["state"])
            assert len(by_job) == n
            for states in by_job.values():
                assert states[0] == "queued" and states[-1] == "completed", states
            ids = [int(e["id"]) for e in sse.events if e.get("event") is None]
            assert ids == sorted(ids)
            # Last-Event-ID: a reconnecting EventSource resumes after the id it saw
            mid = ids[len(ids) // 2]
            with c.stream("GET", "/events", params={"topic": "job.demo."}, headers={"Last-Event-ID": str(mid)}) as r2:
                again = read_sse(
                    r2.iter_lines(), time.monotonic() + 10, lambda s: len(s.events) >= len(ids) - 1 - ids.index(mid)
                )
            assert [int(e["id"]) for e in again.events] == ids[ids.index(mid) + 1 :]
            assert [json.loads(e["data"])["uuid"] for e in again.events] == [d["uuid"] for d in data][
                ids.index(mid) + 1 :
            ]
            # A caller that hangs up gives its stream back
            wait_for(lambda: app.state.topic_hub.streams == 0, 10, what="the streams released")
            metrics = c.get("/metrics").text
            assert "zfab_api_events_buffered " in metrics and "zfab_api_event_streams " in metrics


def test_events_off_is_a_404_problem(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        with served(settings_for(f)) as (base, _app), httpx.Client(base_url=base, timeout=10) as c:
            assert_problem(c.get("/events", params={"topic": "job."}), 404)


def test_event_streams_are_bounded_and_a_stream_that_ends_gives_its_place_back(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events = f"tcp://127.0.0.1:{free_port()}"
        f.env["ZFAB_BROKER_EVENTS"] = events
        f.broker()
        settings = settings_for(f, broker_events=events, api_event_streams=2)
        with served(settings) as (base, app), httpx.Client(base_url=base, timeout=10) as c:
            opened = [c.stream("GET", "/events", params={"topic": "job."}) for _ in range(2)]
            readers = [cm.__enter__().iter_lines() for cm in opened]  # kept: dropping a reader hangs up
            for lines in readers:
                read_sse(lines, time.monotonic() + 10, lambda s: ": subscribed" in s.comments)
            assert_problem(c.get("/events", params={"topic": "job."}), 503)
            opened[0].__exit__(None, None, None)
            wait_for(lambda: app.state.topic_hub.streams == 1, 10, what="the closed stream released")
            with c.stream("GET", "/events", params={"topic": "job."}) as again:
                assert again.status_code == 200
            opened[1].__exit__(None, None, None)


def test_sse_streams_progress_events_and_queue_changes_by_their_topics(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events = f"tcp://127.0.0.1:{free_port()}"
        f.env["ZFAB_BROKER_EVENTS"] = events
        f.broker()
        f.worker("w1", "demo")
        settings = settings_for(f, api_tokens="s3cret", broker_events=events)
        with served(settings) as (base, _app), httpx.Client(base_url=base, timeout=30, headers=AUTH) as c:
            workers_alive(c, {"w1"})
            with (
                c.stream("GET", "/events", params={"topic": "event.demo."}) as progress,
                c.stream("GET", "/events", params={"topic": "queue.demo"}) as queue,
            ):
                p_lines, q_lines = progress.iter_lines(), queue.iter_lines()
                for lines in (p_lines, q_lines):
                    read_sse(lines, time.monotonic() + 10, lambda s: ": subscribed" in s.comments)
                r = c.post("/jobs", json={"service": "demo", "task": "progress", "kwargs": {"steps": 2, "delay": 0}})
                assert r.status_code == 202, r.text
                uuid = r.json()["uuid"]
                got = read_sse(p_lines, time.monotonic() + 20, lambda s: len(s.data) >= 2).data
                assert [(d["topic"], d["uuid"], d["message"]) for d in got] == [
                    ("event.demo.w1", uuid, f"step {i} of 2") for i in (1, 2)
                ]
                assert c.post("/mmi/services/demo/pause").status_code == 200
                paused = read_sse(q_lines, time.monotonic() + 20, lambda s: len(s.data) >= 1).data[0]
                assert (paused["topic"], paused["paused"], paused["depth"]) == ("queue.demo", True, 0)
