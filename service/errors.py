"""The specific errors zfab raises (defined in `service.core.errors`, so pure code can raise them too)."""

from .core.errors import (
    BackpressureError,
    BadRequestError,
    BrokerUnavailableError,
    BusyError,
    ChecksumError,
    ClosedError,
    JobCancelledError,
    JobError,
    JobNotFoundError,
    JobTimeoutError,
    NoWorkersError,
    ProtocolError,
    SecurityError,
    WorkerLostError,
    ZfabError,
)

__all__ = [
    "BackpressureError",
    "BadRequestError",
    "BrokerUnavailableError",
    "BusyError",
    "ChecksumError",
    "ClosedError",
    "JobCancelledError",
    "JobError",
    "JobNotFoundError",
    "JobTimeoutError",
    "NoWorkersError",
    "ProtocolError",
    "SecurityError",
    "WorkerLostError",
    "ZfabError",
]
