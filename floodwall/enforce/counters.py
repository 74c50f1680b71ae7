"""The counters the gates keep: plain ints on the hot path, one set per process.

Owned here, bumped by the gates (``enforce.amqp091``, ``enforce.amqp10``), read at scrape and
telemetry time by ``floodwall.ops`` (``flow_metrics``, ``telemetry``) and by io/ (the spool's
metrics, the drain at shutdown).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from floodwall.enforce.events import ProtocolName


@dataclass
class GateCounters:
    """Every gate's counters, summed over the connections of one process."""

    held_bytes: int = 0  # bytes of publishes held right now, every connection
    held_messages: int = 0
    held_publishes: int = 0  # publishes ever held (0-9-1), for comparing with shadow mode
    # Flow signals sent to clients, by (protocol, "flow_off" | "flow_on"): 0-9-1's
    # Channel.Flow, 1.0's link credit withheld or restored.
    signals: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejects: int = 0  # publishes refused under overflow: reject
    deadline_expiries: int = 0  # publishes refused because they waited too long
    spooled_records: int = 0  # publishes written to the spool instead of held
    spooled_bytes: int = 0
    spool_fallbacks: int = 0  # the spool said no (limits, disk): held instead
    # Shadow mode: what the gates would have done, by (protocol, ShadowAction value).
    shadow: Counter[tuple[str, str]] = field(default_factory=Counter)
    # The broker's outcomes for 1.0 clients' deliveries, by ``Outcome`` code (delivery-ids
    # its dispositions settled: ``floodwall.enforce.amqp10.outcomes``).
    outcomes: Counter[int] = field(default_factory=Counter)

    def signalled(self, protocol: ProtocolName | str, active: bool) -> None:
        """A ``protocol`` gate told a client to stop (False) or resume (True) publishing."""
        name = protocol.value if isinstance(protocol, ProtocolName) else protocol
        self.signals[(name, "flow_on" if active else "flow_off")] += 1

    def signal_total(self, kind: str) -> int:
        """Signals of ``kind`` ("flow_off" or "flow_on") sent so far, every protocol."""
        return sum(n for (_, k), n in self.signals.items() if k == kind)
