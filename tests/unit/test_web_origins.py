"""What a web page can make the API do (api/http/origins.py): the whole app, over ASGI, without a fabric.

A refused request never reaches a route, so these need no broker; a request the rules let through
reaches its route, which answers 503 (no fabric behind this app) or serves a page: anything but the
guard's 400 or 403. The same rules in a real browser: tests/integration/test_web_pages.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from zfab.api.http.app import create_app
from zfab.api.http.origins import MAX_KNOWN_HOSTS, HostRule, origin_netloc
from zfab.api.settings import ApiSettings

JOB = b'{"service":"demo","task":"echo","kwargs":{"data":"x"}}'


def call(method: str, path: str, headers: dict[str, str], body: bytes | None = None, **settings: Any) -> httpx.Response:
    app = create_app(ApiSettings(_env_file=None, **settings))  # type: ignore[call-arg]

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            return await c.request(method, path, content=body, headers=headers)

    return asyncio.run(go())


def problem_type(r: httpx.Response) -> str:
    return (
        str(r.json().get("type", "")).rsplit("/", 1)[-1] if r.headers.get("content-type", "").endswith("json") else ""
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/jobs?limit=5"),
        ("POST", "/jobs"),
        ("POST", "/mmi/services/demo/pause"),
        ("GET", "/ui"),
        ("GET", "/metrics"),
    ],
)
def test_a_rebound_host_name_is_refused_before_any_route_reads_or_changes_anything(method: str, path: str) -> None:
    r = call(
        method,
        path,
        {"Host": "evil.example:8000", "Content-Type": "application/json"},
        JOB if method == "POST" else None,
    )
    assert r.status_code == 400 and problem_type(r) == "host-not-served"
    assert "ZFAB_API_HOSTS" in r.json()["detail"]


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST.:8000", "[::1]:8000", "10.1.2.3:8000", "localhost"]
)
def test_addresses_and_the_listed_names_are_served_on_any_port(host: str) -> None:
    r = call("GET", "/jobs?limit=5", {"Host": host})
    assert r.status_code not in (400, 403), r.text


def test_probes_answer_any_host_and_the_setting_adds_names_and_domains() -> None:
    assert call("GET", "/healthz", {"Host": "pod-name:8000"}).status_code == 200
    served = {"api_hosts": "api,.example.com"}
    assert call("GET", "/jobs", {"Host": "api:8000"}, **served).status_code != 400
    assert call("GET", "/jobs", {"Host": "ui.example.com"}, **served).status_code != 400
    assert call("GET", "/jobs", {"Host": "evilexample.com"}, **served).status_code == 400
    assert call("GET", "/jobs", {"Host": "anything"}, api_hosts="*").status_code != 400


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "http://127.0.0.1:9999"},  # a page on another port of the same machine
        {"Origin": "http://localhost:8000"},  # another origin (name) than the one the request went to
        {"Origin": "null"},  # a sandboxed frame, a file:// page
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # localhost:3000 is same-site with localhost:8000
        {"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "cross-site"},
    ],
)
@pytest.mark.parametrize(
    ("method", "path", "ctype", "body"),
    [
        ("POST", "/jobs", "application/json", JOB),
        ("POST", "/mmi/services/demo/pause", "application/x-www-form-urlencoded", b""),
        ("POST", "/jobs/0123/retry", "text/plain", b'{"wait": 0}'),
        ("DELETE", "/jobs/0123", "", b""),
        ("PUT", "/mmi/services/demo/tasks/echo/limits", "application/json", b'{"rate_limit": "1/s"}'),
    ],
)
def test_a_state_changing_request_from_another_origins_page_is_refused(
    headers: dict[str, str], method: str, path: str, ctype: str, body: bytes
) -> None:
    r = call(method, path, {**headers, **({"Content-Type": ctype} if ctype else {})}, body)
    assert r.status_code == 403 and problem_type(r) == "cross-origin", r.text


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a program: no Origin, no Sec-Fetch-Site
        {"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"},  # the console
        {"Sec-Fetch-Site": "none"},  # typed into the address bar
    ],
)
def test_programs_and_the_apis_own_pages_may_post(headers: dict[str, str]) -> None:
    r = call("POST", "/jobs", {**headers, "Content-Type": "application/json"}, JOB)
    assert r.status_code not in (400, 403, 415), r.text


def test_an_origin_the_setting_trusts_may_post_and_reads_need_no_origin_check() -> None:
    trusted = {"Origin": "https://ui.example.com", "Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}
    assert call("POST", "/jobs", trusted, JOB, api_origins="https://ui.example.com:443").status_code != 403
    assert call("POST", "/jobs", trusted, JOB).status_code == 403
    # A read from another origin is the browser's to withhold: no CORS header ever lets it through.
    r = call("GET", "/jobs?limit=1", {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code != 403 and "access-control-allow-origin" not in r.headers


def test_a_form_shaped_job_is_refused_for_its_media_type() -> None:
    r = call("POST", "/jobs", {"Content-Type": "text/plain"}, JOB)
    assert r.status_code == 415


def test_with_tokens_a_cookie_authenticates_nothing() -> None:
    r = call(
        "GET", "/jobs", {"Cookie": "zfab.token=tok; Authorization=Bearer tok"}, api_tokens="tok", api_hosts="localhost"
    )
    assert r.status_code == 401


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_the_docs_pages_refuse_to_be_framed(path: str) -> None:
    r = call("GET", path, {})
    assert r.status_code == 200
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"


def test_host_and_origin_parsing() -> None:
    rule = HostRule(["localhost", ".example.com"])
    assert rule.serves(b"localhost:1") and rule.serves(b"[::1]:2") and rule.serves(b"example.com")
    assert not rule.serves(b"localhost:x") and not rule.serves(b"") and not rule.serves(b"evil.test")
    assert origin_netloc("http://127.0.0.1:80") == "127.0.0.1"
    assert origin_netloc("https://a.example:8443") == "a.example:8443"
    assert origin_netloc("null") is None and origin_netloc("http://a/b") is None


def test_the_host_verdicts_remembered_are_bounded_and_a_forgotten_one_is_judged_again() -> None:
    # Given a caller that sends a new Host value on every request
    rule = HostRule(["localhost"])
    for i in range(MAX_KNOWN_HOSTS * 3):
        assert rule.serves(f"evil{i}.test".encode()) is False
    # Then the API remembers at most its bound of them, and still judges every value the same
    assert len(rule._known) == MAX_KNOWN_HOSTS
    assert rule.serves(b"evil0.test") is False and rule.serves(b"localhost:8000") is True
    assert len(rule._known) == MAX_KNOWN_HOSTS
