"""What cuts across the broker, assembled once into its hooks (hooks.py): the broker's default middleware.

In the order each hook point calls them: the broker's term (term.py: role and fence), memory trimming (when
glibc can), the event publisher and its queue events (when ZFAB_BROKER_EVENTS is set, or a publisher is
given), hop traces (unless ZFAB_HOP_TRACES=false). None of them is there when unused: a point without hooks
costs one read.
"""

from __future__ import annotations

from collections.abc import Container

import zmq

from ..core.access import GrantBox
from ..core.keepalive import Clock
from ..settings import Settings
from .events import EventPublisher
from .hooks import Hook, Hooks, HopTraces, TrimMemory
from .memory import MemoryKeeper
from .queueevents import QueueEvents
from .registry import Registry
from .term import Term


def cross_cutting(
    s: Settings,
    clock: Clock,
    term: Term,
    memory: MemoryKeeper,
    events: EventPublisher | None,
    changed: set[bytes],
    registry: Registry,
    paused: Container[bytes],
) -> Hooks:
    """The broker's hooks. `term`: its term (term.py), whose loop is the broker's; `changed`: the
    dispatcher's set of services whose queue changed."""
    hooks: list[Hook] = [term]  # first: its fence goes before anything else (term.py)
    if memory.enabled:
        hooks.append(TrimMemory(memory, term.loop))
    publishers = [events] if events else []
    for p in publishers:
        hooks += [p, QueueEvents(p, changed, registry=registry, paused=paused, settings=s)]
    if s.hop_traces:
        hooks.append(HopTraces(clock, [p.traced for p in publishers]))
    return Hooks(hooks)


def publisher_for(
    s: Settings, context: zmq.Context[zmq.Socket[bytes]], grants: GrantBox | None = None
) -> EventPublisher | None:
    """The publisher ZFAB_BROKER_EVENTS asks for, in the broker's `context` (its ZAP handler's), or None;
    `grants`: the keys' grants under CURVE (identities.py), which bound each key's subscriptions."""
    if not s.broker_events:
        return None
    return EventPublisher(
        s.broker_events,
        hwm=s.broker_events_hwm,
        queue_size=s.broker_events_queue,
        max_subscriptions=s.broker_events_subscriptions,
        curve_secret=s.curve_secret,
        context=context,
        grants=grants,
    )
