"""Policies: units, the YAML loader and its line-numbered errors, matching, the engine, reload."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import floodwall.control.policy.model
from floodwall.control.policy import (
    BUILTIN_DEFAULTS,
    DEFAULT_DEADLINE,
    Fsync,
    Overflow,
    Policy,
    PolicyError,
    PolicySet,
    PolicyStore,
    QueueLimits,
    Signal,
    SpoolSettings,
    UnknownDepth,
    format_bytes,
    format_duration,
    glob_to_regex,
    load_policies,
    parse_bytes,
    parse_duration,
    parse_policies,
    render_policies,
    should_trip,
)

POLICIES_DIR = Path(__file__).resolve().parent.parent / "policies"
SCHEMA = json.loads((POLICIES_DIR / "schema.json").read_text())


def doc(body: str) -> str:
    """A version-1 document with ``body`` after the version line (so line 2 is body's first)."""
    return "version: 1\n" + body


# --- units ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    (0, 0), (65536, 65536), ("65536", 65536), ("100B", 100), ("100 B", 100),
    ("1KB", 1000), ("1MB", 1_000_000), ("2GB", 2_000_000_000), ("1TB", 10**12),
    ("1KiB", 1024), ("512KiB", 512 * 1024), ("64MiB", 64 * 2**20), ("10GiB", 10 * 2**30),
    ("1TiB", 2**40), ("1.5MiB", 1572864), ("0.5KB", 500), ("  3 MiB ", 3 * 2**20),
    ("0.1KiB", 102),  # fractions with a unit round down to whole bytes
    # Helm renders a large plain number as a float: 64MiB as 6.7108864e+07 (YAML: a float),
    # 10 MB as 1e+07 (YAML 1.1: a string).
    (6.7108864e+07, 64 * 2**20), ("1e+07", 10**7), ("1E6", 10**6), (2048.0, 2048),
])
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(("text", "reason"), [
    ("64mib", "did you mean 'MiB'"), ("64kb", "did you mean 'KB'"), ("1XB", "unknown unit 'XB'"),
    ("-1", "not a size"), (-1, "negative"), (1.5, "whole number"), ("1.5", "whole number"),
    ("1.5B", "whole number"), (True, "expected a size"), ("", "not a size"),
    ("MiB", "not a size"), ("1.5e0", "whole number"), (2.5e0, "whole number"),
    (-1.0e3, "negative"), ("1e6 MiB", "not a size"), (None, "expected a size"),
    ([1], "expected a size"),
])
def test_parse_bytes_refuses(text: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_bytes(text)


@pytest.mark.parametrize(("text", "expected"), [
    (30, 30.0), (0.25, 0.25), ("30", 30.0), ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0),
    ("1h", 3600.0), ("1.5s", 1.5), ("2 m", 120.0), ("0s", 0.0),
])
def test_parse_duration(text: object, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(("text", "reason"), [
    ("30S", "did you mean 's'"), ("1d", "unknown unit 'd'"), ("-1s", "not a duration"),
    (-2, ">= 0"), (True, "expected a duration"), ("soon", "not a duration"),
    (float("nan"), "finite"), (float("inf"), "finite"),
])
def test_parse_duration_refuses(text: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_duration(text)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0"), (1, "1"), (1000, "1KB"), (1024, "1KiB"), (262144, "256KiB"),
    (64 * 2**20, "64MiB"), (10**9, "1GB"), (2**40, "1TiB"), (1025, "1025"),
    (1024000, "1000KiB"),
])
def test_format_bytes_is_exact(n: int, text: str) -> None:
    assert format_bytes(n) == text
    assert parse_bytes(text) == n


@given(st.integers(min_value=0, max_value=2**50))
def test_format_bytes_round_trips(n: int) -> None:
    assert parse_bytes(format_bytes(n)) == n


@pytest.mark.parametrize(("seconds", "text"), [
    (30.0, "30s"), (120.0, "2m"), (3600.0, "1h"), (0.5, "500ms"), (1.5, "1500ms"),
    (90.0, "90s"), (0.0005, "0.0005s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


# --- globs ----------------------------------------------------------------------------

@pytest.mark.parametrize(("glob", "yes", "no"), [
    ("orders.*", ["orders.", "orders.eu", "orders.eu.1"], ["orders", "xorders.eu", "Orders.eu"]),
    ("a?c", ["abc", "a.c"], ["ac", "abbc"]),
    ("q[0-9]", ["q0", "q9"], ["qa", "q10"]),
    ("q[!0-9]", ["qa"], ["q0", "q"]),
    ("q[]]", ["q]"], ["q"]),
    ("q[a-]", ["qa", "q-"], ["qb"]),
    (r"literal\*", ["literal*"], ["literalx"]),
    ("a.b", ["a.b"], ["axb"]),  # a dot is a dot
    ("*", ["", "anything.at.all"], []),
])
def test_glob_matches_whole_name(glob: str, yes: list[str], no: list[str]) -> None:
    p = Policy(name="g", queue=glob, capacity=1)
    for queue in yes:
        assert p.matches("/", queue), queue
    for queue in no:
        assert not p.matches("/", queue), queue


@pytest.mark.parametrize(("glob", "reason"), [
    ("q[abc", "unclosed '\\['"), ("q[!", "unclosed"), ("q\\", "lone backslash"),
    ("", "empty"), ("q[z-a]", "bad character class"),
])
def test_bad_globs(glob: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        glob_to_regex(glob)


# --- the Policy dataclass -------------------------------------------------------------

def test_policy_defaults_follow_limits() -> None:
    p = Policy(name="p", capacity=1000, max_messages=50)
    assert (p.resume, p.resume_messages) == (1000, 50)
    assert p.deadline == DEFAULT_DEADLINE == 30.0
    assert (p.overflow, p.signal, p.on_unknown_depth) == (
        Overflow.HOLD, Signal.AUTO, UnknownDepth.KEEP)
    assert p.spool == SpoolSettings(max_bytes=2**30, fsync=Fsync.GROUP, group_commit_ms=10)
    assert BUILTIN_DEFAULTS.capacity == 0 and BUILTIN_DEFAULTS.max_messages is None
    assert not BUILTIN_DEFAULTS.is_limited


@pytest.mark.parametrize("kwargs", [
    {"capacity": -1}, {"capacity": 10, "resume": 11}, {"capacity": 0, "resume": 1},
    {"max_messages": 0}, {"resume_messages": 3}, {"max_messages": 5, "resume_messages": 6},
    {"deadline": 0.0}, {"queue": "a", "queue_regex": "a"}, {"queue": "a["},
])
def test_policy_refuses_inconsistent_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Policy(name="p", **kwargs)  # type: ignore[arg-type]


def test_spool_is_hold_without_a_spool_dir() -> None:
    spool = Policy(name="s", capacity=1, overflow=Overflow.SPOOL)
    assert spool.effective_overflow(spooling=False) is Overflow.HOLD
    assert Policy(name="r", capacity=1, overflow=Overflow.REJECT).effective_overflow(
        spooling=False) is Overflow.REJECT
    assert spool.effective_overflow(spooling=True) is Overflow.SPOOL


# --- the engine -----------------------------------------------------------------------

BYTES = Policy(name="bytes", capacity=100, resume=80)
COUNT = Policy(name="count", max_messages=10, resume_messages=7)
BOTH = Policy(name="both", capacity=100, resume=80, max_messages=10, resume_messages=7)


@pytest.mark.parametrize(("depth", "tripped", "expected"), [
    # not tripped: trips only strictly above capacity
    (0, False, False), (80, False, False), (99, False, False), (100, False, False),
    (101, False, True), (10**9, False, True),
    # tripped: releases only at or below resume
    (101, True, True), (100, True, True), (81, True, True), (80, True, False),
    (79, True, False), (0, True, False),
])
def test_bytes_hysteresis(depth: int, tripped: bool, expected: bool) -> None:
    assert should_trip(BYTES, depth, None, tripped) is expected  # messages unlimited: None ignored
    assert should_trip(BYTES, depth, 10**9, tripped) is expected  # ... and any count ignored


@pytest.mark.parametrize(("count", "tripped", "expected"), [
    (0, False, False), (7, False, False), (10, False, False), (11, False, True),
    (11, True, True), (10, True, True), (8, True, True), (7, True, False), (0, True, False),
])
def test_message_hysteresis(count: int, tripped: bool, expected: bool) -> None:
    assert should_trip(COUNT, None, count, tripped) is expected
    assert should_trip(COUNT, 10**12, count, tripped) is expected


@pytest.mark.parametrize(("nbytes", "count", "tripped", "expected"), [
    (100, 10, False, False),  # both at their limit: not over
    (101, 0, False, True),  # bytes alone trips
    (0, 11, False, True),  # count alone trips
    (80, 8, True, True),  # bytes low but count above resume: stays tripped
    (81, 7, True, True),  # count low but bytes above resume: stays tripped
    (80, 7, True, False),  # both at resume: released
    (90, 9, False, False),  # between resume and limit, not tripped: stays released
    (90, 9, True, True),  # ... tripped: stays tripped
])
def test_either_limit_trips_both_must_be_low_to_release(nbytes: int, count: int, tripped: bool,
                                                        expected: bool) -> None:
    assert should_trip(BOTH, nbytes, count, tripped) is expected


@pytest.mark.parametrize("mode", list(UnknownDepth))
@pytest.mark.parametrize("tripped", [False, True])
def test_unknown_depth_follows_policy(mode: UnknownDepth, tripped: bool) -> None:
    p = Policy(name="u", capacity=100, resume=80, max_messages=10, on_unknown_depth=mode)
    want = {UnknownDepth.KEEP: tripped, UnknownDepth.BLOCK: True, UnknownDepth.ALLOW: False}[mode]
    assert should_trip(p, None, None, tripped) is want
    assert should_trip(p, None, 0, tripped) is want  # one unknown is enough
    assert should_trip(p, 0, None, tripped) is want
    # a known figure over its limit trips whatever the other one is
    assert should_trip(p, 101, None, tripped) is True
    assert should_trip(p, None, 11, tripped) is True


def test_unlimited_policy_never_trips() -> None:
    p = Policy(name="free")
    for tripped in (False, True):
        assert should_trip(p, 10**15, 10**9, tripped) is False
        assert should_trip(p, None, None, tripped) is False


def test_should_trip_accepts_queue_limits() -> None:
    limits = QueueLimits(capacity=100, resume=80)
    assert BYTES.limits == limits
    assert should_trip(limits, 101, None, False) is True
    assert should_trip(limits, 90, None, True) is True
    assert should_trip(limits, 80, None, True) is False


@given(nbytes=st.none() | st.integers(0, 300), count=st.none() | st.integers(0, 30),
       tripped=st.booleans(), mode=st.sampled_from(list(UnknownDepth)))
def test_engine_invariants(nbytes: int | None, count: int | None, tripped: bool,
                           mode: UnknownDepth) -> None:
    p = Policy(name="b", capacity=100, resume=80, max_messages=10, resume_messages=7,
               on_unknown_depth=mode)
    got = should_trip(p, nbytes, count, tripped)
    over = (nbytes is not None and nbytes > 100) or (count is not None and count > 10)
    if over:
        assert got is True
    elif nbytes is None or count is None:
        assert got is {UnknownDepth.KEEP: tripped, UnknownDepth.BLOCK: True,
                       UnknownDepth.ALLOW: False}[mode]
    elif nbytes <= 80 and count <= 7:
        assert got is False
    else:
        assert got is tripped  # the band between resume and limit keeps the state


def test_seed_scenario_trips_and_releases_once_each() -> None:
    """Depth climbs 0..300 then drains to 0: one trip just above 256, one release at 192."""
    p = Policy(name="demo", capacity=256, resume=192)
    tripped, changes = False, []
    for depth in [*range(0, 301), *range(300, -1, -1)]:
        now = should_trip(p, depth, None, tripped)
        if now != tripped:
            changes.append((depth, now))
        tripped = now
    assert changes == [(257, True), (192, False)]


# --- loading and matching -------------------------------------------------------------

def test_example_and_demo_load() -> None:
    example = load_policies(POLICIES_DIR / "example.yaml")
    orders = example.for_queue("/", "orders.eu")
    assert orders is not None and orders.name == "orders"
    assert (orders.capacity, orders.resume) == (64 * 2**20, 48 * 2**20)
    assert (orders.max_messages, orders.resume_messages) == (100000, 80000)
    assert orders.overflow is Overflow.SPOOL and orders.effective_overflow(
        spooling=False) is Overflow.HOLD
    assert orders.spool == SpoolSettings(max_bytes=10 * 2**30, fsync=Fsync.GROUP,
                                         group_commit_ms=5)
    audit = example.for_queue("billing", "audit.eu.17")
    assert audit is not None and audit.deadline == 0.5 and audit.resume == 512 * 1024
    assert example.for_queue("billing", "audit.eu.17x") is None  # regex matches whole names
    assert example.for_queue("/", "scratch.1") is None  # exempt
    assert example.for_queue("/", "anything") is None  # defaults for / set no limit

    demo = load_policies(POLICIES_DIR / "demo.yaml")
    p = demo.for_queue("/", "demo.orders")
    assert p is not None
    assert (p.capacity, p.resume, p.deadline) == (256 * 1024, 192 * 1024, 120.0)
    assert p.overflow is Overflow.HOLD
    # seed 000: 1 KiB at 100 msg/s in, 10 msg/s out grows 90 KiB/s: trips within 3 s
    assert p.capacity / (90 * 1024) < 3.0
    assert not demo.is_policed("/", "demo.orders.other")


MATCHING = doc("""\
defaults:
  - vhost: "/"
    capacity: 1MiB
    resume: 512KiB
    deadline: 10s
    spool: {fsync: always}
  - vhost: other
    max_messages: 5
policies:
  - name: first
    match: {queue: "orders.eu.*"}
    capacity: 2MiB
  - name: second
    match: {queue: "orders.*"}
    resume: 256KiB
  - name: exempt
    match: {queue: "logs.*"}
    capacity: 0
  - name: rx
    match: {vhost: other, queue_regex: "jobs-[0-9]+"}
    max_messages: 100
    spool: {group_commit_ms: 3}
""")


def test_first_match_in_file_order_wins() -> None:
    ps = parse_policies(MATCHING)
    a, b = ps.for_queue("/", "orders.eu.1"), ps.for_queue("/", "orders.us")
    assert a is not None and a.name == "first"
    assert b is not None and b.name == "second"


def test_policies_inherit_from_their_vhost_defaults() -> None:
    ps = parse_policies(MATCHING)
    first = ps.for_queue("/", "orders.eu.1")
    assert first is not None
    # capacity given without resume: resume = its own capacity, not the inherited 512KiB
    assert (first.capacity, first.resume) == (2 * 2**20, 2 * 2**20)
    assert first.deadline == 10.0 and first.spool.fsync is Fsync.ALWAYS
    second = ps.for_queue("/", "orders.us")
    assert second is not None and (second.capacity, second.resume) == (2**20, 256 * 1024)
    rx = ps.for_queue("other", "jobs-12")
    assert rx is not None
    assert (rx.max_messages, rx.resume_messages) == (100, 100)
    assert rx.capacity == 0 and rx.deadline == DEFAULT_DEADLINE
    assert rx.spool == SpoolSettings(group_commit_ms=3)  # other fields built-in


def test_the_in_flight_allowance_is_auto_unless_given_and_inherited_from_the_defaults() -> None:
    text = doc("defaults:\n  - vhost: /\n    in_flight_allowance: 1MiB\n"
               "policies:\n  - {name: a, match: {queue: a}, capacity: 256KiB}\n"
               "  - {name: b, match: {queue: b}, capacity: 256KiB, in_flight_allowance: auto}\n"
               "  - {name: c, match: {vhost: v, queue: c}, capacity: 1MiB,"
               " in_flight_allowance: 64KiB}\n")
    ps = parse_policies(text)
    a, b, c = (ps.match(v, q) for v, q in (("/", "a"), ("/", "b"), ("v", "c")))
    assert a is not None and a.in_flight_allowance == 2**20
    assert b is not None and b.in_flight_allowance is None
    assert c is not None and c.in_flight_allowance == 64 * 1024
    assert BUILTIN_DEFAULTS.in_flight_allowance is None
    shown = render_policies(ps)
    assert "in_flight_allowance: 1MiB" in shown and "in_flight_allowance: auto" in shown
    assert schema_errors(text) == []
    with pytest.raises(ValueError, match="in_flight_allowance must be > 0"):
        Policy(name="x", queue="x", capacity=1, in_flight_allowance=0)


def test_vhost_defaults_police_unmatched_queues() -> None:
    ps = parse_policies(MATCHING)
    d = ps.for_queue("/", "unmatched")
    assert d is not None and d.name == "defaults[/]" and d.capacity == 2**20
    o = ps.for_queue("other", "jobs-x")
    assert o is not None and o.name == "defaults[other]" and o.max_messages == 5
    assert ps.for_queue("nowhere", "orders.eu.1") is None  # policies are per vhost
    assert not ps.is_policed("/", "logs.app")  # an unlimited policy exempts
    assert ps.match("/", "logs.app") is not None  # ... though it matches
    assert ps.vhosts == frozenset({"/", "other"})


def test_lookups_are_cached_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    ps = parse_policies(MATCHING)
    calls: list[tuple[str, str]] = []
    real = PolicySet.match

    def counting(self: PolicySet, vhost: str, queue: str) -> Policy | None:
        calls.append((vhost, queue))
        return real(self, vhost, queue)

    monkeypatch.setattr(PolicySet, "match", counting)
    monkeypatch.setattr(floodwall.control.policy.model, "_CACHE_SIZE", 2)
    for _ in range(3):
        assert ps.is_policed("/", "orders.us")
    assert calls == [("/", "orders.us")]
    ps.for_queue("/", "a")
    ps.for_queue("/", "b")  # evicts orders.us, the least recently used
    ps.for_queue("/", "orders.us")
    assert calls == [("/", "orders.us"), ("/", "a"), ("/", "b"), ("/", "orders.us")]
    assert len(ps._cache) == 2


def test_empty_sections_are_fine() -> None:
    ps = parse_policies("version: 1\npolicies:\ndefaults: []\n")
    assert len(ps) == 0 and not ps.is_policed("/", "q")


def test_render_round_trips() -> None:
    for ps in (parse_policies(MATCHING), load_policies(POLICIES_DIR / "example.yaml")):
        again = parse_policies(render_policies(ps))
        assert again == ps
        assert again.for_queue("/", "orders.us") == ps.for_queue("/", "orders.us")


@pytest.mark.parametrize(("written", "queue"), [
    (r"caf\u00e9", "caf\u00e9"), (r"\U0001F600 q", "\U0001f600 q"), (r"a\u2028b", "a\u2028b"),
    (r"\uFEFFq", "\ufeffq"), (r'quo\"te\\s', 'quo"te\\s'), (r"tab\there", "tab\there"),
    (r"\x85nel", "\x85nel"), (r"\ud800", "\ud800")])
def test_render_round_trips_any_queue_name(written: str, queue: str) -> None:
    """A name with characters beyond the BMP, line separators, a BOM, a lone surrogate or
    escapes reads back as it was (JSON's surrogate pairs read as two lone surrogates in
    YAML)."""
    text = ('version: 1\npolicies:\n  - {name: p, match: {queue: "' + written
            + '"}, capacity: 1KiB}\n')
    ps = parse_policies(text)
    assert ps.policies[0].queue == queue
    again = parse_policies(render_policies(ps))
    assert again == ps and again.policies[0].queue == queue


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("capacity", "1e92000", "larger than 9223372036854775807"),
    ("capacity", "1e1000000000", "larger than 9223372036854775807"),  # not computed
    ("capacity", "9" * 30 + "KiB", "larger than 9223372036854775807"),
    ("max_messages", "1e19", "larger than 9223372036854775807"),
    ("deadline", "9" * 400 + "s", "longer than 2147483648s"),
    ("deadline", "99999999999999999999h", "longer than 2147483648s"),
])
def test_a_number_too_large_to_mean_anything_is_a_problem_with_its_line(
        field: str, value: str, reason: str) -> None:
    """A size, count or duration past what the proxy can hold (a 92,000-digit capacity
    crashed the rendering; a deadline of infinite seconds too) is refused where it stands."""
    extra = "" if field == "capacity" else ", capacity: 1KiB"
    with pytest.raises(PolicyError) as info:
        parse_policies("version: 1\npolicies:\n  - {name: p, match: {queue: q}, "
                       f"{field}: {value}{extra}}}\n", "p.yaml")
    assert info.value.problems[0].line == 3 and reason in str(info.value)


# --- errors, with their line ----------------------------------------------------------

BAD = [
    ("", 1, "empty file"),
    ("- 1\n", 1, "expected a mapping with 'version: 1'"),
    ("policies: []\n", 1, "missing 'version: 1'"),
    ("# c\nversion: 2\n", 2, "version: the number 2 is not supported"),
    ("version: '1'\n", 1, "is not supported"),
    ("version: 1\nversion: 1\n", 2, "duplicate key 'version' (first on line 1)"),
    ("version: 1\npolicy: []\n", 2, "unknown key 'policy'"),
    ("version: 1\npolicies: [1\n", 3, "YAML syntax"),
    ("version: 1\npolicies: {a: 1}\n", 2, "policies: expected a list, got a mapping"),
    (doc("policies:\n  - 7\n"), 3, "policies[0]: expected a mapping, got the number 7"),
    (doc("policies:\n  - match: {queue: a}\n"), 3, "missing required key 'name'"),
    (doc("policies:\n  - name: a\n"), 3, "missing required key 'match'"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    capcity: 1\n"), 5,
     "policies[0] (a): unknown key 'capcity'"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 64mib\n"), 5,
     "capacity: '64mib': unknown unit 'mib' (did you mean 'MiB'?)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: -5\n"), 5, "negative"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: [1]\n"), 5,
     "expected a size such as 64MiB, got a list"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 1MiB\n"
         "    resume: 2MiB\n"), 6, "resume: 2MiB is more than capacity (1MiB)"),
    (doc("defaults:\n  - vhost: /\n    capacity: 1MiB\npolicies:\n  - name: a\n"
         "    match: {queue: a}\n    resume: 2MiB\n"), 8,
     "is more than capacity (1MiB) (from defaults for vhost '/')"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    resume: 1\n"), 5,
     "is more than capacity (0 = unlimited)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    resume_messages: 1\n"), 5,
     "resume_messages: set without max_messages"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    max_messages: 5\n"
         "    resume_messages: 6\n"), 6, "6 is more than max_messages (5)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    max_messages: 1.5\n"), 5,
     "expected a whole number, got the number 1.5"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    max_messages: true\n"), 5,
     "expected a whole number, got a boolean (true)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    overflow: drop\n"), 5,
     "overflow: expected one of hold, spool, reject, got the string 'drop'"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    signal: false\n"), 5,
     "signal: expected one of auto, flow, none, got a boolean (false)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    on_unknown_depth: yes\n"), 5,
     "on_unknown_depth: expected one of keep, block, allow"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    deadline: 0s\n"), 5,
     "deadline: must be more than 0"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    deadline: 1d\n"), 5,
     "unknown unit 'd'"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    in_flight_allowance: 0\n"), 5,
     "in_flight_allowance: must be more than 0 (or auto)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    in_flight_allowance: lots\n"),
     5, "in_flight_allowance: expected a value more than 0 (or auto)"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    spool: {fsync: sometimes}\n"), 5,
     "spool.fsync: expected one of always, group, never"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    spool:\n      max_bytes: 0\n"), 6,
     "spool.max_bytes: must be more than 0"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    spool:\n      group_commit_ms: 0\n"),
     6, "group_commit_ms: must be >= 1"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    spool:\n      size: 1\n"), 6,
     "spool: unknown key 'size'"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n  - name: b\n    match: {queue: b}\n"
         "  - name: a\n    match: {queue: c}\n"), 7, "duplicate policy name 'a' (first on line 3)"),
    (doc("policies:\n  - name: 'has space'\n    match: {queue: a}\n"), 3, "must start with"),
    (doc("policies:\n  - name: ''\n    match: {queue: a}\n"), 3, "expected a non-empty string"),
    (doc("policies:\n  - name: a\n    match:\n      queue: 'q[abc'\n"), 5,
     "match.queue: bad glob: glob 'q[abc' has an unclosed '['"),
    (doc("policies:\n  - name: a\n    match:\n      vhost: /\n      queue_regex: 'a(b'\n"), 6,
     "match.queue_regex: bad regex 'a(b'"),
    (doc("policies:\n  - name: a\n    match:\n      queue: a\n      queue_regex: a\n"), 6,
     "give queue (a glob) or queue_regex, not both"),
    (doc("policies:\n  - name: a\n    match: {vhost: /}\n"), 4, "needs queue (a glob) or"),
    (doc("policies:\n  - name: a\n    match: {queue: a, vhost: ''}\n"), 4,
     "match.vhost: expected a non-empty string"),
    (doc("policies:\n  - name: a\n    match: {queue: a, exchange: x}\n"), 4,
     "unknown key 'exchange'"),
    (doc("policies:\n  - name: a\n    match: orders.*\n"), 4, "match: expected a mapping"),
    (doc("defaults:\n  - capacity: 1\n"), 3, "defaults[0]: missing required key 'vhost'"),
    (doc("defaults:\n  - vhost: /\n  - vhost: x\n  - vhost: /\n"), 5,
     "defaults for vhost '/' already given on line 3"),
    (doc("defaults:\n  - vhost: /\n    name: x\n"), 4, "unknown key 'name'"),
    (doc("defaults:\n  - vhost: /\n    capacity: 10\n    resume: 11\n"), 5,
     "defaults[0].resume: 11 is more than capacity (10)"),
    (doc("policies:\n  - &p {name: a, match: {queue: a}}\n  - <<: *p\n    name: b\n"), 4,
     "merge keys (<<) are not supported"),
    (doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: !big 1\n"), 5,
     "could not determine a constructor for the tag '!big'"),
    (doc("policies:\n  - name: !!python/name:os.system a\n    match: {queue: a}\n"), 3,
     "YAML: could not determine a constructor"),
]


@pytest.mark.parametrize(("text", "line", "reason"), BAD)
def test_bad_file_is_refused_with_its_line(text: str, line: int, reason: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policies(text, "pol.yaml")
    err = info.value
    assert (err.source, err.line) == ("pol.yaml", line), str(err)
    assert str(err).startswith(f"pol.yaml:{line}:{err.column}: "), str(err)
    assert err.column is not None and err.column >= 1
    assert reason in err.reason, str(err)


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError, match=r"nope\.yaml: cannot read: No such file"):
        load_policies(missing)
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"version: 1\n\xff\xfe")
    with pytest.raises(PolicyError, match="cannot read"):
        load_policies(bad)


@given(st.text(max_size=200))
def test_any_text_parses_or_raises_policy_error(text: str) -> None:
    try:
        parse_policies(text)
    except PolicyError as exc:
        assert exc.line is not None and exc.line >= 1


# --- the JSON Schema agrees with the loader -------------------------------------------

def schema_errors(text: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [e.message for e in validator.iter_errors(yaml.safe_load(text))]


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("name", ["example.yaml", "demo.yaml"])
def test_shipped_files_pass_schema_and_loader(name: str) -> None:
    path = POLICIES_DIR / name
    assert schema_errors(path.read_text()) == []
    assert len(load_policies(path)) >= 1


GOOD_FOR_BOTH = [
    MATCHING,
    doc("policies:\n  - name: a\n    match: {queue_regex: 'x.+'}\n    capacity: 1.5 GiB\n"
        "    deadline: 0.5\n"),
    doc("defaults:\n  - vhost: v\n    capacity: '65536'\n    deadline: 2h\n"),
    # as Helm 3 renders plain numbers
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 6.7108864e+07\n"
        "    max_messages: 1e+06\n    spool: {max_bytes: 1.073741824e+09}\n"),
]


@pytest.mark.parametrize("text", GOOD_FOR_BOTH)
def test_schema_and_loader_accept_the_same_good_files(text: str) -> None:
    assert schema_errors(text) == []
    parse_policies(text)


# Both refuse these: every structural mistake the schema can express.
BAD_FOR_BOTH = [
    "policies: []\n",
    "version: 2\n",
    "version: 1\nextra: 1\n",
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capcity: 1\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 64mib\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 1.5\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: -1\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    overflow: drop\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    signal: maybe\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    on_unknown_depth: guess\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    deadline: 0s\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    deadline: -3\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    deadline: 1d\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    max_messages: -1\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    spool: {fsync: sometimes}\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    spool: {group_commit_ms: 0}\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    spool: {size: 1}\n"),
    doc("policies:\n  - name: 'has space'\n    match: {queue: a}\n"),
    doc("policies:\n  - match: {queue: a}\n"),
    doc("policies:\n  - name: a\n    match: {vhost: /}\n"),
    doc("policies:\n  - name: a\n    match: {queue: a, queue_regex: a}\n"),
    doc("policies:\n  - name: a\n    match: {queue: ''}\n"),
    doc("policies:\n  - name: a\n    match: {queue: a, exchange: x}\n"),
    doc("defaults:\n  - capacity: 1\n"),
    doc("defaults:\n  - vhost: /\n    name: x\n"),
    doc("defaults:\n  - vhost: /\n    match: {queue: a}\n"),
]


@pytest.mark.parametrize("text", BAD_FOR_BOTH)
def test_schema_and_loader_refuse_the_same_bad_files(text: str) -> None:
    assert schema_errors(text), "schema accepted it"
    with pytest.raises(PolicyError):
        parse_policies(text)


# Only the loader can refuse these (the schema says so in its description).
BAD_FOR_LOADER_ONLY = [
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 1MiB\n    resume: 2MiB\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    resume_messages: 3\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n  - name: a\n    match: {queue: b}\n"),
    doc("defaults:\n  - vhost: /\n  - vhost: /\n"),
    doc("policies:\n  - name: a\n    match: {queue: 'q[a'}\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    spool: {max_bytes: 0}\n"),
    doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: '2.5e+00'\n"),
]


@pytest.mark.parametrize("text", BAD_FOR_LOADER_ONLY)
def test_semantic_errors_only_the_loader_sees(text: str) -> None:
    assert schema_errors(text) == []
    with pytest.raises(PolicyError):
        parse_policies(text)


# --- reloading ------------------------------------------------------------------------

GOOD_A = doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: 1KiB\n")
GOOD_B = doc("policies:\n  - name: b\n    match: {queue: b}\n    capacity: 2KiB\n")
BROKEN = doc("policies:\n  - name: a\n    match: {queue: a}\n    capacity: lots\n")


def test_reload_keeps_old_policies_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD_A)
    store = PolicyStore.from_file(path)
    assert store.generation == 1 and store.current.is_policed("/", "a")
    before = store.current

    path.write_text(BROKEN)
    result = store.reload()
    assert not result.ok
    assert result.reason is not None and result.reason.startswith(f"{path}:5:15: ")
    assert store.current is before and result.policies is before
    assert store.generation == 1

    path.write_text(GOOD_B)
    result = store.reload()
    assert result.ok and result.changed and result.reason is None
    assert store.current.is_policed("/", "b") and not store.current.is_policed("/", "a")
    assert store.generation == 2

    result = store.reload()  # same content again
    assert result.ok and not result.changed


def test_missing_file_on_reload_keeps_old(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD_A)
    store = PolicyStore.from_file(path)
    path.unlink()
    result = store.reload()
    assert not result.ok and result.reason is not None and "cannot read" in result.reason
    assert store.current.is_policed("/", "a")


def test_from_file_raises_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BROKEN)
    with pytest.raises(PolicyError, match=r"p\.yaml:5:\d+: "):
        PolicyStore.from_file(path)


def test_changed_since_last_load_sees_edits_and_not_noise(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD_A)
    store = PolicyStore.from_file(path)
    assert not store.changed_since_last_load()
    assert not store.changed_since_last_load(path)
    path.write_text(BROKEN)
    assert store.changed_since_last_load()
    store.reload()  # fails, but the attempt is recorded: a bad file is reported once
    assert not store.changed_since_last_load()
    st_before = path.stat()
    path.write_text(GOOD_A.replace("1KiB", "9KiB"))  # same size
    os.utime(path, ns=(st_before.st_atime_ns, st_before.st_mtime_ns + 1))
    assert store.changed_since_last_load()
    assert store.changed_since_last_load(tmp_path / "other.yaml")  # a different file


def test_configmap_symlink_swap_is_seen(tmp_path: Path) -> None:
    """Kubernetes swaps ..data to a new directory; same size and mtime, new inode."""
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "p.yaml").write_text(GOOD_A)
    (v2 / "p.yaml").write_text(GOOD_A.replace("name: a", "name: z"))
    st1 = (v1 / "p.yaml").stat()
    os.utime(v2 / "p.yaml", ns=(st1.st_atime_ns, st1.st_mtime_ns))
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "p.yaml").symlink_to("..data/p.yaml")
    store = PolicyStore.from_file(tmp_path / "p.yaml")
    assert not store.changed_since_last_load()
    tmp_link = tmp_path / "..data_tmp"
    tmp_link.symlink_to("v2")
    tmp_link.replace(tmp_path / "..data")  # atomic rename, as the kubelet does
    assert store.changed_since_last_load()
    result = store.reload()
    assert result.ok and result.changed and store.current.policies[0].name == "z"


def test_store_without_path() -> None:
    store = PolicyStore()
    assert len(store.current) == 0 and store.generation == 0
    with pytest.raises(ValueError, match="no path"):
        store.reload()
