"""Telemetry records: what a sidecar writes about its policed queues (schema in docs/telemetry.md).

Pure: building records from a ``FlowController`` snapshot or a typed event (``event_fields``),
the file names, and the rotation policy. Writing happens in ``floodwall/io/telemetry.py``,
off the event loop. One record is one JSON object on one line (NDJSON); three types share
one schema:

- ``sample``: one per policed queue per interval (depth, ingress, tripped, held ...);
- ``sidecar``: one per interval for the sidecar as a whole (``vhost`` and ``queue`` are "");
- ``event``: trip, release, signal, hold, reject, deadline (spool and replay are reserved).

Bump ``SCHEMA_VERSION`` on any change a reader of the old version would misread (a field
renamed, re-typed, re-defined or left out); adding a field is not such a change. Version 2
is version 1 without the fields no reader used (``V1_ONLY``): about a fifth fewer bytes a
line for the pipeline to parse. Version 3 writes samples and sidecar records ``sparse``: no
field that is null, and no count of ``ZERO_WHEN_ABSENT`` that is 0 (nor ``tripped`` when
false): a quarter fewer bytes and a third fewer fields than version 2 on a fleet's lines.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from floodwall.control.controller import ALARM, FlowController, QueueKey
from floodwall.control.depth import QueueDepth
from floodwall.control.events import QueueReleased, QueueTripped
from floodwall.control.lookups import is_pseudo
from floodwall.control.policy import Mode, Policy
from floodwall.control.schedule import drain_bytes_rate
from floodwall.enforce.counters import GateCounters
from floodwall.enforce.events import (
    BrokerRejected,
    DeadlineExpired,
    PublisherHeld,
    Refused,
    Signalled,
    WouldHave,
)
from floodwall.ops.fleet_view import FleetFigures
from floodwall.ops.link_figures import LinkFigures
from floodwall.spool.events import ReplayEnded, SpoolFilling

#: The version every record carries as ``v``; docs/telemetry.md describes each version.
SCHEMA_VERSION = 3
#: Fields version 1 wrote and version 2 leaves out (docs/telemetry.md, "Versions"): nothing
#: read them, and each is always the same, follows from what is written (``interval``,
#: ``tripped``, the events) or is an input of a figure written (``ready_count``, of the
#: depth estimate; on ``/state``). Written only when they say something: ``depth_known`` when
#: false (absent: true), ``delivered_messages`` when not 0 (absent: 0).
V1_ONLY = frozenset({
    "mono",  # every record: ``interval`` already carries the exact interval
    # sample
    "ready_count", "tripped_seconds",
    # sidecar: counters the events count one by one (signal, reject, deadline)
    "policed_queues", "tripped_queues", "flow_off_total", "flow_on_total", "rejects_total",
    "deadline_expiries_total",
})
#: Counts and the one flag of samples and sidecar records that version 3 leaves out when 0
#: (``tripped``: when false): absent, a reader takes 0 (false). Most of a fleet's samples
#: are of queues not tripped, nothing held, blocked or spooled, no count limit.
ZERO_WHEN_ABSENT = frozenset({
    "max_messages", "resume_messages", "ingress_bytes", "ingress_messages",
    "delivered_messages", "tripped", "trips", "blocked_publishers", "held_bytes",
    "held_messages", "spooled_bytes", "blocked_channels", "dropped_records",
    "amqp10_links", "amqp10_window_bytes", "amqp10_credit", "amqp10_admitted_credit",
})
FILE_PREFIX = "telemetry"
FILE_SUFFIX = ".ndjson"

Record = dict[str, object]


def sidecar_identity(env: Mapping[str, str] | None = None, hostname: str | None = None) -> str:
    """The pod's name (``POD_NAME``, from the Kubernetes downward API), else the host name."""
    env = os.environ if env is None else env
    name = env.get("POD_NAME", "").strip()
    if name:
        return name
    return hostname if hostname is not None else socket.gethostname()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100] or "sidecar"


def file_name(sidecar: str, opened_at: float, seq: int) -> str:
    """``telemetry-<sidecar>-<UTC YYYYmmddTHHMMSS>-<seq>.ndjson``: sorts oldest first."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(opened_at))
    return f"{FILE_PREFIX}-{_safe(sidecar)}-{stamp}-{seq:06d}{FILE_SUFFIX}"


# -- rotation ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RotationPolicy:
    """When to start a new file, and how much the directory may hold in all."""

    max_file_bytes: int = 16 * 1024 * 1024
    max_file_age: float = 3600.0  # seconds
    max_total_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_file_bytes <= 0 or self.max_file_age <= 0 or self.max_total_bytes <= 0:
            raise ValueError("telemetry rotation limits must be more than 0")
        if self.max_total_bytes < self.max_file_bytes:
            raise ValueError("telemetry total size must be at least one file's size")

    def should_rotate(self, size: int, opened_at: float, now: float, incoming: int = 0) -> bool:
        """Rotate before writing ``incoming`` more bytes to a file of ``size`` bytes?"""
        if size == 0:
            return False  # never leave an empty file behind
        return size + incoming > self.max_file_bytes or now - opened_at >= self.max_file_age

    def to_delete(self, closed: Iterable[tuple[str, int]]) -> list[str]:
        """The oldest closed files to delete; ``closed`` are (name, size), current excluded.

        Closed files may hold ``max_total_bytes - max_file_bytes`` so that the file being
        written can still grow to its full size within the total. Names sort oldest first
        (see ``file_name``).
        """
        listed = sorted(closed)
        budget = self.max_total_bytes - self.max_file_bytes
        total = sum(size for _, size in listed)
        doomed: list[str] = []
        for name, size in listed:
            if total <= budget:
                break
            doomed.append(name)
            total -= size
        return doomed


# -- records ----------------------------------------------------------------------------
def _base(kind: str, sidecar: str, vhost: str, queue: str, ts: float, seq: int) -> Record:
    return {"v": SCHEMA_VERSION, "type": kind, "ts": round(ts, 3), "seq": seq,
            "sidecar": sidecar, "vhost": vhost, "queue": queue}


def sparse(rec: Record) -> Record:
    """``rec`` as version 3 writes a sample or sidecar record: without its null fields and
    without the counts of ``ZERO_WHEN_ABSENT`` that are 0 (``tripped``: false). A field
    absent means null, or 0 (false) for those (docs/telemetry.md, "Versions")."""
    return {k: v for k, v in rec.items()
            if v is not None and not (k in ZERO_WHEN_ABSENT and not v)}


def _delta(total: int, before: int) -> int:
    """Growth of a counter since the last sample; a counter that restarted counts from 0."""
    return total - before if total >= before else total


@dataclass
class _Previous:
    mono: float
    forwarded_bytes: int
    forwarded_messages: int
    delivered_messages: int


@dataclass
class Sampler:
    """Turns controller snapshots and observer events into records; keeps what deltas need.

    ``seq`` numbers every record this sidecar writes (a gap means records were dropped).
    """

    sidecar: str
    interval: float = 1.0
    seq: int = 0
    dropped: int = 0  # records the writer could not take (its queue was full)
    _previous: dict[QueueKey, _Previous] = field(default_factory=dict)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def snapshot(self, c: FlowController, counters: GateCounters, ts: float, mono: float,
                 depth_known: Mapping[QueueKey, bool] | None = None,
                 spooled: Mapping[QueueKey, int] | None = None,
                 sampling: Mapping[QueueKey, float] | None = None,
                 fleet: FleetFigures | None = None,
                 links: Mapping[QueueKey, LinkFigures] | None = None) -> list[Record]:
        """One ``sample`` per policed queue and one ``sidecar`` record, as of now.
        ``spooled``: bytes in each queue's spool not yet confirmed by the broker (none
        without ``--spool-dir``); ``sampling``: each queue's depth sampling interval;
        ``fleet``: the fleet as this sidecar sees it (None: off); ``links``: the AMQP 1.0
        sender links feeding each queue whose credit the proxy caps, summed."""
        spooled, sampling, links = spooled or {}, sampling or {}, links or {}
        blocked = c.blocked_channels()
        per_queue = Counter(key for b in blocked for key in b.queues)
        all_blocked = len(blocked)
        records: list[Record] = []
        for key in sorted(c.queues):
            q = c.queues[key]
            d = q.depth
            prev = self._previous.get(key) or _Previous(mono - self.interval, 0, 0, 0)
            est = d.estimate()
            broker = d.broker_depth()
            p = q.policy
            publishers = per_queue.get(key, 0)
            # The proxy counts held bytes per connection, not per queue: the sidecar's total
            # is shared out in proportion to the channels blocked on each queue.
            share = publishers / all_blocked if all_blocked else 0.0
            rec = _base("sample", self.sidecar, key[0], key[1], ts, self._next())
            rec.update({
                "interval": round(max(mono - prev.mono, 0.0), 3),
                **_policy_fields(p),
                "depth_bytes": est.bytes if est is not None else None,
                "depth_messages": est.messages if est is not None else None,
                "broker_depth_bytes": broker.bytes if broker is not None else None,
                "broker_depth_messages": broker.messages if broker is not None else None,
                "ingress_bytes": _delta(d.forwarded_bytes_total, prev.forwarded_bytes),
                "ingress_messages": _delta(d.forwarded_messages_total,
                                           prev.forwarded_messages),
                "tripped": q.tripped,
                "trips": q.trips,
                "blocked_publishers": publishers,
                "held_bytes": round(counters.held_bytes * share),
                "held_messages": round(counters.held_messages * share),
                "spooled_bytes": spooled.get(key, 0),
                **_pace_fields(d, sampling.get(key)),
                **_fleet_fields(fleet, key),
                **_link_fields(links.get(key)),
            })
            if depth_known is not None and not depth_known.get(key, True):
                rec["depth_known"] = False  # absent: true
            rec["delivered_messages"] = _delta(d.delivered_messages_total,
                                               prev.delivered_messages)
            records.append(sparse(rec))
            self._previous[key] = _Previous(mono, d.forwarded_bytes_total,
                                            d.forwarded_messages_total,
                                            d.delivered_messages_total)
        for gone in self._previous.keys() - c.queues.keys():
            del self._previous[gone]
        records.append(self._sidecar(c, counters, ts, all_blocked, spooled, fleet))
        return records

    def _sidecar(self, c: FlowController, counters: GateCounters, ts: float,
                 all_blocked: int, spooled: Mapping[QueueKey, int],
                 fleet: FleetFigures | None = None) -> Record:
        """The ``sidecar`` record: the sidecar as a whole."""
        side = _base("sidecar", self.sidecar, "", "", ts, self._next())
        side.update({
            "interval": self.interval,
            "blocked_channels": all_blocked,
            "held_bytes": counters.held_bytes,
            "held_messages": counters.held_messages,
            "spooled_bytes": sum(spooled.values()),
            "alarm": c.alarm_reason,
            "dropped_records": self.dropped,
        })
        if fleet is not None:
            side["fleet_members"] = fleet.size
        return sparse(side)

    def event(self, name: str, fields: Mapping[str, object], ts: float) -> list[Record]:
        """Records for one observer event: one per queue it names (``queues``), else one."""
        vhost = str(fields.get("vhost", ""))
        queues = fields.get("queues")
        if isinstance(queues, (list, tuple, set, frozenset)):
            names = sorted(str(q) for q in queues) or [""]
        else:
            names = [str(fields.get("queue", ""))]
        extra = {k: v for k, v in fields.items()
                 if k not in ("vhost", "queue", "queues") and k in EVENT_FIELDS}
        out: list[Record] = []
        for name_ in names:
            rec = _base("event", self.sidecar, vhost, name_, ts, self._next())
            rec["event"] = name
            rec.update(extra)
            out.append(rec)
        return out


def _pace_fields(d: QueueDepth, sampling: float | None) -> dict[str, object]:
    """A sample's pace fields: the sampling interval in force, the drain estimate."""
    drain = drain_bytes_rate(d)
    return {"sampling_interval": sampling,
            "drain_bytes_per_second": None if drain is None else round(drain, 1)}


def _link_fields(figures: LinkFigures | None) -> dict[str, object]:
    """A queue's capped 1.0 sender links (zeros, left out of the line, without any)."""
    if figures is None:
        return {}
    return {"amqp10_links": figures.links, "amqp10_window_bytes": figures.window_bytes,
            "amqp10_credit": figures.credit, "amqp10_admitted_credit": figures.admitted_credit}


def _fleet_fields(fleet: FleetFigures | None, key: QueueKey) -> dict[str, object]:
    """A sample's fleet fields: members, and this sidecar's demand and share (none when
    the fleet is off)."""
    if fleet is None:
        return {}
    q = fleet.queues.get(key)
    share = q.shares.get(fleet.me) if q is not None else None
    demand = q.demands.get(fleet.me) if q is not None else None
    return {"fleet_members": fleet.size,
            "fleet_share_bytes": None if share is None else round(share),
            "fleet_demand_bytes_per_s": None if demand is None else round(demand, 1)}


def _policy_fields(p: Policy) -> dict[str, object]:
    """A sample's fields from the queue's policy."""
    return {"policy": p.name, "capacity": p.capacity, "resume": p.resume,
            "max_messages": p.max_messages or 0, "resume_messages": p.resume_messages or 0,
            "overflow": p.overflow.value, "deadline": p.deadline, "mode": p.mode.value}


def _mode(shadow: bool) -> str:
    return Mode.SHADOW.value if shadow else Mode.ENFORCE.value


def event_fields(ev: object) -> tuple[str, dict[str, object]] | None:
    """The telemetry event a typed event is (its name and fields), or None for events the
    telemetry does not record."""
    match ev:
        case QueueTripped(key=(vhost, queue)):
            return "trip", {"vhost": vhost, "queue": queue, "policy": ev.policy,
                            "depth_bytes": ev.depth_bytes, "depth_messages": ev.depth_messages,
                            "capacity": ev.capacity, "mode": _mode(ev.shadow)}
        case QueueReleased(key=(vhost, queue)):
            return "release", {"vhost": vhost, "queue": queue, "policy": ev.policy,
                               "depth_bytes": ev.depth_bytes,
                               "depth_messages": ev.depth_messages, "resume": ev.resume,
                               "reason": ev.reason, "mode": _mode(ev.shadow)}
        case WouldHave(at=at):
            return "shadow", {"vhost": at.vhost, "conn": at.conn, "channel": at.channel,
                              "action": ev.action.value,
                              "queues": sorted(k[1] for k in ev.queues if not is_pseudo(k))}
        case PublisherHeld(at=at):
            return "hold", {"vhost": at.vhost, "conn": at.conn, "channel": at.channel,
                            "queues": sorted(q for k in ev.queues
                                             if not is_pseudo(k) for q in (k[1],))}
        case Signalled(at=at):
            return "signal", {"vhost": at.vhost, "conn": at.conn, "channel": at.channel,
                              "active": ev.active}
        case Refused(at=at):
            return "reject", {"vhost": at.vhost, "conn": at.conn, "channel": at.channel,
                              "body_bytes": ev.body_bytes,
                              "queues": sorted(k[1] for k in ev.queues if k != ALARM)}
        case DeadlineExpired(at=at):
            return "deadline", {"vhost": at.vhost, "conn": at.conn, "channel": at.channel,
                                "body_bytes": ev.body_bytes, "waited": ev.waited,
                                "queues": list(ev.queues)}
        case BrokerRejected():
            return "broker_rejected", {"vhost": ev.vhost, "queue": ev.queue or "",
                                       "conn": ev.conn, "count": ev.count,
                                       "condition": ev.condition, "reason": ev.reason}
        case SpoolFilling(key=(vhost, queue)):
            return "spool", {"vhost": vhost, "queue": queue}
        case ReplayEnded(key=(vhost, queue)):
            return "replay", {"vhost": vhost, "queue": queue, "reason": ev.reason,
                              "replayed": ev.replayed, "replayed_bytes": ev.replayed_bytes,
                              "seconds": ev.seconds, "records_left": ev.records_left,
                              "bytes_left": ev.bytes_left}
    return None


#: Fields an event record may carry besides the common ones (docs/telemetry.md).
EVENT_FIELDS = frozenset({
    "policy", "depth_bytes", "depth_messages", "capacity", "resume", "reason", "conn",
    "channel", "active", "body_bytes", "waited", "answer", "replayed", "replayed_bytes",
    "seconds", "records_left", "bytes_left", "mode", "action", "count", "condition",
})
