"""A job's arguments as the API keeps and shows them: the ones its task declares secret
(`@task(redact=(...))`, announced under the schema's `x-zfab`) are replaced by "***" when the job is
recorded (`recorded_json`), from the declaration at that time, so the clear value reaches the fabric
and never the API's table, its database (SQLite or PostgreSQL) or its answers. A service's declarations
are fixed by its first worker (the broker refuses a conflicting announcement: broker/declarations.py).

GET shows them as recorded, redacted again by the declaration read then (cached a few seconds), and
nothing past a byte bound, as results are bounded. When the declaration cannot be read (the broker
silent, nothing cached) the arguments are withheld, not guessed.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from ..models import JobArguments, JobRequest
from ..state import ApiState
from .admission import DECLARATION_KEY
from .record import JobRecord, encode_request

SHOWN_BYTES = 64 * 1024  # arguments larger than this as JSON are not shown (only their size)
REDACTED = "***"


class Asked(Protocol):
    """What shown() reads of a request: a JobRequest, or the fields _asked() decodes."""

    @property
    def service(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def args(self) -> list[Any]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...


class _Asked(msgspec.Struct):
    """The four fields of a stored request (a JobRequest's JSON) that showing its arguments needs: decoded
    by msgspec, not validated again by pydantic (it was when it came), on every POST answer and GET."""

    service: str
    task: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


_asked = msgspec.json.Decoder(_Asked).decode
_encode = msgspec.json.Encoder(enc_hook=str).encode


async def arguments_of(st: ApiState, rec: JobRecord) -> JobArguments | None:
    """The job's arguments as GET shows them; None when the API does not hold its request."""
    raw = rec.request_json
    if raw is None:
        return None
    req: Asked
    try:
        req = _asked(raw)
    except msgspec.MsgspecError:  # a number past 64 bits, which pydantic took: read as pydantic did
        req = JobRequest.model_validate_json(raw)
    known, tasks = await st.schemas.lookup(st.client, req.service)
    schema = (tasks or {}).get(req.task)
    return shown(req, schema if isinstance(schema, dict) else None, known=known)


def shown(req: Asked, schema: dict[str, Any] | None, *, known: bool = True) -> JobArguments:
    """`req`'s arguments redacted by `schema`'s declaration and bounded in bytes (pure)."""
    size = len(_encode([req.args, req.kwargs]))
    if not known:
        why = "the task's declaration of secret arguments could not be read from the broker; try again shortly"
        return JobArguments(args=None, kwargs=None, bytes=size, omitted=why)
    secret = redacted_names(schema)
    names = list((schema or {}).get("properties") or {})
    args = [REDACTED if i < len(names) and names[i] in secret else v for i, v in enumerate(req.args)]
    kwargs = {k: REDACTED if k in secret else v for k, v in req.kwargs.items()}
    hidden = sorted(
        {names[i] for i in range(min(len(req.args), len(names))) if names[i] in secret} | (secret & set(req.kwargs))
    )
    if size > SHOWN_BYTES:
        why = f"{size} bytes of arguments, over the {SHOWN_BYTES} bytes GET shows"
        return JobArguments(args=None, kwargs=None, redacted=hidden, bytes=size, omitted=why)
    return JobArguments(args=args, kwargs=kwargs, redacted=hidden, bytes=size)


def recorded_json(st: ApiState, req: JobRequest, raw: bytes | None) -> bytes | None:
    """The request's JSON as the API records it: `raw` (or None: encoded as usual) when its task declares no
    secret, else with each secret argument as "***"; every argument withheld when the declaration was never
    read. A dict lookup per job on names made when the declarations were fetched (check_job fetched them)."""
    secret = st.schemas.secrets(req.service, req.task)
    if secret is not None and not secret:
        return raw
    if secret is None:
        hidden = req.model_copy(
            update={"args": [REDACTED] * len(req.args), "kwargs": dict.fromkeys(req.kwargs, REDACTED)}
        )
        return encode_request(hidden)
    names = argument_names(st, req)
    args = [REDACTED if i < len(names) and names[i] in secret else v for i, v in enumerate(req.args)]
    kwargs = {k: REDACTED if k in secret else v for k, v in req.kwargs.items()}
    return encode_request(req.model_copy(update={"args": args, "kwargs": kwargs}))


def argument_names(st: ApiState, req: JobRequest) -> list[str]:
    """The task's argument names in order, from its announced schema (what a positional argument is)."""
    schema = (st.schemas.cached(req.service) or {}).get(req.task)
    return list((schema or {}).get("properties") or {}) if isinstance(schema, dict) else []


def secrets_given(st: ApiState, req: JobRequest) -> list[str]:
    """The secret arguments (its task's `redact`, as last read from the broker) `req` gives a value, by name;
    none when the task declares none or no declaration was read."""
    secret = st.schemas.secrets(req.service, req.task)
    if not secret:
        return []
    names = argument_names(st, req)
    given = {names[i] for i in range(min(len(req.args), len(names))) if names[i] in secret}
    return sorted(given | {k for k in req.kwargs if k in secret})


def holds_redacted(req: JobRequest) -> bool:
    """The recorded request has an argument replaced by "***": it cannot be submitted again as it was."""
    return REDACTED in req.args or REDACTED in req.kwargs.values()


def redacted_names(schema: dict[str, Any] | None) -> set[str]:
    """The argument names a task's announced schema declares secret."""
    decl = (schema or {}).get(DECLARATION_KEY)
    names = decl.get("redact") if isinstance(decl, dict) else None
    return {str(n) for n in names} if isinstance(names, list) else set()
