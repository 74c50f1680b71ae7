"""The flow supervisor's decisions as pure functions: whether a queue's depth is unknown, which
broker alarm holds every publish, whether the first round is in, and what ``/readyz`` says.

``floodwall.io.supervisor`` feeds them what its timers saw (samples, alarms, the topology
feed's state) and acts on the answers; the tests call them with values, without a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Final

from floodwall.control.controller import QueueKey
from floodwall.ops.flow_metrics import key_label

#: Items named at most in one log line or readiness list.
LIST_LIMIT: Final = 20


def depth_is_unknown(asked: bool, sampled_at: float | None, now: float,
                     unknown_after: float) -> bool:
    """A policed queue's depth is unknown once the management API was asked about it
    (``asked``) and gave no figure for ``unknown_after`` seconds (``sampled_at``: its last
    good sample). Not asked yet: the ready count and the ledger decide meanwhile."""
    if not asked:
        return False
    return sampled_at is None or now - sampled_at > unknown_after


def broker_alarm(management: str | None, blocked: Mapping[str, str]) -> str | None:
    """The alarm that holds every publish: the management API's node alarms, else the
    ``connection.blocked`` notice of an own connection (the first vhost's, by name), else
    none."""
    if management is not None:
        return management
    if blocked:
        return blocked[min(blocked)]
    return None


def management_alarm(memory: Iterable[str], disk: Iterable[str]) -> str | None:
    """The management API's node alarms as one reason, or None."""
    parts = []
    memory, disk = list(memory), list(disk)
    if memory:
        parts.append("memory alarm on " + ",".join(memory))
    if disk:
        parts.append("disk alarm on " + ",".join(disk))
    return "; ".join(parts) or None


def first_round_in(topology_answered: bool, policed: Iterable[QueueKey],
                   asked: Set[QueueKey]) -> bool:
    """The startup round is complete (ready): the topology loaded or its failure reported,
    and every queue policed then asked about once."""
    return topology_answered and all(k in asked for k in policed)


@dataclass(frozen=True)
class SupervisorView:
    """What readiness is judged from: the supervisor's state at one moment."""

    warm: bool
    policies: Mapping[str, object]  # source, generation, entries
    management: Mapping[str, object]  # ManagementStatus.as_dict
    policed: Iterable[QueueKey]
    asked: Set[QueueKey]
    unknown: Iterable[QueueKey]  # policed queues whose depth is unknown
    topology_error: str | None
    topology: Mapping[str, object] | None  # topology_state, when the events are not up
    own_connections: Mapping[str, str]  # vhost -> "up" or why not
    alarm: str | None


def readiness(view: SupervisorView) -> tuple[bool, dict[str, object]]:
    """Ready once the startup round is in (``warm``). Afterwards management trouble shows in
    the detail but does not unready the proxy: the relay still works and
    ``on_unknown_depth`` keeps queues safe."""
    policed = sorted(view.policed)
    detail: dict[str, object] = {
        "policies": dict(view.policies),
        "management": dict(view.management),
        "policed_queues": len(policed),
    }
    if not view.warm:
        waiting = [key_label(k) for k in policed if k not in view.asked]
        detail["warming_up"] = ({"first_depth_sample": waiting[:LIST_LIMIT]} if waiting
                                else {"topology": "not loaded yet"})
    if view.topology_error is not None:
        detail["topology_error"] = view.topology_error
    if view.topology is not None:
        # Not a reason to be unready (lookups and syncs go on), but say how stale the model
        # can be: changes to known exchanges wait for the next sync.
        detail["topology"] = dict(view.topology)
    unknown = [key_label(k) for k in sorted(view.unknown)]
    if unknown:
        detail["depth_unknown"] = unknown[:LIST_LIMIT]
    down = {v: r for v, r in view.own_connections.items() if r != "up"}
    if down:
        detail["own_connections_down"] = down
    if view.alarm is not None:
        detail["broker_alarm"] = view.alarm
    return view.warm, detail
