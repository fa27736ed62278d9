"""How many jobs a worker offers to hold at once (its credits), and when a change is worth telling.

Pure: no sockets, no threads. The worker calls these with its settings and its runner's moving
average of run times; the broker never sends it more jobs than the credits it last announced.
"""

from __future__ import annotations

from ..settings import Settings

ADAPTIVE_START = 0  # prefetch before any job ran: none until run times say jobs are short
# At 64, a pipelined client's very short jobs mostly waited in the broker's queue, each sent as a
# result freed a credit: 3,587 vs 3,935 jobs/s at 256 (speed.py's window of 1,000, 3 runs each).
ADAPTIVE_MAX = 256
ADAPTIVE_BACKLOG = 0.05  # seconds of waiting work per pool thread the adaptive prefetch aims at
RECHECK_SECONDS = 0.1  # between checks of the adaptive credits while jobs arrive


def credits_for(s: Settings, run_time: float, has_async: bool) -> int:
    """Pool size + prefetch (+ async slots). An unset ZFAB_WORKER_PREFETCH adapts: short jobs get
    up to 256 waiting (they would otherwise wait on the broker's round trip), long ones none, so a
    long job never keeps short ones waiting behind it while another worker is idle."""
    prefetch = s.worker_prefetch
    if prefetch is None:
        prefetch = ADAPTIVE_START if not run_time else min(ADAPTIVE_MAX, int(s.pool_size * ADAPTIVE_BACKLOG / run_time))
    sync_credits = min(s.pool_size + prefetch, s.pool_size + s.job_queue_size)
    return max(1, sync_credits + (s.async_concurrency if has_async else 0))


def worth_telling(announced: int, new: int) -> bool:
    """A change of half or more: small wobbles of the average cost no message."""
    return new * 2 >= announced * 3 or new * 3 <= announced * 2
