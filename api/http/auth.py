"""Bearer-token auth and the role check for every route behind it.

A caller is a principal (a short digest of its token, '' for anonymous loopback) and a Grant (its role,
scope and payloads flag; zfab/core/access.py holds the role table). Tokens come from ZFAB_API_TOKENS
(each an admin, as every token could do everything before roles) and from the access file
(ZFAB_ACCESS_FILE, re-read when it changes). require_auth refuses a route the caller's role may not
use with a 403 naming the role it needs, and leaves the Grant in the request's scope for the scope
filters (`grant_of`, `in_scope`).

Only sha256 digests of the configured tokens are kept in memory, and they are compared with
hmac.compare_digest so the answer time does not tell how much of a guess was right. With no
token configured the API trusts loopback peers only. uvicorn takes the peer from
X-Forwarded-For when the request comes from 127.0.0.1 (its default), so a local reverse proxy
that sets the header passes the real peer on; one that does not makes every peer look local:
configure a token there.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import socket
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from zfab.core.access import ANONYMOUS, HTTP_ROUTES, AccessFile, Grant, needed_role

from ..errors import ProblemError

bearer = HTTPBearer(auto_error=False, description="A token from ZFAB_API_TOKENS", scheme_name="bearer")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenSet:
    """The accepted tokens, as digests: ZFAB_API_TOKENS' (admins) and the access file's (its grants)."""

    def __init__(self, tokens: list[str], access: AccessFile | None = None) -> None:
        self._digests = [_digest(t) for t in tokens if t]
        # Made once: a request finds its grant, it does not make one (POST /jobs is the API's hot path).
        self._admins = {d: Grant.of(_principal(d), "admin") for d in self._digests}
        self.access = access

    def __bool__(self) -> bool:
        return bool(self._digests) or self.access is not None

    def check(self, token: str) -> str | None:
        """The caller's principal (a short digest, safe to log and to scope by) when the token is valid."""
        found = self.grant(token)
        return found[0] if found is not None else None

    def grant(self, token: str) -> tuple[str, Grant] | None:
        """(principal, grant) when the token is valid."""
        d = _digest(token)
        ok = False
        for known in self._digests:  # no early exit: every check costs the same
            ok |= hmac.compare_digest(d, known)
        if ok:
            admin = self._admins[d]
            return admin.name, admin
        # A dict keyed by the token's sha256: its timing tells nothing of the token itself.
        entry = self.access.current().token(d) if self.access is not None else None
        return (_principal(d), entry) if entry is not None else None

    def principals(self) -> frozenset[str]:
        """The principals check() answers for these tokens."""
        return frozenset(_principal(d) for d in self._digests)


def _principal(digest: bytes) -> str:
    return digest.hex()[:16]


@functools.lru_cache(maxsize=4096)  # ipaddress parsing is slow for a per-request check
def is_loopback_ip(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """True when every address `host` resolves to is loopback (what run_api binds)."""
    if is_loopback_ip(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(is_loopback_ip(str(info[4][0])) for info in infos)


def _unauthorized(detail: str, error: str | None = None) -> ProblemError:
    challenge = 'Bearer realm="zfab"' + (f', error="{error}"' if error else "")
    return ProblemError(401, "unauthorized", "Unauthorized", detail, {"WWW-Authenticate": challenge})


def principal_of(tokens: TokenSet, peer: str | None, token: str | None) -> str:
    """The caller's principal ('' for trusted loopback without tokens); 401/403 problems otherwise."""
    return caller_of(tokens, peer, token)[0]


def caller_of(tokens: TokenSet, peer: str | None, token: str | None) -> tuple[str, Grant]:
    """The caller's principal ('' for trusted loopback without tokens) and grant; 401/403 problems otherwise.
    The one rule, for the documented routes (require_auth) and the lean POST /jobs (api/http/lean.py)."""
    if not tokens:
        if not is_loopback_ip(peer):
            raise ProblemError(
                403,
                "forbidden",
                "Forbidden",
                "no API token is configured, so only loopback clients are served; set ZFAB_API_TOKENS",
            )
        return "", ANONYMOUS
    if token is None:
        raise _unauthorized("send 'Authorization: Bearer <token>' (a token from ZFAB_API_TOKENS)")
    found = tokens.grant(token)
    if found is None:
        raise _unauthorized("the bearer token is not valid", "invalid_token")
    return found


GRANT = "zfab.grant"  # request scope key: the caller's Grant, once require_auth has run


def forbidden_role(grant: Grant, action: str, what: str) -> ProblemError:
    return ProblemError(
        403,
        "forbidden-role",
        "Forbidden",
        f"{what} needs the role {needed_role(action)}; this caller ({grant.name}) is a {grant.role}",
    )


def action_of(method: str, path: str) -> str | None:
    """The role table's action for a route (HEAD as its GET), None when the table has no entry."""
    action = HTTP_ROUTES.get((method, path))
    if action is None and method == "HEAD":
        action = HTTP_ROUTES.get(("GET", path))
    return action


def check_route(grant: Grant, method: str, path: str) -> None:
    """403 unless the caller's role may use this route; a route the table lacks is refused to all."""
    action = action_of(method, path)
    if action is None:
        raise ProblemError(
            403, "forbidden-role", "Forbidden", f"{method} {path} has no entry in the role table (zfab/core/access.py)"
        )
    if not grant.allows(action):
        raise forbidden_role(grant, action, f"{method} {path}")


async def require_auth(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """The caller's principal ('' for trusted loopback without tokens); 401/403 problems otherwise,
    403 when its role may not use this route."""
    peer = request.client.host if request.client else None
    principal, grant = caller_of(request.app.state.tokens, peer, creds.credentials if creds is not None else None)
    request.scope[GRANT] = grant  # before the role check: the audit log names who was refused too
    route = request.scope.get("route")
    if route is not None:
        check_route(grant, request.method, str(getattr(route, "path", "")))
    return principal


def grant_of(scope: Scope | Request) -> Grant:
    """The caller's grant (everything for a request require_auth did not see: anonymous loopback)."""
    s = scope.scope if isinstance(scope, Request) else scope
    grant: Grant = s.get(GRANT, ANONYMOUS)
    return grant


def in_scope(request: Request, service: str) -> bool:
    return grant_of(request).sees(service)


def not_found_outside(request: Request, service: str, uuid: str) -> None:
    """404 for a job of a service outside the caller's scope, as for a job that does not exist:
    a 403 would confirm it does."""
    if not grant_of(request).sees(service):
        raise ProblemError(404, "job-not-found", "Job not found", f"no job {uuid} here")


Principal = Annotated[str, Depends(require_auth)]
