"""What the broker's parts send through: one narrow sender, given to each part at construction.

Frames go straight to the ROUTER (the owner loop's `send_now`: owner-direct, never queued); a send
libzmq refuses (an unroutable peer, with ROUTER_MANDATORY) is counted, not raised. `reply` is the
broker's own answer to a client (dispatched, queued, expired, cancelled, lost, refused), which its
`replied` hooks hear of (hooks.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..core import protocol as nfp
from ..transport.base import Frames, Transport
from .hooks import Hooks


class Outbox:
    """Sends for the broker's parts: `send(frames)` and `reply(client, service, uuid, status, payload)`."""

    def __init__(self, loop: Transport, hooks: Hooks, counts: Counter[str]) -> None:
        self.send_now = loop.send_now
        self.replied = hooks.replied
        self.counts = counts

    def send(self, frames: Frames) -> None:
        if not self.send_now(frames):
            self.counts["send_failed"] += 1

    def reply(self, client: bytes, service: bytes, uuid: bytes, status: bytes, payload: Any) -> None:
        for h in self.replied:
            h(uuid, status)
        if not self.send_now(nfp.broker_reply(client, nfp.RESPONSE, service, uuid, status, nfp.dumps(payload))):
            self.counts["send_failed"] += 1
