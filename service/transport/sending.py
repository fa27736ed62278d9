"""The send path both socket owners share: OwnerLoop (a thread of its own) and AioLoop (an asyncio loop).

What differs between them is how they wait and wake; how a frame goes out on the owned socket, how a
drop is counted and logged, how messages to a peer that reads bundles are gathered into one within a
step of the owner (bundle.py), and how a queued follow-up call runs is the same, so it lives here once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from ..core.logbudget import LogBudget
from ..core.lru import BoundedLRU
from .base import Frames, LoopStats
from .bundle import Pending
from .wire import Wire

log = logging.getLogger(__name__)


class WireSender:
    """Mixed into an owner loop, which sets `name`, `stats`, `_wire` (None while no socket is open),
    `_drop_log` (how often a drop is logged: a peer gone away drops every frame sent to it), `_stalled`
    and the bundling state: `_corking` (True within a step of the owner), `_bundled` (the peers that
    read bundles), `_pending` (what the step has for each of them) and `_skip` (routing frames in
    front of a message: 1 on a ROUTER, 0 on a DEALER)."""

    name: str
    stats: LoopStats
    _wire: Wire | None
    _drop_log: LogBudget
    _stalled: Frames | tuple[Frames, Callable[[], None]] | None
    _corking: bool
    _bundled: BoundedLRU[bytes, bool]
    _pending: dict[bytes, Pending]
    _skip: int

    def _send(self, frames: Frames) -> bool | None:
        """The one send path: True when sent (or gathered for a bundle the step sends at its end),
        False when the peer cannot take it now (HWM: the caller may retry), None when it was dropped
        for good (no socket, peer gone; counted)."""
        if self._corking and frames[0] in self._bundled:
            return self._cork(frames)
        return self._put(frames)

    def _cork(self, frames: Frames) -> bool | None:
        peer: bytes = frames[0]  # type: ignore[assignment]  # a peer in _bundled: an identity, small, so bytes
        pending = self._pending.get(peer)
        if pending is None:
            pending = self._pending[peer] = Pending()
        if not pending.add(frames, self._skip):
            self._flush_peer(peer)  # what came before it goes first
            if self._stalled is not None:
                return False  # it could not: this one waits behind it
            return self._put(frames)
        if pending.full():
            self._flush_peer(peer)
        return True

    def _flush(self) -> None:
        """The end of a step: what it gathered goes out, a bundle (or a lone message) per peer."""
        pending = self._pending
        while pending:
            self._flush_peer(next(iter(pending)))

    def _flush_peer(self, peer: bytes) -> None:
        pending = self._pending.pop(peer)
        count = pending.count
        if not count:
            return
        message = pending.message([peer] if self._skip else [])
        sent = self._put(message)
        if sent:
            if count > 1:
                self.stats.sent += count - 1
                self.stats.bundles_sent += 1
            return
        if sent is False and not self._skip and self._stalled is None:
            self._stalled = message  # a DEALER's one peer is slow: the bundle goes first once it can take it
            return
        # A ROUTER never waits on one peer (the others would wait too); a drop counts every message in it.
        self.stats.send_dropped += count - 1 if sent is None else count
        if sent is False:
            self._dropped_log("peer cannot take more (high-water mark)")

    def _put(self, frames: Frames) -> bool | None:
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
        self._dropped_log(why)

    def _dropped_log(self, why: str) -> None:
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
