"""Where the routing model's knowledge comes from, and how a full sync is judged.

The model learns each change from one of four sources (``ChangeSource``): the broker's event
stream, a lookup made for a publish, a full sync (the management API's listing), or a
declare/bind the proxy relayed itself. With the event stream up, a sync should find nothing
new: a difference is a change the model missed, a bug to log. Changes still in flight when the
listing was read (an event emitted before the listing, delivered after it) are not misses:
``SyncDifference`` keeps the differing items for a grace period and excuses each one that a
change arriving meanwhile names.

Pure: items are ``floodwall.control.routing.Topology.items`` tuples; times are the caller's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from floodwall.wire.topology import ChangeKind, TopologyChange

Item = tuple[object, ...]


class ChangeSource(enum.StrEnum):
    """How the model learned a change."""

    EVENT = "event"  # the broker's topology events (rabbitmq_event_exchange)
    LOOKUP = "lookup"  # asked on the spot, for a publish naming something unknown
    SYNC = "sync"  # the periodic (or requested) full listing of the management API
    RELAYED = "relayed"  # a declare/bind/delete the proxy relayed, confirmed by the broker


def _names(item: Item) -> tuple[str, tuple[str, ...]]:
    """(vhost, the names an item is about)."""
    kind = item[0]
    if kind == "vhost":
        return str(item[1]), ()
    if kind == "binding":
        return str(item[1]), (str(item[2]), str(item[4]))
    return str(item[1]), (str(item[2]),)


def change_names(change: TopologyChange) -> set[tuple[str, str]]:
    """(vhost, name) pairs a change is about; ``(vhost, "")`` for a whole vhost."""
    if change.kind in (ChangeKind.DECLARE_VHOST, ChangeKind.DELETE_VHOST):
        return {(change.name, "")}
    names = {(change.vhost, change.name)}
    if change.source:
        names.add((change.vhost, change.source))
    return names


def describe(items: Iterable[Item], limit: int = 10) -> str:
    """Items for a log line: ``queue orders.a@/``, ``binding amq.topic->queue:q[k]@/``."""
    labels = []
    for item in sorted(items, key=repr):
        kind = item[0]
        if kind == "vhost":
            labels.append(f"vhost {item[1]}")
        elif kind == "binding":
            labels.append(f"binding {item[2]}->{item[3]}:{item[4]}[{item[5]}]@{item[1]}")
        else:
            labels.append(f"{kind} {item[2]}@{item[1]}")
    more = len(labels) - limit
    return ",".join(labels[:limit]) + (f",... ({more} more)" if more > 0 else "")


@dataclass
class SyncDifference:
    """What one sync's listing had that the model lacked (``missing``) and what the model
    had that the listing did not (``extra``), until the grace period judges them."""

    missing: frozenset[Item]
    extra: frozenset[Item]
    found_at: float
    in_step_since: float | None  # the previous successful sync: the model was right then
    touched: set[tuple[str, str]] = field(default_factory=set)

    def note(self, change: TopologyChange) -> None:
        """A change arrived during the grace period: what it names is excused."""
        self.touched |= change_names(change)

    def _excused(self, item: Item) -> bool:
        vhost, names = _names(item)
        if (vhost, "") in self.touched:
            return True
        return any((vhost, name) in self.touched for name in names)

    def confirmed(self) -> tuple[frozenset[Item], frozenset[Item]]:
        """(missing, extra) that no change arriving in the grace period explained."""
        return (frozenset(i for i in self.missing if not self._excused(i)),
                frozenset(i for i in self.extra if not self._excused(i)))

    def out_of_step_seconds(self) -> float | None:
        """How long the model was out of step, at most: since the previous sync."""
        if self.in_step_since is None:
            return None
        return self.found_at - self.in_step_since
