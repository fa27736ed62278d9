"""The settings table of docs/operations/configuration.md (moved there from the README) is checked against
the settings classes, so it cannot drift from them.
(The metrics list is checked against live processes: tests/integration/test_metrics_documented.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from zfab.api.settings import ApiSettings
from zfab.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "configuration.md"


def section(title: str) -> str:
    text = PAGE.read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def documented_settings() -> set[str]:
    """Every ZFAB_* name in the first column of the Configuration table."""
    names: set[str] = set()
    for line in section("Configuration").splitlines():
        if line.startswith("| `ZFAB_"):
            names |= set(re.findall(r"`(ZFAB_[A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_the_settings_table_lists_every_setting_and_nothing_else() -> None:
    fields = {f"ZFAB_{name.upper()}" for name in {**Settings.model_fields, **ApiSettings.model_fields}}
    listed = documented_settings()
    missing, extra = sorted(fields - listed), sorted(listed - fields)
    assert not missing, f"{PAGE.name}'s table misses {missing}: add a row for each (default, meaning)"
    assert not extra, f"{PAGE.name}'s table lists {extra}, which no settings class has: remove or rename"


def test_every_documented_default_is_the_code_default() -> None:
    """A row `| \\`ZFAB_X\\` | \\`default\\` | ...` shows the default the settings class has."""
    fields = {**Settings.model_fields, **ApiSettings.model_fields}
    wrong = []
    for line in section("Configuration").splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) != 3 or not cells[0].startswith("`ZFAB_"):
            continue
        names = re.findall(r"`ZFAB_([A-Z0-9_]+)`", cells[0])
        shown = re.findall(r"`([^`]*)`", cells[1])
        if len(shown) != len(names):
            continue  # a default described in words (computed from another setting)
        for name, text in zip(names, shown, strict=True):
            default = fields[name.lower()].default
            if default is None or callable(default) or text.startswith(("$", "~")):
                continue
            value = str(default).lower() if isinstance(default, bool) else str(default)
            if text != value and not (isinstance(default, float) and float(text) == default):
                wrong.append(f"ZFAB_{name}: the page {text!r}, code {value!r}")
    assert not wrong, "docs/operations/configuration.md defaults differ from the code: " + "; ".join(wrong)
