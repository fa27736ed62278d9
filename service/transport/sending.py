"""The send path both socket owners share: OwnerLoop (a thread of its own) and AioLoop (an asyncio loop).

What differs between them is how they wait and wake; how a frame goes out on the owned socket, how a
drop is counted and logged, and how a queued follow-up call runs is the same, so it lives here once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from ..core.logbudget import LogBudget
from .base import Frames, LoopStats
from .wire import Wire

log = logging.getLogger(__name__)


class WireSender:
    """Mixed into an owner loop, which sets `name`, `stats`, `_wire` (None while no socket is open) and
    `_drop_log` (how often a drop is logged: a peer gone away drops every frame sent to it)."""

    name: str
    stats: LoopStats
    _wire: Wire | None
    _drop_log: LogBudget

    def _send(self, frames: Frames) -> bool | None:
        """The one send path: True when sent, False when the peer cannot take it now (HWM: the
        caller may retry), None when it was dropped for good (no socket, peer gone; counted)."""
        wire = self._wire
        if wire is None:
            self._dropped("socket closed")
            return None
        try:
            wire.send(frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            # EHOSTUNREACH from a ROUTER_MANDATORY socket: the peer has gone.
            self._dropped(str(exc))
            return None
        self.stats.sent += 1
        return True

    def _dropped(self, why: str) -> None:
        self.stats.send_dropped += 1
        held = self._drop_log.take()
        if held is not None:
            more = f", {held} of them not logged" if held else ""
            log.warning(
                "%s: dropped an outbound message (%d so far%s): %s", self.name, self.stats.send_dropped, more, why
            )

    def _send_item(self, item: Frames | tuple[Frames, Callable[[], None]]) -> bool:
        """A queued frame: False leaves it stalled (retried first); a dropped one still runs its follow-up."""
        frames, after = (item, None) if isinstance(item, list) else item
        if self._send(frames) is False:
            return False
        if after is not None:
            self._run_call(after)
        return True

    def _run_call(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            self.stats.handler_errors += 1
            log.exception("%s: queued call failed", self.name)
