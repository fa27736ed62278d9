"""Same-host shared memory at the broker: a POST whose body is a handle (docs/protocol.md).

The broker forwards handles unread. It checks a handle's claim when it admits the job, and reads
the body only for a worker that cannot take a handle (on another host, or a NorFab worker).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..core import payloads, shmhandle
from ..core import protocol as nfp
from ..core.logbudget import LogBudget
from ..core.shmhandle import HandleError
from ..transport.shm import ShmArena
from .admission import bad
from .jobqueue import QueuedJob

log = logging.getLogger(__name__)


class ShmBodies:
    """Checks and reads the bodies clients' handles name, within ZFAB_MAX_MESSAGE_BYTES."""

    def __init__(self, arena: ShmArena, *, max_bytes: int, counts: Counter[str], clock: Callable[[], float]) -> None:
        self.arena = arena
        self.max_bytes = max_bytes
        self.counts = counts
        self.log = LogBudget(burst=3, per_second=0.1, clock=clock)  # a peer sending bad handles cannot flood the log

    def check(self, job: QueuedJob) -> None:
        """A POST whose body is a handle: refused (400, counted `shm_refused`) when it is malformed or
        claims more than a message may carry, before anything is read (read() stays within this bound)."""
        try:
            shmhandle.check_claim(job.body, self.max_bytes)
        except HandleError as exc:
            self.counts["shm_refused"] += 1
            raise bad(exc.detail) from None

    def read(self, job: QueuedJob) -> nfp.Frame | str:
        """The body a client's handle names, read here (the broker is on the client's host, or the
        client would not have sent one) for a worker that cannot take a handle: copied with pread
        (transport/shm.py), so a block cut meanwhile reads short instead of faulting, and only a
        block of the broker's own user, within ZFAB_MAX_MESSAGE_BYTES. For an unreadable block, why
        (counted `shm_unreadable`)."""
        try:
            body: nfp.Frame = self.arena.read(job.body)
            attempt = shmhandle.decode_handle(job.body).attempt
            if attempt > 1:  # a retried job: its block's body says attempt 1
                body = payloads.with_attempt(bytes(body), attempt)
        except HandleError as exc:
            self.counts["shm_unreadable"] += 1
            held = self.log.take()
            if held is not None:
                log.warning(
                    "broker: the body of job %r cannot be read from shared memory: %s (%d such lines held back)",
                    job.uuid[:64],
                    exc,
                    held,
                )
            return exc.detail
        self.counts["shm_materialized"] += 1
        return body

    def figures(self) -> dict[str, Any]:
        a = self.arena
        return {
            "shm_host": a.host,
            "shm_threshold": a.threshold if a.enabled else None,
            "shm_reclaimed": a.counts["reclaimed"],
        }
