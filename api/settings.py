"""Settings of the HTTP control plane: the fabric's settings plus the API's own, from `ZFAB_*`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PrivateAttr

from zfab.settings import Settings


class ApiSettings(Settings):
    """Each field is also the environment variable ZFAB_<FIELD> (upper case)."""

    api_host: str = Field("127.0.0.1", description="Address the HTTP API binds")
    api_port: int = Field(8000, ge=0, le=65535, description="Port of the HTTP API")
    api_tokens: str = Field(
        "",
        description="Comma-separated bearer tokens, each an admin (other roles: ZFAB_ACCESS_FILE); none and no "
        "access file = no auth, loopback clients only",
        repr=False,
    )
    api_hosts: str = Field(
        "localhost",
        description="Comma-separated host names the API answers to (its Host header), beside any IP address: "
        "a name, `.example.com` for a domain and its subdomains, `*` for any. Other names get a 400, so a page "
        "whose name is re-pointed at the API (DNS rebinding) reads and changes nothing",
    )
    api_origins: str = Field(
        "",
        description="Comma-separated origins (`https://ui.example.com`) besides the API's own whose pages may "
        "send it state-changing requests; a browser's POST, PUT, PATCH or DELETE from any other is a 403",
    )
    api_access_log: bool = Field(False, description="Log one line per HTTP request (costly under load)")
    job_history: int = Field(10_000, ge=1, description="Recent jobs the API remembers for GET /jobs")
    job_history_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Bytes of finished jobs' results and events the API keeps in memory (the rest: its database)",
    )
    api_expose_tracebacks: bool = Field(
        False, description="Show tasks' tracebacks in REST results (else the error's type and message only)"
    )
    api_traceback_tokens: str = Field(
        "",
        description="Comma-separated tokens (of ZFAB_API_TOKENS) whose callers see tasks' tracebacks in REST "
        "results and the console, when ZFAB_API_EXPOSE_TRACEBACKS is off",
        repr=False,
    )
    # The principals (api/http/auth.py) of api_traceback_tokens: set by create_app, which drops the tokens.
    _traceback_principals: frozenset[str] = PrivateAttr(default_factory=frozenset)
    mmi_cache_seconds: float = Field(1.0, ge=0, description="How long /metrics reuses the broker's MMI answers")
    default_wait_max: float = Field(60, ge=0, description="Upper bound of ?wait= / Prefer: wait=N, in seconds")
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest accepted POST /jobs body")
    api_db: str | None = Field(
        None,
        description="Where the job table and schedules live: a SQLite file (`zfab api` uses "
        "<data_dir>/api/jobs.sqlite when unset), or a postgresql://user:pass@host:port/db URL that several "
        "API replicas share; empty = memory only",
        repr=False,  # a URL may carry a password
    )
    api_db_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1024 * 1024,
        description="PostgreSQL: bytes of jobs (rows and their events) the shared database keeps; the oldest go first",
    )
    api_replica_timeout: float = Field(
        10.0,
        ge=1.0,
        le=3600,
        description="PostgreSQL: seconds without a heartbeat before a replica is gone and its unfinished jobs "
        "are adopted by another",
    )
    sse_ping_seconds: float = Field(15.0, gt=0, le=3600, description="Keep-alive comment interval of idle SSE streams")
    api_events_buffer: int = Field(
        10_000, ge=1, description="Broker events the API holds for GET /events (and Last-Event-ID resumes)"
    )
    api_events_buffer_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Bytes of broker events the API holds for GET /events"
    )
    api_event_streams: int = Field(100, ge=1, description="GET /events streams open at once (503 beyond)")
    api_caller_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of the jobs in flight (ZFAB_MAX_CLIENT_JOBS) and of their bytes "
        "(ZFAB_CLIENT_INFLIGHT_BYTES) "
        "one caller (a token; anonymous callers are one) may hold; its next job is a 429 naming the bound",
    )
    api_audit_count: int = Field(
        10_000, ge=1, description="Entries of the audit log the API keeps (state-changing calls; GET /audit)"
    )
    api_audit_days: float = Field(30.0, gt=0, description="Days the API keeps an audit log entry")
    max_schedules: int = Field(1000, ge=1, description="Most periodic schedules the API keeps (POST /schedules)")

    def default_api_db(self) -> str:
        return str(Path(self.data_dir).expanduser() / "api" / "jobs.sqlite")

    def host_list(self) -> list[str]:
        return [h.strip() for h in self.api_hosts.split(",") if h.strip()]

    def origin_list(self) -> list[str]:
        return [o.strip() for o in self.api_origins.split(",") if o.strip()]

    def token_list(self) -> list[str]:
        return [t.strip() for t in self.api_tokens.split(",") if t.strip()]

    def traceback_token_list(self) -> list[str]:
        return [t.strip() for t in self.api_traceback_tokens.split(",") if t.strip()]

    def tracebacks_for(self, principal: str) -> bool:
        """May this caller read tasks' tracebacks? Everyone with ZFAB_API_EXPOSE_TRACEBACKS; else the
        callers of ZFAB_API_TRACEBACK_TOKENS (their principals, set by create_app). Anyone else gets the
        error's type and message: a traceback names server paths and values."""
        # Read past pydantic's __getattr__ (3.5 us a call, on every job's answer): the private dict itself.
        return self.api_expose_tracebacks or principal in (self.__pydantic_private__ or {})["_traceback_principals"]
