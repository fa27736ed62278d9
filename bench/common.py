"""Small helpers shared by the benchmarks in ``bench/``.

Nothing here imports zfab: the helpers only need the standard library, so the
raw floor (``bench.floor``) and the zfab benchmarks measure with the same tools.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import typing
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "RESULTS",
    "cpu_seconds",
    "dump_json",
    "free_port",
    "idle_cpu_percent",
    "log_dir",
    "log_path",
    "percentile",
    "report",
    "spawn",
    "stop",
    "wait_for",
]

Result = dict[str, str | float | bool | None]

#: Every figure passed to :func:`report`, in order; :func:`dump_json` writes it.
RESULTS: list[Result] = []

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_LOG_DIR: Path | None = None
_LOGS: dict[int, Path] = {}
_LOG_SEQ = itertools.count(1)


# --------------------------------------------------------------------- statistics


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values``, linearly interpolated between
    the closest ranks (the same definition as numpy's default)."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# ------------------------------------------------------------------------ network


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------------------- CPU


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds consumed so far by ``pid`` (all its threads), from
    ``/proc/PID/stat``. Raises :class:`ProcessLookupError` when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(f"no process {pid}") from None
    # The command name (field 2) is in parentheses and may itself contain spaces
    # or parentheses: split after the last ')'. The rest starts at field 3 (state),
    # so utime (field 14) and stime (field 15) are at indices 11 and 12.
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def idle_cpu_percent(pids: list[int], seconds: float) -> float:
    """CPU used by ``pids`` together over a window of ``seconds``, as a percentage of
    ONE core (two processes each burning a full core read 200.0)."""
    if seconds <= 0:
        raise ValueError("the window must be positive")
    before = sum(cpu_seconds(pid) for pid in pids)
    started = time.monotonic()
    time.sleep(seconds)
    after = sum(cpu_seconds(pid) for pid in pids)
    elapsed = time.monotonic() - started
    return 100.0 * (after - before) / elapsed


# ---------------------------------------------------------------------- processes


def log_dir() -> Path:
    """The temporary directory (created on first use) holding the children's logs."""
    global _LOG_DIR
    if _LOG_DIR is None:
        _LOG_DIR = Path(tempfile.mkdtemp(prefix="zfab-bench-"))
    return _LOG_DIR


def log_path(proc: subprocess.Popen[bytes]) -> Path | None:
    """The log file of a child started by :func:`spawn` (None for any other process)."""
    return _LOGS.get(proc.pid)


def _log_name(args: list[str]) -> str:
    words = [a for a in args[1:] if not a.startswith("-")][:3] or [Path(args[0]).name]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(words))[:60]
    return f"{next(_LOG_SEQ):03d}-{stem}.log"


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` as a child in its own session (so :func:`stop` can signal its
    whole process group, and a terminal's Ctrl-C reaches only the parent), with
    stdin from /dev/null and stdout+stderr appended to a log file under
    :func:`log_dir` (see :func:`log_path`). ``env`` is merged over ``os.environ``."""
    if not args:
        raise ValueError("nothing to spawn")
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    path = log_dir() / _log_name(args)
    with path.open("ab") as log:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
    _LOGS[proc.pid] = path
    return proc


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # spawn() made each child a session (and group) leader, so pgid == pid.
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def stop(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 5.0) -> None:
    """SIGTERM every process (its whole group), wait up to ``timeout`` seconds for all
    of them together, then SIGKILL whatever is left and reap it. Safe to call on
    processes that have already exited, and more than once."""
    pending = list(procs)
    for proc in pending:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in pending:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in pending:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``cond`` every ``interval`` seconds until it is true (returns True) or
    ``timeout`` seconds have passed (returns False, after one last try)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return cond()
        time.sleep(min(interval, left))


# ------------------------------------------------------------------------ reports


def _format_value(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 100 or value == 0:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:,.1f}"
    if magnitude >= 0.1:
        return f"{value:,.3f}"
    return f"{value:.3g}"


def report(
    name: str,
    value: float,
    unit: str,
    floor: float | None = None,
    higher_is_better: bool = True,
    vs: str = "floor",
) -> None:
    """Print one aligned figure and record it in :data:`RESULTS`.

    With a ``floor`` the line also shows the speed relative to it, always read the
    same way: below 1.0x is slower than the floor. ``vs`` names the baseline in the line
    (the raw floor by default; a section's own baseline, e.g. "1 worker", otherwise). For a higher-is-better figure
    (throughput) that is ``value / floor``; for a lower-is-better one (latency)
    ``floor / value``, so a p50 four times the floor's reads ``0.25x floor``.
    """
    ratio: float | None = None
    if floor is not None and value != 0 and floor != 0:
        ratio = value / floor if higher_is_better else floor / value
    line = f"{name:<28} {_format_value(value):>12}  {unit:<5}"
    if ratio is not None:
        line += f" {ratio:7.2f}x {vs}"
    print(line.rstrip(), flush=True)
    RESULTS.append(
        {
            "name": name,
            "value": value,
            "unit": unit,
            "floor": floor,
            "ratio": ratio,
            "higher_is_better": higher_is_better,
            "vs": vs,
        }
    )


def dump_json(path: str | os.PathLike[str]) -> None:
    """Write :data:`RESULTS` as a JSON list to ``path``."""
    Path(path).write_text(json.dumps(RESULTS, indent=2) + "\n")


def pipelined(c: typing.Any, n: int, window: int = 500, service: str = "demo", timeout: float = 120) -> float:
    """Jobs/s of n demo echo jobs through a Client, at most `window` in flight (the oldest waited on)."""
    from collections import deque

    q: deque[typing.Any] = deque()
    t0 = time.perf_counter()
    for i in range(n):
        if len(q) >= window:
            q.popleft().result(timeout)
        q.append(c.submit(service, "echo", kwargs={"data": i}, timeout=timeout))
    while q:
        q.popleft().result(timeout)
    return n / (time.perf_counter() - t0)
