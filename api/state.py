"""What the API's lifespan owns, handed to every layer that serves a request as one `ApiState`.

Only the fabric client, settings and the fabric view are imported at run time: the job table, the
stores and the replicas' cluster are named for the type checker only, so this module sits below
every package of api/ and imports none of them (api/http/app.py builds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zfab import Client

from .fabric import FabricView
from .settings import ApiSettings

if TYPE_CHECKING:
    from .jobs.admission import TaskSchemas
    from .jobs.cluster import Cluster
    from .jobs.shares import CallerShares
    from .jobs.table import JobTable
    from .replicas.coordination import Replicas
    from .store.base import JobStore, ScheduleBackend
    from .store.persister import Persister


@dataclass(slots=True)
class ApiState:
    settings: ApiSettings
    client: Client
    jobs: JobTable
    fabric: FabricView
    schemas: TaskSchemas  # task argument schemas, from the broker
    store: JobStore | None = None  # the job table beyond memory (ZFAB_API_DB), if any
    persister: Persister | None = None
    schedules: ScheduleBackend | None = None  # where the scheduler keeps schedules (None: its own SQLite/memory)
    # PostgreSQL: the other replicas sharing the database. The job layer reaches them only through
    # `cluster` (the interface api/jobs/cluster.py defines); `replicas` is for the lifespan and /readyz.
    replicas: Replicas | None = None
    cluster: Cluster | None = None
    shares: CallerShares | None = None  # each caller's share of the jobs in flight (api/jobs/shares.py)
