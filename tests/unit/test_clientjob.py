"""A job as its client tracks it: the broker's replies in, a result dictionary or a specific error out."""

from __future__ import annotations

import time
from typing import Any

import pytest

from zfab.client.clientjob import ClientJob
from zfab.client.future import JobFuture
from zfab.core import protocol as nfp
from zfab.errors import (
    BadRequestError,
    BusyError,
    JobNotFoundError,
    NoWorkersError,
    WorkerLostError,
)

NOW = 0.0
UUID = "job-1"


def make_job(*, target: bytes = b"any", mmi: bool = False) -> ClientJob:
    return ClientJob(
        UUID,
        nfp.MMI_SERVICE if mmi else b"demo",
        target,
        b"{}",
        b"",
        JobFuture(UUID),
        time.monotonic() + 60,
        NOW,
        mmi=mmi,
    )


def reply(status: bytes, payload: Any, command: bytes = nfp.RESPONSE) -> nfp.BrokerReply:
    raw = payload if isinstance(payload, bytes) else nfp.dumps(payload)
    return nfp.BrokerReply(command, b"demo", UUID.encode(), status, raw)


def dispatched(*workers: str) -> nfp.BrokerReply:
    return reply(
        nfp.ST_DISPATCHED,
        {"workers": list(workers), "uuid": UUID, "target": "any", "status": "DISPATCHED", "service": "demo"},
    )


def entry(result: Any = None, *, failed: bool = False, errors: list[str] | None = None) -> dict[str, Any]:
    return {
        "result": result,
        "failed": failed,
        "errors": errors or [],
        "messages": [],
        "juuid": UUID,
        "task": "echo",
        "status": "error" if failed else "completed",
        "task_started": None,
        "task_completed": None,
        "service": "demo",
    }


def result(worker: str, status: bytes = nfp.ST_OK, **kw: Any) -> nfp.BrokerReply:
    return reply(status, {worker: entry(**kw)})


def status_only(status: bytes, worker: str, state: str, **extra: Any) -> nfp.BrokerReply:
    return reply(status, {"worker": worker, "uuid": UUID, "service": "demo", "status": state, **extra})


def refusal(status: bytes, why: str) -> nfp.BrokerReply:
    state = "BUSY" if status == nfp.ST_BUSY else "FAILED"
    return reply(
        status,
        {"workers": None, "uuid": UUID, "target": "any", "status": state, "service": "demo", "errors": [why]},
    )


# ---- acknowledgements ----------------------------------------------------------------


def test_dispatch_ack_sets_the_expected_workers_without_finishing() -> None:
    job = make_job(target=b"all")

    assert job.apply(dispatched("w1", "w2"), NOW) is False

    assert job.expected == {"w1", "w2"}
    assert job.pending == {"w1", "w2"}
    assert "dispatched" in job.future.timings


def test_a_dispatched_job_without_retries_lets_go_of_its_body_and_one_with_retries_keeps_it() -> None:
    # After the 202 the client only ever asks with GET; a job that may run again keeps its body.
    body = nfp.dumps({"task": "echo", "kwargs": {"data": "x" * 1000}})
    once = make_job()
    once.body, once.size = body, len(body)
    once.apply(dispatched("w1"), NOW)
    assert once.body == b"" and once.size == 0

    again = make_job()
    again.body, again.size, again.retries_left = body, len(body), 1
    again.apply(dispatched("w1"), NOW)
    assert again.body == body and again.size == len(body)

    queued = make_job()
    queued.body, queued.size = body, len(body)
    queued.apply(reply(nfp.ST_QUEUED, {"uuid": UUID, "status": "QUEUED", "service": "demo"}), NOW)
    assert queued.body == body  # still to be POSTed again if the broker restarts


def test_a_second_dispatch_ack_does_not_change_the_expected_workers() -> None:
    # A retried POST is acknowledged again; the first answer stands
    job = make_job()
    job.apply(dispatched("w1"), NOW)

    job.apply(dispatched("w2"), NOW)

    assert job.expected == {"w1"}


@pytest.mark.parametrize("status", [nfp.ST_WORKER_ACCEPTED, nfp.ST_PENDING, nfp.ST_WAITING_INPUT])
def test_progress_statuses_do_not_finish_the_job(status: bytes) -> None:
    job = make_job()
    job.apply(dispatched("w1"), NOW)

    assert job.apply(status_only(status, "w1", "PENDING"), NOW) is False
    assert job.pending == {"w1"}
    assert job.results == {}


# ---- results -------------------------------------------------------------------------


def test_result_from_the_dispatched_worker_finishes_the_job_with_a_dict_keyed_by_worker() -> None:
    # Given a job dispatched to w1 and accepted by it
    job = make_job()
    job.apply(dispatched("w1"), NOW)
    job.apply(status_only(nfp.ST_WORKER_ACCEPTED, "w1", "ACCEPTED"), NOW)

    # When w1's result arrives
    done = job.apply(result("w1", result={"echo": 42}), NOW)

    # Then the job is finished with w1's entry
    assert done is True
    results, error = job.outcome()
    assert error is None
    assert results is not None and list(results) == ["w1"]
    assert results["w1"]["result"] == {"echo": 42}
    assert results["w1"]["failed"] is False


def test_job_for_all_needs_a_result_from_every_dispatched_worker() -> None:
    job = make_job(target=b"all")
    job.apply(dispatched("w1", "w2"), NOW)

    assert job.apply(result("w1", result=1), NOW) is False
    assert job.pending == {"w2"}
    assert job.apply(result("w2", result=2), NOW) is True

    results, error = job.outcome()
    assert error is None
    assert results is not None
    assert {w: e["result"] for w, e in results.items()} == {"w1": 1, "w2": 2}


def test_result_without_a_dispatch_ack_finishes_a_single_worker_job() -> None:
    # Given a client in results-only mode: the broker sends no 202
    job = make_job()

    # When the worker's result arrives
    done = job.apply(result("w1", result="ok"), NOW)

    # Then the job finishes with it
    assert done is True
    assert job.expected == {"w1"}
    results, error = job.outcome()
    assert error is None and results is not None and results["w1"]["result"] == "ok"


def test_failed_entries_are_data_not_exceptions() -> None:
    # Given two workers, one of which ran the task and failed
    job = make_job(target=b"all")
    job.apply(dispatched("w1", "w2"), NOW)
    job.apply(result("w1", result=1), NOW)

    done = job.apply(result("w2", failed=True, errors=["ZeroDivisionError"]), NOW)

    # Then the dictionary comes back with the failure in it
    assert done is True
    results, error = job.outcome()
    assert error is None
    assert results is not None
    assert results["w2"]["failed"] is True and results["w2"]["errors"] == ["ZeroDivisionError"]


def test_one_bad_request_among_good_results_still_returns_the_dict() -> None:
    job = make_job(target=b"all")
    job.apply(dispatched("w1", "w2"), NOW)
    job.apply(result("w1", result=1), NOW)
    job.apply(result("w2", nfp.ST_BAD_REQUEST, failed=True, errors=["unknown task 'nope'"]), NOW)

    results, error = job.outcome()

    assert error is None
    assert results is not None and set(results) == {"w1", "w2"}


# ---- refusals and failures -----------------------------------------------------------


def test_broker_refusal_of_an_unknown_service_raises_no_workers_error() -> None:
    job = make_job()
    why = "service 'demo' is unknown: no worker has registered it"

    done = job.apply(refusal(nfp.ST_NOT_FOUND, why), NOW)

    assert done is True
    results, error = job.outcome()
    assert results is None
    assert isinstance(error, NoWorkersError)
    assert str(error) == why
    assert error.uuid == UUID


def test_broker_refusal_when_full_raises_busy_error() -> None:
    job = make_job()

    done = job.apply(refusal(nfp.ST_BUSY, "broker is at its bound of jobs in flight; retry later"), NOW)

    assert done is True
    results, error = job.outcome()
    assert results is None
    assert isinstance(error, BusyError)
    assert "retry later" in str(error)


def test_busy_worker_raises_busy_error_naming_the_worker() -> None:
    job = make_job()
    job.apply(dispatched("w1"), NOW)

    done = job.apply(status_only(nfp.ST_BUSY, "w1", "BUSY", errors=["worker job queue is full"]), NOW)

    assert done is True
    _, error = job.outcome()
    assert isinstance(error, BusyError)
    assert "w1" in str(error) and "queue is full" in str(error)


def test_busy_worker_among_several_keeps_the_others_results_on_the_error() -> None:
    # Given a job for two workers where w1 answered and w2 was too busy to take it
    job = make_job(target=b"all")
    job.apply(dispatched("w1", "w2"), NOW)
    job.apply(result("w1", result="done"), NOW)
    job.apply(status_only(nfp.ST_BUSY, "w2", "BUSY", errors=["worker job queue is full"]), NOW)

    # Then the error says busy and, like every JobError, holds what did arrive
    _, error = job.outcome()
    assert isinstance(error, BusyError)
    assert error.results == {"w1": entry(result="done")}


def test_lost_worker_raises_worker_lost_error_with_partial_results() -> None:
    # Given a job for two workers where one answered
    job = make_job(target=b"all")
    job.apply(dispatched("w1", "w2"), NOW)
    job.apply(result("w1", result="done"), NOW)

    # When the broker reports the other lost
    done = job.apply(status_only(nfp.ST_WORKER_LOST, "w2", "LOST", errors=["worker 'w2' was lost"]), NOW)

    # Then the job ends with WorkerLostError carrying what did arrive
    assert done is True
    results, error = job.outcome()
    assert results is None
    assert isinstance(error, WorkerLostError)
    assert "w2" in str(error)
    assert error.results == {"w1": entry(result="done")}


def test_lost_worker_before_the_other_answers_waits_for_the_other() -> None:
    job = make_job(target=b"all")
    job.apply(dispatched("w1", "w2"), NOW)

    assert job.apply(status_only(nfp.ST_WORKER_LOST, "w1", "LOST"), NOW) is False
    assert job.pending == {"w2"}
    assert job.apply(result("w2", result=2), NOW) is True
    assert isinstance(job.outcome()[1], WorkerLostError)


def test_lost_worker_without_a_dispatch_ack_finishes_the_job() -> None:
    # Given a results-only client: no 202, so the client does not yet know who runs the job
    job = make_job()

    # When the broker reports the worker lost
    done = job.apply(status_only(nfp.ST_WORKER_LOST, "w1", "LOST"), NOW)

    # Then the job ends at once with WorkerLostError, as it does with acks
    assert done is True
    assert isinstance(job.outcome()[1], WorkerLostError)


def test_bad_request_from_every_worker_raises_bad_request_error_naming_the_error() -> None:
    job = make_job()
    job.apply(dispatched("w1"), NOW)

    done = job.apply(result("w1", nfp.ST_BAD_REQUEST, failed=True, errors=["task 'nope' is not a task of demo"]), NOW)

    assert done is True
    results, error = job.outcome()
    assert results is None
    assert isinstance(error, BadRequestError)
    assert str(error) == "task 'nope' is not a task of demo"
    assert set(error.results) == {"w1"}


def test_job_unknown_to_its_worker_raises_job_not_found() -> None:
    job = make_job()
    job.apply(dispatched("w1"), NOW)

    done = job.apply(status_only(nfp.ST_NOT_FOUND, "w1", "JOB NOT FOUND"), NOW)

    assert done is True
    results, error = job.outcome()
    assert results is None
    assert isinstance(error, JobNotFoundError)
    assert UUID in str(error)


def test_unreadable_payload_is_not_taken_as_a_result() -> None:
    job = make_job()
    job.apply(dispatched("w1"), NOW)

    assert job.apply(reply(nfp.ST_OK, b"\xff not json"), NOW) is False
    assert job.apply(reply(nfp.ST_OK, b"[1, 2]"), NOW) is False
    assert job.results == {} and job.pending == {"w1"}


# ---- MMI -----------------------------------------------------------------------------


def test_mmi_job_finishes_on_response_and_ignores_the_mmi_duplicate() -> None:
    # Given an MMI request: the broker answers with RESPONSE and a NorFab-style MMI copy
    job = make_job(mmi=True)
    answer = {"workers": ["w1"]}

    # When the MMI copy arrives first it does not finish the job
    assert job.apply(reply(nfp.ST_OK, answer, command=nfp.MMI), NOW) is False
    assert job.results == {}

    # When the RESPONSE arrives the job finishes with the broker's answer
    assert job.apply(reply(nfp.ST_OK, answer), NOW) is True
    assert job.outcome() == ({"result": answer}, None)

    # And a late MMI copy changes nothing
    assert job.apply(reply(nfp.ST_OK, {"other": 1}, command=nfp.MMI), NOW) is False
    assert job.outcome() == ({"result": answer}, None)


def test_refused_mmi_request_raises_bad_request_error() -> None:
    job = make_job(mmi=True)

    assert job.apply(reply(nfp.ST_BAD_REQUEST, "Unsupported task 'nope'"), NOW) is True

    results, error = job.outcome()
    assert results is None
    assert isinstance(error, BadRequestError)
    assert "Unsupported task 'nope'" in str(error)


def test_a_refused_get_poll_does_not_end_a_dispatched_job() -> None:
    # Given a dispatched job whose worker is not registered at a restarted broker yet
    job = make_job()
    job.apply(dispatched("w1"), NOW)
    refusal = {"workers": None, "uuid": UUID, "target": "w1", "status": "FAILED", "service": "demo", "errors": ["x"]}
    # When the broker refuses the client's GET poll, the job goes on
    assert job.apply(reply(nfp.ST_BAD_REQUEST, refusal), NOW) is False
    # Then the worker's result still finishes it
    assert job.apply(reply(nfp.ST_OK, {"w1": entry("late but fine")}), NOW) is True
    assert job.outcome() == ({"w1": entry("late but fine")}, None)


def test_a_retried_job_travels_under_a_new_wire_uuid() -> None:
    from zfab.core.payloads import split_wire_uuid

    job = make_job()
    job.retries_left = 1
    job.apply(dispatched("w1"), NOW)
    job.apply(reply(nfp.ST_WORKER_LOST, {"worker": "w1", "uuid": UUID, "status": "LOST", "errors": ["gone"]}), NOW)
    assert job.wire_uuid == UUID
    assert job.retry() is True and job.attempt == 2
    assert job.wire_uuid == f"{UUID}~2" and split_wire_uuid(job.wire_uuid) == (UUID, 2)
    assert split_wire_uuid(UUID) == (UUID, 1)
    assert job.retry() is False  # no retries left, and nothing lost in this attempt
