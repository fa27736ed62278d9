"""The bare FastAPI floor for bench/api.py: the same uvicorn setup as `zfab api`, no fabric behind it.

python -m bench.bare_app --port 8001
"""

from __future__ import annotations

import argparse
from typing import Any

from fastapi import FastAPI

app = FastAPI()


@app.post("/jobs")
async def submit(body: dict[str, Any]) -> dict[str, Any]:
    """Answer like a finished job, without running one."""
    kwargs = body.get("kwargs") or {}
    return {"state": "completed", "results": {"bare": {"result": kwargs.get("data"), "failed": False}}}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def main(argv: list[str] | None = None) -> int:
    from zfab.api.server import serve

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    ns = p.parse_args(argv)
    serve(app, ns.host, ns.port, log_level="WARNING")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
