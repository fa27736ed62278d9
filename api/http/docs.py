"""/docs (Swagger UI) and /redoc (ReDoc) from assets packaged with the API, not from a CDN.

FastAPI's own pages load their JavaScript and CSS from a public CDN (and ReDoc its fonts from Google),
so they are blank on a host without internet. The assets come from PyPI's `fastapi-offline`, which
ships Swagger UI's bundle and CSS and ReDoc's standalone bundle (refreshed with each release); only its
static folder is used, served under STATIC_URL, through FastAPI's own get_swagger_ui_html and
get_redoc_html. No auth, as for FastAPI's pages: they show the OpenAPI schema, which is public too.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
STATIC_URL = "/docs/assets"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
# No other page may frame these (clickjacking: Swagger UI's "Try it out" sends real requests). Old
# browsers read X-Frame-Options, current ones the CSP directive, as the console's pages say it too.
NO_FRAMING = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}


def unframed(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(NO_FRAMING)
    return page


def assets_dir() -> Path:
    """fastapi-offline's static folder (an installed package's files: a real directory)."""
    return Path(str(files("fastapi_offline").joinpath("static")))


def install(app: FastAPI) -> None:
    """Serve /docs, /redoc and their assets (the app must be made with docs_url=None, redoc_url=None)."""
    app.mount(STATIC_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    # Swagger UI's validator badge is an image from validator.swagger.io: none offline.
    parameters = {"validatorUrl": None, **(app.swagger_ui_parameters or {})}

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return unframed(
            get_swagger_ui_html(
                openapi_url=f"{root}{openapi_url}",
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
                swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
                swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
                swagger_ui_parameters=parameters,
            )
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return unframed(get_swagger_ui_oauth2_redirect_html())

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return unframed(
            get_redoc_html(
                openapi_url=f"{root}{openapi_url}",
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
                with_google_fonts=False,
            )
        )
