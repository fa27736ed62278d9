"""`@task`: marks a Worker method as a task whose arguments are validated from its type hints."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ..core.limits import Rule, read_rule
from ..core.retries import MAX_RETRIES, Backoff, read_backoff
from ..errors import JobCancelledError, JobTimeoutError

F = TypeVar("F", bound=Callable[..., Any])

_TASK_ATTR = "__zfab_task__"
_DECLARATION_ATTR = "__zfab_declaration__"
DECLARATION_KEY = "x-zfab"  # where a task's declaration travels in its announced argument schema


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed attempt of a task runs again: up to `retries` more times, for exceptions of
    the `retry_on` types, after the `backoff` schedule's wait."""

    retries: int
    backoff: Backoff = field(default_factory=Backoff)
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def after(self, attempt: int, exc: BaseException) -> float | None:
        """Seconds to wait before attempt `attempt` + 1, or None when attempt `attempt` was the last
        (or `exc` is not one to retry: a cancel or a deadline never is)."""
        if attempt > self.retries or isinstance(exc, JobCancelledError | JobTimeoutError):
            return None
        if not isinstance(exc, self.retry_on):
            return None
        return self.backoff.delay(attempt)

    def for_job(self, retries: int | None, backoff: Backoff | None) -> RetryPolicy:
        """This policy as one job asks it: its own count of retries and schedule, where it gives them."""
        return RetryPolicy(self.retries if retries is None else retries, backoff or self.backoff, self.retry_on)


@dataclass(frozen=True, slots=True)
class Declaration:
    """What `@task(...)` declares beyond the signature (docs: README, "Retries")."""

    retry: RetryPolicy | None = None
    redact: tuple[str, ...] = ()
    limits: Rule | None = None  # rate and concurrency, enforced by the broker across the workers


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
    declaration: Declaration = field(default_factory=Declaration)
    # (every parameter, the required ones) when each takes any value (no annotation, or Any): then
    # arguments that name them rightly need no model (pydantic cost 20-30 us of a cold job's path)
    loose: tuple[frozenset[str], frozenset[str]] | None = None

    def retry_policy(self, retries: int | None = None, backoff: Backoff | None = None) -> RetryPolicy | None:
        """How a failed attempt of one job runs again: the task's declaration, with what the job
        asks (`retries`, `backoff`) in its place; None when neither asks for retries."""
        declared = self.declaration.retry
        if declared is None:
            return None if not retries else RetryPolicy(retries, backoff or Backoff())
        return declared.for_job(retries, backoff)

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
        loose = self.loose
        if loose is not None and loose[1] <= data.keys() <= loose[0]:
            return data  # an argument left out takes the function's own default, as the model's would
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
            "inputSchema": self.input_schema(),
        }

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the task's arguments, with its declaration (retries, redacted fields)
        under `x-zfab` when it has one: what READY announces and list_tasks shows."""
        schema = self.model.model_json_schema()
        declared = self.declared()
        if declared:
            schema[DECLARATION_KEY] = declared
        return schema

    def declared(self) -> dict[str, Any]:
        """The declaration as JSON: only what the task declares."""
        decl = self.declaration
        out: dict[str, Any] = {}
        if decl.retry is not None:
            out["retries"] = decl.retry.retries
            out["backoff"] = decl.retry.backoff.as_dict()
            out["retry_on"] = [t.__name__ for t in decl.retry.retry_on]
        if decl.redact:
            out["redact"] = list(decl.redact)
        if decl.limits is not None:
            out.update({k: v for k, v in decl.limits.as_dict().items() if v is not None})
        return out


@overload
def task(fn: F, /) -> F: ...


@overload
def task(
    *,
    retries: int = 0,
    backoff: float | Backoff | None = None,
    retry_on: type[BaseException] | Sequence[type[BaseException]] = (Exception,),
    redact: Sequence[str] = (),
    rate_limit: str | None = None,
    concurrency: int | None = None,
    limit_key: str | None = None,
) -> Callable[[F], F]: ...


def task(
    fn: F | None = None,
    /,
    *,
    retries: int = 0,
    backoff: float | Backoff | None = None,
    retry_on: type[BaseException] | Sequence[type[BaseException]] = (Exception,),
    redact: Sequence[str] = (),
    rate_limit: str | None = None,
    concurrency: int | None = None,
    limit_key: str | None = None,
) -> F | Callable[[F], F]:
    """Mark a Worker method as a task, bare (`@task`) or with its options (`@task(retries=3)`).

    The method's type hints are its arguments' JSON schema: a job whose arguments do not match is
    refused before it runs (a 400 naming the argument). Parameters annotated `Job` receive the running
    job instead. What the method returns is the job's result (JSON); what it raises fails the job, with
    the traceback in the result's `errors`. An `async def` task runs on the worker's event loop
    (`ZFAB_ASYNC_CONCURRENCY` at once), not on a pool thread: thousands of jobs that mostly wait cost a
    coroutine each, not a thread.

    Args:
        fn: the method, when used bare (`@task`).
        retries: attempts after the first when it raises one of `retry_on` (a job's own `retries`
            wins over this).
        backoff: the wait between attempts: seconds (the base of a doubling schedule) or a `Backoff`.
        retry_on: the exceptions that are retried (default: any `Exception`); a cancel, a deadline and
            bad arguments never are.
        redact: arguments the API and console show as `"***"` (passwords, keys).
        rate_limit: at most this many of its jobs start, evenly spaced: `"5/s"`, `"100/m"`,
            `"10 per hour"`.
        concurrency: at most this many of its jobs run at once.
        limit_key: apply `rate_limit` and `concurrency` per value of this argument. The broker enforces
            limits across all the service's workers; jobs over a limit wait in its queue.

    Returns:
        The method, marked (or, with options, a decorator that marks it).

    Raises:
        ValueError: a limit that cannot be read (`rate_limit="fast"`), or options out of range.

    Example:
        ```python
        from zfab import Backoff, Job, Worker, task


        class Devices(Worker):
            service = "devices"

            @task
            def ping(self, host: str, count: int = 3) -> bool:
                return count > 0

            @task(retries=4, backoff=Backoff(base=1, cap=60), retry_on=(OSError,), redact=("password",))
            def backup(self, job: Job, host: str, password: str) -> str:
                job.event(f"attempt {job.attempt} of {job.attempts}")
                return f"saved {host}"

            @task(rate_limit="10/m", concurrency=2, limit_key="site")
            async def firmware(self, site: str, host: str) -> str:
                return f"{site}/{host}: upgraded"
        ```
    """
    declaration = _declaration(retries, backoff, retry_on, redact)
    try:
        limits = read_rule({"rate_limit": rate_limit, "concurrency": concurrency, "limit_key": limit_key})
    except ValueError as exc:
        raise ValueError(f"@task {exc}") from None
    if limits is not None:
        declaration = replace(declaration, limits=limits)

    def mark(f: F) -> F:
        setattr(f, _TASK_ATTR, True)
        if declaration != Declaration():
            setattr(f, _DECLARATION_ATTR, declaration)
        return f

    return mark(fn) if fn is not None else mark


def _declaration(
    retries: int,
    backoff: float | Backoff | None,
    retry_on: type[BaseException] | Sequence[type[BaseException]],
    redact: Sequence[str],
) -> Declaration:
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ValueError(f"@task retries must be a whole number from 0 to {MAX_RETRIES}, not {retries!r}")
    types = (retry_on,) if isinstance(retry_on, type) else tuple(retry_on)
    if not types or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise ValueError("@task retry_on must be an exception class or a tuple of them")
    if isinstance(redact, str):
        raise ValueError("@task redact must be a tuple of argument names, not one string")
    policy = None
    if retries:
        policy = RetryPolicy(retries, read_backoff(backoff) if backoff is not None else Backoff(), types)
    elif backoff is not None:
        raise ValueError("@task backoff without retries: say how many retries the task may have")
    return Declaration(retry=policy, redact=tuple(str(n) for n in redact))


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
    declaration = getattr(fn, _DECLARATION_ATTR, None) or Declaration()
    unknown = [n for n in declaration.redact if n not in fields]
    if unknown:
        raise TypeError(f"task '{name}': redact names {unknown[0]!r}, which is not one of its arguments")
    key = declaration.limits.key if declaration.limits is not None else None
    if key is not None and key not in fields:
        raise TypeError(f"task '{name}': limit_key names {key!r}, which is not one of its arguments")
    loose = None
    if all(ann is Any for ann, _ in fields.values()):
        loose = (frozenset(fields), frozenset(n for n, (_, default) in fields.items() if default is ...))
    return TaskSpec(name, fn, model, positional, job_param, doc.split("\n\n")[0], is_async, declaration, loose)
