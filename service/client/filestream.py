"""File streaming on the client side: chunks arrive under a credit window, one credit back per chunk taken."""

from __future__ import annotations

import hashlib
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core import payloads
from ..core import protocol as nfp
from ..errors import BadRequestError, ChecksumError
from ..transport.base import Transport
from .future import JobFuture


class FileStream:
    """The chunks of a streaming job, in order. Each chunk taken grants the worker one more credit."""

    def __init__(self, loop: Transport, future: JobFuture, service: str, offset: int = 0) -> None:
        self.loop = loop
        self.future = future
        self.service = service.encode()
        self.offset = offset  # where in the file the stream starts
        self.received = 0

    def __iter__(self) -> Iterator[bytes]:
        chunks = self.future.chunks
        assert chunks is not None
        while True:
            try:
                chunk = chunks.get(timeout=0.05)
            except queue.Empty:
                if self.future.done() and chunks.empty():
                    self.future.result()  # raises what ended the job
                    return
                continue
            self.received += len(chunk)
            yield chunk
            self._grant(1)  # the caller has taken it: room for one more

    def _grant(self, n: int) -> None:
        worker = self.future.worker
        if worker is None or self.future.done():
            return
        body = nfp.dumps({"credit": n})
        uuid = self.future.uuid.encode()
        self.loop.submit(nfp.client_request(nfp.PUT, self.service, worker.encode(), uuid, body, payloads.NO_ACK))

    def details(self, timeout: float = 30.0) -> dict[str, Any]:
        """The worker's final answer: size, sha256, chunks sent."""
        result: dict[str, Any] = self.future.result(timeout)
        (entry,) = result.values()
        if entry.get("failed"):
            raise BadRequestError(
                "; ".join(entry.get("errors") or ["stream failed"]), uuid=self.future.uuid, results=result
            )
        details: dict[str, Any] = entry["result"]
        return details


def stream_request(path: str, *, offset: int, chunk_size: int, window: int, timeout: float) -> bytes:
    """The POST body of a fetch_file job (acknowledged: credits go to the worker named in the 202)."""
    kwargs = {"path": path, "offset": offset, "chunk_size": chunk_size, "window": window}
    return payloads.post_body("fetch_file", [], kwargs, timeout=timeout, push=True, ack=True)


def resume_offset(dest: Path, resume: bool) -> int:
    """Where a download into `dest` starts: its size when resuming, else 0."""
    return dest.stat().st_size if resume and dest.exists() else 0


def download(stream: FileStream, dest: Path) -> dict[str, Any]:
    """Write an open stream into `dest` (appending from the stream's offset) and verify the sha256."""
    offset = stream.offset
    h = hashlib.sha256()
    if offset:
        with dest.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    try:
        with dest.open("r+b" if offset else "wb") as out:
            out.seek(offset)
            for chunk in stream:
                out.write(chunk)
                h.update(chunk)
            out.truncate()
        details = stream.details()
    except BaseException:
        if not offset:
            dest.unlink(missing_ok=True)  # nothing worth resuming from a failed first attempt
        raise
    if details.get("sha256") != h.hexdigest():
        raise ChecksumError(
            f"{details.get('path')}: sha256 {h.hexdigest()} of the download differs from the worker's "
            f"{details.get('sha256')}",
            uuid=stream.future.uuid,
        )
    return details
