"""The API's cache of the tasks' announced schemas (api/jobs/admission.py, TaskSchemas): one MMI fetch per
service at a time, an expired entry served while it is fetched again, nothing guessed when the broker
cannot be asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from zfab.api.jobs import admission
from zfab.api.jobs.admission import TaskSchemas


class Broker:
    """Stands in for `mmi`: counts fetches, answers when `go` is set (or raises when told to)."""

    def __init__(self) -> None:
        self.fetches = 0
        self.go = asyncio.Event()
        self.down = False

    async def __call__(self, client: Any, task: str, **kwargs: Any) -> dict[str, Any]:
        assert task == "show_tasks"
        self.fetches += 1
        await self.go.wait()
        if self.down:
            raise TimeoutError("the broker did not answer")
        return {"tasks": {"echo": {"properties": {"n": {}}, "fetch": self.fetches}}}


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    fake = Broker()
    monkeypatch.setattr(admission, "mmi", fake)
    return fake


def test_concurrent_misses_share_one_fetch(broker: Broker) -> None:
    async def main() -> None:
        schemas = TaskSchemas()
        waiting = [asyncio.ensure_future(schemas.lookup(None, "demo")) for _ in range(20)]
        await asyncio.sleep(0)
        broker.go.set()
        answers = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert broker.fetches == 1
        assert all(known and tasks is not None and "echo" in tasks for known, tasks in answers)

    asyncio.run(main())


def test_an_expired_entry_is_served_while_one_fetch_refreshes_it(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        schemas = TaskSchemas()
        broker.go.set()
        await schemas.lookup(None, "demo")
        broker.go.clear()  # the next fetch hangs until released
        monkeypatch.setattr(admission, "TTL", 0.0)
        answers = await asyncio.wait_for(asyncio.gather(*(schemas.lookup(None, "demo") for _ in range(10))), 5)
        assert [a[1]["echo"]["fetch"] for a in answers] == [1] * 10  # the old entry, at once
        assert broker.fetches == 2  # one refresh under way, not ten
        broker.go.set()
        for _ in range(100):
            await asyncio.sleep(0)
            if not schemas._fetching:
                break
        monkeypatch.setattr(admission, "TTL", 60.0)
        known, tasks = await schemas.lookup(None, "demo")
        assert known and tasks is not None and tasks["echo"]["fetch"] == 2

    asyncio.run(main())


def test_a_silent_broker_with_nothing_cached_is_not_guessed(broker: Broker) -> None:
    async def main() -> None:
        schemas = TaskSchemas()
        broker.down = True
        broker.go.set()
        assert await asyncio.wait_for(schemas.lookup(None, "demo"), 5) == (False, None)

    asyncio.run(main())
