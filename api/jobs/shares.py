"""Each caller's share of the jobs the API holds in flight, so that one caller cannot take them all.

The API's client holds at most ZFAB_MAX_CLIENT_JOBS jobs and ZFAB_CLIENT_INFLIGHT_BYTES bytes of them
at once; past that every caller's POST is a 503. One caller's long-delayed large jobs could fill both
and refuse everyone else's, so a caller (a token; every anonymous loopback caller is one) may hold at
most ZFAB_API_CALLER_SHARE of each: its next job is a 429 naming the bound, and the others still get
in. A job counts from its submission until it ends, weighing its request's bytes (what the API holds
for it). Jobs no caller submitted (schedules firing, recovery after a restart) count for no caller.
"""

from __future__ import annotations

import threading

from ..errors import ProblemError

BOUNDS = ("jobs", "bytes")
RETRY_AFTER = "1"


class CallerShares:
    """Jobs in flight per caller (a principal: a token's digest, '' for anonymous), bounded per caller."""

    def __init__(self, max_jobs: int, max_bytes: int, share: float) -> None:
        self.share = share
        self.max_jobs = max(1, int(max_jobs * share))
        self.max_bytes = max(1, int(max_bytes * share))
        self._whole = (max_jobs, max_bytes)
        self._held: dict[str, list[int]] = {}  # principal -> [jobs, bytes]: one entry per caller in flight
        self._lock = threading.Lock()  # a job ends on its client's owner thread
        self.refused = dict.fromkeys(BOUNDS, 0)

    def __len__(self) -> int:
        return len(self._held)

    def held(self, caller: str) -> tuple[int, int]:
        with self._lock:
            jobs, size = self._held.get(caller, (0, 0))
            return jobs, size

    def check(self, caller: str, size: int) -> None:
        """Raise the 429 that refuses a job of `size` bytes when `caller` holds its share already."""
        jobs, held = self.held(caller)
        if jobs + 1 > self.max_jobs:
            self._refuse(
                "jobs",
                f"this caller has {jobs} jobs in flight, its share of the API's ({self.max_jobs}: "
                f"ZFAB_API_CALLER_SHARE {self.share:g} of ZFAB_MAX_CLIENT_JOBS {self._whole[0]})",
            )
        if held + size > self.max_bytes and jobs > 0:  # one job alone is bounded by the request size limit
            self._refuse(
                "bytes",
                f"this caller's jobs in flight hold {held} bytes and this one {size}, past its share of the "
                f"API's ({self.max_bytes}: ZFAB_API_CALLER_SHARE {self.share:g} of ZFAB_CLIENT_INFLIGHT_BYTES "
                f"{self._whole[1]})",
            )

    def hold(self, caller: str, size: int) -> None:
        """A job of `caller` is in flight now; give it back with `release` when it ends."""
        with self._lock:
            entry = self._held.get(caller)
            if entry is None:
                entry = self._held[caller] = [0, 0]
            entry[0] += 1
            entry[1] += size

    def release(self, caller: str, size: int) -> None:
        with self._lock:
            entry = self._held.get(caller)
            if entry is None:
                return
            entry[0] -= 1
            entry[1] -= size
            if entry[0] <= 0:
                del self._held[caller]  # bounded: only callers with jobs in flight have an entry

    def _refuse(self, bound: str, why: str) -> None:
        with self._lock:
            self.refused[bound] += 1
        raise ProblemError(
            429,
            "caller-share",
            "Caller's share in use",
            f"{why}; wait for some of them to finish, other callers are still served",
            {"Retry-After": RETRY_AFTER},
            bound=bound,
        )
