"""A channel's run of whole publishes booked at once (the policed 0-9-1 publish's cost).

``PublishFlow.on_publish`` decides about each publish: its route, its queues' trips, a lookup,
a shadow verdict, the spool, what its channel holds, its confirm numbers, the ledger. Most of
the time, on a channel far from its queues' capacities, every one of those answers is "as
before", and working them out per publish is most of a policed publisher's cost in the
proxy. So after a publish passed ``on_publish`` untouched, the core asks ``publish_run`` how
many more publishes with the same method frame (exchange, routing key, flags) the gate could
book with no decision at all, reads that many (or fewer) in one pass
(``floodwall.wire.amqp091.runs.scan_publish_run``) and hands the totals to
``on_publish_run``.

A run is allowed only while nothing it books can change a decision (the conditions
``PublishFlow._decide`` and ``on_publish`` test, each listed in docs/design/runs.md, "0-9-1:
publish runs"): the channel may run (``ChannelFlow.may_run``: on the fast path, READY,
OPEN and holding nothing, with no Channel.Flow of ours in force or unanswered and no shadow
hold); the connection keeps no client connection.close back (other channels may hold:
nothing ``_decide`` asks about one channel depends on another's held frames, and a run
passes in place exactly as its publishes would one by one); no spool is configured; no
shadow policy has a trip; the first publish's content
header carries no ``headers`` property (the route is then the one for ``None`` headers, for
every publish of the run: the scan ends at a header that carries them); the route needs no
lookup and none of its queues is blocking (a trip, a backlog, a first figure awaited, the
alarm); and the run stays below the ledger totals at which the controller would evaluate
any of its queues again (``floodwall.control.controller.quiet_room``). Within those bounds
``on_publish_run`` books exactly what ``on_publish`` would, publish by publish: the confirm
sequence numbers on both sides, and the body sizes and messages on each policed queue's
ledger (at the same ``now``, so into the same ledger bucket).

Held runs (a producer held at its consumers' pace has every publish held, then let go by
the admission, and one at a time that costs ~10 us of the proxy's CPU per publish to hold).
After ``on_publish`` held a publish with its content header, the core asks ``hold_run`` how
many body bytes of the channel's next whole publishes with the same method
frame the gate holds at once, reads them (``scan_publish_run`` with their ends) and hands
them to ``on_hold_run``. Allowed while each of them would be held exactly as that publish
was: it is held (not spooled, refused or left waiting for its content) and is the newest
thing the channel holds; its content header carries no ``headers``; its route needs no
lookup and no blocking queue's policy says ``reject`` (then ``decide`` holds every publish
behind a held one); no shadow policy has a trip and the channel has no shadow hold; the
connection keeps no client ``connection.close`` back. The hold budget does not end a run:
it is the relay's backpressure after a read (it stops reading past it), and a publish at a
time holds the whole read as well (a run that stopped at the budget sent the rest of every
read past it a publish at a time: a producer held at its consumers' pace is past it all the
time). Each
publish of the run is held as its own ``HeldPublish`` (its method frame, shared, and its
content header and body frames as one piece of bytes), with its confirm sequence number, so
that its release, its deadline and its channel's close see what they would have seen.
"""

from __future__ import annotations

from floodwall.control.controller import ALARM, forwarded_run, quiet_room
from floodwall.control.lookups import is_pseudo
from floodwall.control.policy import Overflow
from floodwall.enforce.amqp091.channels import BODY_SIZE, HeldPublish
from floodwall.enforce.amqp091.holding import HeldChannels
from floodwall.enforce.decision import strictest_overflow
from floodwall.enforce.shared import GateContext
from floodwall.enforce.states import PublishInput, PublishPhase
from floodwall.wire.amqp091.framing import HEADER_SIZE, Buffer
from floodwall.wire.amqp091.runs import HEADERS_FLAG

_NO_QUEUES: frozenset[str] = frozenset()


class PublishRuns:
    """The gate's run booking (``PublishHooks.publish_run`` / ``on_publish_run``, ``hold_run`` /
    ``on_hold_run``), a part the gate owns, over its held channels."""

    def __init__(self, ctx: GateContext, held: HeldChannels) -> None:
        self.ctx = ctx
        self.held = held
        self.controller = ctx.controller
        self._run_queues = _NO_QUEUES  # the route of the run ``publish_run`` allowed

    def publish_run(self, channel: int, buf: Buffer, header_offset: int, now: float
                    ) -> tuple[float, float] | None:
        """After the publish whose content header is at ``buf[header_offset]`` passed
        ``on_publish`` untouched: how many more whole publishes of that channel with the same
        method frame (at most), and how many body bytes, the gate books with
        ``on_publish_run`` as it would one at a time; None when it would decide something
        about the next one."""
        # Another channel's held frames change nothing here (a held connection's free
        # channels keep their runs): only this channel's state, the route's queues and the
        # connection's kept-back close are asked, as ``_decide`` asks them.
        held = self.held
        if held.connection_close is not None or self.ctx.spool is not None:
            return None
        ch = held.channels.get(channel)
        if ch is None or not ch.may_run or ch.last_publish is None:
            return None
        controller = self.controller
        if controller.trips.shadow:
            return None
        if BODY_SIZE.unpack_from(buf, header_offset + HEADER_SIZE)[3] & HEADERS_FLAG:
            return None
        pub = ch.last_publish[1]
        vhost = self.ctx.vhost
        queues = controller.destinations(vhost, pub.exchange, pub.routing_key, None)
        if controller.blocking(vhost, queues):
            return None
        if not (queues and (pub.exchange or pub.routing_key in queues)) and \
                controller.lookup_for(vhost, pub.exchange, pub.routing_key, queues,
                                      now) is not None:
            return None
        room = quiet_room(controller.queues, vhost, queues)
        if room is None:
            return None
        room_bytes, room_messages = room
        if room_messages < 1 or room_bytes < 0:
            return None
        self._run_queues = queues
        return room_messages, room_bytes

    def on_publish_run(self, channel: int, count: int, body_bytes: int, now: float) -> None:
        """``count`` whole publishes of the channel, ``body_bytes`` of body in all, within
        what ``publish_run`` allowed: passed untouched, booked as ``on_publish`` books each."""
        confirms = self.held.channels[channel].confirms
        if confirms is not None:
            confirms.client_seq += count
            confirms.forwarded(count)
        forwarded_run(self.controller.queues, self.ctx.vhost, self._run_queues, body_bytes,
                      count, now)

    def hold_run(self, channel: int, buf: Buffer, header_offset: int, now: float) -> bool:
        """After ``on_publish`` held the publish whose content header is at
        ``buf[header_offset]``: True if ``on_hold_run`` may hold the channel's next whole
        publishes with the same method frame at once, as they would be held one at a time
        (module docstring); False when one of them could be decided otherwise."""
        held = self.held
        if held.connection_close is not None:
            return False
        ch = held.channels.get(channel)
        item = None if ch is None else ch.filling
        if ch is None or item is None or ch.publish is not PublishPhase.FILLING \
                or item.spool_to is not None or item.received \
                or not ch.held or ch.held[-1] is not item or ch.closing_by_proxy \
                or ch.shadow.on:
            return False
        controller = self.controller
        if controller.trips.shadow or item.generation != controller.generation:
            return False
        if BODY_SIZE.unpack_from(buf, header_offset + HEADER_SIZE)[3] & HEADERS_FLAG:
            return False
        blocking = controller.blocking(self.ctx.vhost, item.queues)
        return not (any(is_pseudo(k) and k != ALARM for k in blocking)
                    or strictest_overflow(controller.queues, blocking) is Overflow.REJECT)

    def on_hold_run(self, channel: int, buf: Buffer, body_offset: int, body_end: int,
                    ends: list[int], now: float) -> None:
        """The held publish's body ``buf[body_offset:body_end]``, then the publishes ending
        at ``ends`` (module docstring): held as ``on_content`` and ``on_publish`` hold them."""
        ch = self.held.channels[channel]
        item = ch.filling
        assert item is not None
        first = bytes(buf[body_offset:body_end])
        item.frames.append(first)
        item.received = item.body_size
        ch.filling = None
        ch.move(PublishInput.CONTENT_DONE)
        method = item.frames[0]
        m = len(method)
        pub, queues, generation = item.publish, item.queues, item.generation
        confirms = ch.confirms
        seq = confirms.client_seq if confirms is not None else 0
        held, unpack = ch.held, BODY_SIZE.unpack_from
        nbytes, start = len(first), body_end
        for stop in ends:
            rest = bytes(buf[start + m:stop])
            if confirms is not None:
                seq += 1
            body = unpack(rest, HEADER_SIZE)[2]
            held.append(HeldPublish(pub, [method, rest], body, body, queues, now, seq,
                                    None, generation))
            nbytes += stop - start
            start = stop
        if confirms is not None:
            confirms.client_seq = seq
        self.held.grow(ch, nbytes)
        self.held.account(0, len(ends))
