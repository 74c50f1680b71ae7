"""What the flow supervisor and its topology feed need to know (``FlowSettings``), built from
the proxy's settings for ``floodwall run``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from floodwall.control.admission import HOT_INTERVAL
from floodwall.control.schedule import DEPTH_INTERVAL
from floodwall.io.tls import ManagementTlsContext, UpstreamTlsContext
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials, ManagementCredentials, ProxySettings


@dataclass(frozen=True)
class FlowSettings:
    """What the flow supervisor needs; ``from_proxy_settings`` for ``floodwall run``."""

    policies: Path
    management_urls: tuple[str, ...]  # each node's, tried in order (management.py)
    management_credentials: ManagementCredentials
    upstreams: Upstreams  # the broker's nodes, for the own connections
    amqp_credentials: AmqpCredentials
    depth_interval: float = DEPTH_INTERVAL
    hot_interval: float = HOT_INTERVAL  # a hot queue's counts: at most one per this (schedule.py)
    management_interval: float = 5.0
    alarm_interval: float = 2.0
    topology_interval: float = 30.0
    policy_poll_interval: float = 2.0
    holding_log_interval: float = 5.0
    management_timeout: float = 5.0
    connect_timeout: float = 5.0
    probe_timeout: float = 5.0
    reconnect_min: float = 0.5
    reconnect_max: float = 1.0  # a restarted broker is read again within a second
    management_connections: int = 4  # the API client's pool: requests in flight at most
    # How old the management API's queue figures can be when it answers: RabbitMQ's
    # collect_statistics_interval (5 s by default). Samples are dated back by this much, so
    # a real-time ready count taken meanwhile is never overruled by an older figure.
    management_stats_age: float = 5.0
    unknown_after: float | None = None  # None: 3 * management_interval + management_timeout
    # The routing model's live feed (floodwall/io/topology.py).
    topology_events: bool = True  # consume amq.rabbitmq.event when the broker has it
    event_vhost: str = "/"  # where the rabbitmq_event_exchange plugin declares its exchange
    lookup_timeout: float = 2.0  # longest a publish waits for a lookup before on_unknown_depth
    lookup_ttl: float = 1.0  # how long "absent" (or "failed, allowed") is remembered
    lookup_retry: float = 1.0  # a failed lookup a policy blocks on is asked again this often
    sync_grace: float = 2.0  # how long changes in flight may explain a sync's difference
    # The fleet (floodwall/io/fleet.py): sidecars on this broker share what they see under this
    # name; None: off.
    fleet: str | None = "default"
    upstream_tls: UpstreamTlsContext | None = None  # amqps for the depth probes
    management_tls: ManagementTlsContext | None = None  # https to the management API
    # The broker's Prometheus endpoints, one per node (floodwall/io/prometheus.py): queue
    # depth when the management API has no figures (statistics off); empty: not asked.
    prometheus_urls: tuple[str, ...] = ()
    shadow: bool = False  # --shadow: every policy in shadow mode (nothing held)

    @property
    def depth_unknown_after(self) -> float:
        if self.unknown_after is not None:
            return self.unknown_after
        return 3 * self.management_interval + self.management_timeout

    @classmethod
    def from_proxy_settings(cls, s: ProxySettings, upstreams: Upstreams,
                            upstream_tls: UpstreamTlsContext | None = None,
                            management_tls: ManagementTlsContext | None = None
                            ) -> FlowSettings:
        if s.policies is None:
            raise ValueError("flow control needs a policies file")
        return cls(
            policies=s.policies,
            management_urls=s.effective_management_urls,
            management_credentials=s.credentials,
            upstreams=upstreams,
            amqp_credentials=s.effective_amqp_credentials,
            depth_interval=s.depth_interval,
            hot_interval=s.hot_interval,
            management_interval=s.management_interval,
            alarm_interval=s.alarm_interval,
            topology_interval=s.topology_interval,
            topology_events=s.topology_events,
            policy_poll_interval=s.policy_poll_interval,
            holding_log_interval=s.holding_log_interval,
            management_timeout=s.management_timeout,
            management_connections=s.management_connections,
            connect_timeout=s.connect_timeout,
            fleet=s.fleet,
            upstream_tls=upstream_tls,
            management_tls=management_tls,
            prometheus_urls=s.effective_prometheus_urls,
            shadow=s.shadow,
        )
