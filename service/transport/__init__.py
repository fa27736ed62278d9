"""The single-owner loop shared by every role (on a thread of its own, or on an asyncio event loop:
aioloop.py), its wire helpers, the wake descriptor, CURVE/ZAP, and the stub transport roles are
unit-tested on. Imports only `core` and the shared settings."""

from .aioloop import AioLoop, AioTransport, wait_future
from .base import Frame, Frames, Item, LoopFactory, LoopStats, Role, Transport
from .loop import OwnerLoop
from .stub import FakeClock, StubLoop, StubTransport

__all__ = [
    "AioLoop",
    "AioTransport",
    "FakeClock",
    "Frame",
    "Frames",
    "Item",
    "LoopFactory",
    "LoopStats",
    "OwnerLoop",
    "Role",
    "StubLoop",
    "StubTransport",
    "Transport",
    "wait_future",
]
