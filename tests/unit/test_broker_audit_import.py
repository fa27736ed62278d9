"""The API's side of the broker's MMI audit log (api/http/brokeraudit.py): it takes every key's entries but
its own, page by page, starts again from the beginning of a restarted broker's log, and an entry taken
twice (another replica, or an API restarted) is stored once (api/store/audit.py)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from zfab.api.http.audit import AuditLog
from zfab.api.http.brokeraudit import BrokerAudit
from zfab.api.store.audit import SqliteAudit
from zfab.broker.mmiaudit import MmiAuditLog
from zfab.core.access import Grant

API = Grant.of("api", "admin")


class FakeBroker:
    """A client whose MMI show_audit the broker's own log answers, read with the API's key."""

    broker = "tcp://fake"
    broker_alive = True

    def __init__(self) -> None:
        self.log = MmiAuditLog()
        self.calls = 0

    def mmi_future(self, task: str, timeout: float, **kwargs: Any) -> Future[dict[str, Any]]:
        assert task == "show_audit"
        self.calls += 1
        fut: Future[dict[str, Any]] = Future()
        fut.set_result({"result": self.log.page(kwargs, API)})
        return fut


def pause(broker: FakeBroker, who: str, role: str = "admin", status: bytes = b"200") -> None:
    broker.log.record(Grant.of(who, role), "pause_service", {"service": "demo"}, status)


def test_every_key_but_the_apis_own_is_taken_once_and_a_restarted_broker_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        broker = FakeBroker()
        audit = AuditLog()
        audit.store = SqliteAudit(tmp_path / "api.sqlite", max_count=100, max_age=3600)
        taker = BrokerAudit(broker, audit)  # type: ignore[arg-type]
        pause(broker, "root")
        pause(broker, "api")  # the API's own call: it audited it already
        pause(broker, "ops", "operator", b"400")
        await taker.poll()
        await taker.poll()  # nothing new: nothing taken again
        assert [(r[1], r[3], r[4], r[6]) for r in audit.entries] == [
            ("root", "MMI pause_service", "demo", 200),
            ("ops", "MMI pause_service", "demo", 400),
        ]
        assert taker.taken == 2
        # The broker restarts: a new log, read from its first entry.
        broker.log = MmiAuditLog()
        pause(broker, "root")
        await taker.poll()
        assert taker.taken == 3 and audit.entries[-1][5] == f"broker:{broker.log.log_id}:1"
        # An API restarted (or another replica) takes the same entries again: the database keeps them once.
        again = BrokerAudit(broker, audit)  # type: ignore[arg-type]
        await again.poll()
        await audit.drain()
        rows, total = await audit.store.page(None, None, None, 100, 0)
        assert total == 3 and {r[1] for r in rows} == {"root", "ops"}
        await audit.store.close()

    asyncio.run(go())


def test_a_long_log_is_taken_page_by_page() -> None:
    async def go() -> None:
        broker = FakeBroker()
        audit = AuditLog(max_count=5000)
        for i in range(MmiAuditLog.CAPACITY):
            pause(broker, f"k{i}")
        taker = BrokerAudit(broker, audit)  # type: ignore[arg-type]
        await taker.poll()
        assert taker.taken == MmiAuditLog.CAPACITY and broker.calls == 2  # a full page, then an empty one

    asyncio.run(go())
