"""An API replica that stops wakes every request waiting on another replica's job (api/replicas/coordination.py):
each looks again and sees the server closing, instead of sleeping out its safety interval."""

from __future__ import annotations

import asyncio
from typing import Any

from zfab.api.replicas.coordination import Replicas

DEADLINE = 5.0


class FakeDatabase:
    """Records statements; the replica's stop deregisters it with one."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    async def fetch(self, query: str, params: Any = None) -> list[Any]:
        self.statements.append(" ".join(query.split()))
        return []


def test_stop_wakes_every_waiter() -> None:
    async def main() -> None:
        # Given three requests waiting on two jobs of other replicas
        db = FakeDatabase()
        rp = Replicas(db, None, "tcp://127.0.0.1:1", 5.0, "r1")  # type: ignore[arg-type]
        events = [rp.listen("job-1"), rp.listen("job-1"), rp.listen("job-2")]
        waiters = [asyncio.create_task(ev.wait()) for ev in events]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        # When the replica stops
        await rp.stop()
        # Then every one of them is woken (well before its safety interval), and the replica deregistered
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(*waiters)
        assert db.statements == ["DELETE FROM api_replicas WHERE id = %s"]

    asyncio.run(main())
