"""The jobs a worker keeps in memory: every unfinished one, and finished ones while they fit.

Bounded by count and by bytes (request bodies and results); a finished job that falls out is
still answered, from the job store. The owner loop adds and trims; pool threads report the
size of a result when it is made, under the table's lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .job import Job


class RecentJobs:
    def __init__(self, *, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, uuid: str) -> Job | None:
        return self._jobs.get(uuid)

    def unstarted(self) -> list[Job]:
        return [j for j in self._jobs.values() if not j.started]

    def add(self, job: Job) -> None:
        """Owner: a job admitted. Then finished jobs are forgotten, oldest first, until it fits."""
        self._jobs[job.uuid] = job
        with self._lock:
            self.bytes += len(job.request)
        self.trim()

    def result_made(self, job: Job) -> None:
        """Pool thread: the job's result payload now counts too."""
        with self._lock:
            self.bytes += len(job.result_payload)

    def trim(self) -> None:
        jobs = self._jobs
        # Unfinished jobs are bounded by the worker's admission (far below the count bound), so
        # rotating one to the back always leads to a finished one to forget.
        for _ in range(len(jobs)):
            if len(jobs) <= self.max_count and self.bytes <= self.max_bytes:
                return
            uuid, oldest = next(iter(jobs.items()))
            if oldest.state.final:
                del jobs[uuid]
                with self._lock:
                    self.bytes -= len(oldest.request) + len(oldest.result_payload)
            else:
                jobs.move_to_end(uuid)
