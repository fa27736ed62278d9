"""The API app in-process against a test fabric: its lifespan (and so its fabric client) running, an
httpx client on its ASGI transport, the caller a loopback peer. Shared by the job-semantics tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fabric import Fabric

from zfab.api.http.app import create_app
from zfab.api.settings import ApiSettings


@asynccontextmanager
async def in_process_api(f: Fabric, db: str = "", ready_within: float = 10.0) -> AsyncIterator[httpx.AsyncClient]:
    """Yields once /readyz says ready (the API's client heard the broker); fails after `ready_within` s."""
    s = ApiSettings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier, api_db=db)
    app = create_app(s)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30) as c:
            deadline = time.monotonic() + ready_within
            while (await c.get("/readyz")).status_code != 200:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the in-process API was not ready within {ready_within:g} s")
                await asyncio.sleep(0.05)
            yield c
