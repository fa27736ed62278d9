"""The event publisher's subscription slots: bounded in all and per peer (pure; events.py owns the socket).

A peer is who ZAP says a subscription message comes from (its User-Id): one connection without CURVE
(the publisher names each afresh), one key under CURVE. A peer holds at most `per_peer` prefixes and
all peers together at most `total`, so one subscriber cannot take every slot (issue 38). The table
answers what the publisher's XPUB must do: subscribe the pipe or not, unsubscribe it or not.

libzmq (XPUB_MANUAL) unsubscribes a prefix on its own when the last pipe holding it closes, and that
message names no peer: no pipe holds the prefix any more, so every peer that held it lets it go. A
peer that left while others still held one of its prefixes is let go of it then, at the latest.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum

MAX_PREFIX = 256  # bytes of a subscription prefix


class Verdict(StrEnum):
    """What a subscription request comes to."""

    ACCEPTED = "accepted"  #: a new slot: subscribe the pipe, welcome it
    HELD = "held"  #: the peer holds it already (again, or another connection of its key): no new slot
    TOO_LONG = "too_long"  #: a prefix over MAX_PREFIX bytes
    PER_PEER = "per_peer"  #: the peer holds its share already
    TOO_MANY = "too_many"  #: every slot is taken

    @property
    def subscribes(self) -> bool:
        return self in (Verdict.ACCEPTED, Verdict.HELD)


class SubscriptionSlots:
    """Accepted prefixes, who holds each, and how many each peer holds (bounded by `total`)."""

    def __init__(self, *, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self.holders: dict[bytes, set[bytes]] = {}
        self.held: Counter[bytes] = Counter()  # per peer
        self.count = 0  # slots taken (the sum of `held`)

    def subscribe(self, prefix: bytes, peer: bytes) -> Verdict:
        holders = self.holders.get(prefix)
        if len(prefix) > MAX_PREFIX:
            return Verdict.TOO_LONG
        if holders is not None and peer in holders:
            return Verdict.HELD
        if self.held.get(peer, 0) >= self.per_peer:
            return Verdict.PER_PEER
        if self.count >= self.total:
            return Verdict.TOO_MANY
        self.holders.setdefault(prefix, set()).add(peer)
        self.held[peer] += 1
        self.count += 1
        return Verdict.ACCEPTED

    def unsubscribe(self, prefix: bytes, peer: bytes | None) -> bool:
        """A peer's UNSUBSCRIBE (True: unsubscribe its pipe), or with `peer` None libzmq's own for a
        prefix no pipe holds any more (False: libzmq did it already)."""
        holders = self.holders.get(prefix)
        if not holders or (peer is not None and peer not in holders):
            return False
        for who in [peer] if peer is not None else list(holders):
            holders.discard(who)
            self.held[who] -= 1
            if self.held[who] <= 0:
                del self.held[who]
            self.count -= 1
        if not holders:
            del self.holders[prefix]
        return peer is not None

    def prefixes(self) -> list[bytes]:
        return list(self.holders)
