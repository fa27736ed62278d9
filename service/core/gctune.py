"""Python's cyclic garbage collector, set for a long-running zfab process (broker, worker, API).

With the default thresholds (700, 10, 10) a full collection runs each time the objects that
survived since the last one reach a quarter of all tracked objects. The API keeps its last
10,000 jobs (a few dozen tracked objects each) next to ~230,000 objects that importing FastAPI
and pydantic left, so under load it scanned half a million objects every few thousand jobs:
bench/wrk.py measured 25 % of the API's CPU in the collector (1.2 s of every 5 s), and 0.36 ms
of its 1.4 ms per job.

`tune()`, called once a process has started, does what CPython's documentation of
`gc.freeze()` suggests for such servers:
- collects, then freezes what is alive: modules, classes, the app and its routes are never
  garbage, so no collection need look at them again;
- makes the young generation 50,000 objects instead of 700 (a collection each 50,000 net
  allocations instead of each 700), and keeps the ratios above it: a full collection at most
  once per 10 million net allocations (minutes at full load, some 100,000 jobs), still subject
  to CPython's quarter rule.

Cyclic garbage is still found, only later, and memory stays bounded by the same tables;
reference counting, which frees almost everything, is untouched. Library users (a `Client` in
their own process) are not affected: only the `zfab` commands call it.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 10)


def tune() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
