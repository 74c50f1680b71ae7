"""AMQP 1.0 per-message links under ``overflow: hold``, driven by bytes: a message to a tripped
queue is held for its queue (consumed, the session renumbered, the link keeping its credit),
sent in order as ``SendHeld`` commands when the queue drains, and settled to the client once
with the broker's outcome; the deadline, the window and the budgets bound what is held."""

from __future__ import annotations

import pytest

from floodwall.enforce.amqp10.links import WINDOW_BYTES, link_ref
from floodwall.enforce.commands import SendHeld
from floodwall.wire.amqp10.performatives import DETACH, DISPOSITION, ERROR, TRANSFER, performative
from floodwall.wire.amqp10.types import Described, Symbol, UInt, ULong
from tests.amqp10.streams import amqp, performatives, whole
from tests.amqp10.test_credit_gate import (
    ANON_H,
    CHUNKERS,
    SERVER_CH,
    VHOST,
    Chunker,
    Setup,
    broker_flow,
    credit_seen,
    flows,
    message,
    num,
)
from tests.amqp10.test_spool_gate import ACCEPTED, REJECTED, dispositions

CAPPED = (VHOST, "capped")
TO_CAPPED, TO_FREE = "/amq/queue/capped", "/amq/queue/free"
RELEASED = 0x26


def holding(chunker: Chunker = whole, extra: str = "") -> Setup:
    """A gated connection whose anonymous link has the broker's credit; capped is tripped."""
    s = Setup(chunker=chunker, policy_extra=extra)
    s.server(broker_flow(9, 0, 1000))
    s.take()
    s.sample("capped", 500_000)
    assert s.fc.queues[CAPPED].tripped
    return s


def sends(s: Setup) -> list[SendHeld]:
    s.core.collect()
    return [e for e in s.core.events() if isinstance(e, SendHeld)]


def forwarded(to_server: bytes) -> list[list[object]]:
    return [f for code, f in performatives(to_server) if code == TRANSFER]


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_message_to_a_tripped_queue_is_held_and_the_link_keeps_its_credit(
        chunker: Chunker) -> None:
    s = holding(chunker)
    s.send(ANON_H, 100, to=TO_CAPPED)  # client id 0: held
    s.send(ANON_H, 100, to=TO_FREE)  # client id 1: the broker's 0
    s.send(ANON_H, 101, to=TO_CAPPED)  # client id 2: held behind the first
    s.send(ANON_H, 100, to=TO_FREE)  # client id 3: the broker's 1
    to_server, to_client = s.take()
    assert [(num(f[0]), num(f[1])) for f in forwarded(to_server)] == [(ANON_H, 0), (ANON_H, 1)]
    assert dispositions(to_client) == []  # held: not settled yet
    assert not s.fc.is_blocked(1, link_ref(0, ANON_H))  # the link was never held back
    assert all(num(f[6]) > 0 for f in flows(to_client, 9))
    assert sends(s) == []  # nothing goes while the queue is tripped
    assert [v.as_dict() for v in s.gate.held_views()] == [
        {"queue": "capped", "waiting": 2, "sending": 0,
         "bytes": len(message(100, TO_CAPPED)) + len(message(101, TO_CAPPED))}]
    assert s.counters.held_messages == 2 and s.gate.held_bytes == s.counters.held_bytes > 0
    s.sample("capped", 0)  # drained: the held messages go, in order
    got = sends(s)
    assert [(g.address, g.payload) for g in got] == [(TO_CAPPED, message(100, TO_CAPPED)),
                                                     (TO_CAPPED, message(101, TO_CAPPED))]
    assert s.take()[0] == b""  # not through the client's link: through the proxy's own sender
    accepted = Described(ULong(ACCEPTED), [])
    s.gate.held_settled(got[1].token, accepted, s.clock.t)
    s.gate.held_settled(got[0].token, accepted, s.clock.t)
    s.gate.held_settled(got[0].token, accepted, s.clock.t)  # told once, however often
    s.core.collect()
    _, to_client = s.take()
    assert [(a, b, c) for a, b, c, _ in dispositions(to_client)] == [(2, 2, ACCEPTED),
                                                                      (0, 0, ACCEPTED)]
    assert s.gate.held_views() == [] and s.gate.held_bytes == s.counters.held_bytes == 0
    assert s.gate.outcomes.counts[ACCEPTED] == 2


def test_the_brokers_rejection_reaches_the_client_with_its_error() -> None:
    s = holding()
    s.send(ANON_H, 100, to=TO_CAPPED)
    s.sample("capped", 0)
    (got,) = sends(s)
    error = performative(ERROR, condition=Symbol("amqp:not-found"), description="no queue")
    s.gate.held_settled(got.token, Described(ULong(REJECTED), [error]), s.clock.t)
    s.core.collect()
    ((first, last, code, value),) = dispositions(s.take()[1])
    assert (first, last, code) == (0, 0, REJECTED)
    assert value == [error]


def test_a_message_behind_held_ones_is_held_while_they_are_in_flight() -> None:
    s = holding()
    s.send(ANON_H, 100, to=TO_CAPPED)
    s.sample("capped", 0)
    (first,) = sends(s)
    s.send(ANON_H, 50, to=TO_CAPPED)  # capped is not tripped, but the first is not settled
    to_server, _ = s.take()
    assert to_server == b""
    (second,) = sends(s)  # goes at once, behind the first
    assert second.payload == message(50, TO_CAPPED)
    s.gate.held_settled(first.token, Described(ULong(ACCEPTED), []), s.clock.t)
    s.gate.held_settled(second.token, Described(ULong(ACCEPTED), []), s.clock.t)
    s.send(ANON_H, 10, to=TO_CAPPED)  # nothing held any more: forwarded
    to_server, _ = s.take()
    assert [num(f[1]) for f in forwarded(to_server)] == [0]  # the broker's first delivery


def test_a_held_message_sent_settled_gets_no_disposition() -> None:
    s = holding()
    s.client(amqp(TRANSFER, 0, message(100, TO_CAPPED), handle=UInt(ANON_H),
                  delivery_id=UInt(0), delivery_tag=b"t", message_format=UInt(0), settled=True))
    s.sample("capped", 0)
    (got,) = sends(s)
    s.gate.held_settled(got.token, Described(ULong(ACCEPTED), []), s.clock.t)
    s.core.collect()
    assert dispositions(s.take()[1]) == []
    assert s.gate.held_bytes == 0


def test_held_past_the_deadline_is_rejected_naming_the_queue() -> None:
    s = holding(extra="    deadline: 5s\n")
    t0 = s.clock.t
    s.send(ANON_H, 100, to=TO_CAPPED)
    s.clock.t = t0 + 4
    s.send(ANON_H, 100, to=TO_CAPPED)
    s.take()
    assert s.board.expire(t0 + 4.9) == 0
    assert dispositions(s.take()[1]) == []
    s.board.expire(t0 + 5.1)  # the first waited 5.1 s, the second 1.1 s
    ((first, last, code, value),) = dispositions(s.take()[1])
    assert (first, last, code) == (0, 0, REJECTED)
    error = value[0]  # type: ignore[index]
    assert isinstance(error, Described)
    assert error.value[0] == "amqp:resource-limit-exceeded"
    assert "queue 'capped'" in error.value[1] and "5s deadline" in error.value[1]
    assert s.counters.deadline_expiries == 1
    assert [v.waiting for v in s.gate.held_views()] == [1]
    s.sample("capped", 0)
    assert [g.payload for g in sends(s)] == [message(100, TO_CAPPED)]  # the second only


def test_a_link_past_its_window_of_held_bytes_is_held_back_by_credit() -> None:
    s = holding()
    size = 8000
    n = WINDOW_BYTES // len(message(size, TO_CAPPED)) + 1  # past the window with the last
    for _ in range(n):
        s.send(ANON_H, size, to=TO_CAPPED)
    _, to_client = s.take()
    assert s.fc.is_blocked(1, link_ref(0, ANON_H))  # the per-link hold, as before
    assert s.gate.held_views()[0].waiting == n
    link = s.gate.sessions[0].links[ANON_H]
    left = link.credit.client_credit  # type: ignore[union-attr]
    s.sample("capped", 0)
    got = sends(s)
    assert len(got) == n
    assert not s.fc.is_blocked(1, link_ref(0, ANON_H))
    _, to_client = s.take()
    # released, but its held bytes still fill its window: no more credit than it had
    assert credit_seen(to_client, 9, n) == left == link.credit.client_credit  # type: ignore[union-attr]
    for _ in range(left):  # what it still had credit for goes on (to the free queue here)
        s.send(ANON_H, size, to=TO_FREE)
    _, to_client = s.take()
    assert flows(to_client, 9) == []  # and is not topped up while its held bytes fill it
    assert link.credit.client_credit == 0  # type: ignore[union-attr]
    s.server(amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(0), last=UInt(left - 1),
                  settled=True, state=Described(ULong(ACCEPTED), [])))
    _, to_client = s.take()
    assert flows(to_client, 9) == []  # the broker settled those: still no top-up
    for g in got:
        s.gate.held_settled(g.token, Described(ULong(ACCEPTED), []), s.clock.t)
    s.core.collect()
    _, to_client = s.take()
    assert len(dispositions(to_client)) == n
    assert credit_seen(to_client, 9, n + left) > 0  # settled by the broker: credit again


def test_a_detached_links_held_messages_are_dropped_unsent() -> None:
    s = holding()
    s.send(ANON_H, 100, to=TO_CAPPED)
    s.send(ANON_H, 100, to=TO_CAPPED)
    s.client(amqp(DETACH, 0, handle=UInt(ANON_H), closed=True))
    s.take()
    assert s.gate.held_views() == [] and s.counters.held_bytes == 0
    assert not any(r[1] >= 1 << 48 for r in [(b.conn_id, b.channel)
                                              for b in s.fc.blocked_channels()])
    s.sample("capped", 0)
    assert sends(s) == []


def test_a_hold_budget_too_small_rejects_at_once() -> None:
    s = holding()
    s.gate.hold_budget = 50
    s.send(ANON_H, 100, to=TO_CAPPED)
    ((first, _, code, value),) = dispositions(s.take()[1])
    assert (first, code) == (0, REJECTED)
    assert "hold budget" in value[0].value[1]  # type: ignore[index]
    assert s.gate.held_views() == []
