"""Where zfab's sequential p50 goes, role by role, and how lean zfab's promises can be (issue 40).

The lean NFP fabric (`../shared/acceptance/nfp_floor.py`) and zfab speak the same wire, so each of
zfab's three roles can stand in for the lean one's, one at a time. Twelve setups, interleaved round after
round so a noisy moment of the machine hurts one round rather than one setup, each timing `--n`
sequential echo jobs (one in flight, as speed.py's p50):

- zfab: `zfab broker`, one `zfab worker`, a `Client`;
- lean client / lean broker / lean worker: that role nfp_floor's, the other two zfab's;
- kept broker / kept worker: that role lean but keeping what zfab's keeps per job (below), the other
  two zfab's;
- kept: the kept broker and the kept worker, with the lean client;
- kept worker (zfab's parts): the kept worker's handlers on zfab's own owner loop, pool, job store,
  `Job` and recent-jobs table, announced as zfab's (`v: 2`, hop traces), the other two roles zfab's:
  against zfab, what its worker's handlers cost beyond the promises; against the kept worker, what its
  parts cost;
- flat worker: zfab's worker's per-job features, every one, written flat on the same parts (`flat_worker`),
  the other two roles zfab's: against zfab, what a rewrite of its handlers keeping every feature could
  reach;
- flat worker, the rest kept: that worker with the kept broker and the lean client: the floor of a
  fabric whose worker keeps every feature (a client and a broker cannot do with less than those);
- kept (zfab client): the kept broker and the kept worker, with zfab's client (what a rewrite of the
  broker's and the worker's paths alone could reach);
- lean: all three nfp_floor's.

`--mix CLIENT/BROKER/WORKER` runs any other triple (a client zfab's or lean; a broker zfab's, lean,
kept or flat (`flat_broker`: every per-job feature of zfab's, flat); a worker zfab's, lean, kept, parts
or flat). A role swapped alone and the same role swapped beside others need not gain the same: the
roles share two cores.

A role's share of the gap is the p50 of all-zfab less the p50 with that role lean. The shares need not
add up to the whole gap: a role's Python also competes for the two cores with the others' while it runs.
"kept" against "lean" is what zfab's per-job promises cost when written as lean as they go: the floor
for a fabric that keeps them.

The lean roles are nfp_floor's own functions (its `Owner`, its `worker`, its frames), with what it
takes to serve a zfab peer: every role gets its endpoint from here; the lean broker drops a POST that
comes before any worker is READY (nfp_floor's would divide by zero; here a zfab worker may register
after the first job is sent), names a zfab worker in its 202 by its name (its identity is the name, "~"
and a nonce), and keeps each job's service to name it in the answers (a zfab client checks it). So
all-lean here is slower than nfp_floor's own run (0.53-0.61 ms against 0.51-0.54 on the 2-core VM).
The kept roles are those, with the promises `kept_broker` and `kept_worker` list. The lean and kept
workers and brokers send no keepalives; a zfab peer holds them alive for its hold time (15 s by
default), longer than a round.

    python -m bench.swap [--rounds 3] [--n 2000] [--only "kept worker" ...] [--mix zfab/kept/flat ...]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import spawn, stop, wait_for
from bench.flatroles import flat_broker, flat_worker, kept_worker_on_zfab
from bench.harness import Fabric
from bench.swaproles import (
    LEAN_SERVICE,
    kept_broker,
    kept_worker,
    lean_broker,
    lean_client,
    lean_worker,
    zfab_client,
)
from bench.versus import ROOT, _child, shared_file

# Each setup's roles: (client, broker, worker). A client is zfab's or lean; a broker zfab's, lean, kept or
# "flat"; a worker zfab's, lean, kept, "parts" (kept on zfab's parts) or "flat" (every feature, flat on them).
SETUPS: dict[str, tuple[str, str, str]] = {
    "zfab": ("zfab", "zfab", "zfab"),
    "lean client": ("lean", "zfab", "zfab"),
    "lean broker": ("zfab", "lean", "zfab"),
    "lean worker": ("zfab", "zfab", "lean"),
    "kept broker": ("zfab", "kept", "zfab"),
    "kept worker": ("zfab", "zfab", "kept"),
    "kept worker (zfab's parts)": ("zfab", "zfab", "parts"),
    "flat worker": ("zfab", "zfab", "flat"),
    "flat worker, the rest kept": ("lean", "kept", "flat"),
    "kept": ("lean", "kept", "kept"),
    "kept (zfab client)": ("zfab", "kept", "kept"),
    "lean": ("lean", "lean", "lean"),
}
CLIENTS, BROKERS, WORKERS = (
    ("zfab", "lean"),
    ("zfab", "lean", "kept", "flat"),
    ("zfab", "lean", "kept", "parts", "flat"),
)


def _me(*args: object) -> list[str]:
    return [sys.executable, "-m", "bench.swap", *map(str, args)]


def _client(*args: object) -> float:
    """A client role of this module in a child process: its p50, ms."""
    figures = _child([str(a) for a in args], module="bench.swap")
    if "p50_ms" not in figures:
        raise RuntimeError(f"{args[0]} printed no p50_ms: {figures}")
    return figures["p50_ms"]


def run_setup(setup: str, nfp: Path, tmp: str, n: int) -> float:
    """One setup's p50 in ms: a name of SETUPS, or "client/broker/worker" (`--mix`)."""
    env = {"PYTHONPATH": str(ROOT)}
    client, broker, worker = SETUPS[setup] if setup in SETUPS else setup.split("/")
    service = "demo" if worker == "zfab" else LEAN_SERVICE
    with Fabric(tmp) as fab:
        port = int(fab.endpoint.rsplit(":", 1)[1])
        procs: list[subprocess.Popen[bytes]] = []
        try:
            if broker == "zfab":
                fab.start_broker()
            else:
                procs.append(spawn(_me(f"{broker}-broker", nfp, port), env))
            if not wait_for(lambda: _listening(port), 20):
                raise RuntimeError(f"{setup}: no broker on port {port} within 20 s")
            if worker == "zfab":
                fab.start_worker("sw1")
            elif worker == "lean":
                procs.append(spawn(_me("lean-worker", nfp, port), env))
            else:
                procs.append(spawn(_me(f"{worker}-worker", nfp, port, tmp), env))
            if client == "lean":
                return _client("lean-client", nfp, port, service, n)
            return _client("zfab-client", fab.endpoint, service, n)
        finally:
            stop(procs)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def run(n_rounds: int, n: int, setups: tuple[str, ...] = tuple(SETUPS)) -> dict[str, list[float]]:
    nfp = shared_file("nfp_floor.py", "ZFAB_NFP_FLOOR")
    if nfp is None:
        raise RuntimeError("nfp_floor.py not found beside the checkout (set ZFAB_NFP_FLOOR)")
    out: dict[str, list[float]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory(prefix="zfab-swap-") as base:
        for r in range(n_rounds):
            for s in setups:
                out[s].append(run_setup(s, nfp, f"{base}/{r}-{s.replace(' ', '-')}", n))
            print(f"round {r + 1}: " + ", ".join(f"{s} {out[s][-1]:.3f}" for s in setups), flush=True)
    return out


def summarize(out: dict[str, list[float]]) -> None:
    """The medians, and what they say; a line whose setups did not run (`--only`) is left out."""
    med = {s: statistics.median(v) for s, v in out.items()}
    whole = med["zfab"] - med["lean"]
    print(f"sequential p50, medians of {len(out['zfab'])} rounds (ms):")
    ratio = med["zfab"] / med["lean"]
    print(f"  zfab {med['zfab']:.3f}   lean {med['lean']:.3f}   gap {whole * 1e3:.0f} us ({ratio:.2f}x)")
    for role in ("client", "broker", "worker"):
        if (lean := med.get(f"lean {role}")) is not None:
            print(f"  zfab's {role:6}: {(med['zfab'] - lean) * 1e3:4.0f} us  (p50 with a lean {role}: {lean:.3f} ms)")
    if (parts := med.get("kept worker (zfab's parts)")) is not None:
        gain = (parts - med["zfab"]) * 1e3
        print(f"  kept worker on zfab's parts: p50 {parts:.3f} ms, {gain:+.0f} us against zfab (the handlers' code)")
    if (flat := med.get("flat worker")) is not None:
        gain = (flat - med["zfab"]) * 1e3
        print(f"  flat worker (every feature): p50 {flat:.3f} ms, {gain:+.0f} us against zfab (layers, not features)")
    if (floor := med.get("flat worker, the rest kept")) is not None:
        print(f"  flat worker, kept broker, lean client: {floor:.3f} ms = {floor / med['lean']:.2f}x all lean")
    for role in ("broker", "worker"):
        if (kept := med.get(f"kept {role}")) is None:
            continue
        line = f"  a lean {role} keeping zfab's per-job promises: p50 {kept:.3f} ms = {kept / med['lean']:.2f}x lean"
        if (lean := med.get(f"lean {role}")) is not None:
            line += f", {(kept - lean) * 1e3:+.0f} us against the lean {role}"
        print(line)
    if (kept := med.get("kept")) is not None:
        print(f"  all of them kept, the client lean: {kept:.3f} ms = {kept / med['lean']:.2f}x all lean")
    if (both := med.get("kept (zfab client)")) is not None:
        print(f"  the broker and the worker kept, zfab's client: {both:.3f} ms = {both / med['lean']:.2f}x all lean")
    for setup, p50 in med.items():
        if "/" in setup:
            print(f"  client/broker/worker {setup}: {p50:.3f} ms = {p50 / med['lean']:.2f}x all lean")


def _mix(text: str) -> str:
    """A --mix: client, broker and worker among the roles each can be."""
    parts = text.split("/")
    if len(parts) != 3 or parts[0] not in CLIENTS or parts[1] not in BROKERS or parts[2] not in WORKERS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: CLIENT/BROKER/WORKER, a client of {CLIENTS}, a broker of {BROKERS}, a worker of {WORKERS}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    roles = {
        "lean-broker": lambda a: lean_broker(a[0], int(a[1])),
        "lean-worker": lambda a: lean_worker(a[0], int(a[1])),
        "kept-broker": lambda a: kept_broker(a[0], int(a[1])),
        "flat-broker": lambda a: flat_broker(a[0], int(a[1])),
        "kept-worker": lambda a: kept_worker(a[0], int(a[1]), a[2]),
        "parts-worker": lambda a: kept_worker_on_zfab(a[0], int(a[1]), a[2]),
        "flat-worker": lambda a: flat_worker(a[0], int(a[1]), a[2]),
        "lean-client": lambda a: lean_client(a[0], int(a[1]), a[2], int(a[3])),
        "zfab-client": lambda a: zfab_client(a[0], a[1], int(a[2])),
    }
    if argv and argv[0] in roles:
        roles[argv[0]](argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.swap", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=2000, help="sequential jobs per setup and round")
    p.add_argument(
        "--only",
        action="append",
        choices=tuple(SETUPS),
        metavar="SETUP",
        help="run this setup (repeatable; zfab, lean always run)",
    )
    p.add_argument(
        "--mix",
        action="append",
        type=_mix,
        metavar="CLIENT/BROKER/WORKER",
        help=f"run these roles, as {'/'.join(SETUPS['flat worker, the rest kept'])} (repeatable)",
    )
    a = p.parse_args(argv)
    chosen = ("zfab", *(a.only or ()), *(a.mix or ()), "lean")
    setups = tuple(SETUPS) if not (a.only or a.mix) else tuple(dict.fromkeys(chosen))
    summarize(run(a.rounds, a.n, setups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
