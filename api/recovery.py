"""After an API restart: jobs the database knows as unfinished are answered by their workers (GET)."""

from __future__ import annotations

import logging
import time

from service.errors import ZfabError

from .fabric import mmi
from .jobtable import JobRecord
from .state import ApiState

log = logging.getLogger(__name__)

# A recovery waits for the job's own deadline, and at least this long (the job may have ended
# long ago: its workers then answer the first GET at once).
RECOVER_MIN = 10.0
RECOVER_GRACE = 5.0


async def _service_workers(st: ApiState, service: str) -> list[str]:
    """The live workers of a service: who may hold a job whose worker the database never learnt."""
    try:
        found = await mmi(st.client, "show_workers", service=service, status="alive")
    except (ZfabError, TimeoutError) as exc:
        log.info("api: cannot list the workers of %s for a recovery: %s", service, exc)
        return []
    return sorted(str(w["name"]) for w in found if isinstance(w, dict) and w.get("service") == service)


async def ensure_live(st: ApiState, rec: JobRecord) -> None:
    """Start recovering a job known only from the database as unfinished; no-op otherwise.

    The recovery's future then answers the job like a submitted one. One that could try
    nothing (no broker, no workers yet) leaves the job as stored, and the next read retries.
    """
    if rec.live is not None or rec.stored is None or rec.stored.state.finished:
        return
    workers = rec.dispatched() or await _service_workers(st, rec.service)
    if not workers or rec.live is not None:  # nobody to ask, or a concurrent read started it
        return
    left = rec.stored.submitted_at.timestamp() + rec.timeout - time.time()
    try:
        fut = st.client.recover(rec.service, rec.uuid, workers, timeout=max(RECOVER_MIN, left + RECOVER_GRACE))
    except (ZfabError, ValueError) as exc:
        log.info("api: cannot recover job %s yet: %s", rec.uuid, exc)
        return
    rec.future = fut
    st.jobs.watch(fut)
    log.info("api: recovering job %s from %s", rec.uuid, ", ".join(workers))
