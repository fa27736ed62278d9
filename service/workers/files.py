"""The `files` service: list, describe and stream files under one root directory.

`fetch_file` streams chunks under a credit window: at most `window` chunks are in
flight, and the client grants more as it writes, so a slow receiver makes the task
wait instead of the worker buffering the file. Memory stays at window × chunk_size.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..settings import Settings
from ..worker.job import Job
from ..worker.task import task
from ..worker.worker import Worker

MIN_CHUNK = 1024
MAX_CHUNK = 8 * 1024 * 1024
MAX_WINDOW = 64


class FileAccessError(ValueError):
    """A path the service will not serve: outside the root, missing, or not a regular file."""


class FilesWorker(Worker):
    service = "files"

    def __init__(self, *, root: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        s: Settings = self.settings
        base = root if root is not None else Path(s.data_dir) / "files"
        self.root = Path(base).resolve()
        if not self.root.is_dir():
            raise ValueError(f"files root {self.root} is not a directory")

    def resolve(self, path: str) -> Path:
        """The file under root that `path` names; symlinks and `..` may not lead outside."""
        if not path or "\0" in path:
            raise FileAccessError("path is empty")
        rel = Path(path)
        if rel.is_absolute():
            raise FileAccessError(f"'{path}' is absolute; give a path relative to the service root")
        target = (self.root / rel).resolve()
        if not target.is_relative_to(self.root):
            raise FileAccessError(f"'{path}' leads outside the service root")
        return target

    def _file(self, path: str) -> Path:
        target = self.resolve(path)
        if not target.exists():
            raise FileAccessError(f"'{path}' does not exist")
        if not target.is_file():
            raise FileAccessError(f"'{path}' is not a regular file")
        return target

    @task
    def list_files(self, path: str = ".", limit: int = 1000) -> list[dict[str, Any]]:
        """List the entries of a directory under the root (at most `limit`)."""
        if not 1 <= limit <= 10_000:
            raise ValueError("limit must be between 1 and 10000")
        base = self.resolve(path) if path not in ("", ".") else self.root
        if not base.is_dir():
            raise FileAccessError(f"'{path}' is not a directory")
        out = []
        for entry in sorted(base.iterdir())[:limit]:
            resolved = entry.resolve()
            if not resolved.is_relative_to(self.root):
                continue  # a symlink leading out is not listed
            out.append(
                {
                    "name": entry.name,
                    "path": str(entry.relative_to(self.root)),
                    "type": "dir" if resolved.is_dir() else "file",
                    "size": resolved.stat().st_size if resolved.is_file() else None,
                }
            )
        return out

    @task
    def file_details(self, path: str) -> dict[str, Any]:
        """Size, modification time and sha256 of a file."""
        target = self._file(path)
        h = hashlib.sha256()
        with target.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        st = target.stat()
        return {"path": path, "size": st.st_size, "mtime": st.st_mtime, "sha256": h.hexdigest()}

    @task
    def fetch_file(
        self, job: Job, path: str, offset: int = 0, chunk_size: int = 1024 * 1024, window: int = 8
    ) -> dict[str, Any]:
        """Stream a file from `offset` in chunks under a credit window; return its size and sha256."""
        if not MIN_CHUNK <= chunk_size <= min(MAX_CHUNK, self.settings.max_message_bytes // 2):
            raise ValueError(f"chunk_size must be between {MIN_CHUNK} and {MAX_CHUNK} bytes")
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window must be between 1 and {MAX_WINDOW}")
        target = self._file(path)
        size = target.stat().st_size
        if not 0 <= offset <= size:
            raise ValueError(f"offset {offset} is outside the file (size {size})")
        job.grant(window)
        h = hashlib.sha256()
        sent = chunks = 0
        with target.open("rb") as f:
            # The checksum covers the whole file, so a resumed download can verify too.
            done = 0
            while done < offset:
                block = f.read(min(1 << 20, offset - done))
                h.update(block)
                done += len(block)
            while chunk := f.read(chunk_size):
                h.update(chunk)
                job.stream(chunk)
                sent += len(chunk)
                chunks += 1
        return {"path": path, "size": size, "offset": offset, "sent": sent, "chunks": chunks, "sha256": h.hexdigest()}
