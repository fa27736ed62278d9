"""This broker's term: whether it serves, decided on the broker's own monotonic clock from what the lease
keeper (keeper.py) last heard, and fenced so that a broker cut off from the lease's engine stops before the
engine lets a standby take the lease (docs/failover.md).

Roles: `single` (no lease configured: always serves, as before), `standby` (alive, its ROUTER unbound: no
peer reaches it), `active` (holds the lease: its ROUTER bound), `deposed` (it held the lease and lost it: its
ROUTER is closed at once, which ends every peer's connection, and it never serves again in this process;
`zfab broker` exits so that a supervisor starts a fresh standby). The active broker serves only while its
last successful renewal, counted from when it was SENT, is younger than the duration minus a margin: the
engine computed the expiry after that moment, so the broker stops first. It is a Hook (hooks.py): its `tend`
wakes the loop at the fence, and nothing is checked per job.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import protocol as nfp
from ..core.keepalive import ANSWER_DELAY, Clock
from ..errors import ZfabError
from ..settings import Settings
from ..transport.base import Transport
from ..transport.wire import RECONNECT_MAX_MS
from .hooks import Hook
from .keeper import LeaseKeeper
from .lease import LeaseState, open_lease

if TYPE_CHECKING:
    from .requests import Requests
    from .workers import Workers

log = logging.getLogger(__name__)

SINGLE, STANDBY, ACTIVE, DEPOSED = "single", "standby", "active", "deposed"
# s after taking over during which resubmitted jobs wait, at least: workers that know several brokers reconnect
# as fast as the clients (at most 0.5 s apart, transport/wire.py), and a job's worker says it holds it in READY
# (docs/failover.md). A worker that knows one hears of a restart only when it next sends: see settle_for.
SETTLE = 1.0
READY_MARGIN = 0.5  # s from a worker's DISCONNECT to its READY here, with room to spare


def settle_for(s: Settings) -> float:
    """How long a broker's start settles: until its workers are back. A worker that knows one broker learns
    it restarted from the DISCONNECT its next frame gets: a keepalive, at most ANSWER_DELAY intervals after its
    last, which waits in its socket until the socket reconnects, at most RECONNECT_MAX_MS after the broker
    binds. It re-registers at once; READY_MARGIN covers that round trip. Never past a hold time: a worker
    silent that long has been given up, and reconnects on its own by then."""
    back = max(s.keepalive_interval * ANSWER_DELAY, RECONNECT_MAX_MS / 1000) + READY_MARGIN
    return max(SETTLE, min(back, s.keepalive_interval * s.keepalive_multiplier))


def fence_margin(duration: float) -> float:
    """How long before the engine's expiry the active broker stops: a fifth of the duration, at least 0.1 s
    (the loop's own lag and a renewal sent but not yet applied fit in it)."""
    return max(0.1, duration / 5)


def advertised(endpoint: str) -> str:
    """A broker's id in the lease: its endpoint, with a wildcard host made this host's name."""
    for wild in ("*", "0.0.0.0", "[::]"):
        if f"://{wild}:" in endpoint:
            return endpoint.replace(f"://{wild}:", f"://{socket.gethostname()}:")
    return endpoint


class Term(Hook):
    """Role, epoch and fence of one broker (owner thread only, except `hand_over`, the keeper's)."""

    def __init__(
        self,
        loop: Transport,
        clock: Clock,
        *,
        holder: str = "",
        duration: float = 1.5,
        renew: float = 0.3,
        keeper: Callable[[Term], LeaseKeeper] | None = None,
        grace: float = 0.0,
        takeover: Callable[[], None] | None = None,
        on_deposed: Callable[[], None] | None = None,
        settle: float = SETTLE,
    ) -> None:
        self.settle = settle  # s a start (or a takeover) holds resubmitted jobs and requests for workers not back
        self.loop, self.clock, self.holder, self.duration = loop, clock, holder, duration
        self.takeover = takeover  # on the keeper's thread, before a standby's first held answer reaches the loop
        self.on_deposed = on_deposed  # on the loop, once deposed: `zfab broker` exits on it
        self.margin, self.grace = fence_margin(duration), grace
        self.keeper = keeper(self) if keeper is not None else None
        self.role = STANDBY if self.keeper is not None else SINGLE
        self.epoch = 0  # the highest lease generation seen
        self.lease_holder = ""  # who held the lease at the last answer
        self.valid_until = -math.inf  # monotonic: the fence (active only)
        self.read_at: float | None = None  # monotonic: the last answer handed to the loop
        self.failovers = 0  # times this broker took the lease over from another term
        self.lease_errors = 0  # round trips that found the engine unreachable
        self.requests: Requests | None = None  # while its resubmitted jobs settle (bound)
        self.replay: Callable[[bytes, nfp.ClientRequest], None] = lambda sender, req: None

    @classmethod
    def from_settings(
        cls,
        s: Settings,
        loop: Transport,
        clock: Clock,
        endpoint: str,
        takeover: Callable[[], None] | None = None,
        on_deposed: Callable[[], None] | None = None,
    ) -> Term:
        url = s.broker_lease
        if not url:
            return cls(loop, clock, on_deposed=on_deposed, settle=settle_for(s))
        try:
            lease = open_lease(url, timeout=s.broker_lease_duration)
        except ValueError as exc:
            raise ZfabError(str(exc)) from None
        # A process's own holder id: a broker restarted under its endpoint is a new holder, which waits for
        # the lease like any standby and serves a new epoch, never its dead predecessor's term.
        holder = f"{advertised(endpoint)} (boot {os.urandom(4).hex()})"
        d, r = s.broker_lease_duration, s.broker_lease_renew
        if r >= d - fence_margin(d):
            raise ZfabError(f"ZFAB_BROKER_LEASE_RENEW ({r:g} s) must be well under the duration ({d:g} s)")

        def keeper(term: Term) -> LeaseKeeper:
            return LeaseKeeper(lease, holder, duration=d, renew=r, heard=term.hand_over, clock=clock)

        return cls(
            loop, clock, holder=holder, duration=d, renew=r, keeper=keeper, grace=s.broker_startup_grace,
            takeover=takeover, on_deposed=on_deposed, settle=settle_for(s),
        )  # fmt: skip

    @property
    def serving(self) -> bool:
        """Its ROUTER is bound: active, or the only broker."""
        return self.role is ACTIVE or self.role is SINGLE

    # ---- the keeper's thread ---------------------------------------------------------------------

    def hand_over(self, state: LeaseState | None, sent_at: float) -> None:
        """An answer, to the loop (a standby's unchanged answers only refresh the lease's age)."""
        if (
            state is not None
            and self.role is STANDBY
            and not state.held
            and state.epoch == self.epoch
            and state.holder == self.lease_holder
        ):
            return
        if state is not None and state.held and self.role is STANDBY and self.takeover is not None:
            self.takeover()  # what a user set, reread before this term serves (kept.reread; it blocks here)
        try:
            self.loop.submit(lambda: self.heard(state, sent_at))
        except ZfabError:  # shutting down, or the loop is swamped: the fence decides anyway
            pass

    # ---- the owner's thread -----------------------------------------------------------------------

    def heard(self, state: LeaseState | None, sent_at: float) -> None:
        now = self.clock()
        if state is None:
            self.lease_errors += 1
            return
        self.read_at = now
        self.lease_holder = state.holder
        self.epoch = max(self.epoch, state.epoch)
        if self.role is DEPOSED:
            return
        if state.held:
            self.valid_until = sent_at + self.duration - self.margin
            if self.role is STANDBY and now < self.valid_until:
                self.role = ACTIVE
                self.failovers += 1 if state.epoch > 1 else 0
                if self.keeper is not None:
                    self.keeper.release_on_stop = True
                log.warning("broker %s is active (lease epoch %d)", self.holder, state.epoch)
                self.loop.request_reconnect()  # a bound ROUTER (Broker.open_socket)
        elif self.role is ACTIVE:
            self.depose(f"the lease is held by {state.holder or 'nobody'} (epoch {state.epoch})")

    def bound(self, requests: Requests, workers: Workers, replay: Callable[[bytes, nfp.ClientRequest], None]) -> None:
        """The broker's ROUTER was opened: a standby that just became active gives the services' workers the
        startup grace again, as a restarted broker does (they are on their way from the old one). Either
        settles first: a job resubmitted (`known`) by a client that had no 202 naming its worker (results
        only) waits `settle` for that worker's READY `holds`, so that a broker restarted without a lease does
        not hand it to another worker to run a second time (a new job is never held)."""
        if self.role is ACTIVE:
            requests.grace_until = self.clock() + self.grace
            requests.epoch = self.epoch
            workers.keepalive_facts = nfp.keepalive_facts(self.epoch)
        if self.role is ACTIVE or self.role is SINGLE:
            requests.settle_until = self.clock() + self.settle
            self.requests, self.replay = requests, replay

    def tend(self, now: float) -> float | None:
        if self.role is SINGLE:
            return self._settle(now)
        if self.role is not ACTIVE:
            return None
        if now >= self.valid_until:
            since = now - (self.valid_until - self.duration + self.margin)
            self.depose(f"no renewal of the lease for {since:.2f} s (it expires {self.margin:.2f} s from now)")
            return None
        settling = self._settle(now)
        return self.valid_until if settling is None else min(settling, self.valid_until)

    def _settle(self, now: float) -> float | None:
        """Resubmitted jobs held until their workers said so: replayed once `settle` is over. When to look
        again, or None once settled."""
        if (req := self.requests) is None:
            return None
        if now < req.settle_until:
            return req.settle_until
        held, req.settling, req.settling_bytes, self.requests = req.settling, [], 0, None
        for sender, request in held:  # each as if it came now: to the worker that holds it, or admitted
            self.replay(sender, request)
        return None

    def depose(self, why: str) -> None:
        """Stop serving now and for good: the ROUTER closes (every peer's connection ends with it)."""
        log.error("broker %s stops serving: %s; exiting so that a fresh standby takes its place", self.holder, why)
        self.role = DEPOSED
        if self.keeper is not None:
            self.keeper.release_on_stop = False
            self.keeper.halt()
        self.loop.request_reconnect()  # an unbound ROUTER
        if self.on_deposed is not None:
            self.on_deposed()

    def start(self) -> None:
        if self.keeper is not None:
            self.keeper.start()

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()

    def figures(self) -> dict[str, Any]:
        """show_broker's role, epoch, lease_age, failovers, and the jobs a new term holds while it settles."""
        kept = self.keeper.last_read if self.keeper is not None else None
        read = max((t for t in (kept, self.read_at) if t is not None), default=None)
        age = None if read is None else round(max(0.0, self.clock() - read), 3)
        return {
            "role": self.role,
            "epoch": self.epoch,
            "lease_age": age,
            "failovers": self.failovers,
            "lease_errors": self.lease_errors,
            "lease_holder": self.lease_holder,
            "settling": len(req.settling) if (req := self.requests) is not None else 0,
            "settling_bytes": req.settling_bytes if req is not None else 0,
        }
