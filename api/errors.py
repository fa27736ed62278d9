"""The API's refusals as exceptions that carry their HTTP answer, raised anywhere below `api.http`.

A `ProblemError` is a plain exception (no FastAPI here): the job, replica and schedule layers raise
it, and `api.http.problems` turns it into an RFC 9457 problem document. Fabric errors map onto it
here, in one place, so POST /jobs, schedules and recovery refuse alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zfab.errors import (
    BackpressureError,
    BadRequestError,
    BrokerUnavailableError,
    BusyError,
    ClosedError,
    JobError,
    JobTimeoutError,
    NoWorkersError,
    PayloadTooLargeError,
    ZfabError,
)

RETRY_AFTER = "1"


class ProblemError(Exception):
    """Raise from a handler (or anything it calls) to answer with a problem document."""

    def __init__(
        self, status: int, slug: str, title: str, detail: str, headers: Mapping[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = extra


def unavailable(detail: str, slug: str = "fabric-unavailable") -> ProblemError:
    return ProblemError(503, slug, "Fabric unavailable", detail, {"Retry-After": RETRY_AFTER})


def database_unavailable(detail: str) -> ProblemError:
    """503 for a request the shared database must answer while it does not (api/replicas/)."""
    return ProblemError(
        503,
        "database-unavailable",
        "Database unavailable",
        f"the API database does not answer: {detail}",
        {"Retry-After": RETRY_AFTER},
    )


def from_fabric_error(exc: ZfabError, uuid: str | None = None) -> ProblemError:
    """The HTTP answer for an error that stopped a request before the job could run."""
    extra: dict[str, Any] = {"job": uuid} if uuid else {}
    if isinstance(exc, NoWorkersError):
        # Workers come and go: a retry after they (re)register may succeed, so 503, not 404.
        return ProblemError(503, "no-workers", "No live workers", str(exc), {"Retry-After": RETRY_AFTER}, **extra)
    if isinstance(exc, BusyError | BackpressureError):
        return ProblemError(503, "busy", "Fabric busy", str(exc), {"Retry-After": RETRY_AFTER}, **extra)
    if isinstance(exc, BrokerUnavailableError | ClosedError):
        return ProblemError(503, "fabric-unavailable", "Fabric unavailable", str(exc), {"Retry-After": RETRY_AFTER})
    if isinstance(exc, PayloadTooLargeError):  # over ZFAB_MAX_MESSAGE_BYTES: the sentence names it
        return ProblemError(413, "payload-too-large", "Payload over the fabric's message limit", str(exc), **extra)
    if isinstance(exc, BadRequestError):
        return ProblemError(400, "bad-request", "Request rejected by the fabric", str(exc), **extra)
    if isinstance(exc, JobTimeoutError):
        return ProblemError(504, "timeout", "The fabric did not answer in time", str(exc), **extra)
    if isinstance(exc, JobError):
        return ProblemError(502, "job-error", "The fabric could not complete the request", str(exc), **extra)
    return ProblemError(502, "fabric-error", "Fabric error", str(exc), **extra)


def admission_problem(exc: ZfabError, uuid: str) -> ProblemError:
    """The HTTP answer for a job the fabric would not take: what a retry cannot fix is a 4xx."""
    if isinstance(exc, NoWorkersError):
        return ProblemError(404, "unknown-service", "No such service or worker", str(exc), job=uuid)
    if isinstance(exc, BusyError | BackpressureError):
        hint = exc.retry_after if isinstance(exc, JobError) and exc.retry_after else 1
        return ProblemError(503, "busy", "Fabric busy", str(exc), {"Retry-After": str(int(hint))}, job=uuid)
    if isinstance(exc, BrokerUnavailableError | ClosedError):
        return unavailable(str(exc))
    if isinstance(exc, PayloadTooLargeError):
        return from_fabric_error(exc, uuid)
    if isinstance(exc, BadRequestError):
        return ProblemError(400, "bad-request", "Request rejected by the fabric", str(exc), job=uuid)
    return from_fabric_error(exc, uuid)
