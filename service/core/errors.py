"""The specific errors zfab raises. Each message says what happened and what to do.

Pure: imports nothing of ours, so every layer (core included) can raise them.
"""

from __future__ import annotations

from typing import Any


class ZfabError(Exception):
    """Base class of every zfab error: catch it to catch them all. Each message says what happened and
    what to do about it.

    Example:
        ```python
        from zfab import Client, ZfabError

        try:
            with Client(broker="tcp://127.0.0.1:5555") as client:
                client.run_job("demo", "echo", kwargs={"data": 1}, timeout=5)
        except ZfabError as exc:
            print(f"{type(exc).__name__}: {exc}")
        ```
    """


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
    """The broker has not answered within its hold time (keepalive interval × multiplier): it is down,
    or not at the endpoint the client was given. `zfab healthcheck` says whether it answers.

    Example:
        ```python
        try:
            client.run_job("demo", "echo")
        except BrokerUnavailableError:
            print("no broker at", client.broker)
        ```
    """


class JobError(ZfabError):
    """A job did not produce a complete result; its subclass says why.

    Attributes:
        uuid: the job's id.
        results: the result entries that did arrive, keyed by worker name (a job for `"all"` whose
            one worker was lost still has the others').
        retry_after: seconds the fabric suggests waiting before submitting again (a full queue), or None.

    Example:
        ```python
        try:
            results = client.run_job("demo", "sleep", kwargs={"seconds": 5}, workers="all", timeout=1)
        except JobError as exc:
            print(type(exc).__name__, exc.uuid, sorted(exc.results))
        ```
    """

    def __init__(
        self, message: str, *, uuid: str = "", results: dict[str, Any] | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.uuid = uuid
        self.results: dict[str, Any] = results or {}
        self.retry_after = retry_after  # seconds the fabric suggests waiting before a retry (a full queue)


class NoWorkersError(JobError):
    """No live worker of the service matched the target: the service is unknown (no worker of it ever
    registered), or the named workers are not alive. `zfab mmi show_workers` lists what the broker knows.

    Example:
        ```python
        try:
            client.run_job("no-such-service", "echo")
        except NoWorkersError as exc:
            print(exc)                                  # service 'no-such-service' is unknown ...
        ```
    """


class BusyError(JobError):
    """The fabric is full (a queue at its bound): nothing was lost and the job did not run; submit it
    again after `retry_after` seconds, or add workers. Over REST it is a 503 with `Retry-After`.

    Example:
        ```python
        import time

        try:
            fut = client.submit("demo", "echo")
        except BusyError as exc:
            time.sleep(exc.retry_after or 1)
            fut = client.submit("demo", "echo")
        ```
    """


class BadRequestError(JobError):
    """The broker or a worker rejected the request (unknown task, arguments the task's schema refuses,
    an answer to an input request that does not match): the message names what is wrong. Submitting
    it again unchanged gets the same answer.

    Example:
        ```python
        try:
            client.run_job("demo", "add", kwargs={"a": "one", "b": 2})
        except BadRequestError as exc:
            print(exc)                                  # names argument a and what it must be
        ```
    """


class PayloadTooLargeError(BadRequestError):
    """A request or result over the message limit (ZFAB_MAX_MESSAGE_BYTES): refused before it was
    sent, or by the peer that received it. Raise the limit on every process, or send less."""


class JobTimeoutError(JobError):
    """The job did not finish before its deadline (its `timeout`), or a task's wait ran out (no credit,
    no input). `JobExpiredError` is the broker's word for it.

    Example:
        ```python
        try:
            client.run_job("demo", "sleep", kwargs={"seconds": 10}, timeout=1)
        except JobTimeoutError as exc:
            print("too slow:", exc.uuid)
        ```
    """


class JobExpiredError(JobTimeoutError):
    """The job's deadline passed at the broker: in its queue (no worker took it in time), or with
    no answer from its worker within the deadline and a grace (then its outcome is unknown)."""


class OutcomeUnknownError(JobError):
    """Nobody can say how the job ended: it may have run (e.g. before its broker restarted) and its
    result could not be recovered. Check for its side effects before you submit it again."""


class WorkerLostError(JobError):
    """A worker running the job was lost (killed, stopped, or cut off) before it answered, so nobody
    knows whether the job ran. Submit with `retries` (target "any") to have it run again elsewhere.

    Example:
        ```python
        fut = client.submit("demo", "sleep", kwargs={"seconds": 5}, retries=1)   # survives one lost worker
        ```
    """


class JobCancelledError(JobError):
    """The job was cancelled (`Client.cancel`, `DELETE /jobs/{uuid}`); in a task, `job.check()` raises it."""


class JobNotFoundError(JobError):
    """The worker does not know the job (expired from its store, or never received)."""


class ChecksumError(JobError):
    """A transferred file's checksum differs from the one its worker computed."""
