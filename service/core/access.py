"""Who may do what: the role table, and the access file that gives each bearer token and each CURVE key
its role, service scope and payloads flag.

Pure (no sockets, no threads, no HTTP): the API enforces it on every route (api/http/auth.py) and the
broker on every client frame, MMI command and event subscription of a CURVE key (broker/identities.py,
requests.py, mmi.py, events.py), from this one table; docs/roles.md says it for people. The access file is TOML
(ZFAB_ACCESS_FILE), read again when it changes (`AccessFile.current`, at most once a second), as the
broker's CURVE key directory is:

    [[token]]
    name = "alice"                       # who, in the audit log
    sha256 = "9f86d0..."                 # hex sha256 of the token (the token itself is never stored)
    role = "operator"                    # viewer | operator | admin
    scope = ["demo", "net-*"]            # service patterns (fnmatch); omitted = every service
    payloads = false                     # hide jobs' arguments and results (default true: shown)

    [[key]]
    name = "w1"                          # a certificate's name in ZFAB_CURVE_CLIENTS (its file stem)
    register = ["demo"]                  # a worker key: the services it may register
    client = false                       # may it also act as a client (role and scope below)?
    role = "viewer"
    scope = ["demo"]
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import time
import tomllib
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

ROLES = ("viewer", "operator", "admin")  # each can do what the one before it can, and more

# THE ROLE TABLE: each action and the least role that may do it.
ACTIONS: dict[str, str] = {
    "read": "viewer",  # jobs, queues, workers, schedules, events, MMI reads
    "submit": "operator",  # POST /jobs, a client's POST frame
    "cancel": "operator",  # DELETE /jobs/{uuid}, a client's DELETE frame
    "retry": "operator",  # POST /jobs/{uuid}/retry
    "answer": "operator",  # the input a waiting job asks for
    "schedule": "operator",  # create, change and delete schedules
    "pause": "admin",  # pause and resume a service's queue
    "limits": "admin",  # set and clear a task's run-time limits
    "audit": "admin",  # read the audit log
}

# Every HTTP route behind auth, by (method, path template), and its action. A route missing here is
# refused (403) to everyone, and tests/unit/test_access_table.py fails: the table and the code cannot drift.
HTTP_ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/jobs"): "submit",
    ("GET", "/jobs"): "read",
    ("GET", "/jobs/{uuid}"): "read",
    ("DELETE", "/jobs/{uuid}"): "cancel",
    ("POST", "/jobs/{uuid}/retry"): "retry",
    ("GET", "/jobs/{uuid}/events"): "read",
    ("POST", "/jobs/{uuid}/input"): "answer",
    ("GET", "/events"): "read",
    ("HEAD", "/files/{service}/{path:path}"): "read",
    ("GET", "/files/{service}/{path:path}"): "read",
    ("GET", "/mmi/broker"): "read",
    ("GET", "/mmi/workers"): "read",
    ("GET", "/mmi/services"): "read",
    ("GET", "/mmi/services/{service}/tasks"): "read",
    ("POST", "/mmi/services/{service}/pause"): "pause",
    ("POST", "/mmi/services/{service}/resume"): "pause",
    ("GET", "/mmi/limits"): "read",
    ("PUT", "/mmi/services/{service}/tasks/{task}/limits"): "limits",
    ("DELETE", "/mmi/services/{service}/tasks/{task}/limits"): "limits",
    ("POST", "/schedules"): "schedule",
    ("GET", "/schedules"): "read",
    ("GET", "/schedules/{sid}"): "read",
    ("PATCH", "/schedules/{sid}"): "schedule",
    ("DELETE", "/schedules/{sid}"): "schedule",
    ("GET", "/ui/api/jobs/{uuid}/request"): "read",
    ("GET", "/audit"): "audit",
    ("GET", "/me"): "read",
}

# Every MMI command a client may send the broker, and its action (the broker refuses the rest as unknown).
MMI_COMMANDS: dict[str, str] = {
    "show_workers": "read",
    "show_broker": "read",
    "show_services": "read",
    "show_tasks": "read",
    "show_limits": "read",
    "show_clients": "read",
    "get_status": "read",
    "get_stats": "read",
    "show_broker_version": "read",
    "show_broker_inventory": "read",
    "pause_service": "pause",
    "resume_service": "pause",
    "set_limit": "limits",
    "clear_limit": "limits",
    "show_audit": "audit",  # the broker's log of state-changing MMI commands (broker/mmiaudit.py)
}

# What a client's NFP frames do (the broker's check per frame: a lookup in Grant.actions).
FRAME_ACTIONS: dict[bytes, str] = {b"POST": "submit", b"DELETE": "cancel", b"PUT": "answer", b"GET": "read"}

ALL = ("*",)


def role_allows(role: str, action: str) -> bool:
    """May `role` do `action` (the table's rule: its least role, or a later one)?"""
    need = ACTIONS.get(action)
    return need is not None and role in ROLES and ROLES.index(role) >= ROLES.index(need)


def needed_role(action: str) -> str:
    return ACTIONS.get(action, "admin")


@dataclass(frozen=True, slots=True)
class Grant:
    """What one credential may do: its role's actions, the services it sees, whether it sees payloads;
    for a worker key, the services it may register and whether it may act as a client at all."""

    name: str
    role: str
    scope: tuple[str, ...] = ALL
    payloads: bool = True
    register: tuple[str, ...] = ()
    client: bool = True
    actions: frozenset[str] = field(default=frozenset(), compare=False)
    _seen: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, name: str, role: str, **kw: Any) -> Grant:
        client = kw.get("client", True)
        acts = frozenset(a for a in ACTIONS if client and role_allows(role, a))
        return cls(name, role, actions=acts, **kw)

    def allows(self, action: str) -> bool:
        return action in self.actions

    @property
    def everywhere(self) -> bool:
        return self.scope == ALL

    def sees(self, service: str) -> bool:
        """Is `service` in this credential's scope? Cached per name (bounded), so a check per job is a lookup."""
        hit = self._seen.get(service)
        if hit is None:
            hit = matches(self.scope, service)
            if len(self._seen) < 4096:
                self._seen[service] = hit
        return hit

    def may_register(self, service: str) -> bool:
        return matches(self.register, service)


BROKER_NAMES = ("workers_purged", "paused_services")  # show_broker's fields keyed or listed by service name


def scoped_broker(grant: Grant, answer: dict[str, Any]) -> dict[str, Any]:
    """show_broker as a scoped credential sees it: its fields that name services keep only those in scope."""
    if grant.everywhere:
        return answer
    out = dict(answer)
    for key in BROKER_NAMES:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = {k: v for k, v in value.items() if grant.sees(str(k))}
        elif isinstance(value, list):
            out[key] = [v for v in value if grant.sees(str(v))]
    return out


class GrantBox:
    """Each CURVE key's grant, by its ZAP user id, as the broker's ZAP handler last made them; shared with the
    event publisher's thread, which reads `table` (None: no CURVE, every subscription as before)."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[bytes, Grant] | None = None


def may_subscribe(grant: Grant | None, prefix: bytes) -> bool:
    """May a key subscribe to the broker's events under `prefix`? With `read`, and for a scoped key only a
    prefix that names a whole service in its scope (`job.demo.`: the service part ends with a dot), so
    that no topic of another service can match it."""
    if grant is None or "read" not in grant.actions:
        return False
    if grant.everywhere:
        return True
    parts = prefix.decode(errors="replace").split(".", 2)
    return len(parts) == 3 and grant.sees(parts[1])


def topic_service(topic: str) -> str:
    """The service a broker event's topic names: its second part (`job.<service>.<task>.<state>`, ...)."""
    parts = topic.split(".", 2)
    return parts[1] if len(parts) > 1 else ""


def matches(patterns: tuple[str, ...], name: str) -> bool:
    return any(p == "*" or p == name or fnmatch.fnmatchcase(name, p) for p in patterns)


# Anonymous loopback mode (no tokens, no access file) and ZFAB_API_TOKENS' tokens: everything, as before.
ANONYMOUS = Grant.of("anonymous", "admin")


class AccessError(ValueError):
    """The access file cannot be read or says something this module does not accept."""


@dataclass(frozen=True, slots=True)
class AccessTable:
    tokens: dict[bytes, Grant]  # sha256 digest of the token -> its grant
    keys: dict[str, Grant]  # CURVE certificate name -> its grant

    def token(self, digest: bytes) -> Grant | None:
        return self.tokens.get(digest)


def _strings(entry: dict[str, Any], key: str, default: tuple[str, ...], where: str) -> tuple[str, ...]:
    value = entry.get(key)
    if value is None:
        return default
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise AccessError(f"{where}: {key} must be a list of service patterns")
    return tuple(value)


def _role(entry: dict[str, Any], where: str, default: str) -> str:
    role = entry.get("role", default)
    if role not in ROLES:
        raise AccessError(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
    return str(role)


def parse(text: str) -> AccessTable:
    """The access file's TOML → its table; AccessError naming the entry at fault."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AccessError(f"not TOML: {exc}") from None
    tokens: dict[bytes, Grant] = {}
    keys: dict[str, Grant] = {}
    for i, entry in enumerate(doc.get("token", [])):
        where = f"token #{i + 1}"
        if not isinstance(entry, dict):
            raise AccessError(f"{where}: must be a table ([[token]])")
        digest = entry.get("sha256")
        try:
            raw = bytes.fromhex(str(digest))
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise AccessError(f"{where}: sha256 must be the 64 hex digits of the token's sha256")
        name = str(entry.get("name") or raw.hex()[:16])
        tokens[raw] = Grant.of(
            name,
            _role(entry, where, "viewer"),
            scope=_strings(entry, "scope", ALL, where),
            payloads=bool(entry.get("payloads", True)),
        )
    for i, entry in enumerate(doc.get("key", [])):
        where = f"key #{i + 1}"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise AccessError(f'{where}: needs the certificate\'s name (name = "...")')
        register = _strings(entry, "register", (), where)
        # A worker key (one that registers services) acts as a client only when its entry says so.
        client = bool(entry.get("client", not register))
        keys[entry["name"]] = Grant.of(
            entry["name"],
            _role(entry, where, "viewer"),
            scope=_strings(entry, "scope", ALL, where),
            payloads=bool(entry.get("payloads", True)),
            register=register,
            client=client,
        )
    return AccessTable(tokens, keys)


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class AccessFile:
    """The access file, read again when its mtime or size changes (looked at most once a RESCAN).
    A file that turns bad keeps the last good table (logged), so a typo locks nobody out."""

    RESCAN = 1.0

    def __init__(self, path: str) -> None:
        self.path = path
        self.reloads = 0
        self.errors = 0
        self._stamp: tuple[int, int] | None = None
        self._looked = 0.0
        self.table = self._read()  # the first read must succeed: AccessError otherwise

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _read(self) -> AccessTable:
        stamp = self._stat()
        try:
            with open(self.path, encoding="utf-8") as f:
                table = parse(f.read())
        except OSError as exc:
            raise AccessError(f"cannot read the access file {self.path}: {exc}") from None
        self._stamp = stamp
        return table

    def current(self, now: float | None = None) -> AccessTable:
        now = time.monotonic() if now is None else now
        if now - self._looked < self.RESCAN:
            return self.table
        self._looked = now
        if self._stat() == self._stamp:
            return self.table
        try:
            self.table = self._read()
            self.reloads += 1
            log.info("access file %s: %d tokens, %d keys", self.path, len(self.table.tokens), len(self.table.keys))
        except AccessError as exc:
            self.errors += 1
            self._stamp = self._stat()  # logged once per change, not once a second
            log.error("access file %s not reloaded (the last good one stays): %s", self.path, exc)
        return self.table
