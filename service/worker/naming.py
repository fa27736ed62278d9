"""A worker's name: stable across restarts, and never shared by two live workers of one data dir.

The default is `{service}-{hostname}`: the same every time one container or host starts its
worker, so the worker finds its job store (and its jobs' results) again. A second worker of
the service started on the same host with the same data directory takes `{service}-{host}-2`,
and so on: each name is held by a lock on `<data_dir>/workers/<name>.lock` while its worker
runs, which also keeps two processes from writing one job store. A name is a file name there,
so it passes core/names.py's rule before any file is opened (`a/b` and `../x` are refused).
"""

from __future__ import annotations

import fcntl
import socket
from pathlib import Path
from typing import IO

from ..core.names import check_path_name
from ..errors import BadNameError

MAX_SUFFIX = 100


class WorkerNameInUse(BadNameError):
    """Another live worker holds this name in this data directory (its lock): a name that cannot be this
    worker's files, so, like a name that is a path, the CLI says it in one line (exit code 2)."""


def worker_file(data_dir: Path, name: str, suffix: str) -> Path:
    """`<data_dir>/workers/<name><suffix>`: where a worker's files live (its lock, its job store)."""
    return data_dir / "workers" / f"{check_path_name(name)}{suffix}"


def claim_name(data_dir: Path, service: str, name: str | None) -> tuple[str, IO[str]]:
    """The worker's name, and the open lock file that keeps it ours until closed."""
    if name is not None:
        check_path_name(name)
    else:
        check_path_name(service, "service name")  # the default name is made from it
    folder = data_dir / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    base = f"{service}-{host}"
    candidates = [name] if name else [base, *(f"{base}-{i}" for i in range(2, MAX_SUFFIX))]
    for candidate in candidates:
        lock = worker_file(data_dir, candidate, ".lock").open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return candidate, lock
    if name:
        raise WorkerNameInUse(
            f"another worker named '{name}' is running with data directory {data_dir}; "
            "give each worker its own --name (or ZFAB_DATA_DIR)"
        )
    raise WorkerNameInUse(f"{MAX_SUFFIX} workers of '{service}' already run on {host} with data directory {data_dir}")
