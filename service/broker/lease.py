"""Which broker is active: a lease held in an engine that already decides such things.

The shape every backend answers to (PostgreSQL, Kubernetes: lease_k8s.py). (This branch carries the
protocol only; the factory that picks a backend by the URL's scheme is the failover branch's.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The lease as this broker last read it."""

    held: bool  # this broker holds the lease now
    epoch: int  # the lease's generation: +1 each time its holder changes; 0 = never held
    holder: str  # the holder's id ("" when none); a broker's id is its advertised endpoint
    expires_in: float  # seconds until the lease expires as this broker last read it (<= 0: expired)


class LeaseUnavailable(Exception):
    """The lease's engine cannot be reached (or refuses us): nobody may assume they hold it."""


class Lease(Protocol):
    def acquire_or_renew(self, holder: str, duration: float) -> LeaseState: ...

    def release(self, holder: str) -> None: ...

    def close(self) -> None: ...
