"""Bearer-token auth for the job and MMI routes.

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

from ..errors import ProblemError

bearer = HTTPBearer(auto_error=False, description="A token from ZFAB_API_TOKENS", scheme_name="bearer")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenSet:
    """The accepted tokens, as digests."""

    def __init__(self, tokens: list[str]) -> None:
        self._digests = [_digest(t) for t in tokens if t]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def check(self, token: str) -> str | None:
        """The caller's principal (a short digest, safe to log and to scope by) when the token is valid."""
        d = _digest(token)
        ok = False
        for known in self._digests:  # no early exit: every check costs the same
            ok |= hmac.compare_digest(d, known)
        return _principal(d) if ok else None

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
    """The caller's principal ('' for trusted loopback without tokens); 401/403 problems otherwise.
    The one rule, for the documented routes (require_auth) and the lean POST /jobs (api/http/lean.py)."""
    if not tokens:
        if not is_loopback_ip(peer):
            raise ProblemError(
                403,
                "forbidden",
                "Forbidden",
                "no API token is configured, so only loopback clients are served; set ZFAB_API_TOKENS",
            )
        return ""
    if token is None:
        raise _unauthorized("send 'Authorization: Bearer <token>' (a token from ZFAB_API_TOKENS)")
    principal = tokens.check(token)
    if principal is None:
        raise _unauthorized("the bearer token is not valid", "invalid_token")
    return principal


async def require_auth(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """The caller's principal ('' for trusted loopback without tokens); 401/403 problems otherwise."""
    peer = request.client.host if request.client else None
    return principal_of(request.app.state.tokens, peer, creds.credentials if creds is not None else None)


Principal = Annotated[str, Depends(require_auth)]
