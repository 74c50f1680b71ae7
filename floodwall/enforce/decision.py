"""The one decision both gates take about a publish (0-9-1) or a transfer (1.0): pass, hold,
reject or spool; and the rules around it written once (strictest overflow, signal, deadline).

Pure: it reads the controller's state (which queues are policed, tripped, backlogged, under
which policy) and the spool port's ``accepting``/``has_backlog``, and returns a value. Each
gate translates the verdict into frames: 0-9-1 holds the frames on the channel (or nacks, or
closes it, or acks a spooled one when durable); 1.0 withholds the link's credit (or settles
the delivery ``rejected``, or settles a spooled one ``accepted`` when durable).

Shadow mode is decided here too: the controller keeps the trips of shadow-mode policies apart
(``FlowController.shadow_blocking``); ``decide`` given them returns the verdict acted upon
(as if they were not tripped) and, when it differs, the verdict enforcing them would have
given (``Decision.shadow``), which the gate only records (``events.ShadowAction``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Final, Protocol

from floodwall.control.controller import ALARM, QueueKey
from floodwall.control.policy import DEFAULT_DEADLINE, Overflow, Policy, Signal
from floodwall.enforce.ports import SpoolPort


class Verdict(Enum):
    """What happens to one publish or transfer."""

    PASS = "pass"  # to the broker now
    HOLD = "hold"  # 0-9-1: kept on its channel; 1.0: the link's credit withheld after it
    REJECT = "reject"  # answered by the proxy, never sent (overflow: reject)
    SPOOL = "spool"  # to the queue's spool (overflow: spool), acknowledged once durable


class Unspoolable(Enum):
    """Why a publish that would have been spooled is held instead."""

    TRANSACTIONAL = "transactional"
    MANDATORY = "mandatory"


class Policed(Protocol):
    """A policed queue as the decision reads it (``control.controller.PolicedQueue``)."""

    @property
    def policy(self) -> Policy: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict; the spool that takes it (``SPOOL``); why it is not spooled when it
    would have been (reported once per channel or link by the gate); ``shadow``: the verdict
    had the shadow policies been enforced, when it is not ``verdict`` (None: the same)."""

    verdict: Verdict
    spool_to: QueueKey | None = None
    not_spooled: Unspoolable | None = None
    shadow: Verdict | None = None


PASS: Final = Decision(Verdict.PASS)
HOLD: Final = Decision(Verdict.HOLD)
REJECT: Final = Decision(Verdict.REJECT)


def decide(vhost: str, names: frozenset[str], blocking: frozenset[QueueKey],
           queues: Mapping[QueueKey, Policed], spool: SpoolPort | None, *,
           lookup: bool = False, transactional: bool = False, mandatory: bool = False,
           behind: bool = False, shadow: frozenset[QueueKey] = frozenset()) -> Decision:
    """Pass, hold, reject or spool one publish or transfer; and, given ``shadow`` (what
    it would also wait on were the shadow policies enforced: ``shadow_blocking``, and for
    0-9-1 the shadow queues its channel would still be held on), what enforcing them would
    have done (``Decision.shadow``).

    ``names``: the queues it lands in; ``blocking``: the tripped or backlogged queues among
    them, the broker alarm and the lookups it waits for (``FlowController.blocking``,
    ``lookup_for``); ``lookup``: one of ``blocking`` is a lookup; ``queues``: the policed
    queues (``FlowController.queues``); ``behind``: its publisher already waits (0-9-1:
    frames held on its channel; 1.0: its link's spool refused it until the queue releases),
    so it can neither pass nor join the spool.

    Spooled: a publish landing in exactly one queue whose policy says ``spool``, while that
    queue is tripped or its spool has a backlog (so the broker gets the queue's messages in
    the order the proxy accepted them), when a spool exists and accepts, no lookup is
    pending, the broker has no alarm and the publisher does not already wait. A
    transactional or mandatory publish is held instead (their semantics need the broker
    now). Otherwise nothing blocking and nothing ahead of it: pass; a blocking queue whose
    policy says ``reject``: reject; else hold.
    """
    if not blocking and not behind and spool is None and not shadow:  # the common case
        return PASS
    acted = _decide(vhost, names, blocking, queues, spool, lookup, transactional, mandatory,
                    behind)
    if not shadow:
        return acted
    would = _decide(vhost, names, blocking | shadow, queues, spool, lookup, transactional,
                    mandatory, behind).verdict
    return acted if would is acted.verdict else replace(acted, shadow=would)


def _decide(vhost: str, names: frozenset[str], blocking: frozenset[QueueKey],
            queues: Mapping[QueueKey, Policed], spool: SpoolPort | None, lookup: bool,
            transactional: bool, mandatory: bool, behind: bool) -> Decision:
    if not blocking and not behind and spool is None:  # the common case, first
        return PASS
    if spool is not None and not lookup and not behind and len(names) == 1 \
            and ALARM not in blocking:
        key = _spool_target(vhost, names, blocking, queues, spool)
        if key is not None:
            if transactional:
                return Decision(Verdict.HOLD, not_spooled=Unspoolable.TRANSACTIONAL)
            if mandatory:
                return Decision(Verdict.HOLD, not_spooled=Unspoolable.MANDATORY)
            return Decision(Verdict.SPOOL, key)
    if not blocking and not behind:
        return PASS
    if strictest_overflow(queues, blocking) is Overflow.REJECT:
        return REJECT
    return HOLD


def _spool_target(vhost: str, names: frozenset[str], blocking: frozenset[QueueKey],
                  queues: Mapping[QueueKey, Policed], spool: SpoolPort) -> QueueKey | None:
    """The one queue whose spool would take the publish, or None."""
    key = (vhost, next(iter(names)))
    q = queues.get(key)
    if q is None or q.policy.overflow is not Overflow.SPOOL or not spool.accepting:
        return None
    if key not in blocking and not spool.has_backlog(key):
        return None
    return key


def strictest_overflow(queues: Mapping[QueueKey, Policed],
                       blocking: Iterable[QueueKey]) -> Overflow:
    """What the strictest policy among ``blocking`` says: reject wins over hold."""
    for key in blocking:
        q = queues.get(key)
        if q is not None and q.policy.overflow is Overflow.REJECT:
            return Overflow.REJECT
    return Overflow.HOLD


def should_signal(queues: Mapping[QueueKey, Policed], blocking: Iterable[QueueKey],
                  client_may: bool) -> bool:
    """Whether a held 0-9-1 publisher is sent Channel.Flow(active=false): a policy saying
    ``signal: none`` forbids it, one saying ``flow`` asks for it, ``auto`` leaves it to what
    the client is known to tolerate (``client_may``). (1.0 links are always told, by their
    credit.)"""
    decision = client_may
    for key in blocking:
        q = queues.get(key)
        if q is None:
            continue
        if q.policy.signal is Signal.NONE:
            return False
        if q.policy.signal is Signal.FLOW:
            decision = True
    return decision


def deadline_of(queues: Mapping[QueueKey, Policed], keys: Iterable[QueueKey]) -> float:
    """Seconds a publisher may wait on ``keys``: the shortest ``deadline`` among their
    policies (the broker alarm and lookups have none: ``DEFAULT_DEADLINE``)."""
    deadlines = [q.policy.deadline for key in keys if (q := queues.get(key)) is not None]
    return min(deadlines, default=DEFAULT_DEADLINE)
