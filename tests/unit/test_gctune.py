"""core/gctune.py: what a zfab process does to Python's collector once it has started.

Each case runs in a child interpreter: the collector's settings are process-wide."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

CHILD = """
import gc, json, sys
from service import tune_gc
from service.core.gctune import THRESHOLDS

class Cycle:
    def __init__(self):
        self.me = self

before = gc.get_freeze_count()
tune_gc()
frozen = gc.get_freeze_count()
# A cycle made after the freeze is still collected: tune() delays the collector, it does not stop it.
import weakref
c = Cycle(); ref = weakref.ref(c); del c
gc.collect()
print(json.dumps({"before": before, "frozen": frozen, "thresholds": gc.get_threshold(),
                  "expected": THRESHOLDS, "cycle_freed": ref() is None, "enabled": gc.isenabled()}))
"""


def child(code: str) -> dict[str, Any]:
    import json

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_tune_freezes_what_is_alive_and_raises_the_thresholds() -> None:
    r = child(CHILD)
    assert r["before"] == 0
    assert isinstance(r["frozen"], int) and r["frozen"] > 10_000  # the imported modules and classes
    assert r["thresholds"] == list(r["expected"])
    assert r["thresholds"][0] > 700
    assert r["enabled"] is True
    assert r["cycle_freed"] is True


def test_importing_the_package_leaves_the_collector_alone() -> None:
    r = child(
        "import gc, json; import service; print(json.dumps({'t': gc.get_threshold(), 'f': gc.get_freeze_count()}))"
    )
    assert r == {"t": [700, 10, 10], "f": 0}
