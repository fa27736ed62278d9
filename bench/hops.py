"""What hop traces cost (issue 30, part 2): pipelined jobs/s with ZFAB_HOP_TRACES on and off, and
where a sequential job's time goes, hop by hop.

Two fabrics side by side (a broker and two demo workers each, as processes), one with hop traces on
(the default) and one with ZFAB_HOP_TRACES=false in its broker and workers; the client here submits
demo echo pipelined (window 500). Trials alternate (on, off, on, off...) so drift of the machine falls
on both; each figure is the median. Then 1,000 sequential jobs on the traced fabric: the median of
each hop, and how far the hops' sum is from the end-to-end time measured around submit()/result().

    python -m bench.hops [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from bench.common import cpu_seconds, pipelined, report
from bench.harness import Fabric, wait_mmi_workers


def _fabric(tmp: str, traces: bool, workers: int) -> Fabric:
    fab = Fabric(tmp, **({} if traces else {"ZFAB_HOP_TRACES": "false"}))
    fab.start_broker()
    for i in range(workers):
        fab.start_worker(f"bench-{i}")
    return fab


def _sequential(c: Any, n: int) -> tuple[dict[str, float], float]:
    """Median seconds per hop of n sequential jobs, and the median |sum of hops - measured| / measured."""
    hops: dict[str, list[float]] = {}
    gaps: list[float] = []
    for i in range(n):
        t0 = time.monotonic()
        fut = c.submit("demo", "echo", kwargs={"data": i}, timeout=30)
        fut.result(30)
        measured = time.monotonic() - t0
        assert fut.trace is not None, "a traced fabric's job came back without its trace"
        for hop, s in fut.trace["hops"].items():
            hops.setdefault(hop, []).append(s)
        gaps.append(abs(sum(fut.trace["hops"].values()) - measured) / measured)
    return {h: statistics.median(v) for h, v in hops.items()}, statistics.median(gaps)


async def _sequential_aio(endpoint: str, n: int) -> float:
    """The median gap of n sequential jobs from a client whose socket this event loop owns, as the
    API's is: the caller awaits on the thread that reads the answer, so no thread hand-off is timed."""
    from zfab import AioTransport, Client, Settings, wait_future

    c = Client(settings=Settings(broker=endpoint), name="bench-aio", transport=AioTransport())
    c.start()
    try:
        for _ in range(50):  # connected, and the broker heard of it
            fut = c.submit("demo", "echo", kwargs={"data": 0}, timeout=30)
            await wait_future(fut, 30)
        gaps: list[float] = []
        for i in range(n):
            t0 = time.monotonic()
            fut = c.submit("demo", "echo", kwargs={"data": i}, timeout=30)
            await wait_future(fut, 30)
            fut.result(0)
            measured = time.monotonic() - t0
            assert fut.trace is not None
            gaps.append(abs(sum(fut.trace["hops"].values()) - measured) / measured)
        return statistics.median(gaps)
    finally:
        await c.aclose()


def run(quick: bool = False) -> dict[str, float]:
    from zfab import Client, Settings

    n, trials, workers = (5000, 3, 2) if quick else (20_000, 5, 2)
    out: dict[str, float] = {}
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="zfab-bench-hops-") as tmp:
        on, off = _fabric(tmp + "/on", True, workers), _fabric(tmp + "/off", False, workers)
        with on, off:
            clients = {
                True: Client(settings=Settings(broker=on.endpoint), name="bench-on"),
                False: Client(settings=Settings(broker=off.endpoint), name="bench-off"),
            }
            fabs = {True: on, False: off}
            try:
                for c in clients.values():
                    wait_mmi_workers(c, workers)
                    pipelined(c, 2000)
                for _ in range(trials):
                    for traced in (True, False):
                        broker = fabs[traced].broker
                        assert broker is not None
                        cpu0 = cpu_seconds(broker.pid)
                        jps = pipelined(clients[traced], n)
                        runs[traced].append((jps, (cpu_seconds(broker.pid) - cpu0) / n * 1e6))
                seq, gap = _sequential(clients[True], 300 if quick else 1000)
                aio_gap = asyncio.run(_sequential_aio(on.endpoint, 300 if quick else 1000))
            finally:
                for c in clients.values():
                    c.close()
    on_jps, off_jps = (statistics.median(j for j, _ in runs[t]) for t in (True, False))
    on_us, off_us = (statistics.median(u for _, u in runs[t]) for t in (True, False))
    report("pipelined jobs/s, hop traces off", off_jps, "/s")
    report("pipelined jobs/s, hop traces on", on_jps, "/s", off_jps, vs="off")
    report("broker CPU per job, hop traces on", on_us, "us", off_us, higher_is_better=False, vs="off")
    print("   a sequential echo job, median per hop: " + ", ".join(f"{h} {s * 1e6:.0f} us" for h, s in seq.items()))
    print(
        f"   hops' sum vs the end-to-end time measured around submit()/result(): median gap {gap * 100:.2f} % "
        f"(a thread waiting on the future: its wake-up is not a hop), {aio_gap * 100:.2f} % awaited on the "
        "client's own event loop (AioTransport, as the API)"
    )
    out.update(on_jps=on_jps, off_jps=off_jps, cost=1 - on_jps / off_jps, on_broker_us=on_us, off_broker_us=off_us)
    out.update({f"seq_{h}_us": s * 1e6 for h, s in seq.items()}, seq_gap=gap, seq_gap_aio=aio_gap)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    run(quick=p.parse_args().quick)


if __name__ == "__main__":
    main()
