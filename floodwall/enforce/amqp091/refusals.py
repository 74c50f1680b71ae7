"""The 0-9-1 gate's refusals: a publish answered by the proxy (basic.nack in confirm mode, else
a 406 channel.close on both sides, whose close-oks it absorbs) under ``overflow: reject`` or
past its deadline. A part the gate owns (``PublishFlow``), over its held channels."""

from __future__ import annotations

from pamqp import commands

from floodwall.control.controller import QueueKey
from floodwall.enforce import events as ev
from floodwall.enforce.amqp091.channels import (
    ChannelFlow,
    HeldPublish,
)
from floodwall.enforce.amqp091.holding import HeldChannels
from floodwall.enforce.commands import ForgetChannel
from floodwall.enforce.decision import (
    deadline_of,
)
from floodwall.enforce.shared import GateContext
from floodwall.enforce.states import (
    CHANNEL_PHASES,
    ChannelInput,
    ChannelPhase,
    PublishInput,
    step,
)
from floodwall.wire.amqp091.framing import encode_method

_B = commands.Basic
_CH = commands.Channel


class Refusals:
    """Refusals and the proxy's own channel closes."""

    def __init__(self, ctx: GateContext, held: HeldChannels) -> None:
        self.ctx = ctx
        self.held = held
        self.counters = ctx.counters
        self.outbox = ctx.outbox

    # -- refusals ----------------------------------------------------------------------
    def refuse(self, ch: ChannelFlow, blocking: frozenset[QueueKey], body_size: int,
               why: str) -> None:
        """Answer a publish the proxy will not forward: nack it, or close the channel."""
        names = ",".join(q for _, q in sorted(blocking)) or "?"
        if ch.confirms is not None:
            nack = _B.Nack(delivery_tag=ch.confirms.client_seq)
            self.ctx.to_client(encode_method(nack, ch.channel))
            ch.confirms.answered_by_proxy()
            self._drop_content(ch, body_size)
            self.outbox.append(ev.Refused(self.held.at(ch.channel), blocking, why,
                                          ev.Answer.NACK, body_size))
            return
        self.close_channel(ch, f"PRECONDITION_FAILED - floodwall: queue '{names}' {why}")
        self.outbox.append(ev.Refused(self.held.at(ch.channel), blocking, why,
                                      ev.Answer.CHANNEL_CLOSE, body_size))
        self._drop_content(ch, body_size)

    def _drop_content(self, ch: ChannelFlow, body_size: int) -> None:
        """The refused publish's body, ``body_size`` bytes still to come, is dropped."""
        if body_size:
            ch.discard_content = body_size
            self.held.move(ch, PublishInput.DROPPED)

    def close_channel(self, ch: ChannelFlow, text: str) -> None:
        """Close a channel on both sides: 406 to the client, a plain close to the broker."""
        held = self.held
        self.outbox.append(ev.EndedByProxy(held.at(ch.channel), text))
        dropped = [i for i in ch.held if isinstance(i, HeldPublish)]
        held.account(-ch.held_bytes, -len(dropped))
        ch.held.clear()
        ch.held_bytes = 0
        if ch.filling is not None:  # the rest of its body (FILLING: some is due) is dropped
            ch.discard_content = ch.filling.body_size - ch.filling.received
            ch.filling = None
        held.move(ch, PublishInput.PROXY_CLOSES)
        ch.phase = step(CHANNEL_PHASES, ch.phase, ChannelInput.PROXY_CLOSES) or ch.phase
        held.waiting_lookup.discard(ch.channel)
        self.ctx.controller.channel_closed(self.ctx.conn_id, ch.channel)
        reply = text.encode()[:255].decode("utf-8", "ignore")
        to_client = _CH.Close(reply_code=406, reply_text=reply, class_id=60, method_id=40)
        to_server = _CH.Close(reply_code=200, class_id=0, method_id=0,
                              reply_text="floodwall: channel closed for its client")
        self.ctx.to_client(encode_method(to_client, ch.channel))
        self.ctx.to_server(encode_method(to_server, ch.channel))

    def expire(self, now: float) -> int:
        """Refuse publishes held longer than their policy's deadline; returns how many."""
        refused = 0
        for ch in list(self.held.channels.values()):
            while ch.held and not ch.closing_by_proxy:
                item = ch.held[0]
                if not isinstance(item, HeldPublish):
                    break
                deadline = self._deadline_of(item)
                if now - item.held_at < deadline:
                    break
                refused += 1
                self.counters.deadline_expiries += 1
                why = f"still over capacity after the {deadline:g}s deadline"
                answer = ev.Answer.NACK if ch.confirms is not None and item.complete \
                    else ev.Answer.CHANNEL_CLOSE
                self.outbox.append(ev.DeadlineExpired(
                    self.held.at(ch.channel), tuple(sorted(item.queues)), why, answer,
                    item.body_size, round(now - item.held_at, 3)))
                if ch.confirms is not None and item.complete:
                    ch.held.popleft()
                    nbytes = item.nbytes
                    ch.held_bytes -= nbytes
                    self.held.account(-nbytes, -1)
                    # Its client number, whatever was forwarded before it.
                    nack = _B.Nack(delivery_tag=item.client_seq)
                    self.ctx.to_client(encode_method(nack, ch.channel))
                    ch.confirms.answered_by_proxy()
                    continue
                names = ",".join(sorted(item.queues)) or "?"
                self.close_channel(ch, f"PRECONDITION_FAILED - floodwall: queue '{names}' "
                                       f"{why}")
        return refused

    def _deadline_of(self, item: HeldPublish) -> float:
        return deadline_of(self.ctx.controller.queues,
                           ((self.ctx.vhost, name) for name in item.queues))

    def on_broker_close_ok(self, channel: int) -> bool:
        """A channel.close-ok answering a close the proxy sent: absorb it."""
        ch = self.held.channels.get(channel)
        if ch is None or step(CHANNEL_PHASES, ch.phase, ChannelInput.BROKER_CLOSE_OK) is None:
            return False
        self.close_ok(ch, ChannelInput.BROKER_CLOSE_OK)
        return True

    def close_ok(self, ch: ChannelFlow, answer: ChannelInput) -> None:
        ch.phase = step(CHANNEL_PHASES, ch.phase, answer) or ch.phase
        if ch.phase is ChannelPhase.GONE:  # both answered: the channel number is free again
            self.held.channels.pop(ch.channel, None)
            self.ctx.controller.channel_closed(self.ctx.conn_id, ch.channel)
            self.outbox.append(ForgetChannel(ch.channel))
            for frame in ch.reopen:
                self.ctx.to_server(frame)
