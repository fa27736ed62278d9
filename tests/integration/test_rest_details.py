"""HTTP details a REST client relies on, asked of a real `zfab api` process over HTTP: 415 for a body
that is not JSON, the line and column of a JSON syntax error, HEAD wherever GET is, 405 with the whole
`Allow`, and one health shape."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx
import pytest
from fabric import Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """Broker, one demo worker and the API (processes on 127.0.0.1); an HTTP client of the API."""
    f = Fabric(tmp_path_factory.mktemp("rest"))
    try:
        f.broker()
        f.worker("w1")
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_API_DB": ""})
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            wait_for(lambda: c.get("/readyz").status_code == 200, 30, what="the API ready")
            wait_for(
                lambda: c.post("/jobs?wait=5", json={"service": "demo", "task": "echo"}).status_code == 200,
                30,
                what="a demo job to complete",
            )
            yield c
    finally:
        f.stop()


def problem_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, object] = r.json()
    assert body["status"] == status
    return body


def test_a_body_that_is_not_json_is_415_naming_the_type_expected(api: httpx.Client) -> None:
    # Given a job submitted as form text, or with no Content-Type at all
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}, {}):
        r = api.post("/jobs", content=b"service=demo&task=echo", headers=headers)
        # Then the answer says which media type the route takes
        p = problem_of(r, 415)
        assert "application/json" in str(p["detail"]) and p["expected"] == "application/json"
        assert r.headers["accept-post"] == "application/json"
    # And a JSON body with a charset or a +json type is still JSON
    r = api.post(
        "/jobs?wait=5",
        content=b'{"service": "demo", "task": "echo"}',
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200, r.text
    # And PATCH answers with Accept-Patch
    r = api.patch("/schedules/nope", content=b"paused=true", headers={"Content-Type": "text/plain"})
    assert problem_of(r, 415) and r.headers["accept-patch"] == "application/json"


def test_a_json_syntax_error_names_its_line_and_column(api: httpx.Client) -> None:
    r = api.post("/jobs", content=b'{"service": "demo",', headers={"Content-Type": "application/json"})
    p = problem_of(r, 400)
    assert p["detail"] == "invalid JSON at line 1, column 20: Expecting property name enclosed in double quotes"
    r = api.post(
        "/jobs", content=b'{"service": "demo",\n  "task" "echo"}', headers={"Content-Type": "application/json"}
    )
    assert problem_of(r, 400)["detail"] == "invalid JSON at line 2, column 10: Expecting ':' delimiter"
    # Not the position as if it were a field
    assert "body.19" not in r.text


def test_head_answers_like_get_without_a_body(api: httpx.Client) -> None:
    uuid = api.post("/jobs?wait=5", json={"service": "demo", "task": "echo", "kwargs": {"data": "x"}}).json()["uuid"]
    for path in ("/healthz", "/readyz", "/metrics", "/jobs", f"/jobs/{uuid}", "/mmi/workers", "/nope", "/jobs/nope"):
        got, head = api.get(path), api.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path not in ("/metrics", "/mmi/workers"):  # counters and hold times move between the two requests
            assert head.headers["content-length"] == got.headers["content-length"], path


def past(second: int) -> Callable[[], bool]:
    return lambda: int(time.time()) > second


def test_the_date_header_is_the_current_second_after_the_api_sat_idle(api: httpx.Client) -> None:
    # The API's loop does not tick (an idle API must not wake for the header): each request
    # refreshes it.
    api.get("/healthz")
    start = int(time.time())
    wait_for(past(start + 2), 5.0)  # two whole seconds without a request
    for _ in range(3):
        before = time.time()
        r = api.get("/healthz")
        after = time.time()
        sent = parsedate_to_datetime(r.headers["date"]).timestamp()
        assert start + 2 <= sent and int(before) <= sent <= after, (r.headers["date"], before, after)
        wait_for(past(int(after)), 2.0)  # the next second, then ask again


def test_head_of_an_event_stream_ends_at_once(api: httpx.Client) -> None:
    # Given a job that runs for a while
    uuid = api.post("/jobs", json={"service": "demo", "task": "sleep", "kwargs": {"seconds": 20}}).json()["uuid"]
    try:
        # When its event stream is asked with HEAD
        r = api.head(f"/jobs/{uuid}/events", timeout=5)
        # Then the headers come back, with no stream held open (a stream would last the job's 20 s: the
        # request's 5 s timeout would end it)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    finally:
        api.delete(f"/jobs/{uuid}")


def test_405_lists_every_method_of_the_path(api: httpx.Client) -> None:
    r = api.put("/jobs", json={"service": "demo", "task": "echo"})
    problem_of(r, 405)
    assert r.headers["allow"] == "GET, HEAD, POST"
    r = api.post("/jobs/abc")
    problem_of(r, 405)
    assert r.headers["allow"] == "GET, HEAD, DELETE"
    r = api.delete("/healthz")
    problem_of(r, 405)
    assert r.headers["allow"] == "GET, HEAD"
    r = api.put("/schedules/abc", json={})
    problem_of(r, 405)
    assert r.headers["allow"] == "GET, HEAD, PATCH, DELETE"


def test_health_and_readiness_share_one_shape(api: httpx.Client) -> None:
    for path, status in (("/healthz", "ok"), ("/readyz", "ready")):
        body = api.get(path).json()
        assert set(body) == {"status", "role", "version", "checks"}, body
        assert body["status"] == status and body["role"] == "api"
        assert body["version"] and all(isinstance(v, bool) and v for v in body["checks"].values())
    assert api.get("/readyz").json()["checks"] == {"started": True, "broker_alive": True}


def test_readiness_is_not_ready_while_the_broker_is_silent(tmp_path: Path) -> None:
    f = Fabric(tmp_path)  # no broker listens on its endpoint
    try:
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_API_DB": ""})
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            wait_for(lambda: c.get("/healthz").status_code == 200, 30, what="the API alive")
            r = c.get("/readyz")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["status"] == "not ready"
            assert r.json()["checks"] == {"started": True, "broker_alive": False}
            assert c.head("/readyz").status_code == 503
    finally:
        f.stop()
