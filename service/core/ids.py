"""Job uuids: UUIDv7 (RFC 9562), time-ordered and unguessable, at one system call per 256.

Time-ordered because every worker records each job it receives in SQLite, keyed by its uuid:
with random uuids (v4) each insert landed on another page of that index, so a commit of 50 jobs
dirtied about 50 pages and wrote them all to the WAL. Ordered by time, a batch's jobs share the
index's last page or two: 16 us of the store's CPU a row became 6 us (a 100,000-job table,
batches of 50). Unguessable because a job uuid is never derived from anything but the clock and
74 random bits from the OS's CSPRNG.

os.urandom gives up the GIL around its getrandom call, and a thread that gives it up waits to get
it back until the busy owner thread of its process lets go, up to the switch interval (5 ms).
Asked per job, that wait was an eighth of a pipelined client's samples; the random bytes are the
same, taken in bulk.
"""

from __future__ import annotations

import os
import threading
import time

_BATCH = 256
_RANDOM = 10  # bytes per uuid: 80 bits, of which 74 are kept (6 are version and variant)
_lock = threading.Lock()
_buf = b""
_pos = 0
_MS_MASK = (1 << 48) - 1
_B_MASK = (1 << 62) - 1
_VERSION = 0x7 << 76
_VARIANT = 0b10 << 62


def uuid7(ms: int, rand: int) -> str:
    """The 32 hex digits of a UUIDv7: 48 bits of Unix time in ms, the version, 12 bits of
    `rand`, the variant, 62 more bits of `rand` (which must have at least 74)."""
    value = (ms & _MS_MASK) << 80 | _VERSION | ((rand >> 62) & 0xFFF) << 64 | _VARIANT | (rand & _B_MASK)
    return f"{value:032x}"


def new_uuid() -> str:
    """A UUIDv7 in 32 hex digits, its random bits from the OS's CSPRNG; thread-safe."""
    global _buf, _pos
    with _lock:
        if _pos >= len(_buf):
            _buf, _pos = os.urandom(_RANDOM * _BATCH), 0
        start = _pos
        _pos += _RANDOM
        rand = _buf[start : start + _RANDOM]
    return uuid7(time.time_ns() // 1_000_000, int.from_bytes(rand, "big"))


def _reset_after_fork() -> None:
    # A forked child must not hand out the uuids its parent still holds.
    global _buf, _pos, _lock
    _lock = threading.Lock()
    _buf, _pos = b"", 0


os.register_at_fork(after_in_child=_reset_after_fork)
