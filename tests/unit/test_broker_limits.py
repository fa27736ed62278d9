"""Rate and concurrency limits on the stub broker: enforced across workers, jobs over a limit held in
the queue (never refused), other tasks not held back, per key, set and cleared at run time, kept on
disk. No sockets; a fake clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_broker_handlers import finish, jobs_sent, make_broker, replies, stub

from zfab import Broker
from zfab.core import protocol as nfp
from zfab.core.limits import parse_rate, read_rule
from zfab.transport import FakeClock

SITE = {"type": "object", "properties": {"site": {"type": "string"}, "n": {"type": "integer"}}}
TASKS: dict[str, Any] = {
    "echo": {"type": "object"},
    "slow": {"type": "object", "x-zfab": {"concurrency": 2}},
    "paced": {"type": "object", "x-zfab": {"rate_limit": "5/s"}},
    "per_site": {**SITE, "x-zfab": {"concurrency": 1, "limit_key": "site"}},
}


def ready(b: Broker, ident: bytes, credits: int = 4) -> None:
    ann = nfp.dumps({"v": 2, "name": ident.decode(), "credits": credits, "tasks": TASKS})
    stub(b).feed([ident, b"", nfp.WORKER, nfp.READY, b"demo", ann])


def post(b: Broker, uuid: bytes, task: str, timeout: float = 30, **kwargs: Any) -> None:
    body = nfp.dumps({"task": task, "args": [], "kwargs": kwargs})
    flags = nfp.dumps({"push": True, "ack": True, "task": task, "timeout": timeout})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.POST, b"demo", b"any", uuid, body, flags])


LEFT: list[list[bytes]] = []  # frames an MMI call took along with its answer


def sent(b: Broker) -> list[tuple[bytes, bytes]]:
    """(worker, uuid) of the jobs the broker sent since the last look."""
    frames = [*LEFT, *stub(b).take()]
    LEFT.clear()
    return [(w, u) for w, cmd, u in jobs_sent(frames) if cmd == nfp.POST]


def mmi(b: Broker, command: str, /, **kwargs: Any) -> tuple[bytes, Any]:
    body = nfp.dumps({"task": command, "kwargs": kwargs})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", body])
    frames = stub(b).take()
    LEFT.extend(frames)
    got = [(st, a) for cmd, u, st, a in replies(frames) if cmd == nfp.RESPONSE and u == b"m1"]
    return got[-1]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(clock: FakeClock, tmp_path: Path) -> Broker:
    b = make_broker(clock, data_dir=str(tmp_path), service_queue_size=100)
    for w in (b"w1", b"w2", b"w3"):
        ready(b, w)
    return b


def test_a_rate_reads_as_jobs_per_second_and_a_rule_refuses_nonsense() -> None:
    assert parse_rate("5/s") == 5 and parse_rate("120 per minute") == 2 and parse_rate("36/h") == 0.01
    assert read_rule({"concurrency": 2, "limit_key": "site"}) is not None
    assert read_rule({}) is None
    for bad in (
        {"rate_limit": "fast"},
        {"rate_limit": "0/s"},
        {"concurrency": 0},
        {"concurrency": 1.5},
        {"limit_key": "site"},
    ):
        with pytest.raises(ValueError):
            read_rule(bad)


def test_a_concurrency_limit_holds_its_jobs_across_workers_and_lets_other_tasks_pass(broker: Broker) -> None:
    for i in range(6):
        post(broker, f"s{i}".encode(), "slow")
    first = sent(broker)
    assert len(first) == 2  # 3 workers with 12 credits between them, 2 at once for the task
    post(broker, b"e1", "echo")
    assert [u for _, u in sent(broker)] == [b"e1"]  # the held jobs do not hold back another task
    replies_ = replies(stub(broker).take())
    assert not any(st in (nfp.ST_BUSY, nfp.ST_BAD_REQUEST) for _, _, st, _ in replies_)  # held, never refused
    worker, uuid = first[0]
    finish(broker, worker, uuid)
    assert [u for _, u in sent(broker)] == [b"s2"]  # the next in arrival order, as one slot frees
    (row,) = [r for r in broker.mmi.show_limits() if r["task"] == "slow"]
    assert (row["concurrency"], row["source"], row["running"], row["held"]) == (2, "declared", 2, 3)
    svc = next(s for s in broker.mmi.show_services() if s["service"] == "demo")
    assert svc["limits"]["slow"] == {"running": 2, "held": 3} and svc["queue_depth"] == 3


def test_a_rate_limit_spaces_starts_evenly_on_the_brokers_clock(broker: Broker, clock: FakeClock) -> None:
    for i in range(5):
        post(broker, f"p{i}".encode(), "paced")
    starts = [(clock(), len(sent(broker)))]
    for _ in range(10):
        clock.advance(0.1)
        stub(broker).tick()
        starts.append((clock(), len(sent(broker))))
    # one at once, then one every 0.2 s: the loop wakes for each (next_deadline), no burst
    assert [n for _, n in starts] == [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0]


def test_a_keyed_limit_applies_to_each_value_of_the_argument(broker: Broker) -> None:
    post(broker, b"a1", "per_site", site="a")
    post(broker, b"a2", "per_site", site="a")
    post(broker, b"b1", "per_site", site="b")
    assert sorted(u for _, u in sent(broker)) == [b"a1", b"b1"]
    (row,) = [r for r in broker.mmi.show_limits() if r["task"] == "per_site"]
    assert (row["running"], row["held"]) == (2, 1)


def test_a_held_job_still_expires_at_its_deadline(broker: Broker, clock: FakeClock) -> None:
    post(broker, b"s1", "slow")
    post(broker, b"s2", "slow")
    post(broker, b"late", "slow", timeout=1)
    sent(broker)
    clock.advance(1.5)
    stub(broker).tick()
    assert (b"late", nfp.ST_EXPIRED) in [(u, st) for _, u, st, _ in replies(stub(broker).take())]


def test_a_limit_set_at_run_time_replaces_the_declaration_until_cleared(broker: Broker, tmp_path: Path) -> None:
    status, answer = mmi(broker, "set_limit", service="demo", task_name="echo", concurrency=1)
    assert status == nfp.ST_OK and answer["concurrency"] == 1 and answer["source"] == "set", answer
    for i in range(3):
        post(broker, f"e{i}".encode(), "echo")
    assert len(sent(broker)) == 1
    assert json.loads((tmp_path / "broker" / "limits.json").read_text()) == [
        {"service": "demo", "task": "echo", "rate_limit": None, "concurrency": 1, "limit_key": None}
    ]
    # cleared: back to the declaration (none for echo), and the held jobs go at once
    status, answer = mmi(broker, "clear_limit", service="demo", task_name="echo")
    assert status == nfp.ST_OK and answer["concurrency"] is None
    assert len([u for _, u in sent(broker) if u.startswith(b"e")]) == 2
    # a declared limit lifted at run time (all values null)
    assert mmi(broker, "set_limit", service="demo", task_name="slow")[1]["source"] == "set"
    for i in range(4):
        post(broker, f"s{i}".encode(), "slow")
    assert len(sent(broker)) == 4


def test_a_limit_set_at_run_time_survives_a_restart(clock: FakeClock, tmp_path: Path) -> None:
    b = make_broker(clock, data_dir=str(tmp_path))
    ready(b, b"w1")
    mmi(b, "set_limit", service="demo", task_name="echo", rate_limit="1/m")
    again = make_broker(clock, data_dir=str(tmp_path))
    again.dispatch.limits.load()
    ready(again, b"w1")
    stub(again).take()
    post(again, b"e1", "echo")
    post(again, b"e2", "echo")
    assert [u for _, u in sent(again)] == [b"e1"]


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"task_name": "nosuch", "concurrency": 1}, nfp.ST_NOT_FOUND),
        ({"task_name": "echo", "concurrency": 0}, nfp.ST_BAD_REQUEST),
        ({"task_name": "echo", "rate_limit": "often"}, nfp.ST_BAD_REQUEST),
        ({"task_name": "per_site", "concurrency": 1, "limit_key": "nosuch"}, nfp.ST_BAD_REQUEST),
    ],
)
def test_a_bad_limit_is_refused_with_its_reason(broker: Broker, kwargs: dict[str, Any], status: bytes) -> None:
    got, answer = mmi(broker, "set_limit", service="demo", **kwargs)
    assert got == status and answer["detail"], answer


def keep_alive(b: Broker, clock: FakeClock, seconds: float) -> None:
    """Let `seconds` pass on the broker's clock, its workers keeping alive (one keepalive a second)."""
    end = clock() + seconds
    while clock() < end:
        clock.advance(min(1.0, end - clock()))
        for w in (b"w1", b"w2", b"w3"):
            stub(b).feed([w, b"", nfp.WORKER, nfp.KEEPALIVE, b"demo"])
        stub(b).tick()


def post_flags(b: Broker, uuid: bytes, task: str, client: bytes = b"c1", **flags: Any) -> None:
    kwargs = flags.pop("kwargs", {})
    body = nfp.dumps({"task": task, "args": [], "kwargs": kwargs})
    stub(b).feed([client, b"", nfp.CLIENT, nfp.POST, b"demo", b"any", uuid, body, nfp.dumps({"task": task, **flags})])


def test_a_delayed_job_of_a_limited_task_runs_when_due_across_the_brokers_housekeeping(
    broker: Broker, clock: FakeClock
) -> None:
    # Given a job of a concurrency-limited task delayed past the broker's housekeeping (every 60 s),
    # which forgets buckets nothing needs
    post_flags(broker, b"late", "slow", delay=66, timeout=10)
    assert sent(broker) == []
    keep_alive(broker, clock, 62)
    assert broker.dispatch.limits.buckets, "the delayed job's bucket was forgotten by the housekeeping"
    # When its delay ends, Then it is sent (not held in a forgotten bucket until it expires)
    keep_alive(broker, clock, 4.5)
    assert [u for _, u in sent(broker)] == [b"late"]
    assert nfp.ST_EXPIRED not in [st for _, u, st, _ in replies(stub(broker).take()) if u == b"late"]


def test_a_full_bucket_table_keeps_a_rate_and_says_so(clock: FakeClock, tmp_path: Path) -> None:
    b = make_broker(clock, data_dir=str(tmp_path), service_queue_size=1000)
    b.dispatch.limits.max_buckets = 50  # the table's bound (10,000), small enough for a unit test
    for w in (b"w1", b"w2", b"w3"):
        ready(b, w)
    stub(b).take()
    assert mmi(b, "set_limit", service="demo", task_name="per_site", rate_limit="1/m", limit_key="site")[0] == nfp.ST_OK
    # Given site r ran once (its rate: the next one a minute later)
    post_flags(b, b"r1", "per_site", kwargs={"site": "r"}, timeout=30)
    assert [u for _, u in sent(b)] == [b"r1"]
    finish(b, b"w1", b"r1")
    # When delayed jobs with 60 distinct sites fill the table past its bound
    for i in range(60):
        post_flags(b, f"f{i}".encode(), "per_site", kwargs={"site": f"k{i}"}, delay=600, timeout=30)
    stub(b).take()
    # Then site r's next job still waits for its rate: the full table forgot no bucket that holds one back
    post_flags(b, b"r2", "per_site", kwargs={"site": "r"}, timeout=120)
    keep_alive(b, clock, 5)
    assert [u for _, u in sent(b)] == []
    # And the jobs past the bound shared their task's overflow bucket, counted; the table stayed bounded
    facts = b.mmi.show_broker()
    assert facts["counts"]["limit_overflow"] >= 10
    assert facts["limit_buckets"] <= 50 + 1 and facts["limit_buckets_capacity"] == 50  # (+1: the overflow bucket)
    keep_alive(b, clock, 56)
    assert [u for _, u in sent(b)] == [b"r2"]  # on time, a minute after r1


def test_a_limit_key_is_read_without_decoding_the_body() -> None:
    import tracemalloc

    from zfab.broker.limits import MAX_KEY_SCAN, UNREAD, key_value

    schema = {"type": "object", "properties": {"data": {}, "site": {}}}
    body = nfp.dumps({"task": "t", "args": [], "kwargs": {"data": [[i] for i in range(400_000)], "site": "lon"}})
    tracemalloc.start()
    try:
        assert key_value(body, "site", schema) == '"lon"'
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(body) > 3_000_000 and peak < 100_000  # json.loads would build 800,000 objects here
    # a positional argument by its place in the schema; a value as canonical JSON; absent or unreadable: None
    assert key_value(nfp.dumps({"task": "t", "args": [[1], {"b": 1, "a": 2}]}), "site", schema) == '{"a":2,"b":1}'
    assert key_value(nfp.dumps({"task": "t", "args": [1], "kwargs": {}}), "site", schema) is None
    assert key_value(b"\x00zfab-shm\x00{}", "site", schema) is None
    assert key_value(nfp.dumps({"kwargs": {"site": None}}), "site", schema) == "null"
    long = key_value(nfp.dumps({"kwargs": {"site": "x" * 300}}), "site", schema)
    assert long is not None and long.startswith("sha256:")
    # a body past the scan's bound is not read: its job shares its task's bucket of unread keys (stricter)
    huge = nfp.dumps({"task": "t", "args": [], "kwargs": {"data": "x" * (MAX_KEY_SCAN + 1), "site": "lon"}})
    assert key_value(huge, "site", schema) == UNREAD


def test_delayed_jobs_follow_a_limit_changed_while_they_wait(broker: Broker, clock: FakeClock) -> None:
    # Given three delayed jobs of a task limited per site (one at once per site: all three could run)
    for site in ("a", "b", "c"):
        post_flags(broker, f"d{site}".encode(), "per_site", kwargs={"site": site}, delay=5, timeout=30)
    # When the limit is set to two at once for the whole task while they wait
    status, _ = mmi(broker, "set_limit", service="demo", task_name="per_site", concurrency=2)
    assert status == nfp.ST_OK
    keep_alive(broker, clock, 6)
    # Then the new rule holds them: two run, one waits, and no bucket counts a job it no longer has
    assert len(sent(broker)) == 2
    counts = {b.key: (b.running, b.queued) for b in broker.dispatch.limits.buckets.values()}
    assert counts.pop(None) == (2, 1)
    assert set(counts.values()) <= {(0, 0)}  # the per-site buckets hold nothing: the housekeeping forgets them
    broker.dispatch.limits.sweep(clock())
    assert list(broker.dispatch.limits.buckets) == [(b"demo", "per_site", None)]


def test_a_rate_relaxed_at_run_time_lets_held_jobs_start_at_the_new_rate(clock: FakeClock) -> None:
    """Relaxed from 1/h to 10/s, the held job may start 0.1 s after the last start, not an hour after."""
    b = make_broker(clock)
    ready(b, b"w1")
    mmi(b, "set_limit", service="demo", task_name="echo", rate_limit="1/h")
    post(b, b"e1", "echo")
    post(b, b"e2", "echo")
    assert [u for _, u in sent(b)] == [b"e1"]
    mmi(b, "set_limit", service="demo", task_name="echo", rate_limit="10/s")
    clock.advance(0.2)
    stub(b).tick()
    assert [u for _, u in sent(b)] == [b"e2"]


def test_a_rate_tightened_at_run_time_counts_from_the_last_start(clock: FakeClock) -> None:
    b = make_broker(clock)
    ready(b, b"w1")
    mmi(b, "set_limit", service="demo", task_name="echo", rate_limit="10/s")
    post(b, b"e1", "echo")
    post(b, b"e2", "echo")
    assert [u for _, u in sent(b)] == [b"e1"]
    mmi(b, "set_limit", service="demo", task_name="echo", rate_limit="1/s")
    clock.advance(0.5)
    stub(b).tick()
    assert sent(b) == []  # 10/s would have let it go at 0.1 s
    clock.advance(0.6)
    stub(b).tick()
    assert [u for _, u in sent(b)] == [b"e2"]
