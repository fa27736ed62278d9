"""GET /events' hub (api/http/routes/topics.py) without a broker: who an event wakes, and how much a stream
is handed at once. Events are put in its ring as its pump thread puts them; the streams' side runs on the
test's event loop."""

from __future__ import annotations

import asyncio
import json

from zfab.api.http.routes.topics import CHUNK_BYTES, TopicHub


def hub() -> TopicHub:
    return TopicHub("tcp://127.0.0.1:1", None, capacity=10_000, max_bytes=16 << 20, max_streams=200)


def events(n: int, topic: str, size: int = 0) -> list[dict[str, object]]:
    return [{"topic": topic, "n": i, "pad": "x" * size} for i in range(n)]


def test_an_event_wakes_only_the_streams_it_is_for_and_leaves_idle_ones_untouched() -> None:
    async def run() -> None:
        h = hub()
        h._loop = asyncio.get_running_loop()
        idle = [h.join(f"job.other{i}.", 0) for i in range(100)]
        waiting = [h.arm(r) for r in idle]
        fan, every = h.join("job.demo.", 0), h.join("", 0)
        woken = [h.arm(fan), h.arm(every)]
        h._add(events(3, "job.demo.echo.completed"))
        await asyncio.sleep(0.01)  # the hub's wake-up runs
        assert all(w.done() for w in woken)
        assert not any(w.done() for w in waiting)  # a hundred idle readers did not run
        last, missed, frames = h.after(0, "job.demo.")
        assert last == 3 and missed == 0 and [json.loads(f.split(b"data: ")[1])["n"] for f in frames] == [0, 1, 2]
        # An idle reader's ping: it skips what the hub looked at for it, and reads nothing
        h.idle(idle[0])
        assert h.after(idle[0].last, idle[0].topic) == (3, 0, [])

    asyncio.run(run())


def test_an_idle_reader_is_never_told_it_missed_events_that_were_not_for_it() -> None:
    async def run() -> None:
        h = TopicHub("tcp://127.0.0.1:1", None, capacity=10, max_bytes=1 << 20, max_streams=10)
        h._loop = asyncio.get_running_loop()
        r = h.join("job.demo.", 0)
        h.arm(r)
        for _ in range(5):  # 50 events for others: the ring of 10 forgot 40 of them
            h._add(events(10, "job.other.echo.completed"))
            await asyncio.sleep(0)
        h._add(events(1, "job.demo.echo.completed"))
        await asyncio.sleep(0.01)
        assert r.waiter is None  # woken, for its one event
        last, missed, frames = h.after(r.last, r.topic)
        assert missed == 0 and len(frames) == 1 and last == 51

    asyncio.run(run())


def test_a_stream_is_handed_one_chunk_at_a_time() -> None:
    h = hub()
    h._add(events(1000, "job.demo.echo.completed", size=1000))
    got, last, chunks = 0, 0, 0
    while True:
        last, _, frames = h.after(last, "job.")
        if not frames:
            break
        chunks += 1
        size = sum(len(f) for f in frames)
        assert size < CHUNK_BYTES + 1100  # at most one frame past the chunk
        got += len(frames)
    assert got == 1000 and last == h.last_id and chunks >= 1000 * 1000 // CHUNK_BYTES
