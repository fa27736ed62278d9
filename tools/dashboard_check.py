#!/usr/bin/env python3
"""Check a provisioned Grafana dashboard against Prometheus and the metrics zfab really exports.

    python tools/dashboard_check.py                       # the default dashboard: datasource + PromQL parse
    python tools/dashboard_check.py --metrics-url http://127.0.0.1:8000/metrics --metrics-url ...
                                                          # + every zfab_* name exists in those live scrapes
    python tools/dashboard_check.py --outage              # + every query returns a value on a Prometheus
                                                          #   that scrapes nothing (Debian's `prometheus`)
    python tools/dashboard_check.py --prometheus-url http://127.0.0.1:9090
                                                          # + every query returns a value on that Prometheus

Checks, each of which breaks a dashboard silently in Grafana:
- every panel and query names the pinned datasource uid (no `${DS_...}` import placeholders);
- every PromQL expression parses: they become recording rules in a temporary file for
  `promtool check rules`, after Grafana's variables are replaced by sample values;
- every `zfab_*` metric name used exists in a live scrape (a renamed metric shows up as a gap);
- every query returns at least one series when the series it reads are gone (`--outage`): a
  panel that says "No data" while a service has no live worker hides the outage it should show.
  A Prometheus with no targets is the worst case of that (every zfab series absent), so a
  query that answers there answers in every partial outage too; the usual fix is
  `or vector(0)`, or `or on() vector(0)` after a `by (...)` aggregation.

The test suite (tests/integration/test_deploy.py) imports this file; it uses only the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "zfab-overview.json"
DATASOURCE_UID = "zfab-prometheus"

# Grafana's built-in interval variables become a duration; a dashboard variable becomes its
# "All" value (`.*`), which is what the dashboard sends when nothing is selected.
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_METRIC = re.compile(r"\bzfab_[a-zA-Z0-9_]+")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)")
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)")
_SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum"), "counter": ("_total",)}


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a panel."""

    panel: str
    ref_id: str
    expr: str

    @property
    def promql(self) -> str:
        """The expression as Prometheus would receive it from Grafana."""
        return substitute_variables(self.expr)


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def iter_panels(panels: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels") or [])


def queries(dashboard: dict[str, Any]) -> list[Query]:
    return [
        Query(str(p.get("title", "")), str(t.get("refId", "")), str(t["expr"]))
        for p in iter_panels(dashboard.get("panels") or [])
        for t in p.get("targets") or []
        if t.get("expr")
    ]


def variable_queries(dashboard: dict[str, Any]) -> list[str]:
    """Template variable queries (`label_values(...)`): not PromQL, but they name metrics too."""
    out = []
    for var in (dashboard.get("templating") or {}).get("list") or []:
        q = var.get("query")
        text = q.get("query") if isinstance(q, dict) else q
        if var.get("type") == "query" and text:
            out.append(str(text))
    return out


def substitute_variables(expr: str) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return "1m" if name.startswith("__") else ".*"

    return _VARIABLE.sub(repl, expr)


def metric_names(exprs: Iterable[str]) -> set[str]:
    return {name for e in exprs for name in _METRIC.findall(e)}


def datasource_problems(dashboard: dict[str, Any], uid: str = DATASOURCE_UID) -> list[str]:
    """Panels, queries or variables that do not name the pinned datasource uid."""
    problems = []
    if "${DS_" in json.dumps(dashboard):
        problems.append("a ${DS_...} placeholder: provisioning does not replace it, the panels would be empty")
    for p in iter_panels(dashboard.get("panels") or []):
        if p.get("type") == "row":
            continue
        title = p.get("title", p.get("id"))
        if (p.get("datasource") or {}).get("uid") != uid:
            problems.append(f"panel {title!r}: datasource {p.get('datasource')!r}, want uid {uid!r}")
        for t in p.get("targets") or []:
            if (t.get("datasource") or {}).get("uid") != uid:
                problems.append(f"panel {title!r} query {t.get('refId')}: datasource {t.get('datasource')!r}")
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") == "query" and (var.get("datasource") or {}).get("uid") != uid:
            problems.append(f"variable {var.get('name')!r}: datasource {var.get('datasource')!r}")
    return problems


def rules_document(qs: Iterable[Query]) -> dict[str, Any]:
    """A rules file with one recording rule per query: `promtool check rules` parses each expr."""
    rules = [{"record": f"zfab_dashboard:query_{i}", "expr": q.promql} for i, q in enumerate(qs)]
    return {"groups": [{"name": "zfab-dashboard-queries", "rules": rules}]}


def check_promql(qs: list[Query], promtool: str = "promtool") -> subprocess.CompletedProcess[str]:
    """Run `promtool check rules` on the dashboard's queries (JSON is valid YAML)."""
    with tempfile.TemporaryDirectory(prefix="zfab-dashboard-") as tmp:
        path = Path(tmp) / "dashboard-rules.yml"
        path.write_text(json.dumps(rules_document(qs), indent=1), encoding="utf-8")
        return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def exposed_names(text: str) -> set[str]:
    """Metric names a /metrics page declares: its samples, plus each family's sample names by its TYPE
    (a labelled counter with no child yet still declares the family)."""
    names: set[str] = set()
    for line in text.splitlines():
        if m := _TYPE.match(line):
            name, kind = m.groups()
            names.add(name)
            names.update(name + s for s in _SUFFIXES.get(kind, ()))
        elif line and not line.startswith("#") and (m := _SAMPLE.match(line)):
            names.add(m.group(1))
    return names


def scrape(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body: bytes = r.read()
    return body.decode("utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body: bytes = r.read()
    except urllib.error.HTTPError as e:  # a refused query answers 400 with a JSON error
        body = e.read()
    data: dict[str, Any] = json.loads(body)
    return data


@contextlib.contextmanager
def local_prometheus(
    rule_files: Sequence[Path] = (),
    binary: str = "prometheus",
    timeout: float = 30.0,
    scrape: dict[str, list[str]] | None = None,
) -> Iterator[str]:
    """A Prometheus server on 127.0.0.1 loading `rule_files`; yields its URL. It scrapes nothing unless
    `scrape` names targets (job name -> ["127.0.0.1:PORT", ...], every second).

    With nothing scraped every zfab series is absent: the dashboard as an outage leaves it."""
    with tempfile.TemporaryDirectory(prefix="zfab-prometheus-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        jobs = [
            {"job_name": job, "scrape_interval": "1s", "static_configs": [{"targets": targets}]}
            for job, targets in (scrape or {}).items()
        ]
        doc = {"global": {"evaluation_interval": "1s"}, "rule_files": [str(p) for p in rule_files]}
        if jobs:
            doc["scrape_configs"] = jobs
        config.write_text(json.dumps(doc), encoding="utf-8")  # JSON is valid YAML
        port = _free_port()
        log = (Path(tmp) / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={Path(tmp) / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.flush()
                    tail = (Path(tmp) / "prometheus.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{tail}")
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus on {url} not ready after {timeout:.0f} s")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()


def evaluate(url: str, expr: str) -> dict[str, Any]:
    """An instant query against the Prometheus at `url`: the API's `data`, or ValueError with its error."""
    body = _get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if body.get("status") != "success":
        raise ValueError(str(body.get("error") or body))
    data: dict[str, Any] = body["data"]
    return data


def queries_without_value(qs: Iterable[Query], url: str) -> list[tuple[Query, str]]:
    """The queries that return no series (Grafana's "No data") on the Prometheus at `url`, with why."""
    out = []
    for q in qs:
        try:
            data = evaluate(url, q.promql)
        except ValueError as e:
            out.append((q, f"refused: {e}"))
            continue
        if data.get("resultType") in ("vector", "matrix") and not data.get("result"):
            out.append((q, "no series"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dashboards", nargs="*", type=Path, default=[DASHBOARD])
    ap.add_argument("--promtool", default="promtool")
    ap.add_argument("--metrics-url", action="append", default=[], help="a live /metrics to check names against")
    ap.add_argument("--prometheus-url", help="every query must return a value on this Prometheus")
    ap.add_argument(
        "--outage", action="store_true", help="every query must return a value on a local Prometheus with no targets"
    )
    ap.add_argument("--prometheus", default="prometheus", help="the Prometheus server binary for --outage")
    ns = ap.parse_args(argv)
    exposed: set[str] = set()
    for url in ns.metrics_url:
        exposed |= exposed_names(scrape(url))
    with contextlib.ExitStack() as stack:
        urls = [ns.prometheus_url] if ns.prometheus_url else []
        if ns.outage:
            urls.append(stack.enter_context(local_prometheus(binary=ns.prometheus)))
        failed = False
        for path in ns.dashboards:
            dash = load(path)
            qs = queries(dash)
            problems = datasource_problems(dash)
            r = check_promql(qs, ns.promtool)
            if r.returncode != 0:
                problems.append("promtool check rules: " + (r.stdout + r.stderr).strip())
            if ns.metrics_url:
                names = metric_names([q.expr for q in qs] + variable_queries(dash))
                problems += [f"metric {n} is not exported by any scraped endpoint" for n in sorted(names - exposed)]
            for url in urls:
                where = "a Prometheus with no targets" if url != ns.prometheus_url else url
                problems += [
                    f"panel {q.panel!r} query {q.ref_id} on {where}: {why} ({q.promql})"
                    for q, why in queries_without_value(qs, url)
                ]
            for p in problems:
                print(f"{path}: {p}")
            failed |= bool(problems)
            print(f"{path}: {len(qs)} queries, {'FAILED' if problems else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
