"""The broker's event publisher (issue 30, part 1): every job state change under a topic.

Topics (docs/protocol.md, "Event subscriptions"): `job.<service>.<task>.<state>`, where service
and task are names the broker already accepted (a registered service; a task its workers
declared, else `_`), each reduced to `[A-Za-z0-9_:-]` (anything else becomes `_`, so a part never
holds a dot) and cut to TOPIC_PART_MAX characters; state is one of core/states.py's words, or
`retrying` for a failed attempt its worker says runs again (not the job's end). Workers
that register or leave: `worker.<service>.<worker>.ready|lost`. A job's progress events (a worker's
EVENT frames): `event.<service>.<worker>`, the payload parsed on the publisher's thread (at most
EVENT_PAYLOAD_MAX bytes of it; a larger one is published without its fields) and its text cut to
EVENT_TEXT_MAX. A service's queue (depth, bytes, capacity, paused): `queue.<service>`, coalesced by
the broker's loop to one event per QUEUE_INTERVAL per service (`tend_queues`), and at once when
the service is paused or resumed. A job's hop trace as the broker forwards it (its own durations and
its worker's): `trace.<service>.<task>`, handed over only while a subscription could match it.

Single owner: the XPUB socket is created, polled, sent on and closed by this publisher's own
thread, never by the broker's loop. The loop hands an event over with `offer()`: a tuple appended
to a bounded deque, no lock and no wait; a full deque drops the event and counts it
(zfab_broker_events_dropped_total). The thread wakes on an eventfd only when it sleeps, and then
gathers for GATHER seconds before it sends. A worker's result of at most SMALL_RESULT bytes rides
along to be parsed there (completed, failed or retrying), QUEUE_BYTES of them at most; past that, or
for a larger result, the loop tells them apart by a byte search instead.

Subscriptions are bounded: XPUB_MANUAL, so a subscription takes effect only when this thread
accepts it: a prefix of at most MAX_PREFIX bytes, at most `max_subscriptions` at once, and at most
`max_per_peer` (a tenth of those by default) held by one peer (others are refused and counted);
MAXMSGSIZE closes a peer that sends a longer subscription frame at all. A peer is what ZAP says a
subscription message comes from (its User-Id): under CURVE the broker's ZAP handler names the key,
so a key's connections share one share; without CURVE this thread answers ZAP itself (a ZAP socket
of its own context, NULL mechanism) with a fresh id per connection. A peer that leaves gives its
slots back: libzmq unsubscribes the prefixes no other peer holds (those messages carry no User-Id,
so every holder of such a prefix lets it go, since no pipe holds it any more).
Each subscriber's pipe holds at most `hwm` messages; past it libzmq drops that subscriber's
messages (not the others'), which the subscriber sees as gaps in the per-topic `tseq`.
While nobody is subscribed the loop's cost per event is one attribute read.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import zmq

from ..core import hoptrace
from ..core import protocol as nfp
from ..transport.security import curve_server
from ..transport.waker import Waker
from .subscriptions import MAX_PREFIX, SubscriptionSlots

log = logging.getLogger(__name__)

PEER_SHARE = 10  # one peer holds at most 1/PEER_SHARE of the subscription slots (unless told otherwise)
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # RFC 27: where libzmq asks who a connecting peer is
CURVE_MAXMSG = 1024  # bytes of a frame a CURVE subscriber may send (the handshake's, a boxed subscription)
TOPIC_PART_MAX = 64  # characters of a topic part (service, task)
MAX_NAMES = 100_000  # jobs whose (service, task) the publisher remembers between their events
MAX_TOPICS = 10_000  # per-topic sequence counters kept
BATCH = 512  # events sent per turn before the thread looks at subscriptions again
GATHER = 0.005  # seconds a woken publisher waits for more events before it sends (the most it delays one)
SMALL_RESULT = 64 * 1024  # results parsed (on the publisher's thread) to tell completed from failed
QUEUE_BYTES = 8 * 1024 * 1024  # bytes of such results (and job events) the hand-off queue holds at most
EVENT_PAYLOAD_MAX = 16 * 1024  # bytes of a job event handed over to be parsed; a larger one goes without fields
EVENT_TEXT_MAX = 1024  # characters of a job event's message published (so an event stays far below 64 KiB)
EVENT_WORD_MAX = 64  # characters of its event_type and severity
QUEUE_INTERVAL = 0.25  # seconds between two queue.<service> events of a busy queue (coalesced in between)
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_PLAIN = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:.~-"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:-")

# Broker-side statuses and what state they end a job in.
_BY_STATUS = {
    nfp.ST_WORKER_ACCEPTED: "running",
    nfp.ST_WAITING_INPUT: "waiting",
    nfp.ST_EXPIRED: "expired",
    nfp.ST_CANCELLED: "cancelled",
    nfp.ST_WORKER_LOST: "lost",
    nfp.ST_ERROR: "failed",
    nfp.ST_BAD_REQUEST: "failed",
    nfp.ST_NOT_FOUND: "failed",
}
FINAL = frozenset({"completed", "failed", "cancelled", "expired", "lost"})
# An attempt's end that is not the job's (a failed attempt its worker says runs again): its route ends.
ATTEMPT_ENDS = frozenset({"retrying"})
_TRACE = b"trace."


def _may_match(prefix: bytes, kind: bytes) -> bool:
    """A subscription to `prefix` could receive topics that start with `kind` (`""`, `t`, `trace.demo.`)."""
    return kind.startswith(prefix) or prefix.startswith(kind)


def _json_str(raw: bytes) -> bytes:
    """A peer's bytes as a JSON string (uuids and worker names are short and nearly always plain)."""
    if not raw.translate(None, _PLAIN):  # nothing but plain characters: nothing to escape
        return b'"%s"' % raw
    return json.dumps(raw.decode(errors="replace")).encode()


def topic_part(name: str) -> str:
    """A name as a topic part: safe characters only (no dot), bounded, never empty."""
    part = "".join(c if c in _SAFE else "_" for c in name[:TOPIC_PART_MAX])
    return part or "_"


def result_state(payload: bytes | None) -> str:
    """completed, failed or retrying, from a worker's 200 (a small one is parsed; a large one is a result).
    `retrying`: every failed entry carries the worker's `retry` (docs/protocol.md "Retries on failure"),
    so this attempt's failure is not the job's end: its next attempt follows, as `<uuid>~<N>`."""
    if payload is None:
        return "completed"
    keys = payload.count(b'"failed"')
    if keys == payload.count(b'"failed": false') + payload.count(b'"failed":false'):
        # Every entry says failed: false (the common case; a key spelt with escapes aside): no parse,
        # which was half of this thread's time per result.
        return "completed"
    try:
        entries = json.loads(payload)
    except ValueError:
        return "completed"
    failed = (
        [e for e in entries.values() if isinstance(e, dict) and e.get("failed")] if isinstance(entries, dict) else []
    )
    if failed:
        return "retrying" if all(isinstance(e.get("retry"), dict) for e in failed) else "failed"
    return "completed"


def event_fields(payload: bytes) -> dict[str, Any]:
    """A job event's fields as its payload has them (docs/protocol.md "Events"), bounded: event_type and
    severity EVENT_WORD_MAX characters, the message EVENT_TEXT_MAX, progress a number. Others are left out
    (extras may be large; the job's own event stream has them)."""
    try:
        ev = json.loads(payload)
    except (ValueError, RecursionError):
        return {"malformed": True}
    if not isinstance(ev, dict):
        return {"malformed": True}
    out: dict[str, Any] = {}
    for key, bound in (("event_type", EVENT_WORD_MAX), ("message", EVENT_TEXT_MAX), ("severity", EVENT_WORD_MAX)):
        value = ev.get(key)
        if isinstance(value, str):
            out[key] = value[:bound]
    progress = ev.get("progress")
    if isinstance(progress, (int, float)) and not isinstance(progress, bool) and math.isfinite(progress):
        out["progress"] = progress
    return out


class EventPublisher:
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
        self._peers_seen = 0  # thread: connections named by this thread's ZAP answers (without CURVE)
        self._queue: deque[tuple[Any, ...]] = deque()
        self._names: dict[bytes, tuple[str, str, bool]] = {}  # broker loop only: uuid -> service, task, single
        self._parts: dict[tuple[bytes, str | None], tuple[str, str]] = {}  # broker loop only: names as topic parts
        self._bytes_in = 0  # broker loop: result bytes handed over (to tell completed from failed)
        self._bytes_out = 0  # thread: of those, taken
        self._tseq: dict[str, int] = {}  # thread only
        self._thread_parts: dict[bytes, str] = {}  # thread only: raw names as topic parts
        self._queue_last: dict[bytes, tuple[int, int, int, bool]] = {}  # broker loop only: last published
        self._next_queues = 0.0  # broker loop only: when queue changes may be published next
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

    def admitted(self, uuid: bytes, service: bytes, task: str | None, *, single: bool) -> None:
        """A job the broker took: remember its topic names, publish `queued`."""
        names = self._names
        if len(names) >= MAX_NAMES:
            del names[next(iter(names))]  # the oldest: its later events are published with `_` names
        parts = self._parts.get((service, task))
        if parts is None:
            if len(self._parts) >= MAX_TOPICS:
                self._parts.clear()
            parts = self._parts[(service, task)] = (
                topic_part(service.decode(errors="replace")),
                topic_part(task) if task else "_",
            )
        entry = (parts[0], parts[1], single)
        names[uuid] = entry
        if self.active:
            self._offer(entry, "queued", uuid, b"", None)

    def reply(self, uuid: bytes, status: bytes) -> None:
        """A reply the broker made itself (expired, cancelled, lost...): published for admitted jobs only,
        so a refusal of a name the broker never accepted publishes nothing."""
        state = _BY_STATUS.get(status)
        entry = self._names.get(uuid) if state is not None else None
        if entry is not None:
            self._state(entry, uuid, state, b"", None, status)

    def forwarded(self, uuid: bytes, service: bytes, status: bytes, worker: bytes, payload: Any) -> None:
        """A worker's reply (the service is the worker's, registered)."""
        entry = self._names.get(uuid)
        if entry is None:
            entry = (topic_part(service.decode(errors="replace")), "_", True)
        if status == nfp.ST_OK:
            # completed or failed: told by the result entries, on the publisher's thread
            if not isinstance(payload, bytes) or len(payload) > SMALL_RESULT:
                self._state(entry, uuid, None, worker, None, status)
            elif self._bytes_in - self._bytes_out + len(payload) > QUEUE_BYTES:
                # The hand-off holds its bound of results already: a cheaper look here instead.
                failed = b'"failed": true' in payload or b'"failed":true' in payload
                retrying = failed and (b'"retry": {"after"' in payload or b'"retry":{"after"' in payload)
                state = "retrying" if retrying else "failed" if failed else "completed"
                self._state(entry, uuid, state, worker, None, status)
            else:
                self._state(entry, uuid, None, worker, payload, status)
        else:
            self._state(entry, uuid, _BY_STATUS.get(status), worker, None, status)

    def _state(
        self, entry: tuple[str, str, bool], uuid: bytes, state: str | None, worker: bytes, payload: Any, status: bytes
    ) -> None:
        if state is None and status != nfp.ST_OK:
            return  # 202, 301, 300, a worker's busy: no change of state
        if (state is None or state in FINAL or state in ATTEMPT_ENDS) and entry[2]:
            self._names.pop(uuid, None)  # a job for one worker ends once
            self._final = (uuid, entry)  # for its hop trace, which the broker offers next
        if self.active:
            self._offer(entry, state, uuid, worker, payload)

    def worker(self, service: bytes, name: bytes, state: str, why: str = "") -> None:
        """A worker registered (`ready`) or left (`lost`, with why): worker.<service>.<worker>.<state>."""
        if self.active:
            parts = (topic_part(service.decode(errors="replace")), topic_part(name.decode(errors="replace")), False)
            self._offer(parts, state, b"", name, why, kind="worker")

    def job_event(self, uuid: bytes, service: bytes, worker: bytes, payload: Any) -> None:
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

    def trace(self, uuid: bytes, service: bytes, worker: bytes, frame: bytes) -> None:
        """A final answer's hop trace as the broker forwards it (core/hoptrace.py): trace.<service>.<task>,
        decoded on the publisher's thread. Handed over only while a subscription could match it: every
        job has one, and `job.` subscribers should not pay for it."""
        if not self.tracing:
            return
        final = self._final
        entry = final[1] if final is not None and final[0] == uuid else self._names.get(uuid)
        task = entry[1] if entry is not None else "_"
        self._offer((service, task, False), None, uuid, worker, frame, "trace")

    def queue(self, service: bytes, depth: int, nbytes: int, capacity: int, paused: bool) -> None:
        """A service's queue as it is now: queue.<service>, unless it was published so already."""
        if not self.active:
            return
        facts = (depth, nbytes, capacity, paused)
        last = self._queue_last
        if last.get(service) == facts:
            return  # a job came and went between two looks: nothing a subscriber could tell apart
        if len(last) >= MAX_TOPICS:
            last.clear()
        last[service] = facts
        self._offer((service, "", False), None, b"", b"", facts, "queue")

    def tend_queues(
        self, now: float, changed: set[bytes], facts: Callable[[bytes], tuple[int, int, int, bool] | None]
    ) -> float | None:
        """Publish the queues in `changed` (the broker's dirty set, emptied here) at most once per
        QUEUE_INTERVAL: a busy queue changes with every job, its subscribers hear of it a few times a
        second. Returns when to look again while changes wait for their turn (None: none waits)."""
        if not self.active:
            changed.clear()
            self._queue_last.clear()  # a later subscriber is told the next change, whatever was last
            return None
        if now < self._next_queues:
            return self._next_queues
        for name in changed:
            f = facts(name)
            if f is not None:
                self.queue(name, *f)
        changed.clear()
        self._next_queues = now + QUEUE_INTERVAL
        return None

    def _offer(
        self,
        entry: tuple[Any, str, bool],
        state: str | None,
        uuid: bytes,
        worker: bytes,
        payload: Any,
        kind: str = "job",
    ) -> None:
        self.offered += 1
        if len(self._queue) >= self.queue_size:
            self.dropped += 1
            return
        if type(payload) is bytes:  # a result or a job event, to be parsed on the thread
            self._bytes_in += len(payload)
        self._queue.append((kind, entry[0], entry[1], state, uuid, worker, payload, time.time(), self.offered))
        if self._sleeping:
            self._waker.wake()

    # ---- the publisher's thread ------------------------------------------------------------

    def _open(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes] | None]:
        zap = None
        if not self.curve_secret:
            self._ctx = self._own_ctx = zmq.Context()
            zap = self._own_ctx.socket(zmq.REP)
            zap.setsockopt(zmq.LINGER, 0)
            try:
                zap.bind(ZAP_ENDPOINT)
            except zmq.ZMQError:
                zap.close(0)  # (the context's term() would wait on it)
                raise
        sock = self._ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.setsockopt(zmq.XPUB_MANUAL, 1)
        if zap is not None:
            sock.setsockopt(zmq.ZAP_DOMAIN, b"zfab-events")  # NULL mechanism: ZAP names each connection
        if self.curve_secret:
            # libzmq applies MAXMSGSIZE to the handshake's commands too, and CURVE's INITIATE (about 300
            # bytes) and each boxed message (33 bytes more) pass 1 + MAX_PREFIX: a subscriber would be
            # closed before its first message. The thread refuses a prefix over MAX_PREFIX all the same.
            sock.setsockopt(zmq.MAXMSGSIZE, CURVE_MAXMSG)
            curve_server(sock, self.curve_secret)
        else:
            sock.setsockopt(zmq.MAXMSGSIZE, 1 + MAX_PREFIX)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError:
            sock.close(0)
            if zap is not None:
                zap.close(0)
            raise
        self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock, zap

    def _run(self) -> None:
        try:
            sock, zap = self._open()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            self._waker.close()
            if self._own_ctx is not None:
                self._own_ctx.term()
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
                        self._answer_zap(zap)
                    if sock in events:
                        self._read_subscriptions(sock)
                except Exception:  # nothing a peer sends ends the publisher
                    self._sleeping = False
                    log.exception("broker event publisher: a turn failed")
                    time.sleep(0.01)
        finally:
            sock.close(0)
            if zap is not None:
                zap.close(0)
            if self._own_ctx is not None:
                self._own_ctx.term()
            self._waker.close()

    def _answer_zap(self, zap: zmq.Socket[bytes]) -> None:
        """Without CURVE every connection is welcome: the answer only names it, so its subscriptions
        count against one peer's share (a fresh id per connection, never reused)."""
        for _ in range(BATCH):
            try:
                req = zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(req) < 6:  # (only libzmq speaks on this socket; a REP must answer all the same)
                zap.send_multipart([b"1.0", b"", b"500", b"malformed ZAP request", b"", b""])
                continue
            self._peers_seen += 1
            zap.send_multipart([req[0], req[1], b"200", b"OK", b"c%d" % self._peers_seen, b""])

    def _send_batch(self, sock: zmq.Socket[bytes]) -> bool:
        q = self._queue
        send = self._sender(sock)
        for _ in range(BATCH):
            if not q:
                return False
            kind, service, task, state, uuid, worker, payload, at, seq = q.popleft()
            if kind != "job":
                if kind == "event":
                    self._send_event(send, service, task, uuid, worker, payload, at, seq)
                elif kind == "queue":
                    self._send_queue(send, service, payload, at, seq)
                elif kind == "trace":
                    self._send_trace(send, service, task, uuid, worker, payload, at, seq)
                else:
                    self._send_worker(send, service, task, state, worker, payload, at, seq)
                continue
            if state is None:
                state = result_state(payload)
                if payload is not None:
                    self._bytes_out += len(payload)
            topic = f"job.{service}.{task}.{state}"
            n = self._next_tseq(topic)
            who = b',"worker":%s' % _json_str(worker) if worker else b""
            body = (
                b'{"seq":%d,"tseq":%d,"topic":"%s","uuid":%s,"service":"%s","task":"%s","state":"%s","at":%.6f%s}'
                % (seq, n, topic.encode(), _json_str(uuid), service.encode(), task.encode(), state.encode(), at, who)
            )
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

    def _send_worker(
        self, send: Any, service: str, name: str, state: str, worker: bytes, why: str, at: float, seq: int
    ) -> None:
        topic = f"worker.{service}.{name}.{state}"
        n = self._next_tseq(topic)
        body = {"seq": seq, "tseq": n, "topic": topic, "service": service, "state": state, "at": round(at, 6)}
        body["worker"] = worker.decode(errors="replace")
        if why:
            body["why"] = why
        try:
            send([topic.encode(), json.dumps(body, separators=(",", ":")).encode()], _NOBLOCK)
            self.published += 1
        except zmq.ZMQError:
            self.refused["send_failed"] += 1

    def _part(self, raw: bytes) -> str:
        """A raw name (a registered service or worker) as a topic part, reduced on this thread."""
        parts = self._thread_parts
        part = parts.get(raw)
        if part is None:
            if len(parts) >= MAX_TOPICS:
                parts.clear()
            part = parts[raw] = topic_part(raw.decode(errors="replace"))
        return part

    def _send_event(
        self,
        send: Any,
        service: bytes,
        task: str,
        uuid: bytes,
        worker: bytes,
        payload: bytes | None,
        at: float,
        seq: int,
    ) -> None:
        svc = self._part(service)
        topic = f"event.{svc}.{self._part(worker)}"
        body: dict[str, Any] = {"seq": seq, "tseq": self._next_tseq(topic), "topic": topic}
        body.update(uuid=uuid.decode(errors="replace"), service=svc, task=task, worker=worker.decode(errors="replace"))
        body["at"] = round(at, 6)
        if payload is None:
            body["oversize"] = True  # larger than EVENT_PAYLOAD_MAX (or the hand-off full of them): no fields
        else:
            self._bytes_out += len(payload)
            body.update(event_fields(payload))
        try:
            send([topic.encode(), json.dumps(body, separators=(",", ":")).encode()], _NOBLOCK)
            self.published += 1
        except zmq.ZMQError:
            self.refused["send_failed"] += 1

    def _send_trace(
        self, send: Any, service: bytes, task: str, uuid: bytes, worker: bytes, frame: bytes, at: float, seq: int
    ) -> None:
        self._bytes_out += len(frame)
        svc = self._part(service)
        topic = f"trace.{svc}.{task}"
        hops, held = hoptrace.fabric_hops(frame)
        body: dict[str, Any] = {"seq": seq, "tseq": self._next_tseq(topic), "topic": topic}
        body.update(uuid=uuid.decode(errors="replace"), service=svc, task=task, worker=worker.decode(errors="replace"))
        body.update(at=round(at, 6), held=held, hops=hops)
        try:
            send([topic.encode(), json.dumps(body, separators=(",", ":")).encode()], _NOBLOCK)
            self.published += 1
        except zmq.ZMQError:
            self.refused["send_failed"] += 1

    def _send_queue(self, send: Any, service: bytes, facts: tuple[int, int, int, bool], at: float, seq: int) -> None:
        svc = self._part(service)
        topic = f"queue.{svc}"
        depth, nbytes, capacity, paused = facts
        body = (
            b'{"seq":%d,"tseq":%d,"topic":"%s","service":"%s","depth":%d,"bytes":%d,"capacity":%d,"paused":%s,"at":%.6f}'
            % (
                seq,
                self._next_tseq(topic),
                topic.encode(),
                svc.encode(),
                depth,
                nbytes,
                capacity,
                b"true" if paused else b"false",
                at,
            )
        )
        try:
            send([topic.encode(), body], _NOBLOCK)
            self.published += 1
        except zmq.ZMQError:
            self.refused["send_failed"] += 1

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
            if msg[0] == 1:
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
