"""The worker role: `Worker` (admission on the owner loop, GET/DELETE/PUT), `@task` and argument
validation, the runner and its bounded pool (jobs never run on the owner loop), `Job` (what task
code talks back through), and the durable job store (SQLite, one writer thread, group commit)."""

from .job import Job
from .task import task
from .worker import Worker

__all__ = ["Job", "Worker", "task"]
