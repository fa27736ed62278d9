"""pytest plugin for NorFab's own test suite, loaded with ``-p norfab_suite_plugin`` (run.py).

It runs inside the NorFab virtualenv and never edits NorFab's tests. It adapts two things only:

- **the worker selection**: every NorFab instance a test starts runs only the device-free workers
  (``ZFAB_SUITE_WORKERS``, a comma-separated list; the built-in filesharing worker always runs), and
  those of ``ZFAB_SUITE_START_LAST`` start once the others have initialised (NorFab's own topology
  ``depends_on``). NorFab's FastAPI worker discovers the services' tasks once as it starts and again
  10 s later, and its tests read the discovery within that window: started alongside the nornir
  workers, whether nornir's endpoints exist is a race between processes, on either broker (seen in
  both runs' logs: its first discovery missed nornir in about half of the fabric starts);
- **the broker**, with ``ZFAB_SUITE_BROKER=zfab``: where NorFab would start its own broker process,
  a ``zfab broker`` (``ZFAB_SUITE_ZFAB``, the zfab executable) is started on the same endpoint and
  given the same inventory (``ZFAB_BROKER_INVENTORY``), and stopped when NorFab is destroyed.
  NorFab's workers and client are unchanged: they find the broker at the inventory's endpoint.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from typing import Any
from urllib.parse import urlparse

from norfab.core import nfapi

BROKER = os.environ.get("ZFAB_SUITE_BROKER", "norfab")
ZFAB = os.environ.get("ZFAB_SUITE_ZFAB", "zfab")
WORKERS = {w.strip() for w in os.environ.get("ZFAB_SUITE_WORKERS", "").split(",") if w.strip()}
LAST = {w.strip() for w in os.environ.get("ZFAB_SUITE_START_LAST", "").split(",") if w.strip()}
BUILT_IN = "filesharing-worker-1"  # NorFab adds it to every fabric that runs its own broker
START_TIMEOUT = 20.0


def _name(entry: Any) -> str:
    return str(next(iter(entry))) if isinstance(entry, dict) else str(entry)


def _wait_port(endpoint: str, proc: subprocess.Popen[bytes]) -> None:
    url = urlparse(endpoint)
    deadline = time.monotonic() + START_TIMEOUT
    last: OSError | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"zfab broker exited with {proc.returncode} before binding {endpoint}")
        try:
            with socket.create_connection((url.hostname or "127.0.0.1", url.port or 0), timeout=0.5):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise RuntimeError(f"zfab broker did not bind {endpoint} within {START_TIMEOUT} s (last: {last!r})") from last


def _start_zfab(nf: Any) -> subprocess.Popen[bytes]:
    """A zfab broker on NorFab's endpoint, serving NorFab's inventory as NorFab's broker would
    (workers' data after NorFab added its built-in filesharing worker)."""
    inv = nf.inventory
    data = inv.dict()
    data["workers"] = inv.workers.data
    # Written next to NorFab's inventory, so its relative file names resolve the same way.
    fd, path = tempfile.mkstemp(prefix=".zfab-inventory-", suffix=".yaml", dir=inv.base_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, default=str)  # JSON is YAML
    env = dict(
        os.environ,
        ZFAB_BROKER_INVENTORY=path,
        ZFAB_BROKER_HANDOVER="true",  # NorFab workers reconnect under their names
        ZFAB_DATA_DIR=tempfile.mkdtemp(prefix="zfab-suite-"),
    )
    env.pop("PYTHONPATH", None)
    log = open(os.path.join(inv.base_dir, "__norfab__", "zfab-broker.log"), "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [ZFAB, "broker", "--endpoint", nf.broker_endpoint, "--metrics-port", "0"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    _BROKERS.append(proc)
    _wait_port(nf.broker_endpoint, proc)
    return proc


_BROKERS: list[subprocess.Popen[bytes]] = []  # every zfab broker started, for pytest_unconfigure


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


_init = nfapi.NorFab.__init__
_start = nfapi.NorFab.start
_destroy = nfapi.NorFab.destroy


def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    topo = self.inventory.topology
    if WORKERS and isinstance(topo.get("workers"), list):
        topo["workers"] = [w for w in topo["workers"] if _name(w) in WORKERS]
    if LAST and isinstance(topo.get("workers"), list):
        topo["workers"] = [_after_others(w, topo["workers"]) for w in topo["workers"]]


def _after_others(entry: Any, entries: list[Any]) -> Any:
    """A topology entry of ZFAB_SUITE_START_LAST as one that depends on every other entry (NorFab starts
    it once they have initialised); any other entry as it is."""
    name = _name(entry)
    if name not in LAST:
        return entry
    data = dict(entry[name] or {}) if isinstance(entry, dict) else {}
    others = [_name(e) for e in entries if _name(e) not in LAST]
    data["depends_on"] = [*data.get("depends_on", []), *(o for o in others if o not in data.get("depends_on", []))]
    return {name: data}


def start(self: Any, run_broker: bool | None = None, run_workers: Any = None) -> None:
    runs = self.run_broker if run_broker is None else run_broker
    if BROKER == "zfab" and runs is True and self.inventory.topology.get("broker") is True:
        self.add_built_in_workers_inventory()
        self._zfab_broker = _start_zfab(self)
        self.inventory.topology["broker"] = False  # NorFab starts its workers and client only
    _start(self, run_broker, run_workers)


def destroy(self: Any) -> None:
    try:
        _destroy(self)
    finally:
        proc = getattr(self, "_zfab_broker", None)
        if proc is not None:
            _stop(proc)
            self._zfab_broker = None


nfapi.NorFab.__init__ = __init__  # type: ignore[method-assign]
nfapi.NorFab.start = start  # type: ignore[method-assign]
nfapi.NorFab.destroy = destroy  # type: ignore[method-assign]


def pytest_unconfigure(config: Any) -> None:
    """After the report is written: a NorFab instance a test left running (its worker processes are
    not daemons) would keep pytest from exiting; end those, on either broker alike, and any zfab
    broker a fixture that failed in its setup left behind."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
    for proc in _BROKERS:  # a fixture that failed in its setup never called destroy()
        _stop(proc)
