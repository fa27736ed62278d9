"""core/tuning.py: what a zfab process does to Python's collector and to malloc once it has started.

Each case runs in a child interpreter: both are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHILD = """
import gc, json, sys, weakref
from zfab import tune_process
from zfab.core.tuning import GC_THRESHOLDS

class Cycle:
    def __init__(self):
        self.me = self

before = gc.get_freeze_count()
changed = tune_process()
frozen = gc.get_freeze_count()
# A cycle made after the freeze is still collected: tune() delays the collector, it does not stop it.
c = Cycle(); ref = weakref.ref(c); del c
gc.collect()
print(json.dumps({"before": before, "frozen": frozen, "thresholds": gc.get_threshold(), "changed": changed,
                  "expected": GC_THRESHOLDS, "cycle_freed": ref() is None, "enabled": gc.isenabled()}))
"""

# Page faults of 30 rounds of a 10 MB job's allocations (a frame, its JSON, a result), before and after.
FAULTS = """
import json, resource, sys
from zfab.core.tuning import allocator

def rounds():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(30):
        frame = b"x" * (10 * 1024 * 1024 + i)
        text = frame.decode()
        result = text.encode()
        del frame, text, result
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

rounds()
default = rounds()
changed = allocator()
rounds()
print(json.dumps({"default": default, "tuned": rounds(), "changed": changed}))
"""


def child(code: str, **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env={**environ, **env}
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def glibc() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


def test_tune_freezes_what_is_alive_and_raises_the_thresholds() -> None:
    r = child(CHILD)
    assert r["before"] == 0
    assert r["frozen"] > 10_000  # the imported modules and classes
    assert r["thresholds"] == list(r["expected"]) and r["thresholds"][0] > 700
    assert r["enabled"] is True
    assert r["cycle_freed"] is True
    assert r["changed"] == {"gc": True, "malloc": glibc()}


def test_importing_the_package_leaves_collector_and_malloc_alone() -> None:
    r = child("import gc, json, service; print(json.dumps({'t': gc.get_threshold(), 'f': gc.get_freeze_count()}))")
    assert r == {"t": [700, 10, 10], "f": 0}


@pytest.mark.skipif(not glibc(), reason="mallopt is glibc's")
def test_large_blocks_come_from_the_heap_instead_of_fresh_pages() -> None:
    r = child(FAULTS)
    assert r["changed"] is True
    # 30 rounds of three 10 MB blocks: ~2,560 faults per block by default (fresh mmapped pages),
    # a few hundred in all once the heap keeps them.
    assert r["default"] > 30 * 2 * 2000, r
    assert r["tuned"] < r["default"] / 10, r


@pytest.mark.skipif(not glibc(), reason="mallopt is glibc's")
def test_a_malloc_setting_in_the_environment_wins() -> None:
    r = child(FAULTS, MALLOC_TRIM_THRESHOLD_="131072")
    assert r["changed"] is False
    r = child(CHILD, GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert r["changed"] == {"gc": True, "malloc": False}


def test_one_malloc_policy_in_one_place() -> None:
    """Only core/tuning.py sets glibc's malloc: a second setter (core/memory.py fixed the mmap threshold
    at 1 MiB, which tuning.py then silently overrode with 32 MiB in every role) would leave the policy
    to whichever ran last."""
    root = Path(__file__).resolve().parents[2]
    setters = sorted(
        str(p.relative_to(root))
        for folder in ("service", "api")
        for p in (root / folder).rglob("*.py")
        if "mallopt" in p.read_text()
    )
    assert setters == ["service/core/tuning.py"]
