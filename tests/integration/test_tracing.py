"""OpenTelemetry across the fabric: one trace from an HTTP caller, through the API's client and the
broker's queue, to each attempt on a worker (the SDK's in-memory exporter, in a process of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fabric import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

pytest.importorskip("opentelemetry.sdk", reason="the test extra installs opentelemetry-sdk")


def run_probe(tmp: Path) -> list[dict[str, Any]]:
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "integration" / "otel_probe.py"), str(tmp)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    spans: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    return spans


def test_one_trace_id_spans_http_client_and_worker(tmp_path: Path) -> None:
    spans = run_probe(tmp_path)
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    echo = by_trace["0af7651916cd43dd8448eb211c80319c"]  # the caller's trace id, continued everywhere
    (server,) = [s for s in echo if s["kind"] == "SERVER" and s["name"].startswith("POST")]  # FastAPI's own
    (producer,) = [s for s in echo if s["kind"] == "PRODUCER"]
    (consumer,) = [s for s in echo if s["kind"] == "CONSUMER"]
    # HTTP -> client -> worker, each the parent of the next
    assert server["parent_id"] == "b7ad6b7169203331"
    assert producer["parent_id"] == server["span_id"] and producer["name"] == "send demo"
    assert consumer["parent_id"] == producer["span_id"] and consumer["name"] == "process demo"
    assert producer["attributes"]["messaging.message.id"] == consumer["attributes"]["messaging.message.id"]
    assert consumer["attributes"]["zfab.task"] == "echo" and consumer["attributes"]["zfab.outcome"] == "completed"
    # the queue wait is visible: the consumer starts after the producer ends, and says how long it waited
    assert consumer["start"] >= producer["end"]
    assert consumer["attributes"]["zfab.waited_seconds"] >= consumer["attributes"]["zfab.queued_seconds"] >= 0
    # a retried job: one CONSUMER span per attempt, both children of its one PRODUCER span
    flaky = by_trace["4bf92f3577b34da6a3ce929d0e0e4736"]
    (produced,) = [s for s in flaky if s["kind"] == "PRODUCER"]
    attempts = sorted((s for s in flaky if s["kind"] == "CONSUMER"), key=lambda s: s["attributes"]["zfab.attempt"])
    assert [a["attributes"]["zfab.attempt"] for a in attempts] == [1, 2]
    assert all(a["parent_id"] == produced["span_id"] for a in attempts)
    assert [a["status"] for a in attempts] == ["ERROR", "UNSET"]
    assert attempts[1]["start"] >= attempts[0]["end"] + 0.8  # the declared backoff (1 s, ±10 %) between them
