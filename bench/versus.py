"""zfab beside the lean NFP fabric and the raw pyzmq floor, interleaved in one run (issue 40, item 8).

Three systems, each as three processes on TCP loopback, measured the way
`../shared/acceptance/speed.py` measures them, round after round so a noisy moment of this shared
machine hurts one round rather than one system:

- floor.py (`../shared/acceptance/floor.py`): client DEALER, a ROUTER<->ROUTER forwarder, an echo
  DEALER; 2,000 round trips one at a time (RTT p50), then N pipelined (window 1,000);
- nfp_floor.py (`../shared/acceptance/nfp_floor.py`): a pure-Python NFP broker, worker and client
  with acks and nothing else; 2,000 sequential jobs (p50), then N pipelined (window 500);
- zfab: `zfab broker`, one `zfab worker` (service demo), a `Client` (acks on) in a child process:
  one job until the path answers, 2,000 sequential echo jobs (p50), then N pipelined (window 500).

The two lean systems run from their own files (ZFAB_NFP_FLOOR / ZFAB_FLOOR_PY name other copies),
started here with the endpoints set before each role forks: every role gets a free port (the
file's own nfp_floor port is fixed), and the latency mode can put a proxy between them.

Modes:
- rounds (default): the three interleaved, per-round ratios, the best round (as speed.py picks
  it: highest zfab/nfp pipelined ratio) and the medians;
- `--latency MS`: the same with every connection through bench/delay.py, MS one way (as
  `tc netem delay MSms` on lo would add; this kernel has none), so a job's four crossings add
  4 x MS to a sequential round trip;
- `--burndown N`: zfab's queue as Sidekiq and River publish it: the demo service paused
  (MMI pause_service), N echo jobs submitted and queued at the broker, resumed, and timed
  from the resume to the last result: jobs/s, beside zfab's and nfp_floor's pipelined rates.

- `--other BIN`: another checkout's zfab too (a venv's bin directory: its `zfab`, its `python`),
  after this one's in each round, and this checkout's ratios to it (before/after a change).

    python -m bench.versus [--quick] [--rounds 3] [--n 20000] [--latency 1] [--burndown 100000] [--other BIN]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.common import free_port, log_path, report, spawn, stop, wait_for
from bench.harness import Fabric

ROOT = Path(__file__).resolve().parent.parent
SEQ_N = 2000
WINDOW = 500
CHILD_TIMEOUT_S = 300.0


def shared_file(name: str, env: str) -> Path | None:
    """The acceptance copy of a lean system: $env, else ../shared/acceptance from the checkout
    (or from its worktree's parent, /work/wt/NAME -> /work/shared)."""
    if os.environ.get(env):
        return Path(os.environ[env])
    for base in (ROOT.parent, ROOT.parent.parent):
        path = base / "shared" / "acceptance" / name
        if path.exists():
            return path
    return None


def _kv(out: str) -> dict[str, float]:
    pairs = (x.split("=", 1) for x in out.split() if "=" in x)
    figures: dict[str, float] = {}
    for k, v in pairs:
        try:
            figures[k] = float(v)
        except ValueError:
            continue
    return figures


def _child(
    args: list[str], env: dict[str, str] | None = None, python: str | None = None, module: str = "bench.versus"
) -> dict[str, float]:
    """A role of `module` in a child process (`python`: another venv's, whose zfab it imports): its figures."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    r = subprocess.run(
        [python or sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=full_env,
    )
    figures = _kv(r.stdout)
    if r.returncode != 0 or not figures:
        tail = (r.stdout + r.stderr).strip().splitlines()[-6:]
        raise RuntimeError(f"{' '.join(args[:2])} failed ({r.returncode}): " + " | ".join(tail))
    return figures


# ---------------------------------------------------------------- the delaying proxy


class Delay:
    """bench/delay.py as a child: one listener per target port, `ms` one way; no-op at ms == 0."""

    def __init__(self, ms: float, targets: list[int]) -> None:
        self.ms = ms
        self.ports = {t: (free_port() if ms > 0 else t) for t in targets}
        self.proc: subprocess.Popen[bytes] | None = None
        if ms > 0:
            pairs = [f"{listen}:{target}" for target, listen in self.ports.items()]
            args = [sys.executable, "-m", "bench.delay", "--ms", str(ms), "--parent", str(os.getpid()), *pairs]
            self.proc = spawn(args, {"PYTHONPATH": str(ROOT)})
            path = log_path(self.proc)
            ready = wait_for(lambda: path is not None and path.exists() and "ready" in path.read_text(), 10)
            if not ready:
                stop([self.proc])
                raise RuntimeError("the delaying proxy did not start within 10 s")

    def __enter__(self) -> Delay:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop([self.proc])


# ---------------------------------------------------------------- one round of each


def run_floor(path: Path, n: int, latency_ms: float) -> dict[str, float]:
    front, back = free_port(), free_port()
    with Delay(latency_ms, [front, back]) as d:
        return _child(["lean", "floor", str(path), str(n), f"{front},{back}", f"{d.ports[front]},{d.ports[back]}"])


def run_nfp(path: Path, n: int, latency_ms: float) -> dict[str, float]:
    port = free_port()
    with Delay(latency_ms, [port]) as d:
        return _child(["lean", "nfp", str(path), str(n), str(port), str(d.ports[port])])


def run_zfab(tmp: str, n: int, latency_ms: float, other: Path | None = None) -> dict[str, float]:
    """This checkout's zfab, or (`other`: a venv's bin directory) another checkout's, as
    bench/trust.py measures one: its `zfab` for broker and worker, its `python` for the client."""
    with Fabric(tmp, zfab=str(other / "zfab") if other else None) as fab:
        port = int(fab.endpoint.rsplit(":", 1)[1])
        with Delay(latency_ms, [port]) as d:
            ep = f"tcp://127.0.0.1:{d.ports[port]}"
            fab.start_broker()
            fab.start_worker("sw1", ZFAB_BROKER=ep)
            figures = _child(["zclient", ep, str(n)], python=str(other / "python") if other else None)
    if other is None:
        return figures
    return {k.replace("zfab_", "other_"): v for k, v in figures.items()}


def run_burndown(tmp: str, n: int) -> dict[str, float]:
    env = {"ZFAB_SERVICE_QUEUE_SIZE": str(2 * n), "ZFAB_MAX_ROUTES": str(2 * n)}
    with Fabric(tmp, **env) as fab:
        fab.start_broker()
        fab.start_worker("bw1")
        return _child(["zburndown", fab.endpoint, str(n)], {"ZFAB_MAX_CLIENT_JOBS": str(2 * n)})


# ---------------------------------------------------------------- child roles


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lean(kind: str, path: str, n: int, bind: str, connect: str) -> None:
    """Run a lean system's roles with their endpoints set before each one forks: the broker binds
    `bind`, the worker and the client connect to `connect` (the same ports, or the proxy's)."""
    mod = _load(path)
    fork = mp.get_context("fork")
    ep = "tcp://127.0.0.1:{}".format
    if kind == "nfp":
        mod.EP = ep(bind)
        procs = [fork.Process(target=mod.broker, daemon=True)]
        procs[0].start()
        mod.EP = ep(connect)
        procs.append(fork.Process(target=mod.worker, daemon=True))
        procs[1].start()
        mod.client(n, WINDOW)
    else:
        (bf, bb), (cf, cb) = bind.split(","), connect.split(",")
        mod.FRONT, mod.BACK = ep(bf), ep(bb)
        procs = [fork.Process(target=mod.broker, daemon=True)]
        procs[0].start()
        mod.FRONT, mod.BACK = ep(cf), ep(cb)
        procs.append(fork.Process(target=mod.worker, daemon=True))
        procs[1].start()
        mod.client(n, 1000, 100)
    for p in procs:
        p.terminate()


def _answered(c: Any) -> None:
    """The first job, sent until the path answers it (the fabric is starting): the last error past 20 s."""
    deadline = time.monotonic() + 20
    while True:
        try:
            c.run_job("demo", "echo", kwargs={"data": 0}, timeout=3)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def zclient(endpoint: str, n: int) -> None:
    """speed.py's zfab client: the first job until the path answers, 2,000 sequential, n pipelined."""
    from zfab import Client

    with Client(broker=endpoint, name="speed") as c:
        _answered(c)
        lat = []
        for i in range(SEQ_N):
            t = time.perf_counter()
            c.run_job("demo", "echo", kwargs={"data": i}, timeout=5)
            lat.append(time.perf_counter() - t)
        lat.sort()
        t = time.perf_counter()
        futs: deque[Any] = deque()
        for i in range(n):
            futs.append(c.submit("demo", "echo", kwargs={"data": i}))
            if len(futs) >= WINDOW:
                futs.popleft().result(timeout=30)
        for f in futs:
            f.result(timeout=30)
        jps = n / (time.perf_counter() - t)
    print(f"zfab_pipelined_jobs_per_s={jps:.0f} zfab_seq_p50_ms={lat[len(lat) // 2] * 1e3:.3f}", flush=True)


def zburndown(endpoint: str, n: int) -> None:
    """Pause demo, queue n jobs at the broker, resume, time the drain from the resume to the last result."""
    from concurrent.futures import wait

    from zfab import Client

    with Client(broker=endpoint, name="burndown") as c:
        _answered(c)
        c.mmi("pause_service", service="demo")
        t_sub = time.perf_counter()
        futs = [c.submit("demo", "echo", kwargs={"data": i}, timeout=600) for i in range(n)]
        submit_s = time.perf_counter() - t_sub

        def depth() -> int:
            shown = c.mmi("show_services", timeout=5)
            d = next((s.get("queue_depth") for s in shown if s.get("service") == "demo"), 0)
            return int(d) if isinstance(d, int | float) else 0

        if not wait_for(lambda: depth() >= n, 120, 0.2):
            raise RuntimeError(f"only {depth()} of {n} jobs queued within 120 s")
        t0 = time.perf_counter()
        c.mmi("resume_service", service="demo")
        _, pending = wait(futs, timeout=600)
        t1 = time.perf_counter()
        errors = sum(1 for f in futs if f.done() and f.exception() is not None)
    if pending or errors:
        raise RuntimeError(f"burn-down: {len(pending)} jobs unfinished, {errors} failed")
    print(f"zfab_burndown_jobs_per_s={n / (t1 - t0):.0f} submit_s={submit_s:.1f} jobs={n}", flush=True)


# ---------------------------------------------------------------- the measurement


def rounds(
    n: int, count: int, latency_ms: float = 0.0, tmp: str | None = None, other: Path | None = None
) -> list[dict[str, float]]:
    """`count` rounds of floor.py, nfp_floor.py and zfab (and `other`'s zfab), in that order each round."""
    floor_py, nfp_py = shared_file("floor.py", "ZFAB_FLOOR_PY"), shared_file("nfp_floor.py", "ZFAB_NFP_FLOOR")
    if nfp_py is None:
        raise RuntimeError("nfp_floor.py not found beside the checkout (set ZFAB_NFP_FLOOR)")
    out = []
    with tempfile.TemporaryDirectory(prefix="zfab-versus-", dir=tmp) as base:
        for r in range(count):
            fig: dict[str, float] = {}
            if floor_py is not None:
                fig.update(run_floor(floor_py, 5 * n, latency_ms))
            fig.update(run_nfp(nfp_py, n, latency_ms))
            fig.update(run_zfab(f"{base}/r{r}", n, latency_ms))
            if other is not None:
                fig.update(run_zfab(f"{base}/o{r}", n, latency_ms, other))
            out.append(fig)
            _round_line(r + 1, fig)
    return out


def _round_line(r: int, f: dict[str, float]) -> None:
    zj, zp, nj, np_ = (
        f["zfab_pipelined_jobs_per_s"],
        f["zfab_seq_p50_ms"],
        f["nfp_pipelined_jobs_per_s"],
        f["nfp_seq_p50_ms"],
    )
    line = (
        f"   round {r}: zfab {zj:,.0f} jobs/s p50 {zp:.3f} ms | nfp_floor {nj:,.0f} jobs/s p50 {np_:.3f} ms"
        f" | pipelined {zj / nj:.2f}x nfp_floor, p50 {zp / np_:.2f}x nfp_floor's"
    )
    if "throughput_msgs_per_s" in f:
        fj, fp = f["throughput_msgs_per_s"], f["rtt_p50_us"] / 1000
        line += f" | floor.py {fj:,.0f} msgs/s RTT {fp:.3f} ms ({zj / fj:.3f}x, p50 {zp / fp:.1f}x)"
    if "other_pipelined_jobs_per_s" in f:
        oj, op = f["other_pipelined_jobs_per_s"], f["other_seq_p50_ms"]
        line += f" | other {oj:,.0f} jobs/s p50 {op:.3f} ms ({oj / nj:.2f}x, p50 {op / np_:.2f}x nfp_floor's)"
    print(line, flush=True)


def summarize(rs: list[dict[str, float]], label: str = "") -> dict[str, float]:
    """The best round (speed.py's pick) and the medians, as report() lines."""
    best = max(rs, key=lambda f: f["zfab_pipelined_jobs_per_s"] / f["nfp_pipelined_jobs_per_s"])
    tag = f" {label}" if label else ""
    print(f"   best round (highest zfab/nfp_floor pipelined ratio, as speed.py picks){tag}:", flush=True)
    nj, np_ = best["nfp_pipelined_jobs_per_s"], best["nfp_seq_p50_ms"]
    report(f"nfp_floor pipelined{tag}", nj, "/s")
    report(f"zfab pipelined{tag}", best["zfab_pipelined_jobs_per_s"], "/s", nj, vs="nfp_floor (need 1.2)")
    report(f"nfp_floor seq p50{tag}", np_, "ms")
    # speed.py's ratio is zfab/nfp (need <= 1.2); report()'s for a time is nfp/zfab, so both are printed
    report(f"zfab seq p50{tag}", best["zfab_seq_p50_ms"], "ms", np_, False, vs="nfp_floor")
    print(f"   zfab p50 / nfp_floor p50{tag}: {best['zfab_seq_p50_ms'] / np_:.2f} (need <= 1.2)", flush=True)
    if "throughput_msgs_per_s" in best:
        report(f"floor.py pipelined{tag}", best["throughput_msgs_per_s"], "/s")
        report(f"floor.py RTT p50{tag}", best["rtt_p50_us"] / 1000, "ms")
        report(
            f"zfab pipelined{tag}",
            best["zfab_pipelined_jobs_per_s"],
            "/s",
            best["throughput_msgs_per_s"],
            vs="floor.py",
        )
    ratios = [f["zfab_pipelined_jobs_per_s"] / f["nfp_pipelined_jobs_per_s"] for f in rs]
    p50s = [f["zfab_seq_p50_ms"] / f["nfp_seq_p50_ms"] for f in rs]
    if all("other_pipelined_jobs_per_s" in f for f in rs):
        mine = [f["zfab_pipelined_jobs_per_s"] / f["other_pipelined_jobs_per_s"] for f in rs]
        p50o = [f["zfab_seq_p50_ms"] / f["other_seq_p50_ms"] for f in rs]
        print(
            f"   this checkout / other{tag}: pipelined {min(mine):.2f}-{max(mine):.2f} (median"
            f" {statistics.median(mine):.2f}); p50 {min(p50o):.2f}-{max(p50o):.2f}"
            f" (median {statistics.median(p50o):.2f})",
            flush=True,
        )
    print(
        f"   over {len(rs)} rounds{tag}: pipelined zfab/nfp_floor {min(ratios):.2f}-{max(ratios):.2f}"
        f" (median {statistics.median(ratios):.2f}); p50 zfab/nfp_floor {min(p50s):.2f}-{max(p50s):.2f}"
        f" (median {statistics.median(p50s):.2f})",
        flush=True,
    )
    return {"pipe_ratio": best["zfab_pipelined_jobs_per_s"] / nj, "p50_ratio": best["zfab_seq_p50_ms"] / np_}


def run(quick: bool = False, n_rounds: int | None = None, n: int | None = None) -> dict[str, Any]:
    """bench.run's section: interleaved rounds, a burn-down and a 1 ms injected-latency run."""
    count = n_rounds or (1 if quick else 3)
    jobs = n or (10_000 if quick else 20_000)
    print(f"   {count} interleaved rounds, {jobs:,} pipelined jobs each (floor.py {5 * jobs:,} msgs)", flush=True)
    out: dict[str, Any] = {"rounds": summarize(rounds(jobs, count))}
    burn = 10_000 if quick else 100_000
    out["burndown"] = burndown(burn)
    print("== 1 ms injected latency (bench/delay.py on every connection, one way; no netem here)", flush=True)
    out["latency"] = summarize(rounds(2_000 if quick else 10_000, 1, latency_ms=1.0), "1 ms")
    return out


def burndown(n: int) -> dict[str, float]:
    print(f"== burn-down: {n:,} echo jobs queued at a paused broker, resumed, drained by one worker", flush=True)
    with tempfile.TemporaryDirectory(prefix="zfab-burndown-") as tmp:
        fig = run_burndown(tmp, n)
    report("zfab burn-down", fig["zfab_burndown_jobs_per_s"], "/s")
    print(f"   ({n:,} submitted in {fig['submit_s']:.1f} s, queued before the resume)", flush=True)
    return fig


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "lean":
        lean(argv[1], argv[2], int(argv[3]), argv[4], argv[5])
        return 0
    if argv and argv[0] == "zclient":
        zclient(argv[1], int(argv[2]))
        return 0
    if argv and argv[0] == "zburndown":
        zburndown(argv[1], int(argv[2]))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round of 10,000 jobs, a burn-down of 10,000")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--n", type=int, default=None, help="pipelined jobs per round (default 20,000)")
    p.add_argument("--latency", type=float, default=None, help="only rounds with MS of one-way delay")
    p.add_argument("--burndown", type=int, default=None, help="only a burn-down of N jobs")
    p.add_argument("--other", type=Path, default=None, help="also another checkout's zfab: its venv's bin directory")
    ns = p.parse_args(argv)
    if ns.burndown:
        burndown(ns.burndown)
    elif ns.latency is not None:
        summarize(rounds(ns.n or 10_000, ns.rounds or 1, ns.latency, other=ns.other), f"{ns.latency:g} ms")
    elif ns.rounds or ns.n or ns.other:
        summarize(rounds(ns.n or 20_000, ns.rounds or 3, other=ns.other))
    else:
        run(ns.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
