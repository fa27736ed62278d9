"""Broker and worker processes serve /metrics and /healthz; promtool accepts every output."""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import require_binary
from fabric import fabric, free_port, wait_for

from zfab import Client, Settings

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_broker_and_worker_metrics_are_valid_and_describe_the_fabric(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    bport, wport = free_port(), free_port()
    with fabric(tmp_path) as f:
        f.broker("broker", "--metrics-port", str(bport))
        f.worker("w1", "demo", "--metrics-port", str(wport))
        s = Settings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier)
        with Client(settings=s, name="m") as c:
            wait_for(lambda: {w["name"] for w in c.mmi("show_workers")} == {"w1"}, 20, what="w1")
            c.run_job("demo", "echo", kwargs={"data": 1}, timeout=10)
            c.run_job("demo", "fail", timeout=10)
        for port in (bport, wport):
            wait_for(lambda p=port: get(f"http://127.0.0.1:{p}/healthz")[0] == 200, 10, what="healthz")
        # keepalive stats reach the broker with the next keepalive
        wait_for(
            lambda: (
                'zfab_jobs_total{outcome="failed",service="demo",worker="w1"} 1.0'
                in get(f"http://127.0.0.1:{bport}/metrics")[1]
            ),
            10,
            what="worker-reported job counts in the broker's metrics",
        )
        wait_for(
            lambda: (
                re.search(
                    r'^zfab_worker_keepalives_sent_total\{service="demo",worker="w1"\} [1-9]',
                    get(f"http://127.0.0.1:{bport}/metrics")[1],
                    re.M,
                )
                is not None
            ),
            10,
            what="keepalives counted",
        )
        _, broker = get(f"http://127.0.0.1:{bport}/metrics")
        _, worker = get(f"http://127.0.0.1:{wport}/metrics")
        for text in (broker, worker):
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stdout + r.stderr
            assert not re.search(r"uuid|juuid|[0-9a-f]{32}", text), "a job id leaked into a label"
        assert 'zfab_workers{service="demo",state="alive"} 1.0' in broker
        assert re.search(r'^zfab_worker_keepalives_sent_total\{service="demo",worker="w1"\} [1-9]', broker, re.M)
        assert re.search(r'^zfab_queue_depth\{hop="worker_jobs",worker="w1"\} 0\.0', broker, re.M)
        assert 'zfab_queue_capacity{hop="broker_outbound",worker=""}' in broker
        assert 'zfab_jobs_total{outcome="completed",service="demo",worker="w1"} 1.0' in worker
        assert re.search(
            r'^zfab_worker_broker_holdtime_left_seconds\{service="demo",worker="w1"\} [0-9.]+', worker, re.M
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            get(f"http://127.0.0.1:{bport}/nope")
        assert err.value.code == 404
