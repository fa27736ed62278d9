"""What the broker answers NorFab's tools as NorFab's broker does: its stats (nfcli's `show broker`,
NorFab's monitoring) and the versions it reports (docs/protocol.md, NorFab peers). Read-only, from
MMI's view of the broker (mmi.py)."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .mmi import BrokerView

# The versions NorFab's broker reports. NorFab's tools and tests read "norfab" and expect a version:
# the installed NorFab's, else the NorFab release whose NFP this broker speaks (docs/protocol.md).
NORFAB_VERSION_KEYS = ("norfab", "pyyaml", "pyzmq", "psutil", "pydantic", "tornado", "jinja2")
NFP_OF_NORFAB = "0.25.0"


def version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return ""


def get_stats(b: BrokerView) -> dict[str, Any]:
    """NorFab's `get_stats` (its BrokerMonitoringStats, schema 1.0): the process, its messages
    and each worker's keepalives, which nfcli and NorFab's monitoring read."""
    f = b.figures()
    uptime = max(1e-9, f["uptime_s"])
    t = os.times()
    try:
        fds: int | None = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = None
    rss = f.get("rss_bytes") or 0
    workers = [
        {
            "name": w.label,
            "service": w.service.decode(errors="replace"),
            "status": "alive" if w.keepalive.is_alive() else "dead",
            "holdtime_seconds": round(w.keepalive.hold_time_left(), 3),
            "uptime_seconds": int(w.keepalive.alive_for()),
            "keepalives_sent": w.keepalive.sent,
            "keepalives_received": w.keepalive.received,
        }
        for w in b.registry.workers.values()
    ]
    return {
        "schema_version": "1.0",
        "collected_at": datetime.now(UTC).isoformat(),
        "name": "zfab-broker",
        "role": "broker",
        "status": "active",
        "process": {
            "cpu_percent": round(100.0 * (t.user + t.system) / uptime, 2),  # the average since start
            "memory_rss_mbyte": round(rss / 2**20, 3),
            "uptime_seconds": int(uptime),
            "open_file_descriptors": fds,
            "tcp_sockets": None,
            "threads": threading.active_count(),
        },
        "messaging": {
            "sent": f["frames_sent"],
            "received": f["frames_received"],
            "events_received": 0,
            "send_failures": f["frames_send_dropped"],
            "receive_failures": sum(f["frames_rejected"].values()),
        },
        "endpoint": f["endpoint"],
        "worker_count": len(b.registry.workers),
        "service_count": len(b.registry.services),
        "keepalive_interval_ms": int(b.settings.keepalive_interval * 1000),
        "keepalive_multiplier": b.settings.keepalive_multiplier,
        "workers": workers,
    }


def broker_versions() -> dict[str, str]:
    names = ("zfab", *NORFAB_VERSION_KEYS, "fastapi", "prometheus-client")
    out = {pkg: version(pkg) for pkg in dict.fromkeys(names)}
    out["norfab"] = out["norfab"] or NFP_OF_NORFAB
    out["python"] = sys.version.split(" ")[0]
    out["platform"] = sys.platform
    return out
