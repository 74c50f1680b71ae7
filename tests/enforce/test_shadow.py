"""Shadow mode, sans-IO: a shadow policy's queue trips as an enforced one does, the gates count
what they would have done, and every frame passes as the same bytes (0-9-1 and 1.0).

The comparisons run the same byte streams through a gate under ``mode: enforce`` and under
``mode: shadow`` and check that the shadow counters say what enforce mode did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pamqp import commands

from floodwall.control.controller import ALARM
from floodwall.control.policy import Mode, PolicyStore, parse_policies, render_policies
from floodwall.enforce.decision import Verdict, decide
from floodwall.enforce.events import ShadowAction, WouldHave
from tests.amqp091.test_flow import Setup, pub
from tests.amqp091.wire import CH, method
from tests.amqp10.streams import bytewise, whole
from tests.amqp10.test_credit_gate import CAPPED_H, FREE_H, broker_flow, flows
from tests.amqp10.test_credit_gate import Setup as Setup10
from tests.fakes import FakeSpool

Chunker = Callable[[bytes], Iterator[bytes]]
CF = commands.Confirm


def _091(overflow: str = "hold", mode: str = "shadow", signal: str = "flow",
         extra: str = "") -> str:
    return f"""
version: 1
policies:
  - name: capped
    match: {{vhost: "/orders", queue: "capped"}}
    capacity: 2000
    resume: 1000
    overflow: {overflow}
    signal: {signal}
    mode: {mode}
{extra}"""


def shadow(counters: object, protocol: str = "amqp091") -> dict[str, int]:
    got = counters.shadow
    return {action: n for (proto, action), n in got.items() if proto == protocol and n}


def events(s: Setup) -> list[WouldHave]:
    """The shadow events the gate made (its core keeps them until asked)."""
    return [e for e in s.core.events() if isinstance(e, WouldHave)]


def trip(s: Setup, queue: str = "capped") -> None:
    s.sample(queue, 5000)
    assert s.fc.queues[("/orders", queue)].tripped


def feed(s: Setup, data: bytes, chunker: Chunker) -> bytes:
    for chunk in chunker(data):
        s.core.receive_from_client(chunk, s.clock.t)
    return s.core.data_for_server()


# -- policies -----------------------------------------------------------------------------
def test_mode_defaults_to_enforce_is_read_rendered_and_forced_by_the_store(
        tmp_path: Path) -> None:
    policies = parse_policies(_091(mode="shadow", extra="""  - name: other
    match: {vhost: "/orders", queue: "other"}
    capacity: 10
"""))
    assert [p.mode for p in policies] == [Mode.SHADOW, Mode.ENFORCE]
    assert policies.enforcing_vhosts == {"/orders"}
    assert parse_policies(render_policies(policies)) == policies
    assert all(p.mode is Mode.SHADOW for p in policies.in_shadow())
    assert policies.in_shadow().enforcing_vhosts == frozenset()
    path = tmp_path / "p.yaml"
    path.write_text(_091(mode="enforce"))
    store = PolicyStore.from_file(path, shadow=True)
    assert [p.mode for p in store.current] == [Mode.SHADOW]
    assert store.reload().ok and [p.mode for p in store.current] == [Mode.SHADOW]


def test_decide_gives_the_shadow_verdict_only_when_it_differs() -> None:
    s = Setup(policies=_091(mode="shadow"))
    key = ("/orders", "capped")
    trip(s)
    assert key not in s.fc.tripped and key in s.fc.trips.shadow
    would = s.fc.shadow_blocking("/orders", frozenset({"capped"}))
    assert would == {key}
    d = decide("/orders", frozenset({"capped"}), frozenset(), s.fc.queues, None, shadow=would)
    assert (d.verdict, d.shadow) == (Verdict.PASS, Verdict.HOLD)
    d = decide("/orders", frozenset({"capped"}), frozenset({key}), s.fc.queues, None,
               shadow=would)
    assert (d.verdict, d.shadow) == (Verdict.HOLD, None)


# -- 0-9-1 ---------------------------------------------------------------------------------
def _run_091(mode: str, chunker: Chunker, overflow: str = "hold",
             spool: FakeSpool | None = None, confirms: bool = False
             ) -> tuple[Setup, bytes, bytes]:
    """Three publishes trip ``capped`` (3000 > 2000), four more follow on channel 1 (one to
    ``free``, behind them), one on channel 2; then the queue drains and one more goes."""
    s = Setup(policies=_091(overflow, mode), spool=spool)
    if confirms:  # a refusal is then a nack, not a 406 channel.close that ends the channel
        select = method(CF.Select(), 1) + method(CF.Select(), 2)
        s.core.receive_from_client(select, s.clock.t)
        s.core.receive_from_server(method(CF.SelectOk(), 1) + method(CF.SelectOk(), 2),
                                   s.clock.t)
        assert s.core.data_for_server() == select
        s.core.data_for_client()
    first = b"".join(pub(1, "capped", 1000, i) for i in range(3))
    after = (b"".join(pub(1, "capped", 100, 10 + i) for i in range(3)) + pub(1, "free", 10, 20)
             + pub(2, "capped", 100, 21))
    sent = first + after
    out = feed(s, first, chunker) + feed(s, after, chunker)
    s.sample("capped", 0)
    out += s.core.data_for_server()
    last = pub(1, "capped", 10, 30)
    out += feed(s, last, chunker)
    return s, sent + last, out + s.core.data_for_server()


@pytest.mark.parametrize("chunker", [whole, bytewise], ids=["whole", "bytewise"])
def test_a_shadow_policy_changes_no_byte_and_counts_what_enforce_does(chunker: Chunker) -> None:
    enforced, _, _ = _run_091("enforce", chunker)
    s, sent, out = _run_091("shadow", chunker)
    assert out == sent  # every byte, in order
    assert s.core.data_for_client() == b""  # no Channel.Flow, nothing else of the proxy's
    assert s.counters.held_publishes == 0 and s.counters.held_messages == 0
    assert not s.fc.blocked_channels()
    q, eq = s.fc.queues[("/orders", "capped")], enforced.fc.queues[("/orders", "capped")]
    assert q.trips == eq.trips == 1
    got = shadow(s.counters)
    # Enforced: 5 publishes held (4 on channel 1, the one to 'free' behind them, 1 on 2),
    # two channels signalled off, then on at the release.
    assert enforced.counters.held_publishes == 5
    assert got["held"] == enforced.counters.held_publishes
    assert got["flow_off"] == enforced.counters.signal_total("flow_off") == 2
    # The would-be release is noticed at the channel's next publish (channel 1 only here).
    assert got["flow_on"] == 1 and enforced.counters.signal_total("flow_on") == 2
    kinds = [(e.at.channel, e.action) for e in events(s)]
    assert kinds == [(1, ShadowAction.HELD), (1, ShadowAction.FLOW_OFF),
                     (2, ShadowAction.HELD), (2, ShadowAction.FLOW_OFF),
                     (1, ShadowAction.FLOW_ON)]


def test_shadow_reject_and_spool_are_counted_never_done() -> None:
    enforced, _, _ = _run_091("enforce", whole, overflow="reject", confirms=True)
    s, sent, out = _run_091("shadow", whole, overflow="reject", confirms=True)
    assert out == sent and s.core.data_for_client() == b""  # no nack
    assert shadow(s.counters) == {"rejected": 4}  # the one to 'free' is not refused
    assert enforced.counters.rejects == 4
    spool = FakeSpool()
    s, sent, out = _run_091("shadow", whole, overflow="spool", spool=spool)
    assert out == sent and not spool.records
    assert shadow(s.counters) == {"spooled": 4}
    assert [e.action for e in events(s)] == [ShadowAction.SPOOLED, ShadowAction.SPOOLED]


def test_an_enforced_policy_beside_a_shadow_one_still_holds_and_only_it() -> None:
    extra = """  - name: strict
    match: {vhost: "/orders", queue: "capped2"}
    capacity: 2000
    resume: 1000
"""
    s = Setup(policies=_091(mode="shadow", extra=extra))
    trip(s, "capped")
    trip(s, "capped2")
    free_to_shadow = pub(2, "capped")
    assert feed(s, free_to_shadow, whole) == free_to_shadow
    assert feed(s, pub(1, "capped2"), whole) == b""  # enforced: held
    assert s.counters.held_publishes == 1 and shadow(s.counters) == {"held": 1, "flow_off": 1}


def test_the_alarm_holds_only_while_a_policy_enforces() -> None:
    s = Setup(policies=_091(mode="shadow"))
    s.fc.set_alarm("memory", s.clock.t)
    assert ALARM not in s.fc.tripped and ALARM in s.fc.trips.shadow
    data = pub(1, "capped")
    assert feed(s, data, whole) == data
    assert shadow(s.counters)["held"] == 1
    s.fc.set_policies(parse_policies(_091(mode="enforce")), [], s.clock.t)
    assert ALARM in s.fc.tripped
    assert feed(s, pub(2, "free"), whole) == b""


def test_a_reload_to_shadow_releases_what_an_enforced_trip_held() -> None:
    s = Setup(policies=_091(mode="enforce"))
    s.trip()
    held = pub(1, "capped")
    assert feed(s, held, whole) == b""
    s.fc.set_policies(parse_policies(_091(mode="shadow")), [], s.clock.t)
    s.board.settle()
    assert s.core.data_for_server() == held
    assert s.core.data_for_client() == method(CH.Flow(active=False), 1) + method(
        CH.Flow(active=True), 1)
    assert s.fc.queues[("/orders", "capped")].tripped  # still over: now only watched


# -- 1.0 -----------------------------------------------------------------------------------
def _run_10(mode: str, chunker: Chunker) -> tuple[Setup10, bytes, bytes, bytes]:
    """The capped link sends until its queue trips and beyond, then it drains; the free
    link sends one."""
    s = Setup10(chunker=chunker, policy_extra=f"    mode: {mode}")
    grant = broker_flow(7, 0, 1000) + broker_flow(8, 0, 1000)
    s.server(grant)
    sent = b"".join(s.send(CAPPED_H, 30_000) for _ in range(6))  # > 100,000: trips
    s.sample("capped", 0)
    sent += s.send(CAPPED_H, 100) + s.send(FREE_H, 100)
    to_server, to_client = s.take()
    return s, grant + sent, to_server, to_client


@pytest.mark.parametrize("chunker", [whole, bytewise], ids=["whole", "bytewise"])
def test_a_shadow_link_keeps_the_brokers_credit_and_counts_the_withholding(
        chunker: Chunker) -> None:
    enforced, _, _, _ = _run_10("enforce", chunker)
    s, sent, to_server, to_client = _run_10("shadow", chunker)
    grant = broker_flow(7, 0, 1000) + broker_flow(8, 0, 1000)
    assert to_client == grant  # the broker's flows as they were, and nothing else
    assert to_server == sent[len(grant):]  # every transfer, byte-exact
    assert not flows(to_client[len(grant):])
    q, eq = s.fc.queues[("/", "capped")], enforced.fc.queues[("/", "capped")]
    assert q.trips == eq.trips == 1
    got = shadow(s.counters, "amqp10")
    assert got["credit_withheld"] == enforced.counters.signal_total("flow_off") == 1
    assert got["credit_restored"] == enforced.counters.signal_total("flow_on") == 1
