"""`/files/{service}/{path}`: a file from a files-service worker, streamed to the HTTP caller.

The worker sends chunks under a credit window and the client grants one credit per chunk
taken from its FileStream. Chunks are taken here with `asyncio.to_thread`, one at a time,
only after the previous one was handed to the server: a slow HTTP reader slows the worker
down instead of filling the API's memory. The thread waits at most until the next chunk
arrives or the job ends; a caller that hangs up cancels the job at the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import PurePosixPath
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from zfab import MAX_NAME_BYTES, Client, FileStream
from zfab.errors import BadRequestError, JobTimeoutError, ZfabError

from ...errors import ProblemError, from_fabric_error
from ...fabric import await_result, wait_done
from ...models import MMI_SERVICE
from ..auth import Principal, grant_of
from ..problems import responses
from ..state import api_state

log = logging.getLogger(__name__)

DETAILS_TIMEOUT = 120.0  # file_details reads the whole file for its sha256
STREAM_TIMEOUT = 3600.0  # the whole transfer; a stalled reader fails sooner (the worker waits 60 s per credit)
CHUNK_SIZE = 256 * 1024
WINDOW = 8

router = APIRouter(prefix="/files", tags=["files"])


class FileTransferError(RuntimeError):
    """The transfer broke after the answer started: the connection is cut so the caller sees it."""


def refuse(status: int, slug: str, title: str, detail: str, **headers: str) -> ProblemError:
    return ProblemError(status, slug, title, detail, headers)


def check_service(service: str, request: Request) -> None:
    """404 for a name no files service can have (checked here, not in the schema: it counts UTF-8 bytes),
    or one outside the caller's scope."""
    if len(service.encode()) > MAX_NAME_BYTES or service == MMI_SERVICE or not grant_of(request).sees(service):
        raise refuse(404, "no-such-service", "No such files service", f"no files service can be named '{service}'")


def check_path(path: str) -> None:
    """Refuse what can never name a file under the service root, before asking a worker."""
    parts = PurePosixPath(path).parts
    if not path or "\0" in path or path.startswith("/") or ".." in parts:
        raise refuse(400, "path-refused", "Path refused", f"'{path}': give a path relative to the service root")


def failure_reason(entry: dict[str, Any]) -> str:
    """One line saying why a files task failed (its message, not its traceback)."""
    messages = [str(m) for m in entry.get("messages") or []]
    if messages:
        return messages[0]
    errors = [str(e) for e in entry.get("errors") or []]
    return errors[0].strip().splitlines()[-1] if errors and errors[0].strip() else "the task failed"


def refused_file(path: str, reason: str) -> ProblemError:
    if "does not exist" in reason:
        return refuse(404, "file-not-found", "File not found", reason)
    return refuse(400, "file-refused", "File refused", reason)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) of one `bytes=` range; None when absent or not one we serve (then all of it).

    Raises a 416 problem when the range is well formed but outside the file.
    """
    unit, _, spec = (header or "").partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or not dash or not (first.isdigit() or last.isdigit()):
        return None
    if (first and not first.isdigit()) or (last and not last.isdigit()):
        return None
    if not first:  # the last N bytes
        start, end = max(0, size - int(last)), size
        if int(last) == 0 or size == 0:
            start = size
    else:
        start, end = int(first), min(size, int(last) + 1) if last else size
        if last and int(last) < start:
            return None
    if start >= size:
        raise refuse(
            416,
            "range-not-satisfiable",
            "Range not satisfiable",
            f"the file has {size} bytes",
            **{"Content-Range": f"bytes */{size}"},
        )
    return start, end


async def file_details(client: Client, service: str, path: str) -> tuple[str, dict[str, Any]]:
    """(worker, its file_details answer: size, sha256, mtime), or the problem to answer."""
    try:
        fut = client.submit(service, "file_details", kwargs={"path": path}, timeout=DETAILS_TIMEOUT)
        result = await await_result(fut, DETAILS_TIMEOUT + 1.0)
    except BadRequestError as exc:
        raise refuse(400, "not-a-files-service", "Not a files service", f"service '{service}': {exc}") from None
    except TimeoutError:
        raise refuse(504, "timeout", "The fabric did not answer in time", f"no file_details from {service}") from None
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    ((worker, entry),) = result.items()
    if entry.get("failed") or not isinstance(entry.get("result"), dict):
        raise refused_file(path, failure_reason(entry))
    return str(worker), entry["result"]


def _next(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


def _entry(stream: FileStream) -> dict[str, Any]:
    """The worker's final answer of a finished stream (raises the job's error)."""
    result: dict[str, Any] = stream.future.result(0)
    ((_, entry),) = result.items()
    return dict(entry)


async def _body(
    client: Client, stream: FileStream, chunks: Iterator[bytes], first: bytes, length: int, sha256: str | None
) -> AsyncIterator[bytes]:
    """`length` bytes of the stream. With `sha256` (the rest of the file was asked for), the last chunk
    goes out only once the worker's final answer vouched for the file the headers described."""
    fut = stream.future
    sent = 0
    chunk_or_end: bytes | None = first
    try:
        while chunk_or_end is not None:
            chunk = chunk_or_end
            if sent + len(chunk) >= length:
                if sha256 is not None and not await _verified(stream, sha256):
                    raise FileTransferError(f"stream {fut.uuid}: the file changed during the download")
                yield chunk[: length - sent]
                return
            yield chunk
            sent += len(chunk)
            chunk_or_end = await asyncio.to_thread(_next, chunks)
        raise FileTransferError(f"stream {fut.uuid} ended after {sent} of {length} bytes")
    except (FileTransferError, ZfabError) as exc:
        log.warning("GET /files: %s; cutting the connection", exc)
        raise
    finally:
        if not fut.done():  # the caller hung up, or only part of the file was asked for
            try:
                client.cancel(fut.uuid)
            except ZfabError:
                pass


async def _verified(stream: FileStream, sha256: str) -> bool:
    """True when the worker's final answer has the sha256 the headers promised."""
    if not await wait_done(stream.future, 30.0):
        return False
    try:
        entry = _entry(stream)
    except Exception:
        return False
    return not entry.get("failed") and (entry.get("result") or {}).get("sha256") == sha256


FileService = Annotated[
    str, Path(min_length=1, max_length=MAX_NAME_BYTES, description="A service of files workers, e.g. `files`")
]
FilePath = Annotated[str, Path(max_length=4096, description="Path relative to the service's root")]


def file_headers(path: str, details: dict[str, Any]) -> dict[str, str]:
    sha256 = str(details["sha256"])
    return {
        "ETag": f'"{sha256}"',
        "X-Checksum-Sha256": sha256,
        "Accept-Ranges": "bytes",
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(PurePosixPath(path).name)}",
    }


@router.head(
    "/{service}/{path:path}",
    operation_id="file_headers",
    summary="A file's size and sha256, without its content",
    response_class=Response,
    responses={200: {"description": "The headers a GET would answer with"}, **responses(400, 401, 403, 404, 422, 503)},
)
async def head_file(service: FileService, path: FilePath, request: Request, _: Principal) -> Response:
    """What `GET` would answer, without the content: `Content-Length`, `ETag`, `X-Checksum-Sha256`."""
    st = api_state(request)
    check_service(service, request)
    check_path(path)
    _, details = await file_details(st.client, service, path)
    headers = file_headers(path, details) | {"Content-Length": str(int(details["size"]))}
    return Response(headers=headers, media_type="application/octet-stream")


@router.get(
    "/{service}/{path:path}",
    operation_id="download_file",
    summary="Download a file from a files-service worker",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The file (from `offset`), with its sha256 in `ETag` and `X-Checksum-Sha256`",
        },
        206: {"description": "The byte range asked for with `Range: bytes=N-M`"},
        304: {"description": "`If-None-Match` matched the file's ETag"},
        416: {"description": "The range or offset lies outside the file"},
        **responses(400, 401, 403, 404, 422, 503, 504),
    },
)
async def download_file(
    service: FileService,
    path: FilePath,
    request: Request,
    _: Principal,
    offset: Annotated[int, Query(ge=0, le=2**62, description="Start at this byte (resume); ignored with Range")] = 0,
    range_: Annotated[str | None, Header(alias="range", max_length=200)] = None,
    if_range: Annotated[str | None, Header(max_length=200)] = None,
    if_none_match: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Stream a file through the API. Errors (path outside the root, missing file, a directory)
    are problems with the worker's reason; a transfer that breaks midway cuts the connection,
    so a caller never takes a short file for a whole one."""
    st = api_state(request)
    check_service(service, request)
    check_path(path)
    worker, details = await file_details(st.client, service, path)
    size, sha256 = int(details["size"]), str(details["sha256"])
    headers = file_headers(path, details)
    etag = headers["ETag"]
    tags = {t.strip().removeprefix("W/") for t in (if_none_match or "").split(",")}
    if etag in tags or "*" in tags:
        return Response(status_code=304, headers=headers)
    span = byte_range(range_, size) if if_range is None or if_range.strip() == etag else None
    if span is None and offset > size:
        raise refuse(
            416,
            "range-not-satisfiable",
            "Range not satisfiable",
            f"offset {offset}: the file has {size} bytes",
            **{"Content-Range": f"bytes */{size}"},
        )
    start, end = span or (offset, size)
    try:
        stream = st.client.open_stream(
            service, path, workers=worker, offset=start, chunk_size=CHUNK_SIZE, window=WINDOW, timeout=STREAM_TIMEOUT
        )
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    chunks = iter(stream)
    try:
        first = await asyncio.to_thread(_next, chunks)
        if first is None:  # nothing came: an empty file, or a refusal
            entry = _entry(stream)
            if entry.get("failed"):
                raise refused_file(path, failure_reason(entry))
            if end > start:
                raise ProblemError(502, "file-changed", "File changed", f"'{path}' shrank while it was being read")
    except JobTimeoutError as exc:
        raise refuse(504, "timeout", "The worker did not answer in time", str(exc)) from None
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    except asyncio.CancelledError:
        if not stream.future.done():
            st.client.cancel(stream.future.uuid)
        raise
    headers["Content-Length"] = str(end - start)
    status = 200
    if span is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    verify = sha256 if end == size else None
    body = _body(st.client, stream, chunks, first, end - start, verify) if first else _empty()
    return StreamingResponse(body, status_code=status, headers=headers, media_type="application/octet-stream")


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing
