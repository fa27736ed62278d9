"""A READY the broker refused because a live worker holds our name (docs/protocol.md, "names").

The worker does not spin: it waits (the broker's suggestion, doubled on each refusal in a row, at
most a hold time, with jitter) and tries again, so it takes the name over once its holder leaves.
The first refusal is logged, the ones after it are not, and the registration that ends them says
how many there were.
"""

from __future__ import annotations

import logging
import random

from ..core import protocol as nfp
from ..core.keepalive import KeepAlive

log = logging.getLogger(__name__)


class NameRefusals:
    """Owner: READYs refused in a row, and when to try again (None: not refused)."""

    def __init__(self, name: str, keepalive: KeepAlive) -> None:
        self.name = name
        self.keepalive = keepalive
        self.count = 0
        self.retry_at: float | None = None

    def refused(self, msg: nfp.BrokerControl) -> None:
        self.count += 1
        ka = self.keepalive
        base = msg.retry_after if msg.retry_after is not None else ka.interval
        wait = min(ka.hold_time, max(ka.interval, base) * 2 ** min(self.count - 1, 16))
        wait *= random.uniform(0.9, 1.1)  # two refused workers do not come back in step
        self.retry_at = ka.clock() + wait
        if self.count == 1:
            why = msg.detail or f"another worker is registered as {self.name}"
            log.warning(
                "worker %s: the broker refused it: %s. Trying again every %.0f s at most",
                self.name,
                why,
                ka.hold_time,
            )

    def registered(self) -> None:
        """The broker keeps us alive: registered, whatever came before."""
        if self.count:
            log.info("worker %s: registered with the broker (refused %d times before)", self.name, self.count)
            self.count = 0
