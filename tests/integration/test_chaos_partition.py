"""Partitions (issue 39): a worker in a network namespace of the test's own, its link cut with
iptables DROP rules past the broker's hold time while it holds prefetched jobs. What the broker gave
up must never start on it when the link heals; executions are counted by the task itself. Root only
(skipped with the reason elsewhere; required under CI=true)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fabric import fabric, wait_for
from netns import netns

from tests.integration.declared_workers import marks
from zfab import Client, Settings
from zfab.errors import WorkerLostError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

COUNTER = "tests.integration.declared_workers:Counter"


@pytest.mark.parametrize("retries", [0, 1])
def test_a_worker_cut_past_its_hold_time_never_starts_the_jobs_its_broker_gave_up(tmp_path: Path, retries: int) -> None:
    marks_file = tmp_path / "marks"
    env = {"ZFAB_TEST_MARKS": str(marks_file), "ZFAB_POOL_SIZE": "1", "ZFAB_WORKER_PREFETCH": "3"}
    with netns() as ns, fabric(tmp_path, host=ns.host_ip) as f:
        f.broker("broker", "--insecure")  # on the veth pair of this test's own namespace, not a real network
        f.start("cut", "worker", "--worker", COUNTER, "--name", "cut", env=env, prefix=ns.prefix())
        s = Settings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier)
        with Client(settings=s, name="chaos").start() as c:
            wait_for(lambda: any(w["name"] == "cut" and w["alive"] for w in c.mmi("show_workers")), 30, what="cut")
            # Given a worker running one job and holding three more it has not started
            run = c.submit("count", "mark", kwargs={"token": "run", "seconds": 4.0}, retries=0, timeout=30)
            wait_for(lambda: marks(marks_file, "run") == 1, 15, what="the first job started")
            held = {
                f"held{n}": c.submit("count", "mark", kwargs={"token": f"held{n}"}, retries=retries, timeout=30)
                for n in range(3)
            }
            for fut in held.values():
                fut.admission.result(10)
                wait_for(lambda fut=fut: fut.worker == "cut" or bool(fut.dispatched), 10, what="dispatched")
            # When its link is cut well past the hold time (and, with retries, another worker is there)
            ns.cut()
            cut_at = time.monotonic()
            if retries:
                f.start("spare", "worker", "--worker", COUNTER, "--name", "spare", env=env)
            for token, fut in held.items():
                if retries:
                    result = fut.result(30)
                    assert list(result) == ["spare"] and fut.attempt == 2, (token, result)
                else:
                    with pytest.raises(WorkerLostError):
                        fut.result(30)
            wait_for(lambda: time.monotonic() - cut_at > 3 * f.hold_time, 10, what="three hold times")
            ns.heal()
            # Then the worker comes back, and none of the jobs its broker gave up starts on it
            wait_for(lambda: any(w["name"] == "cut" and w["alive"] for w in c.mmi("show_workers")), 30, what="back")
            wait_for(lambda: marks(marks_file, "run") == 1 and time.monotonic() - cut_at > 6.0, 15, what="run's end")
            for token in held:
                assert marks(marks_file, token) == retries, (token, f.log("cut")[-2000:])
            with pytest.raises(WorkerLostError):
                run.result(1)  # the broker lost it: it ran, and says so as lost
            assert marks(marks_file, "run") == 1
        assert "dropped 3 jobs it had not started" in f.log("cut")
