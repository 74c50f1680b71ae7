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

from typing import Final

from pamqp import commands

from floodwall.control.controller import QueueKey
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
from floodwall.enforce.amqp091.holding import HeldChannels
from floodwall.enforce.amqp091.refusals import Refusals
from floodwall.enforce.amqp091.runs import PublishRuns
from floodwall.enforce.amqp091.spooling import Spooling
from floodwall.enforce.commands import Outbox
from floodwall.enforce.decision import (
    PASS,
    Decision,
    Verdict,
    decide,
)
from floodwall.enforce.shadow import ShadowRecorder
from floodwall.enforce.shared import Enforcement, GateContext
from floodwall.enforce.states import (
    ChannelInput,
    ChannelPhase,
    PublishInput,
    PublishPhase,
)
from floodwall.wire.amqp091.errors import UnexpectedFrame
from floodwall.wire.amqp091.framing import HEADER_SIZE, Buffer, encode_method, frame_at
from floodwall.wire.amqp091.runs import HEADERS_FLAG

_B = commands.Basic
_CH = commands.Channel
_NOTHING: frozenset[QueueKey] = frozenset()


class PublishFlow:
    """The gate for one connection's publishes; asked by its ``amqp091.Connection``
    (``floodwall.wire.amqp091.hooks.PublishHooks``), released and expired by the I/O layer.

    It decides each publish and owns the parts that act on the decisions, each handed the
    one ``GateContext`` (the process' enforcement, the connection, the outbox): the channel
    table and what it holds (``HeldChannels``), refusals (``Refusals``), runs
    (``PublishRuns``), the spool (``Spooling``, with ``--spool-dir``) and shadow mode
    (``ShadowRecorder``). What it makes goes to ``outbox`` (``take_output`` empties it): frames
    for either peer in the order they must leave, ``ForgetChannel``, and typed events.
    """

    def __init__(self, shared: Enforcement, conn_id: int,
                 hold_budget: int = DEFAULT_HOLD_BUDGET) -> None:
        ctx = self.ctx = GateContext(shared, conn_id, hold_budget)
        self.controller = ctx.controller
        self.counters = ctx.counters
        self.outbox: Outbox = ctx.outbox
        held = self.held = HeldChannels(ctx)
        self.channels = held.channels
        self.refusals = Refusals(ctx, held)
        self.runs = PublishRuns(ctx, held)
        self.spooling = None if ctx.spool is None else Spooling(ctx, held, ctx.spool)
        self.shadow = ShadowRecorder(ctx)
        # The hooks the core calls for a run of publishes, or per content frame of a held
        # channel, are the parts' own methods, bound once here (no delegating call each).
        self.publish_run = self.runs.publish_run
        self.on_publish_run = self.runs.on_publish_run
        self.hold_run = self.runs.hold_run
        self.on_hold_run = self.runs.on_hold_run
        self.channel_released = held.channel_released
        self.expire = self.refusals.expire
        self.on_broker_close_ok = self.refusals.on_broker_close_ok
        self.on_channel_gone = held.on_channel_gone
        self.client_identified = held.client_identified

    # -- what the I/O layer and the core ask ------------------------------------------------
    def take_output(self) -> Outbox:
        """What the gate made since the last call, in order; the outbox is empty after."""
        return self.ctx.take_output()

    def vhost_opened(self, vhost: str) -> None:
        self.ctx.vhost = vhost

    @property
    def vhost(self) -> str:
        return self.ctx.vhost

    @property
    def hold_budget(self) -> int:
        return self.ctx.hold_budget

    @property
    def slow_channels(self) -> frozenset[int]:
        return self.held.slow_channels

    @property
    def held_bytes(self) -> int:
        return self.held.held_bytes

    @property
    def holding(self) -> bool:
        return self.held.holding

    @property
    def over_budget(self) -> bool:
        return self.held.over_budget

    @property
    def waiting_for_lookup(self) -> bool:
        return self.held.waiting_for_lookup

    @property
    def may_signal(self) -> bool:
        return self.held.may_signal

    def channel_admitted(self, channel: int, now: float) -> None:
        """The controller: a held queue this channel waits on has tokens
        (``floodwall.control.admission``): held publishes go while it admits them; the
        channel stays blocked (no Channel.Flow, its hold goes on)."""
        self.held.channel_released(channel, now)

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: ack spooled publishes that are now durable."""
        if self.spooling is not None:
            self.spooling.spool_durable(durable)

    def close(self) -> None:
        self.held.close()

    # -- client frames -----------------------------------------------------------------
    def on_publish(self, channel: int, buf: Buffer, offset: int, end: int,
                   header_end: int | None, now: float) -> int | None:
        """A basic.publish frame ``buf[offset:end]``.

        ``header_end`` is where its content header ends when that header follows at once
        in ``buf``. Returns None when both pass untouched (the publish was booked on its
        queues), else how far the gate took frames from ``buf`` (held, refused, or the
        method alone while it waits for a header that is not there yet).
        """
        ch = self.held.channel(channel)
        if ch.publish is not PublishPhase.READY:
            raise _amid_content(ch, "basic.publish", offset)
        pub = _publish_of(ch, buf, offset, end)
        if ch.confirms is not None:
            ch.confirms.client_seq += 1
        if header_end is None or ch.closing_by_proxy:
            ch.awaiting = (pub, bytes(buf[offset:end]))
            self.held.move(ch, PublishInput.METHOD_ALONE)
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
        if ch.closing_by_proxy:  # its content is dropped, as the channel's every frame
            if body_size:
                ch.discard_content = body_size
                self.held.move(ch, PublishInput.DROPPED)
            return True
        controller = self.controller
        vhost = self.ctx.vhost
        headers = headers_of(buf[header_offset:header_end]) if flags & HEADERS_FLAG else None
        queues = controller.destinations(vhost, pub.exchange, pub.routing_key, headers)
        blocking = controller.blocking(vhost, queues)
        # Routed somewhere the model knows (the common case): no lookup can be needed.
        lookup = None if (queues and (pub.exchange or pub.routing_key in queues)) else \
            controller.lookup_for(vhost, pub.exchange, pub.routing_key, queues, now)
        if lookup is not None:  # the model does not know where it lands: ask first
            blocking = blocking | {lookup}
        would = self._shadow_wait(ch, queues)
        spooling = self.spooling
        decision = PASS if not blocking and not would and spooling is None \
            and not ch.holding else self._verdict(ch, pub, queues, blocking, lookup, would)
        verdict = decision.verdict
        if verdict is Verdict.PASS:
            controller.forwarded(vhost, queues, body_size, now)
            if ch.confirms is not None:
                ch.confirms.forwarded()
            if method_bytes is not None:  # it waited for its header: it goes first
                self.ctx.to_server(method_bytes)
            return False
        if verdict is Verdict.REJECT:
            self.refusals.refuse(ch, blocking, body_size, "over capacity (overflow: reject)")
            self.counters.rejects += 1
            return True
        if decision.not_spooled is not None:
            assert spooling is not None
            spooling.not_spooled(ch, queues, decision.not_spooled)
        if method_bytes is None:
            method_bytes = bytes(buf[offset:header_offset])
        header = bytes(buf[header_offset:header_end])
        item = HeldPublish(pub, [method_bytes, header], body_size, 0, queues, now,
                           ch.confirms.client_seq if ch.confirms is not None else 0,
                           decision.spool_to, controller.generation)
        if verdict is Verdict.SPOOL:
            assert spooling is not None
            if item.complete:
                spooling.spool(ch, item, blocking, now)
            else:
                spooling.capture(ch, item, blocking, now)
            return True
        self.held.hold(ch, item)
        if blocking:
            self.held.block(ch, blocking, now)
        return True

    def _verdict(self, ch: ChannelFlow, pub: Publish, queues: frozenset[str],
                 blocking: frozenset[QueueKey], lookup: QueueKey | None,
                 would: frozenset[QueueKey]) -> Decision:
        """``decide`` for a publish that does not pass at once (``_decide`` takes the common
        case, ``decide``'s own first test, without the call); shadow mode recorded."""
        decision = decide(self.ctx.vhost, queues, blocking, self.controller.queues,
                          self.ctx.spool, lookup=lookup is not None,
                          transactional=ch.transactional, mandatory=pub.mandatory,
                          behind=ch.holding, shadow=would)
        if decision.shadow is not None:  # shadow mode: recorded, never acted on
            self.shadow.would_have(self.held.at(ch.channel), ch.shadow, decision.shadow, would,
                                   self.held.may_signal)
        return decision

    def _shadow_wait(self, ch: ChannelFlow, queues: frozenset[str]) -> frozenset[QueueKey]:
        """The shadow queues a publish on ``ch`` to ``queues`` would wait on."""
        if not ch.shadow.on and not self.controller.trips.shadow:
            return _NOTHING
        return self.shadow.would_wait_on(self.held.at(ch.channel), ch.shadow, queues)

    def on_content(self, channel: int, buf: Buffer, offset: int, end: int, now: float) -> bool:
        """A content header or body frame (slow path); True if the gate took it."""
        ch = self.channels.get(channel)
        if ch is None:
            return False
        ftype, _, size = frame_at(buf, offset)
        phase = ch.publish
        if phase is PublishPhase.READY:
            return False  # (a content frame without its method: the broker refuses it)
        if (ftype == 2) is not (phase is PublishPhase.AWAITING_HEADER):
            raise _amid_content(ch, "content header" if ftype == 2 else "content body", offset)
        if phase is PublishPhase.AWAITING_HEADER:
            assert ch.awaiting is not None
            pub, method_bytes = ch.awaiting
            ch.awaiting = None
            ch.move(PublishInput.HEADER_CAME)
            return self._decide(ch, pub, method_bytes, buf, offset, offset, end, now)
        if phase is PublishPhase.FILLING:
            self._fill(ch, buf, offset, end, size, now)
            return True
        ch.discard_content -= size  # DISCARDING
        if ch.discard_content <= 0:
            ch.discard_content = 0
            ch.move(PublishInput.CONTENT_DONE)
        return True

    def _fill(self, ch: ChannelFlow, buf: Buffer, offset: int, end: int, size: int,
              now: float) -> None:
        """A body frame of the publish the channel is filling (held, or captured for the
        spool, which writes it once whole)."""
        item = ch.filling
        assert item is not None
        held = self.held
        data = bytes(buf[offset:end])
        reserved = max(0, item.body_size - item.received)  # (a capture counted these)
        item.frames.append(data)
        item.received += size
        if item.spool_to is None:
            held.grow(ch, len(data))
        else:
            held.grow(ch, len(data) - min(size, reserved))
            if not item.complete and held.held_bytes > self.ctx.hold_budget:
                assert self.spooling is not None
                self.spooling.capture_to_hold(ch, item, "it outgrew the connection's hold "
                                              "budget while assembled for the spool", now)
        if item.complete:
            ch.filling = None
            ch.move(PublishInput.CONTENT_DONE)
            if item.spool_to is not None:
                assert self.spooling is not None
                blocking = self.controller.blocking(self.ctx.vhost, item.queues)
                self.spooling.spool(ch, item, blocking, now)

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
                self.refusals.close_ok(ch, ChannelInput.CLIENT_CLOSE_OK)
            return True  # the spec: frames after a close, other than close-ok, are dropped
        if ch.publish is not PublishPhase.READY:
            raise _amid_content(ch, "method", offset)
        if not ch.held or key in PASS_WHILE_HELD:
            return False
        data = bytes(buf[offset:end])
        ch.held.append(data)
        self.held.grow(ch, len(data))
        return True

    def hold_connection_close(self, frame: bytes) -> bool:
        """The client's connection.close: True if it must wait behind held publishes."""
        if not self.held.holding:
            return False
        self.held.connection_close = frame
        return True

    def on_flow_reply(self, channel: int) -> bool:
        """A channel.flow-ok (or php-amqplib's stray channel.flow): absorb ours."""
        ch = self.channels.get(channel)
        if ch is not None and ch.flow_replies > 0:
            ch.flow_replies -= 1
            return True
        return False

    def on_confirm_select(self, channel: int) -> None:
        ch = self.held.channel(channel)
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
        self.ctx.to_client(encode_method(method, channel))
        return True

    def on_tx_select(self, channel: int) -> None:
        self.held.channel(channel).transactional = True


def _amid_content(ch: ChannelFlow, what: str, offset: int) -> UnexpectedFrame:
    """A frame the channel's publish phase does not take: the spec's 505 (the broker answers
    it the same way; the proxy answers first, as it holds or reads that content)."""
    return UnexpectedFrame(f"{what} frame on channel {ch.channel} while "
                           f"{_EXPECTED[ch.publish]}", offset)


_EXPECTED: Final = {
    PublishPhase.AWAITING_HEADER: "its publish's content header is due",
    PublishPhase.FILLING: "its publish's content body is due",
    PublishPhase.DISCARDING: "its publish's content body is due",
}


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
