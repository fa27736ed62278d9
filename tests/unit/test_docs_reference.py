"""The generated reference pages (tools/docs/reference.py) name everything they should: every ZFAB_ variable
the code reads, every settings field with its default, every CLI command and flag, every REST route. They
are generated from the code as the site builds; these tests make sure the generator misses nothing."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "docs"))
import reference  # noqa: E402

from zfab.api.settings import ApiSettings  # noqa: E402
from zfab.settings import Settings  # noqa: E402


def test_the_settings_page_names_every_variable_the_code_reads() -> None:
    page = reference.settings_page()
    read = set()
    for folder in ("service", "api", "apiclient"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"\bZFAB_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    fields = {f"ZFAB_{name.upper()}" for name in {**Settings.model_fields, **ApiSettings.model_fields}}
    missing = sorted(v for v in read | fields if f"`{v}`" not in page)
    assert len(read | fields) > 60
    assert not missing, f"the settings reference misses {missing}"


def test_the_settings_page_finds_every_settings_class_and_its_defaults() -> None:
    classes = reference.settings_classes()
    assert Settings in classes and ApiSettings in classes
    page = reference.settings_page()
    assert "| `ZFAB_KEEPALIVE_INTERVAL` | `float` | `2.5` |" in page
    assert "| `ZFAB_API_PORT` |" in page


def test_every_variable_read_outside_the_settings_has_a_meaning() -> None:
    known = {f"ZFAB_{n.upper()}" for n in {**Settings.model_fields, **ApiSettings.model_fields}}
    other = set(reference.variables_read()) - known
    assert other <= set(reference.OTHER_VARIABLES), f"say what these mean in OTHER_VARIABLES: {other}"


def test_the_cli_page_names_every_command_and_flag() -> None:
    page = reference.cli_page()
    paths = [path for path, _ in reference.commands()]
    assert {"zfab broker", "zfab worker", "zfab up", "zfab api", "zfab submit", "zfab schedules add"} <= set(paths)
    for path, parser in reference.commands():
        if path != "zfab":
            assert f"`{path}`" in page, path
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert f"`{', '.join(action.option_strings)}`" in page, f"{path} {action.option_strings}"


def test_the_rest_page_names_every_route() -> None:
    schema = reference.openapi()
    page = reference.rest_page()
    routes = [(m.upper(), p) for p, ms in schema["paths"].items() for m in ms]
    assert ("POST", "/jobs") in routes
    missing = [f"{m} {p}" for m, p in routes if f"`{m} {p}`" not in page]
    assert not missing, missing


def test_the_limits_page_lists_the_bounds_with_their_settings() -> None:
    page = reference.limits_page()
    for var in ("ZFAB_SERVICE_QUEUE_SIZE", "ZFAB_BROKER_QUEUE_BYTES", "ZFAB_MAX_CLIENT_JOBS", "ZFAB_JOB_HISTORY"):
        assert f"`{var}`" in page, var
    assert "| `MAX_NAME_BYTES` | `256` |" in page


def test_the_dashboards_and_alerts_page_lists_every_alert_rule_and_panel() -> None:
    import json

    page = reference.alerts_page()
    rules = (ROOT / "deploy" / "prometheus" / "rules" / "zfab-alerts.yml").read_text()
    alerts = re.findall(r"^\s*- alert: (\w+)", rules, re.M)
    assert len(alerts) > 5
    assert not [a for a in alerts if f"`{a}`" not in page]
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "zfab-overview.json").read_text())
    titles = [p["title"] for p in board["panels"]]
    assert not [t for t in titles if reference.cell(t) not in page]
