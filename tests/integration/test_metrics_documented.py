"""The metrics list of docs/operations/metrics.md (moved there from the README) names every metric family
the broker, a worker and the API serve, and only those.

The families are collected by scraping real processes after some traffic (jobs that complete, fail and
send events, a schedule), so a family added anywhere shows up here without this test changing: the
failure message gives the rows to add, from the families' own HELP text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fabric import ROOT, Fabric, free_port, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SUFFIXES = {"counter": "_total"}
IGNORED_LABELS = {"le", "quantile"}


@dataclass
class Family:
    type: str
    help: str
    labels: set[str] = field(default_factory=set)
    where: set[str] = field(default_factory=set)

    def row(self, name: str) -> str:
        """A metrics table row for it."""
        labels = ",".join(sorted(self.labels))
        return f"| `{name}{{{labels}}}` | {self.type} | {', '.join(sorted(self.where))} | {self.help} |"


def families(text: str, where: str, into: dict[str, Family]) -> None:
    """Each zfab_ family in a scrape: its exposed name (counters with _total), type, labels, help, processes."""
    parsed = list(text_string_to_metric_families(text))
    with_created = {f.name + "_created" for f in parsed if f.type in ("counter", "histogram", "summary")}
    for fam in parsed:
        if not fam.name.startswith("zfab_") or fam.name in with_created:
            continue  # `x_created` is the creation time of counter or histogram x, not a family of its own
        entry = into.setdefault(fam.name + SUFFIXES.get(fam.type, ""), Family(fam.type, fam.documentation))
        for sample in fam.samples:
            entry.labels |= set(sample.labels) - IGNORED_LABELS
        entry.where.add(where)


def documented() -> set[str]:
    page = (ROOT / "docs" / "operations" / "metrics.md").read_text()
    section = page.split("\n## Metrics", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(zfab_[a-z0-9_]+)", section))


def test_the_metrics_page_lists_every_metric_family_and_no_other(tmp_path: Path) -> None:
    f = Fabric(tmp_path)
    try:
        broker_port, worker_port, api_port = free_port(), free_port(), free_port()
        f.broker("broker", "--metrics-port", str(broker_port))
        f.worker("w1", "demo", "--metrics-port", str(worker_port))
        f.start("api", "api", "--port", str(api_port), env={"ZFAB_API_DB": ""})
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        wait_for(
            lambda: api.post("/jobs?wait=5", json={"service": "demo", "task": "echo"}).status_code == 200,
            30,
            what="a demo job through the API",
        )
        # Some of every kind of traffic, so that labelled families have their series
        for job in (
            {"service": "demo", "task": "fail", "kwargs": {"message": "x"}},
            {"service": "demo", "task": "progress", "kwargs": {"steps": 2, "delay": 0.01}},
            {"service": "demo", "task": "nosuch"},
            {"service": "demo", "task": "echo", "workers": "all"},
        ):
            api.post("/jobs?wait=5", json=job)
        assert (
            api.post("/schedules", json={"job": {"service": "demo", "task": "echo"}, "every": 3600}).status_code == 201
        )
        found: dict[str, Family] = {}
        for where, url in (
            ("broker", f"http://127.0.0.1:{broker_port}/metrics"),
            ("worker", f"http://127.0.0.1:{worker_port}/metrics"),
            ("api", f"http://127.0.0.1:{api_port}/metrics"),
        ):
            families(httpx.get(url, timeout=10).text, where, found)
        api.close()
    finally:
        f.stop()
    listed = documented()
    missing = sorted(set(found) - listed)
    stale = sorted(listed - set(found))
    assert not missing, "docs/operations/metrics.md's table misses these families; add the rows:\n" + "\n".join(
        found[n].row(n) for n in missing
    )
    assert not stale, f"docs/operations/metrics.md's table lists families no process serves (renamed or gone?): {stale}"
