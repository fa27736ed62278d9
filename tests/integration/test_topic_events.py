"""Event subscriptions by topic prefix (issue 30, part 1): the broker's XPUB publisher, real processes.

A subscriber to `job.demo.` sees every demo job's state changes in order and nothing of another
service; one that reads nothing stalls no job and its losses are counted; prefixes and
subscriptions are bounded.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
import zmq
from fabric import Fabric, fabric, free_port, wait_for, wait_workers
from prometheus_client.parser import text_string_to_metric_families
from test_security import curve_client, keys

from zfab import Settings, Subscriber
from zfab.client.subscriber import SubscriptionError
from zfab.transport.security import curve_client as curve_sub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FINAL = {"completed", "failed", "cancelled", "expired", "lost"}


def _start(f: Fabric) -> tuple[str, int]:
    """Broker (events on, metrics on a port), a demo worker and one of demo-async (a longer name, same start)."""
    events, mport = f"tcp://127.0.0.1:{free_port()}", free_port()
    f.env["ZFAB_BROKER_EVENTS"] = events
    f.broker("broker", "--metrics-port", str(mport))
    f.worker("w1", "demo")
    f.worker("o1", "demo-async")
    return events, mport


def _metrics(port: int) -> dict[str, float]:
    """The broker's zfab_broker_event* samples by name (labels joined in)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text):
        for s in fam.samples:
            if s.name.startswith("zfab_broker_event"):
                out[s.name + "".join(f".{v}" for v in s.labels.values())] = s.value
    return out


def _drain(sub: Subscriber, until: int, timeout: float) -> list[dict[str, object]]:
    """Events until `until` jobs have a final one (or the deadline)."""
    got: list[dict[str, object]] = []
    finals = 0
    deadline = time.monotonic() + timeout
    while finals < until and time.monotonic() < deadline:
        ev = sub.get(timeout=max(0.0, deadline - time.monotonic()))
        if ev is None:
            break
        got.append(ev)
        finals += ev["state"] in FINAL
    return got


def test_a_demo_subscriber_sees_every_demo_job_in_order_and_nothing_else(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events, mport = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1", "o1"})
            with c.subscribe("job.demo.", endpoint=events) as sub:
                n = 1000
                futures = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(n)]
                futures += [c.submit("demo", "fail", timeout=60)]
                others = [c.submit("demo-async", "nap", kwargs={"seconds": 0}, timeout=60) for i in range(50)]
                for fut in futures + others:
                    fut.result(60)
                got = _drain(sub, n + 1, 30)
        assert {e["service"] for e in got} == {"demo"}
        assert all(str(e["topic"]).startswith("job.demo.") for e in got)
        by_job: dict[str, list[str]] = defaultdict(list)
        for e in got:
            by_job[str(e["uuid"])].append(str(e["state"]))
        assert len(by_job) == n + 1
        for states in by_job.values():
            assert states[0] == "queued" and states[-1] in FINAL, states
            assert states.count(states[-1]) == 1 and all(s in ("queued", "running") for s in states[:-1]), states
        ends = [str(e["state"]) for e in got if e["state"] in FINAL]
        assert ends.count("completed") == n and ends.count("failed") == 1
        assert {str(e["topic"]) for e in got if e["state"] == "failed"} == {"job.demo.fail.failed"}
        seqs = [int(str(e["seq"])) for e in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # in the order the broker saw them
        assert sub.missed == 0 and sub.dropped == 0
        m = _metrics(mport)
        assert m["zfab_broker_events_published_total"] >= len(got) and m["zfab_broker_events_dropped_total"] == 0


def test_a_retried_attempts_failure_reads_retrying_and_only_the_jobs_end_is_final(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events, _ = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1", "o1"})
            with c.subscribe("job.demo.", endpoint=events) as sub:
                # Given a task that fails its first attempt and is retried (0.1 s later), and one that always fails
                ok = c.submit("demo", "flaky", kwargs={"failures": 1}, retries=1, backoff=0.1, timeout=30)
                bad = c.submit("demo", "fail", retries=1, backoff=0.1, timeout=30)
                assert ok.result(30)["w1"]["result"] == {"attempt": 2}
                last = bad.result(30)["w1"]
                assert last["failed"] and last["attempt"] == 2 and "retry" not in last
                got = _drain(sub, 2, 20)
        by_attempt = {(str(e["uuid"]), str(e["state"])) for e in got}
        # Then each first attempt's failure is `retrying`, and each job has one final event: its last attempt's
        for job, end in ((ok.uuid, "completed"), (bad.uuid, "failed")):
            assert (job, "retrying") in by_attempt and (f"{job}~2", end) in by_attempt, sorted(by_attempt)
            assert not {s for u, s in by_attempt if u == job} & FINAL, sorted(by_attempt)
        assert {str(e["topic"]) for e in got if e["state"] == "retrying"} == {
            "job.demo.flaky.retrying",
            "job.demo.fail.retrying",
        }


def test_a_subscriber_that_reads_nothing_stalls_no_job_and_its_losses_are_counted(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_BROKER_EVENTS_HWM"] = "100"
        events, mport = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1"})
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            idle = ctx.socket(zmq.SUB)  # owned by this thread; never read
            idle.setsockopt(zmq.RCVHWM, 10)
            idle.setsockopt(zmq.RCVBUF, 4096)
            idle.setsockopt(zmq.LINGER, 0)
            idle.connect(events)
            idle.setsockopt(zmq.SUBSCRIBE, b"")
            try:
                # A confirmed subscriber beside it that reads only at the end.
                sub = Subscriber(events, "job.", queue_size=50).start()
                t0 = time.monotonic()
                n = 3000
                window = []
                for i in range(n):
                    window.append(c.submit("demo", "echo", kwargs={"data": f"{i:05d}" + "x" * 200}, timeout=60))
                    if len(window) >= 200:
                        window.pop(0).result(30)
                for fut in window:
                    fut.result(30)
                took = time.monotonic() - t0
                assert took < 60, f"{n} jobs took {took:.1f} s with a subscriber that reads nothing"
                wait_for(lambda: sub.dropped + sub.missed > 0, 10, what="the slow subscriber's losses counted")
                sub.close()
                m = _metrics(mport)
                assert m["zfab_broker_events_published_total"] >= n and m["zfab_broker_event_subscriptions"] >= 1
            finally:
                idle.close(0)


def test_prefixes_and_subscriptions_are_bounded(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_BROKER_EVENTS_SUBSCRIPTIONS"] = "20"
        events, mport = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1"})
            with pytest.raises(ValueError, match="at most 256"):
                Subscriber(events, "j" * 10_000)
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            raw = ctx.socket(zmq.SUB)
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(events)
            try:
                raw.setsockopt(zmq.SUBSCRIBE, b"j" * 10_000)  # the broker closes this peer (MAXMSGSIZE)
                flood = ctx.socket(zmq.XSUB)
                flood.setsockopt(zmq.LINGER, 0)
                flood.connect(events)
                for i in range(5000):  # (libzmq's pipe itself passes about 2,000 of them: its HWM)
                    flood.send(b"\x01job.flood." + str(i).encode())
                # The publisher goes on: the peer's share (a tenth of the slots) accepted, the rest refused,
                # and it still publishes.

                def bounded() -> bool:
                    m = _metrics(mport)
                    return m["zfab_broker_event_subscriptions"] == 2 and (
                        m["zfab_broker_event_subscriptions_refused_total.per_peer"] >= 900
                    )

                wait_for(bounded, 20, what="the flood refused past the bound")
                flood.close(0)
                wait_for(lambda: _metrics(mport)["zfab_broker_event_subscriptions"] == 0, 20, what="unsubscribed")
                with c.subscribe("job.demo.", endpoint=events) as sub:
                    c.run_job("demo", "echo", kwargs={"data": 1}, timeout=30)
                    assert _drain(sub, 1, 10)[-1]["state"] == "completed"
            finally:
                raw.close(0)


def test_one_peer_holds_its_share_of_the_slots_and_leaves_the_rest_to_others(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_BROKER_EVENTS_SUBSCRIPTIONS"] = "20"  # a peer's share: 2
        events, mport = _start(f)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        socks: list[zmq.Socket[bytes]] = []

        def sub(*prefixes: bytes) -> zmq.Socket[bytes]:
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(events)
            for p in prefixes:
                s.setsockopt(zmq.SUBSCRIBE, p)
            socks.append(s)
            return s

        try:
            # Given one SUB socket that subscribes 1,200 prefixes (all the slots there are, and more)
            hog = sub(*(b"hog.%04d" % i for i in range(1200)))
            # (libzmq's pipe passes about 1,000 of them: its high-water mark drops the rest)
            wait_for(
                lambda: _metrics(mport)["zfab_broker_event_subscriptions_refused_total.per_peer"] >= 900,
                20,
                what="the hog's subscriptions past its share refused",
            )
            # Then another subscriber is still confirmed
            Subscriber(events, "job.demo.").start(5.0).close()
            assert _metrics(mport)["zfab_broker_event_subscriptions"] >= 2
            # And the total bound still holds against many peers: 10 more SUBs of 2 prefixes each
            for i in range(10):
                sub(b"many.%d.a" % i, b"many.%d.b" % i)
            wait_for(
                lambda: (
                    _metrics(mport)["zfab_broker_event_subscriptions"] == 20
                    and _metrics(mport)["zfab_broker_event_subscriptions_refused_total.too_many"] >= 2
                ),
                20,
                what="the total bound reached and held",
            )
            # When the hog leaves, its slots are free again
            hog.close(0)
            wait_for(lambda: _metrics(mport)["zfab_broker_event_subscriptions"] == 18, 20, what="the hog's slots freed")
        finally:
            for s in socks:
                s.close(0)
            ctx.term()


def test_events_off_by_default_and_subscribe_needs_an_endpoint(tmp_path: Path) -> None:
    s = Settings()
    assert s.broker_events is None
    with pytest.raises(Exception, match="did not confirm"):
        Subscriber(f"tcp://127.0.0.1:{free_port()}", "job.").start(timeout=0.5)


def test_workers_that_come_and_go_are_published_under_worker_topics(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events, _ = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1", "o1"})
            with c.subscribe("worker.demo.", endpoint=events) as sub:
                f.worker("w2", "demo")
                first = sub.get(timeout=20)
                assert first is not None and (first["topic"], first["worker"]) == ("worker.demo.w2.ready", "w2")
                f.kill("w2")  # SIGKILL: no DISCONNECT; the broker purges it after its hold time
                gone = sub.get(timeout=20)
                assert gone is not None and gone["topic"] == "worker.demo.w2.lost" and gone["why"]
                assert sub.get(timeout=0.5) is None  # nothing of demo-async's worker, nor of any job


def test_a_jobs_progress_events_are_published_under_event_topics(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events, _ = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1", "o1"})
            with c.subscribe("event.demo.", endpoint=events) as sub:
                fut = c.submit("demo", "progress", kwargs={"steps": 3, "delay": 0}, timeout=30)
                c.submit("demo-async", "nap", kwargs={"seconds": 0}, timeout=30).result(30)
                fut.result(30)
                got = [sub.get(timeout=10) for _ in range(3)]
                assert sub.get(timeout=0.5) is None  # nothing of demo-async, no job state, no queue
        assert all(e is not None for e in got)
        assert [(e["topic"], e["uuid"], e["worker"], e["task"]) for e in got if e] == [
            ("event.demo.w1", fut.uuid, "w1", "progress")
        ] * 3
        assert [(e["message"], e["progress"], e["event_type"], e["severity"]) for e in got if e] == [
            (f"step {i} of 3", i / 3, "progress", "INFO") for i in (1, 2, 3)
        ]


def test_queue_changes_are_published_coalesced_and_pauses_at_once(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events, _ = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1", "o1"})
            with c.subscribe("queue.demo", endpoint=events) as sub:
                paused = c.mmi("pause_service", service="demo")
                assert paused["paused"] is True
                first = sub.get(timeout=10)
                assert first is not None and (first["topic"], first["paused"], first["depth"]) == (
                    "queue.demo",
                    True,
                    0,
                )
                n = 500
                t0 = time.monotonic()
                futures = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(n)]

                def depth() -> int:
                    return int(next(s["queue_depth"] for s in c.mmi("show_services") if s["service"] == "demo"))

                wait_for(lambda: depth() == n, 20, what="all queued")
                c.mmi("resume_service", service="demo")
                for fut in futures:
                    fut.result(60)
                took = time.monotonic() - t0
                seen = []
                deadline = time.monotonic() + 10
                while not seen or seen[-1]["depth"] != 0:
                    e = sub.get(timeout=max(0.0, deadline - time.monotonic()))
                    assert e is not None, f"the queue's return to 0 was not published: {seen[-3:]}"
                    seen.append(e)
        assert {e["topic"] for e in seen} == {"queue.demo"}  # not queue.demo-async, a prefix's neighbour
        resumed = [e for e in seen if not e["paused"]]
        assert resumed and resumed[0]["depth"] == n  # told at the moment of the resume
        assert all(e["capacity"] > 0 and e["bytes"] >= 0 for e in seen)
        # 1,000 changes of the queue (500 in, 500 out), published a few times a second, not per job
        assert len(seen) <= 2 + 4 * (took + 1) + 2, (len(seen), took)
        assert [e["tseq"] for e in seen] == list(range(2, 2 + len(seen)))


def test_with_curve_only_a_known_key_subscribes(tmp_path: Path) -> None:
    k = keys(tmp_path)
    with fabric(tmp_path) as f:
        events = f"tcp://127.0.0.1:{free_port()}"
        f.env.update(ZFAB_BROKER_EVENTS=events)
        f.env.update(ZFAB_CURVE_SECRET=str(k["broker"][1]), ZFAB_CURVE_CLIENTS=str(tmp_path / "allowed"))
        mport = free_port()
        f.broker("broker", "--metrics-port", str(mport))
        f.env.pop("ZFAB_CURVE_CLIENTS")
        f.env.update(ZFAB_CURVE_SECRET=str(k["w1"][1]), ZFAB_CURVE_SERVER_KEY=str(k["broker"][0]))
        f.worker("w1")

        def settings(secret: Path | None, server: Path | None) -> Settings:
            return Settings(
                broker=f.endpoint,
                curve_secret=str(secret) if secret else None,
                curve_server_key=str(server) if server else None,
            )

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        with curve_client(f, k["client"][1], k["broker"][0], "good") as c:
            wait_for(lambda: {w["name"] for w in c.mmi("show_workers", timeout=1)} == {"w1"}, 20, what="w1 over CURVE")
            strangers = []
            for secret, server in ((k["stranger"][1], k["broker"][0]), (None, None)):
                # A key the broker does not know, and plain NULL security: never confirmed
                with pytest.raises(SubscriptionError):
                    Subscriber(events, "job.", settings=settings(secret, server)).start(timeout=1.5)
                # and a bare SUB of each (this thread's) left subscribed to everything while a job runs
                raw = ctx.socket(zmq.SUB)
                raw.setsockopt(zmq.LINGER, 0)
                raw.setsockopt(zmq.RCVTIMEO, 1000)
                if secret is not None and server is not None:
                    curve_sub(raw, str(secret), str(server))
                raw.connect(events)
                raw.setsockopt(zmq.SUBSCRIBE, b"")
                strangers.append(raw)
            try:
                with Subscriber(events, "job.demo.", settings=settings(k["client"][1], k["broker"][0])) as sub:
                    assert c.run_job("demo", "echo", kwargs={"data": "s"}, timeout=10)["w1"]["result"] == "s"
                    got = _drain(sub, 1, 10)
                assert [e["state"] for e in got][-1] == "completed" and got[0]["state"] == "queued"
                for raw in strangers:
                    with pytest.raises(zmq.Again):
                        raw.recv_multipart()  # (RCVTIMEO: 1 s) nothing reached it, not even a welcome
                # A known key's prefixes are bounded as without CURVE: refused past 256 bytes, and a
                # frame past the handshake's room closes the peer (the publisher goes on either way).
                for size in (600, 10_000):
                    long = ctx.socket(zmq.SUB)
                    long.setsockopt(zmq.LINGER, 0)
                    curve_sub(long, str(k["client"][1]), str(k["broker"][0]))
                    long.connect(events)
                    long.setsockopt(zmq.SUBSCRIBE, b"j" * size)
                    strangers.append(long)
                wait_for(
                    lambda: _metrics(mport).get("zfab_broker_event_subscriptions_refused_total.too_long", 0) >= 1,
                    10,
                    what="the 600-byte prefix refused",
                )
                with Subscriber(events, "job.", settings=settings(k["client"][1], k["broker"][0])) as sub:
                    c.run_job("demo", "echo", kwargs={"data": "again"}, timeout=10)
                    assert _drain(sub, 1, 10)[-1]["state"] == "completed"
                assert "unknown public key" in f.log("broker")  # the stranger was refused by ZAP
                # the 10,000-byte frame never reached the publisher's thread (libzmq closed that peer)
                assert _metrics(mport)["zfab_broker_event_subscriptions_refused_total.too_long"] == 1
            finally:
                for raw in strangers:
                    raw.close(0)


def test_each_jobs_hop_trace_is_published_under_trace_topics(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        events, _ = _start(f)
        with f.client() as c:
            wait_workers(c, {"w1", "o1"})
            with c.subscribe("trace.demo.", endpoint=events) as sub:
                futures = [c.submit("demo", "sleep", kwargs={"seconds": 0.02}, timeout=60) for _ in range(20)]
                futures += [c.submit("demo-async", "nap", kwargs={"seconds": 0}, timeout=60) for _ in range(5)]
                for fut in futures:
                    fut.result(60)
                got: list[dict[str, object]] = []
                deadline = time.monotonic() + 10
                while len(got) < 20 and time.monotonic() < deadline:
                    ev = sub.get(timeout=max(0.0, deadline - time.monotonic()))
                    if ev is None:
                        break
                    got.append(ev)
        assert len(got) == 20, got[-3:]
        by_uuid = {fut.uuid: fut for fut in futures[:20]}
        for e in got:
            assert e["topic"] == "trace.demo.sleep" and e["worker"] == "w1"
            hops = e["hops"]
            assert isinstance(hops, dict)
            assert list(hops) == ["broker_queue", "broker_worker", "worker_queue", "run", "worker_result"]
            assert 0.02 <= hops["run"] < 1.0
            fut = by_uuid[str(e["uuid"])]
            assert fut.trace is not None
            # What the client derived is what the broker published, and the client adds its own hop.
            for hop in hops:
                assert hops[hop] == pytest.approx(fut.trace["hops"][hop], abs=1e-9)
            assert float(e["held"]) == pytest.approx(fut.trace["total"] - fut.trace["hops"]["client_broker"], abs=1e-6)
