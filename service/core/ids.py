"""Job uuids: unguessable (from os.urandom) at one system call per 256 of them.

os.urandom gives up the GIL around its getrandom call, and a thread that gives it up waits to get
it back until the busy owner thread of its process lets go, up to the switch interval (5 ms).
Asked per job, that wait was an eighth of a pipelined client's samples; the random bytes are the
same, taken in bulk.
"""

from __future__ import annotations

import os
import threading

_BATCH = 256
_lock = threading.Lock()
_buf = b""
_pos = 0


def new_uuid() -> str:
    """32 hex digits, 128 bits from the OS's CSPRNG; thread-safe."""
    global _buf, _pos
    with _lock:
        if _pos >= len(_buf):
            _buf, _pos = os.urandom(16 * _BATCH), 0
        start = _pos
        _pos += 16
        return _buf[start : start + 16].hex()


def _reset_after_fork() -> None:
    # A forked child must not hand out the uuids its parent still holds.
    global _buf, _pos, _lock
    _lock = threading.Lock()
    _buf, _pos = b"", 0


os.register_at_fork(after_in_child=_reset_after_fork)
