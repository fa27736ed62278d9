"""What the API's job table counts (api/jobs/table.py): requests as their JSON, results as the JSON they
came as, and the views of jobs read back from its database after a restart; past its byte bound the
oldest finished jobs go. Pure: records made as the API makes them, no fabric."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from zfab import JobFuture
from zfab.api.jobs.record import JobRecord, encode_request
from zfab.api.jobs.table import JobTable
from zfab.api.models import Job, JobRequest, JobState
from zfab.api.store.sqlite import record_of


def stored_row(uuid: str, results: object) -> tuple[str, ...]:
    now = datetime.now(UTC)
    job = Job(
        uuid=uuid, service="demo", task="echo", workers="any", state=JobState.COMPLETED,
        results={"w1": {"result": results, "failed": False}}, submitted_at=now, timings={},
    )  # fmt: skip
    req = JobRequest(service="demo", task="echo", kwargs={"data": results})
    return (uuid, "demo", "echo", '"any"', '["w1"]', "", "60", job.model_dump_json(), req.model_dump_json())


def test_a_job_read_back_from_the_database_counts_what_its_view_holds() -> None:
    nested = [[i] for i in range(20_000)]  # ~160 kB of JSON, ~2 MB as objects
    row = stored_row("a" * 32, nested)
    rec = record_of(*row[:6], 60.0, row[7], row[8])
    raw = len(row[7])
    assert rec.stored is not None and rec.stored_bytes >= 10 * raw  # the decoded results, not their text
    assert rec.size == rec.stored_bytes + len(row[8])  # and its request, as JSON
    assert rec.request is not None and rec.request.kwargs["data"] == nested  # decoded when read


def test_the_table_counts_requests_at_once_and_lets_old_finished_jobs_go_past_its_bound() -> None:
    table = JobTable(100, max_bytes=1_000_000)
    big = JobRequest(service="demo", task="echo", kwargs={"data": "x" * 300_000})
    running = JobRecord("r" * 32, "demo", "echo", "any", JobFuture("r" * 32), "", request_json=encode_request(big))
    table.add(running, persist=False)
    assert table.bytes == len(encode_request(big)) > 300_000  # held from its submission, not its end
    for i in range(5):
        row = stored_row(f"{i:032x}", "y" * 100_000)
        table.add(record_of(*row[:6], 60.0, row[7], row[8]), persist=False)
    assert table.bytes <= 1_000_000 and table.released >= 2
    assert table.get("r" * 32) is running  # a job in flight is never let go of for the byte bound
    assert json.loads(running.request_json or b"{}")["kwargs"]["data"] == "x" * 300_000
