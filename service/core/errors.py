"""The specific errors zfab raises. Each message says what happened and what to do.

Pure: imports nothing of ours, so every layer (core included) can raise them.
"""

from __future__ import annotations

from typing import Any


class ZfabError(Exception):
    """Base class of every zfab error."""


class ProtocolError(ZfabError):
    """A frame list or payload that is not valid NFP. `reason` is a short fixed token for metrics."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SecurityError(ZfabError, ValueError):
    """A key or endpoint setting that would leave the fabric open or broken."""


class BadNameError(SecurityError):
    """A worker, service or key name that cannot be a file name (a path, `..`, too long...): taken as
    given it would write outside the data directory, or fail there. The CLI prints it as one line
    and exits with code 2, as it does every SecurityError."""


class BackpressureError(ZfabError):
    """A bounded outbound queue stayed full past its timeout: the peer is slow or gone."""


class ClosedError(ZfabError):
    """The loop, client or worker is shutting down and accepts nothing more."""


class BrokerUnavailableError(ZfabError):
    """The broker has not answered within its hold time."""


class JobError(ZfabError):
    """A job did not produce a complete result. `results` holds what did arrive."""

    def __init__(
        self, message: str, *, uuid: str = "", results: dict[str, Any] | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.uuid = uuid
        self.results: dict[str, Any] = results or {}
        self.retry_after = retry_after  # seconds the fabric suggests waiting before a retry (a full queue)


class NoWorkersError(JobError):
    """No live worker of the service matched the target."""


class BusyError(JobError):
    """The fabric is full (a queue at its bound); retry later."""


class BadRequestError(JobError):
    """The broker or a worker rejected the request (unknown task, bad arguments...)."""


class PayloadTooLargeError(BadRequestError):
    """A request or result over the message limit (ZFAB_MAX_MESSAGE_BYTES): refused before it was
    sent, or by the peer that received it. Raise the limit on every process, or send less."""


class JobTimeoutError(JobError):
    """The job did not finish before its deadline."""


class JobExpiredError(JobTimeoutError):
    """The job's deadline passed at the broker: in its queue (no worker took it in time), or with
    no answer from its worker within the deadline and a grace (then its outcome is unknown)."""


class OutcomeUnknownError(JobError):
    """Nobody can say how the job ended: it may have run (e.g. before its broker restarted) and its
    result could not be recovered. Check for its side effects before you submit it again."""


class WorkerLostError(JobError):
    """A worker running the job was lost (killed, stopped, or cut off) before it answered."""


class JobCancelledError(JobError):
    """The job was cancelled."""


class JobNotFoundError(JobError):
    """The worker does not know the job (expired from its store, or never received)."""


class ChecksumError(JobError):
    """A transferred file's checksum differs from the one its worker computed."""
