"""A channel's run of whole publishes booked at once (issue 19: the policed 0-9-1 publish).

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
``PublishFlow._decide`` and ``on_publish`` test, each listed in docs/architecture.md, "With
policies: the gate"): the channel holds nothing, fills nothing, awaits no content header,
discards no content, is not being closed by the proxy and has no Channel.Flow of ours
outstanding; the connection keeps no client connection.close back (other channels may hold:
nothing ``_decide`` asks about one channel depends on another's held frames, and a run
passes in place exactly as its publishes would one by one); no spool is configured; no
shadow policy has a trip and the channel has no shadow hold; the first publish's content
header carries no ``headers`` property (the route is then the one for ``None`` headers, for
every publish of the run: the scan ends at a header that carries them); the route needs no
lookup and none of its queues is blocking (a trip, a backlog, a first figure awaited, the
alarm); and the run stays below the ledger totals at which the controller would evaluate
any of its queues again (``floodwall.control.controller.quiet_room``). Within those bounds
``on_publish_run`` books exactly what ``on_publish`` would, publish by publish: the confirm
sequence numbers on both sides, and the body sizes and messages on each policed queue's
ledger (at the same ``now``, so into the same ledger bucket).
"""

from __future__ import annotations

from floodwall.control.controller import forwarded_run, quiet_room
from floodwall.enforce.amqp091.channels import BODY_SIZE
from floodwall.enforce.amqp091.refusals import Refusing
from floodwall.wire.amqp091.framing import HEADER_SIZE, Buffer
from floodwall.wire.amqp091.runs import HEADERS_FLAG

_NO_QUEUES: frozenset[str] = frozenset()


class PublishRuns(Refusing):
    """The gate's run booking (``PublishHooks.publish_run`` / ``on_publish_run``)."""

    _run_queues: frozenset[str] = _NO_QUEUES  # the route of the run ``publish_run`` allowed

    def publish_run(self, channel: int, buf: Buffer, header_offset: int, now: float
                    ) -> tuple[float, float] | None:
        """After the publish whose content header is at ``buf[header_offset]`` passed
        ``on_publish`` untouched: how many more whole publishes of that channel with the same
        method frame (at most), and how many body bytes, the gate books with
        ``on_publish_run`` as it would one at a time; None when it would decide something
        about the next one."""
        # Another channel's held frames change nothing here (issue 19: the held connection's
        # free channels): only this channel's state, the route's queues and the connection's
        # kept-back close are asked, as ``_decide`` asks them.
        if self._connection_close is not None or self.spool is not None:
            return None
        ch = self.channels.get(channel)
        if ch is None or ch.needs_every_frame or ch.flow_replies or ch.signalled_off \
                or ch.shadow.on or ch.last_publish is None:
            return None
        controller = self.controller
        if controller.trips.shadow:
            return None
        if BODY_SIZE.unpack_from(buf, header_offset + HEADER_SIZE)[3] & HEADERS_FLAG:
            return None
        pub = ch.last_publish[1]
        queues = controller.destinations(self.vhost, pub.exchange, pub.routing_key, None)
        if controller.blocking(self.vhost, queues):
            return None
        if not (queues and (pub.exchange or pub.routing_key in queues)) and \
                controller.lookup_for(self.vhost, pub.exchange, pub.routing_key, queues,
                                      now) is not None:
            return None
        room = quiet_room(controller.queues, self.vhost, queues)
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
        confirms = self.channels[channel].confirms
        if confirms is not None:
            confirms.client_seq += count
            confirms.forwarded(count)
        forwarded_run(self.controller.queues, self.vhost, self._run_queues, body_bytes, count,
                      now)
