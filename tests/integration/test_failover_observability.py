"""The brokers' dashboard (deploy/grafana/dashboards/zfab-brokers.json) and the failover alerts
(deploy/prometheus/rules/zfab-failover.yml) against a real Prometheus (Debian's):

- every panel query parses (promtool) and uses the pinned datasource;
- scraping two brokers, one active and one standby (stand-ins on 127.0.0.1 that export the metric
  names docs/failover.md gives each broker: the same names, their values set here), every panel
  query returns what the brokers say: which one is active, the epoch, lease ages, failovers;
- with nothing scraped (an outage) every panel still returns a value, not "No data";
- the failover alerts load with their `for`, severity and annotations, and the scraped standby's
  lease errors put ZfabBrokerLeaseErrors pending.

A missing promtool or prometheus skips with the reason; under CI=true it fails instead.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import require_binary, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "zfab-brokers.json"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "zfab-failover.yml"
# What each broker exports about its term (COMMON names, docs/failover.md): the dashboard and the
# alerts may use these and nothing else of their own.
TERM_METRICS = {
    "zfab_broker_active": "gauge",
    "zfab_broker_epoch": "gauge",
    "zfab_broker_lease_age_seconds": "gauge",
    "zfab_broker_failovers_total": "counter",
    "zfab_broker_lease_errors_total": "counter",
}
ACTIVE = {"zfab_broker_active": 1, "zfab_broker_epoch": 3, "zfab_broker_lease_age_seconds": 0.12}
ACTIVE |= {"zfab_broker_failovers_total": 2, "zfab_broker_lease_errors_total": 0}
STANDBY = {"zfab_broker_active": 0, "zfab_broker_epoch": 3, "zfab_broker_lease_age_seconds": 0.31}
STANDBY |= {"zfab_broker_failovers_total": 1, "zfab_broker_lease_errors_total": 0}


def _load_dashboard_check() -> ModuleType:
    loaded = sys.modules.get("dashboard_check")  # test_deploy.py and test_alerts.py load it under this name
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("dashboard_check", ROOT / "tools" / "dashboard_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dashboard_check = _load_dashboard_check()


class FakeBroker:
    """A broker's metrics port as far as its term goes: /metrics with TERM_METRICS, values settable."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = dict(values)
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = me.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def exposition(self) -> str:
        lines = []
        for name, kind in TERM_METRICS.items():
            lines += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f"{name} {self.values[name]}"]
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = dashboard_check.load(DASHBOARD)
    return loaded


@pytest.fixture(scope="module")
def brokers() -> Iterator[tuple[FakeBroker, FakeBroker]]:
    a, b = FakeBroker(ACTIVE), FakeBroker(STANDBY)
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def prometheus(brokers: tuple[FakeBroker, FakeBroker]) -> Iterator[str]:
    binary = require_binary("prometheus")
    targets = [b.target for b in brokers]
    with dashboard_check.local_prometheus([RULES], binary=binary, scrape={"zfab-broker": targets}) as url:
        wait_for(
            lambda: _value(url, 'count(up{job="zfab-broker"} == 1)') == 2,
            30,
            what="both brokers scraped",
        )
        yield url


def _value(url: str, expr: str) -> float | None:
    result = dashboard_check.evaluate(url, expr)["result"]
    return float(result[0]["value"][1]) if result else None


def _by_instance(url: str, expr: str) -> dict[str, float]:
    found = dashboard_check.evaluate(url, expr)["result"]
    return {r["metric"].get("instance", ""): float(r["value"][1]) for r in found}


def _panel_expr(dashboard: dict[str, Any], title: str, ref: str = "A") -> str:
    for q in dashboard_check.queries(dashboard):
        if q.panel == title and q.ref_id == ref:
            return str(q.promql)
    raise AssertionError(f"no panel {title!r} [{ref}]")


def test_dashboard_queries_parse_and_use_the_pinned_datasource(dashboard: dict[str, Any]) -> None:
    promtool = require_binary("promtool")
    qs = dashboard_check.queries(dashboard)
    assert len(qs) >= 8
    r = dashboard_check.check_promql(qs, promtool)
    assert r.returncode == 0, r.stdout + r.stderr
    assert dashboard_check.datasource_problems(dashboard) == []
    ids = [p["id"] for p in dashboard_check.iter_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))


def test_dashboard_and_alerts_use_only_the_brokers_term_metrics(dashboard: dict[str, Any]) -> None:
    rules = [line for line in RULES.read_text().splitlines() if line.strip().startswith("expr:")]
    exprs = [q.expr for q in dashboard_check.queries(dashboard)] + rules
    used = dashboard_check.metric_names(exprs)
    assert used - set(TERM_METRICS) == set(), "metrics no broker exports about its term"
    assert set(TERM_METRICS) <= used, "every term metric has a panel or an alert"


def test_each_panel_shows_what_the_brokers_export(
    prometheus: str, dashboard: dict[str, Any], brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = brokers
    for q in dashboard_check.queries(dashboard):
        assert dashboard_check.evaluate(prometheus, q.promql)["result"], f"{q.panel} [{q.ref_id}] is empty"
    assert _value(prometheus, _panel_expr(dashboard, "Active brokers")) == 1
    assert _value(prometheus, _panel_expr(dashboard, "Brokers scraped")) == 2
    assert _value(prometheus, _panel_expr(dashboard, "Epoch")) == 3
    assert _by_instance(prometheus, _panel_expr(dashboard, "Role per broker")) == {a.target: 1, b.target: 0}
    ages = _by_instance(prometheus, _panel_expr(dashboard, "Lease age"))
    assert ages == {a.target: 0.12, b.target: 0.31}


def test_a_failover_shows_on_the_dashboard(
    prometheus: str, dashboard: dict[str, Any], brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    a, b = brokers
    a.values.update(zfab_broker_active=0)  # deposed (it would exit; its last scrape says standby)
    b.values.update(zfab_broker_active=1, zfab_broker_epoch=4, zfab_broker_failovers_total=2)
    role = _panel_expr(dashboard, "Role per broker")
    wait_for(lambda: _by_instance(prometheus, role) == {a.target: 0, b.target: 1}, 20, what="the new active broker")
    wait_for(lambda: _value(prometheus, _panel_expr(dashboard, "Epoch")) == 4, 20, what="the new epoch")
    assert _value(prometheus, _panel_expr(dashboard, "Active brokers")) == 1


def test_the_failover_alerts_load_and_lease_errors_go_pending(
    prometheus: str, brokers: tuple[FakeBroker, FakeBroker]
) -> None:
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules?type=alert", timeout=10) as r:
        groups = json.loads(r.read())["data"]["groups"]
    alerts = {rule["name"]: rule for g in groups for rule in g["rules"]}
    assert set(alerts) == {"ZfabNoActiveBroker", "ZfabFailoverStorm", "ZfabBrokerLeaseErrors"}
    for name, rule in alerts.items():
        assert rule["duration"] > 0 and rule["health"] != "err", (name, rule)
        assert rule["labels"]["severity"] in ("critical", "warning"), name
    _, b = brokers
    for n in range(1, 6):  # the standby's round trips start failing
        errors = b.values["zfab_broker_lease_errors_total"] = 10 * n
        if _pending(prometheus, "ZfabBrokerLeaseErrors"):
            break
        wait_for(lambda e=errors: _scraped_errors(prometheus, b.target) >= e, 10, what="the errors scraped")
    wait_for(lambda: _pending(prometheus, "ZfabBrokerLeaseErrors") == [b.target], 20, what="the alert pending")


def _scraped_errors(url: str, target: str) -> float:
    return _by_instance(url, "zfab_broker_lease_errors_total").get(target, 0.0)


def _pending(url: str, name: str) -> list[str]:
    found = dashboard_check.evaluate(url, f'ALERTS{{alertname="{name}"}}')["result"]
    return sorted(r["metric"].get("instance", "") for r in found)


def test_every_panel_has_a_value_in_an_outage(dashboard: dict[str, Any]) -> None:
    binary = require_binary("prometheus")
    with dashboard_check.local_prometheus([RULES], binary=binary) as url:
        empty = dashboard_check.queries_without_value(dashboard_check.queries(dashboard), url)
    assert empty == [], "\n".join(f"{q.panel} [{q.ref_id}] {why}: {q.promql}" for q, why in empty)
