"""Paused service queues: which services the broker admits and queues jobs for but does not dispatch.

A user set them, so they outlive the broker: kept (kept.py) in a small JSON file in its data
directory (`$ZFAB_DATA_DIR/broker/paused.json`, replaced atomically on every change), or in
PostgreSQL when brokers share a PostgreSQL lease, and read when the broker starts (and when it takes
the lease), so a paused queue stays paused through a restart or a failover, before any worker of the
service registers again. What cannot be read pauses nothing (and says so in the log); a change that
cannot be written stays in memory only (logged, and counted in `show_broker`).
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.protocol import MAX_NAME_BYTES
from .kept import FileKept, Kept

log = logging.getLogger(__name__)

KIND = "paused"


class PausedServices:
    """The paused service names (bounded: at most `capacity`, each a name the broker accepts)."""

    def __init__(self, kept: Kept | None, capacity: int) -> None:
        self.kept = kept or FileKept(None)
        self.capacity = capacity
        self.names: set[bytes] = set()

    @property
    def write_errors(self) -> int:
        return self.kept.write_errors[KIND]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return len(self.names)

    def load(self) -> None:
        """Read the paused services a previous broker left (nothing when none were kept)."""
        try:
            doc = self.kept.read(KIND)
            if doc is not None and not isinstance(doc, list):
                raise ValueError("not a JSON list of service names")
        except (OSError, ValueError) as exc:
            log.warning(
                "broker: cannot read the paused services in %s (%s); no queue is paused", self.kept.where(KIND), exc
            )
            return
        self.take(doc)

    def take(self, doc: Any) -> None:
        """Pause exactly the services `doc` names (a JSON list; anything else pauses nothing). Owner only."""
        self.names.clear()  # in place: the dispatcher holds this set
        for name in doc if isinstance(doc, list) else []:
            raw = name.encode() if isinstance(name, str) else b""
            if raw and len(raw) <= MAX_NAME_BYTES and len(self.names) < self.capacity:
                self.names.add(raw)
        if self.names:
            log.warning("broker: paused services from %s: %s", self.kept.where(KIND), ", ".join(self.labels()))

    def pause(self, name: bytes) -> bool:
        """Pause a service's queue; False when it was paused already. Raises ValueError when full."""
        if name in self.names:
            return False
        if len(self.names) >= self.capacity:
            raise ValueError(f"{self.capacity} services are paused already (ZFAB_MAX_SERVICES); resume some first")
        self.names.add(name)
        self._save()
        return True

    def resume(self, name: bytes) -> bool:
        """Resume a service's queue; False when it was not paused."""
        if name not in self.names:
            return False
        self.names.discard(name)
        self._save()
        return True

    def labels(self) -> list[str]:
        return sorted(n.decode(errors="replace") for n in self.names)

    def _save(self) -> None:
        self.kept.write(KIND, self.labels())
