"""What a client knows of its broker: alive (answered within its hold time), which incarnation (its
boot), on which host (its shared-memory host id) and with which message limit, from the broker's
keepalive answers; when a silent broker is worth a new connection. Pure: the clock is injected."""

from __future__ import annotations

from enum import IntEnum

from ..core import protocol as nfp
from ..core import shmhandle, sizes
from ..core.keepalive import Clock, KeepAlive
from ..settings import Settings
from .clientjob import object_of


class News(IntEnum):
    """What a message from the broker says of the broker itself."""

    NONE = 0  #: the broker as it was
    RETURNED = 1  #: heard again after a silence past its hold time: its jobs are re-established
    RESTARTED = 2  #: a new incarnation (another boot): it never saw the jobs
    DEPOSED = 3  #: its term is older than one already seen (docs/failover.md): leave it


class BrokerLink:
    """The broker as the client's keepalives and its answers show it."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.keepalive = KeepAlive(settings.keepalive_interval, settings.keepalive_multiplier, clock, answering=True)
        self.seen = False  # heard at least once (before that, silence is no outage)
        self.boot: str | None = None  # the broker's incarnation (a zfab broker's keepalive answers say it)
        self.host: str | None = None  # its shared-memory host id
        self.limit: int | None = None  # its ZFAB_MAX_MESSAGE_BYTES
        self.reconnect_at = 0.0  # monotonic: no new connection before this (one per hold time)
        self.connected = True  # several brokers: a connection is up (transport/links.py); one: always
        self.epoch = 0  # the highest lease generation a broker's keepalive answer said (docs/failover.md)
        self.bundle = False  # its keepalive answers say it reads bundles (transport/bundle.py)

    @property
    def alive(self) -> bool:
        """True while the broker answered within its hold time."""
        return self.seen and self.connected and self.keepalive.is_alive()

    def lost(self) -> None:
        """No connection to any broker is up (several brokers): not alive until one answers again."""
        self.connected = False

    def heard(self, reply: nfp.BrokerReply) -> News:
        """A message from the broker came: it is alive, and perhaps back or new."""
        back = self.seen and not self.keepalive.is_alive()  # the first contact is no return
        self.seen = True
        if reply.command != nfp.KEEPALIVE:
            self.keepalive.heard(keepalive=False)
            return News.RETURNED if back else News.NONE
        self.keepalive.heard(keepalive=True)
        said = object_of(reply.payload)
        boot = said.get("boot")
        self.bundle = isinstance(boot, str) and said.get("bundle") == 1
        if not isinstance(boot, str):
            return News.RETURNED if back else News.NONE  # a NorFab broker's answers carry nothing
        epoch = said.get("epoch")
        if isinstance(epoch, int) and epoch < self.epoch:
            return News.DEPOSED  # a deposed broker still answering (a partition): its boot is not taken
        self.epoch = max(self.epoch, epoch) if isinstance(epoch, int) else self.epoch
        restarted = self.boot is not None and boot != self.boot
        self.boot = boot
        self.host = shmhandle.check_host(said.get("host"))
        self.limit = sizes.advertised_limit(said.get("max"))
        if restarted:
            return News.RESTARTED
        return News.RETURNED if back else News.NONE

    def reconnect_due(self, now: float) -> bool:
        """Silent past its hold time, and no new connection tried within the last one: try one now."""
        ka = self.keepalive
        if self.seen and ka.expired() and now >= self.reconnect_at:
            self.reconnect_at = now + ka.hold_time
            return True
        return False
