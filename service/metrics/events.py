"""The broker's event publisher in metrics (issue 30, part 1; service/broker/events.py).

Exported by the broker's /metrics whether events are on or off (0 when off, so a panel shows 0,
not "No data"). Read from the publisher's counters directly: each is an int written by one
thread, so no call into the broker's loop is needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..broker.broker import Broker

REFUSALS = ("too_long", "too_many", "per_peer", "malformed", "send_failed")  # the closed set of reasons


class EventsCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterable[Metric]:
        ev = self.broker.events
        published = CounterMetricFamily(
            "zfab_broker_events_published", "Job state events the broker's publisher sent on its XPUB socket"
        )
        dropped = CounterMetricFamily(
            "zfab_broker_events_dropped",
            "Events dropped because the broker loop's hand-off queue to its publisher was full",
        )
        depth = GaugeMetricFamily(
            "zfab_broker_events_queue_depth", "Events waiting in the hand-off queue (bound ZFAB_BROKER_EVENTS_QUEUE)"
        )
        qbytes = GaugeMetricFamily(
            "zfab_broker_events_queue_bytes", "Bytes of worker results waiting in the hand-off queue to be read"
        )
        subs = GaugeMetricFamily(
            "zfab_broker_event_subscriptions",
            "Subscriptions the event publisher holds (bound ZFAB_BROKER_EVENTS_SUBSCRIPTIONS)",
        )
        refused = CounterMetricFamily(
            "zfab_broker_event_subscriptions_refused",
            "Subscriptions (and sends) the event publisher refused, by reason",
            labels=["reason"],
        )
        published.add_metric([], ev.published if ev else 0)
        dropped.add_metric([], ev.dropped if ev else 0)
        depth.add_metric([], ev.queue_depth() if ev else 0)
        qbytes.add_metric([], ev.queue_bytes() if ev else 0)
        subs.add_metric([], ev.subscribed if ev else 0)
        for reason in REFUSALS:
            refused.add_metric([reason], ev.refused.get(reason, 0) if ev else 0)
        yield from (published, dropped, depth, qbytes, subs, refused)
