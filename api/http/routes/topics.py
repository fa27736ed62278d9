"""`GET /events?topic=PREFIX`: the broker's events by topic prefix as server-sent events (issue 30, part 1).

One hub per app holds one `service.Subscriber` to the broker's publisher (ZFAB_BROKER_EVENTS),
started at the first request, and a ring of the latest events, bounded by count and bytes
(ZFAB_API_EVENTS_BUFFER, ZFAB_API_EVENTS_BUFFER_BYTES), each with an id of its own. Every stream
reads the ring from its position and filters by its prefix, so a slow caller falls behind (and
is told what it missed) without slowing another, the hub or the fabric. A reconnecting
EventSource sends `Last-Event-ID` and resumes after it, within what the ring still holds.

The hub's pump thread moves events from the subscriber (whose SUB socket its own thread owns)
into the ring and hands each batch's topics to the event loop with one call_soon_threadsafe. There
only the streams whose prefix one of those topics starts with are found (streams are grouped by
prefix, and a topic's prefixes of the lengths in use are looked up) and woken; an idle stream is not
touched at all, and when it wakes (an event for it, or its ping) it skips what the hub has looked at
for it meanwhile, so it never reports as missed what was never for it. A stream sends at most CHUNK_BYTES
of frames at a time and reads on only once they are out, so a reader that reads nothing pins one
chunk and the server's write buffer, never the ring.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from itertools import islice
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Query, Request
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from zfab import Subscriber, ZfabError
from zfab.core.access import ANONYMOUS, Grant, topic_service

from ...errors import ProblemError, unavailable
from ..auth import Principal, grant_of
from ..problems import responses
from ..sse import PING, EventStreamResponse, comment, json_frame
from ..state import api_state

log = logging.getLogger(__name__)

MAX_TOPIC = 256  # characters of a topic prefix (the broker's bound, in bytes, is the same)
CHUNK_BYTES = 64 * 1024  # frames a stream sends at once (one frame more when a single one is larger)


class Reader:
    """One stream's place in the ring: its prefix, the last id it has dealt with, what wakes it."""

    __slots__ = ("last", "topic", "waiter")

    def __init__(self, topic: str, last: int) -> None:
        self.topic = topic
        self.last = last
        self.waiter: asyncio.Future[None] | None = None


# A plain string with an empty default, not `str | None`: an optional header's schema would say `null`
# is a value, and a client (schemathesis did) may send the text "null".
LastEventId = Annotated[
    str,
    Header(
        pattern=r"^(|0|[1-9][0-9]{0,17})$",
        description="Resume after this event id (an EventSource reconnecting); empty: from now",
    ),
]
Topic = Annotated[
    str,
    Query(
        max_length=MAX_TOPIC,
        description="Topic prefix, e.g. `job.demo.` (every demo job's state changes) or `job.demo.echo.completed`; "
        "empty: every event. Topics: job.<service>.<task>.<state>, worker.<service>.<worker>.<state>, "
        "event.<service>.<worker> (jobs' progress events), queue.<service>, trace.<service>.<task> (jobs' hop "
        "traces) (docs/protocol.md)",
    ),
]


class TopicHub:
    """The app's one subscription to the broker's events and the ring of the latest ones."""

    def __init__(self, endpoint: str, settings: Any, *, capacity: int, max_bytes: int, max_streams: int) -> None:
        self.endpoint = endpoint
        self.settings = settings
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.max_streams = max_streams
        self.streams = 0
        self.missed = 0  # events the hub's subscriber lost (gaps, or its queue full)
        self.ring: deque[tuple[int, str, bytes]] = deque()  # (id, topic, SSE frame)
        self.ring_bytes = 0
        self.last_id = 0
        self._lock = threading.Lock()
        self._sub: Subscriber | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # Streams by prefix (bounded by max_streams), and how many use each prefix length.
        self._groups: dict[str, set[Reader]] = {}
        self._lengths: dict[int, int] = {}
        self.woken_until = 0  # the last event id whose batch has been looked at for the streams
        self._starting = asyncio.Lock()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def ensure_started(self) -> None:
        async with self._starting:
            if self.running:
                return
            self._loop = asyncio.get_running_loop()
            try:
                sub = await asyncio.to_thread(lambda: Subscriber(self.endpoint, "", settings=self.settings).start(5.0))
            except (ZfabError, OSError, ValueError) as exc:
                raise unavailable(f"the broker's event publisher is not reachable: {exc}") from None
            self._sub = sub
            self._thread = threading.Thread(target=self._pump, name="zfab-api-topics", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closing = True
        if self._sub is not None:
            self._sub.close()
        if self._thread is not None:
            self._thread.join(2.0)

    # ---- the pump thread ----------------------------------------------------------

    def _pump(self) -> None:
        sub = self._sub
        assert sub is not None
        while not self._closing:
            ev = sub.get(timeout=0.5)
            if ev is None:
                if sub.closed:  # its socket's thread ended: the next request starts another
                    return
                continue
            batch = [ev]
            while len(batch) < 1000 and (more := sub.get(timeout=0)) is not None:
                batch.append(more)
            self._add(batch)
            self.missed = sub.missed + sub.dropped

    def _add(self, batch: list[dict[str, Any]]) -> None:
        topics: set[str] = set()
        with self._lock:
            first = self.last_id + 1
            for ev in batch:
                self.last_id += 1
                frame = json_frame(ev, id=self.last_id)
                topic = str(ev.get("topic", ""))
                topics.add(topic)
                self.ring.append((self.last_id, topic, frame))
                self.ring_bytes += len(frame)
                while len(self.ring) > self.capacity or self.ring_bytes > self.max_bytes:
                    self.ring_bytes -= len(self.ring.popleft()[2])
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._wake, first, self.last_id, tuple(topics))
            except RuntimeError:  # the loop closed meanwhile
                pass

    # ---- the event loop -------------------------------------------------------------

    def _wake(self, first: int, last: int, topics: tuple[str, ...]) -> None:
        """Events `first`..`last` with these topics are in the ring: wake the streams they are for."""
        groups = self._groups
        for t in topics:
            for n in self._lengths:
                group = groups.get(t[:n]) if len(t) >= n else None
                for r in group or ():
                    w = r.waiter
                    if w is not None and not w.done():  # waiting: nothing before `first` was for it
                        r.last = max(r.last, first - 1)
                        r.waiter = None
                        w.set_result(None)
        self.woken_until = last

    def join(self, topic: str, last: int) -> Reader:
        reader = Reader(topic, last)
        self._groups.setdefault(topic, set()).add(reader)
        self._lengths[len(topic)] = self._lengths.get(len(topic), 0) + 1
        return reader

    def leave(self, reader: Reader) -> None:
        group = self._groups.get(reader.topic)
        if group is None or reader not in group:
            return
        group.discard(reader)
        if not group:
            del self._groups[reader.topic]
        n = len(reader.topic)
        self._lengths[n] -= 1
        if not self._lengths[n]:
            del self._lengths[n]

    def idle(self, reader: Reader) -> None:
        """`reader` waited a ping interval without a wake-up: no event the hub has looked at was for it."""
        reader.last = max(reader.last, self.woken_until)

    def arm(self, reader: Reader) -> asyncio.Future[None]:
        """What wakes `reader` when an event for it arrives (event loop only)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        reader.waiter = fut
        return fut

    def after(
        self, last: int, topic: str, max_bytes: int = CHUNK_BYTES, grant: Grant = ANONYMOUS
    ) -> tuple[int, int, list[bytes]]:
        """Frames after id `last` whose topic starts with `topic` and names a service in the grant's scope,
        up to about `max_bytes` of them: (the last id read, ids missed, frames)."""
        everywhere = grant.everywhere
        with self._lock:
            if not self.ring or self.last_id <= last:
                return last, 0, []
            first = self.ring[0][0]
            missed = max(0, first - last - 1)
            start = max(0, last + 1 - first)
            frames: list[bytes] = []
            size, seen = 0, last
            for i, t, f in islice(self.ring, start, None):
                seen = i
                if t.startswith(topic) and (everywhere or grant.sees(topic_service(t))):
                    frames.append(f)
                    size += len(f)
                    if size >= max_bytes:
                        break
            return seen, missed, frames


class TopicHubCollector(Collector):
    """The hub in the API's metrics (0 while no hub runs)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterable[Metric]:
        hub: TopicHub | None = getattr(self.app.state, "topic_hub", None)
        depth = GaugeMetricFamily("zfab_api_events_buffered", "Events the API holds for GET /events (its ring)")
        size = GaugeMetricFamily("zfab_api_events_buffered_bytes", "Bytes of the events the API holds for GET /events")
        streams = GaugeMetricFamily("zfab_api_event_streams", "GET /events streams open")
        missed = CounterMetricFamily(
            "zfab_api_events_missed", "Events of the broker the API's subscriber lost (gaps, or its queue full)"
        )
        depth.add_metric([], len(hub.ring) if hub else 0)
        size.add_metric([], hub.ring_bytes if hub else 0)
        streams.add_metric([], hub.streams if hub else 0)
        missed.add_metric([], hub.missed if hub else 0)
        yield from (depth, size, streams, missed)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    registry: CollectorRegistry | None = getattr(app.state, "registry", None)
    collector = TopicHubCollector(app)
    if registry is not None:
        registry.register(collector)
    try:
        yield
    finally:
        if registry is not None:
            registry.unregister(collector)
        hub: TopicHub | None = getattr(app.state, "topic_hub", None)
        app.state.topic_hub = None
        if hub is not None:
            await asyncio.to_thread(hub.close)


router = APIRouter(tags=["jobs"], lifespan=lifespan)


def _hub(request: Request) -> TopicHub:
    st = api_state(request)
    endpoint = st.settings.broker_events
    if not endpoint:
        raise ProblemError(
            404,
            "events-off",
            "Events are off",
            "the broker's event publisher is not configured: set ZFAB_BROKER_EVENTS on the broker and the API",
        )
    hub: TopicHub | None = getattr(request.app.state, "topic_hub", None)
    if hub is None:
        s = st.settings
        hub = TopicHub(
            endpoint,
            s,
            capacity=s.api_events_buffer,
            max_bytes=s.api_events_buffer_bytes,
            max_streams=s.api_event_streams,
        )
        request.app.state.topic_hub = hub
    return hub


@router.get(
    "/events",
    summary="Stream the broker's events by topic prefix (server-sent events)",
    response_class=EventStreamResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "One `data:` line of JSON per event, with its `id`"},
        **responses(401, 403, 404, 422, 503),
    },
)
async def topic_events(
    request: Request,
    principal: Principal,
    topic: Topic = "",
    last_event_id: LastEventId = "",
) -> EventStreamResponse:
    """Every event whose topic starts with `topic`, as it happens: `job.<service>.<task>.<state>` for each
    state change of a job (docs/protocol.md). With `Last-Event-ID` the stream resumes after that id, from what
    the API still holds (ZFAB_API_EVENTS_BUFFER); older ones are announced as an `event: gap`. A comment line
    every ZFAB_SSE_PING_SECONDS keeps an idle stream open."""
    hub = _hub(request)
    grant = grant_of(request)
    if hub.streams >= hub.max_streams:
        raise unavailable(
            f"{hub.max_streams} event streams are open already (ZFAB_API_EVENT_STREAMS)", "too-many-streams"
        )
    await hub.ensure_started()
    ping = api_state(request).settings.sse_ping_seconds
    start = int(last_event_id) if last_event_id else hub.last_id
    hub.streams += 1
    released = False

    def release() -> None:  # once: when the stream ends, or its generator is dropped unstarted
        nonlocal released
        if not released:
            released = True
            hub.streams -= 1

    async def stream() -> AsyncIterator[bytes]:
        reader = hub.join(topic, start)
        try:
            yield comment("subscribed")
            while not hub.closing:
                waiter = hub.arm(reader)
                last = reader.last
                last_now, missed, frames = hub.after(last, topic, grant=grant)
                if missed:
                    yield json_frame({"missed": missed, "after": last}, event="gap")
                reader.last = max(reader.last, last_now)
                if frames:
                    reader.waiter = None
                    yield b"".join(frames)  # at most a chunk: the next is read once this one is out
                    continue
                try:
                    await asyncio.wait_for(waiter, ping)
                except TimeoutError:
                    hub.idle(reader)
                    yield PING
                finally:
                    reader.waiter = None
        finally:
            hub.leave(reader)
            release()

    body = stream()
    weakref.finalize(body, release)  # a caller gone before the first byte never starts the generator
    return EventStreamResponse(body)
