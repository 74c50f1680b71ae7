"""The phases of a 0-9-1 channel, of a 1.0 sender link and of the delivery it is in the middle
of, as the gates see them: enums and transition tables (h11's ``_state.py`` is the model).

A gate moves a channel or link with ``step(TABLE, phase, input)``; a pair the table does not
hold is an input that phase does not take, and ``step`` returns None: the caller leaves the
frame alone (it is not an answer the proxy waits for). The tests walk every pair.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, TypeVar


class ChannelPhase(Enum):
    """A 0-9-1 channel's phase in its publish gate."""

    OPEN = "open"  # publishes pass, are held or refused
    CLOSE_OKS_DUE = "close-oks due"  # the proxy closed it on both sides; both answers due
    BROKER_CLOSE_OK_DUE = "broker close-ok due"  # the client answered
    CLIENT_CLOSE_OK_DUE = "client close-ok due"  # the broker answered
    GONE = "gone"  # both answered: the channel number is free again


class ChannelInput(Enum):
    """What moves a channel: the proxy closing it, and each peer's close-ok to that."""

    PROXY_CLOSES = "the proxy closes the channel"
    CLIENT_CLOSE_OK = "the client's channel.close-ok"
    BROKER_CLOSE_OK = "the broker's channel.close-ok"


CHANNEL_PHASES: Final[dict[tuple[ChannelPhase, ChannelInput], ChannelPhase]] = {
    (ChannelPhase.OPEN, ChannelInput.PROXY_CLOSES): ChannelPhase.CLOSE_OKS_DUE,
    (ChannelPhase.CLOSE_OKS_DUE, ChannelInput.CLIENT_CLOSE_OK): ChannelPhase.BROKER_CLOSE_OK_DUE,
    (ChannelPhase.CLOSE_OKS_DUE, ChannelInput.BROKER_CLOSE_OK): ChannelPhase.CLIENT_CLOSE_OK_DUE,
    (ChannelPhase.BROKER_CLOSE_OK_DUE, ChannelInput.BROKER_CLOSE_OK): ChannelPhase.GONE,
    (ChannelPhase.CLIENT_CLOSE_OK_DUE, ChannelInput.CLIENT_CLOSE_OK): ChannelPhase.GONE,
}
"""A channel the proxy closes (a refusal without confirms, a deadline) waits for both
close-oks, which it absorbs; then it is forgotten."""

CLOSING_PHASES: Final = frozenset({ChannelPhase.CLOSE_OKS_DUE, ChannelPhase.BROKER_CLOSE_OK_DUE,
                                   ChannelPhase.CLIENT_CLOSE_OK_DUE})


class PublishPhase(Enum):
    """Where a 0-9-1 channel stands in its publishes' content, as its gate reads it: what its
    next content frame is to the gate."""

    READY = "ready"  # between publishes: a publish's content passes in place with it
    AWAITING_HEADER = "awaiting header"  # a publish's method came alone: its header decides it
    FILLING = "filling"  # a held (or spool-captured) publish's body arrives: it joins it
    DISCARDING = "discarding"  # a refused publish's body arrives: dropped


class PublishInput(Enum):
    """What moves a channel's publish phase."""

    METHOD_ALONE = "a basic.publish without its content header in the read"
    HEADER_CAME = "the awaited content header"
    TAKEN = "held or captured, its body still to come"
    DROPPED = "refused (or its channel closing), its body still to come"
    CONTENT_DONE = "the last body frame of the publish filled or dropped"
    RELEASED = "the publish filling is let go: the rest of its body passes in place"
    PROXY_CLOSES = "the proxy closes the channel: what is still to come of a body is dropped"


_P, _PI = PublishPhase, PublishInput
PUBLISH_PHASES: Final[dict[tuple[PublishPhase, PublishInput], PublishPhase]] = {
    (_P.READY, _PI.METHOD_ALONE): _P.AWAITING_HEADER,
    (_P.AWAITING_HEADER, _PI.HEADER_CAME): _P.READY,  # and is decided there
    (_P.READY, _PI.TAKEN): _P.FILLING,
    (_P.READY, _PI.DROPPED): _P.DISCARDING,
    (_P.FILLING, _PI.CONTENT_DONE): _P.READY,
    (_P.DISCARDING, _PI.CONTENT_DONE): _P.READY,
    (_P.FILLING, _PI.RELEASED): _P.READY,
    (_P.FILLING, _PI.PROXY_CLOSES): _P.DISCARDING,
    **{(phase, _PI.PROXY_CLOSES): phase
       for phase in (_P.READY, _P.AWAITING_HEADER, _P.DISCARDING)},
}
"""A publish is decided when its content header is in: it passes (the channel stays READY), is
held or captured for the spool while its body comes (FILLING) or is refused and its body
dropped (DISCARDING); a publish with no body, or held whole, leaves the channel READY. The
core's scanner keeps a content's frames in order (a method amid a body is a 505 there), so no
other pair can occur; one that does is a fault of the gate's, not of the client's.

Orthogonal to it: whether the channel holds frames (``ChannelFlow.held``: every frame but
``PASS_WHILE_HELD`` waits behind them) and its lifecycle (``CHANNEL_PHASES``). A channel is on
the core's fast path (``ChannelFlow.on_fast_path``) when it is READY, OPEN and holds nothing."""


class LinkPhase(Enum):
    """A 1.0 sender link's phase in its credit gate."""

    OPEN = "open"  # credit flows as the gate relays it
    WITHHELD = "withheld"  # blocked on queues: no more credit (the client was told)
    RELEASED = "released"  # the queues drained; its credit is decided again now
    DETACHES_DUE = "detaches due"  # the proxy detached it on both sides; both answers due
    BROKER_DETACH_DUE = "broker detach due"  # the client answered (or was not asked)
    CLIENT_DETACH_DUE = "client detach due"  # the broker answered
    GONE = "gone"  # both answered: forgotten


class LinkInput(Enum):
    """What moves a link."""

    BLOCKED = "a queue it feeds is tripped (or a lookup pending): credit withheld"
    RELEASED = "every queue it waited on drained"
    GRANTED = "credit given again"
    PROXY_DETACHES = "the proxy detaches it on both sides"
    PROXY_DETACHES_BROKER_SIDE = "the proxy detaches it where only the broker knows it"
    CLIENT_DETACH = "the client's detach answering the proxy's"
    BROKER_DETACH = "the broker's detach answering the proxy's"


_L, _I = LinkPhase, LinkInput
LINK_PHASES: Final[dict[tuple[LinkPhase, LinkInput], LinkPhase]] = {
    (_L.OPEN, _I.BLOCKED): _L.WITHHELD,
    (_L.OPEN, _I.GRANTED): _L.OPEN,
    (_L.OPEN, _I.RELEASED): _L.OPEN,  # nothing was withheld: its credit is decided again
    (_L.WITHHELD, _I.BLOCKED): _L.WITHHELD,  # blocked on more queues
    (_L.WITHHELD, _I.RELEASED): _L.RELEASED,
    (_L.RELEASED, _I.BLOCKED): _L.WITHHELD,  # tripped again in the same breath
    (_L.RELEASED, _I.GRANTED): _L.OPEN,  # the client is told to go on
    **{(phase, _I.PROXY_DETACHES): _L.DETACHES_DUE
       for phase in (_L.OPEN, _L.WITHHELD, _L.RELEASED)},
    **{(phase, _I.PROXY_DETACHES_BROKER_SIDE): _L.BROKER_DETACH_DUE
       for phase in (_L.OPEN, _L.WITHHELD, _L.RELEASED)},
    (_L.DETACHES_DUE, _I.CLIENT_DETACH): _L.BROKER_DETACH_DUE,
    (_L.DETACHES_DUE, _I.BROKER_DETACH): _L.CLIENT_DETACH_DUE,
    (_L.BROKER_DETACH_DUE, _I.BROKER_DETACH): _L.GONE,
    (_L.CLIENT_DETACH_DUE, _I.CLIENT_DETACH): _L.GONE,
}
"""A link's credit is withheld while a queue it feeds is tripped, and decided again when the
controller releases it; a link the proxy detaches (past its deadline, beyond its credit)
drops its frames and absorbs both peers' detaches, then is forgotten."""

DETACHING_PHASES: Final = frozenset({LinkPhase.DETACHES_DUE, LinkPhase.BROKER_DETACH_DUE,
                                     LinkPhase.CLIENT_DETACH_DUE, LinkPhase.GONE})

LINK_RUN_PHASES: Final = frozenset({LinkPhase.OPEN, LinkPhase.RELEASED})
"""The link phases in which its deliveries may be booked in a run (``SenderLink.may_run``):
neither blocked nor detached (RELEASED lasts only while a release decides the link's credit
again, which moves it on before any transfer is read)."""


class DeliveryPhase(Enum):
    """What becomes of the delivery a 1.0 sender link is in the middle of: decided by its
    first frame, kept until its last."""

    IDLE = "idle"  # between deliveries: the next frame starts one
    FORWARDING = "forwarding"  # its frames go to the broker
    DROPPING = "dropping"  # the proxy consumed it (refused, a refused capture, a detached link)
    CAPTURING = "capturing"  # its frames are gathered for the spool (``SpoolCapture``)


class DeliveryInput(Enum):
    """What moves a delivery."""

    FIRST_FRAME = "its first frame: forwarded unless the gate decides otherwise"
    DROPPED_FIRST_FRAME = "its first frame, on a link the proxy detached: dropped"
    REFUSED = "the gate refuses it (overflow: reject): settled rejected by the proxy"
    SPOOLED = "the gate sends it to the spool"
    HELD = "the gate holds it for its queue (a per-message link under overflow: hold)"
    CAPTURE_REFUSED = "its capture cannot be spooled: the rest is dropped"
    LAST_FRAME = "its last frame, or an aborted one, was taken"
    PROXY_DETACHES = "the proxy detaches its link"


_D, _DI = DeliveryPhase, DeliveryInput
DELIVERY_PHASES: Final[dict[tuple[DeliveryPhase, DeliveryInput], DeliveryPhase]] = {
    (_D.IDLE, _DI.FIRST_FRAME): _D.FORWARDING,
    (_D.IDLE, _DI.DROPPED_FIRST_FRAME): _D.DROPPING,
    (_D.FORWARDING, _DI.REFUSED): _D.DROPPING,
    (_D.FORWARDING, _DI.HELD): _D.DROPPING,
    (_D.FORWARDING, _DI.SPOOLED): _D.CAPTURING,
    (_D.CAPTURING, _DI.CAPTURE_REFUSED): _D.DROPPING,
    **{(phase, _DI.LAST_FRAME): _D.IDLE
       for phase in (_D.FORWARDING, _D.DROPPING, _D.CAPTURING)},
    **{(phase, _DI.PROXY_DETACHES): _D.IDLE
       for phase in (_D.FORWARDING, _D.DROPPING, _D.CAPTURING)},
}
"""A delivery's first frame decides its fate (forwarded, refused, spooled; on a detached link
dropped); a capture the spool cannot take drops the rest; its last frame (or the proxy
detaching its link) ends it. A link takes the fast path only between deliveries
(``SenderLink.may_run``)."""

P = TypeVar("P", ChannelPhase, PublishPhase, LinkPhase, DeliveryPhase)
I = TypeVar("I", ChannelInput, PublishInput, LinkInput, DeliveryInput)  # noqa: E741


def step(table: dict[tuple[P, I], P], phase: P, event: I) -> P | None:
    """The phase after ``event``, or None when ``phase`` does not take it."""
    return table.get((phase, event))
