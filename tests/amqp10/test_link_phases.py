"""A sender link's phases as the credit gate moves them: the delivery it is in the middle of
(``enforce.states.DeliveryPhase``) through each fate a first frame can decide, and the one
predicate (``SenderLink.may_run``) that says whether its deliveries may be booked in a run."""

from __future__ import annotations

import itertools
from pathlib import Path

from floodwall.enforce.amqp10.links import SenderLink, SpoolCapture
from floodwall.enforce.states import DETACHING_PHASES, DeliveryPhase, LinkPhase
from floodwall.wire.amqp10.addresses import parse_target
from floodwall.wire.amqp10.credit import SenderCredit
from floodwall.wire.amqp10.performatives import TRANSFER
from floodwall.wire.amqp10.types import UInt
from tests.amqp10.streams import amqp, continuation, transfer
from tests.amqp10.test_credit_gate import ANON_H, CAPPED_H, Setup, broker_flow, message
from tests.amqp10.test_spool_gate import spooling

D = DeliveryPhase


def _phase(s: Setup, handle: int) -> DeliveryPhase:
    link = s.gate.sessions[0].links[handle]
    assert isinstance(link, SenderLink)
    return link.delivery.phase


def _link(phase: LinkPhase, delivery: DeliveryPhase, per_message: bool,
          shadowed: bool) -> SenderLink:
    link = SenderLink(0, 1, "l", None if per_message else parse_target("/amq/queue/q"),
                      per_message, SenderCredit(0))
    link.phase, link.delivery.phase = phase, delivery
    if delivery is D.CAPTURING:
        link.capture = SpoolCapture(("/", "q"), "/amq/queue/q", 0, 0)
    if shadowed:
        link.shadow.on = frozenset({("/", "q")})
    return link


def test_the_run_predicate_is_every_check_a_run_made_of_the_link() -> None:
    """Every combination of the link's state: ``may_run`` says what the run's checks said,
    written out one by one (not blocked, not detaching, not per-message, nothing captured,
    not held in shadow, no delivery in progress or being dropped)."""
    seen = set()
    for phase, delivery, per_message, shadowed in itertools.product(
            LinkPhase, DeliveryPhase, (False, True), (False, True)):
        link = _link(phase, delivery, per_message, shadowed)
        in_progress = delivery is not D.IDLE
        dropping = delivery in (D.DROPPING, D.CAPTURING)
        by_hand = not (phase is LinkPhase.WITHHELD or phase in DETACHING_PHASES
                       or link.per_message or link.capture is not None or link.shadow.on
                       or in_progress or dropping)
        assert link.may_run is by_hand, (phase, delivery, per_message, shadowed)
        seen.add(by_hand)
    assert seen == {False, True}


def test_a_forwarded_delivery_is_forwarding_until_its_last_frame() -> None:
    s = Setup()
    s.server(broker_flow(7, 0, 1000))
    body = message(3000)
    s.client(transfer(0, CAPPED_H, 0, body[:1000], more=True))
    assert _phase(s, CAPPED_H) is D.FORWARDING
    assert not s.gate.sessions[0].links[CAPPED_H].may_run  # type: ignore[union-attr]
    s.client(continuation(0, CAPPED_H, body[1000:2000], True))
    assert _phase(s, CAPPED_H) is D.FORWARDING
    s.client(continuation(0, CAPPED_H, body[2000:], False))
    assert _phase(s, CAPPED_H) is D.IDLE
    assert s.gate.sessions[0].links[CAPPED_H].may_run  # type: ignore[union-attr]
    to_server, _ = s.take()
    assert len(to_server) > 3000  # all three frames went on


def test_a_refused_delivery_is_dropped_until_its_last_frame() -> None:
    s = Setup(overflow="reject")
    s.server(broker_flow(9, 0, 1000))
    s.take()
    s.sample("capped", 500_000)
    body = message(3000, to="/amq/queue/capped")
    s.client(transfer(0, ANON_H, 0, body[:1500], more=True))
    assert _phase(s, ANON_H) is D.DROPPING
    s.client(continuation(0, ANON_H, body[1500:], False))
    assert _phase(s, ANON_H) is D.IDLE
    to_server, _ = s.take()
    assert to_server == b"" and s.counters.rejects == 1


def test_a_spooled_delivery_is_captured_and_one_the_spool_cannot_take_is_dropped(
        tmp_path: Path) -> None:
    s = spooling(tmp_path)
    body = message(30_000)
    s.client(transfer(0, CAPPED_H, 0, body[:8192], more=True))
    assert _phase(s, CAPPED_H) is D.CAPTURING
    s.client(continuation(0, CAPPED_H, body[8192:], False))
    assert _phase(s, CAPPED_H) is D.IDLE
    s = spooling(tmp_path / "2")
    s.gate.hold_budget = 12 * 1024
    s.client(transfer(0, CAPPED_H, 0, body[:8192], more=True))
    assert _phase(s, CAPPED_H) is D.CAPTURING
    s.client(continuation(0, CAPPED_H, body[8192:16384], True))  # past the hold budget
    assert _phase(s, CAPPED_H) is D.DROPPING and s.gate.captured_bytes == 0
    s.client(continuation(0, CAPPED_H, body[16384:], False))
    assert _phase(s, CAPPED_H) is D.IDLE
    to_server, _ = s.take()
    assert to_server == b"" and s.counters.spool_fallbacks == 1


def test_an_aborted_capture_ends_idle_with_nothing_held(tmp_path: Path) -> None:
    s = spooling(tmp_path)
    s.client(transfer(0, CAPPED_H, 0, message(20_000)[:8192], more=True))
    assert _phase(s, CAPPED_H) is D.CAPTURING
    s.client(amqp(TRANSFER, 0, b"", handle=UInt(CAPPED_H), aborted=True))
    assert _phase(s, CAPPED_H) is D.IDLE and s.gate.captured_bytes == 0


def test_a_detached_links_deliveries_are_dropped_frame_by_frame() -> None:
    s = Setup()
    s.server(broker_flow(7, 0, 1))
    s.take()
    s.client(transfer(0, CAPPED_H, 0, message(10)))
    s.client(transfer(0, CAPPED_H, 1, message(10)))  # beyond the credit: detached
    link = s.gate.sessions[0].links[CAPPED_H]
    assert isinstance(link, SenderLink) and link.detaching and not link.may_run
    assert link.delivery.phase is D.IDLE
    s.take()
    body = message(3000)
    s.client(transfer(0, CAPPED_H, 2, body[:1500], more=True))
    assert link.delivery.phase is D.DROPPING
    s.client(continuation(0, CAPPED_H, body[1500:], False))
    assert link.delivery.phase is D.IDLE
    to_server, _ = s.take()
    assert to_server == b""
