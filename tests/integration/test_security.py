"""CURVE: only known keys connect, a worker name belongs to its key, and open endpoints need consent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fabric import ROOT, Fabric, fabric, wait_for

from zfab import BrokerUnavailableError, Client, JobTimeoutError, Settings
from zfab.transport.security import create_keys

pytestmark = pytest.mark.integration


def keys(tmp: Path) -> dict[str, tuple[Path, Path]]:
    (tmp / "keys").mkdir()
    allowed = tmp / "allowed"
    allowed.mkdir()
    out = {
        "broker": create_keys(tmp / "keys", "broker"),
        "w1": create_keys(tmp / "keys", "w1", worker="w1"),
        "client": create_keys(tmp / "keys", "client"),
        "stranger": create_keys(tmp / "stranger", "stranger"),
    }
    for name in ("w1", "client"):
        (allowed / f"{name}.key").write_bytes(out[name][0].read_bytes())
    return out


def curve_client(f: Fabric, secret: Path | None, server: Path | None, name: str) -> Client:
    s = Settings(
        broker=f.endpoint,
        keepalive_interval=f.interval,
        keepalive_multiplier=f.multiplier,
        curve_secret=str(secret) if secret else None,
        curve_server_key=str(server) if server else None,
    )
    return Client(settings=s, name=name).start()


def test_curve_admits_known_keys_and_refuses_the_rest(tmp_path: Path) -> None:
    k = keys(tmp_path)
    with fabric(tmp_path) as f:
        f.env.update(ZFAB_CURVE_SECRET=str(k["broker"][1]), ZFAB_CURVE_CLIENTS=str(tmp_path / "allowed"))
        f.broker()
        f.env.pop("ZFAB_CURVE_CLIENTS")
        f.env.update(ZFAB_CURVE_SECRET=str(k["w1"][1]), ZFAB_CURVE_SERVER_KEY=str(k["broker"][0]))
        f.worker("w1")
        # A known worker key registered under the name bound to it; a known client runs a job.
        with curve_client(f, k["client"][1], k["broker"][0], "good") as c:
            wait_for(lambda: {w["name"] for w in c.mmi("show_workers", timeout=1)} == {"w1"}, 20, what="w1 over CURVE")
            assert c.run_job("demo", "echo", kwargs={"data": "secret"}, timeout=10)["w1"]["result"] == "secret"
        # The same worker key cannot register another name.
        f.worker("w9")
        # Unknown client key, garbage server key, and plain NULL security are all refused in bounded time.
        bad = tmp_path / "garbage.key"
        bad.write_text(k["stranger"][0].read_text())
        for secret, server, name in (
            (k["stranger"][1], k["broker"][0], "stranger"),
            (k["client"][1], bad, "wrong-server"),
            (None, None, "plain"),
        ):
            with curve_client(f, secret, server, name) as c, pytest.raises((JobTimeoutError, BrokerUnavailableError)):
                c.mmi("show_workers", timeout=1.5)
            assert not c.broker_alive
        with curve_client(f, k["client"][1], k["broker"][0], "check") as c:
            workers = {w["name"] for w in c.mmi("show_workers", timeout=2)}
            assert workers == {"w1"}  # w9 never registered with w1's key
            rejected = c.mmi("show_broker")["frames_rejected"]
            assert rejected.get("auth", 0) >= 1


def test_a_non_loopback_endpoint_without_curve_needs_insecure(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "zfab.cli", "broker", "--endpoint", "tcp://0.0.0.0:0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2 and "without CURVE" in run.stderr


def test_zfab_keys_writes_a_usable_pair(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "zfab.cli", "keys", "--dir", str(tmp_path), "--name", "w1", "--worker", "w1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "w1.key").exists() and (tmp_path / "w1.key_secret").stat().st_mode & 0o077 == 0
    assert 'worker = "w1"' in (tmp_path / "w1.key").read_text()


def test_a_key_added_to_the_clients_directory_is_accepted_without_a_restart(tmp_path: Path) -> None:
    k = keys(tmp_path)
    pool = create_keys(tmp_path / "keys", "pool", worker="pool-*")  # one key for a Deployment's replicas
    with fabric(tmp_path) as f:
        f.env.update(ZFAB_CURVE_SECRET=str(k["broker"][1]), ZFAB_CURVE_CLIENTS=str(tmp_path / "allowed"))
        f.broker()
        f.env.pop("ZFAB_CURVE_CLIENTS")
        f.env.update(ZFAB_CURVE_SECRET=str(pool[1]), ZFAB_CURVE_SERVER_KEY=str(k["broker"][0]))
        f.worker("pool-a")  # its key is not accepted yet
        with curve_client(f, k["client"][1], k["broker"][0], "ops") as c:
            wait_for(lambda: c.broker_alive, 10, what="the client over CURVE")
            assert c.mmi("show_workers", timeout=2) == []
            # When the operator copies the new public key in (key rotation: the old one may stay)
            (tmp_path / "allowed" / "pool.key").write_bytes(pool[0].read_bytes())
            # Then the worker's next connection attempt is admitted, with no broker restart
            wait_for(lambda: {w["name"] for w in c.mmi("show_workers", timeout=1)} == {"pool-a"}, 20, what="admitted")
            assert c.run_job("demo", "echo", kwargs={"data": 1}, timeout=10)["pool-a"]["result"] == 1
            # and its prefix covers another replica's name, but no name outside it
            f.worker("pool-b")
            f.worker("other")
            wait_for(lambda: "pool-b" in {w["name"] for w in c.mmi("show_workers", timeout=1)}, 20, what="pool-b")
            assert "other" not in {w["name"] for w in c.mmi("show_workers", timeout=1)}
