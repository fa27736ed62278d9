"""Web pages against the loopback API without tokens (the `make run` default), in a real headless Chromium.

A page served from another origin (another port on 127.0.0.1) fires what a hostile page can: form posts,
`no-cors` fetches with text/plain JSON, a CORS read of the job list. A page on a name re-pointed at the
API (DNS rebinding, played by Chromium's host resolver rules: evil.test is 127.0.0.1) reads and posts
same-origin. Nothing may change (no queue paused, no dead job retried, no job created) and nothing may be
read; the API's own page (the console's origin) is still served. The rules: api/http/origins.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from conftest import require_binary
from fabric import Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

EVIL_PAGE = b"<!doctype html><html><head><title>evil</title></head><body><iframe name=sink></iframe></body></html>"

# Runs in the hostile page: every request a page may send without CORS' permission, then one read.
ATTACK = r"""
const [api, dead, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const job = JSON.stringify({service: 'demo', task: 'echo', kwargs: {data: 'from-a-page'}});
const out = {};
const quiet = (p) => p.then((r) => r.type, (e) => 'error: ' + e.message);
(async () => {
  out.pause = await quiet(fetch(api + '/mmi/services/demo/pause', {method: 'POST', mode: 'no-cors'}));
  out.retry = await quiet(fetch(api + '/jobs/' + dead + '/retry', {method: 'POST', mode: 'no-cors',
    headers: {'Content-Type': 'text/plain'}, body: '{"wait": 0}'}));
  out.post = await quiet(fetch(api + '/jobs', {method: 'POST', mode: 'no-cors',
    headers: {'Content-Type': 'text/plain'}, body: job}));
  out.cancel = await quiet(fetch(api + '/jobs/' + dead, {method: 'DELETE'}));  // preflighted: CORS says no
  try {
    const r = await fetch(api + '/jobs?limit=5');
    out.read = 'read: ' + (await r.text()).slice(0, 80);
  } catch (e) { out.read = 'blocked'; }
  // A form: text/plain, its one field spelling a JSON job; posted into the frame, not away from the page.
  const form = document.createElement('form');
  Object.assign(form, {method: 'POST', action: api + '/jobs', enctype: 'text/plain', target: 'sink'});
  const field = document.createElement('input');
  field.name = job.slice(0, -1) + ',"x":"';
  field.value = '"}';
  form.appendChild(field);
  document.body.appendChild(form);
  const loaded = new Promise((ok) => document.querySelector('iframe').addEventListener('load', ok, {once: true}));
  form.submit();
  await Promise.race([loaded, new Promise((ok) => setTimeout(ok, 3000))]);
  form.action = api + '/mmi/services/demo/pause';
  form.enctype = 'application/x-www-form-urlencoded';
  form.submit();
  await new Promise((ok) => setTimeout(ok, 500));
  done(out);
})();
"""

# Runs in a page whose origin is the rebound name: the API answers it same-origin, if it answers at all.
SAME_ORIGIN = r"""
const done = arguments[arguments.length - 1];
const job = JSON.stringify({service: 'demo', task: 'echo', kwargs: {data: 'rebound'}});
const status = (p) => p.then(async (r) => [r.status, (await r.text()).slice(0, 200)], (e) => [0, e.message]);
(async () => done({
  read: await status(fetch('/jobs?limit=5')),
  post: await status(fetch('/jobs', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: job})),
  pause: await status(fetch('/mmi/services/demo/pause', {method: 'POST'})),
}))();
"""


class EvilPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(EVIL_PAGE)))
        self.end_headers()
        self.wfile.write(EVIL_PAGE)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Stack:
    port: int
    evil: str
    http: httpx.Client
    driver: Any

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paused(self) -> bool:
        services = self.http.get("/mmi/services").json()
        return any(s.get("service") == "demo" and s.get("paused") for s in services)

    def total(self) -> int:
        return int(self.http.get("/jobs?limit=1").json()["total"])

    def refusals(self, status: int) -> float:
        """Requests the guard answered with `status` (they match no route: it answers before routing)."""
        text = self.http.get("/metrics").text
        key = f'zfab_http_requests_total{{method="POST",route="<unmatched>",status="{status}"}}'
        for line in text.splitlines():
            if line.startswith(key):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    chromium = require_binary("chromium", "chromium")
    chromedriver = require_binary("chromedriver", "chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("selenium is required under CI=true (the test extra installs it)")
        pytest.skip("selenium not installed (pip install -e '.[test]')")
    f = Fabric(tmp_path_factory.mktemp("webpages"))
    evil = ThreadingHTTPServer(("127.0.0.1", 0), EvilPage)
    threading.Thread(target=evil.serve_forever, name="evil page", daemon=True).start()
    driver = http = None
    try:
        f.broker()
        f.worker("demo-1")
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_API_TOKENS": ""})
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        wait_for(lambda: http is not None and http.get("/readyz").status_code == 200, 30, what="the API ready")
        opts = Options()
        opts.binary_location = chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-proxy-server",
            "--host-resolver-rules=MAP evil.test 127.0.0.1",  # the rebound name, without a DNS server
        ):
            opts.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
        driver.set_page_load_timeout(20)
        driver.set_script_timeout(20)
        yield Stack(port, f"http://127.0.0.1:{evil.server_address[1]}", http, driver)
    finally:
        if driver is not None:
            driver.quit()
        if http is not None:
            http.close()
        evil.shutdown()
        f.stop()


def test_a_page_of_another_origin_changes_nothing_and_reads_nothing(stack: Stack) -> None:
    # Given a dead job, the demo queue running, and the jobs the API holds
    done = stack.http.post("/jobs?wait=10", json={"service": "demo", "task": "echo", "kwargs": {"data": 1}})
    assert done.status_code == 200 and done.json()["state"] == "completed"
    dead = stack.http.post("/jobs?wait=10", json={"service": "demo", "task": "fail", "timeout": 5}).json()
    assert dead["state"] == "failed"
    total, refused = stack.total(), stack.refusals(403)
    # When a page served from another port of this machine fires every request it may send
    stack.driver.get(stack.evil + "/")
    out = stack.driver.execute_async_script(ATTACK, stack.api, dead["uuid"])
    # Then the browser sent them (opaque answers) and the API refused each: nothing changed, nothing read
    assert out["pause"] == out["retry"] == out["post"] == "opaque", out
    assert out["cancel"].startswith("error") and out["read"] == "blocked", out
    wait_for(lambda: stack.refusals(403) >= refused + 5, 10, what="the API's 403s for the five posts")
    assert not stack.paused()
    assert stack.http.get(f"/jobs/{dead['uuid']}").json().get("retried_as") is None
    assert stack.total() == total


def test_a_page_on_a_rebound_name_gets_nothing_even_same_origin(stack: Stack) -> None:
    total = stack.total()
    # When the page's own name now points at the API (its origin is evil.test:PORT, same-origin with it)
    stack.driver.get(f"http://evil.test:{stack.port}/jobs?limit=5")
    assert "host-not-served" in stack.driver.page_source
    out = stack.driver.execute_async_script(SAME_ORIGIN)
    # Then the API answers nothing but the refusal: no job list, no job, no pause
    for what in ("read", "post", "pause"):
        status, text = out[what]
        assert status == 400 and "host-not-served" in text, (what, out[what])
    assert not stack.paused()
    assert stack.total() == total


def test_the_apis_own_page_is_still_served(stack: Stack) -> None:
    total = stack.total()
    for origin in (stack.api, f"http://localhost:{stack.port}"):
        stack.driver.get(origin + "/healthz")
        out = stack.driver.execute_async_script(SAME_ORIGIN)
        assert out["read"][0] == 200 and out["post"][0] == 202, (origin, out)
        assert out["pause"][0] == 200, (origin, out)
        stack.http.post("/mmi/services/demo/resume")
    assert stack.total() == total + 2
