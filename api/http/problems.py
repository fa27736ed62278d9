"""Errors as RFC 9457 problem details (`application/problem+json`), and how fabric errors map onto HTTP.

Every error the API answers goes through here, including FastAPI's own 404/405/422, so a
client parses one error shape. Job outcomes (timeout, worker lost) are not HTTP errors: they
are a finished job with its final state and reason (see api/jobs/table.py). The exception the
other layers raise, `ProblemError`, lives in api/errors.py; this module is its HTTP face.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from zfab.errors import ZfabError

from ..errors import ProblemError, from_fabric_error
from ..models import Problem
from .routeindex import methods_at

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://zfab.dev/problems/"


class ProblemResponse(JSONResponse):
    media_type = MEDIA_TYPE


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> ProblemResponse:
    """A problem document; `extra` members (e.g. `job`, `errors`) go beside the standard ones."""
    body: dict[str, Any] = {"type": TYPE_BASE + slug, "title": title, "status": status, "detail": detail, **extra}
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


def json_position(doc: Any, pos: Any) -> tuple[int, int] | None:
    """Line and column (1-based, as json.JSONDecodeError counts them) of character `pos` in `doc`."""
    if not isinstance(pos, int) or pos < 0:
        return None
    text = doc.decode(errors="replace") if isinstance(doc, bytes | bytearray) else doc
    if not isinstance(text, str):
        return None
    pos = min(pos, len(text))
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def json_syntax_problem(exc: RequestValidationError) -> ProblemResponse | None:
    """400 naming the line and column of a body that is not JSON at all (FastAPI reports `body.<offset>`)."""
    for e in exc.errors():
        if e.get("type") != "json_invalid":
            continue
        loc = list(e.get("loc", ()))
        where = json_position(exc.body, loc[1] if len(loc) > 1 else None)
        reason = str((e.get("ctx") or {}).get("error") or e.get("msg") or "not JSON")
        at = f" at line {where[0]}, column {where[1]}" if where else ""
        return problem(400, "invalid-json", "Invalid JSON", f"invalid JSON{at}: {reason}")
    return None


# The names pydantic gives the members of a union in an error's location (`function-after[...]`,
# `constrained-str`, `none`, a model's class name): not fields, so not shown to the caller.
UNION_MEMBER = re.compile(r"^(?:[A-Z]\w*|[\w-]+\[.*\]|constrained-\w+|none|str|int|float|bool|list|dict)$")


def _validation_detail(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """One readable line naming each bad field (`body.timeout: ...`), plus the errors without their inputs."""
    clean: list[dict[str, Any]] = []
    for e in errors[:20]:
        loc = [str(p) for p in e.get("loc", ()) if not (isinstance(p, str) and UNION_MEMBER.match(p))]
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        entry = {"loc": loc, "field": ".".join(loc), "msg": msg, "type": str(e.get("type", ""))}
        if entry not in clean:
            clean.append(entry)
    # `field: Input should be None` only says the field is optional: noise beside the real reason.
    fields = {c["field"] for c in clean if c["type"] != "none_required"}
    clean = [c for c in clean if c["type"] != "none_required" or c["field"] not in fields]
    detail = "; ".join(f"{c['field']}: {c['msg']}" for c in clean) or "invalid request"
    return detail, clean


def install(app: FastAPI) -> None:
    """Answer every error with a problem document."""

    async def on_problem(request: Request, exc: Exception) -> ProblemResponse:
        p = cast(ProblemError, exc)
        return problem(p.status, p.slug, p.title, p.detail, p.headers, **p.extra)

    async def on_http(request: Request, exc: Exception) -> ProblemResponse:
        http = cast(StarletteHTTPException, exc)
        detail = http.detail if isinstance(http.detail, str) else str(http.detail)
        headers = dict(http.headers or {})
        if http.status_code == 404 and detail == "Not Found":
            detail = f"no route for {request.method} {request.url.path}; see /docs for the API"
        elif http.status_code == 405:
            # Starlette names only the methods of the first route matching the path; /jobs has two.
            allow = methods_at(request.app.router.routes, request.scope)
            headers["Allow"] = ", ".join(allow)
            detail = f"{request.method} is not served at {request.url.path}; it serves {', '.join(allow)}"
        elif http.status_code == 400 and detail == "There was an error parsing the body":
            detail = "the body could not be read as JSON: send UTF-8 encoded JSON"
        try:
            title = HTTPStatus(http.status_code).phrase
        except ValueError:
            title = "HTTP error"
        return problem(http.status_code, f"http-{http.status_code}", title, detail, headers)

    async def on_validation(request: Request, exc: Exception) -> ProblemResponse:
        invalid = cast(RequestValidationError, exc)
        syntax = json_syntax_problem(invalid)
        if syntax is not None:
            return syntax
        detail, errors = _validation_detail(list(invalid.errors()))
        return problem(422, "validation", "Invalid request", detail, errors=errors)

    async def on_fabric(request: Request, exc: Exception) -> ProblemResponse:
        p = from_fabric_error(cast(ZfabError, exc))
        return problem(p.status, p.slug, p.title, p.detail, p.headers, **p.extra)

    async def on_crash(request: Request, exc: Exception) -> ProblemResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem(500, "internal", "Internal error", "the API failed to handle the request; see its log")

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(Exception, on_crash)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(ZfabError, on_fabric)


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problem responses a route may give."""
    text = {
        400: "The fabric rejected the request (unknown task, bad arguments), or the body is not JSON "
        "(`detail` names the line and column)",
        401: "Missing or wrong bearer token",
        403: "No token configured and the client is not on loopback, or a browser's request from another origin",
        404: "Not found",
        409: "Conflicts with the job's state: it already finished, or its Idempotency-Key was used for another request",
        413: "Request body too large",
        415: "The body is not `application/json`",
        422: "Invalid request: `detail` names each bad field",
        429: "The caller holds its share of the jobs in flight (ZFAB_API_CALLER_SHARE; `bound` names which); "
        "retry after `Retry-After` seconds",
        503: "The fabric is unreachable, full, or has no live worker; retry after `Retry-After` seconds",
        504: "The fabric did not answer in time",
    }
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {
            "description": text[code],
            "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if code in (429, 503):
            entry["headers"] = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "string"}}}
        if code == 401:
            entry["headers"] = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
        out[code] = entry
    return out


def add_problem_schema(openapi: dict[str, Any]) -> None:
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    # Every route with a JSON body answers 415 for another media type (ContentTypeMiddleware), and 400
    # for a body that is not JSON at all (on_validation).
    syntax = {**responses(400)[400], "description": "The body is not valid JSON: `detail` names the line and column"}
    for ops in openapi.get("paths", {}).values():
        for op in ops.values():
            if isinstance(op, dict) and "requestBody" in op:
                answers = op.setdefault("responses", {})
                answers.setdefault("400", syntax)
                answers.setdefault("415", responses(415)[415])
