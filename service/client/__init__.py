"""The client role: `Client` submits jobs and collects results over its DEALER; it holds a `Session`
(its owner-loop side), which feeds each job's `ClientJob` (pure state) the broker's replies and settles
its `JobFuture`; `filestream` and `interaction` are file downloads under a credit window, event streams
and input answers."""

from .client import Client
from .filestream import FileStream
from .future import JobFuture

__all__ = ["Client", "FileStream", "JobFuture"]
