"""The client role: `Client` submits jobs and collects results over its DEALER; `clientjob` is the
pure state of one job fed with the broker's replies; `filestream` and `interaction` are file
downloads under a credit window, event streams and input answers."""

from .client import Client
from .clientjob import JobFuture
from .filestream import FileStream

__all__ = ["Client", "FileStream", "JobFuture"]
