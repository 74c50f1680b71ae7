"""The 1.0 credit gate's held messages: on a per-message link (null target, ``/exchange/X``,
``/queue``) under ``overflow: hold``, a message bound for a tripped queue, or for a queue with
messages of this connection held or in flight before it, is consumed by the proxy and kept in
memory in the queue's FIFO (``HeldQueue``), unsettled; the link keeps its credit for its other
messages. When the controller admits or releases the queue the messages go, in order, as
``SendHeld`` commands (the I/O layer sends them through the proxy's own 1.0 sender to the same
address), and the broker's outcome for each reaches the client as one disposition for its
original delivery-id (``settled``); nothing for a delivery sent settled.

A queue's FIFO waits in the controller as a 0-9-1 channel does: under a ref of its own
(``HELD_REF_BASE`` + n, above every ``link_ref``), given tokens (``ChannelAdmitted``) while
the queue is tripped and freed (``ChannelFreed``) when it drains.

Bounds: a link's held bytes (``SenderLink.held_bytes``, held or sent and not yet settled by
the broker) reach its window (``policy_window``) and its credit is withheld as under the
per-link hold until they are below it again (``after_transfer``); what it still had credit
for is held too, so a link holds at most about two windows. Held bytes count as the
connection's held bytes (the hold budget, the memory budget): a message that does not fit
them is settled ``rejected`` (amqp:resource-limit-exceeded) at once. A message held past its
policy's ``deadline`` is settled ``rejected`` (amqp:resource-limit-exceeded, naming the queue),
counted in ``deadline_expiries``. A link that goes (detached, its session ended, the
connection lost) loses its held messages not yet sent: the client never got an outcome for
them; the outcome of one already sent is not told (its link is gone).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final, Protocol

from floodwall.control.controller import QueueKey
from floodwall.enforce import events as ev
from floodwall.enforce.amqp10.links import SenderLink, SessionGate, rejected_outcome
from floodwall.enforce.amqp10.outcomes import BrokerOutcomes
from floodwall.enforce.commands import SendHeld
from floodwall.enforce.decision import deadline_of
from floodwall.enforce.shared import GateContext
from floodwall.wire.amqp10.types import Described

HELD_REF_BASE: Final = 1 << 48
"""Controller refs of a connection's held queues start here (a ``link_ref`` is below 2^48)."""


class Sessions(Protocol):
    """What the held messages need of the gate's sessions part (``amqp10.sessions``)."""

    @property
    def sessions(self) -> dict[int, SessionGate]: ...

    @property
    def captured_bytes(self) -> int: ...

    def at(self, link: SenderLink) -> ev.At: ...

    def settle(self, session: SessionGate, first: int, last: int, state: Described) -> None: ...


@dataclass(eq=False, slots=True)
class HeldMessage:
    """One consumed delivery: whose it is, where it goes, what it is."""

    token: int  # the connection's number for it (``SendHeld.token``)
    link: SenderLink
    delivery_id: int | None  # the client's; None: sent settled (no outcome told)
    address: str  # the message's ``to`` (null target), else the link's target
    message_format: int
    payload: bytes  # its encoded sections, as the client sent them
    since: float


@dataclass(eq=False, slots=True)
class HeldQueue:
    """One queue's held messages of this connection: waiting (FIFO), and sent, not settled."""

    key: QueueKey
    ref: int  # its ref in the controller while it waits there
    waiting: deque[HeldMessage] = field(default_factory=deque)
    sending: dict[int, HeldMessage] = field(default_factory=dict)  # by token
    bytes: int = 0  # of both


@dataclass(frozen=True, slots=True)
class HeldView:
    """One queue's held messages as ``/state`` shows them."""

    queue: str
    waiting: int
    sending: int
    bytes: int

    def as_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}


class HeldMessages:
    """A connection's held 1.0 messages, per queue (``HeldQueue``)."""

    def __init__(self, ctx: GateContext, lifecycle: Sessions, outcomes: BrokerOutcomes) -> None:
        self.ctx = ctx
        self.lifecycle = lifecycle
        self.outcomes = outcomes
        self.queues: dict[QueueKey, HeldQueue] = {}
        self.by_ref: dict[int, HeldQueue] = {}
        self.by_token: dict[int, HeldQueue] = {}  # sent, not settled
        self.bytes = 0
        self._next_token = 0

    # -- what the gate asks -----------------------------------------------------------------
    def behind(self, names: frozenset[str]) -> QueueKey | None:
        """The queue among ``names`` with messages of this connection held or in flight
        (a message to it goes behind them), or None."""
        if not self.queues:
            return None
        vhost = self.ctx.vhost
        for name in names:
            if (vhost, name) in self.queues:
                return vhost, name
        return None

    def refusal(self, size: int) -> str | None:
        """Why a message of ``size`` bytes may not be held now (the hold budget, the memory
        budget's resume level), or None."""
        ctx = self.ctx
        conn_held = self.bytes + self.lifecycle.captured_bytes
        if ctx.hold_budget and conn_held + size > ctx.hold_budget:
            return f"the connection's hold budget ({ctx.hold_budget} bytes) is full"
        memory = ctx.shared.memory
        if memory is not None and ctx.counters.held_bytes + size > memory.resume:
            return f"the memory budget ({memory.limit} bytes) is full"
        return None

    def hold(self, session: SessionGate, link: SenderLink, key: QueueKey, delivery_id: int | None,
             address: str, message_format: int, payload: bytes, now: float) -> None:
        """Keep the message for ``key``: it waits behind what is held there, and in the
        controller while the queue is tripped."""
        hq = self.queues.get(key)
        if hq is None:
            hq = HeldQueue(key, HELD_REF_BASE + self._next_token)
            self.queues[key] = hq
            self.by_ref[hq.ref] = hq
        token = self._next_token
        self._next_token += 1
        hq.waiting.append(HeldMessage(token, link, delivery_id, address, message_format,
                                      payload, now))
        self._account(hq, link, len(payload), 1)
        if len(hq.waiting) == 1:
            self._send(hq, now)

    # -- the controller ------------------------------------------------------------------
    def released(self, ref: int, now: float) -> None:
        """The controller freed or admitted the held queue of ``ref``: send what it takes."""
        hq = self.by_ref.get(ref)
        if hq is not None:
            self._send(hq, now)

    def _send(self, hq: HeldQueue, now: float) -> None:
        """Hand the I/O layer the queue's waiting messages while the controller lets them
        go (not tripped, or admitted by its tokens); block the queue's ref on it else."""
        ctx, controller = self.ctx, self.ctx.controller
        names = frozenset((hq.key[1],))
        while hq.waiting:
            blocking = controller.blocking(ctx.vhost, names)
            if blocking and not controller.admits(blocking, now):
                controller.block(ctx.conn_id, hq.ref, blocking, now)
                if controller.is_blocked(ctx.conn_id, hq.ref):
                    return
                continue  # released in the same breath: look again
            message = hq.waiting.popleft()
            hq.sending[message.token] = message
            self.by_token[message.token] = hq
            controller.forwarded(ctx.vhost, names, len(message.payload), now)
            ctx.outbox.append(SendHeld(message.token, ctx.vhost, message.address,
                                       message.message_format, message.payload))
        if not hq.sending:
            self._forget(hq)

    # -- the broker's outcome -----------------------------------------------------------
    def settled(self, token: int, state: Described, now: float) -> SenderLink | None:
        """The broker settled the held message ``token`` with ``state`` (an outcome): told
        to the client once, for its delivery-id. Returns its link when that may have credit
        again (its held bytes fell below its window)."""
        hq = self.by_token.pop(token, None)
        if hq is None:
            return None
        message = hq.sending.pop(token)
        link = message.link
        was_full = link.held_bytes >= link.policy_bytes
        self._account(hq, link, -len(message.payload), -1)
        if not hq.waiting and not hq.sending:
            self._forget(hq)
        session = self._session_of(link)
        if session is None:
            return None
        if message.delivery_id is not None:
            self.lifecycle.settle(session, message.delivery_id, message.delivery_id, state)
            self.outcomes.settled(session.channel, state, message.delivery_id,
                                  message.delivery_id, now)
        return link if was_full and link.held_bytes < link.policy_bytes else None

    # -- deadlines, links that go -----------------------------------------------------------
    def expire(self, now: float) -> list[SenderLink]:
        """Settle ``rejected`` the messages held past their policy's deadline; returns the
        links that may have credit again."""
        freed: list[SenderLink] = []
        controller = self.ctx.controller
        for hq in list(self.queues.values()):
            deadline = deadline_of(controller.queues, (hq.key,))
            while hq.waiting and now - hq.waiting[0].since >= deadline:
                message = hq.waiting.popleft()
                link = message.link
                was_full = link.held_bytes >= link.policy_bytes
                self._account(hq, link, -len(message.payload), -1)
                self._expired(hq.key[1], message, deadline, now)
                if was_full and link.held_bytes < link.policy_bytes:
                    freed.append(link)
            if not hq.waiting and not hq.sending:
                self._forget(hq)
        return freed

    def _expired(self, queue: str, message: HeldMessage, deadline: float, now: float) -> None:
        ctx = self.ctx
        ctx.counters.deadline_expiries += 1
        why = f"still over capacity after the {deadline:g}s deadline"
        ctx.outbox.append(ev.DeadlineExpired(
            self.lifecycle.at(message.link), (queue,), why, ev.Answer.REJECTED,
            len(message.payload), round(now - message.since, 3)))
        session = self._session_of(message.link)
        if session is not None and message.delivery_id is not None:
            self.lifecycle.settle(
                session, message.delivery_id, message.delivery_id, rejected_outcome(
                    f"floodwall: queue '{queue}' {why}: the message was held "
                    f"{now - message.since:.1f}s"))

    def link_gone(self, link: SenderLink) -> None:
        """``link`` is gone: its messages not sent yet are dropped (no outcome was told)."""
        if not link.held_bytes:
            return
        for hq in list(self.queues.values()):
            kept = deque(m for m in hq.waiting if m.link is not link)
            for message in hq.waiting:
                if message.link is link:
                    self._account(hq, link, -len(message.payload), -1)
            hq.waiting = kept
            if not hq.waiting and not hq.sending:
                self._forget(hq)

    def close(self) -> None:
        """The connection is gone: nothing of it is held (the controller forgot its refs)."""
        for hq in self.queues.values():
            for message in [*hq.waiting, *hq.sending.values()]:
                self._account(hq, message.link, -len(message.payload), -1)
        self.queues.clear()
        self.by_ref.clear()
        self.by_token.clear()

    def views(self) -> list[HeldView]:
        """Each queue's held messages (``/state``)."""
        return [HeldView(hq.key[1], len(hq.waiting), len(hq.sending), hq.bytes)
                for hq in self.queues.values()]

    # -- bookkeeping ----------------------------------------------------------------------
    def _account(self, hq: HeldQueue, link: SenderLink, n: int, messages: int) -> None:
        hq.bytes += n
        link.held_bytes += n
        self.bytes += n
        counters = self.ctx.counters
        counters.held_bytes += n
        counters.held_messages += messages

    def _forget(self, hq: HeldQueue) -> None:
        """Nothing of the queue is held or in flight: its FIFO and its wait end."""
        self.queues.pop(hq.key, None)
        self.by_ref.pop(hq.ref, None)
        ctx = self.ctx
        if ctx.controller.is_blocked(ctx.conn_id, hq.ref):
            ctx.controller.channel_closed(ctx.conn_id, hq.ref)

    def _session_of(self, link: SenderLink) -> SessionGate | None:
        """The session of ``link`` while the link is still the client's."""
        session = self.lifecycle.sessions.get(link.channel)
        if session is None or session.links.get(link.handle) is not link:
            return None
        return session
