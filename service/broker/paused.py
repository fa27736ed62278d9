"""Paused service queues: which services the broker admits and queues jobs for but does not dispatch.

The broker keeps no other state across a restart; this one it writes to a small JSON file in its
data directory (`$ZFAB_DATA_DIR/broker/paused.json`, replaced atomically on every change) and
reads when it starts, so a paused queue stays paused through a restart, before any worker of the
service registers again. A file that cannot be read pauses nothing (and says so in the log); one
that cannot be written leaves the change in memory only (logged, and counted in `show_broker`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..core.protocol import MAX_NAME_BYTES

log = logging.getLogger(__name__)

FILE_NAME = "paused.json"


class PausedServices:
    """The paused service names (bounded: at most `capacity`, each a name the broker accepts)."""

    def __init__(self, directory: Path | None, capacity: int) -> None:
        self.path = directory / FILE_NAME if directory is not None else None
        self.capacity = capacity
        self.names: set[bytes] = set()
        self.write_errors = 0

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return len(self.names)

    def load(self) -> None:
        """Read the paused services a previous broker left (nothing when there is no file)."""
        if self.path is None or not self.path.exists():
            return
        try:
            names = json.loads(self.path.read_text())
            if not isinstance(names, list):
                raise ValueError("not a JSON list of service names")
        except (OSError, ValueError) as exc:
            log.warning("broker: cannot read the paused services in %s (%s); no queue is paused", self.path, exc)
            return
        for name in names:
            raw = name.encode() if isinstance(name, str) else b""
            if raw and len(raw) <= MAX_NAME_BYTES and len(self.names) < self.capacity:
                self.names.add(raw)
        if self.names:
            log.warning("broker: paused services from %s: %s", self.path, ", ".join(self.labels()))

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
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("w") as f:
                json.dump(self.labels(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            self.write_errors += 1
            log.error(
                "broker: cannot write the paused services to %s (%s); a restart forgets the change", self.path, exc
            )
