"""The fleet as this sidecar hears it: the sidecars policing the same queues on one broker,
what each announces per queue, and the share of a queue's headroom each may forward.

Pure: announcements are decoded from bytes (``decode``) and fed with ``now``
(``FleetTable.heard``); nothing here reads a clock, a socket or a logger. Membership
changes are handed back as values (``MemberJoined``, ``MemberLeft``; ``take_changes``).

Rules (docs/design/fleet.md):

- A member is live while its last announcement on some vhost's channel is younger than
  ``timeout``; after that it is *silent*: it still counts, at an equal share (its demand
  unknown), until the broker says its own queue is gone (``gone``: the topology events, or
  the service's passive check of the queue), it speaks again (``MemberBack``), or it stays
  silent for ``silent_limit``. A ``leaving`` announcement (a clean stop) removes it at once.
  So a member that is alive but cannot be heard (its event loop or its connection starved)
  never has its part of a queue handed to the others (over-admission), and does not flap.
- This sidecar hears its own announcements too (the channel is a fanout): while, on some
  vhost it announces on (``expect``), it has not heard itself for ``timeout`` it is *deaf*:
  nobody expires, and it counts the fleet at the size it had when it last heard itself on
  every vhost (``size``): a sidecar that cannot hear the others never assumes they left.
  When it hears itself again, the others' silence is counted from then (``_hearing_since``):
  what it missed while deaf says nothing about them.
- One member polls each queue on the management API for the whole fleet (``poller_of``:
  rendezvous hashing over the live members that police it) and announces its samples;
  the others feed those instead of asking the API themselves, while they are fresh.
- Shares of a queue's headroom are max-min fair on demand (``max_min_shares``): a member
  that needs less than an equal share gets what it needs, the rest is split evenly among
  the others; what nobody needs is split evenly too. A member with no measured demand yet
  (a newcomer) asks for exactly an equal share, and none asks for less than half of one
  (``MIN_WANT``: ``fleet_shares``). The shares never sum to more than the headroom. Deaf,
  a member's share is at most ``headroom / size`` (``fallback_share``).
- The shares are enforced (``ShareRule``, handed to the controller at each tick): a member
  trips when what it forwarded since its last count passes its share of the headroom that
  count showed, and while a queue is held it admits its share of the room each count
  shows (``floodwall.control.admission``), at most its share of the queue's drain per
  second (``ShareRule.rate_share``, ``floodwall.control.fleet_rate``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from floodwall.control.depth import ManagementSample, QueueDepth

QueueKey = tuple[str, str]  # (vhost, queue)

#: Announcements carry ``"v": FLEET_VERSION``; a member ignores versions it does not read.
FLEET_VERSION = 1
#: The exchange a fleet announces on (one per vhost with policed queues), and the prefix of
#: each member's own queue bound to it: neither is ever policed.
EXCHANGE_PREFIX = "floodwall.fleet."
#: How often a member announces while one of its queues on the vhost is hot (near capacity,
#: tripped or holding publishers), and while none is; how long one unheard counts as gone
#: (seconds: more than two cold intervals, so one lost announcement is not a departure).
ANNOUNCE_INTERVAL = 0.1
COLD_INTERVAL = 1.0
MEMBER_TIMEOUT = 2.5
#: How long a silent member (unheard for ``MEMBER_TIMEOUT``, its queue still there) keeps
#: counting before it is dropped anyway: longer than the broker takes to close a dead
#: peer's connection (two 30 s heartbeats), which deletes its queue.
SILENT_LIMIT = 120.0
#: Held bytes count as demand to be met within this many seconds.
DEMAND_HORIZON = 1.0
#: Weight of the newest interval in a member's ingress rate.
INGRESS_SMOOTHING = 0.3


class FleetMessageError(ValueError):
    """An announcement that is not one (bad JSON, a field missing or of the wrong type)."""


@dataclass(frozen=True, slots=True)
class SharedSample:
    """A management API sample of one queue, as the member that polls it for the fleet
    announces it: the figures, how long before the announcement it was asked for
    (``age``), and an id that changes with each new sample (``sid``)."""

    messages_ready: int
    messages_unacknowledged: int
    message_bytes: int
    message_bytes_ready: int
    message_bytes_unacknowledged: int
    bytes_known: bool
    age: float
    sid: int

    @classmethod
    def of(cls, sample: ManagementSample, now: float, sid: int) -> SharedSample:
        return cls(sample.messages_ready, sample.messages_unacknowledged,
                   sample.message_bytes, sample.message_bytes_ready,
                   sample.message_bytes_unacknowledged, sample.bytes_known,
                   max(0.0, now - sample.taken_at), sid)

    def sample(self, received_at: float) -> ManagementSample:
        """The sample on the receiver's clock: asked for ``age`` before it arrived."""
        return ManagementSample(received_at - self.age, self.messages_ready,
                                self.messages_unacknowledged, self.message_bytes,
                                self.message_bytes_ready, self.message_bytes_unacknowledged,
                                self.bytes_known)


@dataclass(frozen=True, slots=True)
class SharedAlarms:
    """The broker's node alarms as the fleet's alarm poller (``FleetTable.alarm_poller``)
    last read them on the management API: the nodes in a memory and in a disk alarm, how
    long before the announcement it asked (``age``), and an id per answer (``sid``)."""

    memory: tuple[str, ...]
    disk: tuple[str, ...]
    age: float
    sid: int


@dataclass(frozen=True, slots=True)
class SharedTopology:
    """What a vhost's topology poller (``FleetTable.topology_poller``) says of its routing
    model of the vhost: a digest of it (``floodwall.control.fleet_polls.topology_digests``)
    and how long ago its last full sync succeeded (None: none yet)."""

    digest: str
    sync_age: float | None


@dataclass(frozen=True, slots=True)
class QueueReport:
    """What one member says about one queue it polices.

    ``ingress``: body bytes/s it forwarded lately; ``held``: body bytes it holds for the
    queue; ``demand``: bytes/s it would forward if let (None: not measured yet, a
    newcomer); ``depth``/``age``: its last depth sample (bytes) and how old it was when
    announced (seconds), None when it has none; ``management``: its last management API
    sample of the queue, when it is the queue's poller for the fleet (``poller_of``).
    """

    ingress: float
    held: int
    demand: float | None
    depth: int | None = None
    age: float | None = None
    management: SharedSample | None = None


@dataclass(frozen=True, slots=True)
class Announcement:
    """One member's announcement on one vhost's channel."""

    member: str
    started: float  # the member's wall-clock start: a restart under the same id is new
    seq: int
    vhost: str
    queues: Mapping[str, QueueReport] = field(default_factory=dict)
    leaving: bool = False
    alarms: SharedAlarms | None = None  # from the fleet's alarm poller only
    topology: SharedTopology | None = None  # from the vhost's topology poller only


def fleet_exchange(name: str) -> str:
    return EXCHANGE_PREFIX + name


def member_queue(name: str, member: str) -> str:
    """The member's own (exclusive, auto-delete) queue on the fleet's exchange."""
    return f"{EXCHANGE_PREFIX}{name}.{member}"


def is_fleet_queue(queue: str) -> bool:
    """A fleet member's own queue: never policed (policies with ``*`` would match it)."""
    return queue.startswith(EXCHANGE_PREFIX)


# -- the wire format ----------------------------------------------------------------------
def _num(x: float | None, digits: int = 1) -> float | int | None:
    if x is None:
        return None
    r = round(x, digits)
    return int(r) if r == int(r) else r


def _entry(name: str, r: QueueReport) -> list[object]:
    entry: list[object] = [name, _num(r.ingress), r.held, _num(r.demand), r.depth,
                           _num(r.age, 3)]
    m = r.management
    if m is not None:
        entry.append([m.messages_ready, m.messages_unacknowledged, m.message_bytes,
                      m.message_bytes_ready, m.message_bytes_unacknowledged,
                      int(m.bytes_known), _num(m.age, 3), m.sid])
    return entry


def encode(a: Announcement) -> bytes:
    """Compact JSON: ``{"v","id","st","seq","vh","q":[[name, ingress, held, demand,
    depth, age(, management)], ...]}`` (``"bye":1`` when leaving); ~60 bytes + ~45 per
    queue, ~40 more for a management sample ``[ready, unacked, bytes, bytes ready, bytes
    unacked, bytes known (0/1), age, sid]``; from the fleet's alarm poller ``"al":[[memory
    alarm nodes], [disk alarm nodes], age, sid]`` (~40 bytes), from a vhost's topology
    poller ``"tp":[digest, sync age]`` (~30 bytes)."""
    doc: dict[str, object] = {
        "v": FLEET_VERSION, "id": a.member, "st": round(a.started, 3), "seq": a.seq,
        "vh": a.vhost, "q": [_entry(name, r) for name, r in sorted(a.queues.items())],
    }
    if a.alarms is not None:
        al = a.alarms
        doc["al"] = [list(al.memory), list(al.disk), _num(al.age, 3), al.sid]
    if a.topology is not None:
        doc["tp"] = [a.topology.digest, _num(a.topology.sync_age, 3)]
    if a.leaving:
        doc["bye"] = 1
    return json.dumps(doc, separators=(",", ":")).encode()


def _opt_num(x: object, what: str) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
        raise FleetMessageError(f"{what}: {x!r} is not a number >= 0")
    return float(x)


def _shared(item: object) -> SharedSample | None:
    if item is None:
        return None
    if not isinstance(item, list) or len(item) != 8:
        raise FleetMessageError(f"management sample {item!r}: not 8 fields")
    nums = [_opt_num(x, "management") for x in item]
    if any(x is None for x in nums):
        raise FleetMessageError(f"management sample {item!r}: a field is null")
    n = [x or 0.0 for x in nums]
    return SharedSample(int(n[0]), int(n[1]), int(n[2]), int(n[3]), int(n[4]), bool(n[5]),
                        n[6], int(n[7]))


def _names(x: object, what: str) -> tuple[str, ...]:
    if not isinstance(x, list) or not all(isinstance(n, str) for n in x):
        raise FleetMessageError(f"{what}: {x!r} is not a list of names")
    return tuple(x)


def _alarms(item: object) -> SharedAlarms | None:
    if item is None:
        return None
    if not isinstance(item, list) or len(item) != 4:
        raise FleetMessageError(f"alarms {item!r}: not [memory, disk, age, sid]")
    age, sid = _opt_num(item[2], "alarms age"), _opt_num(item[3], "alarms sid")
    if age is None or sid is None:
        raise FleetMessageError(f"alarms {item!r}: age and sid are required")
    return SharedAlarms(_names(item[0], "memory alarms"), _names(item[1], "disk alarms"),
                        age, int(sid))


def _topology(item: object) -> SharedTopology | None:
    if item is None:
        return None
    if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
        raise FleetMessageError(f"topology {item!r}: not [digest, sync age]")
    return SharedTopology(item[0], _opt_num(item[1], "topology sync age"))


def _report(item: object) -> tuple[str, QueueReport]:
    if not isinstance(item, list) or len(item) not in (6, 7) or not isinstance(item[0], str):
        raise FleetMessageError(f"queue entry {item!r}: not [name, ingress, held, demand, "
                                "depth, age(, management)]")
    name, ingress, held, demand, depth, age = item[:6]
    ingress_ = _opt_num(ingress, "ingress")
    held_ = _opt_num(held, "held")
    depth_ = _opt_num(depth, "depth")
    if ingress_ is None or held_ is None:
        raise FleetMessageError(f"queue entry {item!r}: ingress and held are required")
    return name, QueueReport(ingress_, int(held_), _opt_num(demand, "demand"),
                             None if depth_ is None else int(depth_), _opt_num(age, "age"),
                             _shared(item[6]) if len(item) == 7 else None)


def decode(data: bytes) -> Announcement | None:
    """An announcement; None for a version this build does not read (a newer fleet member:
    ignored, not an error). Raises ``FleetMessageError`` for anything malformed."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FleetMessageError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FleetMessageError("not a JSON object")
    if doc.get("v") != FLEET_VERSION:
        if isinstance(doc.get("v"), int):
            return None
        raise FleetMessageError(f"version {doc.get('v')!r}")
    member, vhost, seq, started = doc.get("id"), doc.get("vh"), doc.get("seq"), doc.get("st")
    if not isinstance(member, str) or not member or not isinstance(vhost, str):
        raise FleetMessageError("id and vh must be strings")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise FleetMessageError(f"seq {seq!r}")
    started_ = _opt_num(started, "st")
    queues = doc.get("q", [])
    if started_ is None or not isinstance(queues, list):
        raise FleetMessageError("st and q are required")
    return Announcement(member, started_, seq, vhost, dict(_report(i) for i in queues),
                        leaving=bool(doc.get("bye")), alarms=_alarms(doc.get("al")),
                        topology=_topology(doc.get("tp")))


def announce_due(last: float | None, now: float, hot: bool, interval: float = ANNOUNCE_INTERVAL,
                 cold_interval: float = COLD_INTERVAL) -> bool:
    """Whether a member announces on a vhost now: first, then every ``interval`` while a
    queue of it is hot, every ``cold_interval`` otherwise (a tick's jitter tolerated)."""
    if last is None:
        return True
    every = interval if hot else cold_interval
    return now - last >= every - min(every * 0.25, 0.02)


# -- demand and ingress -------------------------------------------------------------------
def demand_of(ingress: float, held: int, horizon: float = DEMAND_HORIZON) -> float:
    """Bytes/s a member would forward if let: what it forwards, plus its held bytes spread
    over ``horizon``."""
    return ingress + held / horizon


@dataclass
class IngressMeter:
    """Bytes/s forwarded into each queue, from the ledger's running totals
    (``QueueDepth.forwarded_bytes_total``), smoothed over the calls."""

    _last: dict[QueueKey, tuple[float, int]] = field(default_factory=dict)
    rates: dict[QueueKey, float] = field(default_factory=dict)

    def update(self, totals: Mapping[QueueKey, int], now: float) -> None:
        for key in self._last.keys() - totals.keys():
            del self._last[key]
            self.rates.pop(key, None)
        for key, total in totals.items():
            last = self._last.get(key)
            self._last[key] = (now, total)
            if last is None or now <= last[0]:
                continue
            rate = max(0, total - last[1]) / (now - last[0])
            old = self.rates.get(key)
            a = INGRESS_SMOOTHING
            self.rates[key] = rate if old is None else a * rate + (1 - a) * old


def held_by_queue(blocked: Iterable[frozenset[QueueKey]], held_bytes: int
                  ) -> dict[QueueKey, int]:
    """The sidecar's held bytes shared out over the queues its blocked channels wait on, in
    proportion to the channels (the gates count held bytes per connection, not per queue;
    the telemetry shares them the same way)."""
    per: dict[QueueKey, int] = {}
    sets = list(blocked)
    for queues in sets:
        for key in queues:
            per[key] = per.get(key, 0) + 1
    if not sets:
        return {}
    return {k: held_bytes * n // len(sets) for k, n in per.items()}


def withheld_by_queue(blocked: Iterable[tuple[frozenset[QueueKey], int]]
                      ) -> dict[QueueKey, int]:
    """The bytes the sidecar's withheld 1.0 sender links would send if they had credit
    (each its window, ``Blocked.wants_bytes``), shared out over the queues each waits on: a
    link holds no publishes, so without them a member whose links are withheld announces a
    demand of its ingress alone, which shrinks its share as it waits (0-9-1 channels hold
    their publishes: ``held_by_queue``)."""
    per: dict[QueueKey, int] = {}
    for queues, wants in blocked:
        if wants and queues:
            part = wants // len(queues)
            for key in queues:
                per[key] = per.get(key, 0) + part
    return per


def last_sample(depth: QueueDepth, now: float) -> tuple[int, float] | None:
    """(bytes, age) of the queue's last ready count, as the estimate took it: ready
    messages times the mean body size (a capacity counts ready messages only)."""
    if depth.ready_count is None or depth.ready_count_at is None:
        return None
    return (depth.ready_count * depth.average_body_bytes(),
            max(0.0, now - depth.ready_count_at))


# -- shares -------------------------------------------------------------------------------
def max_min_shares(headroom: float, demands: Mapping[str, float | None]) -> dict[str, float]:
    """Each member's share of ``headroom``: max-min fair on demand (water filling).

    A member with demand None gets an equal share (``headroom / n``) as its demand. When
    the demands sum to less than the headroom, each gets its demand plus an equal part of
    the rest. The shares sum to ``headroom`` (none below 0; all 0 when it is not > 0).
    """
    n = len(demands)
    if n == 0:
        return {}
    if headroom <= 0:
        return dict.fromkeys(demands, 0.0)
    equal = headroom / n
    want = {m: (equal if d is None else max(0.0, d)) for m, d in demands.items()}
    total = sum(want.values())
    if total <= headroom:
        extra = (headroom - total) / n
        return {m: w + extra for m, w in want.items()}
    shares: dict[str, float] = {}
    left, pending = headroom, sorted(want, key=lambda m: (want[m], m))
    while pending:
        level = left / len(pending)
        m = pending[0]
        if want[m] > level:
            break
        shares[m] = want[m]
        left -= want[m]
        pending.pop(0)
    level = left / len(pending) if pending else 0.0
    for m in pending:
        shares[m] = level
    return shares


#: A member that polices a queue asks for at least this part of an equal share of its
#: headroom, whatever its measured demand (an idle member can start publishing without
#: tripping at once; what it leaves unused stays headroom for the next count).
MIN_WANT = 0.5


def fleet_shares(headroom: float, demands: Mapping[str, float | None]) -> dict[str, float]:
    """The members' shares of ``headroom``: ``max_min_shares`` with each demand raised to
    ``MIN_WANT`` of an equal share at least."""
    floor = MIN_WANT * max(0.0, headroom) / max(1, len(demands))
    return max_min_shares(headroom, {m: (None if d is None else max(d, floor))
                                     for m, d in demands.items()})


@dataclass(frozen=True, slots=True)
class ShareRule:
    """How this sidecar sizes its part of one queue's headroom, from the fleet's demands as
    announced (its own as it last announced it, so every member that heard the same
    announcements computes the same shares: ``share``), until the next tick.

    ``share(h)`` is max-min fair on the members' demands (``max_min_shares``), each asking
    for at least ``MIN_WANT`` of an equal share: it is nondecreasing in ``h`` and the
    members' shares of one ``h`` sum to at most ``h``, so members that sized their shares
    on different headrooms forward together at most the largest of them (the bound in
    docs/design/fleet.md, "The bound"). Deaf (``fallback_size`` > 0): at most
    ``h / fallback_size``. ``others_ingress``: what the other members forward into the
    queue (bytes/s, as announced), for the prediction that makes a queue hot."""

    me: str
    demands: tuple[tuple[str, float | None], ...]  # every member's, this one included
    fallback_size: int = 0
    others_ingress: float = 0.0

    def share(self, headroom: float) -> float:
        """This member's part of ``headroom`` bytes (a headroom <= 0 is left as it is)."""
        if headroom <= 0:
            return headroom
        got = fleet_shares(headroom, dict(self.demands)).get(self.me, 0.0)
        if self.fallback_size > 0:
            got = min(got, fallback_share(headroom, self.fallback_size))
        return got

    def rate_share(self, rate: float) -> float:
        """This member's part of a rate (bytes/s: a held queue's feed,
        ``floodwall.control.fleet_rate``): max-min fair on the announced demands, which
        are rates too, without ``MIN_WANT`` (an idle member's unused part of a rate is lost
        for good, where its unused part of a room is room again at the next count); deaf,
        at most ``rate / fallback_size``."""
        if rate <= 0:
            return 0.0
        got = max_min_shares(rate, dict(self.demands)).get(self.me, 0.0)
        if self.fallback_size > 0:
            got = min(got, fallback_share(rate, self.fallback_size))
        return got

    def fraction(self, room_bytes: float | None, room_messages: float | None,
                 body_bytes: float) -> float:
        """This member's part (0..1) of a queue's room: of its bytes (a byte capacity), else
        of its messages taken at ``body_bytes`` each; 1 when there is no room to share."""
        h = room_bytes if room_bytes is not None else (
            None if room_messages is None else room_messages * max(1, body_bytes))
        if h is None or h <= 0 or not math.isfinite(h):
            return 1.0
        return min(1.0, self.share(h) / h)


def fallback_share(headroom: float, size: int) -> float:
    """A deaf member's share: the headroom split evenly over the last fleet size it knew."""
    return max(0.0, headroom) / max(1, size)


# -- one management poller per queue ------------------------------------------------------
#: The pseudo-keys the node alarms' and a vhost's topology poller are picked with
#: (``poller_of``): no queue has these names (a NUL is not allowed in one).
ALARMS_KEY: QueueKey = ("", "\0alarms")
TOPOLOGY_QUEUE = "\0topology"


def poller_of(key: QueueKey, members: Iterable[str]) -> str:
    """Which member polls ``key`` on the management API for the fleet: rendezvous hashing
    of the queue over the members (the highest hash wins), so every member that hears the
    same members picks the same one, and a member leaving moves only its own queues."""
    def weight(member: str) -> bytes:
        return hashlib.blake2b(f"{member}\0{key[0]}\0{key[1]}".encode(),
                               digest_size=8).digest()

    return max(members, key=lambda m: (weight(m), m))


# -- membership ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MemberJoined:
    member: str
    vhost: str
    size: int  # members (this sidecar included) after it joined


@dataclass(frozen=True, slots=True)
class MemberLeft:
    member: str
    reason: str  # "timeout" | "leaving" | "restarted" | "queue deleted"
    silent_seconds: float
    size: int


@dataclass(frozen=True, slots=True)
class MemberSilent:
    """Unheard for the timeout: still counted (an equal share) until the broker says its
    queue is gone (``FleetTable.gone``), it speaks again, or ``silent_limit``."""

    member: str
    silent_seconds: float
    size: int


@dataclass(frozen=True, slots=True)
class MemberBack:
    """A silent member heard again (it never stopped counting)."""

    member: str
    silent_seconds: float
    size: int


FleetChange = MemberJoined | MemberLeft | MemberSilent | MemberBack


@dataclass
class _Heard:
    started: float
    seq: int
    at: float
    queues: Mapping[str, QueueReport]
    alarms: SharedAlarms | None = None
    topology: SharedTopology | None = None


@dataclass
class FleetTable:
    """The members this sidecar hears (``me`` not among them) and their reports."""

    me: str
    timeout: float = MEMBER_TIMEOUT
    silent_limit: float = SILENT_LIMIT
    # member -> vhost -> its last announcement there
    _heard: dict[str, dict[str, _Heard]] = field(default_factory=dict)
    # vhost -> when this sidecar last heard its own announcement there (``expect`` says
    # which vhosts it announces on)
    _self_heard: dict[str, float | None] = field(default_factory=dict)
    _size_when_heard: int = 1
    # When this sidecar last began hearing itself on every vhost after being deaf: the
    # others' silence counts from then.
    _hearing_since: float = -math.inf
    # The silent members (unheard for ``timeout``, still counted) and when each was last heard.
    _silent: dict[str, float] = field(default_factory=dict)
    ignored_total: int = 0  # stale (seq not newer), from an older start, or undecodable
    changes: list[FleetChange] = field(default_factory=list)

    def take_changes(self) -> list[FleetChange]:
        out, self.changes = self.changes, []
        return out

    def heard(self, a: Announcement, now: float) -> None:
        """An announcement arrived (this sidecar's own echo included)."""
        if a.member == self.me:
            if a.vhost in self._self_heard:
                was_deaf = self.deaf(now)
                self.expire(now)
                self._self_heard[a.vhost] = now
                if not self.deaf(now):
                    if was_deaf:
                        self._hearing_since = now
                    self._size_when_heard = 1 + len(self._heard)
            return
        mine = self._heard.get(a.member)
        last = mine.get(a.vhost) if mine else None
        if last is not None and (a.started < last.started
                                 or (a.started == last.started and a.seq <= last.seq)):
            self.ignored_total += 1
            return
        if a.leaving:
            self._drop(a.member, "leaving", now)
            return
        if mine is not None and any(h.started < a.started for h in mine.values()):
            self._drop(a.member, "restarted", now)
            mine = None
        if mine is None:
            mine = self._heard[a.member] = {}
            mine[a.vhost] = _Heard(a.started, a.seq, now, a.queues, a.alarms, a.topology)
            self.changes.append(MemberJoined(a.member, a.vhost, self.size(now)))
            return
        mine[a.vhost] = _Heard(a.started, a.seq, now, a.queues, a.alarms, a.topology)
        was = self._silent.pop(a.member, None)
        if was is not None:
            self.changes.append(MemberBack(a.member, round(now - was, 3), self.size(now)))

    def ignored(self) -> None:
        """An announcement that could not be read."""
        self.ignored_total += 1

    def gone(self, member: str, now: float, reason: str = "queue deleted") -> None:
        """The broker says the member's queue is gone (its connection died)."""
        if member in self._heard:
            self._drop(member, reason, now)

    def _drop(self, member: str, reason: str, now: float) -> None:
        mine = self._heard.pop(member, None)
        self._silent.pop(member, None)
        if mine is None:
            return
        silent = now - max(h.at for h in mine.values())
        self.changes.append(MemberLeft(member, reason, round(silent, 3), self.size(now)))

    def expect(self, vhosts: Iterable[str]) -> None:
        """The vhosts this sidecar announces on now (those with policed queues)."""
        wanted = set(vhosts)
        for vhost in self._self_heard.keys() - wanted:
            del self._self_heard[vhost]
        for vhost in wanted - self._self_heard.keys():
            self._self_heard[vhost] = None

    def deaf(self, now: float) -> bool:
        """On some vhost it announces on, it has not heard its own announcement for
        ``timeout`` (or never); or it announces nowhere."""
        if not self._self_heard:
            return True
        return any(at is None or now - at > self.timeout for at in self._self_heard.values())

    def _quiet(self, at: float, now: float) -> float:
        """How long a member heard at ``at`` has been silent, as far as this sidecar could
        have heard it (not while it was deaf itself)."""
        return now - max(at, self._hearing_since)

    def expire(self, now: float) -> None:
        """Members unheard for ``timeout`` turn silent (``MemberSilent``: still counted);
        silent ones are dropped after ``silent_limit``. Nothing while this sidecar is deaf
        (then nobody's silence says anything)."""
        if self.deaf(now):
            return
        for member, mine in list(self._heard.items()):
            last = max(h.at for h in mine.values())
            quiet = self._quiet(last, now)
            if member in self._silent:
                if quiet > self.silent_limit:
                    self._drop(member, "timeout", now)
            elif quiet > self.timeout:
                self._silent[member] = last
                self.changes.append(MemberSilent(member, round(now - last, 3),
                                                 self.size(now)))

    def members(self, now: float) -> list[str]:
        """The others that count now (silent ones included), sorted."""
        self.expire(now)
        return sorted(self._heard)

    def silent_members(self, now: float) -> dict[str, float]:
        """The silent members and when each was last heard."""
        self.expire(now)
        return dict(self._silent)

    def vhost_of(self, member: str) -> str | None:
        """The vhost ``member`` was last heard on."""
        mine = self._heard.get(member)
        return max(mine.items(), key=lambda kv: kv[1].at)[0] if mine else None

    def size(self, now: float) -> int:
        """Members, this sidecar included; deaf: the size when it last heard itself."""
        if self.deaf(now):
            return max(self._size_when_heard, 1 + len(self._heard))
        return 1 + len(self._heard)

    def reports(self, key: QueueKey, now: float) -> dict[str, QueueReport]:
        """What each member (not this one) last said about ``key``; a member silent (or
        unheard on ``key``'s vhost for ``timeout``) with its demand unknown (None: it asks
        for an equal share, whatever it said last)."""
        self.expire(now)
        deaf = self.deaf(now)
        out: dict[str, QueueReport] = {}
        for member, mine in self._heard.items():
            h = mine.get(key[0])
            if h is None or key[1] not in h.queues:
                continue
            r = h.queues[key[1]]
            if member in self._silent or (not deaf and self._quiet(h.at, now) > self.timeout):
                r = QueueReport(r.ingress, r.held, None, r.depth, r.age)
            out[member] = r
        return out

    def poller(self, key: QueueKey, now: float) -> str:
        """The member that polls ``key`` on the management API for the fleet: among the
        members that police it and speak (not silent), and this one (``poller_of``); deaf,
        this one."""
        if self.deaf(now):
            return self.me
        return poller_of(key, [self.me, *(m for m in self.reports(key, now)
                                          if m not in self._silent)])

    def shared_sample(self, key: QueueKey, member: str, now: float
                      ) -> tuple[SharedSample, float] | None:
        """``member``'s last announced management sample of ``key`` and when its
        announcement arrived (None: it announced none, or is not live)."""
        self.expire(now)
        h = self._heard.get(member, {}).get(key[0])
        if h is None or key[1] not in h.queues or member in self._silent:
            return None
        m = h.queues[key[1]].management
        return None if m is None else (m, h.at)

    def alarm_poller(self, now: float) -> str:
        """The member that asks the management API for node alarms for the fleet (they are
        the broker's, not a vhost's): rendezvous hashing over every member that speaks,
        this one included; deaf, this one."""
        if self.deaf(now):
            return self.me
        live = [m for m in self.members(now) if m not in self._silent]
        return poller_of(ALARMS_KEY, [self.me, *live])

    def topology_poller(self, vhost: str, now: float) -> str:
        """The member whose full syncs of the topology stand for the fleet's on ``vhost``:
        rendezvous hashing over the members that speak on it, this one included; deaf,
        this one."""
        if self.deaf(now):
            return self.me
        live = [m for m, mine in self._heard.items() if m not in self._silent
                and vhost in mine and self._quiet(mine[vhost].at, now) <= self.timeout]
        return poller_of((vhost, TOPOLOGY_QUEUE), [self.me, *live])

    def shared_alarms(self, member: str, now: float) -> tuple[SharedAlarms, float] | None:
        """``member``'s newest announced node alarms and when that announcement arrived
        (None: it announced none, or is silent)."""
        self.expire(now)
        if member in self._silent:
            return None
        heard = [(h.alarms, h.at) for h in self._heard.get(member, {}).values()
                 if h.alarms is not None]
        return max(heard, key=lambda x: x[1]) if heard else None

    def shared_topology(self, vhost: str, member: str, now: float
                        ) -> tuple[SharedTopology, float] | None:
        """What ``member`` last said of its model of ``vhost`` and when it arrived."""
        self.expire(now)
        h = self._heard.get(member, {}).get(vhost)
        if h is None or h.topology is None or member in self._silent:
            return None
        return h.topology, h.at

    def last_heard(self, member: str) -> float | None:
        mine = self._heard.get(member)
        return max(h.at for h in mine.values()) if mine else None

    def is_silent(self, member: str) -> bool:
        return member in self._silent

    def rule(self, key: QueueKey, mine: QueueReport, now: float,
             since: float | None = None) -> ShareRule | None:
        """How this sidecar sizes its share of ``key``'s headroom now (``ShareRule``), from
        ``mine`` (its report as announced) and the members' reports; None when it is alone
        on the queue and hears the fleet (the whole headroom is its own).

        ``since``: when this sidecar began policing ``key``. The members of its vhost that
        do not report ``key`` and have not announced since then may police it too (a queue
        declared for the whole fleet at once, their announcement of it not here yet): each
        counts as a newcomer (an equal share) rather than as absent, until it announces
        (``_pending``)."""
        reports = self.reports(key, now)
        deaf = self.deaf(now)
        pending = [] if since is None else self._pending(key, reports, since)
        if not reports and not pending and not deaf:
            return None
        demands = tuple(sorted([(m, r.demand) for m, r in reports.items()]
                               + [(m, None) for m in pending]
                               + [(self.me, mine.demand)]))
        return ShareRule(self.me, demands, self.size(now) if deaf else 0,
                         sum(r.ingress for r in reports.values()))

    def _pending(self, key: QueueKey, reports: Mapping[str, QueueReport], since: float
                 ) -> list[str]:
        """The members of ``key``'s vhost that do not report it and were last heard there
        before this sidecar began policing it (at ``since``): their next announcement says
        whether they police it (a member announces a queue at once when it begins to)."""
        return [m for m, mine in self._heard.items()
                if m not in reports and key[0] in mine and mine[key[0]].at <= since]

    def shares(self, key: QueueKey, headroom: float, mine: QueueReport | None, now: float
               ) -> dict[str, float]:
        """Every member's share of ``key``'s ``headroom`` as this sidecar computes it
        (``me`` included when ``mine`` is given). Deaf: ``fallback_share`` for this
        sidecar, and the others as they were last heard."""
        reports = self.reports(key, now)
        demands: dict[str, float | None] = {m: r.demand for m, r in reports.items()}
        if mine is not None:
            demands[self.me] = mine.demand
        shares = fleet_shares(headroom, demands)
        if mine is not None and self.deaf(now):
            shares[self.me] = min(shares.get(self.me, 0.0),
                                  fallback_share(headroom, self.size(now)))
        return shares
