"""HTTP under a native load generator: wrk against `zfab api`, the REST floor and a bare FastAPI endpoint, same run.

    wrk -t2 -c64 -d{D}s --latency -s post.lua  http://127.0.0.1:{bare}/jobs          bench/bare_app.py
    wrk -t2 -c64 -d{D}s --latency -s post.lua  http://127.0.0.1:{floor}/jobs         the REST floor
    wrk -t2 -c64 -d{D}s --latency -s post.lua  http://127.0.0.1:{api}/jobs?wait=10   zfab api + broker + 1 demo worker

The REST floor (`../shared/acceptance/http_floor.py`, or ZFAB_HTTP_FLOOR) is FastAPI validating the
same body and doing one zmq.asyncio round trip through a lean Python broker and worker: zfab's
three processes with nothing inside but the round trip, the yardstick of the REST path. The three
are measured interleaved, twice (once with --quick), and each figure is the best of its runs, so a
noisy moment of this shared machine hurts one run rather than one server.

The Lua script posts a JSON demo echo job on every request. Both servers run under the same
uvicorn setup (api/server.py's serve()). The API's CPU per job comes from /proc (utime+stime
over the run / requests answered). With uvicorn's defaults ("auto"), uvloop and httptools are
used when importable, and the project depends on them: the first run measures what a user
gets. A second run hides them (a side directory first on PYTHONPATH whose `uvloop` and
`httptools` modules raise ImportError) to show what they give against asyncio + h11.
Skipped, with the reason printed, when wrk is missing and `apt-get install -y wrk` cannot get it.

    python -m bench.wrk [--quick] [--no-asyncio]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, free_port, report, wait_for
from bench.harness import Fabric, http_json, log_tail

CONNECTIONS = 64
ROOT = Path(__file__).resolve().parent.parent
HTTP_FLOOR = Path(os.environ.get("ZFAB_HTTP_FLOOR") or ROOT.parent / "shared" / "acceptance" / "http_floor.py")
THREADS = 2
JOB = {"service": "demo", "task": "echo", "kwargs": {"data": "0123456789ab"}}

LUA = """
wrk.method = "POST"
wrk.body = '@BODY@'
wrk.headers["Content-Type"] = "application/json"
statuses = {}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
  local by = {}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for k, v in pairs(s) do by[tostring(k)] = (by[tostring(k)] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(by) do table.insert(parts, string.format('"%s": %d', k, v)) end
  io.write(string.format('WRKJSON {"requests": %d, "duration_us": %d, "errors_connect": %d, ' ..
    '"errors_read": %d, "errors_write": %d, "errors_timeout": %d, "errors_status": %d, ' ..
    '"p50_us": %d, "p99_us": %d, "statuses": {%s}}\\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout, summary.errors.status,
    latency:percentile(50), latency:percentile(99), table.concat(parts, ", ")))
end
""".replace("@BODY@", json.dumps(JOB))


def find_wrk() -> tuple[str | None, str]:
    """The wrk binary, installing Debian's package if needed; (None, why) when it cannot be had."""
    path = shutil.which("wrk")
    if path:
        return path, ""
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "-qq", "wrk"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        r = subprocess.run(install, capture_output=True, text=True, timeout=300, env=env)
        if r.returncode != 0:
            # A fresh machine's package lists may be missing or stale: refresh them once and retry.
            subprocess.run(
                ["apt-get", "-o", "DPkg::Lock::Timeout=120", "update", "-qq"],
                capture_output=True,
                text=True,
                timeout=300,
                env=env,
            )
            r = subprocess.run(install, capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"apt-get install -y wrk failed: {exc}"
    path = shutil.which("wrk")
    return (path, "") if path else (None, f"apt-get install -y wrk exited {r.returncode}: {r.stderr[-300:]}")


def hide_uvloop(where: Path) -> str:
    """A directory that, first on PYTHONPATH, makes `import uvloop` and `import httptools` fail,
    so uvicorn's "auto" falls back to asyncio and h11."""
    for mod in ("uvloop", "httptools"):
        (where / f"{mod}.py").write_text(f"raise ImportError('{mod} hidden by bench.wrk')\n")
    return str(where)


def children_of(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc), e.g. the REST floor's broker and worker."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def run_wrk(wrk: str, url: str, seconds: float, script: Path) -> dict[str, Any]:
    cmd = [
        wrk,
        f"-t{THREADS}",
        f"-c{CONNECTIONS}",
        f"-d{int(seconds)}s",
        "--timeout",
        "15s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"^WRKJSON (.*)$", r.stdout, re.M)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"wrk failed ({r.returncode}): {r.stdout[-500:]} {r.stderr[-500:]}")
    out: dict[str, Any] = json.loads(m.group(1))
    out["rps"] = out["requests"] / (out["duration_us"] / 1e6)
    out["ok"] = out["statuses"].get("200", 0)
    return out


def _measure(
    wrk: str, script: Path, seconds: float, warm: float, extra_path: str | None, rounds: int = 1
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zfab-bench-wrk-") as tmp, Fabric(tmp) as fab:
        env = {}
        if extra_path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, fab.env.get("PYTHONPATH", "")]))
        fab.start_broker()
        fab.start_worker("bench-1")
        api = fab.start_api(extra_path=extra_path)
        bare_port = free_port()
        bare = fab.spawn([sys.executable, "-m", "bench.bare_app", "--port", str(bare_port)], env)
        bare_url = f"http://127.0.0.1:{bare_port}"
        targets = [("bare", bare_url + "/jobs", bare)]
        if HTTP_FLOOR.exists():
            floor_port = free_port()
            # Its broker and worker are child processes of this one (multiprocessing): their CPU is
            # read from them (children_of), beside the API process's own, as zfab's broker and worker.
            floor = fab.spawn([sys.executable, str(HTTP_FLOOR), str(floor_port)], env)
            floor_url = f"http://127.0.0.1:{floor_port}"
            if not wait_for(lambda: http_json(floor_url + "/docs")[0] == 200, 30):
                raise RuntimeError("the REST floor did not come up" + log_tail([floor]))
            targets.append(("floor", floor_url + "/jobs", floor))
        else:
            print(f"   the REST floor: SKIPPED, {HTTP_FLOOR} not found (set ZFAB_HTTP_FLOOR)", flush=True)
        targets.append(("api", fab.api_url + "/jobs?wait=10", api))
        fab.wait_api_workers(1)
        if not wait_for(lambda: http_json(bare_url + "/healthz")[0] == 200, 30):
            raise RuntimeError("bench.bare_app did not come up" + log_tail([bare]))
        st, _, raw = http_json(fab.api_url + "/jobs?wait=10", JOB)
        if st != 200:
            raise RuntimeError(f"POST /jobs?wait=10 answered {st}: {raw[:300]!r}")
        out: dict[str, Any] = {}
        for _tag, url, _ in targets:
            run_wrk(wrk, url, warm, script)
        for _ in range(rounds):
            for tag, url, proc in targets:
                time.sleep(1.0)
                c0 = cpu_seconds(proc.pid)
                fab_pids = (
                    children_of(proc.pid)
                    if tag == "floor"
                    else [p.pid for p in (fab.broker, *fab.workers.values()) if p is not None]
                    if tag == "api"
                    else []
                )
                f0 = sum(cpu_seconds(p) for p in fab_pids)
                res = run_wrk(wrk, url, seconds, script)
                res["cpu_ms"] = (cpu_seconds(proc.pid) - c0) / max(1, res["requests"]) * 1000
                res["fabric_cpu_ms"] = (sum(cpu_seconds(p) for p in fab_pids) - f0) / max(1, res["requests"]) * 1000
                res["cpu_pct"] = (cpu_seconds(proc.pid) - c0) / seconds * 100
                res["runs"] = [*out[tag]["runs"], res["rps"]] if tag in out else [res["rps"]]
                if tag not in out or res["rps"] > out[tag]["rps"]:
                    out[tag] = res
                else:
                    out[tag]["runs"] = res["runs"]
        return out


def _runs(r: dict[str, Any]) -> str:
    return "/".join(f"{x:.0f}" for x in r["runs"])


def run(quick: bool = False, try_asyncio: bool = True) -> dict[str, Any]:
    wrk, why = find_wrk()
    if wrk is None:
        print(f"-- wrk: SKIPPED, {why}", flush=True)
        return {}
    seconds, warm = (5.0, 2.0) if quick else (10.0, 3.0)
    rounds = 1 if quick else 2
    script = Path(tempfile.mkdtemp(prefix="zfab-wrk-")) / "post.lua"
    script.write_text(LUA)
    print(
        f"-- wrk -t{THREADS} -c{CONNECTIONS} -d{seconds:.0f}s, POST a JSON echo job: bare FastAPI /jobs, the REST "
        f"floor /jobs and zfab api /jobs?wait=10 (+ broker + 1 demo worker), interleaved, best of {rounds}, "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    variants: list[tuple[str, str | None]] = [("uvloop+httptools", None)]
    if try_asyncio:
        variants.append(("asyncio+h11", hide_uvloop(script.parent)))
    results: dict[str, Any] = {}
    for label, extra in variants:
        try:
            r = _measure(wrk, script, seconds, warm, extra, rounds if extra is None else 1)
        except Exception as exc:
            print(f"   wrk {label}: failed: {exc}", flush=True)
            continue
        results[label] = r
        b, a = r["bare"], r["api"]
        print(f"- uvicorn with {label}", flush=True)
        report(f"wrk bare POST ({label})", b["rps"], "/s")
        fl = r.get("floor")
        if fl is not None:
            report(f"wrk REST floor POST ({label})", fl["rps"], "/s", b["rps"], vs="bare")
            report(f"wrk api POST ?wait ({label})", a["rps"], "/s", fl["rps"], vs="REST floor")
            print(
                f"   wrk api / REST floor = {a['rps'] / fl['rps']:.2f}x (target >= 0.9x); api / bare = "
                f"{a['rps'] / b['rps']:.2f}x; runs: api {_runs(a)}, floor {_runs(fl)}, bare {_runs(b)}",
                flush=True,
            )
        else:
            report(f"wrk api POST ?wait ({label})", a["rps"], "/s", b["rps"], vs="bare")
        non2xx = sum(v for k, v in a["statuses"].items() if not k.startswith("2"))
        print(
            f"   answers: bare {b['statuses']}, api {a['statuses']} ({non2xx} not 2xx); socket errors api "
            f"{a['errors_read'] + a['errors_timeout']}",
            flush=True,
        )
        report(f"wrk bare p50 ({label})", b["p50_us"] / 1000, "ms")
        report(f"wrk api p50 ({label})", a["p50_us"] / 1000, "ms", b["p50_us"] / 1000, False, vs="bare")
        report(f"wrk bare p99 ({label})", b["p99_us"] / 1000, "ms")
        report(f"wrk api p99 ({label})", a["p99_us"] / 1000, "ms", b["p99_us"] / 1000, False, vs="bare")
        report(f"bare server cpu/req ({label})", b["cpu_ms"], "ms")
        if fl is not None:
            report(f"REST floor server cpu/job ({label})", fl["cpu_ms"], "ms", b["cpu_ms"], False, vs="bare")
            print(f"   REST floor's broker + worker {fl['fabric_cpu_ms']:.2f} ms CPU per job", flush=True)
        report(f"api server cpu/job ({label})", a["cpu_ms"], "ms", b["cpu_ms"], False, vs="bare")
        print(
            f"   api process {a['cpu_pct']:.0f} % of a core; broker + worker {a['fabric_cpu_ms']:.2f} ms CPU per job",
            flush=True,
        )
    if len(results) == 2:
        base, fast = results["asyncio+h11"], results["uvloop+httptools"]
        print(
            f"   uvloop+httptools vs asyncio+h11: api {fast['api']['rps'] / base['api']['rps']:.2f}x jobs/s, "
            f"{fast['api']['cpu_ms']:.2f} vs {base['api']['cpu_ms']:.2f} ms CPU/job; bare "
            f"{fast['bare']['rps'] / base['bare']['rps']:.2f}x",
            flush=True,
        )
    shutil.rmtree(script.parent, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.wrk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-asyncio", action="store_true", help="skip the asyncio+h11 comparison run")
    ns = p.parse_args(argv)
    run(ns.quick, not ns.no_asyncio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
