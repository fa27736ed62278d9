"""Issue 31: a flood of READY frames from one peer, each for a new service, must not leave the
broker's memory behind it (docs/broker-memory.md).

The integration test floods a real broker through a raw DEALER and measures the broker process's
RSS (VmRSS of /proc/<pid>/status); the others check the trim policy (service/broker/memory.py)
on a fake clock and a fake trim.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq
from fabric import fabric, wait_for, wait_workers

from zfab.broker.memory import LOOK_EVERY, MAX_DEFER, QUIET, STEP, MemoryKeeper

FLOOD = 100_000  # READY frames, as the issue sends them
NAME_BYTES = 200  # each one's service name, new every frame
MAX_GROWTH = 25_000_000  # what the issue allows the flood to leave: under 25 MB
TIGHT_GROWTH = 10 * 1024 * 1024  # twice what it left with its bounds here (3.3-5.3 MiB)


def vm_rss(pid: int) -> int:
    """The process's resident set, in bytes (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def send_flood(endpoint: str, broker_pid: int) -> tuple[int, float]:
    """One DEALER sends FLOOD READY frames, each for a new service; returns the broker's highest RSS
    seen meanwhile and the seconds it took (the broker reads at its pace: its sender waits)."""
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    try:
        peer.setsockopt(zmq.SNDTIMEO, 10_000)  # a broker that stops reading fails the test here
        peer.setsockopt(zmq.RCVTIMEO, 1000)
        peer.setsockopt(zmq.IDENTITY, b"flood")
        peer.connect(endpoint)
        peak, t0 = 0, time.monotonic()
        for i in range(FLOOD):
            peer.send_multipart([b"", b"NFPW01", b"0x01", b"%08d" % i + b"x" * (NAME_BYTES - 8)])
            if i % 5000 == 0:
                peak = max(peak, vm_rss(broker_pid))
        return peak, time.monotonic() - t0
    finally:
        peer.close(linger=30_000)  # what its queue still holds goes out first (bounded)
        ctx.term()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_ready_flood_from_one_peer_leaves_under_25_mb_and_a_real_worker_serves_at_once(tmp_path: Path) -> None:
    # The broker's defaults, keepalives included (fabric() makes them short for other tests).
    with fabric(tmp_path, interval=2.5, multiplier=6) as f:
        broker = f.broker()
        c = f.client()
        try:
            wait_for(lambda: bool(c.mmi("show_broker", timeout=2)), 20, what="the broker answering MMI")
            flood_end = int(c.mmi("show_broker", timeout=2)["frames_received"]) + FLOOD
            before = vm_rss(broker.pid)
            peak, sent_s = send_flood(f.endpoint, broker.pid)

            def read_all() -> bool:
                nonlocal peak
                peak = max(peak, vm_rss(broker.pid))
                return int(c.mmi("show_broker", timeout=2)["frames_received"]) >= flood_end

            wait_for(read_all, 60, interval=0.2, what=f"the broker reading the {FLOOD:,} READY frames")

            # Once it has looked at its RSS after the flood, any trim that fell due has run (memory.py).
            def settled() -> bool:
                facts = c.mmi("show_broker", timeout=2)
                return int(facts["memory_looked_at_frames"]) >= flood_end and not facts["memory_trim_due"]

            wait_for(settled, MAX_DEFER + 3 * LOOK_EVERY, interval=0.2, what="the broker's look at its memory")
            facts = c.mmi("show_broker", timeout=2)
            growth, peak_growth = vm_rss(broker.pid) - before, peak - before
            summary = (
                f"RSS {mib(before)} before, +{mib(growth)} after the flood (peak seen +{mib(peak_growth)}); "
                f"sent in {sent_s:.1f} s; {facts['memory_trims']} trims released "
                f"{mib(facts['memory_released_bytes'])}"
            )
            print(summary)
            assert growth < MAX_GROWTH, summary
            assert peak_growth < MAX_GROWTH, summary
            # What the bounds allow (1,000 service records, a peer's 1,000 waiting messages). Without
            # them this test measured 8.9-11.4 MiB here, under the 25 MB (the issue saw 55).
            assert growth < TIGHT_GROWTH, summary
            # The services table held to its bound, and nothing was refused or logged per frame.
            assert facts["services"] == facts["services_capacity"] == 1000
            assert facts["frames_rejected"] == {}, facts["frames_rejected"]
            assert len(f.log("broker").splitlines()) < 20, f.log("broker")[-2000:]

            # A real worker that registers now is served at once.
            f.worker("w1")
            wait_workers(c, {"w1"}, timeout=20)
            t1 = time.monotonic()
            r = c.run_job("demo", "echo", kwargs={"data": "after the flood"}, timeout=10)
            took = time.monotonic() - t1
            assert r["w1"]["result"] == "after the flood" and not r["w1"]["failed"], json.dumps(r)[:500]
            assert took < 2.0, f"the first job after the flood took {took:.2f} s"
        finally:
            c.close()


# ---- the trim policy, on a fake clock (no process) ----------------------------------------------


class FakeProcess:
    """A process whose RSS the test moves, and a trim that gives back what is above `live`."""

    def __init__(self) -> None:
        self.rss = self.live = 100 * 2**20
        self.trims = 0

    def trim(self) -> int:
        self.trims += 1
        self.rss = self.live
        return 1


def keeper() -> tuple[MemoryKeeper, FakeProcess]:
    p = FakeProcess()
    return MemoryKeeper(trim=p.trim, rss=lambda: p.rss), p


def test_an_idle_broker_is_not_woken_and_small_growth_is_left_alone() -> None:
    k, p = keeper()
    assert k.tend(0.0, 0) is None  # the first look takes the base
    assert k.tend(5.0, 0) is None  # idle: no look, no wake-up
    assert k.tend(6.0, 400) is None  # traffic that grows nothing (keepalives): no wake-up either
    p.rss += STEP - 1
    assert k.tend(7.0, 410) == 7.0 + LOOK_EVERY  # growing with traffic: it looks again in a second
    assert k.tend(7.5, 420) == 7.0 + LOOK_EVERY  # between looks: the deadline stands
    assert k.tend(8.0, 420) == 9.0  # ten more since the last look: once more
    assert k.tend(9.0, 420) is None  # idle, grown less than STEP: nothing to do, no wake-up
    assert k.tend(9.5, 420 + QUIET - 1) is None  # fewer than QUIET since: no wake-up for a look
    assert k.tend(9.6, 420 + QUIET) == 10.0  # a burst: its look comes even if the loop sleeps
    assert p.trims == 0 and not k.due


def test_growth_past_step_is_trimmed_once_traffic_quiets_and_counted() -> None:
    k, p = keeper()
    k.tend(0.0, 0)
    p.rss += STEP  # a burst: the receive path's buffers
    assert k.tend(1.0, 5 * QUIET) == 2.0  # due, but traffic flows: wait for quiet
    assert k.due and p.trims == 0
    p.live += 2**20  # what stays (service records)
    assert k.tend(2.0, 5 * QUIET + QUIET - 1) is None  # quiet: trimmed
    assert p.trims == 1 and p.rss == p.live and not k.due
    facts = k.facts(3.0)
    assert facts["memory_trims"] == 1 and facts["memory_released_bytes"] == STEP - 2**20
    assert facts["memory_last_trim"]["age_s"] == 1.0 and facts["memory_last_trim"]["quiet"]
    assert k.tend(10.0, 6 * QUIET + 5) is None and p.trims == 1  # grown nothing since: left alone


def test_traffic_that_never_quiets_is_trimmed_after_max_defer_and_once_more_when_it_does() -> None:
    k, p = keeper()
    k.tend(0.0, 0)
    p.rss += 2 * STEP
    now, received = 0.0, 0
    while p.trims == 0 and now < 2 * MAX_DEFER:
        now += LOOK_EVERY
        received += 10 * QUIET
        k.tend(now, received)
    assert p.trims == 1 and MAX_DEFER <= now <= MAX_DEFER + 2 * LOOK_EVERY  # forced, under traffic
    assert k.due  # a quiet one is owed: what was in use then is freed later
    p.rss += STEP // 2  # freed after the trim, not given back (less than STEP)
    assert k.tend(now + LOOK_EVERY, received + 10 * QUIET) == now + 2 * LOOK_EVERY  # still busy: no trim
    assert k.tend(now + 2 * LOOK_EVERY, received + 10 * QUIET + 1) is None  # quiet: the owed one runs
    assert p.trims == 2 and not k.due


def test_without_malloc_trim_it_never_looks() -> None:
    k = MemoryKeeper(trim=None, rss=lambda: None)
    assert k.tend(0.0, 0) is None and k.tend(5.0, 10**6) is None
    assert k.facts(0.0)["memory_trims"] == 0 and k.facts(0.0)["memory_trim_step_bytes"] is None
