"""What this sidecar tells its fleet and shows of it: its own report per policed queue
(ingress, held, demand, last depth sample: ``my_reports``), each queue's headroom and the
shares the fleet's demands give (``FleetFigures``), the ``fleet`` section of ``GET /state``
(``fleet_state``) and the ``floodwall_fleet_*`` metrics (``FleetCollector``).

Pure (every entry point takes ``now``); the fleet's I/O is ``floodwall/io/fleet.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from floodwall.control.controller import FlowController, PolicedQueue, QueueKey
from floodwall.control.fleet import (
    FleetTable,
    IngressMeter,
    QueueReport,
    demand_of,
    held_by_queue,
    is_fleet_queue,
    last_sample,
    withheld_by_queue,
)
from floodwall.enforce.counters import GateCounters


@dataclass
class FleetCounters:
    """Announcements this sidecar sent and received (its own echoes included)."""

    sent: int = 0
    sent_bytes: int = 0
    received: int = 0
    received_bytes: int = 0
    undecodable: int = 0
    channel_failures: int = 0
    shared_samples: int = 0  # management samples fed from the fleet's pollers
    # How late this sidecar heard its own announcements (published -> echo, seconds) and how
    # late its announcement timer fired (its event loop's lag): the largest of each, and
    # the last echo's. A member the others call silent shows which it was here.
    echo_delay_max: float = 0.0
    echo_delay_last: float | None = None
    tick_late_max: float = 0.0


def my_reports(controller: FlowController, counters: GateCounters, meter: IngressMeter,
               now: float) -> dict[QueueKey, QueueReport]:
    """This sidecar's report of each queue it polices (``meter`` moves on to ``now``); a
    queue's demand is None until its ingress has been measured once (a newcomer)."""
    keys = [k for k in controller.queues if not is_fleet_queue(k[1])]
    meter.update({k: controller.queues[k].depth.forwarded_bytes_total for k in keys}, now)
    blocked = controller.blocked_channels()
    held = held_by_queue((b.queues for b in blocked if not b.wants_bytes), counters.held_bytes)
    withheld = withheld_by_queue((b.queues, b.wants_bytes) for b in blocked)
    out: dict[QueueKey, QueueReport] = {}
    for key in keys:
        rate = meter.rates.get(key)
        h = held.get(key, 0) + withheld.get(key, 0)
        sample = last_sample(controller.queues[key].depth, now)
        out[key] = QueueReport(rate or 0.0, h, None if rate is None else demand_of(rate, h),
                               sample[0] if sample else None, sample[1] if sample else None)
    return out


#: A queue is hot, for the fleet, from this share of its capacity on.
HOT_FRACTION = 0.5


def hot_queues(controller: FlowController) -> set[QueueKey]:
    """Policed queues the fleet should hear about often: tripped, holding publishers, or
    with an estimate at ``HOT_FRACTION`` of a limit or more (or unknown)."""
    hot = {k for b in controller.blocked_channels() for k in b.queues}
    for key, q in controller.queues.items():
        est, p = q.depth.estimate(), q.policy
        if q.tripped or est is None or (
                p.capacity > 0 and est.bytes >= HOT_FRACTION * p.capacity) or (
                p.max_messages and est.messages >= HOT_FRACTION * p.max_messages):
            hot.add(key)
    return hot


def headroom(q: PolicedQueue) -> float | None:
    """Bytes the queue may still take: capacity less the estimate (None: no byte capacity,
    or depth unknown)."""
    est = q.depth.estimate()
    if q.policy.capacity <= 0 or est is None:
        return None
    return float(q.policy.capacity - est.bytes)


@dataclass(frozen=True)
class QueueShares:
    """One queue as the fleet shares it: its headroom, each member's demand (bytes/s, None:
    not measured yet) and share of the headroom (bytes; none without a headroom)."""

    headroom: float | None
    demands: dict[str, float | None]
    shares: dict[str, float]
    poller: str = ""  # the member that samples it on the management API for the fleet


@dataclass(frozen=True)
class FleetFigures:
    """The fleet as this sidecar sees it at one moment."""

    name: str
    me: str
    size: int
    deaf: bool
    members: tuple[str, ...]  # the others that count (silent ones included)
    queues: dict[QueueKey, QueueShares] = field(default_factory=dict)

    def share(self, key: QueueKey) -> float | None:
        q = self.queues.get(key)
        return None if q is None else q.shares.get(self.me)


def fleet_figures(name: str, table: FleetTable, controller: FlowController,
                  mine: dict[QueueKey, QueueReport], now: float) -> FleetFigures:
    queues: dict[QueueKey, QueueShares] = {}
    for key, report in sorted(mine.items()):
        q = controller.queues.get(key)
        room = headroom(q) if q is not None else None
        demands: dict[str, float | None] = {m: r.demand
                                            for m, r in table.reports(key, now).items()}
        demands[table.me] = report.demand
        shares = table.shares(key, room, report, now) if room is not None else {}
        queues[key] = QueueShares(room, demands, shares, table.poller(key, now))
    return FleetFigures(name, table.me, table.size(now), table.deaf(now),
                        tuple(table.members(now)), queues)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def fleet_state(fig: FleetFigures, table: FleetTable, counters: FleetCounters,
                now: float) -> dict[str, object]:
    """The ``fleet`` section of ``GET /state``."""
    members = []
    for m in fig.members:
        at = table.last_heard(m)
        members.append({"id": m, "heard_seconds_ago": None if at is None else round(now - at, 3),
                        "silent": table.is_silent(m)})
    return {
        "name": fig.name,
        "me": fig.me,
        "size": fig.size,
        "deaf": fig.deaf,
        "timeout_seconds": table.timeout,
        "members": members,
        "queues": [{
            "vhost": key[0], "queue": key[1], "headroom_bytes": _round(s.headroom),
            "management_poller": s.poller,
            "members": {m: {"demand_bytes_per_second": _round(d),
                            "share_bytes": _round(s.shares.get(m))}
                        for m, d in sorted(s.demands.items())},
        } for key, s in sorted(fig.queues.items())],
        "announcements": {"sent": counters.sent, "sent_bytes": counters.sent_bytes,
                          "received": counters.received,
                          "received_bytes": counters.received_bytes,
                          "undecodable": counters.undecodable, "ignored": table.ignored_total,
                          "channel_failures": counters.channel_failures,
                          "shared_samples_fed": counters.shared_samples,
                          "echo_delay_max_seconds": round(counters.echo_delay_max, 3),
                          "echo_delay_last_seconds": (None if counters.echo_delay_last is None
                                                      else round(counters.echo_delay_last, 3)),
                          "tick_late_max_seconds": round(counters.tick_late_max, 3)},
    }


class FleetCollector(Collector):
    """``floodwall_fleet_*``: members, deafness, each member's demand and share per queue,
    announcements."""

    def __init__(self, figures: Callable[[], FleetFigures | None],
                 counters: FleetCounters) -> None:
        self.figures = figures
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        fig = self.figures()
        c = self.counters
        sent = CounterMetricFamily("floodwall_fleet_announcements",
                                   "Fleet announcements sent and received (own echoes "
                                   "included)", labels=["direction"])
        sent.add_metric(["sent"], c.sent)
        sent.add_metric(["received"], c.received)
        sent.add_metric(["undecodable"], c.undecodable)
        yield sent
        yield CounterMetricFamily("floodwall_fleet_shared_samples",
                                  "Management API samples fed from the fleet's poller of the "
                                  "queue instead of asking the API", value=c.shared_samples)
        if fig is None:
            return
        yield GaugeMetricFamily("floodwall_fleet_members",
                                "Sidecars in the fleet as this one hears it (itself included)",
                                value=fig.size)
        yield GaugeMetricFamily("floodwall_fleet_deaf",
                                "1 while this sidecar does not hear its own announcements",
                                value=1 if fig.deaf else 0)
        share = GaugeMetricFamily("floodwall_fleet_share_bytes",
                                  "Each member's share of the queue's headroom",
                                  labels=["vhost", "queue", "member"])
        demand = GaugeMetricFamily("floodwall_fleet_demand_bytes_per_second",
                                   "Each member's demand on the queue (-1: not measured yet)",
                                   labels=["vhost", "queue", "member"])
        for key, s in sorted(fig.queues.items()):
            for m, d in sorted(s.demands.items()):
                demand.add_metric([key[0], key[1], m], -1.0 if d is None else d)
                if m in s.shares:
                    share.add_metric([key[0], key[1], m], s.shares[m])
        yield share
        yield demand
