"""Every (phase, input) pair of the channel, link and delivery tables: what it moves to, or
that the phase does not take it (h11's ``_state.py`` tests are the model)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from floodwall.enforce.states import (
    CHANNEL_PHASES,
    CLOSING_PHASES,
    DELIVERY_PHASES,
    DETACHING_PHASES,
    LINK_PHASES,
    LINK_RUN_PHASES,
    PUBLISH_PHASES,
    ChannelInput,
    ChannelPhase,
    DeliveryInput,
    DeliveryPhase,
    LinkInput,
    LinkPhase,
    PublishInput,
    PublishPhase,
    step,
)

C, CI = ChannelPhase, ChannelInput
L, LI = LinkPhase, LinkInput
P, PI = PublishPhase, PublishInput
D, DI = DeliveryPhase, DeliveryInput

CHANNEL_EXPECTED = {
    (C.OPEN, CI.PROXY_CLOSES): C.CLOSE_OKS_DUE,
    (C.CLOSE_OKS_DUE, CI.CLIENT_CLOSE_OK): C.BROKER_CLOSE_OK_DUE,
    (C.CLOSE_OKS_DUE, CI.BROKER_CLOSE_OK): C.CLIENT_CLOSE_OK_DUE,
    (C.BROKER_CLOSE_OK_DUE, CI.BROKER_CLOSE_OK): C.GONE,
    (C.CLIENT_CLOSE_OK_DUE, CI.CLIENT_CLOSE_OK): C.GONE,
}

PUBLISH_EXPECTED = {
    (P.READY, PI.METHOD_ALONE): P.AWAITING_HEADER,
    (P.READY, PI.TAKEN): P.FILLING,
    (P.READY, PI.DROPPED): P.DISCARDING,
    (P.READY, PI.PROXY_CLOSES): P.READY,
    (P.AWAITING_HEADER, PI.HEADER_CAME): P.READY,
    (P.AWAITING_HEADER, PI.PROXY_CLOSES): P.AWAITING_HEADER,
    (P.FILLING, PI.CONTENT_DONE): P.READY,
    (P.FILLING, PI.RELEASED): P.READY,
    (P.FILLING, PI.PROXY_CLOSES): P.DISCARDING,
    (P.DISCARDING, PI.CONTENT_DONE): P.READY,
    (P.DISCARDING, PI.PROXY_CLOSES): P.DISCARDING,
}

LINK_EXPECTED = {
    (L.OPEN, LI.BLOCKED): L.WITHHELD,
    (L.OPEN, LI.GRANTED): L.OPEN,
    (L.OPEN, LI.RELEASED): L.OPEN,
    (L.OPEN, LI.PROXY_DETACHES): L.DETACHES_DUE,
    (L.OPEN, LI.PROXY_DETACHES_BROKER_SIDE): L.BROKER_DETACH_DUE,
    (L.WITHHELD, LI.BLOCKED): L.WITHHELD,
    (L.WITHHELD, LI.RELEASED): L.RELEASED,
    (L.WITHHELD, LI.PROXY_DETACHES): L.DETACHES_DUE,
    (L.WITHHELD, LI.PROXY_DETACHES_BROKER_SIDE): L.BROKER_DETACH_DUE,
    (L.RELEASED, LI.BLOCKED): L.WITHHELD,
    (L.RELEASED, LI.GRANTED): L.OPEN,
    (L.RELEASED, LI.PROXY_DETACHES): L.DETACHES_DUE,
    (L.RELEASED, LI.PROXY_DETACHES_BROKER_SIDE): L.BROKER_DETACH_DUE,
    (L.DETACHES_DUE, LI.CLIENT_DETACH): L.BROKER_DETACH_DUE,
    (L.DETACHES_DUE, LI.BROKER_DETACH): L.CLIENT_DETACH_DUE,
    (L.BROKER_DETACH_DUE, LI.BROKER_DETACH): L.GONE,
    (L.CLIENT_DETACH_DUE, LI.CLIENT_DETACH): L.GONE,
}

DELIVERY_EXPECTED = {
    (D.IDLE, DI.FIRST_FRAME): D.FORWARDING,
    (D.IDLE, DI.DROPPED_FIRST_FRAME): D.DROPPING,
    (D.FORWARDING, DI.REFUSED): D.DROPPING,
    (D.FORWARDING, DI.HELD): D.DROPPING,
    (D.FORWARDING, DI.SPOOLED): D.CAPTURING,
    (D.FORWARDING, DI.LAST_FRAME): D.IDLE,
    (D.FORWARDING, DI.PROXY_DETACHES): D.IDLE,
    (D.DROPPING, DI.LAST_FRAME): D.IDLE,
    (D.DROPPING, DI.PROXY_DETACHES): D.IDLE,
    (D.CAPTURING, DI.CAPTURE_REFUSED): D.DROPPING,
    (D.CAPTURING, DI.LAST_FRAME): D.IDLE,
    (D.CAPTURING, DI.PROXY_DETACHES): D.IDLE,
}


TABLES: dict[str, tuple[Any, ...]] = {
    "channel": (CHANNEL_PHASES, CHANNEL_EXPECTED, ChannelPhase, ChannelInput),
    "publish": (PUBLISH_PHASES, PUBLISH_EXPECTED, PublishPhase, PublishInput),
    "link": (LINK_PHASES, LINK_EXPECTED, LinkPhase, LinkInput),
    "delivery": (DELIVERY_PHASES, DELIVERY_EXPECTED, DeliveryPhase, DeliveryInput),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_pair_moves_as_expected_or_is_not_taken(name: str) -> None:
    table, expected, phases, inputs = TABLES[name]
    for phase, event in itertools.product(phases, inputs):
        assert step(table, phase, event) == expected.get((phase, event)), (phase, event)
    assert table == expected


def test_a_publish_phase_returns_to_ready_from_every_phase() -> None:
    # no phase a channel can reach keeps it off the fast path for good
    for phase in PublishPhase:
        assert P.READY in _reachable(PUBLISH_PHASES, phase)


def _reachable(table: dict[tuple[object, object], object], start: object) -> set[object]:
    seen, todo = {start}, [start]
    while todo:
        phase = todo.pop()
        for (src, _), dst in table.items():
            if src == phase and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    return seen


def test_every_phase_is_reachable_and_gone_is_final() -> None:
    assert _reachable(CHANNEL_PHASES, C.OPEN) == set(ChannelPhase)
    assert _reachable(LINK_PHASES, L.OPEN) == set(LinkPhase)
    assert _reachable(PUBLISH_PHASES, P.READY) == set(PublishPhase)
    assert _reachable(DELIVERY_PHASES, D.IDLE) == set(DeliveryPhase)
    assert not any(src is C.GONE for src, _ in CHANNEL_PHASES)
    assert not any(src is L.GONE for src, _ in LINK_PHASES)


def test_a_closing_channel_or_detaching_link_takes_only_the_peers_answers() -> None:
    for (phase, event) in CHANNEL_PHASES:
        if phase in CLOSING_PHASES:
            assert event in (CI.CLIENT_CLOSE_OK, CI.BROKER_CLOSE_OK)
    for (phase, event) in LINK_PHASES:
        if phase in DETACHING_PHASES:
            assert event in (LI.CLIENT_DETACH, LI.BROKER_DETACH)
    # once detaching, no credit decision moves it back
    for phase in DETACHING_PHASES:
        for event in (LI.BLOCKED, LI.RELEASED, LI.GRANTED, LI.PROXY_DETACHES):
            assert step(LINK_PHASES, phase, event) is None


def test_a_delivery_is_decided_by_its_first_frame_and_every_one_ends_idle() -> None:
    # Only an idle link starts a delivery; only a forwarded one is refused or spooled.
    for (phase, event) in DELIVERY_PHASES:
        if event in (DI.FIRST_FRAME, DI.DROPPED_FIRST_FRAME):
            assert phase is D.IDLE
        if event in (DI.REFUSED, DI.SPOOLED):
            assert phase is D.FORWARDING
    for phase in DeliveryPhase:
        if phase is not D.IDLE:
            assert step(DELIVERY_PHASES, phase, DI.LAST_FRAME) is D.IDLE
            assert step(DELIVERY_PHASES, phase, DI.PROXY_DETACHES) is D.IDLE


def test_a_link_runs_only_while_neither_blocked_nor_detaching() -> None:
    assert LINK_RUN_PHASES == {L.OPEN, L.RELEASED}
    assert not LINK_RUN_PHASES & DETACHING_PHASES and L.WITHHELD not in LINK_RUN_PHASES
