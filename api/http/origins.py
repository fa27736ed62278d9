"""Which hosts the API answers to, and which pages may change something through it.

With no token configured the API trusts any loopback peer, and a browser is one: a page from any
origin can send it simple requests (form posts, `fetch` in `no-cors` mode), and a page whose name
an attacker re-points at 127.0.0.1 (DNS rebinding) is even same-origin with it. Two rules close
both, whatever the token setting (with tokens on, auth stays bearer-only, never a cookie):

- **Host.** A request is served only when its `Host` names the API: an IP address (an address is
  not a name DNS can re-point, so a page at http://127.0.0.1:PORT is the API's own), or a name in
  ZFAB_API_HOSTS (`localhost` by default; `.example.com` for a domain and its subdomains; `*` for
  any), on any port. Anything else is a 400 naming the setting. /healthz and /readyz answer any
  Host: probes address the process by whatever name or address reaches it, and say nothing.
- **Origin.** A state-changing request (POST, PUT, PATCH, DELETE) that a browser marks as sent by
  another origin is a 403: `Sec-Fetch-Site: cross-site` or `same-site`, or an `Origin` whose
  host and port are not the request's own `Host` (nor in ZFAB_API_ORIGINS). Programs send neither
  header and are served as before.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from zfab import BoundedLRU

from .problems import problem

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ANY_HOST_PATHS = frozenset({"/healthz", "/readyz"})
FOREIGN_SITES = frozenset({b"cross-site", b"same-site"})
DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}
MAX_KNOWN_HOSTS = 256  # Host values remembered with their verdict (the oldest go first)


def split_host(value: str) -> tuple[str, str]:
    """(`host` lower-case, without a trailing dot and with IPv6 brackets kept, `port` or '')."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        host, rest = (value[: end + 1], value[end + 1 :]) if end > 0 else (value, "")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = value.partition(":")
    return host.rstrip("."), port


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return False
    return True


class HostRule:
    """The names ZFAB_API_HOSTS lists: exact names, `.suffix` (a domain and its subdomains), `*`."""

    def __init__(self, names: Iterable[str]) -> None:
        listed = [split_host(n)[0] for n in names if n.strip()]
        self.any = "*" in listed
        self.names = frozenset(n for n in listed if not n.startswith("."))
        self.suffixes = tuple(n for n in listed if n.startswith("."))
        self._known: BoundedLRU[bytes, bool] = BoundedLRU(max_count=MAX_KNOWN_HOSTS)  # Host values come from callers

    def serves(self, raw: bytes) -> bool:
        verdict = self._known.get(raw)
        if verdict is None:
            verdict = self._judge(raw.decode("latin-1"))
            self._known.put(raw, verdict)
            self._known.shed()
        return verdict

    def _judge(self, value: str) -> bool:
        host, port = split_host(value)
        if not host or (port and not port.isdigit()):
            return False
        if self.any or is_address(host) or host in self.names:
            return True
        return any(host.endswith(s) or host == s[1:] for s in self.suffixes)


def origin_netloc(origin: str) -> str | None:
    """`host[:port]` of an Origin header (the scheme's default port left out); None if it is no origin."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or not rest or "/" in rest:
        return None
    host, port = split_host(rest)
    if not host or (port and not port.isdigit()):
        return None
    return host if not port or DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"


def host_netloc(value: str, scheme: str) -> str:
    host, port = split_host(value)
    return host if not port or DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"


class OriginGuardMiddleware:
    """The two rules above, before anything else reads the request (pure ASGI: one pass over the headers)."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str], origins: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = HostRule(hosts)
        self.origins = frozenset(n for o in origins if (n := origin_netloc(o)) is not None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = site = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                site = value
        if host is not None and not self.hosts.serves(host) and scope["path"] not in ANY_HOST_PATHS:
            shown = host.decode("latin-1")[:100]
            response = problem(
                400,
                "host-not-served",
                "Host not served",
                f"this API does not answer to Host '{shown}': it serves IP addresses and the names in "
                "ZFAB_API_HOSTS (a page whose name points at the API is refused; add the name the API "
                "is reached by there)",
            )
            await response(scope, receive, send)
            return
        if scope["method"] in STATE_CHANGING and (origin is not None or site is not None):
            why = self._foreign(scope, host, origin, site)
            if why is not None:
                response = problem(403, "cross-origin", "Cross-origin request refused", why)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _foreign(self, scope: Scope, host: bytes | None, origin: bytes | None, site: bytes | None) -> str | None:
        """Why a browser's state-changing request came from another origin; None when it did not."""
        netloc = origin_netloc(origin.decode("latin-1")) if origin is not None else None
        if netloc is not None and netloc in self.origins:
            return None
        method = scope["method"]
        if site is not None and site.lower() in FOREIGN_SITES:
            return (
                f"{method} {scope['path']} was sent by a page of another origin (Sec-Fetch-Site: "
                f"{site.decode('latin-1')}): only the API's own pages and programs may change anything "
                "(ZFAB_API_ORIGINS lists other origins to trust)"
            )
        if origin is None:
            return None
        own = host_netloc(host.decode("latin-1"), str(scope.get("scheme", "http"))) if host is not None else None
        if netloc is None or netloc != own:
            shown = origin.decode("latin-1")[:100]
            return (
                f"{method} {scope['path']} was sent by a page of origin '{shown}', not the API's own: "
                "only the API's own pages and programs may change anything (ZFAB_API_ORIGINS lists "
                "other origins to trust)"
            )
        return None
