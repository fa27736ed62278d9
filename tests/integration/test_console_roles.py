"""The console in a real browser (headless Chromium) shows a viewer no button it may not use, and an admin
every one, Audit included; the API refuses the viewer's calls all the same (tests/unit/test_access_table.py)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import require_binary
from fabric import Fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TOKENS = {"viewer": "console-viewer-token", "admin": "console-admin-token"}
ACTION_BUTTONS = {"/ui": ["#new-job"], "/ui/schedules": ["#new-schedule"]}


def _selenium() -> Any:
    try:
        from selenium import webdriver
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("selenium is required under CI=true (the test extra installs it)")
        pytest.skip("selenium not installed (pip install -e '.[test]')")
    return webdriver


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, httpx.Client]]:
    chromium = require_binary("chromium", "chromium")
    chromedriver = require_binary("chromedriver", "chromium-driver")
    webdriver = _selenium()
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    tmp = tmp_path_factory.mktemp("console-roles")
    access = tmp / "access.toml"
    access.write_text(
        "".join(
            f'[[token]]\nname = "{role}"\nsha256 = "{hashlib.sha256(t.encode()).hexdigest()}"\nrole = "{role}"\n\n'
            for role, t in TOKENS.items()
        )
    )
    f = Fabric(tmp)
    driver = None
    http = None
    try:
        f.broker()
        f.worker("demo-1")
        port = free_port()
        f.start("api", "api", "--port", str(port), env={"ZFAB_ACCESS_FILE": str(access)})
        base = f"http://127.0.0.1:{port}"
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKENS['admin']}"}, timeout=10)
        wait_for(lambda: http is not None and http.get("/readyz").status_code == 200, 30, what="the API ready")
        opts = Options()
        opts.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            opts.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
        driver.set_page_load_timeout(20)
        driver.set_script_timeout(10)
        yield base, driver, http
    finally:
        if driver is not None:
            driver.quit()
        if http is not None:
            http.close()
        f.stop()


def shown(driver: Any, css: str) -> bool:
    return bool(
        driver.execute_script(
            "const e = document.querySelector(arguments[0]); return !!e && getComputedStyle(e).display !== 'none'",
            css,
        )
    )


def visit(base: str, driver: Any, path: str, token: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base + "/ui")
    driver.execute_script("sessionStorage.setItem('zfab.token', arguments[0])", token)
    driver.get(base + path)
    WebDriverWait(driver, 15, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.body.dataset.ready === '1'"), message=f"{path} ready"
    )


@pytest.mark.parametrize("who", ["viewer", "admin"])
def test_a_viewer_sees_no_action_button_and_an_admin_sees_them_all(browser: tuple[str, Any, Any], who: str) -> None:
    base, driver, http = browser
    job = http.post("/jobs?wait=10", json={"service": "demo", "task": "echo", "kwargs": {"data": 1}}).json()
    pages = {**ACTION_BUTTONS, f"/ui/jobs/{job['uuid']}": ["#again"]}
    for path, buttons in pages.items():
        visit(base, driver, path, TOKENS[who])
        assert driver.execute_script("return document.body.dataset.role") == who
        for css in [*buttons, 'nav a[data-needs="audit"]']:
            assert shown(driver, css) is (who == "admin"), f"{css} on {path} for the {who}"
    if who == "admin":
        visit(base, driver, "/ui/audit", TOKENS[who])
        assert "Audit log" in driver.page_source
