"""What the AMQP 1.0 sender links feeding each policed queue have from the proxy, summed over
the open connections: how many links it caps, their windows in force, the credit their
clients hold and what a held queue's tokens admitted of it. ``/state`` shows each link
(``LinkView``); the metrics and the telemetry samples show these sums per queue."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from floodwall.control.controller import QueueKey
from floodwall.enforce.amqp10.links import LinkView


class HasSenderLinks(Protocol):
    """A connection: its vhost and its 1.0 sender links, or None (0-9-1, or no credit gate)."""

    def sender_links(self) -> tuple[str, list[LinkView]] | None: ...


@dataclass(slots=True)
class LinkFigures:
    """A policed queue's 1.0 sender links whose credit the proxy caps, summed."""

    links: int = 0
    window_bytes: int = 0  # their windows in force (``LinkView.window_bytes``)
    credit: int = 0  # the credit their clients hold now
    admitted_credit: int = 0  # of it, what a held queue's tokens admitted (not yet sent)


def link_figures(connections: Iterable[HasSenderLinks],
                 policed: Container[QueueKey]) -> dict[QueueKey, LinkFigures]:
    """Per policed queue, its capped links' figures (a link feeding several queues counts on
    each); queues no capped link feeds are left out."""
    out: dict[QueueKey, LinkFigures] = {}
    for conn in connections:
        found = conn.sender_links()
        if found is None:
            continue
        vhost, views = found
        for view in views:
            if not view.windowed:
                continue
            for name in view.queues:
                key = (vhost, name)
                if key not in policed:
                    continue
                figures = out.get(key)
                if figures is None:
                    figures = out[key] = LinkFigures()
                figures.links += 1
                figures.window_bytes += view.window_bytes or 0
                figures.credit += view.credit
                figures.admitted_credit += view.admitted_credit
    return out


class LinkCollector(Collector):
    """``floodwall_amqp10_*`` per policed queue (``figures``: ``link_figures`` of the open
    connections, as the telemetry reads them too)."""

    def __init__(self, figures: Callable[[], Mapping[QueueKey, LinkFigures]]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        labels = ["vhost", "queue"]
        families = (
            (GaugeMetricFamily(
                "floodwall_amqp10_sender_links",
                "AMQP 1.0 sender links feeding the queue whose credit the proxy caps",
                labels=labels), "links"),
            (GaugeMetricFamily(
                "floodwall_amqp10_window_bytes",
                "Their windows in force, summed: message bytes they may have credit for (the "
                "policy's window, or a part of the queue's room when that is more)",
                labels=labels), "window_bytes"),
            (GaugeMetricFamily(
                "floodwall_amqp10_link_credit",
                "The link credit their clients hold now, summed (messages)",
                labels=labels), "credit"),
            (GaugeMetricFamily(
                "floodwall_amqp10_admitted_credit",
                "Of it, what a held queue's tokens admitted and the clients have not sent yet "
                "(messages)", labels=labels), "admitted_credit"),
        )
        figures = self.figures()
        for key in sorted(figures):
            for family, name in families:
                family.add_metric(list(key), getattr(figures[key], name))
        for family, _ in families:
            yield family
