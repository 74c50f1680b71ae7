"""The policy model: enums, limits, one resolved ``Policy``, and the ``PolicySet`` that says which
policy polices a queue."""

from __future__ import annotations

import enum
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

#: Seconds a publisher may be held before it gets a nack or a channel close.
DEFAULT_DEADLINE: Final = 30.0

FORMAT_VERSION: Final = 1


class Severity(enum.Enum):
    """How bad a problem with a policy file is: an error refuses the file, a warning not."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy file, where it is: ``FILE:LINE:COLUMN: reason``.

    ``line`` and ``column`` count from 1; None when the problem has no place (an
    unreadable file). A warning says so after the place.
    """

    source: str
    line: int | None
    column: int | None
    reason: str
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        warning = "warning: " if self.severity is Severity.WARNING else ""
        return f"{where}: {warning}{self.reason}"

    def as_dict(self) -> dict[str, object]:
        return {"file": self.source, "line": self.line, "column": self.column,
                "severity": self.severity.value, "reason": self.reason}


class PolicyError(ValueError):
    """A policy file is unreadable or invalid: every error found in it (``problems``), one
    ``FILE:LINE:COLUMN: reason`` per line in ``str()``; ``source``, ``line``, ``column``
    and ``reason`` are the first one's."""

    def __init__(self, source: str, line: int | None, reason: str,
                 column: int | None = None, problems: tuple[Problem, ...] = ()) -> None:
        self.source = source
        self.line = line
        self.column = column
        self.reason = reason
        self.problems = problems or (Problem(source, line, column, reason),)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def of(cls, problems: list[Problem]) -> PolicyError:
        """The error of a file with these problems (at least one)."""
        first = problems[0]
        return cls(first.source, first.line, first.reason, first.column, tuple(problems))


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


class Mode(enum.Enum):
    """Whether a policy acts (enforce) or only says what it would have done (shadow: depth,
    trips and the gates' verdicts are computed, logged and counted; every frame passes)."""

    ENFORCE = "enforce"
    SHADOW = "shadow"


class Fsync(enum.Enum):
    """When the spool makes a record durable: each record, each group commit, never."""

    ALWAYS = "always"
    GROUP = "group"
    NEVER = "never"


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
    mode: Mode = Mode.ENFORCE
    in_flight_allowance: int | None = None  # bytes; None: auto (``in_flight_allowance``)
    line: int | None = field(default=None, compare=False)
    column: int | None = field(default=None, compare=False)
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
        if self.in_flight_allowance is not None and self.in_flight_allowance < 1:
            raise ValueError(f"in_flight_allowance must be > 0 or None (auto), got "
                             f"{self.in_flight_allowance}")
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
    def enforced(self) -> bool:
        """False for a shadow policy: its queues are watched, never held."""
        return self.mode is Mode.ENFORCE

    def effective_overflow(self, spooling: bool) -> Overflow:
        """The overflow applied: ``spool`` is ``hold`` without a spool (``spooling`` False: no
        ``--spool-dir``, which the caller knows; the policy does not)."""
        if self.overflow is Overflow.SPOOL and not spooling:
            return Overflow.HOLD
        return self.overflow

    def matches(self, vhost: str, queue: str) -> bool:
        if vhost != self.vhost:
            return False
        return self._pattern is None or self._pattern.fullmatch(queue) is not None


#: The built-in defaults, as a vhost-less template (``name``/``vhost`` unused).
BUILTIN_DEFAULTS: Final = Policy(name="builtin")


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

    @property
    def enforcing_vhosts(self) -> frozenset[str]:
        """The vhosts where an enforce-mode policy or limiting defaults entry can police."""
        return frozenset([*(p.vhost for p in self.policies if p.enforced),
                          *(v for v, d in self.defaults.items() if d.is_limited and d.enforced)])

    def in_shadow(self) -> PolicySet:
        """The same policies, every one in shadow mode (``--shadow``)."""
        return PolicySet(tuple(replace(p, mode=Mode.SHADOW) for p in self.policies),
                         {v: replace(d, mode=Mode.SHADOW) for v, d in self.defaults.items()},
                         self.source)

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
