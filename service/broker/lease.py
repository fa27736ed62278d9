"""Which broker of several is active: a lease held in an engine that already does consensus (PostgreSQL, a
Kubernetes Lease), never a vote among brokers (docs/failover.md).

`Lease` is the one shape every backend gives: `acquire_or_renew` is one round trip that takes the lease when
it is free or expired, renews it when this holder has it, and otherwise only reads it; the answer says who
holds it, its epoch (the lease's generation: +1 each time it is taken, so each term has its own) and how long
the engine will keep it. Round trips block, so they run on the lease keeper's thread (keeper.py), never on
the broker's loop. `open_lease` imports a backend only when its scheme is used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LeaseState:
    held: bool  # this broker holds the lease now
    epoch: int  # the lease's generation: +1 each time its holder changes; 0 = never held
    holder: str  # the holder's id ("" when none); a broker's id is its advertised endpoint
    expires_in: float  # seconds until the lease expires as this broker last read it (<= 0: expired)


class LeaseUnavailable(Exception):
    """The lease's engine could not be reached (or answered an error): nothing is known of the lease."""


class Lease(Protocol):
    def acquire_or_renew(self, holder: str, duration: float) -> LeaseState:
        """One round trip; raises LeaseUnavailable when the engine cannot be reached."""
        ...

    def release(self, holder: str) -> None:
        """Best effort, on a clean stop: the standby need not wait out the lease."""
        ...

    def close(self) -> None: ...


# scheme: (module, class), imported only when used (importlib: the backends import this module's names)
BACKENDS = {
    "postgresql": (".lease_pg", "PgLease"),
    "postgres": (".lease_pg", "PgLease"),
    "k8s": (".lease_k8s", "K8sLease"),
}


def open_lease(url: str, *, timeout: float) -> Lease:
    """The backend `url` names: postgresql://... (lease_pg.py) or k8s://NAMESPACE/NAME (lease_k8s.py).
    ValueError for any other scheme (a setting's mistake, said at start)."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in BACKENDS:
        known = ", ".join(f"{k}://" for k in BACKENDS)
        raise ValueError(f"ZFAB_BROKER_LEASE must start with one of {known}; got {scheme or url[:20]!r}")
    module, name = BACKENDS[scheme]
    backend: Lease = getattr(importlib.import_module(module, __package__), name)(url, timeout=timeout)
    return backend
