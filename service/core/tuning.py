"""A started `zfab` process (broker, worker, API) sets up Python's collector and C's allocator.

Library users (a `Client` in their own process) are not affected: only the `zfab` commands
call `tune()`, once the process has started.

**The cyclic garbage collector.** With the default thresholds (700, 10, 10) a full collection
runs each time the objects that survived since the last one reach a quarter of all tracked
objects. The API keeps its last 10,000 jobs (a few dozen tracked objects each) next to
~230,000 objects that importing FastAPI and pydantic left, so under load it scanned half a
million objects every few thousand jobs: bench/wrk.py measured the collector at 25 % of the
API's CPU (1.2 s of every 5 s, about 0.35 ms of its 1.4 ms per job). So:
- what is alive once the process has started is collected, then frozen (`gc.freeze()` moves
  it to a permanent generation no collection scans; CPython documents it for servers that
  fork, the saving in collection time is the same): modules, classes, the app and its routes
  are never garbage;
- the young generation is 50,000 objects instead of 700, and the ratios above it are kept: a
  full collection at most once per 10 million net allocations (some 100,000 jobs), still
  subject to CPython's quarter rule.
Cyclic garbage is still found, only later; reference counting, which frees almost
everything, is untouched.

**glibc's malloc: one policy, here.** Blocks from 128 KiB up are mmapped and unmapped one by
one, and a heap whose free top passes 128 KiB is trimmed. glibc raises both thresholds as it sees
large blocks freed, but a 10 MB job frees several blocks at once and a same-sized block is mmapped
again: in bench/large.py every 10 MB buffer (the received frame, its JSON, the result) came from
fresh pages, 12,000-15,000 page faults per job in the broker and the worker each, and the 10 MB
echo ran at 0.28x the bulk floor. With blocks up to 32 MiB (glibc's own ceiling for its moving
threshold) taken from the heap, and up to 64 MiB of free top kept (twice that, as glibc would), it
ran at 0.46x.

The other policy, a threshold fixed at 1 MiB so that every freed payload goes back to the OS at
once, was set by a second module for every `zfab` command, and silently overridden by this one in
every role; it is gone. Measured against this one (issue 40, bench/large.py's zfab phases with
`MALLOC_MMAP_THRESHOLD_=1048576` for the other, three interleaved rounds, 2 shared cores): 10 MB
echo at 1 in flight 64 / 157 / 156 MB/s here against 59 / 65 / 56 at 1 MiB, at 4 in flight
100 / 161 / 274 against 46 / 62 / 93, so 2.5x the rate; the price is memory kept at rest after
such jobs: worker 190-230 MB against 131-141, broker 88-108 against 49, a tuned client 183-193
against 68. The memory kept is bounded by the trim threshold per malloc arena, and only after
large jobs; a deployment that wants it back sooner says so in the environment: a
`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or `GLIBC_TUNABLES` there wins, and this leaves
malloc alone. Other C libraries (musl) have no mallopt and are left alone too.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Callable
from typing import cast

GC_THRESHOLDS = (50_000, 20, 10)
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune() -> dict[str, bool]:
    """Set up this process's collector and allocator; says what was changed."""
    collector()
    return {"gc": True, "malloc": allocator()}


def collector() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def allocator() -> bool:
    """glibc only, and only when the environment does not set malloc up itself."""
    if any(name in os.environ for name in _MALLOC_ENV):
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # The mmap threshold first: glibc caps it (at 32 MiB on 64-bit) and refuses more with 0.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, libc's among them (no ldconfig run)
        fn = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only: musl's mallopt does nothing
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int], int], fn)
