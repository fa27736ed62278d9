"""A cached virtualenv with NorFab 0.25.0, used to run ``norfab_driver.py``.

``norfab_python()`` returns the python of a virtualenv that can import NorFab's
``NFPClient``. The virtualenv is created once and cached. A ``.ok`` marker is
written only after the import check passes. When the virtualenv cannot be made
(no network, pip failure, ...), the function returns None and prints the reason.
``last_failure_reason()`` returns the same reason, for ``pytest.skip``.

The install is the base wheel, with no extras, plus ``pydantic``. The reason:
``norfab.models`` imports pydantic, but norfab 0.25.0 lists pydantic only under
its extras, so a plain ``pip install norfab==0.25.0`` cannot import ``NFPClient``.

Location: ``$ZFAB_NORFAB_VENV``, or ``~/.cache/zfab/norfab-0.25-venv`` by default.

``run_driver()`` runs the driver in that virtualenv and returns its JSON line
as a dict.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

NORFAB_VERSION = "0.25.0"
# The pydantic pin that norfab 0.25.0's own extras use.
REQUIREMENTS: tuple[str, ...] = (f"norfab=={NORFAB_VERSION}", "pydantic==2.14.1")
DEFAULT_VENV = Path.home() / ".cache" / "zfab" / "norfab-0.25-venv"
DRIVER = Path(__file__).resolve().with_name("norfab_driver.py")
OK_MARKER = ".ok"

PIP_TIMEOUT_S = 900
CHECK_TIMEOUT_S = 120
_CHECK_CODE = (
    "import importlib.metadata as m\n"
    "from norfab.core.client import NFPClient\n"
    "from norfab.core.inventory import NorFabInventory\n"
    "print(m.version('norfab'))\n"
)

_last_failure: str | None = None


def venv_dir() -> Path:
    """Where the NorFab virtualenv lives (``$ZFAB_NORFAB_VENV`` or the default)."""
    env = os.environ.get("ZFAB_NORFAB_VENV")
    return Path(env).expanduser() if env else DEFAULT_VENV


def _venv_python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def last_failure_reason() -> str | None:
    """Why the last ``norfab_python()`` call returned None, else None."""
    return _last_failure


def _fail(reason: str) -> None:
    global _last_failure
    _last_failure = reason
    print(f"norfab_env: NorFab {NORFAB_VERSION} virtualenv unavailable: {reason}", file=sys.stderr)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Serialise creation across processes (e.g. pytest-xdist workers)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / f".{root.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: Sequence[str | os.PathLike[str]], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    # Our own virtualenv must not leak into the child's import path.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _tail(text: str, lines: int = 15) -> str:
    kept = [ln for ln in text.strip().splitlines() if "is ignored: it is neither a file" not in ln]
    return "\n".join(kept[-lines:])


def _check(python: Path) -> str | None:
    """None if ``python`` imports NorFab's NFPClient at the right version, else a reason."""
    try:
        proc = _run([python, "-c", _CHECK_CODE], CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"import check could not run: {exc!r}"
    if proc.returncode != 0:
        return f"import check failed: {_tail(proc.stderr)}"
    version = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if version != NORFAB_VERSION:
        return f"expected norfab {NORFAB_VERSION}, found {version!r}"
    return None


def _create(root: Path) -> str | None:
    """Build the virtualenv at ``root``. Return None on success, else a reason."""
    shutil.rmtree(root, ignore_errors=True)
    try:
        venv.EnvBuilder(with_pip=True, clear=True, symlinks=sys.platform != "win32").create(root)
    except Exception as exc:
        return f"venv creation failed: {exc!r}"
    python = _venv_python(root)
    try:
        proc = _run(
            [python, "-m", "pip", "install", "--retries", "2", "--timeout", "60", *REQUIREMENTS],
            PIP_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pip install could not finish: {exc!r}"
    if proc.returncode != 0:
        return f"pip install {' '.join(REQUIREMENTS)} failed (rc={proc.returncode}):\n{_tail(proc.stderr)}"
    return _check(python)


def norfab_python() -> Path | None:
    """The python of a cached NorFab 0.25.0 virtualenv, created on first use.

    Returns None, and prints the reason, when it cannot be created.
    """
    global _last_failure
    root = venv_dir()
    python = _venv_python(root)
    marker = root / OK_MARKER
    if marker.is_file() and python.exists():
        _last_failure = None
        return python
    try:
        with _locked(root):
            # Another process may have finished the job while we waited for the lock.
            if marker.is_file() and python.exists():
                _last_failure = None
                return python
            reason = _create(root)
            if reason is not None:
                shutil.rmtree(root, ignore_errors=True)
                _fail(reason)
                return None
            marker.write_text(f"{' '.join(REQUIREMENTS)}\n")
    except OSError as exc:
        _fail(f"cannot prepare {root}: {exc!r}")
        return None
    _last_failure = None
    return python


def run_driver(
    python: Path,
    broker: str,
    *,
    service: str = "demo",
    task: str = "echo",
    kwargs: dict[str, Any] | None = None,
    workers: str | list[str] = "any",
    timeout: float = 20.0,
    mmi_timeout: float = 10.0,
    mmi_only: bool = False,
    extra_args: Sequence[str] = (),
) -> tuple[int, dict[str, Any], str]:
    """Run ``norfab_driver.py`` under ``python``; return (exit code, parsed JSON line, stderr).

    If the driver prints no JSON line, the dict is ``{"error": ...}``. The subprocess
    has its own deadline, above the driver's internal hard timeout.
    """
    cmd: list[str] = [
        str(python),
        str(DRIVER),
        "--broker",
        broker,
        "--service",
        service,
        "--task",
        task,
        "--kwargs",
        json.dumps(kwargs or {}),
        "--workers",
        workers if isinstance(workers, str) else json.dumps(workers),
        "--timeout",
        str(timeout),
        "--mmi-timeout",
        str(mmi_timeout),
        *(["--mmi-only"] if mmi_only else []),
        *extra_args,
    ]
    deadline = (0 if mmi_only else timeout) + mmi_timeout + 40
    try:
        proc = _run(cmd, deadline)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return -1, {"error": f"driver subprocess exceeded {deadline}s"}, err
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        parsed = json.loads(lines[-1]) if lines else {"error": "driver printed nothing on stdout"}
    except json.JSONDecodeError:
        parsed = {"error": f"driver stdout is not JSON: {proc.stdout[-500:]!r}"}
    if not isinstance(parsed, dict):
        parsed = {"error": f"driver printed a non-object: {parsed!r}"}
    return proc.returncode, parsed, proc.stderr


if __name__ == "__main__":
    py = norfab_python()
    print(py if py else f"unavailable: {last_failure_reason()}")
    sys.exit(0 if py else 1)
