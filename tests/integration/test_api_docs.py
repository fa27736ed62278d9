"""/docs and /redoc work on a host without internet: their pages name only the API's own URLs, and
every script, stylesheet and icon they load is served by the API itself (packaged assets, api/http/docs.py).

In-process (httpx over ASGI, no socket at all), so nothing here could reach a network if it tried.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from zfab.api.http.app import create_app
from zfab.api.http.docs import ASSETS, STATIC_URL
from zfab.api.settings import ApiSettings

pytestmark = pytest.mark.timeout(60)

LINK = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
URL = re.compile(r"""\bhttps?://[^\s"'<>]+""")
TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


async def fetch(paths: list[str]) -> dict[str, httpx.Response]:
    app = create_app(ApiSettings())  # no lifespan needed: the docs pages do not touch the fabric
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        return {p: await c.get(p) for p in paths}


def test_docs_and_redoc_load_only_packaged_assets() -> None:
    pages = asyncio.run(fetch(["/docs", "/redoc", "/docs/oauth2-redirect"]))
    linked: set[str] = set()
    for path, r in pages.items():
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
        assert URL.findall(r.text) == [], f"{path} names an outside URL"  # no CDN, no Google Fonts
        linked |= set(LINK.findall(r.text))
    assert "validatorUrl" in pages["/docs"].text  # Swagger UI's validator badge (an outside image) is off
    assert linked == {f"{STATIC_URL}/{name}" for name in ASSETS}, linked
    assets = asyncio.run(fetch([*sorted(linked), "/openapi.json"]))
    for path, r in assets.items():
        assert r.status_code == 200, path
        suffix = path[path.rfind(".") :]
        if suffix in TYPES:
            assert r.headers["content-type"].startswith(TYPES[suffix]), (path, r.headers["content-type"])
            assert len(r.content) > 1000, path
    assert b"SwaggerUIBundle" in assets[f"{STATIC_URL}/swagger-ui-bundle.js"].content
    assert b"Redoc" in assets[f"{STATIC_URL}/redoc.standalone.js"].content
    # The docs routes stay out of the API's own schema
    assert not [p for p in assets["/openapi.json"].json()["paths"] if p.startswith(("/docs", "/redoc"))]
