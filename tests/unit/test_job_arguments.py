"""What GET /jobs/{uuid} shows of a job's arguments (api/jobs/arguments.py): redacted by name and by
position as the task declares, withheld when the declaration cannot be read, bounded in bytes."""

from __future__ import annotations

from zfab.api.jobs.arguments import SHOWN_BYTES, shown
from zfab.api.models import JobRequest

SCHEMA = {
    "properties": {"user": {"type": "string"}, "password": {"type": "string"}, "site": {"type": "string"}},
    "x-zfab": {"redact": ["password"]},
}


def request(**kw: object) -> JobRequest:
    return JobRequest.model_validate({"service": "s", "task": "login", **kw})


def test_a_declared_secret_is_shown_as_stars_by_name_and_by_position() -> None:
    by_name = shown(request(kwargs={"user": "ada", "password": "hunter2"}), SCHEMA)
    assert by_name.kwargs == {"user": "ada", "password": "***"} and by_name.redacted == ["password"]
    by_position = shown(request(args=["ada", "hunter2", "lab"]), SCHEMA)
    assert by_position.args == ["ada", "***", "lab"] and by_position.redacted == ["password"]
    assert "hunter2" not in by_position.model_dump_json()


def test_a_task_without_a_declaration_shows_everything() -> None:
    got = shown(request(args=[1], kwargs={"password": "x"}), {"properties": {"a": {}}})
    assert got.args == [1] and got.kwargs == {"password": "x"} and got.redacted == [] and got.omitted is None
    assert shown(request(kwargs={"a": 1}), None).kwargs == {"a": 1}  # a NorFab service announces no schema


def test_arguments_are_withheld_when_the_declaration_cannot_be_read() -> None:
    got = shown(request(kwargs={"password": "hunter2"}), None, known=False)
    assert got.args is None and got.kwargs is None and "could not be read" in (got.omitted or "")


def test_arguments_over_the_bound_are_counted_not_shown() -> None:
    got = shown(request(kwargs={"user": "x" * SHOWN_BYTES}), SCHEMA)
    assert got.args is None and got.kwargs is None and got.bytes > SHOWN_BYTES and "over the" in (got.omitted or "")
