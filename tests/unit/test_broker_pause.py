"""Paused service queues on the stub broker: jobs admitted and queued, none sent until resumed, the
pause kept on disk across a restart, and MMI's refusals. No sockets; a fake clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_broker_handlers import finish, jobs_sent, make_broker, post, ready, replies, stub

from zfab import Broker
from zfab.core import protocol as nfp
from zfab.transport import FakeClock

SENT: list[list[bytes]] = []  # what the broker sent along with the last control's answer


def control(b: Broker, task: str, **kwargs: Any) -> tuple[bytes, Any]:
    """An MMI request from client c1: (status, answer) of its RESPONSE; the rest it sent in SENT."""
    body = nfp.dumps({"task": task, "kwargs": kwargs})
    stub(b).feed([b"c1", b"", nfp.CLIENT, nfp.MMI, nfp.MMI_SERVICE, b"any", b"m1", body])
    SENT[:] = stub(b).take()
    ((_, _, status, answer),) = [r for r in replies(SENT) if r[0] == nfp.RESPONSE and r[1] == b"m1"]
    return status, answer


def service_row(b: Broker, name: str = "demo") -> dict[str, Any]:
    row: dict[str, Any] = next(s for s in b.mmi.show_services() if s["service"] == name)
    return row


def test_a_paused_service_queues_its_jobs_and_sends_none_until_resumed(tmp_path: Path) -> None:
    b = make_broker(FakeClock(), data_dir=str(tmp_path), service_queue_size=100)
    ready(b, b"w1", credits=2)
    ready(b, b"w2", credits=2)
    status, answer = control(b, "pause_service", service="demo")
    assert status == nfp.ST_OK and answer == {"service": "demo", "paused": True, "changed": True, "queue_depth": 0}
    for i in range(10):
        post(b, f"j{i}".encode())
    post(b, b"named", target=b"w1")  # a part for a named worker waits too
    sent = stub(b).take()
    assert jobs_sent(sent) == []
    assert {u for _, u, st, _ in replies(sent) if st == nfp.ST_QUEUED} >= {f"j{i}".encode() for i in range(10)}
    row = service_row(b)
    assert row["paused"] is True and row["queue_depth"] == 11 and row["jobs_dispatched"] == 0
    assert b.mmi.show_broker()["paused_services"] == ["demo"]
    assert control(b, "pause_service", service="demo")[1]["changed"] is False  # idempotent
    # resumed: the workers' credits take the queue's head, the rest follows as credits free
    status, answer = control(b, "resume_service", service="demo")
    assert status == nfp.ST_OK and answer["paused"] is False and answer["queue_depth"] == 11
    first = jobs_sent(SENT)
    assert len(first) == 4 and {u for _, _, u in first} <= {b"named", *(f"j{i}".encode() for i in range(10))}
    worker, _, uuid = first[0]
    finish(b, worker, uuid)
    assert len(jobs_sent(stub(b).take())) == 1
    assert service_row(b)["paused"] is False


def test_a_pause_survives_a_broker_restart_before_any_worker_registers(tmp_path: Path) -> None:
    clock = FakeClock()
    b = make_broker(clock, data_dir=str(tmp_path))
    ready(b, b"w1")
    control(b, "pause_service", service="demo")
    assert json.loads((tmp_path / "broker" / "paused.json").read_text()) == ["demo"]
    # a new broker on the same data directory (start() reads it; the stub broker is told to)
    again = make_broker(clock, data_dir=str(tmp_path))
    again.paused.load()
    assert again.mmi.show_broker()["paused_services"] == ["demo"]
    post(again, b"j1", known=True)  # a client re-submitting its job after the restart
    ready(again, b"w1")  # (holding nothing: the job waits out the broker's settling, then is admitted)
    clock.advance(again.term.settle)
    again.on_timer(clock())
    assert jobs_sent(stub(again).take()) == []
    assert service_row(again)["paused"] is True and service_row(again)["queue_depth"] == 1
    status, _ = control(again, "resume_service", service="demo")  # resumable though no worker had come yet
    assert status == nfp.ST_OK and [u for _, _, u in jobs_sent(SENT)] == [b"j1"]
    assert json.loads((tmp_path / "broker" / "paused.json").read_text()) == []


def test_pausing_an_unknown_service_or_without_a_name_is_refused(tmp_path: Path) -> None:
    b = make_broker(FakeClock(), data_dir=str(tmp_path))
    status, answer = control(b, "pause_service", service="nosuch")
    assert status == nfp.ST_NOT_FOUND and answer["error"] == "unknown-service"
    for kwargs in ({}, {"service": 3}, {"service": "x" * 300}):
        status, answer = control(b, "pause_service", **kwargs)
        assert status == nfp.ST_BAD_REQUEST and answer["error"] == "bad-request", kwargs
    assert not (tmp_path / "broker" / "paused.json").exists()


def test_an_unreadable_pause_file_pauses_nothing(tmp_path: Path) -> None:
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "paused.json").write_text("{not json")
    b = make_broker(FakeClock(), data_dir=str(tmp_path))
    b.paused.load()
    assert b.mmi.show_broker()["paused_services"] == []
    ready(b, b"w1")
    post(b, b"j1")
    assert [u for _, _, u in jobs_sent(stub(b).take())] == [b"j1"]
