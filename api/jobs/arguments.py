"""What GET /jobs/{uuid} shows of a job's arguments: as they were submitted, with the ones its task
declares secret (`@task(redact=(...))`, announced under the schema's `x-zfab`) shown as "***", and
nothing past a byte bound, as results are bounded.

The task's declaration is read when the job is shown, from the broker's `show_tasks` (cached a few
seconds): a job submitted before a worker declared a field secret is shown redacted too. When the
declaration cannot be read (the broker silent, nothing cached) the arguments are withheld, not
guessed.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from ..models import JobArguments, JobRequest
from ..state import ApiState
from .table import JobRecord

SHOWN_BYTES = 64 * 1024  # arguments larger than this as JSON are not shown (only their size)
REDACTED = "***"
DECLARATION_KEY = "x-zfab"


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


def redacted_names(schema: dict[str, Any] | None) -> set[str]:
    """The argument names a task's announced schema declares secret."""
    decl = (schema or {}).get(DECLARATION_KEY)
    names = decl.get("redact") if isinstance(decl, dict) else None
    return {str(n) for n in names} if isinstance(names, list) else set()
