"""The console's routes: `/` (to the console), its five pages, their assets, and what a job was
submitted with (for "submit again": GET /jobs/{uuid} shows its arguments, not the rest of its request).

Who is served follows the API's own rule (api/http/auth.py). With no token configured only loopback
peers get anything, the pages and assets included. With tokens the pages and assets are public, for
they carry no data: the pages' JavaScript asks for a token and sends it as the bearer token of
every request for data, each of which the API checks as it does any other.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from zfab import MAX_JOB_UUID

from ...errors import ProblemError
from ...jobs.arguments import arguments_of
from ...jobs.operations import known_job
from ..auth import Principal, caller_of, grant_of, not_found_outside
from ..state import api_state
from .pages import assets, render

# The pages' scripts and styles come from the API itself; data only through fetch() to the API.
# No inline script or style, so text from a job (a result, a reason) can never run as code.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
IMMUTABLE = "public, max-age=31536000, immutable"

JobUuid = Annotated[str, Path(description="The job's uuid", max_length=MAX_JOB_UUID)]


async def shell_access(request: Request) -> None:
    """No token configured: loopback peers only, as for every job and MMI route (403 otherwise)."""
    if not request.app.state.tokens:
        # The shell holds no data (its pages ask the API with the caller's token): no role to check.
        caller_of(request.app.state.tokens, request.client.host if request.client else None, None)


router = APIRouter(include_in_schema=False)
shell = APIRouter(prefix="/ui", include_in_schema=False, dependencies=[Depends(shell_access)])


def _root(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root


def _page(request: Request, view: str, job: str = "") -> HTMLResponse:
    return HTMLResponse(render(view, _root(request), job), headers=PAGE_HEADERS)


@router.get("/")
async def index(request: Request) -> Response:
    """A browser that opens the API's address lands on the console; the body links the rest."""
    root = _root(request)
    links = (
        f'<p>zfab: the <a href="{root}/ui">console</a>, the <a href="{root}/docs">API reference</a> '
        f'(<a href="{root}/openapi.json">OpenAPI</a>), <a href="{root}/healthz">health</a>, '
        f'<a href="{root}/metrics">metrics</a>.</p>'
    )
    return HTMLResponse(links, status_code=307, headers={"Location": f"{root}/ui"})


@shell.get("")
async def jobs_page(request: Request) -> HTMLResponse:
    return _page(request, "jobs")


@shell.get("/jobs/{uuid}")
async def job_page(request: Request, uuid: JobUuid) -> HTMLResponse:
    return _page(request, "job", uuid)


@shell.get("/queues")
async def queues_page(request: Request) -> HTMLResponse:
    return _page(request, "queues")


@shell.get("/workers")
async def workers_page(request: Request) -> HTMLResponse:
    return _page(request, "workers")


@shell.get("/schedules")
async def schedules_page(request: Request) -> HTMLResponse:
    return _page(request, "schedules")


@shell.get("/audit")
async def audit_page(request: Request) -> HTMLResponse:
    """The audit log (GET /audit: admins; anyone else's page says the API refused it)."""
    return _page(request, "audit")


@shell.get("/static/{name}")
async def asset(request: Request, name: Annotated[str, Path(max_length=64)]) -> Response:
    """A packaged asset. Pages name it with its version (?v=), so that URL may be cached for good."""
    found = assets().get(name)
    if found is None:
        raise ProblemError(404, "not-found", "Not found", f"the console has no file {name}")
    gzipped = "gzip" in request.headers.get("accept-encoding", "") and len(found.gzipped) < len(found.body)
    etag = f'"{found.version}{"-gz" if gzipped else ""}"'
    versioned = request.query_params.get("v") == found.version
    headers = {
        "ETag": etag,
        "Cache-Control": IMMUTABLE if versioned else "no-cache",
        "Vary": "Accept-Encoding",
        "X-Content-Type-Options": "nosniff",
    }
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    return Response(found.gzipped if gzipped else found.body, media_type=found.media_type, headers=headers)


@shell.get("/api/jobs/{uuid}/request")
async def job_request(request: Request, uuid: JobUuid, _: Principal) -> JSONResponse:
    """What the job was submitted with (the body of POST /jobs), for "submit again": its arguments as
    GET /jobs/{uuid} shows them, so a secret one (`@task(redact=...)`) is `***` here too and `redacted`
    names it, and none past GET's byte bound (`omitted` says why). 404 when the API does not hold it."""
    st = api_state(request)
    rec = await known_job(st, uuid)
    not_found_outside(request, rec.service, uuid)
    shown = await arguments_of(st, rec) if grant_of(request).payloads else None
    if rec.request is None or shown is None:
        raise ProblemError(404, "request-unknown", "Request not known", f"the API does not hold what job {uuid} asked")
    body = rec.request.model_dump(mode="json")
    body.update(args=shown.args, kwargs=shown.kwargs, redacted=shown.redacted, omitted=shown.omitted)
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


router.include_router(shell)
