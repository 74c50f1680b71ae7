"""The broker's outcomes for a 1.0 client's deliveries, counted (``BrokerOutcomes``).

The broker's dispositions reach the client unchanged; the gate counts them per outcome, a
range at once, on every path a disposition takes through the core: a run of alike
settlements, one read by ``peek_disposition``, one decoded in full (a ``rejected`` one, for
its error's info; a transactional state; a renumbered session). Whole reads and one byte
at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from floodwall.control.policy import parse_policies
from floodwall.enforce.amqp10.outcomes import REJECT_EVENT_INTERVAL, rejected_error
from floodwall.enforce.events import BrokerRejected
from floodwall.ops.flow_metrics import FlowCollector, FlowStats
from floodwall.ops.logs import log_event
from floodwall.ops.telemetry import event_fields
from floodwall.wire.amqp10.performatives import DISPOSITION, ERROR, performative
from floodwall.wire.amqp10.types import Described, Symbol, UInt, ULong
from tests.amqp10.streams import amqp, bytewise, whole
from tests.amqp10.test_credit_gate import (
    ANON_H,
    FREE_H,
    SERVER_CH,
    Setup,
    broker_flow,
    policies,
)
from tests.conftest import record_calls

ACCEPTED = Described(ULong(0x24), [])
RELEASED = Described(ULong(0x26), [])
MODIFIED = Described(ULong(0x27), [True, False, None])
BASE = 1000  # uint-encoded ids (a run's template wants them)
CHUNKERS = [pytest.param(whole, id="whole"), pytest.param(bytewise, id="bytewise")]


def rejected(queue: str | None = None, reason: str | None = None) -> Described:
    """A ``rejected`` outcome as RabbitMQ 4.3 sends it: an error whose info names the queue
    and the reason (none before 4.3)."""
    info = {Symbol(k): v for k, v in (("queue", queue), ("reason", reason)) if v is not None}
    return Described(ULong(0x25), [performative(
        ERROR, condition=Symbol("amqp:resource-limit-exceeded"),
        description="queue full", info=info or None)])


def settle(first: int, last: int | None = None, state: object = ACCEPTED) -> bytes:
    return amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(first),
                last=UInt(first if last is None else last), settled=True, state=state,
                batchable=None)


def started(chunker: Callable[..., object], n: int) -> Setup:
    """A gated connection whose client sent ``n`` deliveries on the free link."""
    s = Setup(chunker=chunker)  # type: ignore[arg-type]
    s.next_id = BASE
    s.server(broker_flow(8, 0, 10_000))
    for _ in range(n):
        s.send(FREE_H)
    s.take()
    s.core.events()
    return s


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_each_outcome_is_counted_and_the_dispositions_pass_unchanged(
        chunker: Callable[..., object]) -> None:
    s = started(chunker, 120)
    data = (b"".join(settle(BASE + i) for i in range(40))  # a run of alike settlements
            + settle(BASE + 40, BASE + 49)  # one range, one frame
            + b"".join(settle(BASE + i, state=RELEASED) for i in range(50, 80))
            + settle(BASE + 80, BASE + 84, MODIFIED)
            + settle(BASE + 85, BASE + 86, Described(ULong(0x34), [b"tx", ACCEPTED]))
            + settle(BASE + 87, state=None)  # settled without a state: not an outcome
            + settle(BASE + 88, BASE + 90, rejected("q1", "maxlen"))
            + settle(BASE + 91, state=rejected()))
    s.server(data)
    assert s.take() == (b"", data)  # byte for byte to the client
    assert s.gate.outcomes.as_dict() == {"accepted": 52, "rejected": 4, "released": 30,
                                         "modified": 5}
    assert dict(s.counters.outcomes) == {0x24: 52, 0x25: 4, 0x26: 30, 0x27: 5}
    told = [e for e in s.core.events() if isinstance(e, BrokerRejected)]
    assert told == [BrokerRejected(1, "/", 0, BASE + 88, BASE + 90, 3,
                                   "amqp:resource-limit-exceeded", "queue full", "q1",
                                   "maxlen")]


def test_a_run_of_settlements_is_counted_by_its_ranges() -> None:
    s = started(whole, 64)
    calls = record_calls(s.gate, "on_server_settle_run")
    s.server(b"".join(settle(BASE + i, state=RELEASED) for i in range(64)))
    assert [call[1:4] for call in calls] == [(BASE, BASE + 63, 0x26)]  # one call
    assert s.gate.outcomes.counts[0x26] == 64


def test_rejects_are_told_at_most_once_a_second_with_the_count_between() -> None:
    s = started(whole, 20)
    for i in range(5):
        s.server(settle(BASE + i, state=rejected("q", "full")))
    s.clock.t += REJECT_EVENT_INTERVAL
    s.server(settle(BASE + 5, BASE + 6, rejected("q", "full")))
    told = [e for e in s.core.events() if isinstance(e, BrokerRejected)]
    assert [(e.first, e.last, e.count) for e in told] == [(BASE, BASE, 1),
                                                          (BASE + 5, BASE + 6, 6)]
    assert s.gate.outcomes.counts[0x25] == 7


def test_in_a_renumbered_session_the_brokers_ranges_are_counted_once() -> None:
    s = Setup(overflow="reject")
    s.server(broker_flow(8, 0, 10_000))
    s.send(FREE_H)
    s.send(FREE_H)
    s.sample("capped", 10**9)  # the capped queue trips: the anonymous link's refused
    s.server(broker_flow(9, 0, 10_000))
    s.send(ANON_H, to="/amq/queue/capped")  # rejected by the proxy: the session renumbers
    s.send(FREE_H)
    s.take()
    assert s.gate.sessions[0].ids.dropped == 1
    s.server(settle(0, 1) + settle(2, state=RELEASED))  # the broker's ids 0..2
    assert s.gate.outcomes.as_dict() == {"accepted": 2, "rejected": 0, "released": 1,
                                         "modified": 0}


def test_the_metric_has_every_outcome() -> None:
    s = started(whole, 3)
    s.server(settle(BASE, BASE + 1) + settle(BASE + 2, state=RELEASED))
    collector = FlowCollector(s.fc, s.counters, FlowStats(parse_policies(policies("hold"))),
                              lambda: s.clock.t)
    family = next(m for m in collector.collect() if m.name == "floodwall_amqp10_outcomes")
    got = {x.labels["outcome"]: x.value for x in family.samples if x.name.endswith("_total")}
    assert got == {"accepted": 2.0, "released": 1.0, "rejected": 0.0, "modified": 0.0}


def test_a_rejected_error_without_info_or_malformed_reads_as_empty() -> None:
    assert rejected_error(rejected()) == ("amqp:resource-limit-exceeded", "queue full", {})
    assert rejected_error(Described(ULong(0x25), [])) == ("", "", {})
    assert rejected_error(Described(ULong(0x25), [b"junk"])) == ("", "", {})


def test_a_broker_rejected_event_is_one_log_line_and_one_telemetry_record(
        caplog: pytest.LogCaptureFixture) -> None:
    told = BrokerRejected(3, "/", 0, 7, 9, 12, "amqp:resource-limit-exceeded", "full",
                          "orders", "maxlen")
    with caplog.at_level(logging.INFO, logger="floodwall.gate"):
        log_event(told)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    fields = record.__dict__
    assert (record.getMessage(), fields["conn"], fields["rejected"], fields["queue"],
            fields["reason"], fields["condition"]) == (
        "broker_rejected", 3, 12, "orders", "maxlen", "amqp:resource-limit-exceeded")
    name, rec = event_fields(told)  # type: ignore[misc]
    assert (name, rec["queue"], rec["count"], rec["reason"]) == (
        "broker_rejected", "orders", 12, "maxlen")
    without = BrokerRejected(3, "/", 0, 7, 7, 1, "", "", None, None)
    assert event_fields(without)[1]["queue"] == ""  # type: ignore[index]
