"""Rate and concurrency limits per task, enforced by the broker across all of a service's workers.

Pure state on the dispatcher's clock. A task's rule (core/limits.py) comes from its workers'
declaration (READY's schema, `x-zfab`) or is set at run time (MMI `set_limit`, which replaces the
declaration until `clear_limit`; kept across a restart or a failover by kept.py: in
`$ZFAB_DATA_DIR/broker/limits.json`, or in PostgreSQL when brokers share a PostgreSQL lease).

A job of a limited task (target `any`) belongs to a **bucket**: one per task, or per task and value
of the rule's `key` argument (found in the job's body by a bounded scan that builds nothing but that
value: key_value). The bucket counts the jobs dispatched and not yet ended (concurrency) and when the next may
start (rate: evenly spaced, no burst). A job its bucket does not let go waits there (Spot.HELD),
still in its service's queue for depth, bytes, expiry and cancel; the dispatcher takes the best job
of the ready heap and of the open buckets (priority, then arrival), so a limited task never holds
back the service's other tasks.

Limits never loosen. A bucket lives while a job may need it: while jobs of it run or wait in the
queue (held, or delayed: `queued` counts them from admission, so a delay spanning the broker's
housekeeping finds its bucket) and while its rate has not let the next job start. Buckets are
bounded (MAX_BUCKETS): a full table forgets only buckets that hold nothing back, and past that new
key values share one overflow bucket per task, which only makes the limit stricter (the dispatcher
counts each such job: `limit_overflow`).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
from collections.abc import Iterator
from typing import Any

import msgspec

from ..core import protocol as nfp
from ..core.limits import Rule, read_rule
from .jobqueue import QueuedJob, Spot
from .kept import FileKept, Kept

log = logging.getLogger(__name__)

MAX_BUCKETS = 10_000
MAX_RULES = 10_000  # tasks with a limit set at run time
MAX_KEY_BYTES = 200  # a key value longer than this (as JSON) is known by its hash
MAX_KEY_PARSE = 64 * 1024  # a key value's raw JSON over this is hashed as it is, not parsed
MAX_KEY_SCAN = 4 << 20  # bytes of a body scanned for its key on the loop (about 6 ms at worst); past it, UNREAD
UNREAD = "\x00unread"  # the key of a body too large to scan: such jobs of a task share one bucket (stricter)
MAX_DECODERS = 1000  # key scanners kept (one per argument name and position)
OVERFLOW = "\x00overflow"  # the key of the bucket new values share once the table is full
DECLARATION_KEY = "x-zfab"
KIND = "limits"


class Bucket:
    """One task's (and key value's) share of its rule: jobs running, when the next may start, and
    the jobs waiting for it in priority then arrival order (lazily pruned, like the queue's heaps)."""

    __slots__ = ("armed", "held", "key", "next_at", "queued", "rule", "running", "service", "task")

    def __init__(self, service: bytes, task: str, key: str | None, rule: Rule) -> None:
        self.service = service
        self.task = task
        self.key = key
        self.rule = rule
        self.running = 0
        self.queued = 0  # its jobs in the service's queue (held here, or delayed): the dispatcher counts them
        self.next_at = 0.0  # monotonic: the next start the rate allows
        self.armed = -1.0  # the next_at a timer was set for (one timer per opening)
        self.held: list[tuple[int, int, QueuedJob]] = []

    def hold(self, job: QueuedJob) -> None:
        job.spot = Spot.HELD
        heapq.heappush(self.held, (-job.priority, job.seq, job))

    def top(self) -> QueuedJob | None:
        held = self.held
        while held:
            job = held[0][2]
            if job.spot is Spot.HELD and job.limit is self:
                return job
            heapq.heappop(held)
        return None

    def pop(self) -> QueuedJob | None:
        job = self.top()
        if job is not None:
            heapq.heappop(self.held)
        return job

    def open(self, now: float) -> bool:
        """May one more job start now?"""
        rule = self.rule
        if rule.concurrency is not None and self.running >= rule.concurrency:
            return False
        return rule.rate is None or self.next_at <= now

    def started(self, now: float) -> None:
        self.running += 1
        interval = self.rule.interval
        if interval:
            # Evenly spaced; a start a little late keeps the schedule, one late by a whole interval
            # or more starts it again from now (no burst to catch up).
            base = self.next_at if self.next_at > now - interval else now
            self.next_at = base + interval

    def retune(self, rule: Rule) -> None:
        """Take `rule`'s numbers. The next start its rate allows counts from the last start at the new
        interval: a rate relaxed from 1/h to 5/s must not hold its jobs for the rest of the old hour."""
        old = self.rule.interval
        if rule is not self.rule and old and self.next_at:
            self.next_at = self.next_at - old + rule.interval
        self.rule = rule

    def idle(self, now: float) -> bool:
        """Nothing needs this bucket: no job of it runs or waits (delayed ones included), and its
        rate would let the next one start now. Only then may it be forgotten: a bucket made again
        later starts with the same freedom."""
        return self.running <= 0 and self.queued <= 0 and not self.held and self.next_at <= now


class Limiter:
    """Every bucket, and the rules set at run time (`overrides`), bounded."""

    def __init__(self, kept: Kept | None = None) -> None:
        self.kept = kept or FileKept(None)
        self.overrides: dict[tuple[bytes, str], Rule | None] = {}  # None: set to no limit
        self.buckets: dict[tuple[bytes, str, str | None], Bucket] = {}
        self.max_buckets = MAX_BUCKETS
        self.by_service: dict[bytes, dict[tuple[bytes, str, str | None], Bucket]] = {}
        self.timers: list[tuple[float, int, Bucket]] = []  # when a rate-closed bucket with jobs opens
        self._declared: dict[tuple[bytes, str], tuple[int, Rule | None]] = {}  # by id of the declaration
        self._seq = 0

    @property
    def write_errors(self) -> int:
        return self.kept.write_errors[KIND]

    # ---- rules --------------------------------------------------------------------------------

    def rule(self, service: bytes, task: str, tasks: dict[str, Any] | None) -> Rule | None:
        """The task's rule: set at run time, else declared by its workers (cached per declaration)."""
        key = (service, task)
        if key in self.overrides:
            return self.overrides[key]
        schema = tasks.get(task) if tasks else None
        decl = schema.get(DECLARATION_KEY) if isinstance(schema, dict) else None
        if decl is None:
            return None
        cached = self._declared.get(key)
        if cached is not None and cached[0] == id(decl):
            return cached[1]
        try:
            rule = read_rule(decl)
        except ValueError as exc:
            log.warning("broker: task %s of %r declares a bad limit (%s); not limited", task, service, exc)
            rule = None
        if len(self._declared) >= MAX_RULES:
            self._declared.clear()  # a cache: it fills again from the declarations
        self._declared[key] = (id(decl), rule)
        return rule

    def set_rule(self, service: bytes, task: str, rule: Rule | None) -> None:
        """Set a task's rule at run time (None: no limit, whatever it declares). ValueError when full."""
        if (service, task) not in self.overrides and len(self.overrides) >= MAX_RULES:
            raise ValueError(f"{MAX_RULES} tasks have limits set already; clear some first")
        self.overrides[(service, task)] = rule
        self._save()

    def clear_rule(self, service: bytes, task: str) -> bool:
        """Back to the declaration; False when nothing was set."""
        if self.overrides.pop((service, task), 0) == 0:
            return False
        self._save()
        return True

    # ---- buckets ------------------------------------------------------------------------------

    def bucket_for(self, job: QueuedJob, rule: Rule, schema: Any, now: float) -> Bucket:
        """The bucket a job of a limited task belongs to (made when new). A full table forgets the
        buckets nothing needs (idle); past that the job shares its task's overflow bucket (stricter)."""
        value = key_value(job.body, rule.key, schema) if rule.key else None
        ident = (job.service, job.task, value)
        b = self.buckets.get(ident)
        if b is None:
            if len(self.buckets) >= self.max_buckets:
                self.sweep(now)
            if len(self.buckets) >= self.max_buckets:
                ident = (job.service, job.task, OVERFLOW)
                b = self.buckets.get(ident)
            if b is None:
                # (The overflow bucket itself may take the table one past its bound: one per task.)
                b = self.buckets[ident] = Bucket(job.service, job.task, ident[2], rule)
                self.by_service.setdefault(job.service, {})[ident] = b
        b.retune(rule)
        return b

    def of_service(self, service: bytes) -> Iterator[Bucket]:
        return iter(list(self.by_service.get(service, {}).values()))

    def of_task(self, service: bytes, task: str) -> Iterator[Bucket]:
        return (b for b in self.of_service(service) if b.task == task)

    def finished(self, b: Bucket) -> None:
        """A job of the bucket ended (its route went): a slot is free."""
        b.running = max(0, b.running - 1)

    def arm(self, b: Bucket, now: float) -> None:
        """A bucket with jobs waiting that the rate closes: look again when it opens."""
        if b.rule.rate is not None and b.next_at > now and b.armed != b.next_at:
            b.armed = b.next_at
            self._seq += 1
            heapq.heappush(self.timers, (b.next_at, self._seq, b))

    def next_deadline(self) -> float | None:
        timers = self.timers
        while timers and (timers[0][2].top() is None or timers[0][0] < timers[0][2].next_at):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def due(self, now: float) -> set[bytes]:
        """Services with a bucket the rate opened by now."""
        out: set[bytes] = set()
        while self.timers and self.timers[0][0] <= now:
            b = heapq.heappop(self.timers)[2]
            if b.top() is not None:
                out.add(b.service)
        return out

    def sweep(self, now: float) -> None:
        """Forget buckets nothing needs (Bucket.idle): none with a job running, held or delayed,
        nor one whose rate still holds the next start back."""
        for ident, b in list(self.buckets.items()):
            if b.idle(now):
                del self.buckets[ident]
                mine = self.by_service.get(ident[0])
                if mine is not None:
                    mine.pop(ident, None)
                    if not mine:
                        del self.by_service[ident[0]]

    def facts(self) -> dict[tuple[bytes, str], dict[str, Any]]:
        """Per limited task: its rule, where it comes from, jobs running and waiting, buckets."""
        out: dict[tuple[bytes, str], dict[str, Any]] = {}
        for b in self.buckets.values():
            row = out.setdefault((b.service, b.task), {**b.rule.as_dict(), "running": 0, "held": 0, "buckets": 0})
            row["running"] += b.running
            row["held"] += sum(1 for _, _, j in b.held if j.spot is Spot.HELD and j.limit is b)
            row["buckets"] += 1
        for (service, task), rule in self.overrides.items():
            row = out.setdefault((service, task), {"running": 0, "held": 0, "buckets": 0})
            row.update(rule.as_dict() if rule is not None else {"rate_limit": None, "concurrency": None})
        for (service, task), row in out.items():
            row["source"] = "set" if (service, task) in self.overrides else "declared"
        return out

    # ---- persistence (rules set at run time) ----------------------------------------------------

    def load(self) -> None:
        try:
            doc = self.kept.read(KIND)
        except (OSError, ValueError) as exc:
            log.warning(
                "broker: cannot read the limits in %s (%s); only declared limits apply", self.kept.where(KIND), exc
            )
            return
        self.take(doc)

    def take(self, doc: Any) -> None:
        """The limits set at run time are exactly `doc`'s (a JSON list of rows; a bad one sets none).
        Owner only; a bucket takes its task's new rule when its next job comes."""
        self.overrides.clear()
        try:
            if doc is not None and not isinstance(doc, list):
                raise ValueError("not a JSON list")
            for row in (doc or [])[:MAX_RULES]:
                service, task = row["service"].encode(), str(row["task"])
                self.overrides[(service, task)] = read_rule(row)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "broker: cannot read the limits in %s (%s); only declared limits apply", self.kept.where(KIND), exc
            )
            self.overrides.clear()

    def _save(self) -> None:
        rows = [
            {"service": s.decode(errors="replace"), "task": t, **(r.as_dict() if r is not None else {})}
            for (s, t), r in self.overrides.items()
        ]
        self.kept.write(KIND, rows)


_scanners: dict[tuple[str, int], msgspec.json.Decoder[Any]] = {}


def _scanner(name: str, index: int) -> msgspec.json.Decoder[Any]:
    """A decoder that reads a POST body's `kwargs[name]` and `args[index]` as raw JSON and skips
    everything else unbuilt: a 20 MiB body costs a pass over its bytes (1-2 ms a MiB) and no memory."""
    dec = _scanners.get((name, index))
    if dec is None:
        raw = msgspec.Raw | msgspec.UnsetType
        kwargs = msgspec.defstruct("LimitKwargs", [("value", raw, msgspec.UNSET)], rename={"value": name})
        fields: list[tuple[str, Any, Any]] = [("kwargs", kwargs | None, None)]
        if index >= 0:  # the arguments before it are skipped (each a raw slice), those after it not looked at
            positions = [(f"a{i}", raw, msgspec.UNSET) for i in range(index + 1)]
            fields.append(("args", msgspec.defstruct("LimitArgs", positions, array_like=True) | None, None))
        if len(_scanners) >= MAX_DECODERS:
            _scanners.clear()
        dec = _scanners[(name, index)] = msgspec.json.Decoder(msgspec.defstruct("LimitBody", fields))
    return dec


def key_value(body: nfp.Frame, name: str | None, schema: Any) -> str | None:
    """The value of the job's `name` argument, as a bounded string (None: the job does not give it,
    or its body is not JSON: a handle to shared memory is not read here). A positional argument is
    found by the order of the task's schema's properties. Nothing but that value is decoded, and a
    body over MAX_KEY_SCAN is not scanned at all (UNREAD: it shares one bucket with its task's other
    such jobs, which only makes its limit stricter), so no job holds the broker's loop for long."""
    if name is None:
        return None
    if len(body) > MAX_KEY_SCAN:
        return UNREAD
    props = schema.get("properties") if isinstance(schema, dict) else None
    names = list(props) if isinstance(props, dict) else []
    index = names.index(name) if name in names else -1
    try:
        req = _scanner(name, index).decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    raw = req.kwargs.value if req.kwargs is not None else msgspec.UNSET
    if raw is msgspec.UNSET and index >= 0 and req.args is not None:
        raw = getattr(req.args, f"a{index}")
    if raw is msgspec.UNSET:
        return None
    blob = bytes(raw)
    if len(blob) > MAX_KEY_PARSE:
        return "sha256:" + hashlib.sha256(blob).hexdigest()
    text = json.dumps(json.loads(blob), sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= MAX_KEY_BYTES else "sha256:" + hashlib.sha256(text.encode()).hexdigest()
