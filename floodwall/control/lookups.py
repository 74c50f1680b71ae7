"""Lookups: what the proxy must ask the broker before a publish naming it may go.

A publish can name something the routing model has not heard of yet: a queue declared by
another client a moment ago (through the default exchange), an exchange made since the last
event. When a policy could match where that publish lands, the gate does not guess: it asks
for a *lookup* of that name and holds the publish (and what follows it on that channel or
link) until the answer is in. The same holds while a queue just policed has no depth figure
yet: its first figure is a queue lookup too.

``LookupTable`` is the bookkeeping, pure: which lookups are pending (the gate blocks channels
on their ``key``, a pseudo-queue in the empty vhost, as it does on the broker alarm), which
answers are remembered (a name found absent, or a lookup that failed and whose policy lets
publishes go, for ``ttl`` or ``failed_ttl`` seconds, so a stream of publishes to it costs
one lookup), and the outbox of lookups the I/O layer must perform (``take_due``; ``due``
says whether there are any). The I/O layer reports each answer with ``answered``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

QueueKey = tuple[str, str]  # (vhost, queue), as floodwall.control.controller has it

#: Seconds an "absent" answer is remembered.
DEFAULT_TTL: Final = 1.0
#: Seconds a "failed, let go" answer is remembered: a broker that cannot answer (a hung
#: management API) is not asked for every publish, each waiting out the lookup timeout.
FAILED_TTL: Final = 10.0
#: Remembered answers past which expired ones are swept.
SWEEP_AT: Final = 4096
#: The vhost of every pseudo-queue (RabbitMQ vhost names are never empty).
PSEUDO_VHOST: Final = ""


class LookupKind(enum.StrEnum):
    """What a lookup asks about: a queue (passive declare) or an exchange (its bindings)."""

    QUEUE = "queue"
    EXCHANGE = "exchange"


class LookupResult(enum.Enum):
    """How the broker answered a lookup."""

    FOUND = "found"  # the model has it now (and, for a queue, its first depth figure)
    ABSENT = "absent"  # no such queue or exchange: the broker routes nothing there
    FAILED = "failed"  # the broker could not be asked: the policy's on_unknown_depth decides


@dataclass(frozen=True, slots=True)
class Lookup:
    """One name to ask the broker about."""

    vhost: str
    kind: LookupKind
    name: str

    @property
    def key(self) -> QueueKey:
        """The pseudo-queue a channel waiting for this answer is blocked on."""
        return (PSEUDO_VHOST, f"lookup of {self.kind.value} '{self.name}' in '{self.vhost}'")


def is_pseudo(key: QueueKey) -> bool:
    """True for the alarm and lookup pseudo-queues, False for real queues."""
    return key[0] == PSEUDO_VHOST


@dataclass(slots=True)
class _Entry:
    pending: bool
    since: float  # when asked (pending) or answered
    until: float = 0.0  # remembered answers: valid until then


@dataclass
class LookupTable:
    """Pending lookups, remembered answers, and the lookups the I/O layer must perform."""

    ttl: float = DEFAULT_TTL
    failed_ttl: float = FAILED_TTL
    _entries: dict[Lookup, _Entry] = field(default_factory=dict)
    _by_key: dict[QueueKey, Lookup] = field(default_factory=dict)
    _due: list[Lookup] = field(default_factory=list)
    asked: int = 0  # lookups started, for metrics

    def want(self, lookup: Lookup, now: float) -> bool:
        """A publish needs ``lookup``'s answer: True while it must wait for it (asked now
        if it was not pending), False when a remembered answer lets it go."""
        entry = self._entries.get(lookup)
        if entry is not None:
            if entry.pending:
                return True
            if entry.until > now:
                return False
        self.start(lookup, now)
        return True

    def start(self, lookup: Lookup, now: float) -> None:
        """Mark ``lookup`` pending and put it in the outbox (once)."""
        entry = self._entries.get(lookup)
        if entry is not None and entry.pending:
            return
        if len(self._entries) >= SWEEP_AT:
            self._sweep(now)
        self._entries[lookup] = _Entry(True, now)
        self._by_key[lookup.key] = lookup
        self._due.append(lookup)
        self.asked += 1

    def retry(self, lookup: Lookup) -> None:
        """Ask again (a failed lookup whose policy says block): back in the outbox."""
        entry = self._entries.get(lookup)
        if entry is not None and entry.pending and lookup not in self._due:
            self._due.append(lookup)

    @property
    def due(self) -> bool:
        """True while lookups wait in the outbox for the I/O layer (``take_due``)."""
        return bool(self._due)

    def take_due(self) -> list[Lookup]:
        """The lookups to perform now (each once), emptying the outbox."""
        due, self._due = self._due, []
        return [lk for lk in dict.fromkeys(due) if self.pending(lk)]

    def pending(self, lookup: Lookup) -> bool:
        entry = self._entries.get(lookup)
        return entry is not None and entry.pending

    def pending_key(self, key: QueueKey) -> bool:
        """True while ``key`` is the pseudo-queue of a pending lookup."""
        return key in self._by_key

    def lookup_of(self, key: QueueKey) -> Lookup | None:
        return self._by_key.get(key)

    def answered(self, lookup: Lookup, remember: bool, now: float,
                 failed: bool = False) -> float | None:
        """The answer is in: not pending any more; remembered for ``ttl`` (``failed_ttl``
        for a failure) if ``remember``. Returns how long it was pending (None if it was
        not)."""
        entry = self._entries.get(lookup)
        if entry is None or not entry.pending:
            return None
        self._by_key.pop(lookup.key, None)
        waited = now - entry.since
        if remember:
            ttl = self.failed_ttl if failed else self.ttl
            self._entries[lookup] = _Entry(False, now, now + ttl)
        else:
            del self._entries[lookup]
        return waited

    def forget(self, lookup: Lookup) -> None:
        """Drop a remembered answer (the model learned the name another way)."""
        entry = self._entries.get(lookup)
        if entry is not None and not entry.pending:
            del self._entries[lookup]

    def pending_lookups(self) -> list[tuple[Lookup, float]]:
        """Every pending lookup and since when, for /state."""
        return [(lk, e.since) for lk, e in self._entries.items() if e.pending]

    def _sweep(self, now: float) -> None:
        for lookup in [lk for lk, e in self._entries.items() if not e.pending and e.until <= now]:
            del self._entries[lookup]
