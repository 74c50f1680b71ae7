"""Shadowed and overlapping policies: the glob comparisons are exact, checked against every
name up to a length (hypothesis), and the warnings name what ``floodwall check`` reports."""

from __future__ import annotations

import itertools
import re
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.control.policy import glob_to_regex, overlaps, parse_policies
from floodwall.control.policy.overlaps import covers, intersects, tokens

ALPHABET = "ab."
PIECES = ["a", "b", ".", "*", "?", "[ab]", "[!a]", "[a-b]"]
globs = st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join)


@cache
def names(max_length: int) -> tuple[str, ...]:
    return tuple("".join(chars) for n in range(max_length + 1)
                 for chars in itertools.product(ALPHABET, repeat=n))


def matching(glob: str, max_length: int) -> set[str]:
    pattern = re.compile(glob_to_regex(glob), re.DOTALL)
    return {n for n in names(max_length) if pattern.fullmatch(n)}


@settings(max_examples=300, deadline=None)
@given(globs, globs)
def test_covers_and_intersects_agree_with_every_short_name(a: str, b: str) -> None:
    bound = len(tokens(a)) + len(tokens(b)) + 1  # long enough for a witness either way
    in_a, in_b = matching(a, bound), matching(b, bound)
    assert covers(tokens(a), tokens(b)) == (in_b <= in_a), (a, b)
    assert intersects(tokens(a), tokens(b)) == bool(in_a & in_b), (a, b)


def test_tokens() -> None:
    assert tokens("**") == tokens("*") == (None,)
    assert covers(tokens("orders.*"), tokens("orders.eu.[0-9]"))
    assert not covers(tokens("orders.eu.[0-9]"), tokens("orders.*"))
    assert intersects(tokens("*.eu.*"), tokens("orders.*"))
    assert not intersects(tokens("orders.*"), tokens("audit.*"))
    assert covers(tokens("a\\*"), tokens("a\\*")) and not covers(tokens("a\\*"), tokens("a*"))


def test_overlaps_in_a_policy_set() -> None:
    policies = parse_policies("""
version: 1
policies:
  - {name: all-billing, match: {vhost: billing, queue: "*"}}
  - {name: invoices, match: {vhost: billing, queue_regex: "inv.+"}, capacity: 1MiB}
  - {name: orders, match: {queue: "orders.*"}, capacity: 1MiB}
  - {name: eu, match: {queue: "*.eu"}, capacity: 1MiB}
  - {name: audit, match: {queue_regex: 'audit\\.[0-9]+'}, capacity: 1MiB}
  - {name: audit-1, match: {queue: "audit.1"}, capacity: 1MiB}
  - {name: audit-x, match: {queue: "audit.x"}, capacity: 1MiB}
  - {name: other-vhost, match: {vhost: v2, queue: "orders.*"}, capacity: 1MiB}
""")
    found = [(o.later.name, o.earlier.name, o.shadowed) for o in overlaps(policies)]
    assert found == [("invoices", "all-billing", True), ("eu", "orders", False),
                     ("audit-1", "audit", True)]
    (_, eu, _) = overlaps(policies)
    assert "gets 'orders', the first in the file" in eu.reason()
