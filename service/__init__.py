"""zfab: a job fabric on ZeroMQ that speaks NorFab's NFP.

from service import Client
with Client(broker="tcp://127.0.0.1:5555") as c:
    print(c.run_job("demo", "echo", kwargs={"data": "hi"}))
"""

from .broker.broker import Broker
from .client.client import Client
from .client.clientjob import JobFuture
from .errors import (
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
    WorkerLostError,
    ZfabError,
)
from .settings import Settings
from .worker.job import Job
from .worker.task import task
from .worker.worker import Worker

__all__ = [
    "BackpressureError",
    "BadRequestError",
    "Broker",
    "BrokerUnavailableError",
    "BusyError",
    "ChecksumError",
    "Client",
    "ClosedError",
    "Job",
    "JobCancelledError",
    "JobError",
    "JobFuture",
    "JobNotFoundError",
    "JobTimeoutError",
    "NoWorkersError",
    "Settings",
    "Worker",
    "WorkerLostError",
    "ZfabError",
    "task",
]
