"""Faults: lost and stopped workers, broker restarts under load, hostile frames, slow clients, worker restarts."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import zmq
from fabric import alive_workers, fabric, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zfab import JobError, JobNotFoundError, JobTimeoutError, WorkerLostError

pytestmark = pytest.mark.integration


def test_a_lost_worker_job_runs_once_elsewhere_when_retries_are_asked(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=3) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_for(lambda: alive_workers(c) == {"w1", "w2"}, 20, what="both workers")
            fut = c.submit("demo", "sleep", kwargs={"seconds": 1.0}, timeout=30, retries=1)
            wait_for(lambda: fut.worker is not None, 5, what="dispatch")
            victim = fut.worker
            assert victim is not None
            f.kill(victim)
            result = fut.result(20)
            (survivor,) = result
            assert survivor != victim and result[survivor]["failed"] is False
            assert "retried" in fut.timings
            # without retries the same loss is a definite error
            fut2 = c.submit("demo", "sleep", kwargs={"seconds": 5}, timeout=30)
            wait_for(lambda: fut2.worker is not None, 5, what="dispatch")
            f.kill(survivor)
            with pytest.raises(WorkerLostError):
                fut2.result(20)


def test_a_stopped_worker_is_dropped_then_rejoins_and_its_stale_result_is_discarded(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=3) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_for(lambda: alive_workers(c) == {"w1", "w2"}, 20, what="both workers")
            fut = c.submit("demo", "sleep", kwargs={"seconds": 1.5}, timeout=30, retries=1)
            wait_for(lambda: fut.worker is not None, 5, what="dispatch")
            frozen = fut.worker
            assert frozen is not None
            f.signal(frozen, signal.SIGSTOP)
            wait_for(lambda: frozen not in alive_workers(c), f.hold_time + 3, what="the stopped worker dropped")
            result = fut.result(20)
            (other,) = result
            assert other != frozen
            f.signal(frozen, signal.SIGCONT)
            wait_for(lambda: alive_workers(c) == {"w1", "w2"}, 10, what="the stopped worker back")
            # its own run of the job finishes and is thrown away: the result stays the one we got
            wait_for(
                lambda: c.counts["late"] + c.mmi("show_broker")["counts"].get("stale_results", 0) >= 1,
                10,
                what="the stale result discarded",
            )
            assert fut.result() == result


def test_every_job_ends_definitely_and_once_across_a_broker_restart(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker("b1")
        f.worker("w1")
        f.worker("w2")
        futures: list[Future[Any]] = []
        with f.client(poll_after=0.5) as c:
            wait_for(lambda: alive_workers(c) == {"w1", "w2"}, 20, what="both workers")
            stop = threading.Event()

            def submit_stream() -> None:
                i = 0
                while not stop.is_set() and i < 400:
                    futures.append(c.submit("demo", "sleep", kwargs={"seconds": 0.05}, timeout=30))
                    i += 1
                    stop.wait(0.01)

            t = threading.Thread(target=submit_stream)
            t.start()
            wait_for(lambda: len(futures) >= 80, 10, what="submissions under way")
            f.kill("b1")
            f.broker("b2")
            t.join(30)
            stop.set()
            kinds: list[str] = []
            for fut in futures:
                try:
                    r = fut.result(40)
                    assert len(r) == 1 and not next(iter(r.values()))["failed"], r
                    kinds.append("ok")
                except JobError as exc:
                    kinds.append(type(exc).__name__)
            # Every job ended, with a result or with a specific error: jobs sent while the new
            # broker had no workers yet are refused at once, not lost; once the workers are
            # back, everything runs.
            assert set(kinds) <= {"ok", "NoWorkersError"}, set(kinds)
            assert kinds[:50] == ["ok"] * 50 and kinds[-20:] == ["ok"] * 20, kinds
    # None ran twice: no job uuid is in both workers' stores.
    stores = [sqlite3.connect(tmp_path / "data" / "workers" / f"{w}.sqlite") for w in ("w1", "w2")]
    ran = [{r[0] for r in db.execute("SELECT uuid FROM jobs")} for db in stores]
    assert not (ran[0] & ran[1]), f"{len(ran[0] & ran[1])} of {len(ran[0] | ran[1])} ran on both"


def test_a_restarted_worker_still_answers_for_its_stored_jobs(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=3) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1")
            done = c.run_job("demo", "echo", kwargs={"data": "kept"}, timeout=10)
            done_uuid = done["w1"]["juuid"]
            running = c.submit("demo", "sleep", kwargs={"seconds": 30}, timeout=60)
            wait_for(lambda: running.worker == "w1", 5, what="dispatch")
            f.kill("w1")
            with pytest.raises(WorkerLostError):
                running.result(10)
            f.worker("w1")
            wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1 back")
            again = c.recover("demo", done_uuid, ["w1"]).result(10)
            assert again["w1"]["result"] == "kept"
            cut = c.recover("demo", running.uuid, ["w1"]).result(10)
            assert cut["w1"]["failed"] is True and "interrupted" in cut["w1"]["errors"][0]
            with pytest.raises(JobNotFoundError):
                c.recover("demo", "no-such-job", ["w1"]).result(10)


def test_results_reported_just_before_a_kill_are_answered_after_the_restart(tmp_path: Path) -> None:
    # Given a worker killed (SIGKILL) the moment its last results came back: they were reported once
    # durable in its job store's journal, and its writer folds them into SQLite only every 50 ms
    with fabric(tmp_path, interval=0.3, multiplier=3) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1")
            futures = [c.submit("demo", "echo", kwargs={"data": i}) for i in range(20)]
            assert [fut.result(10)["w1"]["result"] for fut in futures] == list(range(20))
            uuids = [fut.uuid for fut in futures]
            f.kill("w1")
            # When it comes back, then every reported job answers with its result, none as interrupted
            f.worker("w1")
            wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1 back")
            answers = [c.recover("demo", uuid, ["w1"]).result(10)["w1"] for uuid in uuids]
            assert [a["result"] for a in answers] == list(range(20))
            assert not any(a["failed"] for a in answers)


frames_strategy = st.lists(st.binary(max_size=40), min_size=0, max_size=9).map(lambda fs: fs or [b""])
prefixed = st.tuples(
    st.sampled_from(
        [[], [b""], [b"", b"NFPC01"], [b"", b"NFPW01"], [b"", b"NFPC01", b"0x04"], [b"", b"NFPW01", b"0x05"]]
    ),
    st.lists(st.binary(max_size=20), max_size=6),
).map(lambda t: (t[0] + t[1]) or [b""])


def test_hypothesis_frames_never_stop_a_live_broker(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.SNDTIMEO, 5000)
        raw.connect(f.endpoint)
        sent = [0]

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.one_of(frames_strategy, prefixed))
        def send(frames: list[bytes]) -> None:
            raw.send_multipart(frames)
            sent[0] += 1

        try:
            with f.client() as c:
                wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1")
                send()
                wait_for(lambda: sum(c.mmi("show_broker")["frames_rejected"].values()) > 0, 10, what="rejections")
                assert c.run_job("demo", "echo", kwargs={"data": "alive"}, timeout=10)["w1"]["result"] == "alive"
        finally:
            raw.close(0)
            ctx.term()
        assert f.procs["broker"].poll() is None and sent[0] >= 100


def test_a_client_that_never_reads_does_not_stall_others(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        ctx = zmq.Context()
        slow = ctx.socket(zmq.DEALER)
        slow.setsockopt(zmq.LINGER, 0)
        slow.setsockopt(zmq.RCVHWM, 1)
        slow.setsockopt(zmq.SNDTIMEO, 1000)
        slow.connect(f.endpoint)
        try:
            with f.client() as c:
                wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1")
                body = b'{"task":"show_broker","kwargs":{}}'
                for i in range(20_000):
                    slow.send_multipart([b"", b"NFPC01", b"0x11", b"mmi.service.broker", b"any", str(i).encode(), body])
                t0 = time.monotonic()
                for i in range(50):
                    assert c.run_job("demo", "echo", kwargs={"data": i}, timeout=10)["w1"]["result"] == i
                assert time.monotonic() - t0 < 15
                # replies the slow client could not take are dropped, not queued without bound
                wait_for(lambda: c.mmi("show_broker")["frames_send_dropped"] > 0, 30, what="dropped replies")
        finally:
            slow.close(0)
            ctx.term()


def test_delete_ends_a_queued_job_at_once_and_a_running_one_cooperatively(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.env["ZFAB_POOL_SIZE"] = "1"
        f.env["ZFAB_WORKER_PREFETCH"] = "1"  # the second job waits on the worker, not in the broker's queue
        f.worker("w1")
        with f.client() as c:
            wait_for(lambda: alive_workers(c) == {"w1"}, 20, what="w1")
            running = c.submit("demo", "sleep", kwargs={"seconds": 30}, timeout=60)
            queued = c.submit("demo", "sleep", kwargs={"seconds": 30}, timeout=60)
            wait_for(lambda: queued.worker == "w1" and running.worker == "w1", 5, what="both dispatched")
            t0 = time.monotonic()
            assert c.cancel(queued.uuid)
            q = queued.result(5)["w1"]
            assert q["status"] == "cancelled" and "before it started" in q["errors"][0]
            assert c.cancel(running.uuid)
            r = running.result(5)["w1"]
            assert r["status"] == "cancelled" and r["failed"] is True
            assert time.monotonic() - t0 < 3
            # a job past its deadline ends as timed out on the worker too
            fut = c.submit("demo", "sleep", kwargs={"seconds": 5}, timeout=0.5)
            with pytest.raises(JobTimeoutError):
                fut.result(5)
            stored = c.recover("demo", fut.uuid, ["w1"]).result(10)["w1"]
            assert stored["status"] in ("timeout", "cancelled") and stored["failed"] is True
