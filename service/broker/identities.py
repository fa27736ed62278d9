"""Who a frame comes from under CURVE: an identity belongs to the key that first used it.

Without CURVE (no ZAP handler) every check passes: there is no key to bind to. Under CURVE the
ROUTER identity of each frame is bound to the ZAP user id (the key) of the first frame that used it
(bounded, least recently used forgotten), a job's answers follow only the key that submitted it,
a worker name registers only with a key issued for it (transport/security.py), and each key does only
what its grant allows (core/access.py: the access file's entry, or its certificate's default): `may`,
a dict lookup per request on grants made when the keys or the access file were read.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..core.access import AccessFile, Grant, GrantBox, needed_role
from ..transport.base import Transport
from ..transport.security import ZapHandler


class Identities:
    """The CURVE bindings of identities, job owners and worker names (all pass without CURVE)."""

    KEYS_MAX = 100_000  # identities bound to the CURVE key that first used them

    def __init__(self, loop: Transport, zap: ZapHandler | None) -> None:
        self.loop = loop
        self.zap = zap
        self.keys: OrderedDict[bytes, bytes] = OrderedDict()  # identity -> ZAP user id of its first frame
        self.grants = GrantBox()  # each key's grant, for the event publisher's thread (core/access.py)

    def start_zap(self, secret: str | None, clients: Any, access_file: str | None = None) -> None:
        """Under CURVE (a secret): the ZAP handler that names each connection's key (transport/security.py),
        with the keys' entries of the access file (ZFAB_ACCESS_FILE) when one is set. It keeps `grants` (the
        box the event publisher reads each subscription's key in) up to date."""
        if secret:
            access = AccessFile(access_file) if access_file else None
            self.zap = ZapHandler(self.loop.context, clients, access, box=self.grants)
            self.zap.start()

    def may(self, action: str, service: bytes | None) -> bool:
        """May this frame's key do `action` (core/access.py) on `service` (None: no service named)?
        True without CURVE."""
        if self.zap is None:
            return True
        grant = self.zap.grants.get(self.loop.user_id or b"")
        if grant is None or action not in grant.actions:
            return False
        return service is None or grant.everywhere or grant.sees(service.decode(errors="replace"))

    def grant(self) -> Grant | None:
        """This frame's key's grant (None without CURVE: everything is allowed)."""
        return self.zap.grants.get(self.loop.user_id or b"") if self.zap is not None else None

    def refusal(self, action: str, service: bytes | None) -> str | None:
        """Why this frame's key may not do `action` on `service` (None: it may)."""
        if self.may(action, service):
            return None
        grant = self.zap.grants.get(self.loop.user_id or b"") if self.zap is not None else None
        if grant is None:
            return "this connection's key has no grant"
        if not grant.client:
            return f"key {grant.name} is a worker key: it registers services and does not act as a client"
        if action not in grant.actions:
            return f"{action} needs the role {needed_role(action)}; key {grant.name} is a {grant.role}"
        return f"service {(service or b'').decode(errors='replace')!r} is outside the scope of key {grant.name}"

    def stop_zap(self) -> None:
        if self.zap is not None:
            self.zap.stop()

    def same_key(self, sender: bytes) -> bool:
        """The frame's key is the one its identity was first used with (True without CURVE)."""
        if self.zap is None:
            return True
        user = self.loop.user_id or b""
        bound = self.keys.get(sender)
        if bound is None:
            self.keys[sender] = user
            if len(self.keys) > self.KEYS_MAX:
                self.keys.popitem(last=False)
            return True
        self.keys.move_to_end(sender)
        return bound == user

    def owns(self, job: Any) -> bool:
        """May the sender of this frame take over the job's answers? Under CURVE only with the key
        that submitted it (another key could otherwise divert a job's results)."""
        return self.zap is None or job.client_key == self.loop.user_id

    def sent_by_key_of(self, ident: bytes) -> bool:
        """This frame comes with the key that `ident` was bound to (True without CURVE)."""
        return self.zap is None or self.keys.get(ident) == self.loop.user_id

    def may_register(self, name: bytes, service: bytes | None = None) -> bool:
        """A READY under `name` comes with a key issued for that worker name, whose entry lets it register
        `service` (True without CURVE)."""
        return self.zap is None or self.zap.may_register(name, self.loop.user_id, service)

    def figures(self) -> dict[str, Any]:
        return {"identities_bound": len(self.keys), "identities_capacity": self.KEYS_MAX}
