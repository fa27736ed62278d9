"""`zfab audit`: the API's audit log (GET /audit, admins) from the command line, newest first."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from .jobs import add_api_flags, client_of, guarded, table


def when(at: Any) -> str:
    """An entry's epoch seconds as `YYYY-MM-DD HH:MM:SS` UTC."""
    try:
        return datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError):
        return "-"


def cmd_audit(ns: argparse.Namespace) -> int:
    query: dict[str, Any] = {"limit": ns.limit}
    for key in ("actor", "action", "since"):
        if getattr(ns, key) is not None:
            query[key] = getattr(ns, key)
    page = client_of(ns).call("GET", "/audit", query=query)
    items = page.get("items", []) if isinstance(page, dict) else []
    if ns.json:
        print(json.dumps(items, indent=2))
        return 0
    rows = [["WHEN", "WHO", "ROLE", "ACTION", "TARGET", "FROM", "OUTCOME"]]
    for e in items:
        rows.append(
            [
                when(e.get("at")),
                str(e.get("actor")),
                str(e.get("role") or "-"),
                str(e.get("action")),
                str(e.get("target")),
                str(e.get("peer") or "-"),
                str(e.get("status")),
            ]
        )
    table(rows, sys.stdout)
    return 0


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("audit", help="the API's audit log: who changed what (admins)")
    add_api_flags(p)
    p.add_argument("--actor", help="only this token's or key's name")
    p.add_argument("--action", help="only actions containing this text, e.g. pause")
    p.add_argument("--since", type=float, help="only entries at or after (epoch seconds)")
    p.add_argument("--limit", type=int, default=100, help="entries shown (at most 1000; default 100)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=guarded("audit", cmd_audit))
