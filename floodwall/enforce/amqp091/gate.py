"""Per-connection publish gate for AMQP 0-9-1: admit, hold, refuse, signal, release.

The core hands every client ``basic.publish`` (with its content header, when it has
arrived) to ``PublishFlow``, which routes it, asks the shared ``FlowController`` whether any
destination queue is tripped, and then either lets it pass untouched, holds it (and every
frame that must stay behind it on that channel) or refuses it as the policy says. Held
frames leave, in channel order, when the controller releases the channel; each held
publish is checked again as it leaves, so a queue that trips again stops the release.

After a publish passed untouched, the publishes of its channel that follow it in the read
with the same arguments are booked at once while none of them could change a decision
(``floodwall.enforce.amqp091.runs``).

Output is a value: frames the proxy sends (a Channel.Flow, a nack, held frames released)
and typed events (``floodwall.enforce.events``) go to ``outbox`` in order; every entry point
that needs the time takes ``now``. The core moves the outbox into its outgoing data.
"""

from __future__ import annotations

from pamqp import commands

from floodwall.control.controller import QueueKey
from floodwall.control.policy import Fsync
from floodwall.enforce import events as ev
from floodwall.enforce.amqp091.channels import (
    BODY_SIZE,
    DEFAULT_HOLD_BUDGET,
    LOOKUP_HOLD_BUDGET,
    PASS_WHILE_HELD,
    ChannelFlow,
    ConfirmNumbers,
    HeldPublish,
    Publish,
    headers_of,
    parse_publish,
)
from floodwall.enforce.amqp091.runs import PublishRuns
from floodwall.enforce.capture import capture_refusal
from floodwall.enforce.decision import (
    PASS,
    Decision,
    Unspoolable,
    Verdict,
    decide,
)
from floodwall.enforce.ports import SpoolRefused
from floodwall.enforce.states import (
    ChannelInput,
    ChannelPhase,
)
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp091.framing import HEADER_SIZE, Buffer, encode_method, frame_at
from floodwall.wire.amqp091.runs import HEADERS_FLAG

_B = commands.Basic
_CH = commands.Channel


class PublishFlow(PublishRuns):
    """The gate for one connection's publishes; asked by its ``amqp091.Connection``
    (``floodwall.wire.amqp091.hooks.PublishHooks``), released and expired by the I/O layer.

    What it makes goes to ``outbox`` (``take_output`` empties it): frames for either peer in
    the order they must leave, ``ForgetChannel``, and typed events.
    """


    # -- client frames -----------------------------------------------------------------
    def on_publish(self, channel: int, buf: Buffer, offset: int, end: int,
                   header_end: int | None, now: float) -> int | None:
        """A basic.publish frame ``buf[offset:end]``.

        ``header_end`` is where its content header ends when that header follows at once
        in ``buf``. Returns None when both pass untouched (the publish was booked on its
        queues), else how far the gate took frames from ``buf`` (held, refused, or the
        method alone while it waits for a header that is not there yet).
        """
        ch = self.channel(channel)
        pub = _publish_of(ch, buf, offset, end)
        if ch.confirms is not None:
            ch.confirms.client_seq += 1
        if header_end is None or ch.closing_by_proxy:
            ch.awaiting = (pub, bytes(buf[offset:end]))
            self._maybe_slow = True
            return end
        took = self._decide(ch, pub, None, buf, offset, end, header_end, now)
        return header_end if took else None

    def _decide(self, ch: ChannelFlow, pub: Publish, method_bytes: bytes | None,
                buf: Buffer, offset: int, header_offset: int, header_end: int,
                now: float) -> bool:
        """Decide a publish once its content header is known; True if the gate took it.

        ``method_bytes`` is the method frame when it already left ``buf`` (it waited for its
        header), else None: the method frame is ``buf[offset:header_offset]``.
        """
        _, _, body_size, flags = BODY_SIZE.unpack_from(buf, header_offset + HEADER_SIZE)
        if ch.closing_by_proxy:
            ch.discard_content = body_size
            self._maybe_slow = True
            return True
        controller = self.controller
        headers = headers_of(buf[header_offset:header_end]) if flags & HEADERS_FLAG else None
        queues = controller.destinations(self.vhost, pub.exchange, pub.routing_key, headers)
        blocking = controller.blocking(self.vhost, queues)
        # Routed somewhere the model knows (the common case): no lookup can be needed.
        lookup = None if (queues and (pub.exchange or pub.routing_key in queues)) else \
            controller.lookup_for(self.vhost, pub.exchange, pub.routing_key, queues, now)
        if lookup is not None:  # the model does not know where it lands: ask first
            blocking = blocking | {lookup}
        would = self._shadow_wait(ch, queues)
        decision = PASS if not blocking and not would and self.spool is None \
            and not ch.holding else self._verdict(ch, pub, queues, blocking, lookup, would)
        verdict = decision.verdict
        if verdict is Verdict.PASS:
            controller.forwarded(self.vhost, queues, body_size, now)
            if ch.confirms is not None:
                ch.confirms.forwarded()
            if method_bytes is not None:  # it waited for its header: it goes first
                self._to_server(method_bytes)
            return False
        if verdict is Verdict.REJECT:
            self._refuse(ch, blocking, body_size, "over capacity (overflow: reject)")
            self.counters.rejects += 1
            return True
        if decision.not_spooled is not None:
            self._not_spooled(ch, queues, decision.not_spooled)
        if method_bytes is None:
            method_bytes = bytes(buf[offset:header_offset])
        header = bytes(buf[header_offset:header_end])
        item = HeldPublish(pub, [method_bytes, header], body_size, 0, queues, now,
                           ch.confirms.client_seq if ch.confirms is not None else 0,
                           decision.spool_to, controller.generation)
        if verdict is Verdict.SPOOL:
            if item.complete:
                self._spool(ch, item, blocking, now)
            else:
                self._capture(ch, item, blocking, now)
            return True
        self._hold(ch, item)
        if blocking:
            self._block(ch, blocking, now)
        return True

    def _verdict(self, ch: ChannelFlow, pub: Publish, queues: frozenset[str],
                 blocking: frozenset[QueueKey], lookup: QueueKey | None,
                 would: frozenset[QueueKey]) -> Decision:
        """``decide`` for a publish that does not pass at once (``_decide`` takes the common
        case, ``decide``'s own first test, without the call); shadow mode recorded."""
        decision = decide(self.vhost, queues, blocking, self.controller.queues, self.spool,
                          lookup=lookup is not None, transactional=ch.transactional,
                          mandatory=pub.mandatory, behind=ch.holding, shadow=would)
        self._shadowed(ch, decision.shadow, would)  # shadow mode: recorded, never acted on
        return decision

    def on_content(self, channel: int, buf: Buffer, offset: int, end: int, now: float) -> bool:
        """A content header or body frame (slow path); True if the gate took it."""
        ch = self.channels.get(channel)
        if ch is None:
            return False
        ftype, _, size = frame_at(buf, offset)
        if ch.awaiting is not None and ftype == 2:
            pub, method_bytes = ch.awaiting
            ch.awaiting = None
            return self._decide(ch, pub, method_bytes, buf, offset, offset, end, now)
        item = ch.filling
        if item is not None and ftype == 3:
            data = bytes(buf[offset:end])
            reserved = max(0, item.body_size - item.received)  # (a capture counted these)
            item.frames.append(data)
            item.received += size
            if item.spool_to is None:
                self._grow(ch, len(data))
            else:
                self._grow(ch, len(data) - min(size, reserved))
                if not item.complete and self.held_bytes > self.hold_budget:
                    self._capture_to_hold(ch, item, "it outgrew the connection's hold budget "
                                          "while assembled for the spool", now)
            if item.complete:
                ch.filling = None
                if item.spool_to is not None:
                    self._spool(ch, item, self.controller.blocking(self.vhost, item.queues),
                                now)
            return True
        if ch.discard_content > 0 and ftype == 3:
            ch.discard_content -= size
            return True
        return False

    def on_method_while_held(self, channel: int, key: int, buf: Buffer, offset: int,
                             end: int) -> bool:
        """Any other client method on a channel with held frames: True if it must wait."""
        ch = self.channels.get(channel)
        if ch is None:
            return False
        if ch.closing_by_proxy:
            if ch.phase is ChannelPhase.BROKER_CLOSE_OK_DUE:
                # The client is done with the channel and opens it again before the broker
                # answered our close: that channel.open waits for the broker's close-ok.
                ch.reopen.append(bytes(buf[offset:end]))
            elif key == _CH.CloseOk.index:  # the client's answer to our close
                self._close_ok(ch, ChannelInput.CLIENT_CLOSE_OK)
            return True  # the spec: frames after a close, other than close-ok, are dropped
        if not ch.held or key in PASS_WHILE_HELD:
            return False
        data = bytes(buf[offset:end])
        ch.held.append(data)
        self._grow(ch, len(data))
        return True

    def hold_connection_close(self, frame: bytes) -> bool:
        """The client's connection.close: True if it must wait behind held publishes."""
        if not self.holding:
            return False
        self._connection_close = frame
        return True

    def on_flow_reply(self, channel: int) -> bool:
        """A channel.flow-ok (or php-amqplib's stray channel.flow): absorb ours."""
        ch = self.channels.get(channel)
        if ch is not None and ch.flow_replies > 0:
            ch.flow_replies -= 1
            return True
        return False

    def on_confirm_select(self, channel: int) -> None:
        ch = self.channel(channel)
        if ch.confirms is None:
            ch.confirms = ConfirmNumbers()

    # -- broker frames -----------------------------------------------------------------
    def on_broker_confirm(self, channel: int, buf: Buffer, offset: int, end: int,
                          nack: bool) -> bool:
        """basic.ack / basic.nack from the broker: renumber when needed. True if replaced."""
        ch = self.channels.get(channel)
        confirms = ch.confirms if ch is not None else None
        if confirms is None or not confirms.renumbering:
            return False
        cls = _B.Nack if nack else _B.Ack
        method = cls()
        method.unmarshal(bytes(buf[offset + HEADER_SIZE + 4 : end - 1]))
        tag = int(method.delivery_tag)
        method.delivery_tag = confirms.to_client(tag)
        if method.multiple:
            confirms.acked_through(tag)
        self._to_client(encode_method(method, channel))
        return True

    # -- spool -------------------------------------------------------------------------
    def _not_spooled(self, ch: ChannelFlow, queues: frozenset[str], why: Unspoolable) -> None:
        """A publish to a spooling queue is held instead: said once per channel."""
        if not ch.not_spooled_reported:
            ch.not_spooled_reported = True
            reason = ("transactional channel" if why is Unspoolable.TRANSACTIONAL
                      else "mandatory publish")
            self.outbox.append(ev.NotSpooled(self._at(ch.channel), next(iter(queues)), reason,
                                          "held"))

    def _spool_limit(self, key: QueueKey) -> int:
        """The queue's ``spool.max_bytes``."""
        q = self.controller.queues.get(key)
        return q.policy.spool.max_bytes if q is not None else 1 << 30

    def _capture(self, ch: ChannelFlow, item: HeldPublish, blocking: frozenset[QueueKey],
                 now: float) -> None:
        """A publish to spool whose body is still to come: its frames are gathered in memory
        (``ch.filling``) and spooled when all are in, if the whole announced message fits
        the spool and, meanwhile, the hold and memory budgets (``capture_refusal``); its
        announced size counts as held from now. Else it is held, as a full spool's is."""
        assert self.spool is not None and item.spool_to is not None
        size = item.nbytes + item.body_size
        why = capture_refusal(self.spool, item.spool_to, size, self._spool_limit(item.spool_to),
                              size, self.held_bytes, self.hold_budget,
                              self.counters.held_bytes, self.shared.memory)
        if why is not None:
            self._spool_fell_back(ch, item, why, blocking, now)
            return
        ch.filling = item  # its body frames come next; spooled when all are in
        self._grow(ch, size)
        self._maybe_slow = True

    def _capture_to_hold(self, ch: ChannelFlow, item: HeldPublish, why: str,
                         now: float) -> None:
        """A capture may not go on (``why``): what came of it is held from now on, and the
        rest of its body with it, as any held publish's (counted as it arrives)."""
        assert item.spool_to is not None
        self._grow(ch, -max(0, item.body_size - item.received))  # no longer reserved
        ch.held.append(item)
        self._account(0, 1)
        self.counters.spool_fallbacks += 1
        self.outbox.append(ev.SpoolFellBack(self._at(ch.channel), item.spool_to[1], why,
                                            "held"))
        key, item.spool_to = item.spool_to, None
        self._block(ch, self.controller.blocking(self.vhost, item.queues) or frozenset({key}),
                    now)

    def _spool_fell_back(self, ch: ChannelFlow, item: HeldPublish, why: str,
                         blocking: frozenset[QueueKey], now: float) -> None:
        """The spool cannot take the publish (``why``): it is held instead."""
        assert item.spool_to is not None
        self.counters.spool_fallbacks += 1
        self.outbox.append(ev.SpoolFellBack(self._at(ch.channel), item.spool_to[1], why,
                                            "held"))
        key, item.spool_to = item.spool_to, None
        self._hold(ch, item)
        self._block(ch, blocking or frozenset({key}), now)

    def _spool(self, ch: ChannelFlow, item: HeldPublish, blocking: frozenset[QueueKey],
               now: float) -> None:
        """Write a complete publish to its queue's spool; hold it if the spool says no. A
        captured one (``_capture``) stops counting as held either way (held, it counts
        again)."""
        assert self.spool is not None and item.spool_to is not None
        key = item.spool_to
        q = self.controller.queues.get(key)
        settings = q.policy.spool if q is not None else None
        record = SpoolRecord(0, 0.0, item.publish.exchange, item.publish.routing_key,
                             bytes(item.frames[1][HEADER_SIZE:-1]),
                             b"".join(f[HEADER_SIZE:-1] for f in item.frames[2:]),
                             item.publish.mandatory)
        if item.body_size:  # captured (its body came after the decision): it was counted
            self._grow(ch, -item.nbytes)
        try:
            seq = self.spool.append(key, record, settings.max_bytes if settings else 1 << 30)
        except SpoolRefused as exc:
            self._spool_fell_back(ch, item, str(exc), blocking, now)
            return
        self.counters.spooled_records += 1
        self.counters.spooled_bytes += record.size
        if ch.confirms is None:
            return
        ch.confirms.answered_by_proxy()  # the broker will never number this one
        if settings is not None and settings.fsync is Fsync.NEVER:
            self._to_client(encode_method(_B.Ack(delivery_tag=item.client_seq), ch.channel))
        else:
            ch.spool_acks.append((key, seq, item.client_seq))

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: ack spooled publishes that are now durable."""
        for ch in self.channels.values():
            acks = ch.spool_acks
            while acks:
                key, seq, client_seq = acks[0]
                if durable.get(key, 0) < seq:
                    break
                acks.popleft()
                self._to_client(encode_method(_B.Ack(delivery_tag=client_seq), ch.channel))

    def on_tx_select(self, channel: int) -> None:
        self.channel(channel).transactional = True




def _publish_of(ch: ChannelFlow, buf: Buffer, offset: int, end: int) -> Publish:
    """The basic.publish frame ``buf[offset:end]`` read, or the channel's last one when its
    arguments are the same bytes (a publisher sends the same exchange and key over and
    over: one comparison instead of a parse)."""
    args = buf[offset + HEADER_SIZE + 4 : end - 1]  # ticket, exchange, routing key, flags
    if type(args) is not bytes:
        args = bytes(args)
    last = ch.last_publish
    if last is not None and last[0] == args:
        return last[1]
    pub = parse_publish(buf, offset)
    ch.last_publish = (args, pub)
    return pub


__all__ = ["DEFAULT_HOLD_BUDGET", "LOOKUP_HOLD_BUDGET", "PASS_WHILE_HELD", "ConfirmNumbers",
           "HeldPublish", "Publish", "PublishFlow", "parse_publish"]
