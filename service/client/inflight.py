"""The jobs a client tracks until they end: bounded in count and in bytes, each with one timer.

Any thread adds (submit) and reads; the owner loop ends jobs and runs their timers. One lock guards
the table, its byte count and the timer heap; a lookup by uuid takes none (a dict read is atomic).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterator

from ..errors import BusyError
from ..settings import Settings
from ..transport.shm import ShmArena
from .clientjob import ClientJob
from .future import JobFuture


class InFlight:
    """Jobs by uuid, bounded by ZFAB_MAX_CLIENT_JOBS and ZFAB_CLIENT_INFLIGHT_BYTES; their timers (the
    earlier of a job's deadline and its next check) in one heap."""

    def __init__(self, settings: Settings, shm: ShmArena) -> None:
        self.max_jobs = settings.max_client_jobs
        self.max_bytes = settings.client_inflight_bytes
        self.shm = shm  # a job's body block (ClientJob.shm_handle) is given back when the job ends
        self.lock = threading.Lock()
        self._jobs: dict[str, ClientJob] = {}
        self._timers: list[tuple[float, str]] = []  # (monotonic due, uuid)
        self.bytes = 0  # bytes of bodies and results held for the jobs (ClientJob.size)
        # The job tracked under a uuid, or None: the dict's own lookup, with no call of ours around it
        # (the owner makes one for every reply).
        self.get: Callable[[str], ClientJob | None] = self._jobs.get

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: ClientJob, check_at: float) -> JobFuture:
        """Track `job`, its first timer at `check_at`, and return its future; or the future of the job
        tracked under its uuid already (a resubmission), `job` let go of. BusyError past a bound."""
        with self.lock:
            have = self._jobs.get(job.uuid)
            if have is None:
                if len(self._jobs) >= self.max_jobs:
                    why = f"client tracks {self.max_jobs} jobs already; wait for some to finish"
                elif self.bytes + job.size > self.max_bytes:
                    why = (
                        f"client holds {self.bytes} bytes of jobs in flight (ZFAB_CLIENT_INFLIGHT_BYTES = "
                        f"{self.max_bytes}); wait for some to finish"
                    )
                else:
                    self.bytes += job.size
                    self._jobs[job.uuid] = job
                    heapq.heappush(self._timers, (check_at, job.uuid))
                    return job.future
        if job.shm_handle is not None:
            self.shm.free(job.shm_handle)  # never sent: nobody reads it
        if have is not None:
            return have.future
        raise BusyError(why)

    def forget(self, uuid: str) -> ClientJob | None:
        """The job ends (or was never sent): no longer tracked, its bytes and its body's block given back."""
        with self.lock:
            job = self._jobs.pop(uuid, None)
            if job is None:
                return None
            self.bytes -= job.size
        if job.shm_handle is not None:
            self.shm.free(job.shm_handle)  # the job ended: nobody reads its body any more
        return job

    def resized(self, change: int) -> None:
        """A job's size changed by `change` bytes (its results came, its body was let go of)."""
        with self.lock:
            self.bytes += change

    def arm(self, uuid: str, due: float) -> None:
        """The job's next timer (each job has one: a due timer is popped before its check re-arms it)."""
        with self.lock:
            heapq.heappush(self._timers, (due, uuid))

    def due(self, now: float) -> Iterator[ClientJob]:
        """The tracked jobs whose timer is due at `now`, each popped (a job that ended is skipped)."""
        timers = self._timers
        while True:
            with self.lock:
                if not timers or timers[0][0] > now:
                    return
                _, uuid = heapq.heappop(timers)
                job = self._jobs.get(uuid)
            if job is not None:
                yield job

    def next_due(self) -> float | None:
        with self.lock:
            return self._timers[0][0] if self._timers else None

    def recheck_all(self) -> None:
        """The broker came back (restarted, or reachable again): every job is re-established at once,
        not at its next check."""
        with self.lock:
            for job in self._jobs.values():
                job.recheck = True
                heapq.heappush(self._timers, (0.0, job.uuid))

    def drain(self) -> list[ClientJob]:
        """Every job, no longer tracked (the client closes)."""
        with self.lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
            self._timers.clear()
            self.bytes = 0
        return jobs
