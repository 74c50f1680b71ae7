"""The one decision both gates take: pass, hold, reject or spool, as a table of cases; and the
strictest-overflow, signal and deadline rules written once."""

from __future__ import annotations

import itertools

import pytest

from floodwall.control.controller import ALARM, FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.lookups import Lookup, LookupKind
from floodwall.control.policy import DEFAULT_DEADLINE, Overflow, parse_policies
from floodwall.enforce.decision import (
    Decision,
    Unspoolable,
    Verdict,
    deadline_of,
    decide,
    should_signal,
    strictest_overflow,
)
from floodwall.spool.records import SpoolRecord
from tests.fakes import DefaultExchange, FakeSpool

V = "/"
POLICIES = parse_policies("""
version: 1
policies:
  - {name: held, match: {queue: "hold*"}, capacity: 100, deadline: 7s}
  - {name: rejected, match: {queue: "reject*"}, capacity: 100, overflow: reject, deadline: 3s}
  - {name: spooled, match: {queue: "spool*"}, capacity: 100, overflow: spool, signal: flow}
  - {name: quiet, match: {queue: "quiet*"}, capacity: 100, signal: none}
""")
LOOKUP = Lookup(V, LookupKind.QUEUE, "unknown").key


def controller(*tripped: str) -> FlowController:
    fc = FlowController(DefaultExchange(), POLICIES)
    for name in ("hold", "reject", "spool", "quiet", "hold2"):
        fc.queue_seen((V, name), 0.0)
        fc.sampled_management((V, name), ManagementSample(0.0, 0, 0, 0, 0, 0), 0.0)
    for name in tripped:
        fc.sampled_management((V, name), ManagementSample(1.0, 5, 0, 500, 500, 0), 1.0)
        assert (V, name) in fc.tripped
    return fc


def verdict(fc: FlowController, names: set[str], spool: FakeSpool | None = None,
            **flags: bool) -> Decision:
    queues = frozenset(names)
    blocking = fc.blocking(V, queues)
    if flags.get("lookup"):
        blocking |= {LOOKUP}
    return decide(V, queues, blocking, fc.queues, spool, **flags)


def test_nothing_blocking_passes_and_a_waiting_publisher_holds() -> None:
    fc = controller()
    assert verdict(fc, {"hold"}) == Decision(Verdict.PASS)
    assert verdict(fc, {"hold"}, behind=True) == Decision(Verdict.HOLD)
    assert verdict(fc, {"nowhere"}) == Decision(Verdict.PASS)


@pytest.mark.parametrize(("tripped", "names", "expected"), [
    ({"hold"}, {"hold"}, Verdict.HOLD),
    ({"reject"}, {"reject"}, Verdict.REJECT),
    ({"hold", "reject"}, {"hold", "reject"}, Verdict.REJECT),  # the strictest wins
    ({"reject"}, {"reject", "hold"}, Verdict.REJECT),
    ({"hold"}, {"hold", "reject"}, Verdict.HOLD),  # reject's queue is not tripped
    ({"spool"}, {"spool"}, Verdict.SPOOL),
    ({"spool"}, {"spool", "hold"}, Verdict.HOLD),  # several queues: never spooled
])
def test_tripped_queues_decide_by_their_policies(tripped: set[str], names: set[str],
                                                 expected: Verdict) -> None:
    fc = controller(*tripped)
    assert verdict(fc, names, FakeSpool()).verdict is expected


def test_the_alarm_holds_everything_and_is_never_spooled() -> None:
    fc = controller("spool")
    fc.set_alarm("memory")
    assert verdict(fc, {"spool"}, FakeSpool()).verdict is Verdict.HOLD
    assert verdict(fc, {"nowhere"}, FakeSpool()).verdict is Verdict.HOLD


def test_spool_needs_a_spool_that_accepts_and_no_lookup_and_nothing_ahead() -> None:
    fc = controller("spool")
    assert verdict(fc, {"spool"}, FakeSpool()) == Decision(Verdict.SPOOL, (V, "spool"))
    assert verdict(fc, {"spool"}, None).verdict is Verdict.HOLD  # no --spool-dir
    assert verdict(fc, {"spool"}, FakeSpool(accepting=False)).verdict is Verdict.HOLD
    assert verdict(fc, {"spool"}, FakeSpool(), lookup=True).verdict is Verdict.HOLD
    assert verdict(fc, {"spool"}, FakeSpool(), behind=True).verdict is Verdict.HOLD


def test_transactional_and_mandatory_publishes_are_held_and_say_why() -> None:
    fc = controller("spool")
    assert verdict(fc, {"spool"}, FakeSpool(), transactional=True) == Decision(
        Verdict.HOLD, not_spooled=Unspoolable.TRANSACTIONAL)
    assert verdict(fc, {"spool"}, FakeSpool(), mandatory=True) == Decision(
        Verdict.HOLD, not_spooled=Unspoolable.MANDATORY)


def test_a_backlog_is_joined_after_the_queue_released_so_nothing_overtakes_it() -> None:
    fc = controller()
    spool = FakeSpool()
    assert verdict(fc, {"spool"}, spool).verdict is Verdict.PASS
    spool.records[(V, "spool")] = []
    assert verdict(fc, {"spool"}, spool).verdict is Verdict.PASS  # empty: no backlog
    spool.append((V, "spool"), _record(), 1 << 20)
    assert verdict(fc, {"spool"}, spool) == Decision(Verdict.SPOOL, (V, "spool"))
    fc.set_backlog((V, "spool"), True)  # as the spool service says on append
    assert verdict(fc, {"spool"}, FakeSpool()) == Decision(Verdict.SPOOL, (V, "spool"))


def test_every_combination_of_flags_gives_one_verdict_and_spools_only_when_allowed() -> None:
    fc = controller("spool", "hold")
    for names, spool, lookup, txn, mandatory, behind in itertools.product(
            ({"spool"}, {"hold"}, {"spool", "hold"}, {"nowhere"}),
            (None, FakeSpool(), FakeSpool(accepting=False)),
            *([(False, True)] * 4)):
        d = verdict(fc, names, spool, lookup=lookup, transactional=txn, mandatory=mandatory,
                    behind=behind)
        may_spool = (names == {"spool"} and spool is not None and spool.accepting
                     and not (lookup or txn or mandatory or behind))
        assert (d.verdict is Verdict.SPOOL) == may_spool, (names, spool, lookup, txn,
                                                           mandatory, behind)
        blocked = bool(fc.blocking(V, frozenset(names))) or lookup
        if d.verdict is Verdict.PASS:
            assert not blocked and not behind
        assert (d.not_spooled is not None) == (
            names == {"spool"} and spool is not None and spool.accepting and not lookup
            and not behind and (txn or mandatory))


def test_strictest_overflow_signal_and_deadline_are_the_policies_of_the_keys() -> None:
    fc = controller()
    keys: list[QueueKey] = [(V, "hold"), (V, "reject")]
    assert strictest_overflow(fc.queues, keys) is Overflow.REJECT
    assert strictest_overflow(fc.queues, keys[:1]) is Overflow.HOLD
    assert strictest_overflow(fc.queues, [ALARM, LOOKUP]) is Overflow.HOLD
    assert deadline_of(fc.queues, keys) == 3.0
    assert deadline_of(fc.queues, [(V, "hold"), ALARM]) == 7.0
    assert deadline_of(fc.queues, [ALARM]) == DEFAULT_DEADLINE
    assert should_signal(fc.queues, [(V, "hold")], True)  # auto: the client decides
    assert not should_signal(fc.queues, [(V, "hold")], False)
    assert should_signal(fc.queues, [(V, "spool")], False)  # signal: flow
    assert not should_signal(fc.queues, [(V, "spool"), (V, "quiet")], True)  # none wins


def _record() -> SpoolRecord:
    return SpoolRecord(0, 0.0, "", "spool", b"", b"x")
