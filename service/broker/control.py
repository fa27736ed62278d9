"""What MMI may change at the broker (mmi.py), and nothing else: a narrow control interface.

Pause and resume a service's queue (paused.py, kept across a restart), set and clear a task's limit
(limits.py; the jobs waiting under the old rule are placed again), and count MMI's own answers.
Each change tells the hooks that publish it (hooks.py `queue_now`) at the moment it happens.
"""

from __future__ import annotations

from collections import Counter

from ..core.limits import Rule
from .dispatch import Dispatch
from .hooks import Hooks
from .jobqueue import QueuedJob, Spot
from .limits import Bucket
from .paused import PausedServices
from .registry import Registry


class BrokerControl:
    """The broker's controls, for MMI."""

    def __init__(
        self, registry: Registry, dispatch: Dispatch, paused: PausedServices, *, hooks: Hooks, counts: Counter[str]
    ) -> None:
        self.reg = registry
        self.dispatch = dispatch
        self.paused = paused
        self.queue_now = hooks.queue_now
        self.counts = counts

    def count(self, what: str) -> None:
        self.counts[what] += 1

    def pause(self, name: bytes) -> bool:
        """A service's jobs are admitted and queued, and none is sent until it resumes. True: it was
        not paused. ValueError: too many paused already."""
        changed = self.paused.pause(name)
        if changed:
            for hook in self.queue_now:  # at the moment it changes, not at the queue's next turn
                hook(name)
        return changed

    def resume(self, name: bytes) -> bool:
        """A paused queue resumes: its jobs go as credits allow, from the next pump. True: it was paused."""
        changed = self.paused.resume(name)
        if changed:
            svc = self.reg.services.get(name)
            if svc is not None:
                svc.roster_changed = True  # jobs parked for named workers (or `all`) are looked at again
                self.dispatch.dirty.add(name)
            for hook in self.queue_now:
                hook(name)
        return changed

    def set_limit(self, service: bytes, task: str, rule: Rule | None) -> None:
        """A task's limit set at run time (it replaces its declaration until cleared)."""
        self.dispatch.limits.set_rule(service, task, rule)
        self._relimit(service, task)

    def clear_limit(self, service: bytes, task: str) -> bool:
        """Back to the task's declared limit (or none). True: a limit set at run time was cleared."""
        changed = self.dispatch.limits.clear_rule(service, task)
        self._relimit(service, task)
        return changed

    def _relimit(self, service: bytes, task: str) -> None:
        """A task's limit was set or cleared: buckets with the same key take the new numbers; the
        jobs waiting in others are placed again, under the new rule or none."""
        svc = self.reg.services.get(service)
        rule = self.dispatch.limits.rule(service, task, svc.tasks if svc is not None else None)
        waiting: list[QueuedJob] = []
        stale: set[Bucket] = set()
        for b in self.dispatch.limits.of_task(service, task):
            if rule is not None and rule.key == b.rule.key:
                b.retune(rule)
                continue
            stale.add(b)
            while (job := b.pop()) is not None:
                waiting.append(job)
        now = self.dispatch.clock()
        # Delayed jobs hold their bucket too: they enter the new one when their delay ends.
        delayed = [j for j in svc.queue.waiting.values() if j.spot is Spot.DELAYED and j.limit in stale] if svc else []
        schema = (svc.tasks or {}).get(task) if svc else None
        for job in waiting + delayed:
            if job.uuid in self.dispatch.queued:
                job.limit.queued -= 1
            job.limit = None
            if rule is not None:
                job.limit = self.dispatch.limits.bucket_for(job, rule, schema, now)
                if job.uuid in self.dispatch.queued:
                    job.limit.queued += 1
            if svc is not None and job.spot is not Spot.DELAYED:
                svc.queue.place(job, now)
        if svc is not None:
            self.dispatch.dirty.add(service)
