"""The web console in a real browser: Debian's headless Chromium driven by Selenium through chromedriver,
against a demo stack this module starts (broker, two demo workers, `zfab api` with a token).

A person's uses, each waited for with a deadline: sign in with a token, submit a job from the form (its
field errors first) and watch it go from queued to completed without a reload, follow a job's events and
answer its input, submit it again, cancel a long job, filter for failed jobs, pause a schedule; then every
view loads in under a second and its screenshot is a real picture (the acceptance check's ink measure).

ZFAB_CONSOLE_SCREENSHOTS=docs/console keeps the screenshots there (how docs/console/*.png are made).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import require_binary
from fabric import Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOKEN = "console-test-token"
VIEWS = {
    "jobs": "/ui",
    "job": "/ui/jobs/{uuid}",
    "queues": "/ui/queues",
    "workers": "/ui/workers",
    "schedules": "/ui/schedules",
}
LOAD_BOUND_MS = 1000.0  # issue 29: each view loads in under a second on the demo stack


def png_ink(png: bytes) -> tuple[float, int]:
    """Share of decoded pixel bytes that differ from the most common one, and how many byte values occur
    (the acceptance check's measure: about:blank is 0.0003 / 4, a page of real content 0.02 / 256)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    i, idat = 8, b""
    while i < len(png):
        n, kind = struct.unpack(">I4s", png[i : i + 8])
        if kind == b"IDAT":
            idat += png[i + 8 : i + 8 + n]
        i += 12 + n
    counts = collections.Counter(zlib.decompress(idat))
    return 1 - counts.most_common(1)[0][1] / sum(counts.values()), len(counts)


@dataclass
class Stack:
    base: str
    http: httpx.Client
    driver: Any
    fabric: Fabric
    jobs: dict[str, str] = field(default_factory=dict)  # what earlier tests made, for the screenshots

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def until(self, cond: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(
            lambda _: cond(), message=f"timed out after {timeout} s waiting for {what}"
        )

    def ready(self) -> None:
        self.until(lambda: self.js("return document.body.dataset.ready === '1'"), "the view's first data")

    def keep(self, name: str) -> None:
        """A screenshot for the docs, when ZFAB_CONSOLE_SCREENSHOTS names where."""
        where = os.environ.get("ZFAB_CONSOLE_SCREENSHOTS")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            (Path(where) / f"{name}.png").write_bytes(self.driver.get_screenshot_as_png())

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        return str(self.js("const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css))

    def post_job(self, body: dict[str, Any], wait: float | None = None) -> dict[str, Any]:
        r = self.http.post("/jobs" + (f"?wait={wait}" if wait else ""), json=body)
        assert r.status_code in (200, 202), r.text
        job: dict[str, Any] = r.json()
        return job


def _selenium() -> Any:
    try:
        from selenium import webdriver
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("selenium is required under CI=true (the test extra installs it)")
        pytest.skip("selenium not installed (pip install -e '.[test]')")
    return webdriver


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    chromium = require_binary("chromium", "chromium")
    chromedriver = require_binary("chromedriver", "chromium-driver")
    webdriver = _selenium()
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    tmp = tmp_path_factory.mktemp("console")
    f = Fabric(tmp)
    driver = None
    http = None
    try:
        f.broker()
        f.worker("demo-1")
        f.worker("demo-2")
        f.start("secrets-1", "worker", "--worker", "tests.integration.declared_workers:Secrets", "--name", "secrets-1")
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_API_TOKENS": TOKEN})
        base = f"http://127.0.0.1:{port}"
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)

        def three_workers() -> bool:
            assert http is not None
            return sum(1 for w in http.get("/mmi/workers").json() if w["alive"]) == 3

        wait_for(three_workers, 30, what="the API, two demo workers and a secrets worker")
        opts = Options()
        opts.binary_location = chromium
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ):
            opts.add_argument(arg)
        # The driver named outright: Selenium then looks for nothing on the network.
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
        driver.set_page_load_timeout(20)
        driver.set_script_timeout(10)
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        yield Stack(base, http, driver, f)
    finally:
        if driver is not None:
            driver.quit()
        if http is not None:
            http.close()
        f.stop()


@pytest.fixture
def console(stack: Stack) -> Stack:
    """The browser signed in (the first test does it through the form; alone, a test is signed in here)."""
    stack.open("/ui")
    if stack.js("return sessionStorage.getItem('zfab.token')") != TOKEN:
        stack.js("sessionStorage.setItem('zfab.token', arguments[0])", TOKEN)
    return stack


def test_the_console_asks_for_the_token_and_never_puts_it_in_a_url(stack: Stack) -> None:
    stack.open("/ui")
    stack.js("sessionStorage.clear()")
    stack.driver.refresh()
    stack.until(lambda: stack.js("return !document.querySelector('#login').hidden"), "the sign-in form")
    assert stack.find("#rows tr.empty").text == "Loading jobs…"  # the shell carries no data
    stack.find("#token").send_keys("not-the-token")
    stack.find("#login-form button").click()
    stack.until(lambda: "not accepted" in stack.text("#login-error"), "a refused token said so")
    stack.find("#token").clear()
    stack.find("#token").send_keys(TOKEN)
    stack.find("#login-form button").click()
    stack.ready()
    assert stack.js("return document.querySelector('#login').hidden")
    assert stack.js("return sessionStorage.getItem('zfab.token')") == TOKEN
    urls = stack.js("return [location.href, ...performance.getEntries().map((e) => e.name)]")
    assert urls and not [u for u in urls if TOKEN in u], urls
    assert not stack.find("#signout").get_attribute("hidden")


def test_a_job_from_the_form_shows_field_errors_then_goes_queued_to_completed_live(console: Stack) -> None:
    from selenium.webdriver.support.ui import Select

    c = console
    c.open("/ui")
    c.ready()
    c.js("window.sameDocument = true")  # gone if the page reloaded
    c.find("#new-job").click()
    c.until(lambda: c.js("return !!document.querySelector('#job-form option[value=demo]')"), "the services")
    Select(c.find("#job-form select[name=service]")).select_by_value("demo")
    c.until(lambda: c.js("return !!document.querySelector('#job-form option[value=sleep]')"), "demo's tasks")
    Select(c.find("#job-form select[name=task]")).select_by_value("sleep")
    c.until(
        lambda: c.js("return !!document.querySelector('[data-field=\"kwargs.seconds\"]')"), "the sleep task's fields"
    )
    c.find("#job-form details.options summary").click()
    c.find("#job-form [data-field=priority]").send_keys("20")
    c.find("#job-form button[type=submit]").click()
    # Checked in the page first: a required argument left empty.
    c.until(lambda: "required" in c.text("#job-form .field.bad .field-error"), "seconds marked as required")
    c.find('[data-field="kwargs.seconds"]').send_keys("0.2")
    c.find("#job-form button[type=submit]").click()
    # Then the API's 422, shown beside the field it names.
    c.until(lambda: "less than or equal to 9" in c.text("#job-form label.bad .field-error"), "the priority's 422")
    assert not c.text("#job-form .field.bad .field-error") and not c.text("#job-form .form-error")  # said once
    c.keep("submit")
    Select(c.find("#job-form select[name=task]")).select_by_value("echo")
    c.until(lambda: c.js("return !!document.querySelector('[data-field=\"kwargs.data\"]')"), "the echo task's fields")
    c.find('[data-field="kwargs.data"]').send_keys("from-the-form")
    c.find("#job-form [data-field=priority]").clear()
    c.find("#job-form [data-field=delay]").send_keys("3")  # held by the broker: queued for 3 s
    c.find("#job-form button[type=submit]").click()
    c.until(lambda: c.text("#job-form .done a"), "the submitted job's link")
    uuid = c.text("#job-form .done a")
    state = f"const r = document.querySelector('tr[data-uuid=\"{uuid}\"]'); return r ? r.dataset.state : null"
    c.until(lambda: c.js(state) == "queued", "the new job listed as queued")
    c.until(lambda: c.js(state) == "completed", "the job shown completed", timeout=20)
    badge = c.find(f'tr[data-uuid="{uuid}"] .badge')
    assert "st-completed" in badge.get_attribute("class") and badge.text == "completed"
    assert c.js("return window.sameDocument") is True  # live, not reloaded
    assert c.http.get(f"/jobs/{uuid}").json()["results"]
    c.jobs["form"] = uuid


def test_the_job_view_streams_events_answers_input_and_submits_again(console: Stack) -> None:
    c = console
    job = c.post_job({"service": "demo", "task": "progress", "kwargs": {"steps": 4, "delay": 0.4}})
    c.open(f"/ui/jobs/{job['uuid']}")
    c.ready()
    c.until(lambda: c.text("#event-count") == "(4)", "four progress events")
    c.until(lambda: c.text("#progress .progress .num") == "100 %", "the progress bar full")
    c.until(lambda: c.text("#state") == "completed", "the job completed")
    assert '"steps": 4' in c.text("#results") and '"steps": 4' in c.text("#args")
    assert "completed" in c.text("#history") and "running" in c.text("#history")
    assert c.js("return document.querySelectorAll('#timings tbody tr').length") >= 5
    c.jobs["progress"] = job["uuid"]

    c.find("#again").click()
    c.until(lambda: job["uuid"] not in c.driver.current_url, "the page of the job submitted again")
    c.until(lambda: c.text("#state") == "completed", "the job submitted again completed")
    again = c.driver.current_url.rsplit("/", 1)[-1]
    assert c.http.get(f"/jobs/{again}").json()["results"]

    c.find("#edit").click()
    c.until(
        lambda: c.js("return (document.querySelector('[data-field=\"kwargs.steps\"]') || {}).value") == "4",
        "the form filled",
    )

    asks = c.post_job({"service": "demo", "task": "ask", "kwargs": {"question": "Who is there?"}})
    c.open(f"/ui/jobs/{asks['uuid']}")
    c.until(lambda: c.js("return !document.querySelector('#input').hidden"), "the input request")
    assert "Who is there?" in c.text("#question")
    c.find("#input-form [data-field=value]").send_keys("Ada")
    c.find("#input-form button").click()
    c.until(lambda: c.text("#state") == "completed", "the answered job completed")
    assert '"answer": "Ada"' in c.text("#results")


def test_the_input_panel_counts_down_and_the_history_has_each_state_in_order(console: Stack) -> None:
    c = console
    job = c.post_job({"service": "demo", "task": "ask", "kwargs": {"question": "Ready?", "timeout": 40}})
    c.open(f"/ui/jobs/{job['uuid']}")
    c.until(lambda: c.js("return !document.querySelector('#input').hidden"), "the input request")
    first = c.text("#countdown")
    assert first.endswith(" left") and 30 <= int(first.split()[0]) <= 40, first
    c.until(lambda: c.text("#countdown") != first, "the countdown moving on", timeout=5)
    assert int(c.text("#countdown").split()[0]) < int(first.split()[0])
    c.find("#input-form [data-field=value]").send_keys("yes")
    c.find("#input-form button").click()
    c.until(lambda: c.text("#state") == "completed", "the answered job completed")
    rows = "return [...document.querySelectorAll('#history tbody tr')].map((r) => r.cells[0].textContent)"
    c.until(lambda: c.js(rows)[-1:] == ["completed"], "the history's end")
    assert c.js(rows) == ["submitted", "queued", "running", "waiting", "running", "completed"]
    assert "took the answer" in c.text("#history")
    steps = c.http.get(f"/jobs/{job['uuid']}").json()["history"]
    assert [s["at"] for s in steps] == sorted(s["at"] for s in steps)


def test_a_failed_jobs_page_shows_its_error_and_its_traceback_to_whom_the_api_shows_it(console: Stack) -> None:
    c = console
    boom = {"service": "demo", "task": "fail", "kwargs": {"message": "console-boom"}}
    job = c.post_job(boom, wait=10)
    c.open(f"/ui/jobs/{job['uuid']}")
    c.until(lambda: c.text("#state") == "failed", "the job failed")
    c.until(lambda: "RuntimeError: console-boom" in c.text("#results .task-error"), "the error in one line")
    assert not c.js("return !!document.querySelector('#results details.traceback')")  # a token holder: no traceback
    # An API that shows this token's callers tracebacks (ZFAB_API_TRACEBACK_TOKENS) shows it on the same page
    port = free_port()
    env = {
        "ZFAB_API_TOKENS": TOKEN,
        "ZFAB_API_TRACEBACK_TOKENS": TOKEN,
        "ZFAB_API_DB": str(c.fabric.tmp / "tracebacks.sqlite"),
    }
    c.fabric.start("api-tracebacks", "api", "--port", str(port), env=env)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
        wait_for(lambda: http.get("/readyz").status_code == 200, 30, what="the second API ready")
        r = http.post("/jobs?wait=10", json=boom)
        assert r.status_code == 200, r.text
        c.driver.get(base + "/ui")
        c.js("sessionStorage.setItem('zfab.token', arguments[0])", TOKEN)
        c.driver.get(f"{base}/ui/jobs/{r.json()['uuid']}")
        c.until(
            lambda: "Traceback (most recent call last)" in c.text("#results details.traceback pre"), "the traceback"
        )
        assert "console-boom" in c.text("#results .task-error")
    c.fabric.signal("api-tracebacks", signal.SIGTERM)


def test_a_secret_argument_is_never_in_the_page_nor_sent_again(console: Stack) -> None:
    c = console
    body = {"service": "secrets", "task": "login", "kwargs": {"user": "ada", "password": "hunter2"}}
    job = c.post_job(body, wait=10)
    c.open(f"/ui/jobs/{job['uuid']}")
    c.ready()
    c.until(lambda: "***" in c.text("#args"), "the arguments, redacted")
    assert "password: secret" in c.text("#args")
    assert "hunter2" not in c.driver.page_source
    assert not c.find("#again").is_enabled()  # what it would send again has no password
    asked = c.http.get(f"/ui/api/jobs/{job['uuid']}/request").json()
    assert asked["redacted"] == ["password"] and "hunter2" not in json.dumps(asked)
    c.find("#edit").click()
    user = "return (document.querySelector('[data-field=\"kwargs.user\"]') || {}).value"
    c.until(lambda: c.js(user) == "ada", "the form filled but for the secret")
    assert c.js("return document.querySelector('[data-field=\"kwargs.password\"]').value") == ""


def test_a_long_job_is_cancelled_from_its_page(console: Stack) -> None:
    c = console
    job = c.post_job({"service": "demo", "task": "sleep", "kwargs": {"seconds": 60}})
    c.open(f"/ui/jobs/{job['uuid']}")
    c.until(lambda: c.text("#state") == "running", "the job running")
    c.find("#cancel").click()
    c.until(lambda: c.text("#state") == "cancelled", "the job cancelled")
    assert c.http.get(f"/jobs/{job['uuid']}").json()["state"] == "cancelled"
    assert not c.find("#cancel").is_enabled()


def test_the_jobs_list_filters_for_failed_jobs(console: Stack) -> None:
    c = console
    failed = c.post_job({"service": "demo", "task": "fail", "kwargs": {"message": "boom for the filter"}}, wait=10)
    done = c.post_job({"service": "demo", "task": "echo", "kwargs": {"data": "fine"}}, wait=10)
    c.open("/ui")
    c.ready()
    c.until(lambda: c.js(f"return !!document.querySelector('tr[data-uuid=\"{done['uuid']}\"]')"), "the echo job listed")
    c.find("#filters .st-failed").click()
    states = "return [...document.querySelectorAll('#rows tr[data-uuid]')].map((r) => r.dataset.state)"
    c.until(lambda: (s := c.js(states)) and set(s) == {"failed"}, "only failed jobs listed")
    assert c.js(f"return !!document.querySelector('tr[data-uuid=\"{failed['uuid']}\"]')")
    assert "boom for the filter" in c.text(f'tr[data-uuid="{failed["uuid"]}"] .reason')
    assert "state=failed" in c.driver.current_url  # the filter is in the address, to share or reload
    c.driver.refresh()
    c.ready()
    assert c.js("return document.querySelector('#filters input[value=failed]').checked")
    assert set(c.js(states)) == {"failed"}


def test_a_schedule_is_paused_and_deleted_from_its_page(console: Stack) -> None:
    c = console

    def schedule(name: str) -> str:
        r = c.http.post(
            "/schedules",
            json={"job": {"service": "demo", "task": "echo", "kwargs": {"data": name}}, "every": 30, "name": name},
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    keep, gone = schedule("nightly-report"), schedule("to-delete")
    failing = c.http.post(
        "/schedules",
        json={"job": {"service": "demo", "task": "fail", "kwargs": {"message": "sched-boom"}}, "every": 1, "name": "f"},
    ).json()["id"]
    c.open("/ui/schedules")
    c.ready()
    row = f"#s-{keep}"
    c.until(lambda: c.js(f"return document.querySelector('{row}')?.dataset.state") == "active", "the schedule listed")
    c.find(f"{row} button[data-action=pause]").click()
    c.until(lambda: c.js(f"return document.querySelector('{row}')?.dataset.state") == "paused", "the schedule paused")
    assert c.http.get(f"/schedules/{keep}").json()["paused"] is True
    c.find(f"#s-{gone} button[data-action=delete]").click()
    c.until(lambda: c.text(f"#s-{gone} button[data-action=delete]") == "Really delete?", "the delete button armed")
    c.find(f"#s-{gone} button[data-action=delete]").click()
    c.until(lambda: not c.js(f"return !!document.querySelector('#s-{gone}')"), "the deleted schedule gone")
    assert c.http.get(f"/schedules/{gone}").status_code == 404
    # A schedule whose jobs fail shows how many did, and the last error
    c.until(lambda: "sched-boom" in c.text(f"#s-{failing} .last-error"), "the failing schedule's last error")
    count = f"return document.querySelector('#s-{failing} td.failures').firstChild.textContent"
    assert int(c.js(count).replace(",", "")) >= 1
    c.http.delete(f"/schedules/{failing}")


def test_the_queues_view_shows_which_broker_serves_and_its_term(console: Stack) -> None:
    card = '#cards [data-k="broker"]'
    console.open(VIEWS["queues"])
    console.ready()
    endpoint = console.http.get("/mmi/broker").json()["endpoint"]
    console.until(lambda: endpoint in console.text(card), "the broker card")
    # this stack's broker has no lease: it is the only one
    assert console.text(card).split()[0] == "single"
    assert "epoch" not in console.text(card)
    show = (
        "window.zfab.showBroker(arguments[0]); const e = document.querySelector(arguments[1]);"
        "return [e.textContent, e.querySelector('.badge').className];"
    )
    # brokers on a lease: show_broker of the active one (the API follows it), then of a standby
    active = {"role": "active", "epoch": 4, "failovers": 2, "lease_age": 0.31, "endpoint": "tcp://zfab-broker-1:5555"}
    text, cls = console.js(show, {**console.http.get("/mmi/broker").json(), **active}, card)
    assert text.split()[0] == "active" and "role-active" in cls.split()
    for part in ("tcp://zfab-broker-1:5555", "epoch 4", "took over 2×", "lease read 0.3 s ago"):
        assert part in text, (part, text)
    text, cls = console.js(show, {"role": "standby", "epoch": 4, "endpoint": "tcp://zfab-broker-0:5555"}, card)
    assert text.split()[0] == "standby" and "role-standby" in cls.split()
    console.keep("queues-broker")


def test_every_view_loads_in_under_a_second_and_renders_a_real_picture(console: Stack) -> None:
    c = console
    uuid = (
        c.jobs.get("progress")
        or c.post_job({"service": "demo", "task": "progress", "kwargs": {"steps": 3}}, wait=10)["uuid"]
    )
    # A fabric at work for the pictures: a schedule that has fired, one job running, three held in the queue.
    sid = c.http.post("/schedules", json={"job": {"service": "demo", "task": "echo"}, "every": 1, "name": "heartbeat"})
    wait_for(lambda: c.http.get(f"/schedules/{sid.json()['id']}").json()["runs"] >= 2, 10, what="two firings")
    c.post_job({"service": "demo", "task": "sleep", "kwargs": {"seconds": 30}})
    for i in range(3):
        c.post_job({"service": "demo", "task": "echo", "kwargs": {"data": i}, "delay": 30, "priority": 3 + i})
    keep = os.environ.get("ZFAB_CONSOLE_SCREENSHOTS")
    figures: dict[str, dict[str, float]] = {}
    for view, path in VIEWS.items():
        c.driver.execute_cdp_cmd("Network.clearBrowserCache", {})  # each view as on a first visit
        c.open(path.format(uuid=uuid))
        c.ready()
        ready_ms = float(c.js("return window.zfabReadyMs"))
        if view == "queues":  # a rate needs two readings, two seconds apart
            c.until(lambda: "…" not in c.text("#queues tbody"), "the dispatch rates")
        # The page and what it loaded from /ui (its HTML, CSS, JS), as read and as sent (gzip).
        weights = c.js(
            "const e = [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]"
            ".filter((r) => /^\\/ui(\\/(jobs|queues|workers|schedules|static)|$)/.test(new URL(r.name).pathname));"
            "const kind = (r) => r.entryType === 'navigation' ? 'html' : new URL(r.name).pathname.split('.').pop();"
            "const out = {};"
            "for (const r of e) { const k = kind(r); out[k] = (out[k] || 0) + r.decodedBodySize;"
            "  out.sent = (out.sent || 0) + r.encodedBodySize; }"
            "return out;"
        )
        c.js("document.activeElement && document.activeElement.blur()")
        png = c.driver.get_screenshot_as_png()
        ink, values = png_ink(png)
        if view == "job":  # the whole page for the docs: history and timings are below the fold
            height = min(int(c.js("return document.documentElement.scrollHeight")), 2400)
            c.driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
            full = c.driver.get_screenshot_as_png()
            c.driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            )
        else:
            full = png
        figures[view] = {"ready_ms": round(ready_ms, 1), **weights, "ink": round(ink, 4), "values": values}
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"{view}.png").write_bytes(full)
        assert ready_ms < LOAD_BOUND_MS, f"{view}: first data after {ready_ms:.0f} ms"
        assert ink >= 0.003 and values >= 32, f"{view}: blank screenshot ({ink:.4f}, {values} byte values)"
    print("\nconsole views: " + json.dumps(figures, indent=1))
