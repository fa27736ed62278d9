"""The web console at /ui: server-rendered page shells, packaged CSS and JavaScript that read the REST API.

The shells carry no data: the pages' JavaScript reads GET /jobs, /mmi/*, /schedules and the job's event
stream with the caller's bearer token, so the console shows exactly what the API would show that caller.
"""

from .routes import router

__all__ = ["router"]
