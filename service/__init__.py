"""zfab: a job fabric on ZeroMQ that speaks NorFab's NFP.

from zfab import Client
with Client(broker="tcp://127.0.0.1:5555") as c:
    print(c.run_job("demo", "echo", kwargs={"data": "hi"}))
"""

from . import errors
from .broker.broker import Broker
from .client.client import Client
from .client.filestream import FileStream
from .client.future import JobFuture, decoded_size
from .client.subscriber import Subscriber, SubscriptionError
from .core.ids import new_uuid as new_job_uuid
from .core.lru import BoundedLRU
from .core.payloads import MAX_JOB_UUID, interrupted, job_deadline, timeout_left
from .core.protocol import MAX_NAME_BYTES
from .core.retries import Backoff
from .core.schemacheck import check_arguments
from .core.states import DEAD_ENDS, JobState, State, final_state
from .core.tuning import tune as tune_process
from .errors import *  # noqa: F403 - every error class is part of the face
from .settings import Settings
from .transport.aioloop import AioTransport, wait_future
from .worker.job import Job
from .worker.task import task
from .worker.worker import Worker

__all__ = [
    "MAX_JOB_UUID",
    "MAX_NAME_BYTES",
    "DEAD_ENDS",
    "AioTransport",
    "Backoff",
    "BoundedLRU",
    "Broker",
    "Client",
    "FileStream",
    "Job",
    "JobFuture",
    "JobState",
    "Settings",
    "State",
    "Subscriber",
    "SubscriptionError",
    "Worker",
    "check_arguments",
    "decoded_size",
    "final_state",
    "interrupted",
    "job_deadline",
    "new_job_uuid",
    "task",
    "timeout_left",
    "tune_process",
    "wait_future",
    *errors.__all__,
]
