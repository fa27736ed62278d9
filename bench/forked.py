"""Forked or started as programs: what a fabric's sequential p50 owes to how its processes start (issue 40).

`../shared/acceptance/nfp_floor.py` forks its broker and its worker from its client's process, so the
three share the memory of everything imported before the fork, while `speed.py` starts zfab's broker and
worker as programs of their own (`zfab broker`, `zfab worker`), as any deployment does. Every hop of a
sequential job runs a cold process on this 2-core VM, and its p50 depends on which of the two it is:
four setups, interleaved round after round, each timing 2,000 sequential echo jobs after 300 to warm up:

- nfp_floor forked: its broker and worker forked from the measuring process, its own client (its way);
- nfp_floor as programs: the same two role functions, each in a Python process started for it
  (`python -m bench.forked nfprole ...`), the same client;
- zfab as programs: `zfab broker` and `zfab worker` started as commands, a `Client` (as speed.py);
- zfab forked: the same two commands' `main`, forked from the measuring process once it imported zfab.

It prints each setup's p50, the ratio speed.py judges (zfab as programs against nfp_floor forked) and the
two like for like. No role is changed between its two setups: only how its process starts.

    python -m bench.forked [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import free_port, report
from bench.swaproles import LEAN_SERVICE, lean_submitter
from bench.versus import SEQ_N, _answered, _child, _load, shared_file

WARM = 300
ROLE_START_S = 30.0  # how long a role program may take to say `ready`
PR_SET_PDEATHSIG = 1
SETUPS = ("nfp_floor forked", "nfp_floor as programs", "zfab as programs", "zfab forked")


# ---------------------------------------------------------------- child roles


def _die_with_parent() -> None:
    """A role started here ends with the measuring process, even one killed at its timeout (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _forked(target: Any, *args: Any) -> None:
    """A forked role: `target(*args)`, ending with the measuring process."""
    _die_with_parent()
    target(*args)


def nfprole(role: str, path: str, port: int) -> None:
    """One of nfp_floor's roles (broker or worker) as a process of its own; says `ready` once it runs."""
    mod = _load(path)
    mod.EP = f"tcp://127.0.0.1:{port}"
    fn = mod.broker if role == "broker" else mod.worker
    print("ready", flush=True)
    fn()


def _await_ready(proc: subprocess.Popen[str]) -> None:
    """A role program's `ready` line within ROLE_START_S, or the reason it did not come."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(ROLE_START_S) else ""  # a crash closes the pipe: ""
    if line.strip() != "ready":
        proc.kill()
        why = line.strip() or f"nothing within {ROLE_START_S:.0f} s"
        raise RuntimeError(f"a role program did not start: {why} (exit {proc.poll()})")


def nfp(path: str, forked: bool) -> None:
    """nfp_floor's client, sequential only, after its broker and worker started one way or the other."""
    mod = _load(path)
    port = free_port()
    mod.EP = f"tcp://127.0.0.1:{port}"
    procs: list[Any] = []
    try:
        if forked:
            fork = mp.get_context("fork")
            for role in (mod.broker, mod.worker):
                procs.append(fork.Process(target=_forked, args=(role,), daemon=True))
                procs[-1].start()
        else:
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
            for role in ("broker", "worker"):  # the worker once the broker listens
                args = [sys.executable, "-m", "bench.forked", "nfprole", role, path, str(port)]
                out = subprocess.PIPE
                procs.append(subprocess.Popen(args, stdout=out, text=True, env=env, preexec_fn=_die_with_parent))
                _await_ready(procs[-1])
        p50 = _nfp_sequential(mod)
    finally:
        for p in procs:
            p.terminate()
    print(f"seq_p50_ms={p50:.3f}", flush=True)


def _p50_ms(job: Callable[[int], object]) -> float:
    """`job(i)` WARM times, then SEQ_N times timed one at a time: their p50 in ms."""
    for i in range(WARM):
        job(i)
    lat = []
    for i in range(SEQ_N):
        t = time.perf_counter()
        job(i)
        lat.append(time.perf_counter() - t)
    lat.sort()
    return lat[len(lat) // 2] * 1e3  # as speed.py reads its p50


def _nfp_sequential(mod: Any) -> float:
    """nfp_floor's own client (bench/swaproles.py's lean submitter), timed as its `client` times it."""
    submit = lean_submitter(mod, LEAN_SERVICE)
    time.sleep(0.5)  # as nfp_floor's client waits: its broker fails on a POST that comes before any READY
    return _p50_ms(lambda i: submit(i, 5.0))


def zfab(forked: bool) -> None:
    """zfab's broker and worker started one way or the other, then a `Client`'s sequential jobs."""
    from zfab import Client
    from zfab.cli import main

    tmp = tempfile.mkdtemp(prefix="zfab-forked-")
    ep = f"tcp://127.0.0.1:{free_port()}"
    os.environ.update(ZFAB_BROKER=ep, ZFAB_STATE_DIR=tmp, ZFAB_DATA_DIR=tmp)
    roles = [["broker", "--endpoint", ep], ["worker", "--broker", ep, "--service", "demo", "--name", "sw1"]]
    procs: list[Any] = []
    if forked:
        import zfab.broker
        import zfab.worker
        import zfab.workers.demo  # noqa: F401  (imported before the fork, as nfp_floor's roles are)

        fork = mp.get_context("fork")
        procs = [fork.Process(target=_forked, args=(main, r), daemon=True) for r in roles]
        for p in procs:
            p.start()
    else:
        zfab_bin = str(Path(sys.executable).parent / "zfab")
        quiet = subprocess.DEVNULL
        procs = [
            subprocess.Popen([zfab_bin, *r], stdout=quiet, stderr=quiet, cwd=tmp, preexec_fn=_die_with_parent)
            for r in roles
        ]
    try:
        with Client(broker=ep, name="forked") as c:
            _answered(c)
            p50 = _p50_ms(lambda i: c.run_job("demo", "echo", kwargs={"data": i}, timeout=5))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10) if forked else p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)  # the worker's job store, once its process is gone
    print(f"seq_p50_ms={p50:.3f}", flush=True)


# ---------------------------------------------------------------- the measurement


def one(setup: str, nfp_py: Path) -> float:
    """One setup's p50 in ms, measured in a child process of its own."""
    forked = setup.endswith("forked")
    if setup.startswith("nfp_floor"):
        args = ["nfp", str(nfp_py), "fork" if forked else "programs"]
    else:
        args = ["zfab", "fork" if forked else "programs"]
    return _child(args, module="bench.forked")["seq_p50_ms"]


def run(quick: bool = False, rounds: int | None = None) -> dict[str, list[float]]:
    """`rounds` rounds (3 with `quick`, else 5) of the four setups, in that order each round."""
    rounds = rounds or (3 if quick else 5)
    nfp_py = shared_file("nfp_floor.py", "ZFAB_NFP_FLOOR")
    if nfp_py is None:
        raise RuntimeError("nfp_floor.py not found beside the checkout (set ZFAB_NFP_FLOOR)")
    p50: dict[str, list[float]] = {s: [] for s in SETUPS}
    for r in range(1, rounds + 1):
        for s in SETUPS:
            p50[s].append(one(s, nfp_py))
        print(f"   round {r}: " + " | ".join(f"{s} {p50[s][-1]:.3f} ms" for s in SETUPS), flush=True)
    med = {s: statistics.median(v) for s, v in p50.items()}
    for s in SETUPS:
        report(f"seq p50, {s} (median of {rounds})", med[s], "ms")
    judged = [z / n for z, n in zip(p50["zfab as programs"], p50["nfp_floor forked"], strict=True)]
    programs = [z / n for z, n in zip(p50["zfab as programs"], p50["nfp_floor as programs"], strict=True)]
    forks = [z / n for z, n in zip(p50["zfab forked"], p50["nfp_floor forked"], strict=True)]
    fork_gain = [p / f for p, f in zip(p50["nfp_floor as programs"], p50["nfp_floor forked"], strict=True)]

    def span(v: list[float]) -> str:
        return f"median {statistics.median(v):.2f}x, rounds {min(v):.2f}-{max(v):.2f}x"

    print(f"   zfab as programs / nfp_floor forked (what speed.py judges): {span(judged)}", flush=True)
    print(f"   like for like, both as programs: {span(programs)}", flush=True)
    print(f"   like for like, both forked: {span(forks)}", flush=True)
    print(f"   nfp_floor as programs / nfp_floor forked (what the fork is worth): {span(fork_gain)}", flush=True)
    return p50


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("nfprole")
    r.add_argument("role", choices=["broker", "worker"])
    r.add_argument("path")
    r.add_argument("port", type=int)
    n = sub.add_parser("nfp")
    n.add_argument("path")
    n.add_argument("how", choices=["fork", "programs"])
    z = sub.add_parser("zfab")
    z.add_argument("how", choices=["fork", "programs"])
    p.add_argument("--rounds", type=int, default=None, help="5 (3 with --quick)")
    p.add_argument("--quick", action="store_true", help="3 rounds")
    ns = p.parse_args()
    if ns.cmd == "nfprole":
        nfprole(ns.role, ns.path, ns.port)
    elif ns.cmd == "nfp":
        nfp(ns.path, ns.how == "fork")
    elif ns.cmd == "zfab":
        zfab(ns.how == "fork")
    else:
        run(ns.quick, ns.rounds)


if __name__ == "__main__":
    main()
