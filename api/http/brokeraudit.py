"""The broker's audit entries in the API's audit log: MMI commands that change state (pause, resume, limits)
sent straight to the broker by a CURVE key, not through this API (service/broker/mmiaudit.py).

Every POLL_SECONDS the API reads the broker's log with MMI `show_audit` after the last entry it took, and
adds each entry to its own log (GET /audit, origin `broker`, action `MMI <command>`), except those of
its own key (`you` in the answer): the API made those calls itself and audited them already, with the
token behind them. Without CURVE there is no key to tell them apart, so none is taken. A broker that
restarted has another log (`log`): its entries are read from its beginning. Each entry's peer is
`broker:<log>:<seq>`, unique in the API's database (api/store/audit.py): an entry taken again (by another
replica on the same PostgreSQL, or by this API after a restart) is stored once. The API's key must be an
admin's (a key without an access-file entry is); otherwise the broker refuses and the API logs why.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from zfab import Client
from zfab.core.logbudget import LogBudget

from ..fabric import mmi
from .audit import BROKER_ACTION, AuditLog

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
PAGE = 1000  # entries a show_audit answers at most (the broker's bound too)
LOGS_KEPT = 8  # brokers' logs whose cursor is remembered (an active and a standby broker take turns)
TEXT_CHARS = 200  # what a broker's entry says, cut: the API's log bounds what it keeps


class BrokerAudit:
    """Takes the broker's new entries into `audit` (one poller per API, started with its client)."""

    def __init__(self, client: Client, audit: AuditLog) -> None:
        self.client = client
        self.audit = audit
        self.cursors: OrderedDict[str, int] = OrderedDict()  # a broker log's id -> the last entry taken
        self.taken = 0
        self.errors = 0
        self._log = LogBudget(burst=2, per_second=0.02)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if not self.client.broker_alive:
                continue
            try:
                await self.poll()
            except Exception as exc:  # the broker away, or refusing this key: try again later
                self.errors += 1
                if self._log.take() is not None:
                    log.warning("audit log: the broker's MMI entries could not be read: %s", exc)

    async def poll(self) -> None:
        """Take every entry the broker has after the last one taken (page by page)."""
        log_id = next(reversed(self.cursors), "") if self.cursors else ""
        while True:
            after = self.cursors.get(log_id, 0)
            page: dict[str, Any] = await mmi(self.client, "show_audit", after=after, limit=PAGE)
            found = str(page.get("log", ""))
            if found != log_id:  # another broker, or this one restarted: its log from where we left it
                log_id = found
                self.cursors.setdefault(found, 0)
                self.cursors.move_to_end(found)
                while len(self.cursors) > LOGS_KEPT:
                    self.cursors.popitem(last=False)
                if self.cursors[found] != after:
                    continue
            entries = page.get("entries") or []
            self.take(found, entries, str(page.get("you", "")))
            self.cursors[found] = int(page.get("next", after))
            if len(entries) < PAGE:
                return

    def take(self, log_id: str, entries: list[dict[str, Any]], you: str) -> None:
        for e in entries:
            key = str(e.get("key", ""))
            if key == you:
                continue  # this API's own call: audited already, with the token behind it
            self.audit.add(
                (
                    float(e.get("at", 0.0)),
                    key[:TEXT_CHARS],
                    str(e.get("role", ""))[:TEXT_CHARS],
                    BROKER_ACTION + str(e.get("command", ""))[:TEXT_CHARS],
                    str(e.get("target", ""))[:TEXT_CHARS],
                    f"broker:{log_id[:32]}:{int(e.get('seq', 0))}",  # unique: stored once however often taken
                    int(e.get("status", 0)),
                )
            )
            self.taken += 1
