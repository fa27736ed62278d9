"""The broker role: owns the ROUTER socket through one mediate loop. `broker` is the mediator (process_client,
process_worker, POST de-duplication, on_timer as Majordomo's mediate()); its parts (workers, requests,
dispatch, deadlines, replies, mmi) return what it must do; what cuts across is hooks (docs/architecture.md)."""

from .broker import Broker

__all__ = ["Broker"]
