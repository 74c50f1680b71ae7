"""Flow control seen from outside: its Prometheus families and its ``/state`` section.

Pure: everything is read off the ``FlowController`` and a ``FlowStats`` (what the flow
supervisor in ``floodwall/io/supervisor.py`` counts) at scrape or request time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from floodwall.control.controller import ALARM, FlowController, PolicedQueue, QueueKey
from floodwall.control.depth import Depth, DepthSource
from floodwall.control.histogram import HOLD_BUCKETS, Histogram
from floodwall.control.lookups import is_pseudo
from floodwall.control.policy import PolicySet
from floodwall.control.schedule import drain_bytes_rate, ingress_rate
from floodwall.enforce.counters import GateCounters
from floodwall.enforce.events import ShadowAction
from floodwall.ops.metrics import PROTOCOLS
from floodwall.wire.amqp10.performatives import Outcome

SHADOW_ACTIONS = tuple(a.value for a in ShadowAction)

#: ``ManagementError.kind`` values, always exported (as 0 until they happen).
MANAGEMENT_ERROR_KINDS = ("auth", "not_found", "unreachable", "timeout", "tls", "http",
                          "bad_reply")
QUEUE_LABELS = ["vhost", "queue", "policy"]


@dataclass
class ManagementStatus:
    """How the management API answered last: ``ok`` None until it was first asked."""

    url: str
    ok: bool | None = None
    kind: str | None = None  # a ManagementError.kind while not ok
    error: str | None = None
    since: float | None = None  # clock time of the last change between ok and not ok

    def as_dict(self, now: float) -> dict[str, object]:
        doc: dict[str, object] = {"url": self.url, "ok": self.ok}
        if self.ok is False:
            doc["kind"] = self.kind
            doc["error"] = self.error
        if self.since is not None:
            doc["for_seconds"] = round(now - self.since, 3)
        return doc


#: Upper bounds (seconds) of the lookup latency histogram's buckets.
LOOKUP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Upper bounds (seconds) of the management API's request latency histogram.
MANAGEMENT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The endpoints the management API latency is labelled by (floodwall.io.management).
MANAGEMENT_ENDPOINTS = ("queues", "nodes", "exchanges", "bindings", "policies", "other")
#: Where the routing model learns its changes (floodwall.control.routing.sync.ChangeSource).
CHANGE_SOURCES = ("event", "lookup", "sync", "relayed")


@dataclass
class FlowStats:
    """What the flow supervisor counts besides the controller's own figures."""

    policies: PolicySet
    policies_generation: int = 1
    management: ManagementStatus = field(default_factory=lambda: ManagementStatus(""))
    management_requests: int = 0
    management_errors: Counter[str] = field(default_factory=Counter)  # by kind
    management_seconds: dict[str, Histogram] = field(default_factory=dict)  # by endpoint
    # The broker's Prometheus endpoint, asked when the management API has no figures.
    prometheus_requests: int = 0
    prometheus_errors: Counter[str] = field(default_factory=Counter)  # by kind
    # Where the depth rounds read the queues' figures: the management API, or, while it
    # does not answer, the Prometheus endpoints; and how often that changed.
    depth_source: DepthSource = DepthSource.MANAGEMENT
    depth_source_switches: int = 0
    reloads: Counter[str] = field(default_factory=Counter)  # ok | error
    last_reload_error: str | None = None
    own_connections: dict[str, str] = field(default_factory=dict)  # vhost -> "up" | reason
    own_connection_failures: int = 0  # failed connects and lost connections
    depth_known: dict[QueueKey, bool] = field(default_factory=dict)  # False: on_unknown_depth
    # The depth sampling interval in force per queue (floodwall.control.schedule), and the
    # ready counts fed per queue.
    sampling_interval: dict[QueueKey, float] = field(default_factory=dict)
    ready_counts: Counter[QueueKey] = field(default_factory=Counter)
    # The routing model (floodwall/io/topology.py): changes by source, events, lookups, syncs.
    changes: Counter[str] = field(default_factory=Counter)  # by ChangeSource value
    events_status: str = "off"  # off | starting | up | down: ... | unavailable: ...
    events_received: int = 0
    event_lag_seconds: float | None = None  # broker's event stamp to its arrival, last one
    lookups: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, result)
    lookup_seconds: Histogram = field(default_factory=lambda: Histogram(LOOKUP_BUCKETS))
    syncs: Counter[str] = field(default_factory=Counter)  # ok | error | covered (skipped)
    last_sync_at: float | None = None
    sync_differences: int = 0  # syncs that found changes the events had not brought
    out_of_step_seconds: float | None = None  # the last such: out of step for at most this


    def observe_management(self, endpoint: str, seconds: float) -> None:
        """One management API request took ``seconds`` (answered or failed)."""
        histogram = self.management_seconds.get(endpoint)
        if histogram is None:
            histogram = self.management_seconds[endpoint] = Histogram(MANAGEMENT_BUCKETS)
        histogram.observe(seconds)


def key_label(key: QueueKey) -> str:
    """A queue for people: ``orders@/``; the alarm pseudo-queue is ``broker-alarm``, a
    lookup's is its description."""
    if key == ALARM:
        return "broker-alarm"
    return key[1] if is_pseudo(key) else f"{key[1]}@{key[0]}"


def _depth_doc(depth: Depth | None) -> dict[str, int] | None:
    return None if depth is None else {"bytes": depth.bytes, "messages": depth.messages}


class FlowCollector(Collector):
    """Turns a FlowController and FlowStats into ``floodwall_*`` metric families."""

    def __init__(self, controller: FlowController, counters: GateCounters, stats: FlowStats,
                 clock: Callable[[], float]) -> None:
        self.controller = controller
        self.counters = counters
        self.stats = stats
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        c, s, now = self.controller, self.stats, self.clock()
        yield from self._queues(c, now)
        yield from self._depth_freshness(c, s, now)
        yield from pace_metrics(c, s, now)
        yield self._holds(c, s)
        yield from self._gates(c, self.counters)
        yield from self._management(s)
        yield from self._topology(c, s)
        yield from self._policies(s)

    @staticmethod
    def _queues(c: FlowController, now: float) -> Iterator[Metric]:
        """Per policed queue: depth, limits, trips, overshoot; a shadow policy's trips in
        their own families (nothing was held: alerts on trips see enforced ones only)."""
        depth_bytes = GaugeMetricFamily(
            "floodwall_queue_depth_bytes",
            "Message-body bytes in a policed queue: the broker's last figure or the estimate",
            labels=[*QUEUE_LABELS, "source"])
        depth_messages = GaugeMetricFamily(
            "floodwall_queue_depth_messages",
            "Messages ready in a policed queue (what a capacity counts), by source",
            labels=[*QUEUE_LABELS, "source"])
        capacity = GaugeMetricFamily(
            "floodwall_queue_capacity_bytes", "Trip above this depth (0: no byte limit)",
            labels=QUEUE_LABELS)
        resume = GaugeMetricFamily(
            "floodwall_queue_resume_bytes", "Release at or below this depth", labels=QUEUE_LABELS)
        tripped = GaugeMetricFamily(
            "floodwall_queue_tripped", "1 while the queue's publishers are held",
            labels=QUEUE_LABELS)
        tripped_seconds = CounterMetricFamily(
            "floodwall_queue_tripped_seconds", "Seconds the queue has spent tripped",
            labels=QUEUE_LABELS)
        trips = CounterMetricFamily(
            "floodwall_queue_trips", "Times the queue tripped", labels=QUEUE_LABELS)
        overshoot_messages = CounterMetricFamily(
            "floodwall_queue_overshoot_messages",
            "Publishes forwarded to the queue while it was tripped (AMQP 1.0: sent on link "
            "credit granted before the trip)", labels=QUEUE_LABELS)
        overshoot_bytes = CounterMetricFamily(
            "floodwall_queue_overshoot_bytes",
            "Message-body bytes of floodwall_queue_overshoot_messages", labels=QUEUE_LABELS)
        shadow_tripped = GaugeMetricFamily(
            "floodwall_shadow_queue_tripped",
            "1 while a shadow-mode policy's queue is over its limit (nothing is held)",
            labels=QUEUE_LABELS)
        shadow_seconds = CounterMetricFamily(
            "floodwall_shadow_queue_tripped_seconds",
            "Seconds a shadow-mode policy's queue has spent tripped", labels=QUEUE_LABELS)
        shadow_trips = CounterMetricFamily("floodwall_shadow_queue_trips", "Times a shadow-"
                                           "mode policy's queue tripped", labels=QUEUE_LABELS)
        for key in sorted(c.queues):
            q = c.queues[key]
            labels = [key[0], key[1], q.policy.name]
            for source, depth in (("broker", q.depth.broker_depth()),
                                  ("estimate", q.depth.estimate())):
                if depth is not None:
                    depth_bytes.add_metric([*labels, source], depth.bytes)
                    depth_messages.add_metric([*labels, source], depth.messages)
            capacity.add_metric(labels, q.policy.capacity)
            resume.add_metric(labels, q.policy.resume)
            enforced = q.policy.enforced
            (tripped if enforced else shadow_tripped).add_metric(labels, 1 if q.tripped else 0)
            (tripped_seconds if enforced else shadow_seconds).add_metric(
                labels, q.seconds_tripped(now))
            (trips if enforced else shadow_trips).add_metric(labels, q.trips)
            overshoot_messages.add_metric(labels, q.overshoot_messages)
            overshoot_bytes.add_metric(labels, q.overshoot_bytes)
        yield from (depth_bytes, depth_messages, capacity, resume, tripped, tripped_seconds,
                    trips, overshoot_messages, overshoot_bytes, shadow_tripped, shadow_seconds,
                    shadow_trips)

    @staticmethod
    def _depth_freshness(c: FlowController, s: FlowStats, now: float) -> Iterator[Metric]:
        """How old each queue's broker figures are, and whether its depth is unknown."""
        sample_age = GaugeMetricFamily(
            "floodwall_queue_depth_sample_age_seconds",
            "Age of the queue's newest broker figure, by source: ready_count (the passive "
            "declare), management or prometheus (dated back by the broker's statistics "
            "interval)",
            labels=[*QUEUE_LABELS, "source"])
        source = GaugeMetricFamily(
            "floodwall_queue_depth_source",
            "1 for where the queue's broker byte figures come from: management (/api/queues) "
            "or prometheus (/metrics/detailed, when the management API has no figures)",
            labels=[*QUEUE_LABELS, "source"])
        unknown = GaugeMetricFamily(
            "floodwall_queue_depth_unknown",
            "1 while the queue's depth is unknown (no management figures for "
            "3 intervals + the timeout): its policy's on_unknown_depth applies",
            labels=QUEUE_LABELS)
        for key in sorted(c.queues):
            q = c.queues[key]
            labels = [key[0], key[1], q.policy.name]
            if q.depth.ready_count_at is not None:
                sample_age.add_metric([*labels, "ready_count"],
                                      max(0.0, now - q.depth.ready_count_at))
            m = q.depth.management
            if m is not None:
                sample_age.add_metric([*labels, m.source.value], max(0.0, now - m.taken_at))
                source.add_metric([*labels, m.source.value], 1)
            unknown.add_metric(labels, 0 if s.depth_known.get(key, True) else 1)
        yield from (sample_age, source, unknown)

    @staticmethod
    def _holds(c: FlowController, s: FlowStats) -> Metric:
        holds = HistogramMetricFamily(
            "floodwall_hold_seconds",
            "How long channels (0-9-1) and sender links (1.0) were held, from the block to "
            "the release (outcome released) or to their close while held (outcome closed: "
            "a deadline, a reject, the client), by the policy of the queues they waited on "
            "(broker-alarm: the broker's alarm)", labels=["policy", "outcome"])
        names = sorted({p.name for p in s.policies.policies if p.is_limited}
                       | {d.name for d in s.policies.defaults.values() if d.is_limited}
                       | {label for label, _ in c.holds.seconds})
        for name in names:
            for outcome in ("released", "closed"):
                h = c.holds.seconds.get((name, outcome)) or Histogram(HOLD_BUCKETS)
                holds.add_metric([name, outcome], h.buckets(), h.total)
        return holds

    @staticmethod
    def _gates(c: FlowController, g: GateCounters) -> Iterator[Metric]:
        """What the gates hold and did: blocked channels, held publishes, signals, refusals;
        the broker alarm."""
        yield GaugeMetricFamily("floodwall_policed_queues", "Queues under a policy now",
                                value=len(c.queues))
        yield GaugeMetricFamily("floodwall_blocked_channels",
                                "Channels whose publishes are held now",
                                value=len(c.blocked_channels()))
        yield GaugeMetricFamily("floodwall_held_bytes", "Body bytes of publishes held now",
                                value=g.held_bytes)
        yield GaugeMetricFamily("floodwall_held_messages", "Publishes held now",
                                value=g.held_messages)
        yield CounterMetricFamily("floodwall_held_publishes", "Publishes held (0-9-1), ever",
                                  value=g.held_publishes)
        shadow = CounterMetricFamily(
            "floodwall_shadow_actions",
            "What the gates would have done had the shadow-mode policies been enforced "
            "(every frame passed): publishes held, Channel.Flow off/on (amqp091), link credit "
            "withheld/restored (amqp10), publishes rejected or spooled",
            labels=["protocol", "action"])
        for proto in sorted({*PROTOCOLS, *(p for p, _ in g.shadow)}):
            for action in SHADOW_ACTIONS:
                shadow.add_metric([proto, action], g.shadow[(proto, action)])
        yield shadow
        signals = CounterMetricFamily(
            "floodwall_flow_signals",
            "Flow signals sent to clients: Channel.Flow (amqp091), link credit withheld "
            "(active false) or restored (active true) (amqp10)", labels=["protocol", "active"])
        for proto in sorted({*PROTOCOLS, *(p for p, _ in g.signals)}):
            signals.add_metric([proto, "false"], g.signals[(proto, "flow_off")])
            signals.add_metric([proto, "true"], g.signals[(proto, "flow_on")])
        yield signals
        yield CounterMetricFamily("floodwall_rejected_publishes",
                                  "Publishes refused under overflow: reject", value=g.rejects)
        outcomes = CounterMetricFamily(
            "floodwall_amqp10_outcomes",
            "The broker's outcomes for AMQP 1.0 clients' deliveries, relayed unchanged "
            "(delivery-ids its dispositions settled; unroutable: released on RabbitMQ 4)",
            labels=["outcome"])
        for o in Outcome:
            outcomes.add_metric([o.label], g.outcomes[o])
        yield outcomes
        yield CounterMetricFamily("floodwall_deadline_expiries",
                                  "Publishes refused because they were held past the deadline",
                                  value=g.deadline_expiries)
        yield GaugeMetricFamily("floodwall_broker_alarm",
                                "1 while the broker has a memory or disk alarm",
                                value=1 if c.alarm_reason is not None else 0)

    @staticmethod
    def _management(s: FlowStats) -> Iterator[Metric]:
        """The management API and the own connections."""
        yield CounterMetricFamily("floodwall_management_requests",
                                  "Requests made to the broker's management API",
                                  value=s.management_requests)
        errors = CounterMetricFamily("floodwall_management_errors",
                                     "Management API requests that failed, by kind",
                                     labels=["kind"])
        for kind in sorted({*MANAGEMENT_ERROR_KINDS, *s.management_errors}):
            errors.add_metric([kind], s.management_errors[kind])
        yield errors
        yield CounterMetricFamily("floodwall_prometheus_requests",
                                  "Requests made to the broker's Prometheus endpoints for queue "
                                  "depth (the management API had no figures or no answer)",
                                  value=s.prometheus_requests)
        rounds = GaugeMetricFamily(
            "floodwall_depth_source",
            "1 for where the depth rounds read the queues' figures: management, or "
            "prometheus while the management API does not answer", labels=["source"])
        for source in DepthSource:
            rounds.add_metric([source.value], 1 if s.depth_source is source else 0)
        yield rounds
        yield CounterMetricFamily("floodwall_depth_source_switches",
                                  "Times the depth rounds changed source (to prometheus when "
                                  "the management API stopped answering, and back)",
                                  value=s.depth_source_switches)
        prometheus_errors = CounterMetricFamily(
            "floodwall_prometheus_errors",
            "Prometheus endpoint requests that failed, by kind", labels=["kind"])
        for kind in sorted(s.prometheus_errors):
            prometheus_errors.add_metric([kind], s.prometheus_errors[kind])
        yield prometheus_errors
        latency = HistogramMetricFamily(
            "floodwall_management_request_seconds",
            "Management API request latency (answered or failed), by endpoint",
            labels=["endpoint"])
        for endpoint in sorted({*MANAGEMENT_ENDPOINTS, *s.management_seconds}):
            h = s.management_seconds.get(endpoint) or Histogram(MANAGEMENT_BUCKETS)
            latency.add_metric([endpoint], h.buckets(), h.total)
        yield latency
        yield GaugeMetricFamily("floodwall_management_up",
                                "1 if the management API's last answer was good",
                                value=1 if s.management.ok else 0)
        yield CounterMetricFamily("floodwall_own_connection_failures",
                                  "The proxy's own AMQP connections that failed or were lost",
                                  value=s.own_connection_failures)

    @staticmethod
    def _policies(s: FlowStats) -> Iterator[Metric]:
        """Reloads and entries of the policy file."""
        reloads = CounterMetricFamily("floodwall_policy_reloads", "Policy reloads, by result",
                                      labels=["result"])
        for result in ("ok", "error"):
            reloads.add_metric([result], s.reloads[result])
        yield reloads
        yield GaugeMetricFamily("floodwall_policies_loaded",
                                "Policy and per-vhost defaults entries in effect",
                                value=len(s.policies.policies) + len(s.policies.defaults))

    @staticmethod
    def _topology(c: FlowController, s: FlowStats) -> Iterator[Metric]:
        changes = CounterMetricFamily(
            "floodwall_topology_changes",
            "Changes the routing model learned, by source: event (the broker's event "
            "exchange), lookup (asked for a publish), sync (a full listing found it), "
            "relayed (a declare/bind the proxy relayed)", labels=["source"])
        for source in sorted({*CHANGE_SOURCES, *s.changes}):
            changes.add_metric([source], s.changes[source])
        yield changes
        yield GaugeMetricFamily("floodwall_topology_events_up",
                                "1 while the broker's topology events are consumed",
                                value=1 if s.events_status == "up" else 0)
        yield CounterMetricFamily("floodwall_topology_events",
                                  "Topology events received from the broker",
                                  value=s.events_received)
        lookups = CounterMetricFamily("floodwall_topology_lookups",
                                      "Lookups of names a publish needed, by kind and result",
                                      labels=["kind", "result"])
        for kind in ("queue", "exchange"):
            for result in ("found", "absent", "failed"):
                lookups.add_metric([kind, result], s.lookups[(kind, result)])
        yield lookups
        latency = HistogramMetricFamily("floodwall_topology_lookup_seconds",
                                        "Time to ask the broker about one name")
        latency.add_metric([], s.lookup_seconds.buckets(), s.lookup_seconds.total)
        yield latency
        yield GaugeMetricFamily("floodwall_topology_lookups_pending",
                                "Lookups the gate is waiting for now",
                                value=len(c.lookups.pending_lookups()))
        syncs = CounterMetricFamily("floodwall_topology_syncs",
                                    "Full listings of the topology, by result",
                                    labels=["result"])
        for result in ("ok", "error", "covered"):  # covered: the fleet's poller synced
            syncs.add_metric([result], s.syncs[result])
        yield syncs
        yield CounterMetricFamily(
            "floodwall_topology_sync_differences",
            "Syncs that found changes the events had not brought (a bug to report)",
            value=s.sync_differences)
        yield GaugeMetricFamily(
            "floodwall_topology_out_of_step_seconds",
            "The last sync difference: how long the model was out of step, at most",
            value=s.out_of_step_seconds or 0.0)


def topology_state(controller: FlowController, stats: FlowStats, now: float
                   ) -> dict[str, object]:
    """Where the routing model's knowledge comes from now (``/state`` and ``/readyz``)."""
    return {
        "events": stats.events_status,
        "events_received": stats.events_received,
        "event_lag_seconds": (round(stats.event_lag_seconds, 3)
                              if stats.event_lag_seconds is not None else None),
        "last_sync_seconds_ago": (round(now - stats.last_sync_at, 1)
                                  if stats.last_sync_at is not None else None),
        "changes": {k: stats.changes[k] for k in sorted({*CHANGE_SOURCES, *stats.changes})},
        "lookups_pending": [{"vhost": lk.vhost, "kind": lk.kind.value, "name": lk.name,
                             "seconds": round(now - since, 3)}
                            for lk, since in controller.lookups.pending_lookups()],
        "sync_differences": stats.sync_differences,
    }


def pace_of(controller: FlowController, stats: FlowStats, key: QueueKey, now: float
            ) -> dict[str, float | int | None]:
    """A policed queue's pace: the sampling interval in force, the lag in force,
    the longest recent count round trip (``rtt_high``: with the lag, what the margin ``m``
    stands on), the newest count's (``count_rtt``: what ``m_lo`` stands on), the drain
    rate (body bytes/s, from its ready counts and the ledger), what the proxy forwarded
    to it over the last second (bytes/s; while it is held, the rate held publishes were
    admitted) and its AMQP 1.0 deliveries the broker has not settled (``unsettled``)."""
    q = controller.queues[key]
    depth = q.depth
    drain = drain_bytes_rate(depth)
    return {"sampling_interval": stats.sampling_interval.get(key),
            "enqueue_lag": round(depth.lag_at(now), 4),
            "rtt_high": round(depth.rtt_high, 4),
            "count_rtt": None if depth.ready_rtt is None else round(depth.ready_rtt, 4),
            "drain_rate_bytes": None if drain is None else round(drain, 1),
            "admitted_rate_bytes": round(ingress_rate(depth, now).bytes, 1),
            "unsettled": q.in_flight}


def pace_metrics(c: FlowController, s: FlowStats, now: float) -> Iterator[Metric]:
    """Per policed queue: sampling interval, drain rate, admitted rate, ready counts."""
    interval = GaugeMetricFamily(
        "floodwall_queue_sampling_interval_seconds",
        "The depth sampling interval in force: --hot-interval while the queue is held; "
        "while it is predicted to fill before the next slow count, an eighth of the time "
        "its ingress would take to fill it (at least --hot-interval); else --depth-interval",
        labels=QUEUE_LABELS)
    drain = GaugeMetricFamily(
        "floodwall_queue_drain_bytes_per_second",
        "The queue's estimated drain (consumer) rate, message-body bytes per second",
        labels=QUEUE_LABELS)
    admitted = GaugeMetricFamily(
        "floodwall_queue_admitted_bytes_per_second",
        "Message-body bytes per second the proxy forwarded to the queue over the last "
        "second (while it is tripped: the rate held publishes are admitted at)",
        labels=QUEUE_LABELS)
    counts = CounterMetricFamily(
        "floodwall_queue_depth_samples", "Ready counts (passive declares) of the queue",
        labels=QUEUE_LABELS)
    unsettled = GaugeMetricFamily(
        "floodwall_queue_unsettled_deliveries",
        "AMQP 1.0 deliveries the proxy forwarded to the queue unsettled (on links whose "
        "credit it caps) that the broker has not settled yet",
        labels=QUEUE_LABELS)
    for key in sorted(c.queues):
        labels = [key[0], key[1], c.queues[key].policy.name]
        pace = pace_of(c, s, key, now)
        if pace["sampling_interval"] is not None:
            interval.add_metric(labels, pace["sampling_interval"])
        if pace["drain_rate_bytes"] is not None:
            drain.add_metric(labels, pace["drain_rate_bytes"])
        admitted.add_metric(labels, pace["admitted_rate_bytes"] or 0.0)
        counts.add_metric(labels, s.ready_counts[key])
        unsettled.add_metric(labels, pace["unsettled"] or 0)
    yield from (interval, drain, admitted, counts, unsettled)


def management_requests(stats: FlowStats) -> dict[str, int]:
    """The load this sidecar puts on the management API: requests so far by endpoint,
    answered or failed, and their total (a fleet's pollers spare the others:
    docs/design/fleet.md, "Node alarms and the topology")."""
    return {"total": stats.management_requests,
            **{endpoint: h.count for endpoint, h in sorted(stats.management_seconds.items())}}


def _depth_state(q: PolicedQueue, known: bool) -> dict[str, object]:
    """A queue's ``depth`` in ``/state``: the estimate, the broker's figures, where its byte
    figures came from (``source``: management or prometheus; null before any)."""
    m = q.depth.management
    return {
        "estimate": _depth_doc(q.depth.estimate()),
        "broker": _depth_doc(q.depth.broker_depth()),
        "ready_count": q.depth.ready_count,
        "known": known,
        "source": None if m is None else m.source.value,
    }


def flow_state(controller: FlowController, counters: GateCounters, stats: FlowStats,
               now: float) -> dict[str, object]:
    """The ``flow`` section of ``GET /state`` (JSON-ready)."""
    c = controller
    queues: list[dict[str, object]] = []
    for key in sorted(c.queues):
        q = c.queues[key]
        p = q.policy
        queues.append({
            "vhost": key[0], "queue": key[1], "policy": p.name,
            "mode": p.mode.value,
            "capacity": p.capacity,
            "resume": p.resume,
            "max_messages": p.max_messages,
            "resume_messages": p.resume_messages,
            # what this sidecar's 1.0 senders may have unsettled past the count (its share)
            "in_flight_allowance": q.allowance_bytes(),
            "depth": _depth_state(q, stats.depth_known.get(key, True)),
            "tripped": q.tripped,
            "tripped_seconds": round(q.seconds_tripped(now), 3),
            "trips": q.trips,
            "overshoot": {"messages": q.overshoot_messages, "bytes": q.overshoot_bytes},
            "drain_rate": (None if q.depth.drain_rate is None
                           else round(q.depth.drain_rate, 1)),
            **pace_of(c, stats, key, now),
        })
    blocked = [{
        "conn": b.conn_id,
        "channel": b.channel,
        "queues": [{"vhost": k[0], "queue": k[1]} for k in sorted(b.queues)
                   if not is_pseudo(k)],
        "alarm": ALARM in b.queues,
        "lookups": [k[1] for k in sorted(b.queues) if is_pseudo(k) and k != ALARM],
        "seconds": round(now - b.since, 3),
        # 1.0 links: how long it has had no credit (null: it still has some).
        "starved_seconds": (None if b.starved_since is None
                            else round(now - b.starved_since, 3)),
    } for b in sorted(c.blocked_channels(), key=lambda b: (b.conn_id, b.channel))]
    return {
        "policies": {
            "source": stats.policies.source,
            "generation": stats.policies_generation,
            "entries": len(stats.policies.policies),
            "defaults": sorted(stats.policies.defaults),
            "reloads": dict(stats.reloads),
            "last_reload_error": stats.last_reload_error,
        },
        "management": stats.management.as_dict(now),
        "management_requests": management_requests(stats),
        "depth_source": {"source": stats.depth_source.value,
                         "switches": stats.depth_source_switches},
        "own_connections": dict(stats.own_connections),
        "topology": topology_state(c, stats, now),
        "alarm": c.alarm_reason,
        "queues": queues,
        "blocked_channels": blocked,
        "held": {"bytes": counters.held_bytes, "messages": counters.held_messages},
    }
