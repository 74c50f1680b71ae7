"""The 0-9-1 gate's spooling: a publish to a spooling queue written to its spool, whole (its body
gathered in memory first when it comes after the decision), acked when the spool says it is
durable; held instead when the spool cannot take it. A part the gate owns (``PublishFlow``)
when a spool is configured, over its held channels."""

from __future__ import annotations

from pamqp import commands

from floodwall.control.controller import QueueKey
from floodwall.control.policy import Fsync
from floodwall.enforce import events as ev
from floodwall.enforce.amqp091.channels import ChannelFlow, HeldPublish
from floodwall.enforce.amqp091.holding import HeldChannels
from floodwall.enforce.capture import capture_refusal
from floodwall.enforce.decision import Unspoolable
from floodwall.enforce.ports import SpoolPort, SpoolRefused
from floodwall.enforce.shared import GateContext
from floodwall.enforce.states import PublishInput
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp091.framing import HEADER_SIZE, encode_method

_B = commands.Basic


class Spooling:
    """Publishes written to their queue's spool (``overflow: spool``) and their acks."""

    def __init__(self, ctx: GateContext, held: HeldChannels, port: SpoolPort) -> None:
        self.ctx = ctx
        self.held = held
        self.port = port
        self.controller = ctx.controller
        self.counters = ctx.counters
        self.outbox = ctx.outbox

    def not_spooled(self, ch: ChannelFlow, queues: frozenset[str], why: Unspoolable) -> None:
        """A publish to a spooling queue is held instead: said once per channel."""
        if not ch.not_spooled_reported:
            ch.not_spooled_reported = True
            reason = ("transactional channel" if why is Unspoolable.TRANSACTIONAL
                      else "mandatory publish")
            self.outbox.append(ev.NotSpooled(self.held.at(ch.channel), next(iter(queues)),
                                             reason, "held"))

    def _spool_limit(self, key: QueueKey) -> int:
        """The queue's ``spool.max_bytes``."""
        q = self.controller.queues.get(key)
        return q.policy.spool.max_bytes if q is not None else 1 << 30

    def capture(self, ch: ChannelFlow, item: HeldPublish, blocking: frozenset[QueueKey],
                now: float) -> None:
        """A publish to spool whose body is still to come: its frames are gathered in memory
        (``ch.filling``) and spooled when all are in, if the whole announced message fits
        the spool and, meanwhile, the hold and memory budgets (``capture_refusal``); its
        announced size counts as held from now. Else it is held, as a full spool's is."""
        assert item.spool_to is not None
        size = item.nbytes + item.body_size
        why = capture_refusal(self.port, item.spool_to, size, self._spool_limit(item.spool_to),
                              size, self.held.held_bytes, self.ctx.hold_budget,
                              self.counters.held_bytes, self.ctx.shared.memory)
        if why is not None:
            self._spool_fell_back(ch, item, why, blocking, now)
            return
        ch.filling = item  # its body frames come next; spooled when all are in
        self.held.grow(ch, size)
        self.held.move(ch, PublishInput.TAKEN)

    def capture_to_hold(self, ch: ChannelFlow, item: HeldPublish, why: str,
                        now: float) -> None:
        """A capture may not go on (``why``): what came of it is held from now on, and the
        rest of its body with it, as any held publish's (counted as it arrives)."""
        assert item.spool_to is not None
        self.held.grow(ch, -max(0, item.body_size - item.received))  # no longer reserved
        ch.held.append(item)
        self.held.account(0, 1)
        self.counters.spool_fallbacks += 1
        self.outbox.append(ev.SpoolFellBack(self.held.at(ch.channel), item.spool_to[1], why,
                                            "held"))
        key, item.spool_to = item.spool_to, None
        blocking = self.controller.blocking(self.ctx.vhost, item.queues)
        self.held.block(ch, blocking or frozenset({key}), now)

    def _spool_fell_back(self, ch: ChannelFlow, item: HeldPublish, why: str,
                         blocking: frozenset[QueueKey], now: float) -> None:
        """The spool cannot take the publish (``why``): it is held instead."""
        assert item.spool_to is not None
        self.counters.spool_fallbacks += 1
        self.outbox.append(ev.SpoolFellBack(self.held.at(ch.channel), item.spool_to[1], why,
                                            "held"))
        key, item.spool_to = item.spool_to, None
        self.held.hold(ch, item)
        self.held.block(ch, blocking or frozenset({key}), now)

    def spool(self, ch: ChannelFlow, item: HeldPublish, blocking: frozenset[QueueKey],
              now: float) -> None:
        """Write a complete publish to its queue's spool; hold it if the spool says no. A
        captured one (``capture``) stops counting as held either way (held, it counts
        again)."""
        assert item.spool_to is not None
        key = item.spool_to
        q = self.controller.queues.get(key)
        settings = q.policy.spool if q is not None else None
        record = SpoolRecord(0, 0.0, item.publish.exchange, item.publish.routing_key,
                             bytes(item.frames[1][HEADER_SIZE:-1]),
                             b"".join(f[HEADER_SIZE:-1] for f in item.frames[2:]),
                             item.publish.mandatory)
        if item.body_size:  # captured (its body came after the decision): it was counted
            self.held.grow(ch, -item.nbytes)
        try:
            seq = self.port.append(key, record, settings.max_bytes if settings else 1 << 30)
        except SpoolRefused as exc:
            self._spool_fell_back(ch, item, str(exc), blocking, now)
            return
        self.counters.spooled_records += 1
        self.counters.spooled_bytes += record.size
        if ch.confirms is None:
            return
        ch.confirms.answered_by_proxy()  # the broker will never number this one
        if settings is not None and settings.fsync is Fsync.NEVER:
            self.ctx.to_client(encode_method(_B.Ack(delivery_tag=item.client_seq), ch.channel))
        else:
            ch.spool_acks.append((key, seq, item.client_seq))

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: ack spooled publishes that are now durable."""
        for ch in self.held.channels.values():
            acks = ch.spool_acks
            while acks:
                key, seq, client_seq = acks[0]
                if durable.get(key, 0) < seq:
                    break
                acks.popleft()
                self.ctx.to_client(encode_method(_B.Ack(delivery_tag=client_seq), ch.channel))
