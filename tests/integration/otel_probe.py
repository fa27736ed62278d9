"""Run by tests/integration/test_tracing.py in a process of its own (the global tracer provider is
set once per process): a broker, a demo worker and the API in this process, the OpenTelemetry SDK's
in-memory exporter, two jobs POSTed with a W3C traceparent; prints the finished spans as JSON."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from zfab import Broker, Settings  # noqa: E402
from zfab.api.http.app import create_app  # noqa: E402 - after the provider: the app sees it configured
from zfab.api.settings import ApiSettings  # noqa: E402
from zfab.workers.demo import DemoWorker  # noqa: E402

TRACEPARENTS = {
    "echo": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "flaky": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def span_of(s: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": f"{s.context.trace_id:032x}",
        "span_id": f"{s.context.span_id:016x}",
        "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
        "start": s.start_time / 1e9,
        "end": s.end_time / 1e9,
        "status": s.status.status_code.name,
        "attributes": dict(s.attributes or {}),
    }


async def main(tmp: Path) -> list[dict[str, Any]]:
    ep = f"tcp://127.0.0.1:{free_port()}"
    s = Settings(broker=ep, data_dir=str(tmp), keepalive_interval=0.3, keepalive_multiplier=3, startup_grace=0)
    broker = Broker(s, endpoint=ep).start()
    worker = DemoWorker(name="w1", settings=s).start()
    api = ApiSettings(broker=ep, keepalive_interval=0.3, keepalive_multiplier=3, api_db="", data_dir=str(tmp))
    app = create_app(api)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30) as c:
                deadline = time.monotonic() + 20
                while (await c.get("/mmi/workers")).text.count('"alive":true') < 1:
                    if time.monotonic() > deadline:
                        raise SystemExit("no worker registered")
                    await asyncio.sleep(0.05)
                for task, kwargs in (("echo", {"data": "traced"}), ("flaky", {"failures": 1})):
                    headers = {"traceparent": TRACEPARENTS[task]}
                    r = await c.post(
                        "/jobs?wait=20", json={"service": "demo", "task": task, "kwargs": kwargs}, headers=headers
                    )
                    if r.json().get("state") != "completed":
                        raise SystemExit(f"{task}: {r.text}")
    finally:
        worker.stop(drain=1)
        broker.stop()
    provider.force_flush()
    return [span_of(s) for s in exporter.get_finished_spans()]


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
