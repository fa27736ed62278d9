"""The broker role: owns the ROUTER socket through one mediate loop. `broker` routes (named after
the spec: process_client, process_worker, dispatch, forward, tend_workers), `registry` holds the
tables and routing decisions (pure), `mmi` answers the management interface from a narrow view."""

from .broker import Broker

__all__ = ["Broker"]
