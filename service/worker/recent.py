"""The jobs a worker keeps in memory: every unfinished one, and finished ones while they fit.

Bounded by count and by bytes (request bodies and results); a finished job that falls out is
still answered, from the job store. The owner loop adds and trims; pool threads report the
size of a result when it is made (core/lru.py's byte count takes their updates).
"""

from __future__ import annotations

from ..core.lru import BoundedLRU
from .job import Job


def _held(job: Job) -> int:
    return len(job.request) + len(job.result_payload)


def _finished(job: Job) -> bool:
    return job.state.final


class RecentJobs:
    def __init__(self, *, max_count: int, max_bytes: int) -> None:
        self._jobs: BoundedLRU[str, Job] = BoundedLRU(max_count=max_count, max_bytes=max_bytes, size=_held)

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def bytes(self) -> int:
        return self._jobs.bytes

    @property
    def max_bytes(self) -> int:
        return self._jobs.max_bytes or 0

    @property
    def max_count(self) -> int:
        return self._jobs.max_count

    def get(self, uuid: str) -> Job | None:
        return self._jobs.get(uuid)

    def uuids(self, most: int) -> list[str]:
        """The newest `most` jobs' uuids, unfinished ones first (READY's `holds`, docs/failover.md)."""
        jobs = list(self._jobs.values())
        return [j.uuid for j in jobs if not j.state.final][-most:] + [j.uuid for j in jobs if j.state.final][-most:]

    def unstarted(self) -> list[Job]:
        return [j for j in self._jobs.values() if not j.started]

    def add(self, job: Job) -> None:
        """Owner: a job admitted. Then finished jobs are forgotten, oldest first, until it fits."""
        jobs = self._jobs
        jobs.put(job.uuid, job)
        jobs.shed(_finished)

    def result_made(self, job: Job) -> None:
        """Pool thread: the job's result payload now counts too (before its state turns final)."""
        self._jobs.grew(len(job.result_payload))

    def trim(self) -> None:
        # Unfinished jobs stay: they are bounded by the worker's admission, far below the count bound.
        self._jobs.shed(_finished)
