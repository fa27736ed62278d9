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


def test_an_event_wakes_only_the_streams_it_is_for_and_moves_idle_ones_past_it() -> None:
    async def run() -> None:
        h = hub()
        h._loop = asyncio.get_running_loop()
        idle = [h.join(f"job.other{i}.", 0) for i in range(100)]
        waiting = [h.arm(r) for r in idle]
        fan = h.join("job.demo.", 0)
        woken = h.arm(fan)
        h._add(events(3, "job.demo.echo.completed"))
        await asyncio.sleep(0.01)  # the hub's wake-up runs
        assert woken.done()
        assert not any(w.done() for w in waiting)  # a hundred idle readers did not run
        assert {r.last for r in idle} == {3}  # and need not read those three again
        last, missed, frames = h.after(idle[0].last, idle[0].topic)
        assert (last, missed, frames) == (3, 0, [])
        last, missed, frames = h.after(0, "job.demo.")
        assert last == 3 and missed == 0 and [json.loads(f.split(b"data: ")[1])["n"] for f in frames] == [0, 1, 2]

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
