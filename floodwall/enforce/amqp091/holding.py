"""The 0-9-1 gate's channel table and what it holds: holding a publish and what follows it on its
channel, blocking the channel on queues (and signalling the client), releasing it in order; the
connection's hold accounting. A part the gate owns (``PublishFlow``), shared with its other parts
(refusals, runs, spooling), which hold and account through it."""

from __future__ import annotations

from pamqp import commands

from floodwall.control.controller import ALARM, QueueKey, forwarded_run, quiet_room
from floodwall.control.lookups import is_pseudo
from floodwall.enforce import events as ev
from floodwall.enforce.amqp091.channels import (
    LOOKUP_HOLD_BUDGET,
    PROTOCOL,
    ChannelFlow,
    HeldPublish,
    headers_of,
)
from floodwall.enforce.amqp091.clients import may_signal
from floodwall.enforce.decision import should_signal
from floodwall.enforce.shared import GateContext
from floodwall.enforce.states import PublishInput
from floodwall.wire.amqp091.framing import encode_method
from floodwall.wire.amqp091.hooks import ClientInfo

_CH = commands.Channel
_NO_CHANNELS: frozenset[int] = frozenset()


class HeldChannels:
    """A connection's channels as its publish gate holds and releases them."""

    def __init__(self, ctx: GateContext) -> None:
        self.ctx = ctx
        self.controller = ctx.controller
        self.counters = ctx.counters
        self.outbox = ctx.outbox
        self.may_signal = False
        self.channels: dict[int, ChannelFlow] = {}
        self.held_bytes = 0
        self.connection_close: bytes | None = None  # the client's close, behind held frames
        self.waiting_lookup: set[int] = set()  # channels blocked on lookups only
        self.maybe_slow = False  # set whenever a channel may have left the fast path

    # -- output --------------------------------------------------------------------------
    def at(self, channel: int) -> ev.At:
        return ev.At(PROTOCOL, self.ctx.conn_id, self.ctx.vhost, channel)

    def move(self, ch: ChannelFlow, event: PublishInput) -> None:
        """Step the channel's publish phase; ``slow_channels`` looks at the channels again."""
        ch.move(event)
        self.maybe_slow = True

    # -- what the core learns about the connection ----------------------------------------
    def client_identified(self, client: ClientInfo) -> None:
        """connection.start-ok: whether the client may be sent Channel.Flow (clients.py)."""
        self.may_signal = may_signal(client)

    # -- state -------------------------------------------------------------------------
    def channel(self, channel: int) -> ChannelFlow:
        ch = self.channels.get(channel)
        if ch is None:
            ch = self.channels[channel] = ChannelFlow(channel)
        return ch

    @property
    def slow_channels(self) -> frozenset[int]:
        """The channels that must see each of their frames now (the rest stay on the
        core's scan). Asked at every method frame the core stops at: O(1) while no channel
        left the fast path since the last time all were back on it."""
        if not self.maybe_slow:
            return _NO_CHANNELS
        slow = frozenset(n for n, ch in self.channels.items() if not ch.on_fast_path)
        self.maybe_slow = bool(slow)
        return slow

    @property
    def over_budget(self) -> bool:
        """Past the hold budget: stop reading the connection (the relay's backpressure)."""
        held = self.held_bytes
        return held > self.ctx.hold_budget or (held > LOOKUP_HOLD_BUDGET
                                           and bool(self.waiting_lookup))

    @property
    def waiting_for_lookup(self) -> bool:
        """True while a channel of this connection waits for a lookup's answer."""
        return bool(self.waiting_lookup)

    @property
    def holding(self) -> bool:
        return any(ch.holding for ch in self.channels.values())

    def close(self) -> None:
        """The connection is gone: nothing of it is blocked or held any more."""
        self.controller.connection_closed(self.ctx.conn_id)
        self.account(-self.held_bytes, -sum(
            sum(1 for i in ch.held if isinstance(i, HeldPublish)) for ch in self.channels.values()))
        self.channels.clear()

    def on_channel_gone(self, channel: int) -> None:
        """The channel's close handshake completed: nothing of it is held any more.

        Not for a channel the proxy itself is closing: its close-oks are the proxy's to
        absorb, and ``_close_ok`` forgets it once both have come.
        """
        ch = self.channels.get(channel)
        if ch is not None and ch.closing_by_proxy:
            return
        self.channels.pop(channel, None)
        self.waiting_lookup.discard(channel)
        if ch is not None and ch.held_bytes:
            self.account(-ch.held_bytes, -sum(1 for i in ch.held if isinstance(i, HeldPublish)))
        self.controller.channel_closed(self.ctx.conn_id, channel)

    # -- hold, block, release ------------------------------------------------------------
    def hold(self, ch: ChannelFlow, item: HeldPublish) -> None:
        self.maybe_slow = True
        ch.held.append(item)
        self.grow(ch, item.nbytes)
        self.account(0, 1)
        if not item.complete:
            ch.filling = item
            ch.move(PublishInput.TAKEN)

    def grow(self, ch: ChannelFlow, nbytes: int) -> None:
        ch.held_bytes += nbytes
        self.account(nbytes, 0)

    def account(self, nbytes: int, messages: int) -> None:
        self.held_bytes += nbytes
        self.counters.held_bytes += nbytes
        self.counters.held_messages += messages
        if messages > 0:
            self.counters.held_publishes += messages

    def block(self, ch: ChannelFlow, blocking: frozenset[QueueKey], now: float) -> None:
        newly = self.controller.block(self.ctx.conn_id, ch.channel, blocking, now)
        only_lookups = all(is_pseudo(k) and k != ALARM for k in blocking)
        if not only_lookups:
            self.waiting_lookup.discard(ch.channel)
        if not newly:
            if not self.controller.is_blocked(self.ctx.conn_id, ch.channel):
                # Released while we looked (the block/release race): let it go at once.
                self.channel_released(ch.channel, now)
            return
        if only_lookups:
            # A moment's wait for the broker's answer (a lookup): no signal, no hold event.
            self.waiting_lookup.add(ch.channel)
            self.outbox.append(ev.WaitingForLookup(self.at(ch.channel), blocking))
            return
        signal = should_signal(self.controller.queues, blocking, self.may_signal)
        self.outbox.append(ev.PublisherHeld(self.at(ch.channel), blocking, signal))
        if signal and not ch.signalled_off:
            self.send_flow(ch, active=False)

    def send_flow(self, ch: ChannelFlow, active: bool) -> None:
        self.ctx.to_client(encode_method(_CH.Flow(active=active), ch.channel))
        ch.flow_replies += 1
        ch.signalled_off = not active
        self.counters.signalled(PROTOCOL, active)
        self.outbox.append(ev.Signalled(self.at(ch.channel), active))

    def channel_released(self, channel: int, now: float) -> None:
        """The controller says every queue this channel waited on has drained."""
        self.waiting_lookup.discard(channel)
        ch = self.channels.get(channel)
        if ch is None:
            return
        self.release(ch, now)
        if self.connection_close is not None and not self.holding:
            self.ctx.to_server(self.connection_close)
            self.connection_close = None

    def release(self, ch: ChannelFlow, now: float) -> None:
        held = ch.held
        controller = self.controller
        while held:
            item = held[0]
            if isinstance(item, HeldPublish):
                blocking = controller.blocking(self.ctx.vhost, item.queues)
                if item.generation != controller.generation:
                    # The model learned something while it waited (a lookup's answer): it
                    # goes where the broker will route it now, and is checked there.
                    pub = item.publish
                    item.generation = controller.generation
                    item.queues = controller.destinations(self.ctx.vhost, pub.exchange,
                                                          pub.routing_key,
                                                          headers_of(item.frames[1]))
                    blocking = controller.blocking(self.ctx.vhost, item.queues)
                    lookup = controller.lookup_for(self.ctx.vhost, pub.exchange, pub.routing_key,
                                                   item.queues, now)
                    if lookup is not None:
                        blocking = blocking | {lookup}
                if blocking and not controller.admits(blocking, now):
                    self.block(ch, blocking, now)
                    if self.controller.is_blocked(self.ctx.conn_id, ch.channel):
                        return
                    continue  # released in the same breath: look again
                if len(held) > 1 and self.release_run(ch, item, blocking, now):
                    continue
                held.popleft()
                nbytes = sum(map(len, item.frames))
                for f in item.frames:
                    self.ctx.to_server(f)
                ch.held_bytes -= nbytes
                self.account(-nbytes, -1)
                self.controller.forwarded(self.ctx.vhost, item.queues, item.body_size, now)
                if ch.confirms is not None:
                    ch.confirms.forwarded()
                if ch.filling is item:  # the rest of its content passes in place
                    ch.filling = None
                    ch.move(PublishInput.RELEASED)
            else:
                held.popleft()
                self.ctx.to_server(item)
                ch.held_bytes -= len(item)
                self.account(-len(item), 0)
        if ch.signalled_off and not controller.is_blocked(self.ctx.conn_id, ch.channel):
            self.send_flow(ch, active=True)

    def release_run(self, ch: ChannelFlow, first: HeldPublish, blocking: frozenset[QueueKey],
                     now: float) -> bool:
        """Let ``first`` (which may go) and the held publishes after it with the same route
        go at once, as many as would go one at a time (a held producer is let go at every
        count); True if two or more went. Only where no booking could
        change a decision: held (``blocking``), every policed queue of the route is among
        ``blocking`` (tripped: ``forwarded`` evaluates none) and each publish goes while the
        ledger is below the tokens (``Admission.room``); released (nothing blocking), within the
        route's ``quiet_room`` (no queue evaluated). The route and generation are the first's."""
        controller = self.controller
        queues, vhost, policed = first.queues, self.ctx.vhost, controller.queues
        if first.generation != controller.generation:
            return False
        # Each publish goes while the ledger is below the tokens (held), or while its booking
        # stays within the quiet room (released): ``whole`` is 1 for the latter.
        if blocking:
            if any((vhost, n) in policed and (vhost, n) not in blocking for n in queues):
                return False
            # each admits (``_release`` asked): the least room of them, less what held 1.0
            # links were admitted and have not sent yet
            room = controller.admission_room(blocking, now)
            if room is None:
                return False
            (room_bytes, room_messages), whole = room, 0
        else:
            quiet = quiet_room(policed, vhost, queues)
            if quiet is None:
                return False
            (room_bytes, room_messages), whole = quiet, 1
        count = body = 0
        frames: list[bytes] = []
        for item in ch.held:
            if not isinstance(item, HeldPublish) or item is ch.filling \
                    or (item.queues is not queues and item.queues != queues) \
                    or item.generation != first.generation \
                    or body + whole * item.body_size >= room_bytes + whole \
                    or count + whole >= room_messages + whole:
                break
            count += 1
            body += item.body_size
            frames.extend(item.frames)
        if count < 2:
            return False
        for _ in range(count):
            ch.held.popleft()
        data = b"".join(frames)
        self.ctx.to_server(data)
        ch.held_bytes -= len(data)
        self.account(-len(data), -count)
        forwarded_run(policed, vhost, queues, body, count, now)
        if ch.confirms is not None:
            ch.confirms.forwarded(count)
        return True
