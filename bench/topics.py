"""A slow subscriber never slows the fabric (issue 30, part 1): pipelined jobs/s with the broker's event
publisher off, on with no subscriber, on with a subscriber that reads nothing, and on with one that reads
everything (`service.Subscriber` to `job.`).

One broker (ZFAB_BROKER_EVENTS set for the "on" runs) and two demo workers as processes, the client
here, demo echo pipelined (window 500). The subscriber that reads nothing is a SUB socket subscribed to
`job.` that is never read: its pipe fills (ZFAB_BROKER_EVENTS_HWM, then the kernel's buffers) within
the first trial and stays full; the broker's publisher drops what it cannot take. The trials alternate
(none, idle, none, idle, ...) so drift of the machine falls on both; each figure is the median.

    python -m bench.topics [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from typing import Any

from bench.common import cpu_seconds, free_port, pipelined, report
from bench.harness import Fabric, wait_mmi_workers


def _fabric(tmp: str, events: str | None, workers: int) -> Fabric:
    env = {"ZFAB_BROKER_EVENTS": events} if events else {}
    fab = Fabric(tmp, **env)
    fab.start_broker()
    for i in range(workers):
        fab.start_worker(f"bench-{i}")
    return fab


def _phase(c: Any, n: int, broker_pid: int) -> tuple[float, float]:
    """(jobs/s, the broker's CPU microseconds per job) of one pipelined run."""
    cpu0 = cpu_seconds(broker_pid)
    jps = pipelined(c, n)
    return jps, (cpu_seconds(broker_pid) - cpu0) / n * 1e6


def run(quick: bool = False) -> dict[str, float]:
    import zmq

    from zfab import Client, Settings, Subscriber

    n, trials, workers = (5000, 3, 2) if quick else (20_000, 5, 2)
    out: dict[str, float] = {}
    phases: dict[str, list[tuple[float, float]]] = {"off": [], "none": [], "idle": [], "reading": []}
    with tempfile.TemporaryDirectory(prefix="zfab-bench-topics-") as tmp:
        fab = _fabric(tmp + "/off", None, workers)
        with fab, Client(settings=Settings(broker=fab.endpoint), name="bench") as c:
            wait_mmi_workers(c, workers)
            pipelined(c, 2000)
            assert fab.broker is not None
            phases["off"] = [_phase(c, n, fab.broker.pid) for _ in range(trials)]
        events = f"tcp://127.0.0.1:{free_port()}"
        fab = _fabric(tmp + "/on", events, workers)
        with fab, Client(settings=Settings(broker=fab.endpoint), name="bench") as c:
            wait_mmi_workers(c, workers)
            pipelined(c, 2000)
            assert fab.broker is not None
            pid = fab.broker.pid
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            got = missed = 0
            for _ in range(trials):  # interleaved: drift of the machine falls on every phase alike
                phases["none"].append(_phase(c, n, pid))
                idle = ctx.socket(zmq.SUB)  # owned by this thread; never read
                idle.setsockopt(zmq.LINGER, 0)
                idle.connect(events)
                idle.setsockopt(zmq.SUBSCRIBE, b"job.")
                time.sleep(0.3)  # connected and subscribed (a bench, not a test: no welcome read)
                phases["idle"].append(_phase(c, n, pid))
                idle.close(0)
                with Subscriber(events, "job.", queue_size=100_000) as reader:
                    counted = threading.Thread(target=lambda r=reader: sum(1 for _ in r), daemon=True)
                    counted.start()  # takes every event from the subscriber, as an application would
                    phases["reading"].append(_phase(c, n, pid))
                    time.sleep(0.2)
                    got, missed = got + reader.received, missed + reader.missed + reader.dropped
    med = {k: (statistics.median(j for j, _ in v), statistics.median(u for _, u in v)) for k, v in phases.items()}
    names = {
        "off": "events off",
        "none": "events on, no subscriber",
        "idle": "a subscriber reading nothing",
        "reading": "a subscriber reading all",
    }
    for key, label in names.items():
        jps, us = med[key]
        out[f"{key}_jps"], out[f"{key}_broker_us_per_job"] = jps, us
        base = med["off" if key == "none" else "none"]
        vs = "off" if key == "none" else "no subscriber"
        if key == "off":
            report(f"pipelined jobs/s, {label}", jps, "/s")
            report(f"broker CPU per job, {label}", us, "us")
        else:
            report(f"pipelined jobs/s, {label}", jps, "/s", base[0], vs=vs)
            report(f"broker CPU per job, {label}", us, "us", base[1], higher_is_better=False, vs=vs)
    print(f"   the reading subscriber got {got} events and lost {missed} over {trials * n} jobs")
    out["reader_events"], out["reader_lost"] = float(got), float(missed)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    run(quick=p.parse_args().quick)


if __name__ == "__main__":
    main()
