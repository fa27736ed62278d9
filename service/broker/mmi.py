"""The broker's management interface, service `mmi.service.broker`.

Task names and reply shapes follow NorFab 0.25 where NorFab has them (`show_workers`,
`get_status`, `show_broker_version`); zfab adds `show_broker`, `show_services` and
`show_clients`. Runs on the broker's owner thread.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from collections import Counter, OrderedDict
from typing import Any, Protocol

from ..core import protocol as nfp
from ..core.errors import ProtocolError
from ..settings import Settings
from ..transport.base import Transport
from .registry import Registry


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return ""


class BrokerFacts(Protocol):
    """The narrow view of the broker that MMI answers from (the Broker satisfies it)."""

    settings: Settings
    registry: Registry
    loop: Transport
    bound_endpoint: str
    started_at: float
    rejected: Counter[str]
    counts: Counter[str]
    purged: Counter[str]
    told_to_leave: OrderedDict[bytes, float]
    TOLD_TO_LEAVE_MAX: int


class MmiService:
    def __init__(self, broker: BrokerFacts) -> None:
        self.broker = broker

    def answer(self, body: bytes) -> tuple[bytes, bytes]:
        """(status, JSON payload) for an MMI request body; ProtocolError("json", why) when it is malformed."""
        try:
            req = json.loads(body) if body else {}
            if not isinstance(req, dict):
                raise ValueError("body must be a JSON object")
            task = str(req.get("task", ""))
            kwargs = req.get("kwargs") or {}
            if not isinstance(kwargs, dict):
                raise ValueError("kwargs must be a JSON object")
        except (ValueError, RecursionError) as exc:
            raise ProtocolError("json", f"MMI request: {exc}") from None
        if task not in self.TASKS:
            return nfp.ST_BAD_REQUEST, nfp.dumps(f"Unsupported task '{task}'")
        return nfp.ST_OK, nfp.dumps(self.run(task, kwargs))

    TASKS = ("show_workers", "show_broker", "show_services", "show_clients", "get_status", "show_broker_version")

    def run(self, task: str, kwargs: dict[str, Any]) -> Any:
        if task == "show_workers":
            return self.show_workers(kwargs.get("service"), kwargs.get("status"))
        if task == "show_broker":
            return self.show_broker()
        if task == "show_services":
            return self.show_services()
        if task == "show_clients":
            return self.show_clients()
        if task == "get_status":
            return self.get_status()
        if task == "show_broker_version":
            return self.show_broker_version()
        raise ValueError(f"unsupported MMI task '{task}'")

    def show_workers(self, service: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        out = []
        for w in self.broker.registry.workers.values():
            ka = w.keepalive
            alive = ka.is_alive()
            out.append(
                {
                    # NorFab's keys and string formats first...
                    "name": w.label,
                    "service": w.service.decode(errors="replace"),
                    "status": "alive" if alive else "dead",
                    "holdtime": str(round(ka.hold_time_left(), 1)),
                    "keepalives tx/rx": f"{ka.sent} / {ka.received}",
                    "alive (s)": str(round(ka.alive_for())),
                    # ...then zfab's typed figures.
                    "alive": alive,
                    "holdtime_left_s": round(ka.hold_time_left(), 3),
                    "keepalives_sent": ka.sent,
                    "keepalives_received": ka.received,
                    "alive_for_s": round(ka.alive_for(), 3),
                    "jobs_in_flight": len(w.inflight),
                    "jobs_dispatched": w.jobs_dispatched,
                    "reported": w.stats,
                }
            )
        if service and service != "all":
            out = [w for w in out if w["service"] == service]
        if status in ("alive", "dead"):
            out = [w for w in out if w["status"] == status]
        return out

    def show_services(self) -> list[dict[str, Any]]:
        reg = self.broker.registry
        return [
            {
                "service": s.name.decode(errors="replace"),
                "workers": len(s.workers),
                "alive": sum(1 for w in s.workers.values() if w.keepalive.is_alive()),
                "jobs_in_flight": sum(len(w.inflight) for w in s.workers.values()),
                "purged": self.broker.purged[s.name.decode(errors="replace")],
            }
            for s in reg.services.values()
        ]

    def show_clients(self) -> list[dict[str, Any]]:
        reg = self.broker.registry
        per_client = reg.inflight_by_client()
        now = time.time()
        return [
            {
                "name": c.identity.decode(errors="replace"),
                "idle_s": round(now - c.last_seen, 3),
                "requests": c.requests,
                "jobs_in_flight": per_client.get(c.identity, 0),
            }
            for c in reversed(reg.clients.values())
        ][:1000]

    def show_broker(self) -> dict[str, Any]:
        b = self.broker
        reg = b.registry
        s = b.settings
        st = b.loop.stats
        return {
            "endpoint": b.bound_endpoint,
            "version": _version("zfab"),
            "uptime_s": round(time.time() - b.started_at, 3),
            "keepalive_interval_s": s.keepalive_interval,
            "keepalive_multiplier": s.keepalive_multiplier,
            "workers": len(reg.workers),
            "services": len(reg.services),
            "clients": len(reg.clients),
            "clients_capacity": reg.max_clients,
            "jobs_in_flight": len(reg.routes),
            "jobs_in_flight_capacity": reg.max_routes,
            "jobs_finished_remembered": len(reg.finished),
            "jobs_finished_capacity": reg.max_finished,
            "unknown_workers_remembered": len(b.told_to_leave),
            "unknown_workers_capacity": b.TOLD_TO_LEAVE_MAX,
            "max_inflight_per_worker": reg.max_inflight_per_worker,
            "outbound_queue_depth": b.loop.queue_depth(),
            "outbound_queue_capacity": b.loop.outbound_size,
            "frames_received": st.received,
            "frames_sent": st.sent,
            "frames_send_dropped": st.send_dropped,
            "handler_errors": st.handler_errors,
            "frames_rejected": dict(b.rejected),
            "counts": dict(b.counts),
            "workers_purged": dict(b.purged),
        }

    def get_status(self) -> dict[str, Any]:
        b = self.broker
        return {"name": "broker", "endpoint": b.bound_endpoint, "security": "NULL", "status": "running"}

    def show_broker_version(self) -> dict[str, str]:
        out = {pkg: _version(pkg) for pkg in ("zfab", "pyzmq", "pydantic", "fastapi", "prometheus-client")}
        out["python"] = sys.version.split(" ")[0]
        out["platform"] = sys.platform
        return out
