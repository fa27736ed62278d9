"""The broker's event publisher (issue 30, part 1): every job state change under a topic.

Topics (docs/protocol.md, "Event subscriptions"): `job.<service>.<task>.<state>` (state: core/states.py's
words, or `retrying`), `worker.<service>.<worker>.ready|lost`, `event.<service>.<worker>` (a job's progress
events), `queue.<service>` (queueevents.py) and `trace.<service>.<task>`; names as topic parts (eventbody.py).

The publisher is a hook (hooks.py): the broker calls it at its hook points, never through a guard.
Single owner: the XPUB socket is created, polled, sent on and closed by this publisher's own
thread. The loop hands an event over with `_offer()`: a tuple appended to a bounded deque, no lock
and no wait; a full deque drops the event and counts it (zfab_broker_events_dropped_total).

The outcome of a worker's 200 travels as data: a zfab worker says it in its trace frame
(core/hoptrace.py), and the loop hands the state over as it is. A worker that does not say it (a
NorFab worker) has its result decoded once, on the publisher's thread (QUEUE_BYTES of them in the
hand-off at most). Past that bound a result of at most SMALL_RESULT bytes is decoded on the loop
(once: only while the thread is that far behind), and a larger one is dropped and counted as a
full hand-off drops any event. Nothing reads a result's bytes for a pattern.

Subscriptions are bounded (eventsocket.py, subscriptions.py): a prefix of at most MAX_PREFIX bytes,
at most `max_subscriptions` at once and `max_per_peer` (a tenth of those by default) per peer (a key
under CURVE, a connection without), given back when a peer leaves; under CURVE each key's grant bounds its
prefixes (core/access.py). Each subscriber's pipe holds at most `hwm` messages; past it libzmq drops that
subscriber's messages (`tseq` gaps). While nobody is subscribed the loop's cost per event is one attribute read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from ..core import protocol as nfp
from ..core.access import GrantBox, may_subscribe
from ..core.logbudget import LogBudget
from ..core.states import State
from ..transport.waker import Waker
from .eventbody import RETRYING, event_body, job_body, queue_body, result_state, topic_part, trace_body, worker_body
from .eventsocket import answer_zap, open_xpub
from .hooks import Hook
from .jobqueue import ANY
from .subscriptions import SubscriptionSlots

if TYPE_CHECKING:
    from .jobqueue import QueuedJob
    from .registry import ServiceRecord, WorkerRecord

log = logging.getLogger(__name__)

PEER_SHARE = 10  # one peer holds at most 1/PEER_SHARE of the subscription slots (unless told otherwise)
MAX_NAMES = 100_000  # jobs whose (service, task) the publisher remembers between their events
MAX_TOPICS = 10_000  # per-topic sequence counters kept
BATCH = 512  # events sent per turn before the thread looks at subscriptions again
GATHER = 0.005  # seconds a woken publisher waits for more events before it sends (the most it delays one)
SMALL_RESULT = 64 * 1024  # a result the loop decodes itself while the hand-off is full (larger: dropped)
QUEUE_BYTES = 8 * 1024 * 1024  # bytes of results (and job events) the hand-off queue holds at most
EVENT_PAYLOAD_MAX = 16 * 1024  # bytes of a job event handed over to be parsed; a larger one goes without fields

_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)

# Broker-side statuses and what state they put a job in (core/states.py's words).
_BY_STATUS: dict[bytes, str] = {
    nfp.ST_WORKER_ACCEPTED: State.RUNNING,
    nfp.ST_WAITING_INPUT: State.WAITING,
    nfp.ST_EXPIRED: State.EXPIRED,
    nfp.ST_CANCELLED: State.CANCELLED,
    nfp.ST_WORKER_LOST: State.LOST,
    nfp.ST_ERROR: State.FAILED,
    nfp.ST_BAD_REQUEST: State.FAILED,
    nfp.ST_NOT_FOUND: State.FAILED,
}
# A job's end, and an attempt's end that is not the job's (its route ends all the same).
ENDS = frozenset({*(s.value for s in State if s.final), RETRYING})
_TRACE = b"trace."

Entry = tuple[Any, str, bool]  # service part (or raw name), task part, one worker (its first end is the job's)


def _may_match(prefix: bytes, kind: bytes) -> bool:
    """A subscription to `prefix` could receive topics that start with `kind` (`""`, `t`, `trace.demo.`)."""
    return kind.startswith(prefix) or prefix.startswith(kind)


class EventPublisher(Hook):
    """Publishes job state changes on its own XPUB socket, owned by its own thread."""

    def __init__(
        self,
        endpoint: str,
        *,
        hwm: int = 10_000,
        queue_size: int = 10_000,
        max_subscriptions: int = 1000,
        max_per_peer: int | None = None,
        curve_secret: str | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        grants: GrantBox | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.hwm = hwm
        self.queue_size = queue_size
        self.max_subscriptions = max_subscriptions
        per_peer = max_per_peer if max_per_peer is not None else max(1, max_subscriptions // PEER_SHARE)
        self.slots = SubscriptionSlots(total=max_subscriptions, per_peer=per_peer)  # thread only
        self.curve_secret = curve_secret
        self.bound_endpoint = ""
        self.active = False  # someone is subscribed (written by the thread, read by the loop)
        self.tracing = False  # a subscription could match a trace.* topic (written by the thread)
        self._final: tuple[bytes, tuple[str, str, bool]] | None = None  # broker loop: the job that just ended
        # Counters (each written by one thread only; read for metrics).
        self.offered = 0  # broker loop: events offered while someone was subscribed (the `seq`)
        self.dropped = 0  # broker loop: offered to a full queue
        self.published = 0  # thread: sent to the socket
        self.refused: Counter[str] = Counter()  # thread: subscriptions refused, by reason
        self.grants = grants if grants is not None else GrantBox()  # under CURVE each key's (identities.py)
        self._peers_seen = 0  # thread: connections named by this thread's ZAP answers (without CURVE)
        self._queue: deque[tuple[Any, ...]] = deque()
        self._names: dict[bytes, tuple[str, str, bool]] = {}  # broker loop only: uuid -> service, task, single
        self._parts: dict[tuple[bytes, str | None], tuple[str, str]] = {}  # broker loop only: names as topic parts
        self._bytes_in = 0  # broker loop: result and event bytes handed over (to be read on the thread)
        self._bytes_out = 0  # thread: of those, taken
        self._tseq: dict[str, int] = {}  # thread only
        self._thread_parts: dict[bytes, str] = {}  # thread only: raw names as topic parts
        self._queue_last: dict[bytes, tuple[int, int, int, bool]] = {}  # broker loop only: last published
        # Under CURVE the broker's context, where its ZAP handler names each key; without, a context of
        # this publisher's own, whose ZAP requests its thread answers (a fresh peer id per connection).
        self._ctx = context if context is not None else zmq.Context.instance()
        self._own_ctx: zmq.Context[zmq.Socket[bytes]] | None = None  # made by the thread (_open)
        self._waker = Waker()
        self._sleeping = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._log = LogBudget(burst=3, per_second=0.1)  # thread only: lines about failed turns

    # ---- any thread ---------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name="zfab-broker-events", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("the broker's event publisher did not start")
        if self._error is not None:
            raise self._error

    def stop(self, timeout: float = 5.0) -> None:
        self._closing = True
        self._waker.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def queue_depth(self) -> int:
        return len(self._queue)

    def queue_bytes(self) -> int:
        """Bytes of results waiting in the hand-off queue (to be parsed), at most QUEUE_BYTES."""
        return max(0, self._bytes_in - self._bytes_out)

    # ---- the broker's loop --------------------------------------------------------------

    def admitted(self, job: QueuedJob, svc: ServiceRecord) -> None:
        """A job the broker took: remember its topic names, publish `queued`."""
        task = job.task if svc.tasks and job.task in svc.tasks else None
        names = self._names
        if len(names) >= MAX_NAMES:
            del names[next(iter(names))]  # the oldest: its later events are published with `_` names
        parts = self._parts.get((svc.name, task))
        if parts is None:
            if len(self._parts) >= MAX_TOPICS:
                self._parts.clear()
            parts = self._parts[(svc.name, task)] = (
                topic_part(svc.name.decode(errors="replace")),
                topic_part(task) if task else "_",
            )
        entry = (parts[0], parts[1], job.kind == ANY)
        names[job.uuid] = entry
        if self.active:
            self._offer(entry, State.QUEUED, job.uuid, b"", None)

    def replied(self, uuid: bytes, status: bytes) -> None:
        """A reply the broker made itself (expired, cancelled, lost...): published for admitted jobs only,
        so a refusal of a name the broker never accepted publishes nothing."""
        state = _BY_STATUS.get(status)
        entry = self._names.get(uuid) if state is not None else None
        if entry is not None:
            self._state(entry, uuid, state, b"", None, status)

    def forwarded(self, worker: WorkerRecord, msg: nfp.WorkerReply, outcome: str | None) -> None:
        """A worker's reply (the service is the worker's, registered)."""
        uuid, status, payload = msg.uuid, msg.status, msg.payload
        if msg.command == nfp.EVENT:
            self._job_event(uuid, worker.service, worker.name, payload)
            return
        if msg.command != nfp.RESPONSE:
            return
        entry = self._names.get(uuid)
        if entry is None:
            entry = (topic_part(worker.service.decode(errors="replace")), "_", True)
        if status != nfp.ST_OK or outcome is not None:
            self._state(entry, uuid, outcome or _BY_STATUS.get(status), worker.name, None, status)
        elif self._bytes_in - self._bytes_out + len(payload) <= QUEUE_BYTES:
            self._state(entry, uuid, None, worker.name, payload, status)  # read once, on the thread
        elif len(payload) <= SMALL_RESULT:
            # The hand-off holds its bound of results already: decoded here, once.
            self._state(entry, uuid, result_state(payload), worker.name, None, status)
        else:
            self._state(entry, uuid, None, worker.name, None, status)  # ends the job's names; not handed over

    def _state(self, entry: Entry, uuid: bytes, state: str | None, worker: bytes, payload: Any, status: bytes) -> None:
        if state is None and status != nfp.ST_OK:
            return  # 202, 301, 300, a worker's busy: no change of state
        if (state is None or state in ENDS) and entry[2]:
            self._names.pop(uuid, None)  # a job for one worker ends once
            self._final = (uuid, entry)  # for its hop trace, which the broker offers next
        if not self.active:
            return
        if state is None and payload is None:
            self.offered += 1
            self.dropped += 1  # a result too large to read here, with the hand-off full: as a full queue
            return
        self._offer(entry, state, uuid, worker, payload)

    def worker(self, service: bytes, name: bytes, state: str, why: str) -> None:
        """A worker registered (`ready`) or left (`lost`, with why): worker.<service>.<worker>.<state>."""
        if self.active:
            parts = (topic_part(service.decode(errors="replace")), topic_part(name.decode(errors="replace")), False)
            self._offer(parts, state, b"", name, why, kind="worker")

    def _job_event(self, uuid: bytes, service: bytes, worker: bytes, payload: Any) -> None:
        """A job's progress event (a worker's EVENT frame): event.<service>.<worker>. Nothing is parsed
        or reduced here: the payload (if small, and the hand-off's byte bound allows) and the raw names
        go to the publisher's thread."""
        if not self.active:
            return
        # (Frames of 64 KiB or more arrive as zmq.Frame, never small enough to be handed over.)
        small = type(payload) is bytes and len(payload) <= EVENT_PAYLOAD_MAX
        if not small or self._bytes_in - self._bytes_out + len(payload) > QUEUE_BYTES:
            payload = None
        entry = self._names.get(uuid)
        self._offer((service, entry[1] if entry is not None else "_", False), None, uuid, worker, payload, "event")

    def traced(self, uuid: bytes, service: bytes, worker: bytes, trace: bytes) -> None:
        """A final answer's hop trace as the broker forwards it (core/hoptrace.py): trace.<service>.<task>,
        decoded on the publisher's thread. Handed over only while a subscription could match it: every
        job has one, and `job.` subscribers should not pay for it."""
        if not self.tracing:
            return
        final = self._final
        entry = final[1] if final is not None and final[0] == uuid else self._names.get(uuid)
        task = entry[1] if entry is not None else "_"
        self._offer((service, task, False), None, uuid, worker, trace, "trace")

    def queue(self, service: bytes, facts: tuple[int, int, int, bool]) -> None:
        """A service's queue as it is now: queue.<service>, unless it was published so already."""
        if not self.active:
            return
        last = self._queue_last
        if last.get(service) == facts:
            return  # a job came and went between two looks: nothing a subscriber could tell apart
        if len(last) >= MAX_TOPICS:
            last.clear()
        last[service] = facts
        self._offer((service, "", False), None, b"", b"", facts, "queue")

    def _offer(
        self, entry: Entry, state: str | None, uuid: bytes, worker: bytes, payload: Any, kind: str = "job"
    ) -> None:
        self.offered += 1
        if len(self._queue) >= self.queue_size:
            self.dropped += 1
            return
        if kind != "worker" and kind != "queue" and payload is not None:  # a result, event or trace: bytes
            self._bytes_in += len(payload)
        self._queue.append((kind, entry[0], entry[1], state, uuid, worker, payload, time.time(), self.offered))
        if self._sleeping:
            self._waker.wake()

    # ---- the publisher's thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            sock, zap, self._own_ctx = open_xpub(self._ctx, self.endpoint, self.hwm, self.curve_secret)
            self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException as exc:
            self._error = exc
            self._started.set()
            self._waker.close()
            return
        self._started.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        if zap is not None:
            poller.register(zap, zmq.POLLIN)
        try:
            while not self._closing:
                try:
                    more = self._send_batch(sock)
                    if not more:
                        self._sleeping = True
                        more = bool(self._queue)  # one offered between the batch and the flag
                    events = dict(poller.poll(0 if more else None))
                    self._sleeping = False
                    if self._waker.fd in events:
                        self._waker.clear()
                        # Woken by the first event after a quiet spell: let a batch gather, so a busy
                        # broker wakes this thread (and hands it the GIL) at most 1/GATHER times a second.
                        time.sleep(GATHER)
                    if zap is not None and zap in events:
                        self._peers_seen = answer_zap(zap, self._peers_seen)
                    if sock in events:
                        self._read_subscriptions(sock)
                except Exception:  # nothing a peer sends ends the publisher
                    self._sleeping = False
                    if (held := self._log.take()) is not None:  # a peer's doing must not flood the log
                        log.exception("broker event publisher: a turn failed (%d such lines held back)", held)
                    time.sleep(0.01)
        finally:
            sock.close(0)
            if zap is not None:
                zap.close(0)
            if self._own_ctx is not None:
                self._own_ctx.term()
            self._waker.close()

    def _send_batch(self, sock: zmq.Socket[bytes]) -> bool:
        q = self._queue
        send = self._sender(sock)
        for _ in range(BATCH):
            if not q:
                return False
            kind, service, task, state, uuid, worker, payload, at, seq = q.popleft()
            if kind in ("job", "event", "trace") and payload is not None:
                self._bytes_out += len(payload)
            if kind == "job":
                if state is None:
                    state = result_state(payload)
                topic = f"job.{service}.{task}.{state}"
                body = job_body(seq, self._next_tseq(topic), topic, uuid, service, task, state, at, worker)
            elif kind == "event":
                svc = self._part(service)
                topic = f"event.{svc}.{self._part(worker)}"
                body = event_body(seq, self._next_tseq(topic), topic, uuid, svc, task, worker, payload, at)
            elif kind == "trace":
                svc = self._part(service)
                topic = f"trace.{svc}.{task}"
                body = trace_body(seq, self._next_tseq(topic), topic, uuid, svc, task, worker, payload, at)
            elif kind == "queue":
                svc = self._part(service)
                topic = f"queue.{svc}"
                body = queue_body(seq, self._next_tseq(topic), topic, svc, payload, at)
            else:
                topic = f"worker.{service}.{task}.{state}"
                body = worker_body(seq, self._next_tseq(topic), topic, service, state, worker, payload, at)
            try:
                send([topic.encode(), body], _NOBLOCK)
                self.published += 1
            except zmq.ZMQError:
                self.refused["send_failed"] += 1
        return bool(q)

    @staticmethod
    def _sender(sock: zmq.Socket[bytes]) -> Callable[[list[bytes], int], None]:
        """send_multipart for two frames, with int flags: pyzmq's own spends a third of its time on
        its loop and its flags' enum arithmetic."""
        raw_send = sock.send

        def send(frames: list[bytes], flags: int) -> None:
            raw_send(frames[0], _MORE)
            raw_send(frames[1], flags)

        return send

    def _next_tseq(self, topic: str) -> int:
        tseq = self._tseq
        n = tseq.get(topic, 0) + 1
        if n == 1 and len(tseq) >= MAX_TOPICS:
            tseq.clear()  # subscribers see a counter restart at 1, not a gap
        tseq[topic] = n
        return n

    def _part(self, raw: bytes) -> str:
        """A raw name (a registered service or worker) as a topic part, reduced on this thread."""
        parts = self._thread_parts
        part = parts.get(raw)
        if part is None:
            if len(parts) >= MAX_TOPICS:
                parts.clear()
            part = parts[raw] = topic_part(raw.decode(errors="replace"))
        return part

    def _read_subscriptions(self, sock: zmq.Socket[bytes]) -> None:
        for _ in range(BATCH):
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            msg = frame.bytes
            if not msg or msg[0] not in (0, 1):
                self.refused["malformed"] += 1
                continue
            prefix = msg[1:]
            try:
                user = frame.get("User-Id")
            except zmq.ZMQError:
                user = None  # libzmq's own unsubscription for a pipe that closed: it names no peer
            peer = user.encode() if isinstance(user, str) else None
            table = self.grants.table
            if msg[0] == 1 and table is not None and not may_subscribe(table.get(peer or b""), prefix):
                self.refused["scope"] += 1  # a key that may not read, or a prefix past its scope
            elif msg[0] == 1:
                verdict = self.slots.subscribe(prefix, peer or b"")
                if verdict.subscribes:
                    # (HELD: another pipe of a peer that holds it already gets it too, no new slot)
                    sock.setsockopt(zmq.SUBSCRIBE, prefix)
                    self._welcome(sock, prefix)
                else:
                    self.refused[verdict.value] += 1
            elif self.slots.unsubscribe(prefix, peer):
                sock.setsockopt(zmq.UNSUBSCRIBE, prefix)
            prefixes = self.slots.prefixes()
            self.active = bool(prefixes)
            self.tracing = any(_may_match(p, _TRACE) for p in prefixes)

    @property
    def subscribed(self) -> int:
        """Subscription slots taken (read for metrics)."""
        return self.slots.count

    def _welcome(self, sock: zmq.Socket[bytes], prefix: bytes) -> None:
        """Tell a new subscription it is live: a message on its own prefix (so it matches)."""
        self.active = True
        self.tracing = self.tracing or _may_match(prefix, _TRACE)
        body = json.dumps({"subscribed": prefix.decode(errors="replace"), "seq": self.offered}).encode()
        try:
            sock.send_multipart([prefix, body], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
