"""Retries on failure: the backoff schedule, the task's declaration, and what a worker and a client
do with a failed attempt (on the stub transport: no sockets; the broker is played by the test)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zfab import Backoff, Client, Settings, Worker, task
from zfab.core import payloads
from zfab.core import protocol as nfp
from zfab.core.errors import ProtocolError
from zfab.core.retries import MAX_RETRIES, read_backoff
from zfab.transport import FakeClock, StubLoop, StubTransport
from zfab.worker.job import Job
from zfab.worker.task import build_spec
from zfab.workers.demo import DemoWorker

PAUSE = threading.Event()  # never set: bounded waits below poll with a deadline


# ---- the schedule ------------------------------------------------------------------------------


def test_the_planned_wait_doubles_from_its_base_up_to_its_cap() -> None:
    b = Backoff(base=0.5, factor=2, cap=3)
    assert [b.planned(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert Backoff(base=1, factor=3, cap=6e5).planned(MAX_RETRIES + 50) == 6e5  # no overflow however far


def test_jitter_moves_each_wait_within_its_fraction_and_never_past_the_cap() -> None:
    b = Backoff(base=10, factor=1, cap=10.5, jitter=0.1)
    assert b.delay(1, rand=lambda: 0.0) == 9.0
    assert b.delay(1, rand=lambda: 1.0) == 10.5  # 11 jittered, held at the cap
    waits = [Backoff(base=2, jitter=0.2).delay(1) for _ in range(200)]
    assert all(1.6 <= w <= 2.4 for w in waits) and len(set(waits)) > 10


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"base": -1}, "base"),
        ({"factor": 0.5}, "factor"),
        ({"base": 5, "cap": 1}, "cap"),
        ({"jitter": 1.0}, "jitter"),
        ({"base": float("nan")}, "finite"),
    ],
)
def test_a_bad_schedule_is_refused_naming_its_field(fields: dict[str, float], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Backoff(**fields)


def test_a_backoff_reads_from_seconds_or_an_object() -> None:
    assert read_backoff(2.5) == Backoff(base=2.5)
    assert read_backoff(900) == Backoff(base=900, cap=900)  # a base past the default cap raises the cap
    assert read_backoff({"base": 1, "factor": 3}) == Backoff(base=1, factor=3)
    with pytest.raises(ValueError, match="no field 'speed'"):
        read_backoff({"speed": 1})
    with pytest.raises(ValueError, match="seconds or an object"):
        read_backoff("fast")


# ---- the declaration ---------------------------------------------------------------------------


class Declared(Worker):
    service = "declared"

    @task(retries=2, backoff=Backoff(base=0.5, cap=5), retry_on=(OSError,), redact=("password",))
    def connect(self, job: Job, host: str, password: str = "") -> int:
        """Connect (fails with OSError until its third attempt)."""
        if job.attempt < 3:
            raise OSError(f"unreachable on attempt {job.attempt}")
        return job.attempt

    @task(retries=1)
    def strict(self, value: int) -> int:
        if value < 0:
            raise ValueError("negative")
        return value

    @task
    def plain(self) -> None:
        raise RuntimeError("always")


def test_a_declaration_travels_in_the_announced_schema_and_plain_tasks_carry_none() -> None:
    spec = build_spec("connect", Declared.connect, Job)
    decl = spec.input_schema()["x-zfab"]
    assert decl == {
        "retries": 2,
        "backoff": {"base": 0.5, "factor": 2.0, "cap": 5.0, "jitter": 0.1},
        "retry_on": ["OSError"],
        "redact": ["password"],
    }
    assert "x-zfab" not in build_spec("plain", Declared.plain, Job).input_schema()
    assert spec.schema()["inputSchema"] == spec.input_schema()  # list_tasks shows the same


def test_a_policy_retries_only_its_exceptions_and_only_while_attempts_remain() -> None:
    policy = build_spec("connect", Declared.connect, Job).retry_policy()
    assert policy is not None
    assert policy.after(1, OSError()) == pytest.approx(0.5, rel=0.101)
    assert policy.after(2, ConnectionError()) == pytest.approx(1.0, rel=0.101)  # a subclass counts
    assert policy.after(3, OSError()) is None  # the last of 1 + 2 attempts
    assert policy.after(1, ValueError()) is None
    # a job's own ask replaces the count and schedule, not what to retry on
    mine = build_spec("connect", Declared.connect, Job).retry_policy(retries=5, backoff=Backoff(base=2))
    assert mine is not None and mine.retries == 5 and mine.after(4, OSError()) == pytest.approx(16, rel=0.101)
    assert mine.after(1, ValueError()) is None
    # an undeclared task retries what the job asks, on any exception; without an ask, never
    plain = build_spec("plain", Declared.plain, Job)
    assert plain.retry_policy() is None and plain.retry_policy(retries=0) is None
    asked = plain.retry_policy(retries=1)
    assert asked is not None and asked.after(1, RuntimeError()) == pytest.approx(1.0, rel=0.101)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": MAX_RETRIES + 1}, "retries"),
        ({"retries": 1, "retry_on": (int,)}, "retry_on"),
        ({"backoff": 1.0}, "without retries"),
        ({"redact": "password"}, "redact"),
    ],
)
def test_a_bad_declaration_fails_where_it_is_written(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        task(**kwargs)


def test_redacting_an_argument_the_task_does_not_have_fails_when_the_worker_is_built() -> None:
    class Wrong:
        @task(redact=("pasword",))
        def login(self, user: str, password: str) -> None: ...

    with pytest.raises(TypeError, match="pasword"):
        build_spec("login", Wrong().login, Job)


def test_a_post_body_carries_the_jobs_own_retries_and_rejects_bad_ones() -> None:
    body = payloads.read_post_body(payloads.post_body("t", retries=2, backoff={"base": 3.0}))
    assert (body.attempt, body.retries, body.backoff) == (1, 2, Backoff(base=3.0))
    plain = payloads.read_post_body(payloads.post_body("t"))
    assert (plain.attempt, plain.retries, plain.backoff) == (1, None, None)
    for bad in ({"retries": -1}, {"retries": True}, {"attempt": 0}, {"backoff": {"factor": 0}}):
        with pytest.raises(ProtocolError, match="bad request body"):
            payloads.read_post_body(nfp.dumps({"task": "t", **bad}))


# ---- a worker's failed attempt -----------------------------------------------------------------


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[DemoWorker]:
    clock = FakeClock()
    s = Settings(data_dir=str(tmp_path), keepalive_interval=1.0, keepalive_multiplier=3, pool_size=1)
    w = DemoWorker(name="w1", settings=s, transport=StubTransport(clock), clock=clock)
    w.start()
    yield w
    w.stop(drain=0)


def result_of(w: Worker, uuid: bytes, body: dict[str, Any]) -> dict[str, Any]:
    """POST a job to the worker and return its result entry (its 200, within a deadline)."""
    loop = w.loop
    assert isinstance(loop, StubLoop)
    loop.feed([b"", nfp.BROKER, nfp.POST, b"c1", b"", uuid, nfp.dumps(body)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        loop.tick()
        for f in loop.take():
            if f[2] == nfp.RESPONSE and f[5] == uuid and f[6] in (nfp.ST_OK, nfp.ST_BAD_REQUEST):
                entry: dict[str, Any] = json.loads(f[7])["w1"]
                return entry
        PAUSE.wait(0.005)
    raise AssertionError(f"no result for {uuid!r}")


def test_a_failed_attempt_its_task_may_retry_says_when_and_which_attempt_comes_next(worker: DemoWorker) -> None:
    first = result_of(worker, b"j1", {"task": "flaky", "kwargs": {"failures": 5}})
    assert first["failed"] and "attempt 1 of 4 fails on purpose" in first["messages"][0]
    assert first["retry"]["attempt"] == 2 and first["retry"]["attempts"] == 4
    assert first["retry"]["after"] == pytest.approx(1.0, rel=0.101)
    third = result_of(worker, b"j1~3", {"task": "flaky", "kwargs": {"failures": 5}, "attempt": 3})
    assert third["attempt"] == 3 and third["retry"]["after"] == pytest.approx(4.0, rel=0.101)
    last = result_of(worker, b"j1~4", {"task": "flaky", "kwargs": {"failures": 5}, "attempt": 4})
    assert last["failed"] and "retry" not in last  # the last of 1 + 3


def test_a_failure_is_retried_only_as_the_job_or_its_task_asks(worker: DemoWorker) -> None:
    assert "retry" not in result_of(worker, b"a", {"task": "fail"})  # no declaration, no ask
    asked = result_of(worker, b"b", {"task": "fail", "retries": 1, "backoff": 0.25})
    assert asked["retry"]["after"] == pytest.approx(0.25, rel=0.101) and asked["retry"]["attempts"] == 2
    assert "retry" not in result_of(worker, b"c", {"task": "flaky", "retries": 0})  # the job says none
    assert "retry" not in result_of(worker, b"d", {"task": "flaky", "kwargs": {"failures": "x"}})  # bad arguments
    assert result_of(worker, b"e~3", {"task": "flaky", "attempt": 3})["result"] == {"attempt": 3}


# ---- the client --------------------------------------------------------------------------------


@pytest.fixture
def client() -> Iterator[tuple[Client, FakeClock]]:
    clock = FakeClock()
    s = Settings(keepalive_interval=1.0, keepalive_multiplier=3)
    c = Client(settings=s, name="t", transport=StubTransport(clock), clock=clock, poll_after=2.0).start()
    yield c, clock
    c.close()


def feed(c: Client, uuid: str, status: bytes, payload: Any) -> None:
    loop = c.loop
    assert isinstance(loop, StubLoop)
    loop.feed([b"", nfp.BROKER, nfp.RESPONSE, b"demo", uuid.encode(), status, nfp.dumps(payload)])


def posts(c: Client) -> list[list[bytes]]:
    loop = c.loop
    assert isinstance(loop, StubLoop)
    return [f for f in loop.take() if f[2] == nfp.POST]


def failed(worker: str, after: float | None, attempt: int = 1) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "result": None,
        "failed": True,
        "status": "error",
        "errors": ["Traceback (most recent call last):\n  ...\nRuntimeError: boom"],
        "messages": [f"RuntimeError: boom {attempt}"],
        "worker": worker,
        "timestamps": {"started": 100.0 + attempt, "completed": 100.5 + attempt},
    }
    if after is not None:
        entry["retry"] = {"after": after, "attempt": attempt + 1, "attempts": 3}
    return {worker: entry}


def test_a_failed_attempt_runs_again_through_the_brokers_delay_and_the_record_keeps_its_error(
    client: tuple[Client, FakeClock],
) -> None:
    c, clock = client
    fut = c.submit("demo", "flaky", timeout=5)
    posts(c)
    feed(c, fut.uuid, nfp.ST_DISPATCHED, {"workers": ["w1"]})
    before = time.time()
    feed(c, fut.uuid, nfp.ST_OK, failed("w1", 1.5))
    ((*_, wire, body, flags),) = posts(c)
    assert wire.decode() == f"{fut.uuid}~2" and json.loads(body)["attempt"] == 2
    sent = json.loads(flags)
    assert before + 1.499 <= sent["not_before"] <= time.time() + 1.501  # the broker holds it for the wait
    assert sent["timeout"] == 5  # counted from the end of the wait
    assert not fut.done() and fut.state == "queued" and fut.attempt == 2
    (earlier,) = fut.attempts
    assert earlier["attempt"] == 1 and earlier["worker"] == "w1" and earlier["error"] == "RuntimeError: boom 1"
    assert earlier["retry_after"] == 1.5 and earlier["started"] == 101.0
    # a late copy of attempt 1's answer does not pass for attempt 2's
    feed(c, fut.uuid, nfp.ST_OK, {"w1": {"result": "stale", "failed": False}})
    assert not fut.done()
    # the deadline moved with the wait: 5 s after it ends, not after the first attempt
    clock.advance(5.5)
    c.loop.tick()  # type: ignore[attr-defined]
    assert not fut.done()
    feed(c, f"{fut.uuid}~2", nfp.ST_OK, {"w2": {"result": {"attempt": 2}, "failed": False}})
    entry = fut.result(0)["w2"]
    assert entry["attempt"] == 2 and entry["juuid"] == fut.uuid and fut.state == "completed"
    assert c.bytes_in_flight() == 0


def test_a_failure_without_a_wait_named_or_past_the_jobs_retries_ends_the_job(
    client: tuple[Client, FakeClock],
) -> None:
    c, _ = client
    plain = c.submit("demo", "fail", timeout=5)
    none_left = c.submit("demo", "fail", timeout=5, retries=0)
    posts(c)
    feed(c, plain.uuid, nfp.ST_OK, failed("w1", None))
    feed(c, none_left.uuid, nfp.ST_OK, failed("w1", 1.0))
    assert plain.state == "failed" and none_left.state == "failed" and not posts(c)
    assert none_left.result(0)["w1"]["retry"]["not_sent"] == "no retries left"
    # target all: every worker's own outcome stands
    fan = c.submit("demo", "fail", timeout=5, workers="all")
    posts(c)
    feed(c, fan.uuid, nfp.ST_DISPATCHED, {"workers": ["w1"]})
    feed(c, fan.uuid, nfp.ST_OK, failed("w1", 1.0))
    assert fan.state == "failed" and not posts(c)


def test_a_large_body_is_not_kept_for_a_retry_nobody_asked_for(client: tuple[Client, FakeClock]) -> None:
    c, _ = client
    big = c.submit("demo", "echo", kwargs={"data": "x" * 100_000}, timeout=5)
    asked = c.submit("demo", "echo", kwargs={"data": "x" * 100_000}, timeout=5, retries=1)
    posts(c)
    for fut in (big, asked):
        feed(c, fut.uuid, nfp.ST_DISPATCHED, {"workers": ["w1"]})
    assert c.bytes_in_flight() < 2 * 100_000 + 10_000  # the first let go of its body
    feed(c, big.uuid, nfp.ST_OK, failed("w1", 1.0))
    assert big.state == "failed" and "no longer held the request" in big.result(0)["w1"]["retry"]["not_sent"]
    feed(c, asked.uuid, nfp.ST_OK, failed("w1", 1.0))
    ((*_, wire, _, _),) = posts(c)
    assert wire.decode() == f"{asked.uuid}~2"
