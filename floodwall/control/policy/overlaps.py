"""Policies that can never match (shadowed by an earlier one) or that share queues with an
earlier one: the warnings of ``floodwall check``.

The first matching policy wins, so a later policy whose every queue an earlier policy of the
same vhost also matches never applies (it is *shadowed*), and two policies that can match
one queue *overlap* (the earlier one wins for it). For two globs both questions are decided
exactly: a glob is a sequence of tokens (``*``, one character of a set), and the answers
come from comparing the token sequences (``covers``, ``intersects``). A regex is compared
only where that is certain: an earlier pattern that matches every name (``*``, ``.*``)
shadows everything after it, and an earlier regex shadows a later glob without wildcards
that it matches.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from floodwall.control.policy.model import Policy, PolicySet

_ANY_NAME = frozenset({".*", "^.*$", ".*$", "^.*", "(.*)"})


@dataclass(frozen=True)
class CharSet:
    """The characters one glob token stands for: ``chars``, or every character but
    ``chars`` when ``negated`` (``?`` is the empty negated set)."""

    chars: frozenset[str]
    negated: bool = False

    def covers(self, other: CharSet) -> bool:
        """Every character ``other`` stands for is one this stands for."""
        if self.negated:
            return (other.chars.isdisjoint(self.chars) if not other.negated
                    else self.chars <= other.chars)
        return not other.negated and other.chars <= self.chars

    def intersects(self, other: CharSet) -> bool:
        if self.negated and other.negated:
            return True  # both exclude finitely many characters
        if self.negated:
            return bool(other.chars - self.chars)
        if other.negated:
            return bool(self.chars - other.chars)
        return bool(self.chars & other.chars)


STAR = None  # the token ``*``: any run of characters
Token = CharSet | None


def tokens(glob: str) -> tuple[Token, ...]:
    """A glob (``Policy.queue``, already validated) as tokens: ``None`` for ``*``."""
    out: list[Token] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if not out or out[-1] is not STAR:  # ** is *
                out.append(STAR)
        elif c == "?":
            out.append(CharSet(frozenset(), negated=True))
        elif c == "\\":
            i += 1
            out.append(CharSet(frozenset(glob[i])))
        elif c == "[":
            j = i + 1
            negated = j < n and glob[j] == "!"
            if negated:
                j += 1
            start = j
            if j < n and glob[j] == "]":
                j += 1
            while glob[j] != "]":
                j += 1
            out.append(CharSet(_class_chars(glob[start:j]), negated))
            i = j
        else:
            out.append(CharSet(frozenset(c)))
        i += 1
    return tuple(out)


def _class_chars(body: str) -> frozenset[str]:
    chars: set[str] = set()
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            chars.update(chr(c) for c in range(ord(body[k]), ord(body[k + 2]) + 1))
            k += 3
        else:
            chars.add(body[k])
            k += 1
    return frozenset(chars)


def covers(a: tuple[Token, ...], b: tuple[Token, ...]) -> bool:
    """True when glob ``a`` matches every name glob ``b`` matches.

    Exact: the two globs run side by side as automata (a state is the set of token
    positions a name's prefix can have reached) over the characters either glob names plus
    one character neither names, which stands for all the others; ``a`` covers ``b`` unless
    some name takes ``b`` to its end and ``a`` nowhere near it.
    """
    alphabet = {c for t in (*a, *b) if t is not None for c in t.chars}
    other = next(chr(c) for c in range(0x21, 0x110000) if chr(c) not in alphabet)
    alphabet.add(other)
    start = (_closure(b, {0}), _closure(a, {0}))
    seen = {start}
    todo = [start]
    while todo:
        sb, sa = todo.pop()
        if len(b) in sb and len(a) not in sa:
            return False
        for ch in alphabet:
            nb = _step(b, sb, ch)
            if not nb:
                continue  # no name b matches goes this way
            pair = (nb, _step(a, sa, ch))
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True


def _closure(glob: tuple[Token, ...], states: set[int]) -> frozenset[int]:
    """``states`` and the positions after the stars they stand on (a star may match nothing)."""
    out = set(states)
    for s in sorted(states):
        while s < len(glob) and glob[s] is STAR:
            s += 1
            out.add(s)
    return frozenset(out)


def _step(glob: tuple[Token, ...], states: frozenset[int], ch: str) -> frozenset[int]:
    """The positions reached from ``states`` by one more character ``ch``."""
    nxt: set[int] = set()
    for s in states:
        if s == len(glob):
            continue
        t = glob[s]
        if t is None:  # STAR
            nxt.add(s)
        elif (ch in t.chars) != t.negated:
            nxt.add(s + 1)
    return _closure(glob, nxt)


def intersects(a: tuple[Token, ...], b: tuple[Token, ...]) -> bool:
    """True when some name matches both globs."""

    @functools.cache
    def go(i: int, j: int) -> bool:
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] is STAR:
            return go(i + 1, j) or (j < len(b) and go(i, j + 1))
        if j < len(b) and b[j] is STAR:
            return go(i, j + 1) or (i < len(a) and go(i + 1, j))
        if i == len(a) or j == len(b):
            return False
        ai, bj = a[i], b[j]
        assert ai is not None and bj is not None
        return ai.intersects(bj) and go(i + 1, j + 1)

    return go(0, 0)


def _matches_every_name(p: Policy) -> bool:
    if p.queue is not None:
        return tokens(p.queue) == (STAR,)
    return p.queue_regex is None or p.queue_regex in _ANY_NAME


def _literal(p: Policy) -> str | None:
    """The one queue name a glob without wildcards matches."""
    if p.queue is None or any(t is STAR or t.negated or len(t.chars) != 1
                              for t in tokens(p.queue)):
        return None
    return "".join(next(iter(t.chars)) for t in tokens(p.queue) if t is not None)


@dataclass(frozen=True)
class Overlap:
    """``later`` can match a queue ``earlier`` matches too; ``shadowed``: every one of them."""

    earlier: Policy
    later: Policy
    shadowed: bool

    def reason(self) -> str:
        e, lt = self.earlier, self.later
        what = _pattern(lt)
        if self.shadowed:
            return (f"policy {lt.name!r} ({what}) can never match: every queue it matches in "
                    f"vhost {lt.vhost!r} is matched first by policy {e.name!r} "
                    f"({_pattern(e)}, line {e.line}); move it above, or narrow {e.name!r}")
        return (f"policy {lt.name!r} ({what}) overlaps policy {e.name!r} ({_pattern(e)}, "
                f"line {e.line}): a queue both match gets {e.name!r}, the first in the file")


def _pattern(p: Policy) -> str:
    if p.queue_regex is not None:
        return f"queue_regex {p.queue_regex!r}"
    return f"queue {p.queue if p.queue is not None else '*'!r}"


def overlaps(policies: PolicySet) -> list[Overlap]:
    """Each later policy's first shadowing earlier policy, else every earlier policy it
    overlaps (globs only), in file order."""
    found: list[Overlap] = []
    listed = list(policies.policies)
    for k, later in enumerate(listed):
        earlier = [p for p in listed[:k] if p.vhost == later.vhost]
        shadow = next((e for e in earlier if _shadows(e, later)), None)
        if shadow is not None:
            found.append(Overlap(shadow, later, shadowed=True))
            continue
        for e in earlier:
            if e.queue is not None and later.queue is not None and intersects(
                    tokens(e.queue), tokens(later.queue)):
                found.append(Overlap(e, later, shadowed=False))
    return found


def _shadows(earlier: Policy, later: Policy) -> bool:
    if _matches_every_name(earlier):
        return True
    if earlier.queue is not None and later.queue is not None:
        return covers(tokens(earlier.queue), tokens(later.queue))
    literal = _literal(later)
    if literal is not None and earlier.queue_regex is not None:
        return re.fullmatch(earlier.queue_regex, literal) is not None
    if later.queue_regex is not None and earlier.queue_regex == later.queue_regex:
        return True
    return False
