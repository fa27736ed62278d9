"""The broker's audit log of MMI commands that change state: what the role table (core/access.py
MMI_COMMANDS) marks beyond `read` (pause, resume, set and clear limits), sent by any key, refusals
included. Who (the key's name), what, on which service or task, the outcome, when.

Kept in memory, bounded (the oldest entry goes first; counted), on the broker's owner thread. An admin
key reads it with MMI `show_audit` (after a sequence number, so a reader takes each entry once); the
API polls it and brings into its own audit log the entries of every key but its own (the API audits
the calls it makes itself, with the token behind them: api/http/brokeraudit.py).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..core.access import MMI_COMMANDS, Grant

# The commands recorded: every MMI command whose action is more than reading.
AUDITED: frozenset[str] = frozenset(task for task, action in MMI_COMMANDS.items() if action not in ("read", "audit"))
TARGET_CHARS = 200  # a target names a service (and a task): bounded, however long what a peer sent
PAGE_MAX = 1000


@dataclass(frozen=True, slots=True)
class MmiEntry:
    seq: int
    at: float
    key: str  # the key's name ("" without CURVE: no key to name)
    role: str
    command: str
    target: str
    status: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "key": self.key,
            "role": self.role,
            "command": self.command,
            "target": self.target,
            "status": self.status,
        }


def target_of(command: str, kwargs: dict[str, Any]) -> str:
    """`service`, or `service/task` for a limit: what the command acts on, as the peer named it."""
    service = kwargs.get("service")
    text = service if isinstance(service, str) else ""
    task = kwargs.get("task_name")
    if command in ("set_limit", "clear_limit") and isinstance(task, str):
        text = f"{text}/{task}"
    return text[:TARGET_CHARS]


class MmiAuditLog:
    """The newest `capacity` state-changing MMI commands, in order (`seq` grows by one per entry)."""

    CAPACITY = 1000

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.entries: deque[MmiEntry] = deque(maxlen=capacity)
        self.capacity = capacity
        self.seq = 0
        self.evicted = 0
        # Which log this is: a reader that finds another one (the broker restarted) starts from its beginning.
        self.log_id = os.urandom(8).hex()

    def record(self, grant: Grant | None, command: str, kwargs: dict[str, Any], status: bytes) -> None:
        if len(self.entries) == self.capacity:
            self.evicted += 1
        self.seq += 1
        self.entries.append(
            MmiEntry(
                self.seq,
                time.time(),
                grant.name if grant is not None else "",
                grant.role if grant is not None else "",
                command,
                target_of(command, kwargs),
                int(status) if status.isdigit() else 0,
            )
        )

    def page(self, kwargs: dict[str, Any], reader: Grant | None) -> dict[str, Any]:
        """show_audit {after, limit}: the entries after sequence number `after`, oldest first, at most
        `limit` (1..1000); `next` is the `after` of the next call; `you` the reading key's name."""
        after = kwargs.get("after", 0)
        limit = kwargs.get("limit", PAGE_MAX)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ValueError("show_audit's `after` is a sequence number (an integer >= 0)")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= PAGE_MAX:
            raise ValueError(f"show_audit's `limit` is an integer of 1..{PAGE_MAX}")
        found = [e.as_dict() for e in self.entries if e.seq > after][:limit]
        return {
            "log": self.log_id,
            "you": reader.name if reader is not None else "",
            "next": found[-1]["seq"] if found else min(after, self.seq),
            "entries": found,
            "evicted": self.evicted,
        }

    def figures(self) -> dict[str, Any]:
        return {"mmi_audit_entries": len(self.entries), "mmi_audit_capacity": self.capacity}
