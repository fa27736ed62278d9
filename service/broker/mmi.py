"""The broker's management interface, service `mmi.service.broker`: it reads a view, acts through a control.

Task names and reply shapes follow NorFab 0.25 where NorFab has them (`show_workers`, `get_stats`,
`get_status`, `show_broker_version`, `show_broker_inventory`); zfab adds `show_broker`,
`show_services` and `show_clients`. `sid.service.broker` (NorFab's inventory service) answers
`get_inventory` from the broker's inventory (inventory.py). Runs on the broker's owner thread.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ..core import protocol as nfp
from ..core.access import MMI_COMMANDS, Grant, scoped_broker
from ..core.errors import ProtocolError
from ..core.keepalive import Clock
from ..core.limits import read_rule
from ..settings import Settings
from . import norfab
from .control import BrokerControl
from .dispatch import MAX_NOTICES, Dispatch
from .inventory import Inventory, InventoryError
from .mmiaudit import AUDITED, MmiAuditLog
from .outbox import Outbox
from .paused import PausedServices
from .registry import Registry
from .workers import Workers

log = logging.getLogger(__name__)

SID_SERVICE = b"sid.service.broker"  # NorFab's inventory service, answered by the broker itself


class BrokerView(Protocol):
    """What MMI reads of the broker (the Broker satisfies it): its tables, read and never written
    through, and its own figures. What MMI may change goes through a BrokerControl (control.py)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def dispatch(self) -> Dispatch: ...
    @property
    def workers(self) -> Workers: ...
    @property
    def paused(self) -> PausedServices: ...
    @property
    def inventory(self) -> Inventory | None: ...
    @property
    def clock(self) -> Clock: ...

    def figures(self) -> dict[str, Any]:
        """The broker's own figures (show_broker's: endpoint, uptime, boot, loop, memory, tables...)."""
        ...


def scoped(grant: Grant | None, task: str, answer: Any) -> Any:
    """An MMI read as a scoped key sees it: the rows of services in its scope (workers, services, limits),
    a service's tasks only in it. Unscoped keys and no CURVE: the answer as it is."""
    if grant is None or grant.everywhere:
        return answer
    if isinstance(answer, list):
        return [r for r in answer if not isinstance(r, dict) or grant.sees(str(r.get("service", "")))]
    if task == "show_tasks" and isinstance(answer, dict) and not grant.sees(str(answer.get("service", ""))):
        return None
    return scoped_broker(grant, answer) if task == "show_broker" and isinstance(answer, dict) else answer


class MmiService:
    def __init__(self, view: BrokerView, control: BrokerControl, out: Outbox) -> None:
        self.view = view
        self.out = out
        self.controls = control
        self.audit = MmiAuditLog()  # the state-changing commands, by any key (mmiaudit.py)

    def serve(self, sender: bytes, req: nfp.ClientRequest) -> ProtocolError | None:
        """Answer an MMI request (its malformed body answered 400, and returned to be counted)."""
        error = None
        try:
            status, answer = self.answer(req.body, req.service)
        except ProtocolError as exc:
            error, status, answer = exc, nfp.ST_BAD_REQUEST, nfp.dumps({"errors": [exc.detail]})
        self.controls.count("mmi")
        # NorFab's broker answers MMI twice, as RESPONSE and as MMI; its clients read either
        # (NFPClient.mmi() only the MMI copy), refusals included.
        for cmd in (nfp.RESPONSE, nfp.MMI):
            self.out.send(nfp.broker_reply(sender, cmd, req.service, req.uuid, status, answer))
        return error

    def answer(self, body: nfp.Frame, service: bytes = nfp.MMI_SERVICE) -> tuple[bytes, bytes]:
        """(status, JSON payload) for an MMI request body to `mmi.service.broker` or
        `sid.service.broker`; ProtocolError("json", why) when it is malformed."""
        task, kwargs = self._request(body)
        status, answer = self._answer(task, kwargs, service)
        if task in AUDITED and service != SID_SERVICE:  # a change, or a refused one: who, what, the outcome
            self.audit.record(self.view.workers.ids.grant(), task, kwargs, status)
            self.controls.count("mmi_audited")
        return status, answer

    def _answer(self, task: str, kwargs: dict[str, Any], service: bytes) -> tuple[bytes, bytes]:
        if service == SID_SERVICE:
            return self.inventory_answer(task, kwargs)  # a worker's own inventory: any key may ask
        ids = self.view.workers.ids
        if ids.zap is not None and task in MMI_COMMANDS:
            name = kwargs.get("service")
            named = name.encode() if task in self.CONTROLS and isinstance(name, str) else None
            why = ids.refusal(MMI_COMMANDS[task], named)
            if why is not None:
                self.controls.count("mmi_refused_by_key")
                return nfp.ST_BAD_REQUEST, nfp.dumps({"error": "forbidden", "detail": f"forbidden: {why}"})
        if task in self.CONTROLS:
            return self.control(task, kwargs)
        if task == "show_audit":
            try:
                return nfp.ST_OK, nfp.dumps(self.audit.page(kwargs, ids.grant()))
            except ValueError as exc:
                return nfp.ST_BAD_REQUEST, nfp.dumps({"error": "bad-request", "detail": str(exc)})
        if task not in self.TASKS:
            return nfp.ST_BAD_REQUEST, nfp.dumps(f"Unsupported task '{task}'")
        return nfp.ST_OK, nfp.dumps(scoped(ids.grant(), task, self.run(task, kwargs)))

    @staticmethod
    def _request(body: nfp.Frame) -> tuple[str, dict[str, Any]]:
        try:
            req = nfp.loads(body) if body else {}
            if not isinstance(req, dict):
                raise ValueError("body must be a JSON object")
            task = str(req.get("task", ""))
            kwargs = req.get("kwargs") or {}
            if not isinstance(kwargs, dict):
                raise ValueError("kwargs must be a JSON object")
        except (ValueError, RecursionError) as exc:
            raise ProtocolError("json", f"MMI request: {exc}") from None
        return task, kwargs

    def inventory_answer(self, task: str, kwargs: dict[str, Any]) -> tuple[bytes, bytes]:
        """`sid.service.broker` `get_inventory` {"name"}: the worker's inventory, or null (200) when the
        broker has none for it, as NorFab's broker answers (the worker then runs on an empty one)."""
        if task != "get_inventory":
            return nfp.ST_BAD_REQUEST, nfp.dumps(f"Unsupported task '{task}'")
        name = kwargs.get("name")
        inv = self.view.inventory
        if not isinstance(name, str) or inv is None:
            return nfp.ST_OK, nfp.dumps(None)
        try:
            data = inv.worker(name)
        except InventoryError as exc:
            self.controls.count("inventory_errors")
            log.error("inventory of worker %r cannot be read: %s", name[:64], exc)
            return nfp.ST_OK, nfp.dumps(None)
        self.controls.count("inventory_served")
        return nfp.ST_OK, nfp.dumps(data)

    CONTROLS = ("pause_service", "resume_service", "set_limit", "clear_limit")

    def control(self, task: str, kwargs: dict[str, Any]) -> tuple[bytes, bytes]:
        """pause_service / resume_service {"service": name}: (status, JSON payload). A paused
        service's jobs are admitted and queued, and none is sent until it resumes (paused.py)."""
        b = self.view
        name = kwargs.get("service")
        raw = name.encode() if isinstance(name, str) else b""
        if not raw or len(raw) > nfp.MAX_NAME_BYTES:
            why = f"{task} needs kwargs {{'service': name}} with a service name of 1..{nfp.MAX_NAME_BYTES} bytes"
            return nfp.ST_BAD_REQUEST, nfp.dumps({"error": "bad-request", "detail": why})
        if raw not in b.registry.services and raw not in b.paused:
            why = f"service {name!r} is unknown: no worker has registered it with this broker"
            return nfp.ST_NOT_FOUND, nfp.dumps({"error": "unknown-service", "detail": why})
        if task in ("set_limit", "clear_limit"):
            return self.limit(task, raw, kwargs)
        try:
            changed = self.controls.pause(raw) if task == "pause_service" else self.controls.resume(raw)
        except ValueError as exc:
            return nfp.ST_BAD_REQUEST, nfp.dumps({"error": "bad-request", "detail": str(exc)})
        self.controls.count(task)
        svc = b.registry.services.get(raw)
        depth = svc.queue.depth if svc is not None else 0
        return nfp.ST_OK, nfp.dumps(
            {"service": name, "paused": raw in b.paused, "changed": changed, "queue_depth": depth}
        )

    TASKS = (
        "show_workers",
        "show_broker",
        "show_services",
        "show_tasks",
        "show_limits",
        "show_clients",
        "get_status",
        "get_stats",
        "show_broker_version",
        "show_broker_inventory",
        "show_audit",  # answered by _answer (its page or a 400), before run()
    )

    def run(self, task: str, kwargs: dict[str, Any]) -> Any:
        if task == "show_workers":
            return self.show_workers(kwargs.get("service"), kwargs.get("status"), bool(kwargs.get("gone")))
        if task == "show_broker":
            return self.show_broker()
        if task == "show_services":
            return self.show_services()
        if task == "show_tasks":
            return self.show_tasks(str(kwargs.get("service", "")))
        if task == "show_clients":
            return self.show_clients()
        if task == "show_limits":
            return self.show_limits()
        if task == "get_status":
            return self.get_status()
        if task == "show_broker_version":
            return norfab.broker_versions()
        if task == "get_stats":
            return norfab.get_stats(self.view)
        if task == "show_broker_inventory":
            inv = self.view.inventory
            return inv.as_dict() if inv is not None else {}
        raise ValueError(f"unsupported MMI task '{task}'")

    def show_workers(
        self, service: str | None = None, status: str | None = None, gone: bool = False
    ) -> list[dict[str, Any]]:
        """Registered workers; with `gone`, also those that left lately (state "gone", for metrics)."""
        out = []
        for w in self.view.registry.workers.values():
            ka = w.keepalive
            alive = ka.is_alive()
            out.append(
                {
                    # NorFab's row first, its figures as strings: NorFab's own tests read "holdtime"
                    # (test_mmi_show_workers) and nfcli's `show workers` prints the row as it comes...
                    "name": w.label,
                    "service": w.service.decode(errors="replace"),
                    "status": "alive" if alive else "dead",
                    "holdtime": str(round(ka.hold_time_left(), 1)),
                    "keepalives tx/rx": f"{ka.sent} / {ka.received}",
                    "alive (s)": str(round(ka.alive_for())),
                    # ...then zfab's typed figures, which its metrics and the API read.
                    "alive": alive,
                    "holdtime_left_s": round(ka.hold_time_left(), 3),
                    "keepalives_sent": ka.sent,
                    "keepalives_received": ka.received,
                    "alive_for_s": round(ka.alive_for(), 3),
                    "jobs_in_flight": len(w.inflight),
                    "jobs_dispatched": w.jobs_dispatched,
                    "credits": w.credits,
                    "credits_free": max(0, w.free),
                    "jobs_waiting_for_it": len(w.directed),
                    "draining": w.draining,
                    "reported": w.stats,
                }
            )
        if gone:
            now = self.view.clock()
            for name, info in self.view.workers.gone.items():
                out.append(
                    {
                        "name": name.decode(errors="replace"),
                        "service": info["service"].decode(errors="replace"),
                        "status": "gone",
                        "alive": False,
                        "gone_for_s": round(now - info["at"], 3),
                        "why": info["why"],
                        "jobs_in_flight": 0,
                        "credits": 0,
                        "holdtime_left_s": 0.0,
                    }
                )
        if service and service != "all":
            out = [w for w in out if w["service"] == service]
        if status in ("alive", "dead", "gone"):
            out = [w for w in out if w["status"] == status]
        return out

    def show_services(self) -> list[dict[str, Any]]:
        b = self.view
        now = b.clock()
        out = []
        limited = b.dispatch.limits.facts()
        for s in b.registry.services.values():
            q = s.queue
            h = s.queued_seconds
            out.append(
                {
                    "service": s.label,
                    "workers": len(s.workers),
                    "alive": sum(1 for w in s.workers.values() if w.keepalive.is_alive()),
                    "jobs_in_flight": sum(len(w.inflight) for w in s.workers.values()),
                    "credits": sum(w.credits for w in s.workers.values()),
                    "purged": s.purged,
                    "queue_depth": q.depth,
                    "queue_capacity": b.settings.service_queue_size,
                    "queue_bytes": q.bytes,
                    "queue_oldest_age_s": round(q.oldest_age(now), 3),
                    "queue_delayed": len(q.delayed),
                    "queue_parked": len(q.parked),
                    "jobs_dispatched": s.dispatched,
                    "expired_in_queue": s.expired_queue,
                    "expired_in_flight": s.expired_worker,
                    "queued_seconds": h.snapshot() if h is not None else None,
                    "tasks": sorted(s.tasks) if s.tasks is not None else None,
                    "tentative": s.tentative,
                    "paused": s.name in b.paused,
                    # jobs running and waiting on each limited task's rate or concurrency limit
                    "limits": {
                        task: {"running": row["running"], "held": row["held"]}
                        for (svc_name, task), row in limited.items()
                        if svc_name == s.name
                    },
                }
            )
        return out

    def limit(self, task: str, service: bytes, kwargs: dict[str, Any]) -> tuple[bytes, bytes]:
        """set_limit {service, task_name, rate_limit, concurrency, limit_key} / clear_limit {service, task_name}:
        a task's limit set at run time (it replaces the declaration until cleared; limits.py)."""
        svc = self.view.registry.services.get(service)
        name = kwargs.get("task_name")  # not "task": that names the MMI request itself
        tasks = svc.tasks if svc is not None else None
        if not isinstance(name, str) or tasks is None or name not in tasks:
            known = ", ".join(sorted(tasks or {})) or "none announced"
            why = f"{task} needs the name of a task its workers announced in kwargs 'task_name' (its tasks: {known})"
            return nfp.ST_NOT_FOUND, nfp.dumps({"error": "unknown-task", "detail": why})
        if task == "clear_limit":
            changed = self.controls.clear_limit(service, name)
        else:
            try:
                rule = read_rule({k: kwargs.get(k) for k in ("rate_limit", "concurrency", "limit_key")})
                schema = tasks[name] if isinstance(tasks[name], dict) else {}
                if rule is not None and rule.key is not None and rule.key not in (schema.get("properties") or {}):
                    raise ValueError(f"limit_key {rule.key!r} is not an argument of task {name!r}")
            except ValueError as exc:
                return nfp.ST_BAD_REQUEST, nfp.dumps({"error": "bad-request", "detail": str(exc)})
            self.controls.set_limit(service, name, rule)
            changed = True
        self.controls.count(task)
        return nfp.ST_OK, nfp.dumps(
            {"service": service.decode(), "task": name, "changed": changed, **self._limit_of(service, name)}
        )

    def _limit_of(self, service: bytes, task: str) -> dict[str, Any]:
        d = self.view.dispatch
        svc = self.view.registry.services.get(service)
        rule = d.limits.rule(service, task, svc.tasks if svc is not None else None)
        row = d.limits.facts().get((service, task), {})
        return {
            **(rule.as_dict() if rule is not None else {"rate_limit": None, "concurrency": None, "limit_key": None}),
            "source": row.get("source", "declared"),
            "running": row.get("running", 0),
            "held": row.get("held", 0),
        }

    def show_limits(self) -> list[dict[str, Any]]:
        """Every limited task: its rule and where it comes from, jobs running and waiting on it."""
        b = self.view
        rows = []
        facts = b.dispatch.limits.facts()
        names = set(facts)
        for svc in b.registry.services.values():
            for task in svc.tasks or {}:
                if b.dispatch.limits.rule(svc.name, task, svc.tasks) is not None:
                    names.add((svc.name, task))
        for service, task in sorted(names):
            rows.append({"service": service.decode(errors="replace"), "task": task, **self._limit_of(service, task)})
        return rows

    def show_tasks(self, service: str) -> dict[str, Any] | None:
        """The tasks a service's workers announced, with the JSON schema of their arguments (None:
        the service is unknown or its workers announce none, as NorFab's do)."""
        svc = self.view.registry.services.get(service.encode())
        if svc is None or svc.tasks is None:
            return None
        return {"service": svc.label, "tasks": svc.tasks}

    def show_clients(self) -> list[dict[str, Any]]:
        reg = self.view.registry
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
        b = self.view
        reg = b.registry
        s = b.settings
        d = b.dispatch
        return {
            **b.figures(),
            "version": norfab.version("zfab"),
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
            "unknown_workers_remembered": len(b.workers.told_to_leave),
            "unknown_workers_capacity": b.workers.TOLD_TO_LEAVE_MAX,
            "gone_workers_remembered": len(b.workers.gone),
            "gone_workers_capacity": b.workers.GONE_MAX,
            "client_keepalives": len(reg.client_keepalives),
            "client_keepalives_capacity": reg.max_clients,
            "queued_notices": len(d.notices),
            "queued_notices_capacity": MAX_NOTICES,
            "limit_buckets": len(d.limits.buckets),
            "limit_buckets_capacity": d.limits.max_buckets,
            "services_capacity": reg.max_services,
            "jobs_queued": len(d.queued),
            "queue_bytes": d.queued_bytes,
            "dispatched_bytes": reg.held_bytes,
            "queue_bytes_capacity": s.broker_queue_bytes,
            "service_queue_capacity": s.service_queue_size,
            "max_inflight_per_worker": reg.max_inflight_per_worker,
            "workers_purged": {svc.label: svc.purged for svc in reg.services.values() if svc.purged},
            "paused_services": b.paused.labels(),
            "paused_services_capacity": b.paused.capacity,
            "paused_write_errors": b.paused.write_errors,
            **self.audit.figures(),
            "mmi_audit_evicted": self.audit.evicted,
        }

    def get_status(self) -> dict[str, Any]:
        endpoint = self.view.figures()["endpoint"]
        return {"name": "broker", "endpoint": endpoint, "security": "NULL", "status": "running"}
