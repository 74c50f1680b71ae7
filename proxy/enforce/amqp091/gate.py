"""Per-connection publish gate for AMQP 0-9-1: admit, hold, refuse, signal, release.

The core hands every client ``basic.publish`` (with its content header, when it has
arrived) to ``PublishFlow``, which routes it, asks the shared ``FlowController`` whether any
destination queue is tripped, and then either lets it pass untouched, holds it (and every
frame that must stay behind it on that channel) or refuses it as the policy says. Held
frames leave, in channel order, when the controller releases the channel; each held
publish is checked again as it leaves, so a queue that trips again stops the release.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from pamqp import commands
from pamqp import frame as pamqp_frame

from floodwall.control.controller import ALARM, FlowController, QueueKey
from floodwall.control.lookups import is_pseudo
from floodwall.control.policy import Fsync, Overflow, Policy, Signal
from floodwall.ops.logs import event
from floodwall.spool.log import SpoolError
from floodwall.spool.manager import SpoolManager
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp091.framing import HEADER_SIZE, Buffer, encode_method, frame_at

log = logging.getLogger("floodwall.flow")

PROTOCOL: Final = "amqp091"
_B = commands.Basic
_CH = commands.Channel
_SHORT = struct.Struct(">H")
_BODY_SIZE = struct.Struct(">HHQH")  # class id, weight, body size, property flags
_HEADERS_FLAG: Final = 0x2000  # property flag bit of ``headers`` (third property)
DEFAULT_HOLD_BUDGET: Final = 16 * 1024 * 1024
#: Held bytes past which a connection is not read while a channel of it waits for a lookup
#: (proxy/lookups.py): a lookup takes a round trip, and a flood read meanwhile would only
#: take the event loop from the answer.
LOOKUP_HOLD_BUDGET: Final = 256 * 1024

# Methods that keep flowing on a channel while its publishes are held: they cannot
# overtake a publish in any way the broker or the client could observe.
PASS_WHILE_HELD: Final = frozenset({
    _B.Ack.index, _B.Nack.index, _B.Reject.index, _B.Qos.index, _B.Consume.index,
    _B.Cancel.index, _B.Get.index, _B.Recover.index, _B.RecoverAsync.index,
    _CH.FlowOk.index, _CH.Flow.index,
})


@dataclass(frozen=True, slots=True)
class Publish:
    """What the gate needs to know of one basic.publish."""

    exchange: str
    routing_key: str
    mandatory: bool


def parse_publish(buf: Buffer, offset: int) -> Publish:
    """Read exchange, routing key and flags of the basic.publish frame at ``offset``.

    The caller has validated the frame; a field running past the frame's end raises
    ValueError, which the core turns into a 502 syntax error.
    """
    _, _, size = frame_at(buf, offset)
    end = offset + HEADER_SIZE + size
    pos = offset + HEADER_SIZE + 6  # class, method, ticket
    n = buf[pos]
    exchange = bytes(buf[pos + 1 : pos + 1 + n]).decode("utf-8", "replace")
    pos += 1 + n
    n = buf[pos]
    routing_key = bytes(buf[pos + 1 : pos + 1 + n]).decode("utf-8", "replace")
    pos += 1 + n
    if pos >= end:
        raise ValueError("basic.publish fields run past the end of the frame")
    return Publish(exchange, routing_key, bool(buf[pos] & 1))


@dataclass(eq=False, slots=True)
class HeldPublish:
    """A publish waiting at the proxy: its frames exactly as they came, and why it waits."""

    publish: Publish
    frames: list[bytes]
    body_size: int
    received: int  # body bytes that have arrived so far
    queues: frozenset[str]
    held_at: float
    client_seq: int  # its confirm sequence number on the client's side (0 = not confirming)
    spool_to: QueueKey | None = None  # goes to this queue's spool once its content is in
    generation: int = 0  # the routing model's generation ``queues`` was computed at

    @property
    def complete(self) -> bool:
        return self.received >= self.body_size

    @property
    def nbytes(self) -> int:
        return sum(len(f) for f in self.frames)


HeldItem = HeldPublish | bytes  # a held publish, or another frame waiting behind one


@dataclass(slots=True)
class ConfirmNumbers:
    """Client and broker publish sequence numbers of one channel in confirm mode.

    They differ once the proxy itself answered a publish (a nack for a refused or expired
    one): the broker never saw it. ``offsets`` records, from which broker number on, how
    far the client's numbers run ahead, so the broker's acks can be renumbered.
    """

    client_seq: int = 0  # publishes the client sent since confirm.select
    broker_seq: int = 0  # publishes forwarded to the broker
    ahead: int = 0  # client_seq - broker_seq for the next forwarded publish
    offsets: deque[tuple[int, int]] = field(default_factory=deque)  # (first broker seq, ahead)

    def forwarded(self) -> None:
        self.broker_seq += 1
        if self.ahead and (not self.offsets or self.offsets[-1][1] != self.ahead):
            self.offsets.append((self.broker_seq, self.ahead))

    def answered_by_proxy(self) -> None:
        self.ahead += 1

    def to_client(self, broker_tag: int) -> int:
        """The client's number for the broker's ``broker_tag``."""
        ahead = 0
        for first, value in self.offsets:
            if first > broker_tag:
                break
            ahead = value
        return broker_tag + ahead

    def acked_through(self, broker_tag: int) -> None:
        """Forget offsets no later ack can need (after an ack with multiple=true)."""
        offsets = self.offsets
        while len(offsets) > 1 and offsets[1][0] <= broker_tag:
            offsets.popleft()

    @property
    def renumbering(self) -> bool:
        return bool(self.offsets)


@dataclass(slots=True)
class ChannelFlow:
    """One channel's publish state."""

    channel: int
    held: deque[HeldItem] = field(default_factory=deque)
    held_bytes: int = 0
    filling: HeldPublish | None = None  # held publish whose content is still arriving
    awaiting: tuple[Publish, bytes] | None = None  # publish waiting for its content header
    discard_content: int = 0  # body bytes still to drop (a refused publish's content)
    confirms: ConfirmNumbers | None = None
    transactional: bool = False  # tx.select seen: its publishes are never spooled
    spool_acks: deque[tuple[QueueKey, int, int]] = field(default_factory=deque)
    # (queue, spool seq, client seq): spooled publishes whose ack waits for durability
    not_spooled_reported: bool = False
    signalled_off: bool = False  # we sent channel.flow(active=false)
    flow_replies: int = 0  # replies to injected channel.flow still to absorb
    closing_by_proxy: bool = False
    close_oks_due: set[str] = field(default_factory=set)  # "client", "broker"
    reopen: list[bytes] = field(default_factory=list)  # client frames after its close-ok

    @property
    def holding(self) -> bool:
        return bool(self.held) or self.filling is not None

    @property
    def needs_every_frame(self) -> bool:
        return (bool(self.held) or self.filling is not None or self.awaiting is not None
                or self.discard_content > 0 or self.closing_by_proxy)


class PublishFlow:
    """The gate for one connection's publishes; owned by its ``amqp091.Connection``.

    ``to_server`` / ``to_client`` append bytes to the core's output queues in order; the
    core calls ``notify`` after output produced outside a receive call (a release).
    """

    def __init__(self, controller: FlowController, conn_id: int,
                 to_server: Callable[[bytes], None], to_client: Callable[[bytes], None],
                 hold_budget: int = DEFAULT_HOLD_BUDGET,
                 spool: SpoolManager | None = None) -> None:
        self.controller = controller
        self.spool = spool
        self.conn_id = conn_id
        self._to_server = to_server
        self._to_client = to_client
        self.hold_budget = hold_budget
        self.vhost = "/"
        self.may_signal = False
        self.channels: dict[int, ChannelFlow] = {}
        self.held_bytes = 0
        self.notify: Callable[[], None] = lambda: None
        self.on_channel_closed: Callable[[int], None] = lambda channel: None
        self.client_gone = False
        self._connection_close: bytes | None = None  # the client's close, behind held frames
        self._waiting_lookup: set[int] = set()  # channels blocked on lookups only
        self._maybe_slow = False  # set whenever a channel may have left the fast path
        controller.register(self)

    # -- state -------------------------------------------------------------------------
    def channel(self, channel: int) -> ChannelFlow:
        ch = self.channels.get(channel)
        if ch is None:
            ch = self.channels[channel] = ChannelFlow(channel)
        return ch

    @property
    def needs_every_frame(self) -> bool:
        """True while some channel must see each of its frames (slow path).

        Asked before every method frame the core stops at: O(1) while no channel ever
        left the fast path since the last time all were back on it.
        """
        if not self._maybe_slow:
            return False
        slow = any(ch.needs_every_frame for ch in self.channels.values())
        self._maybe_slow = slow
        return slow

    @property
    def over_budget(self) -> bool:
        """Past the hold budget: stop reading the connection (the relay's backpressure)."""
        held = self.held_bytes
        return held > self.hold_budget or (held > LOOKUP_HOLD_BUDGET
                                           and bool(self._waiting_lookup))

    @property
    def waiting_for_lookup(self) -> bool:
        """True while a channel of this connection waits for a lookup's answer."""
        return bool(self._waiting_lookup)

    @property
    def holding(self) -> bool:
        return any(ch.holding for ch in self.channels.values())

    def close(self) -> None:
        self.controller.unregister(self)
        self._account(-self.held_bytes, -sum(
            sum(1 for i in ch.held if isinstance(i, HeldPublish)) for ch in self.channels.values()))
        self.channels.clear()

    # -- client frames -----------------------------------------------------------------
    def on_publish(self, channel: int, buf: Buffer, offset: int, end: int,
                   header_end: int | None) -> int | None:
        """A basic.publish frame ``buf[offset:end]``.

        ``header_end`` is where its content header ends when that header follows at once
        in ``buf``. Returns None when both pass untouched (the publish was booked on its
        queues), else how far the gate took frames from ``buf`` (held, refused, or the
        method alone while it waits for a header that is not there yet).
        """
        ch = self.channel(channel)
        pub = parse_publish(buf, offset)
        if ch.confirms is not None:
            ch.confirms.client_seq += 1
        if header_end is None or ch.closing_by_proxy:
            ch.awaiting = (pub, bytes(buf[offset:end]))
            self._maybe_slow = True
            return end
        took = self._decide(ch, pub, None, buf, offset, end, header_end)
        return header_end if took else None

    def _decide(self, ch: ChannelFlow, pub: Publish, method_bytes: bytes | None,
                buf: Buffer, offset: int, header_offset: int, header_end: int) -> bool:
        """Decide a publish once its content header is known; True if the gate took it.

        ``method_bytes`` is the method frame when it already left ``buf`` (it waited for its
        header), else None: the method frame is ``buf[offset:header_offset]``.
        """
        header = buf[header_offset:header_end]
        body_size = _BODY_SIZE.unpack_from(header, HEADER_SIZE)[2]
        if ch.closing_by_proxy:
            ch.discard_content = body_size
            self._maybe_slow = True
            return True
        controller = self.controller
        queues = controller.destinations(self.vhost, pub.exchange, pub.routing_key,
                                         _headers_of(header))
        blocking = controller.blocking(self.vhost, queues)
        # Routed somewhere the model knows (the common case): no lookup can be needed.
        lookup = None if (queues and (pub.exchange or pub.routing_key in queues)) else \
            controller.lookup_for(self.vhost, pub.exchange, pub.routing_key, queues)
        if lookup is not None:  # the model does not know where it lands: ask first
            blocking = blocking | {lookup}
        spool_to = (self._spool_target(ch, pub, queues, blocking)
                    if self.spool and lookup is None else None)
        if spool_to is not None:
            if method_bytes is None:
                method_bytes = bytes(buf[offset:header_offset])
            item = HeldPublish(pub, [method_bytes, bytes(header)], body_size, 0, queues,
                               self.controller.clock(),
                               ch.confirms.client_seq if ch.confirms is not None else 0,
                               spool_to)
            if item.complete:
                self._spool(ch, item, blocking)
            else:
                ch.filling = item  # its body frames come next; spooled when all are in
                self._maybe_slow = True
            return True
        if not blocking and not ch.holding:
            self.controller.forwarded(self.vhost, queues, body_size)
            if ch.confirms is not None:
                ch.confirms.forwarded()
            if method_bytes is not None:  # it waited for its header: it goes first
                self._to_server(method_bytes)
            return False
        policy = self._strictest(blocking)
        if policy is not None and policy.effective_overflow is Overflow.REJECT:
            self._refuse(ch, blocking, body_size, "over capacity (overflow: reject)")
            self.controller.rejects += 1
            self.controller.emit("reject", {"vhost": self.vhost, "conn": self.conn_id,
                                            "channel": ch.channel, "body_bytes": body_size,
                                            "queues": [k[1] for k in blocking if k != ALARM]})
            return True
        if method_bytes is None:
            method_bytes = bytes(buf[offset:header_offset])
        item = HeldPublish(pub, [method_bytes, bytes(header)], body_size, 0, queues,
                           self.controller.clock(),
                           ch.confirms.client_seq if ch.confirms is not None else 0,
                           generation=controller.generation)
        self._hold(ch, item)
        if blocking:
            self._block(ch, blocking)
        return True

    def _strictest(self, blocking: frozenset[QueueKey]) -> Policy | None:
        """The policy that decides for a publish blocked on several queues: reject wins."""
        chosen: Policy | None = None
        for key in blocking:
            q = self.controller.queues.get(key)
            if q is None:
                continue
            if chosen is None or q.policy.effective_overflow is Overflow.REJECT:
                chosen = q.policy
        return chosen

    def on_content(self, channel: int, buf: Buffer, offset: int, end: int) -> bool:
        """A content header or body frame (slow path); True if the gate took it."""
        ch = self.channels.get(channel)
        if ch is None:
            return False
        ftype, _, size = frame_at(buf, offset)
        if ch.awaiting is not None and ftype == 2:
            pub, method_bytes = ch.awaiting
            ch.awaiting = None
            return self._decide(ch, pub, method_bytes, buf, offset, offset, end)
        item = ch.filling
        if item is not None and ftype == 3:
            data = bytes(buf[offset:end])
            item.frames.append(data)
            item.received += size
            if item.spool_to is None:
                self._grow(ch, len(data))
            if item.complete:
                ch.filling = None
                if item.spool_to is not None:
                    self._spool(ch, item, self.controller.blocking(self.vhost, item.queues))
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
            if "client" not in ch.close_oks_due:
                # The client is done with the channel and opens it again before the broker
                # answered our close: that channel.open waits for the broker's close-ok.
                ch.reopen.append(bytes(buf[offset:end]))
            elif key == _CH.CloseOk.index:  # the client's answer to our close
                self._close_ok(ch, "client")
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

    def on_channel_gone(self, channel: int) -> None:
        """The channel's close handshake completed: nothing of it is held any more.

        Not for a channel the proxy itself is closing: its close-oks are the proxy's to
        absorb, and ``_close_ok`` forgets it once both have come.
        """
        ch = self.channels.get(channel)
        if ch is not None and ch.closing_by_proxy:
            return
        self.channels.pop(channel, None)
        self._waiting_lookup.discard(channel)
        if ch is not None and ch.held_bytes:
            self._account(-ch.held_bytes, -sum(1 for i in ch.held if isinstance(i, HeldPublish)))
        self.controller.channel_closed(self, channel)

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

    def on_broker_close_ok(self, channel: int) -> bool:
        """A channel.close-ok answering a close the proxy sent: absorb it."""
        ch = self.channels.get(channel)
        if ch is None or "broker" not in ch.close_oks_due:
            return False
        self._close_ok(ch, "broker")
        return True

    def _close_ok(self, ch: ChannelFlow, side: str) -> None:
        ch.close_oks_due.discard(side)
        if not ch.close_oks_due:  # both sides answered: the channel number is free again
            self.channels.pop(ch.channel, None)
            self.controller.channel_closed(self, ch.channel)
            self.on_channel_closed(ch.channel)
            for frame in ch.reopen:
                self._to_server(frame)

    # -- spool -------------------------------------------------------------------------
    def _spool_target(self, ch: ChannelFlow, pub: Publish, queues: frozenset[str],
                      blocking: frozenset[QueueKey]) -> QueueKey | None:
        """The queue whose spool takes this publish, or None (held or passed instead).

        Spooled: a publish that lands in exactly one queue, whose policy says ``spool``,
        while that queue is tripped or still has spooled backlog (so the broker gets its
        messages in the order the proxy accepted them). Never spooled: transactional and
        mandatory publishes (their semantics need the broker now), a publish behind held
        frames on its channel, and anything while the broker has a resource alarm.
        """
        assert self.spool is not None
        if len(queues) != 1 or ALARM in blocking:
            return None
        key = (self.vhost, next(iter(queues)))
        q = self.controller.queues.get(key)
        if q is None or q.policy.overflow is not Overflow.SPOOL:
            return None
        if key not in blocking and not self.spool.has_backlog(key):
            return None
        if ch.transactional or pub.mandatory or ch.holding:
            if not ch.not_spooled_reported and not ch.holding:
                ch.not_spooled_reported = True
                event(log, "publish_not_spooled", conn=self.conn_id, channel=ch.channel,
                      queue=key[1], reason=("transactional channel" if ch.transactional
                                            else "mandatory publish"), action="held")
            return None
        return key

    def _spool(self, ch: ChannelFlow, item: HeldPublish, blocking: frozenset[QueueKey]) -> None:
        """Write a complete publish to its queue's spool; hold it if the spool says no."""
        assert self.spool is not None and item.spool_to is not None
        key = item.spool_to
        q = self.controller.queues.get(key)
        settings = q.policy.spool if q is not None else None
        record = SpoolRecord(0, time.time(), item.publish.exchange, item.publish.routing_key,
                             bytes(item.frames[1][HEADER_SIZE:-1]),
                             b"".join(f[HEADER_SIZE:-1] for f in item.frames[2:]),
                             item.publish.mandatory)
        try:
            seq = self.spool.append(key, record, settings.max_bytes if settings else 1 << 30)
        except SpoolError as exc:
            self.controller.spool_fallbacks += 1
            event(log, "spool_refused", logging.WARNING, conn=self.conn_id, channel=ch.channel,
                  queue=key[1], reason=str(exc), action="held")
            item.spool_to = None
            self._hold(ch, item)
            self._block(ch, blocking or frozenset({key}))
            return
        self.controller.spooled_records += 1
        self.controller.spooled_bytes += record.size
        if ch.confirms is None:
            return
        ch.confirms.answered_by_proxy()  # the broker will never number this one
        if settings is not None and settings.fsync is Fsync.NEVER:
            self._to_client(encode_method(_B.Ack(delivery_tag=item.client_seq), ch.channel))
        else:
            ch.spool_acks.append((key, seq, item.client_seq))

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: ack spooled publishes that are now durable."""
        sent = False
        for ch in self.channels.values():
            acks = ch.spool_acks
            while acks:
                key, seq, client_seq = acks[0]
                if durable.get(key, 0) < seq:
                    break
                acks.popleft()
                self._to_client(encode_method(_B.Ack(delivery_tag=client_seq), ch.channel))
                sent = True
        if sent:
            self.notify()

    def on_tx_select(self, channel: int) -> None:
        self.channel(channel).transactional = True

    # -- hold, block, release ------------------------------------------------------------
    def _hold(self, ch: ChannelFlow, item: HeldPublish) -> None:
        self._maybe_slow = True
        ch.held.append(item)
        self._grow(ch, item.nbytes)
        self._account(0, 1)
        if not item.complete:
            ch.filling = item
            self._maybe_slow = True

    def _grow(self, ch: ChannelFlow, nbytes: int) -> None:
        ch.held_bytes += nbytes
        self._account(nbytes, 0)

    def _account(self, nbytes: int, messages: int) -> None:
        self.held_bytes += nbytes
        self.controller.held_bytes += nbytes
        self.controller.held_messages += messages

    def _block(self, ch: ChannelFlow, blocking: frozenset[QueueKey]) -> None:
        newly = self.controller.block(self, ch.channel, blocking)
        only_lookups = all(is_pseudo(k) and k != ALARM for k in blocking)
        if not only_lookups:
            self._waiting_lookup.discard(ch.channel)
        if not newly:
            if not self.controller.is_blocked(self, ch.channel):
                # Released while we looked (seed 000's race): let it go at once.
                self.channel_released(ch.channel)
            return
        if only_lookups:
            # A moment's wait for the broker's answer (a lookup): no signal, no hold event.
            self._waiting_lookup.add(ch.channel)
            event(log, "publisher_waits_for_lookup", logging.DEBUG, conn=self.conn_id,
                  channel=ch.channel, vhost=self.vhost,
                  lookups=",".join(q for _, q in sorted(blocking)))
            return
        names = ",".join(q for _, q in sorted(blocking))
        signal = self._signal_for(blocking)
        event(log, "publisher_held", logging.INFO, conn=self.conn_id, channel=ch.channel,
              vhost=self.vhost, queues=names, signalled=signal)
        self.controller.emit("hold", {"vhost": self.vhost, "conn": self.conn_id,
                                      "channel": ch.channel,
                                      "queues": [k[1] for k in blocking if not is_pseudo(k)]})
        if signal and not ch.signalled_off:
            self._send_flow(ch, active=False)

    def _signal_for(self, blocking: frozenset[QueueKey]) -> bool:
        decision = self.may_signal
        for key in blocking:
            q = self.controller.queues.get(key)
            if q is None:
                continue
            if q.policy.signal is Signal.NONE:
                return False
            if q.policy.signal is Signal.FLOW:
                decision = True
        return decision

    def _send_flow(self, ch: ChannelFlow, active: bool) -> None:
        self._to_client(encode_method(_CH.Flow(active=active), ch.channel))
        ch.flow_replies += 1
        ch.signalled_off = not active
        self.controller.signalled(PROTOCOL, active)
        event(log, "publisher_signalled", conn=self.conn_id, channel=ch.channel,
              active=active)
        self.controller.emit("signal", {"vhost": self.vhost, "conn": self.conn_id,
                                        "channel": ch.channel, "active": active})

    def channel_released(self, channel: int) -> None:
        """The controller says every queue this channel waited on has drained."""
        self._waiting_lookup.discard(channel)
        ch = self.channels.get(channel)
        if ch is None:
            return
        self._release(ch)
        if self._connection_close is not None and not self.holding:
            self._to_server(self._connection_close)
            self._connection_close = None
        self.notify()

    def _release(self, ch: ChannelFlow) -> None:
        held = ch.held
        controller = self.controller
        while held:
            item = held[0]
            if isinstance(item, HeldPublish):
                blocking = controller.blocking(self.vhost, item.queues)
                if item.generation != controller.generation:
                    # The model learned something while it waited (a lookup's answer): it
                    # goes where the broker will route it now, and is checked there.
                    pub = item.publish
                    item.generation = controller.generation
                    item.queues = controller.destinations(self.vhost, pub.exchange,
                                                          pub.routing_key,
                                                          _headers_of(item.frames[1]))
                    blocking = controller.blocking(self.vhost, item.queues)
                    lookup = controller.lookup_for(self.vhost, pub.exchange, pub.routing_key,
                                                   item.queues)
                    if lookup is not None:
                        blocking = blocking | {lookup}
                if blocking:
                    self._block(ch, blocking)
                    if self.controller.is_blocked(self, ch.channel):
                        return
                    continue  # released in the same breath: look again
                held.popleft()
                nbytes = sum(len(f) for f in item.frames)
                for f in item.frames:
                    self._to_server(f)
                ch.held_bytes -= nbytes
                self._account(-nbytes, -1)
                self.controller.forwarded(self.vhost, item.queues, item.body_size)
                if ch.confirms is not None:
                    ch.confirms.forwarded()
                if ch.filling is item:
                    ch.filling = None  # the rest of its content passes in place
            else:
                held.popleft()
                self._to_server(item)
                ch.held_bytes -= len(item)
                self._account(-len(item), 0)
        if ch.signalled_off:
            self._send_flow(ch, active=True)

    # -- refusals ----------------------------------------------------------------------
    def _refuse(self, ch: ChannelFlow, blocking: frozenset[QueueKey], body_size: int,
                why: str) -> None:
        """Answer a publish the proxy will not forward: nack it, or close the channel."""
        names = ",".join(q for _, q in sorted(blocking)) or "?"
        if ch.confirms is not None:
            self._to_client(encode_method(_B.Nack(delivery_tag=ch.confirms.client_seq), ch.channel))
            ch.confirms.answered_by_proxy()
            ch.discard_content = body_size
            self._maybe_slow = True
            event(log, "publish_refused", logging.WARNING, conn=self.conn_id,
                  channel=ch.channel, queues=names, reason=why, answer="basic.nack")
            return
        self._close_channel(ch, f"PRECONDITION_FAILED - floodwall: queue '{names}' {why}")
        ch.discard_content = body_size
        self._maybe_slow = True

    def _close_channel(self, ch: ChannelFlow, text: str) -> None:
        """Close a channel on both sides: 406 to the client, a plain close to the broker."""
        self._maybe_slow = True
        event(log, "channel_closed_by_proxy", logging.WARNING, conn=self.conn_id,
              channel=ch.channel, reason=text)
        dropped = [i for i in ch.held if isinstance(i, HeldPublish)]
        self._account(-ch.held_bytes, -len(dropped))
        ch.held.clear()
        ch.held_bytes = 0
        ch.filling = None
        ch.closing_by_proxy = True
        ch.close_oks_due = {"client", "broker"}
        self._waiting_lookup.discard(ch.channel)
        self.controller.channel_closed(self, ch.channel)
        reply = text.encode()[:255].decode("utf-8", "ignore")
        self._to_client(encode_method(_CH.Close(reply_code=406, reply_text=reply,
                                                class_id=60, method_id=40), ch.channel))
        self._to_server(encode_method(_CH.Close(reply_code=200, reply_text="floodwall: "
                                                "channel closed for its client",
                                                class_id=0, method_id=0), ch.channel))

    def expire(self, now: float) -> int:
        """Refuse publishes held longer than their policy's deadline; returns how many."""
        refused = 0
        for ch in list(self.channels.values()):
            while ch.held and not ch.closing_by_proxy:
                item = ch.held[0]
                if not isinstance(item, HeldPublish):
                    break
                deadline = self._deadline_of(item)
                if now - item.held_at < deadline:
                    break
                refused += 1
                self.controller.deadline_expiries += 1
                self.controller.emit("deadline", {
                    "vhost": self.vhost, "conn": self.conn_id, "channel": ch.channel,
                    "body_bytes": item.body_size, "waited": round(now - item.held_at, 3),
                    "queues": sorted(item.queues)})
                why = f"still over capacity after the {deadline:g}s deadline"
                if ch.confirms is not None and item.complete:
                    ch.held.popleft()
                    nbytes = item.nbytes
                    ch.held_bytes -= nbytes
                    self._account(-nbytes, -1)
                    # Its client number, whatever was forwarded before it.
                    self._to_client(encode_method(_B.Nack(delivery_tag=item.client_seq),
                                                  ch.channel))
                    ch.confirms.answered_by_proxy()
                    event(log, "publish_refused", logging.WARNING, conn=self.conn_id,
                          channel=ch.channel, reason=why, answer="basic.nack")
                    continue
                names = ",".join(sorted(item.queues)) or "?"
                self._close_channel(ch, f"PRECONDITION_FAILED - floodwall: queue '{names}' "
                                        f"{why}")
        if refused:
            self.notify()
        return refused

    def _deadline_of(self, item: HeldPublish) -> float:
        deadlines = [q.policy.deadline for name in item.queues
                     if (q := self.controller.queues.get((self.vhost, name))) is not None]
        if not deadlines and ALARM in self.controller.tripped:
            return 30.0
        return min(deadlines, default=30.0)


def _headers_of(header_frame: Buffer) -> dict[str, object] | None:
    """The ``headers`` property of a content header frame, decoded only when present."""
    flags = _BODY_SIZE.unpack_from(header_frame, HEADER_SIZE)[3]
    if not flags & _HEADERS_FLAG:
        return None
    try:
        _, _, value = pamqp_frame.unmarshal(bytes(header_frame))
    except Exception:  # the broker will refuse it; route as if it had no headers
        return None
    headers = getattr(getattr(value, "properties", None), "headers", None)
    return dict(headers) if isinstance(headers, dict) else None
