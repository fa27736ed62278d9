"""`@task`: marks a Worker method as a task whose arguments are validated from its type hints."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

F = TypeVar("F", bound=Callable[..., Any])

_TASK_ATTR = "__zfab_task__"


class TaskArgumentsError(ValueError):
    """Arguments that do not fit the task's signature; the message names each bad field."""


@dataclass(slots=True)
class TaskSpec:
    name: str
    fn: Callable[..., Any]
    model: type[BaseModel]
    positional: list[str]  # parameter names in order, for args given by position
    job_param: str | None  # the parameter that receives the Job, if any
    description: str
    is_async: bool = False  # an `async def` task: runs on the worker's event loop, not a pool thread

    def bind(self, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Validate args and kwargs; return keyword arguments ready for the call."""
        if len(args) > len(self.positional):
            raise TaskArgumentsError(
                f"task '{self.name}' takes at most {len(self.positional)} positional arguments, got {len(args)}"
            )
        data = dict(zip(self.positional, args, strict=False))
        for k, v in kwargs.items():
            if k in data:
                raise TaskArgumentsError(f"task '{self.name}' got argument '{k}' twice")
            data[k] = v
        try:
            model = self.model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors()
            )
            raise TaskArgumentsError(f"bad arguments for task '{self.name}': {problems}") from None
        # A validated model's fields are its __dict__ (extras and private attributes live apart).
        return dict(model.__dict__)

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.model.model_json_schema(),
        }


def task(fn: F) -> F:
    """Mark a Worker method as a task. Parameters annotated `Job` receive the running job.

    An `async def` task runs on the worker's event loop (ZFAB_ASYNC_CONCURRENCY at once), not on a
    pool thread: thousands of jobs that mostly wait cost a coroutine each, not a thread."""
    setattr(fn, _TASK_ATTR, True)
    return fn


def is_task(obj: object) -> bool:
    return callable(obj) and getattr(obj, _TASK_ATTR, False) is True


def build_spec(name: str, fn: Callable[..., Any], job_type: type) -> TaskSpec:
    """Build the validation model of a bound task method from its signature and hints."""
    sig = inspect.signature(fn)
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    positional: list[str] = []
    job_param: str | None = None
    for pname, p in sig.parameters.items():
        ann = hints.get(pname, Any)
        if ann is job_type:
            job_param = pname
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"task '{name}': *args/**kwargs cannot be validated; name each parameter")
        if p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"task '{name}': positional-only parameter '{pname}'; tasks are called by keyword")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[pname] = (ann, default)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional.append(pname)
    model = create_model(
        f"{name}_arguments", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields
    )
    doc = inspect.getdoc(fn) or ""
    is_async = inspect.iscoroutinefunction(fn)
    return TaskSpec(name, fn, model, positional, job_param, doc.split("\n\n")[0], is_async)
