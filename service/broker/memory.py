"""Giving the OS back what a burst of messages used (issue 31; docs/broker-memory.md).

What a burst leaves is mostly not the broker's tables. 100,000 READY frames from one peer, each
for a new 200-byte service, left the broker 10-19 MB larger. tracemalloc counted 1.8 MB more live
Python memory: the 1,000 service records `ZFAB_MAX_SERVICES` allows. The rest was free memory
inside glibc's malloc arenas. libzmq's receive pipe had held the backlog there while the burst
lasted: up to RCVHWM messages per peer, about 1.3 KB each for such a frame, allocated by libzmq's
I/O thread. `core/tuning.py` lets glibc keep up to 64 MiB of free memory per arena (so that 10 MB
jobs find their pages mapped), so those pages stayed resident.

Two bounds now apply. broker.py lets a peer have 1,000 messages waiting instead of 10,000, so
that backlog is a tenth as large. This keeper gives free memory back with `malloc_trim(0)` after
a burst that grew RSS by STEP or more. It does so on the owner thread, once traffic has gone
quiet. A sustained load keeps its warm heap: the trim waits for the load to stop (at most
MAX_DEFER). It takes about a millisecond, plus page faults for the pages given back.
`malloc_trim` returns the free pages inside every arena but shrinks only the main arena's top, so
the free top of a thread's arena (libzmq's I/O thread's, say) stays resident up to tuning.py's
64 MiB. Only glibc has malloc_trim; elsewhere the keeper does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from typing import Any, cast

log = logging.getLogger(__name__)

STEP = 8 * 1024 * 1024  # RSS grown past its lowest since the last trim that makes a trim worth it
LOOK_EVERY = 1.0  # seconds between looks at RSS while messages come in
QUIET = 2_000  # messages since the previous look that still count as quiet
MAX_DEFER = 10.0  # seconds a due trim waits for quiet before it runs anyway

Trim = Callable[[], int]  # glibc's malloc_trim(0): 1 if memory went back to the OS


def glibc_trim() -> Trim | None:
    """`malloc_trim(0)` of glibc, or None (musl and others have none)."""
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, libc's among them
        fn = libc.malloc_trim
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim = cast(Callable[[int], int], fn)
    return lambda: trim(0)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's RSS (Linux's /proc/self/statm), or None where there is no such file."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryKeeper:
    """Decides when the broker's owner loop gives freed memory back (`tend` on every timer pass).

    It looks at the process's RSS at most once a LOOK_EVERY, on a timer pass the loop makes anyway
    after messages came in. A trim is due when RSS has grown STEP past its lowest level since the
    last trim. It runs at the first look that finds fewer than QUIET new messages, or MAX_DEFER
    after it fell due. A trim that ran under traffic owes one more at the first quiet look (what
    was in use then is freed later). `tend` costs a few comparisons between looks. It returns a
    deadline only while a trim is due or owed, a burst (QUIET messages) came in since the last
    look, or RSS is growing with the traffic (a quarter STEP): an idle fabric is not woken for it."""

    def __init__(self, *, trim: Trim | None, rss: Callable[[], int | None] = resident_bytes) -> None:
        self._trim = trim
        self._rss = rss
        self.base: int | None = None  # lowest RSS seen since the last trim
        self.owed = False  # the last trim ran under traffic: one more is due once it quiets
        self.due_since: float | None = None
        self.watch = False  # RSS grew a quarter STEP with traffic at the last look: look again
        self.next_look = 0.0
        self.seen = 0  # messages received at the last look
        self.trims = 0
        self.released = 0  # bytes of RSS the trims gave back, in all
        self.last: dict[str, Any] | None = None

    @property
    def enabled(self) -> bool:
        return self._trim is not None

    @property
    def due(self) -> bool:
        return self.due_since is not None or self.owed

    def tend(self, now: float, received: int) -> float | None:
        if self._trim is None:
            return None
        if now < self.next_look:
            # A burst (QUIET messages since the last look) gets its look even if it ends before the
            # loop would wake again; an idle fabric's keepalives do not.
            busy = received - self.seen >= QUIET
            return self.next_look if busy or self.watch or self.due else None
        new, self.seen = received - self.seen, received
        self.next_look = now + LOOK_EVERY
        quiet = new < QUIET
        if self.owed and quiet:
            self.trim(now)
            return None
        if self.due_since is None:
            self.watch = False
            if new == 0 and self.base is not None:
                return self.next_look if self.owed else None  # nothing came in: nothing grew
            rss = self._rss()
            if rss is None:
                return None
            self.base = rss if self.base is None else min(self.base, rss)
            if rss - self.base < STEP:
                # Growing with the traffic: the next look is worth a wake-up of its own (a burst may
                # end before the loop wakes again). Steady RSS, as an idle fabric's keepalives
                # leave it, costs no wake-up at all.
                self.watch = new > 0 and rss - self.base >= STEP // 4
                return self.next_look if self.watch or self.owed else None
            self.due_since = now
        if quiet or now - self.due_since >= MAX_DEFER:
            self.trim(now, quiet=quiet)
            return None
        return self.next_look

    def trim(self, now: float, *, quiet: bool = True) -> None:
        """Give free memory back now (what `tend` does when one is due); counted, with what it released."""
        self.due_since, self.owed = None, not quiet
        if self._trim is None:
            return
        before = self._rss()
        t0 = time.perf_counter()
        self._trim()
        took = time.perf_counter() - t0
        after = self._rss()
        self.base = after
        released = max(0, before - after) if before is not None and after is not None else 0
        self.trims += 1
        self.released += released
        self.last = {"at": now, "released_bytes": released, "took_ms": round(took * 1000, 3), "quiet": quiet}
        log.debug("gave %d bytes back to the OS in %.2f ms (trim %d)", released, took * 1000, self.trims)

    def facts(self, now: float) -> dict[str, Any]:
        """For show_broker."""
        last = self.last
        return {
            "rss_bytes": self._rss(),
            "memory_trims": self.trims,
            "memory_released_bytes": self.released,
            "memory_trim_due": self.due,
            "memory_looked_at_frames": self.seen,  # frames received when it last looked
            "memory_last_trim": None
            if last is None
            else {
                "age_s": round(now - last["at"], 3),
                "released_bytes": last["released_bytes"],
                "took_ms": last["took_ms"],
                "quiet": last["quiet"],
            },
            "memory_trim_step_bytes": STEP if self.enabled else None,
        }
