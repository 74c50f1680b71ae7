"""Queue policies: the version-1 YAML format, its loader, and the pure trip/release engine.

Nothing here does I/O beyond reading the one policy file it is asked to load, and nothing
keeps time: the depth tracker, the gate and the I/O layer call in with figures and act on
the answers.

Defaults, for every field a policy or a ``defaults`` entry leaves out (a policy first takes
the ``defaults`` entry of its vhost, then these):

=================  ===========================================================
capacity           0 (no byte limit)
resume             = capacity of the same entry
max_messages       none (no count limit; ``0`` in the file means the same)
resume_messages    = max_messages of the same entry
overflow           hold (``spool`` acts as ``hold`` unless run with ``--spool-dir``)
deadline           30s
signal             auto
on_unknown_depth   keep
spool              max_bytes 1GiB, fsync group, group_commit_ms 10
=================  ===========================================================

``capacity``/``resume`` are inherited as a pair, and so are ``max_messages``/
``resume_messages``: an entry that sets a limit but not its resume level resumes at its own
limit, never at an inherited resume level.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar

import yaml
from yaml.constructor import SafeConstructor

__all__ = [
    "BUILTIN_DEFAULTS",
    "DEFAULT_DEADLINE",
    "EMPTY_POLICIES",
    "SPOOL_AVAILABLE",
    "Fsync",
    "Overflow",
    "Policy",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "QueueLimits",
    "ReloadResult",
    "Signal",
    "SpoolSettings",
    "UnknownDepth",
    "decide",
    "format_bytes",
    "format_bytes_approx",
    "format_duration",
    "glob_to_regex",
    "load_policies",
    "parse_bytes",
    "parse_duration",
    "parse_policies",
    "render_policies",
    "set_spool_available",
]

#: True while the running proxy has a spool (``--spool-dir``; the proxy sets it at start,
#: ``set_spool_available``); otherwise ``overflow: spool`` acts as hold.
SPOOL_AVAILABLE = False


def set_spool_available(available: bool) -> None:
    """The running proxy has (True) or has no (False) spool directory."""
    global SPOOL_AVAILABLE
    SPOOL_AVAILABLE = available

#: Seconds a publisher may be held before it gets a nack or a channel close.
DEFAULT_DEADLINE: Final = 30.0

FORMAT_VERSION: Final = 1


class PolicyError(ValueError):
    """A policy file is unreadable or invalid; ``str()`` is ``FILE:LINE: reason``."""

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")


class Overflow(enum.Enum):
    """What happens to publishes on a channel blocked by this queue."""

    HOLD = "hold"
    SPOOL = "spool"
    REJECT = "reject"


class Signal(enum.Enum):
    """Whether blocked clients are sent Channel.Flow: by client product table, always, never."""

    AUTO = "auto"
    FLOW = "flow"
    NONE = "none"


class UnknownDepth(enum.Enum):
    """What the engine decides while a queue's depth is unknown (management API down...)."""

    KEEP = "keep"  # keep the last decision
    BLOCK = "block"  # trip (fail closed)
    ALLOW = "allow"  # release (fail open)


class Fsync(enum.Enum):
    """When the spool makes a record durable: each record, each group commit, never."""

    ALWAYS = "always"
    GROUP = "group"
    NEVER = "never"


# --- units ----------------------------------------------------------------------------

_BYTE_UNITS: Final[dict[str, int]] = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
}
_DURATION_UNITS: Final[dict[str, Decimal]] = {
    "ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600),
}
_QUANTITY = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*")


def _unit_hint(unit: str, known: Mapping[str, object]) -> str:
    for name in known:
        if name.lower() == unit.lower():
            return f"unknown unit {unit!r} (did you mean {name!r}?)"
    return f"unknown unit {unit!r}; use one of {', '.join(known)}"


def parse_bytes(value: object) -> int:
    """``64MiB``, ``512KiB``, ``1.5GB``, ``65536`` or ``"65536"`` to a byte count (>= 0).

    KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024, units are case-sensitive.
    A fraction is allowed only with a unit above B and is rounded down to whole bytes.
    Raises ``ValueError`` with a reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 64MiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    if isinstance(value, float):
        raise ValueError(f"size {value!r} is not a whole number of bytes; use a unit, "
                         "e.g. 1.5MiB")
    if not isinstance(value, str):
        raise ValueError(f"expected a size such as 64MiB, got {_describe(value)}")
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a size; write e.g. 64MiB, 512KiB, 10GB or 65536")
    number, unit = Decimal(m["number"]), m["unit"] or "B"
    if unit not in _BYTE_UNITS:
        raise ValueError(f"{value!r}: {_unit_hint(unit, _BYTE_UNITS)}")
    multiplier = _BYTE_UNITS[unit]
    if multiplier == 1 and number != number.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(number * multiplier)


def parse_duration(value: object) -> float:
    """``500ms``, ``30s``, ``5m``, ``1h`` or a plain number of seconds to seconds (>= 0).

    Raises ``ValueError`` with a reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value or value == float("inf"):
            raise ValueError(f"duration must be a finite number >= 0, got {value}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 30s, got {_describe(value)}")
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 30s, 5m, 1h or 30")
    unit = m["unit"] or "s"
    if unit not in _DURATION_UNITS:
        raise ValueError(f"{value!r}: {_unit_hint(unit, _DURATION_UNITS)}")
    try:
        return float(Decimal(m["number"]) * _DURATION_UNITS[unit])
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{value!r} is not a duration") from None


def format_bytes(n: int) -> str:
    """A byte count in the largest unit that divides it exactly (``256KiB``, ``10MB``, ``1000``).

    The result parses back to ``n`` with ``parse_bytes``.
    """
    if n <= 0:
        return str(n)
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"):
        mult = _BYTE_UNITS[unit]
        if n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def format_bytes_approx(n: int) -> str:
    """A byte count rounded to one decimal in binary units, for people (``1.2 MiB``)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        mult = _BYTE_UNITS[unit]
        if n >= mult:
            return f"{n / mult:.1f} {unit}"
    return f"{n} B"


def format_duration(seconds: float) -> str:
    """Seconds in the largest unit that divides them exactly (``2m``, ``500ms``, ``1.5s``)."""
    ms = Decimal(repr(seconds)) * 1000
    if ms == ms.to_integral_value():
        whole = int(ms)
        for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if whole and whole % size == 0:
                return f"{whole // size}{unit}"
        return f"{whole}ms"
    return f"{seconds!r}s"


# --- the policy model -----------------------------------------------------------------

_SAME_AS_LIMIT: Final = -1  # resume / resume_messages: "equal to the limit of the entry"
_GLOB_SPECIAL = frozenset("*?[")


def glob_to_regex(glob: str) -> str:
    """A queue-name glob to an anchored-by-fullmatch regex; ``ValueError`` if malformed.

    ``*`` any run of characters (dots included), ``?`` one character, ``[abc]``, ``[a-z]``,
    ``[!abc]`` character classes (``]`` first in a class is literal), ``\\`` escapes the next
    character. Case-sensitive.
    """
    if not glob:
        raise ValueError("empty glob")
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":
            if i + 1 == n:
                raise ValueError(f"glob {glob!r} ends with a lone backslash")
            i += 1
            out.append(re.escape(glob[i]))
        elif c == "[":
            j = i + 1
            negate = j < n and glob[j] == "!"
            if negate:
                j += 1
            start = j
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                raise ValueError(f"glob {glob!r} has an unclosed '[' at position {i}")
            body = glob[start:j]
            parts: list[str] = []
            for k, ch in enumerate(body):
                if ch == "-" and 0 < k < len(body) - 1:
                    parts.append("-")
                else:
                    parts.append(re.escape(ch))
            cls = ("[^" if negate else "[") + "".join(parts) + "]"
            try:
                re.compile(cls)
            except re.error as exc:
                raise ValueError(f"glob {glob!r}: bad character class [{body}]: {exc}") from None
            out.append(cls)
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class SpoolSettings:
    """Flow-to-disk settings of a queue (used when ``overflow`` is ``spool``)."""

    max_bytes: int = 1024**3
    fsync: Fsync = Fsync.GROUP
    group_commit_ms: int = 10

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be > 0, got {self.max_bytes}")
        if self.group_commit_ms < 1:
            raise ValueError(f"spool group_commit_ms must be >= 1, got {self.group_commit_ms}")


@dataclass(frozen=True)
class QueueLimits:
    """The part of a policy the engine needs: limits, resume levels, unknown-depth rule."""

    capacity: int = 0
    resume: int = 0
    max_messages: int | None = None
    resume_messages: int | None = None
    on_unknown_depth: UnknownDepth = UnknownDepth.KEEP

    @property
    def is_limited(self) -> bool:
        """False when neither bytes nor messages are limited: such a queue is not policed."""
        return self.capacity > 0 or self.max_messages is not None


@dataclass(frozen=True)
class Policy:
    """One resolved policy: what it matches and every setting, nothing left to inherit.

    ``queue`` is a glob and ``queue_regex`` a regex that must match the whole queue name; at
    most one is set, and neither means every queue of ``vhost`` (a vhost's ``defaults``).
    ``resume`` defaults to ``capacity`` and ``resume_messages`` to ``max_messages``.
    Invalid combinations raise ``ValueError``.
    """

    name: str
    vhost: str = "/"
    queue: str | None = None
    queue_regex: str | None = None
    capacity: int = 0
    resume: int = _SAME_AS_LIMIT
    max_messages: int | None = None
    resume_messages: int | None = _SAME_AS_LIMIT
    overflow: Overflow = Overflow.HOLD
    deadline: float = DEFAULT_DEADLINE
    signal: Signal = Signal.AUTO
    on_unknown_depth: UnknownDepth = UnknownDepth.KEEP
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    line: int | None = field(default=None, compare=False)
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)
    _limits: QueueLimits | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.resume == _SAME_AS_LIMIT:
            object.__setattr__(self, "resume", self.capacity)
        if self.resume_messages == _SAME_AS_LIMIT:
            object.__setattr__(self, "resume_messages", self.max_messages)
        if self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")
        if not 0 <= self.resume <= self.capacity:
            raise ValueError(f"resume ({self.resume}) must be between 0 and capacity "
                             f"({self.capacity})")
        if self.max_messages is not None and self.max_messages < 1:
            raise ValueError(f"max_messages must be >= 1 or None, got {self.max_messages}")
        if self.max_messages is None and self.resume_messages is not None:
            raise ValueError("resume_messages needs max_messages")
        if self.max_messages is not None and (
                self.resume_messages is None
                or not 0 <= self.resume_messages <= self.max_messages):
            raise ValueError(f"resume_messages ({self.resume_messages}) must be between 0 and "
                             f"max_messages ({self.max_messages})")
        if not self.deadline > 0:
            raise ValueError(f"deadline must be > 0, got {self.deadline}")
        if self.queue is not None and self.queue_regex is not None:
            raise ValueError("give queue (a glob) or queue_regex, not both")
        if self.queue is not None:
            pattern: re.Pattern[str] | None = re.compile(glob_to_regex(self.queue), re.DOTALL)
        elif self.queue_regex is not None:
            pattern = re.compile(self.queue_regex)
        else:
            pattern = None
        object.__setattr__(self, "_pattern", pattern)
        # Built once: the engine reads it on every publish to a policed queue.
        object.__setattr__(self, "_limits", QueueLimits(
            self.capacity, self.resume, self.max_messages, self.resume_messages,
            self.on_unknown_depth))

    @property
    def limits(self) -> QueueLimits:
        assert self._limits is not None
        return self._limits

    @property
    def is_limited(self) -> bool:
        """False for a policy with no byte and no count limit: its queues are not policed."""
        return self.capacity > 0 or self.max_messages is not None

    @property
    def effective_overflow(self) -> Overflow:
        """The overflow applied: ``spool`` is ``hold`` without a spool (``--spool-dir``)."""
        if self.overflow is Overflow.SPOOL and not SPOOL_AVAILABLE:
            return Overflow.HOLD
        return self.overflow

    def matches(self, vhost: str, queue: str) -> bool:
        if vhost != self.vhost:
            return False
        return self._pattern is None or self._pattern.fullmatch(queue) is not None


#: The built-in defaults, as a vhost-less template (``name``/``vhost`` unused).
BUILTIN_DEFAULTS: Final = Policy(name="builtin")


# --- the engine -----------------------------------------------------------------------

def decide(policy: Policy | QueueLimits, depth_bytes: int | None, depth_messages: int | None,
           tripped: bool) -> bool:
    """Whether the queue should be tripped now, given its depth and whether it is tripped.

    Trips when bytes > capacity (capacity > 0) or messages > max_messages; once tripped,
    releases only when bytes <= resume AND messages <= resume_messages. A known figure over
    its limit trips even if the other is unknown. Otherwise an unknown figure (None) of a
    limited dimension decides by ``on_unknown_depth``: keep -> ``tripped``, block -> True,
    allow -> False. A figure whose dimension is not limited is ignored.
    """
    limits = policy.limits if isinstance(policy, Policy) else policy
    check_bytes = limits.capacity > 0
    check_messages = limits.max_messages is not None
    if not check_bytes and not check_messages:
        return False
    if check_bytes and depth_bytes is not None and depth_bytes > limits.capacity:
        return True
    if (limits.max_messages is not None and depth_messages is not None
            and depth_messages > limits.max_messages):
        return True
    if (check_bytes and depth_bytes is None) or (check_messages and depth_messages is None):
        if limits.on_unknown_depth is UnknownDepth.BLOCK:
            return True
        if limits.on_unknown_depth is UnknownDepth.ALLOW:
            return False
        return tripped
    if not tripped:
        return False
    bytes_low = not check_bytes or (depth_bytes is not None and depth_bytes <= limits.resume)
    messages_low = (not check_messages or (
        depth_messages is not None and limits.resume_messages is not None
        and depth_messages <= limits.resume_messages))
    return not (bytes_low and messages_low)


# --- the set of policies --------------------------------------------------------------

_CACHE_SIZE: Final = 65536


class PolicySet:
    """The policies of one loaded file, in file order, and the per-vhost defaults.

    ``for_queue`` answers which policy polices a queue: the first matching policy in file
    order, else the vhost's defaults if they set a limit; ``None`` means not policed (also
    when the winning policy sets no limit, which is how a policy exempts queues).
    """

    def __init__(self, policies: tuple[Policy, ...] = (),
                 defaults: Mapping[str, Policy] | None = None, source: str = "<none>") -> None:
        self.policies = policies
        self.defaults: Mapping[str, Policy] = MappingProxyType(dict(defaults or {}))
        self.source = source
        self._by_vhost: dict[str, tuple[Policy, ...]] = {}
        for p in policies:
            self._by_vhost[p.vhost] = (*self._by_vhost.get(p.vhost, ()), p)
        self._cache: OrderedDict[tuple[str, str], Policy | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.policies)

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PolicySet):
            return NotImplemented
        return self.policies == other.policies and dict(self.defaults) == dict(other.defaults)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"PolicySet(source={self.source!r}, policies={len(self.policies)}, "
                f"defaults={sorted(self.defaults)})")

    @property
    def vhosts(self) -> frozenset[str]:
        """Every vhost a policy or a limiting defaults entry can police."""
        return frozenset([*self._by_vhost, *(v for v, d in self.defaults.items()
                                             if d.is_limited)])

    def match(self, vhost: str, queue: str) -> Policy | None:
        """The policy that applies to the queue, limited or not (uncached)."""
        for p in self._by_vhost.get(vhost, ()):
            if p.matches(vhost, queue):
                return p
        return self.defaults.get(vhost)

    def for_queue(self, vhost: str, queue: str) -> Policy | None:
        """The policy that polices the queue, or None if it is not policed. Cached."""
        key = (vhost, queue)
        try:
            found = self._cache[key]
        except KeyError:
            pass
        else:
            self._cache.move_to_end(key)
            return found
        p = self.match(vhost, queue)
        found = p if p is not None and p.is_limited else None
        self._cache[key] = found
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return found

    def is_policed(self, vhost: str, queue: str) -> bool:
        return self.for_queue(vhost, queue) is not None


EMPTY_POLICIES: Final = PolicySet()


# --- the loader -----------------------------------------------------------------------

_LIMIT_KEYS: Final = ("capacity", "resume", "max_messages", "resume_messages", "overflow",
                      "deadline", "signal", "on_unknown_depth", "spool")
_TOP_KEYS: Final = ("version", "defaults", "policies")
_POLICY_KEYS: Final = ("name", "match", *_LIMIT_KEYS)
_DEFAULTS_KEYS: Final = ("vhost", *_LIMIT_KEYS)
_MATCH_KEYS: Final = ("vhost", "queue", "queue_regex")
_SPOOL_KEYS: Final = ("max_bytes", "fsync", "group_commit_ms")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")

_Entry = tuple[yaml.Node, yaml.Node]  # (key node, value node)
_E = TypeVar("_E", bound=enum.Enum)


def _describe(value: object) -> str:
    if isinstance(value, _Composite):
        return value.what
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    return f"a {type(value).__name__}"


def _peek_name(item: yaml.Node) -> str:
    """`` (NAME)`` for messages about a policy entry whose name is a plain string, else ``""``."""
    if isinstance(item, yaml.MappingNode):
        for key, value in item.value:
            if (isinstance(key, yaml.ScalarNode) and key.value == "name"
                    and isinstance(value, yaml.ScalarNode) and value.value):
                return f" ({value.value})"
    return ""


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


class _Reader:
    """Walks the composed YAML, turning nodes into values or PolicyErrors with lines."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = SafeConstructor()

    def fail(self, node: yaml.Node | None, reason: str) -> PolicyError:
        return PolicyError(self.source, _line(node) if node is not None else 1, reason)

    def describe(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return _describe(self.scalar(node))

    def scalar(self, node: yaml.Node) -> object:
        if node.tag == "tag:yaml.org,2002:merge":
            raise self.fail(node, "YAML merge keys (<<) are not supported; repeat the fields")
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.fail(node, f"YAML: {problem}") from None

    def mapping(self, node: yaml.Node, where: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, _Entry]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{where}: expected a mapping, got {self.describe(node)}")
        out: dict[str, _Entry] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise self.fail(key_node, f"{where}: keys must be names, got "
                                          f"{self.describe(key_node)}")
            if key in out:
                raise self.fail(key_node, f"{where}: duplicate key {key!r} (first on line "
                                          f"{_line(out[key][0])})")
            if key not in allowed:
                raise self.fail(key_node, f"{where}: unknown key {key!r}; known: "
                                          f"{', '.join(allowed)}")
            out[key] = (key_node, value_node)
        for key in required:
            if key not in out:
                raise self.fail(node, f"{where}: missing required key {key!r}")
        return out

    def sequence(self, node: yaml.Node, where: str) -> list[yaml.Node]:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node) is None:
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{where}: expected a list, got {self.describe(node)}")
        return list(node.value)

    def string(self, node: yaml.Node, where: str) -> str:
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else node
        if not isinstance(value, str) or not value:
            raise self.fail(node, f"{where}: expected a non-empty string, got "
                                  f"{self.describe(node)}")
        return value

    def size(self, node: yaml.Node, where: str) -> int:
        try:
            return parse_bytes(self._value(node))
        except ValueError as exc:
            raise self.fail(node, f"{where}: {exc}") from None

    def duration(self, node: yaml.Node, where: str) -> float:
        try:
            seconds = parse_duration(self._value(node))
        except ValueError as exc:
            raise self.fail(node, f"{where}: {exc}") from None
        if seconds <= 0:
            raise self.fail(node, f"{where}: must be more than 0")
        return seconds

    def count(self, node: yaml.Node, where: str, minimum: int) -> int:
        value = self._value(node)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(node, f"{where}: expected a whole number, got "
                                  f"{self.describe(node)}")
        if value < minimum:
            raise self.fail(node, f"{where}: must be >= {minimum}, got {value}")
        return value

    def choice(self, node: yaml.Node, where: str, kind: type[_E]) -> _E:
        value = self._value(node)
        for member in kind:
            if member.value == value:
                return member
        options = ", ".join(str(m.value) for m in kind)
        raise self.fail(node, f"{where}: expected one of {options}, got {self.describe(node)}")

    def _value(self, node: yaml.Node) -> object:
        if not isinstance(node, yaml.ScalarNode):
            return _Composite(self.describe(node))
        return self.scalar(node)


class _Composite:
    """Stands in for a list or mapping where a scalar was expected, for error messages."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


def _resolve(reader: _Reader, entry: dict[str, _Entry], where: str, base: Policy,
             base_label: str, **fixed: Any) -> Policy:
    """Build a Policy from an entry's limit keys, inheriting what it leaves out from base."""
    def node(key: str) -> yaml.Node | None:
        return entry[key][1] if key in entry else None

    values: dict[str, Any] = {}
    cap_node, res_node = node("capacity"), node("resume")
    capacity = (reader.size(cap_node, f"{where}.capacity") if cap_node is not None
                else base.capacity)
    if res_node is not None:
        resume = reader.size(res_node, f"{where}.resume")
        if resume > capacity:
            origin = "" if cap_node is not None else f" ({base_label})"
            limit = "0 = unlimited" if capacity == 0 else format_bytes(capacity)
            raise reader.fail(res_node, f"{where}.resume: {format_bytes(resume)} is more than "
                                        f"capacity ({limit}){origin}; resume must be <= "
                                        "capacity")
    else:
        resume = capacity if cap_node is not None else base.resume
    values.update(capacity=capacity, resume=resume)

    max_node, rmsg_node = node("max_messages"), node("resume_messages")
    max_messages = base.max_messages
    if max_node is not None:
        max_messages = reader.count(max_node, f"{where}.max_messages", 0) or None
    if rmsg_node is not None:
        resume_messages: int | None = reader.count(rmsg_node, f"{where}.resume_messages", 0)
        if max_messages is None:
            raise reader.fail(rmsg_node, f"{where}.resume_messages: set without max_messages "
                                         "(no count limit to resume from)")
        if resume_messages is not None and resume_messages > max_messages:
            origin = "" if max_node is not None else f" ({base_label})"
            raise reader.fail(rmsg_node, f"{where}.resume_messages: {resume_messages} is more "
                                         f"than max_messages ({max_messages}){origin}")
    else:
        resume_messages = max_messages if max_node is not None else base.resume_messages
    values.update(max_messages=max_messages, resume_messages=resume_messages)

    n = node("overflow")
    values["overflow"] = (reader.choice(n, f"{where}.overflow", Overflow)
                          if n is not None else base.overflow)
    n = node("deadline")
    values["deadline"] = (reader.duration(n, f"{where}.deadline")
                          if n is not None else base.deadline)
    n = node("signal")
    values["signal"] = (reader.choice(n, f"{where}.signal", Signal)
                        if n is not None else base.signal)
    n = node("on_unknown_depth")
    values["on_unknown_depth"] = (reader.choice(n, f"{where}.on_unknown_depth", UnknownDepth)
                                  if n is not None else base.on_unknown_depth)
    spool = base.spool
    n = node("spool")
    if n is not None:
        sp = reader.mapping(n, f"{where}.spool", _SPOOL_KEYS)
        max_bytes = spool.max_bytes
        if "max_bytes" in sp:
            max_bytes = reader.size(sp["max_bytes"][1], f"{where}.spool.max_bytes")
            if max_bytes == 0:
                raise reader.fail(sp["max_bytes"][1], f"{where}.spool.max_bytes: must be more "
                                                      "than 0")
        fsync = (reader.choice(sp["fsync"][1], f"{where}.spool.fsync", Fsync)
                 if "fsync" in sp else spool.fsync)
        group_ms = (reader.count(sp["group_commit_ms"][1], f"{where}.spool.group_commit_ms", 1)
                    if "group_commit_ms" in sp else spool.group_commit_ms)
        spool = SpoolSettings(max_bytes=max_bytes, fsync=fsync, group_commit_ms=group_ms)
    values["spool"] = spool
    return Policy(**fixed, **values)


def parse_policies(text: str, source: str = "<string>") -> PolicySet:
    """Parse a version-1 policy document; raise ``PolicyError`` (``FILE:LINE: reason``)."""
    reader = _Reader(source)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "malformed"
        raise PolicyError(source, line, f"YAML syntax: {problem}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(source, 1, f"YAML: {exc}") from None
    if root is None:
        raise PolicyError(source, 1, "empty file; expected a mapping with 'version: 1'")
    if not isinstance(root, yaml.MappingNode):
        raise reader.fail(root, "expected a mapping with 'version: 1' at the top, got "
                                f"{reader.describe(root)}")
    top = reader.mapping(root, "top level", _TOP_KEYS)
    if "version" not in top:
        raise reader.fail(root, "missing 'version: 1' (the policy format version)")
    version_node = top["version"][1]
    version = reader.scalar(version_node) if isinstance(version_node, yaml.ScalarNode) else None
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise reader.fail(version_node, f"version: {reader.describe(version_node)} is not "
                                        f"supported; this floodwall reads version "
                                        f"{FORMAT_VERSION}")

    defaults: dict[str, Policy] = {}
    default_lines: dict[str, int] = {}
    if "defaults" in top:
        for i, item in enumerate(reader.sequence(top["defaults"][1], "defaults")):
            where = f"defaults[{i}]"
            entry = reader.mapping(item, where, _DEFAULTS_KEYS, required=("vhost",))
            vhost_node = entry["vhost"][1]
            vhost = reader.string(vhost_node, f"{where}.vhost")
            if vhost in defaults:
                raise reader.fail(vhost_node, f"{where}.vhost: defaults for vhost {vhost!r} "
                                              f"already given on line {default_lines[vhost]}")
            default_lines[vhost] = _line(vhost_node)
            defaults[vhost] = _resolve(reader, entry, where, BUILTIN_DEFAULTS, "built-in",
                                       name=f"defaults[{vhost}]", vhost=vhost,
                                       line=_line(item))

    policies: list[Policy] = []
    name_lines: dict[str, int] = {}
    if "policies" in top:
        for i, item in enumerate(reader.sequence(top["policies"][1], "policies")):
            where = f"policies[{i}]" + _peek_name(item)
            entry = reader.mapping(item, where, _POLICY_KEYS, required=("name", "match"))
            name_node = entry["name"][1]
            name = reader.string(name_node, f"{where}.name")
            if not _NAME.fullmatch(name):
                raise reader.fail(name_node, f"{where}.name: {name!r} must start with a letter "
                                             "or digit and use only letters, digits and _.:/-")
            if name in name_lines:
                raise reader.fail(name_node, f"{where}.name: duplicate policy name {name!r} "
                                             f"(first on line {name_lines[name]})")
            name_lines[name] = _line(name_node)
            match_node = entry["match"][1]
            match = reader.mapping(match_node, f"{where}.match", _MATCH_KEYS)
            vhost = (reader.string(match["vhost"][1], f"{where}.match.vhost")
                     if "vhost" in match else "/")
            glob = regex = None
            if "queue" in match and "queue_regex" in match:
                raise reader.fail(match["queue_regex"][0], f"{where}.match: give queue (a glob) "
                                                           "or queue_regex, not both")
            if "queue" in match:
                glob_node = match["queue"][1]
                glob = reader.string(glob_node, f"{where}.match.queue")
                try:
                    glob_to_regex(glob)
                except ValueError as exc:
                    raise reader.fail(glob_node, f"{where}.match.queue: bad glob: {exc}") from None
            elif "queue_regex" in match:
                regex_node = match["queue_regex"][1]
                regex = reader.string(regex_node, f"{where}.match.queue_regex")
                try:
                    re.compile(regex)
                except re.error as exc:
                    raise reader.fail(regex_node, f"{where}.match.queue_regex: bad regex "
                                                  f"{regex!r}: {exc}") from None
            else:
                raise reader.fail(match_node, f"{where}.match: needs queue (a glob) or "
                                              "queue_regex")
            base = defaults.get(vhost, BUILTIN_DEFAULTS)
            label = f"from defaults for vhost {vhost!r}" if vhost in defaults else "built-in"
            policies.append(_resolve(reader, entry, where, base, label, name=name, vhost=vhost,
                                     queue=glob, queue_regex=regex, line=_line(item)))
    return PolicySet(tuple(policies), defaults, source)


def load_policies(path: str | os.PathLike[str]) -> PolicySet:
    """Read and parse a policy file; ``PolicyError`` names the file (and line) on failure."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PolicyError(source, None, f"cannot read: {reason}") from None
    return parse_policies(text, source)


# --- reloading ------------------------------------------------------------------------

_Fingerprint = tuple[int, int, int]  # (mtime_ns, size, inode)


def _fingerprint(path: str) -> _Fingerprint | None:
    try:
        st = os.stat(path)  # follows symlinks: a ConfigMap swap changes the inode
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@dataclass(frozen=True)
class ReloadResult:
    """What one reload did: ``ok`` with the policies now in effect, or the ``reason`` why not.

    On failure ``policies`` is the unchanged previous set. ``changed`` is True when the new
    set differs from the old one.
    """

    ok: bool
    policies: PolicySet
    reason: str | None = None
    changed: bool = False


class PolicyStore:
    """The policies in effect, replaced whole by ``reload``; a bad file keeps the old ones.

    The I/O layer calls ``reload()`` on SIGHUP and polls ``changed_since_last_load()`` on a
    timer (a Kubernetes ConfigMap changes by symlink swap, seen as a new inode/mtime/size).
    Every reload attempt, good or bad, records the file's fingerprint, so a bad file is
    reported once and not again until it changes. ``generation`` counts successful loads.
    """

    def __init__(self, policies: PolicySet = EMPTY_POLICIES,
                 path: str | os.PathLike[str] | None = None) -> None:
        self.current = policies
        self.path = os.fspath(path) if path is not None else None
        self.generation = 0
        self._fingerprint: _Fingerprint | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> PolicyStore:
        """Load at startup: a bad file raises ``PolicyError`` (no old policies to keep)."""
        store = cls(path=path)
        source = store._path(None)
        store._fingerprint = _fingerprint(source)
        store.current = load_policies(source)
        store.generation = 1
        return store

    def _path(self, path: str | os.PathLike[str] | None) -> str:
        if path is not None:
            return os.fspath(path)
        if self.path is None:
            raise ValueError("PolicyStore has no path; pass one")
        return self.path

    def reload(self, path: str | os.PathLike[str] | None = None) -> ReloadResult:
        """Load the file (the store's path by default); on error keep the current set."""
        source = self._path(path)
        self.path = source
        self._fingerprint = _fingerprint(source)  # before reading: a racing change is seen
        try:
            new = load_policies(source)
        except PolicyError as exc:
            return ReloadResult(ok=False, policies=self.current, reason=str(exc))
        changed = new != self.current
        self.current = new
        self.generation += 1
        return ReloadResult(ok=True, policies=new, changed=changed)

    def changed_since_last_load(self, path: str | os.PathLike[str] | None = None) -> bool:
        """True if the file's (mtime_ns, size, inode) differ from the last reload attempt."""
        source = self._path(path)
        if source != self.path:
            return True
        return _fingerprint(source) != self._fingerprint


# --- the effective policies, for people -----------------------------------------------

_COMMENT_COLUMN: Final = 32


def _quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def _limit_lines(p: Policy) -> list[tuple[str, str]]:
    """``(yaml, comment)`` lines of every resolved setting of a policy or defaults entry."""
    lines: list[tuple[str, str]] = []
    exact = "" if p.capacity < 1024 else f"{p.capacity} bytes"
    lines.append((f"capacity: {format_bytes(p.capacity)}",
                  "no byte limit" if p.capacity == 0 else exact))
    lines.append((f"resume: {format_bytes(p.resume)}",
                  "" if p.resume < 1024 else f"{p.resume} bytes"))
    if p.max_messages is None:
        lines.append(("max_messages: 0", "no count limit (so no resume_messages)"))
    else:
        lines.append((f"max_messages: {p.max_messages}", ""))
        lines.append((f"resume_messages: {p.resume_messages}", ""))
    note = ""
    if p.overflow is not p.effective_overflow:
        note = (f"NOTE: {p.overflow.value} needs --spool-dir at run time "
                f"(acts as {p.effective_overflow.value} without it)")
    lines.append((f"overflow: {p.overflow.value}", note))
    lines.append((f"deadline: {format_duration(p.deadline)}", ""))
    lines.append((f"signal: {p.signal.value}", ""))
    lines.append((f"on_unknown_depth: {p.on_unknown_depth.value}", ""))
    sp = p.spool
    lines.append((f"spool: {{max_bytes: {format_bytes(sp.max_bytes)}, fsync: {sp.fsync.value}, "
                  f"group_commit_ms: {sp.group_commit_ms}}}", ""))
    return lines


def _emit(out: list[str], indent: str, text: str, comment: str = "") -> None:
    line = indent + text
    if comment:
        line = f"{line.ljust(_COMMENT_COLUMN - 1)} # {comment}"
    out.append(line)


def render_policies(policies: PolicySet) -> str:
    """The effective policies as commented YAML: every field resolved, sizes in units.

    The text is itself a valid policy file that loads to an equal ``PolicySet``.
    """
    out: list[str] = [
        f"# {policies.source}: valid, {len(policies.policies)} "
        f"polic{'y' if len(policies.policies) == 1 else 'ies'}, defaults for "
        f"{len(policies.defaults)} vhost{'' if len(policies.defaults) == 1 else 's'}.",
        "# Every field is resolved (inherited values filled in). First matching policy wins,",
        "# then the vhost's defaults if they set a limit; anything else is not policed.",
        f"version: {FORMAT_VERSION}",
    ]
    if policies.defaults:
        out.append("defaults:")
        for vhost, d in policies.defaults.items():
            where = f"line {d.line}" if d.line is not None else ""
            _emit(out, "  - ", f"vhost: {_quote(vhost)}", where)
            for text, comment in _limit_lines(d):
                _emit(out, "    ", text, comment)
            if not d.is_limited:
                out.append(f"    # sets no limit: queues of {_quote(vhost)} that no policy "
                           "matches are not policed")
    if policies.policies:
        out.append("policies:")
        for p in policies.policies:
            where = f"line {p.line}" if p.line is not None else ""
            _emit(out, "  - ", f"name: {_quote(p.name)}", where)
            if p.queue_regex is not None:
                what = f"queue_regex: {_quote(p.queue_regex)}"
            else:
                what = f"queue: {_quote(p.queue if p.queue is not None else '*')}"
            _emit(out, "    ", f"match: {{vhost: {_quote(p.vhost)}, {what}}}")
            for text, comment in _limit_lines(p):
                _emit(out, "    ", text, comment)
            if not p.is_limited:
                out.append("    # sets no limit: the queues it matches are exempt (not policed)")
    else:
        out.append("policies: []")
    return "\n".join(out) + "\n"
