"""OpenTelemetry for jobs: one trace from the submitter, through the broker's queue, to each attempt.

A client that submits a job starts (and ends) a PRODUCER span, a child of whatever span is current
(the API's HTTP span, so an instrumented caller's trace goes on), and sends its W3C trace context
(`traceparent`, `tracestate`) in the flags frame, never among the arguments. The broker passes it to
the worker in the meta frame; the worker runs each attempt in a CONSUMER span, a child of the
PRODUCER one, carrying how long the job waited (`zfab.queued_seconds` in the broker's queue,
`zfab.waited_seconds` until it started), so the wait shows on the timeline as the gap between the
two. Task code's own spans nest under the CONSUMER span.

Only `opentelemetry-api` is needed. Without an SDK's tracer provider configured (opentelemetry-sdk
with an exporter, or `opentelemetry-instrument`), no span is made and no header sent: the global
tracer provider is looked at again at most once every RECHECK seconds (a provider set after the
first jobs is in use within that), not per job; OpenTelemetry sets the global provider once per
process, so once an SDK's is seen the answer is kept.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError:  # the API is a dependency; a trimmed install still runs, untraced
    trace = None  # type: ignore[assignment]

from .core import ids

SYSTEM = "zfab"


_NO_SDK: tuple[type, ...] = (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()
_sdk_seen = False  # OpenTelemetry sets the global provider once: seen once, it stays
RECHECK = 1.0  # seconds between looks at the global provider while it is the API's no-op
_looked_at = -RECHECK  # monotonic: the last look


def enabled() -> bool:
    """True once an SDK's tracer provider is the global one (the API alone answers with a no-op).
    Asked about three times a job on each side: the look itself reads the environment
    (OTEL_PYTHON_TRACER_PROVIDER) each time no provider is set, about 6 us, an eighth of a worker's
    pool thread per sequential echo job; so a no answer is kept for RECHECK seconds."""
    global _sdk_seen, _looked_at
    if _sdk_seen:
        return True
    if trace is None:
        return False
    now = time.monotonic()
    if now - _looked_at < RECHECK:
        return False
    _looked_at = now
    _sdk_seen = not isinstance(trace.get_tracer_provider(), _NO_SDK)
    return _sdk_seen


def produce(service: str, task: str, uuid: str | None) -> tuple[str, dict[str, str]] | None:
    """At submit: a PRODUCER span for the job (its uuid made here when the caller gave none), ended at
    once, and the trace context to send in the flags frame. None when tracing is off."""
    if not enabled():
        return None
    juuid = uuid or ids.new_uuid()
    tracer = trace.get_tracer(SYSTEM)
    span = tracer.start_span(
        f"send {service}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": service,
            "messaging.message.id": juuid,
            "zfab.task": task,
        },
    )
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    span.end()
    return juuid, {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def consume(
    carrier: dict[str, str] | None,
    *,
    service: str,
    task: str,
    uuid: str,
    attempt: int,
    queued: float,
    waited: float,
    worker: str,
) -> Span | None:
    """On a worker, as an attempt starts: its CONSUMER span, a child of the submitter's PRODUCER span
    when the job carried its context. None when tracing is off (the caller ends the span it gets)."""
    if not enabled():
        return None
    parent = propagate.extract(carrier) if carrier else None
    return trace.get_tracer(SYSTEM).start_span(
        f"process {service}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": service,
            "messaging.message.id": uuid,
            "messaging.consumer.group.name": service,
            "zfab.task": task,
            "zfab.worker": worker,
            "zfab.attempt": attempt,
            "zfab.queued_seconds": round(queued, 6),
            "zfab.waited_seconds": round(waited, 6),
        },
    )


def use(span: Span) -> Any:
    """Make `span` current while the task runs, so the task's own spans are its children."""
    return trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


def finish(span: Span, outcome: str, error: BaseException | None = None) -> None:
    """End an attempt's span with how it ended (the result entry's status)."""
    span.set_attribute("zfab.outcome", outcome)
    if error is not None:
        span.record_exception(error)
    if outcome != "completed":
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()
