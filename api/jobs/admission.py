"""What the API checks before a job reaches the broker: its arguments against the task's schema.

The broker knows each service's tasks and their argument schemas from its workers (MMI
`show_tasks`); the API reads them (cached a few seconds, bounded) and answers 422 naming the
argument a worker would refuse, instead of a 202 for a job bound to fail. The check is as lax
as the worker's own validation (core/schemacheck.py), so it never refuses what a worker would
run; for POST /jobs an unknown task is the broker's to refuse (400), and a service whose workers
announce no schemas (NorFab's) is not checked here. A schedule's job, which the broker sees only
when it fires, is checked here for all three (`check_template`), from the same announced tasks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from zfab import BoundedLRU, check_arguments

from ..errors import ProblemError
from ..fabric import mmi
from ..models import JobRequest

TTL = 5.0
DECLARATION_KEY = "x-zfab"  # where a task's announced schema carries its declaration (worker/task.py)
MAX_SERVICES = 1000


class TaskSchemas:
    """service -> (fetched at, {task: inputSchema} or None), least recently used first."""

    def __init__(self) -> None:
        self._cache: BoundedLRU[str, tuple[float, dict[str, Any] | None]] = BoundedLRU(max_count=MAX_SERVICES)
        self._fetching: dict[str, asyncio.Future[tuple[bool, dict[str, Any] | None]]] = {}
        # service -> {task: the argument names it declares secret}, made once per fetch: what a job's record
        # redacts is then a dict lookup per job (api/jobs/arguments.py, recorded_json).
        self._secrets: BoundedLRU[str, dict[str, frozenset[str]]] = BoundedLRU(max_count=MAX_SERVICES)

    def cached(self, service: str) -> dict[str, Any] | None:
        """The service's tasks as last read (no fetch)."""
        hit = self._cache.get(service)
        return hit[1] if hit is not None else None

    def secrets(self, service: str, task: str) -> frozenset[str] | None:
        """The argument names `task` declares secret, as last read from the broker; None when nothing was read."""
        found = self._secrets.get(service)
        return None if found is None else found.get(task, NO_SECRETS)

    async def get(self, client: Any, service: str) -> dict[str, Any] | None:
        return (await self.lookup(client, service))[1]

    async def lookup(self, client: Any, service: str) -> tuple[bool, dict[str, Any] | None]:
        """(known, {task: schema} or None). `known` is False when the broker could not be asked
        and nothing is cached: whoever must not guess (which arguments are secret) can tell.

        One fetch per service at a time: callers that miss while it is under way wait for it, and a
        caller with an expired entry gets that entry at once while the fetch refreshes it (every job's
        admission and answer reads this; none should wait out an MMI round trip the TTL made due)."""
        hit = self._cache.get(service)
        if hit is not None and time.monotonic() - hit[0] < TTL:
            self._cache.touch(service)
            return True, hit[1]
        pending = self._fetching.get(service)
        if pending is None:
            if len(self._fetching) >= MAX_SERVICES:  # as many fetches under way as services kept
                return (True, hit[1]) if hit is not None else await self._fetch(client, service, None)
            pending = self._fetching[service] = asyncio.ensure_future(self._fetch(client, service, hit))
            pending.add_done_callback(lambda _: self._fetching.pop(service, None))
        if hit is not None:
            return True, hit[1]
        return await asyncio.shield(pending)

    async def _fetch(
        self, client: Any, service: str, hit: tuple[float, dict[str, Any] | None] | None
    ) -> tuple[bool, dict[str, Any] | None]:
        try:
            answer = await mmi(client, "show_tasks", service=service)
        except Exception:
            # The broker will judge a job's arguments itself.
            return (True, hit[1]) if hit is not None else (False, None)
        tasks = answer.get("tasks") if isinstance(answer, dict) else None
        entry = (time.monotonic(), tasks if isinstance(tasks, dict) else None)
        self._cache.put(service, entry)
        self._cache.shed()
        self._secrets.put(service, _secret_names(entry[1]))
        self._secrets.shed()
        return True, entry[1]


NO_SECRETS: frozenset[str] = frozenset()


def _secret_names(tasks: dict[str, Any] | None) -> dict[str, frozenset[str]]:
    """{task: names declared secret} for the tasks that declare any (`x-zfab` `redact`)."""
    out: dict[str, frozenset[str]] = {}
    for task, schema in (tasks or {}).items():
        decl = schema.get(DECLARATION_KEY) if isinstance(schema, dict) else None
        names = decl.get("redact") if isinstance(decl, dict) else None
        if isinstance(names, list) and names:
            out[task] = frozenset(str(n) for n in names)
    return out


async def check_job(schemas: TaskSchemas, client: Any, req: JobRequest) -> None:
    """422 when the job's arguments do not fit its task (as the worker would say)."""
    tasks = await schemas.get(client, req.service)
    _check_arguments(req, tasks)


async def check_template(schemas: TaskSchemas, client: Any, req: JobRequest) -> None:
    """A job to be submitted later (a schedule's): refused now for what the broker would refuse then,
    when the fabric can tell. 404 for a service no worker registered (past the broker's startup grace),
    400 for a task the service's workers do not declare, 422 for arguments its schema refuses: the
    answers POST /jobs gives. Nothing is refused when the broker cannot be asked, or for a service
    whose workers announce no tasks (NorFab's): the firing then meets the broker's own judgement."""
    known, tasks = await schemas.lookup(client, req.service)
    if not known:
        return
    if tasks is None:
        if not await _service_unknown(client, req.service):
            return
        raise ProblemError(
            404,
            "unknown-service",
            "No such service or worker",
            f"no worker of service '{req.service}' is registered with the broker: start one, or check the name",
        )
    if req.task not in tasks:
        names = ", ".join(sorted(tasks)[:20]) + (", ..." if len(tasks) > 20 else "")
        raise ProblemError(
            400,
            "unknown-task",
            "No such task",
            f"service '{req.service}' has no task '{req.task}' (its workers declare: {names})",
        )
    _check_arguments(req, tasks)


async def _service_unknown(client: Any, service: str) -> bool:
    """True when the broker answers that no worker of `service` registered and it is past its startup
    grace (a broker that just started cannot tell a typo from workers on their way back)."""
    try:
        services = await mmi(client, "show_services")
        if any(isinstance(s, dict) and s.get("service") == service for s in services or []):
            return False
        broker = await mmi(client, "show_broker")
    except Exception:
        return False
    return isinstance(broker, dict) and not broker.get("starting")


def _check_arguments(req: JobRequest, tasks: dict[str, Any] | None) -> None:
    schema = (tasks or {}).get(req.task)
    if not isinstance(schema, dict):
        return
    problem = check_arguments(req.args, req.kwargs, schema)
    if problem is not None:
        raise ProblemError(
            422,
            "bad-arguments",
            "Arguments do not fit the task",
            f"bad arguments for task '{req.task}' of service '{req.service}': {problem}",
        )
