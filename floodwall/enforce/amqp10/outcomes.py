"""The broker's outcomes for a connection's deliveries, counted: what RabbitMQ settled the
client's transfers with (``accepted``, ``released``, ``rejected``, ``modified``).

The broker's dispositions (role receiver) reach the client unchanged (renumbered only where
the proxy consumed deliveries); this part only counts them, per connection (``counts``, in
``/state``) and per process (``GateCounters.outcomes``: ``floodwall_amqp10_outcomes_total``).
A disposition settles a range of delivery-ids with one state, so a range is counted at once
(its ids, not per id). A ``rejected`` outcome's error (RabbitMQ 4.3 names the queue and the
reason in its info map) becomes a ``BrokerRejected`` event, at most one per connection per
``REJECT_EVENT_INTERVAL`` seconds, carrying how many deliveries were rejected since the last.

What is counted is ids, as the broker's ranges name them: a broker that settles an id twice
(RabbitMQ 3.10 re-covers ids in a later range at times) counts it twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from floodwall.enforce import events as ev
from floodwall.enforce.shared import GateContext
from floodwall.wire.amqp10.performatives import TRANSACTIONAL_STATE, Outcome
from floodwall.wire.amqp10.types import Described, Symbol

REJECT_EVENT_INTERVAL: Final = 1.0
"""Seconds between two ``BrokerRejected`` events of one connection (the rest are counted
into the next one)."""
_MASK: Final = 0xFFFFFFFF
_FIRST: Final = min(Outcome)
_LAST: Final = max(Outcome)


def counted(state: int) -> bool:
    """Whether a state code is an outcome counted (``Outcome``)."""
    return _FIRST <= state <= _LAST


class BrokerOutcomes:
    """One connection's count of the broker's outcomes, and its reject events."""

    __slots__ = ("counts", "ctx", "last_event", "rejected_since", "total")

    def __init__(self, ctx: GateContext) -> None:
        self.ctx = ctx
        self.counts: Counter[int] = Counter()  # by Outcome code: this connection's
        self.total = ctx.counters.outcomes  # the process'
        self.last_event = -REJECT_EVENT_INTERVAL  # when the last BrokerRejected was made
        self.rejected_since = 0  # rejected deliveries not told in an event yet

    def count(self, state: int, first: int, last: int) -> None:
        """The broker settled ``first``..``last`` with ``state`` (a counted ``Outcome``)."""
        n = ((last - first) & _MASK) + 1
        self.counts[state] += n
        self.total[state] += n

    def settled(self, session: int, state: object, first: int, last: int, now: float) -> None:
        """A decoded disposition's state (a transactional state's outcome counts as that
        outcome): counted; a ``rejected`` one told (``BrokerRejected``, rate-limited)."""
        if not isinstance(state, Described):
            return
        code = state.descriptor
        if code == TRANSACTIONAL_STATE and isinstance(state.value, list) \
                and len(state.value) > 1 and isinstance(state.value[1], Described):
            state = state.value[1]
            code = state.descriptor
        if not isinstance(code, int) or not counted(code):
            return
        self.count(code, first, last)
        if code == Outcome.REJECTED:
            self.rejected_since += ((last - first) & _MASK) + 1
            if now - self.last_event >= REJECT_EVENT_INTERVAL:
                self._tell_rejected(session, state, first, last, now)

    def _tell_rejected(self, session: int, state: Described, first: int, last: int,
                       now: float) -> None:
        condition, description, info = rejected_error(state)
        self.ctx.outbox.append(ev.BrokerRejected(
            self.ctx.conn_id, self.ctx.vhost, session, first, last, self.rejected_since,
            condition, description, _text(info.get("queue")), _text(info.get("reason"))))
        self.last_event = now
        self.rejected_since = 0

    def as_dict(self) -> dict[str, int]:
        """The counts by outcome name (``/state``)."""
        return {o.label: self.counts[o] for o in Outcome}


def rejected_error(state: Described) -> tuple[str, str, dict[str, object]]:
    """A ``rejected`` state's error: its condition, description and info map (keys as
    text); empty where absent or not of the spec's types."""
    fields = state.value if isinstance(state.value, list) else []
    error = fields[0] if fields else None
    if not isinstance(error, Described) or not isinstance(error.value, list):
        return "", "", {}
    parts = [*error.value, None, None, None]
    info = parts[2] if isinstance(parts[2], dict) else {}
    return (_text(parts[0]) or "", _text(parts[1]) or "",
            {str(k): v for k, v in info.items()})


def _text(value: object) -> str | None:
    """A symbol or string as text; None for anything else."""
    if isinstance(value, (str, Symbol)):
        return str(value)
    return None
