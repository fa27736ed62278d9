"""@task: arguments validated from type hints, the Job injected, a JSON schema for list_tasks."""

from __future__ import annotations

from typing import Any

import pytest

from zfab.worker.job import Job
from zfab.worker.task import TaskArgumentsError, TaskSpec, build_spec, is_task, task


class Inventory:
    """A small service class, shaped like a Worker's tasks."""

    @task
    def add(self, a: int, b: int = 2) -> int:
        """Add two numbers.

        The second defaults to two.
        """
        return a + b

    @task
    def tag(self, job: Job, name: str, labels: list[str] | None = None) -> dict[str, Any]:
        """Tag a device; the running job is injected."""
        return {"job": job.uuid, "name": name, "labels": labels or []}

    @task
    def keyword_only(self, *, level: float) -> float:
        return level

    @task
    def untyped(self, value):  # type: ignore[no-untyped-def]
        return value

    @task
    def loosely(self, value, note=None):  # type: ignore[no-untyped-def]
        return value, note

    @task
    def star_args(self, *items: int) -> int:
        return sum(items)

    @task
    def star_kwargs(self, **options: str) -> dict[str, str]:
        return options

    @task
    def positional_only(self, a: int, /, b: int = 0) -> int:
        return a + b

    def helper(self) -> None:
        """Not a task."""


def spec_of(name: str) -> TaskSpec:
    return build_spec(name, getattr(Inventory(), name), Job)


def make_job() -> Job:
    return Job(uuid="job-1", client=b"c", task="tag", args=[], kwargs={}, timeout=None, push=True, ack=True)


# ---- marking -------------------------------------------------------------------------


def test_only_methods_marked_with_task_are_tasks() -> None:
    svc = Inventory()

    assert is_task(svc.add)
    assert not is_task(svc.helper)
    assert not is_task("add")


# ---- bind ----------------------------------------------------------------------------


def test_bind_maps_positional_and_keyword_arguments_to_names() -> None:
    spec = spec_of("add")

    assert spec.bind([1], {"b": 5}) == {"a": 1, "b": 5}
    assert spec.bind([1, 3], {}) == {"a": 1, "b": 3}


def test_bind_fills_defaults() -> None:
    assert spec_of("add").bind([], {"a": 7}) == {"a": 7, "b": 2}


def test_bind_coerces_values_to_the_annotated_type() -> None:
    bound = spec_of("add").bind(["4"], {"b": 1.0})

    assert bound == {"a": 4, "b": 1}
    assert type(bound["a"]) is int and type(bound["b"]) is int


def test_bound_arguments_call_the_task() -> None:
    spec = spec_of("add")

    assert spec.fn(**spec.bind(["4"], {})) == 6


def test_value_of_the_wrong_type_is_rejected_naming_the_field() -> None:
    with pytest.raises(TaskArgumentsError, match=r"bad arguments for task 'add': a: .*integer"):
        spec_of("add").bind(["four"], {})


def test_missing_required_argument_is_rejected() -> None:
    with pytest.raises(TaskArgumentsError, match=r"a: Field required"):
        spec_of("add").bind([], {"b": 1})


def test_unknown_keyword_argument_is_rejected() -> None:
    with pytest.raises(TaskArgumentsError, match=r"c: Extra inputs are not permitted"):
        spec_of("add").bind([1], {"c": 2})


def test_too_many_positional_arguments_are_rejected() -> None:
    with pytest.raises(TaskArgumentsError, match=r"at most 2 positional arguments, got 3"):
        spec_of("add").bind([1, 2, 3], {})


def test_argument_given_by_position_and_by_name_is_rejected() -> None:
    with pytest.raises(TaskArgumentsError, match=r"got argument 'a' twice"):
        spec_of("add").bind([1], {"a": 2})


def test_keyword_only_parameter_cannot_be_given_by_position() -> None:
    spec = spec_of("keyword_only")

    assert spec.bind([], {"level": "0.5"}) == {"level": 0.5}
    with pytest.raises(TaskArgumentsError, match="at most 0 positional"):
        spec.bind([0.5], {})


def test_unannotated_parameter_accepts_any_value() -> None:
    assert spec_of("untyped").bind([{"any": ["thing"]}], {}) == {"value": {"any": ["thing"]}}


def test_a_task_without_annotations_is_checked_by_its_names_alone() -> None:
    # Given a task none of whose parameters is annotated (no model needed to read them)
    spec = spec_of("loosely")
    assert spec.loose is not None and spec_of("add").loose is None
    # an argument left out takes the function's default, the values reach it unchanged
    value = {"nested": [1, "two"]}
    bound = spec.bind([value], {})
    assert spec.fn(**bound) == (value, None) and bound["value"] is value
    assert spec.fn(**spec.bind([], {"value": 1, "note": "n"})) == (1, "n")
    # and wrong names are refused as the model refuses them
    with pytest.raises(TaskArgumentsError, match=r"other: Extra inputs are not permitted"):
        spec.bind([1], {"other": 2})
    with pytest.raises(TaskArgumentsError, match=r"value: Field required"):
        spec.bind([], {"note": 1})
    with pytest.raises(TaskArgumentsError, match=r"got argument 'value' twice"):
        spec.bind([1], {"value": 2})


# ---- the Job parameter ----------------------------------------------------------------


def test_job_parameter_is_found_and_left_out_of_the_arguments() -> None:
    spec = spec_of("tag")

    assert spec.job_param == "job"
    assert spec.positional == ["name", "labels"]
    assert spec.bind(["r1"], {}) == {"name": "r1", "labels": None}


def test_job_parameter_cannot_be_supplied_by_the_client() -> None:
    with pytest.raises(TaskArgumentsError, match="job: Extra inputs"):
        spec_of("tag").bind(["r1"], {"job": {"uuid": "forged"}})


def test_injected_job_reaches_the_task_alongside_the_bound_arguments() -> None:
    spec = spec_of("tag")
    job = make_job()
    kwargs = spec.bind(["r1", ["core"]], {})
    assert spec.job_param is not None
    kwargs[spec.job_param] = job

    assert spec.fn(**kwargs) == {"job": "job-1", "name": "r1", "labels": ["core"]}


# ---- schema --------------------------------------------------------------------------


def test_schema_gives_name_first_docstring_paragraph_and_input_schema() -> None:
    schema = spec_of("add").schema()

    assert schema["name"] == "add"
    assert schema["description"] == "Add two numbers."
    inputs = schema["inputSchema"]
    assert inputs["type"] == "object"
    assert set(inputs["properties"]) == {"a", "b"}
    assert inputs["properties"]["a"]["type"] == "integer"
    assert inputs["properties"]["b"]["default"] == 2
    assert inputs["required"] == ["a"]
    assert inputs["additionalProperties"] is False


def test_schema_leaves_out_the_job_parameter() -> None:
    inputs = spec_of("tag").schema()["inputSchema"]

    assert set(inputs["properties"]) == {"name", "labels"}
    assert inputs["required"] == ["name"]


def test_task_without_docstring_has_empty_description() -> None:
    assert spec_of("keyword_only").schema()["description"] == ""


# ---- refused signatures --------------------------------------------------------------


@pytest.mark.parametrize("name", ["star_args", "star_kwargs"])
def test_star_args_and_star_kwargs_tasks_are_refused(name: str) -> None:
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs cannot be validated"):
        spec_of(name)


def test_positional_only_parameters_are_refused_when_the_task_is_built() -> None:
    # The worker calls tasks with keyword arguments only, so `a` can never be passed
    with pytest.raises(TypeError):
        spec_of("positional_only")
