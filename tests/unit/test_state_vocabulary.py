"""One vocabulary for a job's states (core/states.py): the worker's job, the API's models and the CLI
name them from there, and the API's JSON keeps the values it has always had."""

from __future__ import annotations

from typing import Any

from zfab import Job as WorkerJob
from zfab import JobState, State
from zfab.api.models import Job as ApiJob
from zfab.api.models import JobState as ApiJobState
from zfab.apiclient.jobs import FINAL, is_final
from zfab.core.states import FINAL_STATES, STATES, UNFINISHED_STATES
from zfab.worker.job import JobState as WorkerJobState

API_VALUES = ["queued", "running", "waiting", "completed", "failed", "cancelled", "expired", "lost"]


def test_the_api_the_worker_and_the_roles_share_one_enum() -> None:
    assert ApiJobState is JobState and WorkerJobState is JobState and State is JobState


def test_the_apis_json_values_are_unchanged() -> None:
    assert [s.value for s in JobState] == API_VALUES == list(STATES)
    schema: dict[str, Any] = ApiJob.model_json_schema()
    assert schema["$defs"]["JobState"]["enum"] == API_VALUES


def test_final_and_unfinished_split_the_states() -> None:
    assert set(UNFINISHED_STATES) == {"queued", "running", "waiting"}
    assert set(FINAL_STATES) | set(UNFINISHED_STATES) == set(STATES)
    assert all(JobState(s).final for s in FINAL_STATES) and not any(JobState(s).final for s in UNFINISHED_STATES)


def test_a_workers_job_starts_queued_and_the_cli_reads_every_final_state_as_final() -> None:
    job = WorkerJob(uuid="u", client=b"c", task="echo", args=[], kwargs={}, timeout=None, push=True, ack=True)
    assert job.state is JobState.QUEUED and not job.state.final
    assert set(FINAL_STATES) <= FINAL
    assert all(is_final({"state": s}) for s in FINAL_STATES)
    assert not any(is_final({"state": s, "finished_at": None}) for s in UNFINISHED_STATES)
