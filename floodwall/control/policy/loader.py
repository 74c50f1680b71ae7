"""The version-1 YAML policy file: parsed with every error found (``FILE:LINE:COLUMN: reason``),
loaded, reloaded."""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import yaml
from yaml.constructor import SafeConstructor

from floodwall.control.policy.model import (
    BUILTIN_DEFAULTS,
    EMPTY_POLICIES,
    FORMAT_VERSION,
    Fsync,
    Mode,
    Overflow,
    Policy,
    PolicyError,
    PolicySet,
    Problem,
    Signal,
    SpoolSettings,
    UnknownDepth,
    glob_to_regex,
)
from floodwall.control.policy.units import (
    _Composite,
    _describe,
    format_bytes,
    parse_bytes,
    parse_duration,
    whole_number,
)

# --- the loader -----------------------------------------------------------------------

_LIMIT_KEYS: Final = ("capacity", "resume", "max_messages", "resume_messages", "overflow",
                      "deadline", "signal", "on_unknown_depth", "spool", "mode",
                      "in_flight_allowance")
_TOP_KEYS: Final = ("version", "defaults", "policies")
_POLICY_KEYS: Final = ("name", "match", *_LIMIT_KEYS)
_DEFAULTS_KEYS: Final = ("vhost", *_LIMIT_KEYS)
_MATCH_KEYS: Final = ("vhost", "queue", "queue_regex")
_SPOOL_KEYS: Final = ("max_bytes", "fsync", "group_commit_ms")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")

_Entry = tuple[yaml.Node, yaml.Node]  # (key node, value node)
_E = TypeVar("_E", bound=enum.Enum)
_T = TypeVar("_T")
_N = TypeVar("_N", int, float)


def _peek_name(item: yaml.Node) -> str:
    """`` (NAME)`` for messages about a policy entry whose name is a plain string, else ``""``."""
    if isinstance(item, yaml.MappingNode):
        for key, value in item.value:
            if (isinstance(key, yaml.ScalarNode) and key.value == "name"
                    and isinstance(value, yaml.ScalarNode) and value.value):
                return f" ({value.value})"
    return ""


def _short_tag(tag: str) -> str:
    """``tag:yaml.org,2002:int`` as it was written: ``!!int``."""
    prefix = "tag:yaml.org,2002:"
    return "!!" + tag[len(prefix):] if tag.startswith(prefix) else tag


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _column(node: yaml.Node) -> int:
    return int(node.start_mark.column) + 1


class _Invalid(Exception):
    """One problem where reading cannot go on; caught where it can (the next field, the
    next entry), so one run finds every error."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class _Reported(Exception):
    """Reading a value stopped on problems already recorded."""


class _Reader:
    """Walks the composed YAML, turning nodes into values and collecting ``problems``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self._constructor = SafeConstructor()

    def problem(self, node: yaml.Node | None, reason: str) -> Problem:
        if node is None:
            return Problem(self.source, 1, 1, reason)
        return Problem(self.source, _line(node), _column(node), reason)

    def fail(self, node: yaml.Node | None, reason: str) -> _Invalid:
        """The problem to raise where the value cannot be read."""
        return _Invalid(self.problem(node, reason))

    def note(self, node: yaml.Node | None, reason: str) -> None:
        """A problem to record; reading goes on."""
        self.problems.append(self.problem(node, reason))

    def attempt(self, read: Callable[[], _T], fallback: _T) -> _T:
        """``read()``, or ``fallback`` with its problem recorded."""
        try:
            return read()
        except _Invalid as exc:
            self.problems.append(exc.problem)
            return fallback
        except _Reported:
            return fallback

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
        except Exception:  # PyYAML's constructors raise what they meet (!!bool maybe)
            raise self.fail(node, f"YAML: {_shown(node.value)} is not a valid "
                                  f"{_short_tag(node.tag)}") from None
        finally:
            self._constructor.constructed_objects.clear()  # each node on its own
            self._constructor.recursive_objects.clear()

    def mapping(self, node: yaml.Node, where: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, _Entry]:
        """The keys of a mapping; unknown, duplicate and missing keys are recorded (the
        rest is read on), anything but a mapping raises."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{where}: expected a mapping, got {self.describe(node)}")
        out: dict[str, _Entry] = {}
        for key_node, value_node in node.value:
            try:
                key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            except _Invalid as exc:
                self.problems.append(exc.problem)
                continue
            if not isinstance(key, str):
                self.note(key_node, f"{where}: keys must be names, got "
                                    f"{self.describe(key_node)}")
                continue
            if key in out:
                self.note(key_node, f"{where}: duplicate key {key!r} (first on line "
                                    f"{_line(out[key][0])})")
                continue
            if key not in allowed:
                self.note(key_node, f"{where}: unknown key {key!r}; known: "
                                    f"{', '.join(allowed)}")
                continue
            out[key] = (key_node, value_node)
        for key in required:
            if key not in out:
                self.note(node, f"{where}: missing required key {key!r}")
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

    def allowance(self, node: yaml.Node, where: str) -> int | None:
        """``auto`` (None) or a size of more than 0 bytes."""
        if isinstance(node, yaml.ScalarNode) and self.scalar(node) == "auto":
            return None
        return self._more_than_zero(parse_bytes, node, where, " (or auto)")

    def duration(self, node: yaml.Node, where: str) -> float:
        return self._more_than_zero(parse_duration, node, where)

    def _more_than_zero(self, parse: Callable[[object], _N], node: yaml.Node, where: str,
                        besides: str = "") -> _N:
        """``parse`` of the node's value, which must be more than 0 (``besides``: what else
        the field takes, said in the errors)."""
        try:
            value = parse(self._value(node))
        except ValueError as exc:
            said = f"expected a value more than 0{besides}: " if besides else ""
            raise self.fail(node, f"{where}: {said}{exc}") from None
        if value <= 0:
            raise self.fail(node, f"{where}: must be more than 0{besides}")
        return value

    def count(self, node: yaml.Node, where: str, minimum: int) -> int:
        """A whole number (also as Helm writes a large one: ``1e+06``)."""
        try:
            value = whole_number(self._value(node))
        except ValueError as exc:
            raise self.fail(node, f"{where}: {exc}") from None
        if value is None:
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


def _resolve(reader: _Reader, entry: dict[str, _Entry], where: str, base: Policy,
             base_label: str, **fixed: Any) -> Policy | None:
    """A Policy from an entry's limit keys, inheriting what it leaves out from base; None
    when a field is wrong (each problem recorded: the other fields are still read)."""
    before = len(reader.problems)

    def node(key: str) -> yaml.Node | None:
        return entry[key][1] if key in entry else None

    def read(key: str, value: Callable[[yaml.Node], _T], inherited: _T) -> _T:
        n = node(key)
        return inherited if n is None else reader.attempt(lambda: value(n), inherited)

    values: dict[str, Any] = {}
    values.update(_byte_limits(reader, node, where, base, base_label))
    values.update(_count_limits(reader, node, where, base, base_label))
    values["overflow"] = read("overflow", lambda n: reader.choice(
        n, f"{where}.overflow", Overflow), base.overflow)
    values["deadline"] = read("deadline", lambda n: reader.duration(
        n, f"{where}.deadline"), base.deadline)
    values["signal"] = read("signal", lambda n: reader.choice(
        n, f"{where}.signal", Signal), base.signal)
    values["on_unknown_depth"] = read("on_unknown_depth", lambda n: reader.choice(
        n, f"{where}.on_unknown_depth", UnknownDepth), base.on_unknown_depth)
    values["mode"] = read("mode", lambda n: reader.choice(n, f"{where}.mode", Mode), base.mode)
    values["spool"] = read("spool", lambda n: _spool_settings(
        reader, n, where, base.spool), base.spool)
    values["in_flight_allowance"] = read("in_flight_allowance", lambda n: reader.allowance(
        n, f"{where}.in_flight_allowance"), base.in_flight_allowance)
    if len(reader.problems) > before or any(
            v is None for k, v in values.items() if k in ("capacity", "resume")):
        return None
    return Policy(**fixed, **values)


_Node = Callable[[str], "yaml.Node | None"]


def _byte_limits(reader: _Reader, node: _Node, where: str, base: Policy,
                 base_label: str) -> dict[str, int | None]:
    """``capacity`` and ``resume``: inherited as a pair (a limit set alone resumes at itself).
    None where a value could not be read (its problem recorded)."""
    cap_node, res_node = node("capacity"), node("resume")
    capacity: int | None = base.capacity
    if cap_node is not None:
        capacity = reader.attempt(lambda: reader.size(cap_node, f"{where}.capacity"), None)
    resume: int | None
    if res_node is not None:
        resume = reader.attempt(lambda: reader.size(res_node, f"{where}.resume"), None)
        if resume is not None and capacity is not None and resume > capacity:
            origin = "" if cap_node is not None else f" ({base_label})"
            limit = "0 = unlimited" if capacity == 0 else format_bytes(capacity)
            reader.note(res_node, f"{where}.resume: {format_bytes(resume)} is more than "
                                  f"capacity ({limit}){origin}; resume must be <= capacity")
    else:
        resume = capacity if cap_node is not None else base.resume
    return {"capacity": capacity, "resume": resume}


def _count_limits(reader: _Reader, node: _Node, where: str, base: Policy,
                  base_label: str) -> dict[str, int | None]:
    """``max_messages`` and ``resume_messages``, inherited as a pair like the byte limits."""
    max_node, rmsg_node = node("max_messages"), node("resume_messages")
    max_messages = base.max_messages
    max_ok = True
    if max_node is not None:
        read = reader.attempt(lambda: reader.count(max_node, f"{where}.max_messages", 0), -1)
        max_ok = read >= 0
        max_messages = read or None if max_ok else None
    if rmsg_node is not None:
        resume_messages: int | None = reader.attempt(
            lambda: reader.count(rmsg_node, f"{where}.resume_messages", 0), None)
        if max_ok and max_messages is None:
            reader.note(rmsg_node, f"{where}.resume_messages: set without max_messages "
                                   "(no count limit to resume from)")
        elif (max_ok and max_messages is not None and resume_messages is not None
              and resume_messages > max_messages):
            origin = "" if max_node is not None else f" ({base_label})"
            reader.note(rmsg_node, f"{where}.resume_messages: {resume_messages} is more "
                                   f"than max_messages ({max_messages}){origin}")
    else:
        resume_messages = max_messages if max_node is not None else base.resume_messages
    return {"max_messages": max_messages, "resume_messages": resume_messages}


def _spool_settings(reader: _Reader, n: yaml.Node, where: str,
                    spool: SpoolSettings) -> SpoolSettings:
    """An entry's ``spool`` mapping over the inherited settings (raises after recording
    every problem in it)."""
    before = len(reader.problems)
    sp = reader.mapping(n, f"{where}.spool", _SPOOL_KEYS)
    max_bytes = spool.max_bytes
    if "max_bytes" in sp:
        node = sp["max_bytes"][1]
        max_bytes = reader.attempt(lambda: reader.size(node, f"{where}.spool.max_bytes"),
                                   spool.max_bytes)
        if max_bytes == 0:
            reader.note(node, f"{where}.spool.max_bytes: must be more than 0")
    fsync = spool.fsync
    if "fsync" in sp:
        node_f = sp["fsync"][1]
        fsync = reader.attempt(lambda: reader.choice(node_f, f"{where}.spool.fsync", Fsync),
                               spool.fsync)
    group_ms = spool.group_commit_ms
    if "group_commit_ms" in sp:
        node_g = sp["group_commit_ms"][1]
        group_ms = reader.attempt(lambda: reader.count(
            node_g, f"{where}.spool.group_commit_ms", 1), spool.group_commit_ms)
    if len(reader.problems) > before:
        raise _Reported
    return SpoolSettings(max_bytes=max_bytes, fsync=fsync, group_commit_ms=group_ms)


def parse_policies(text: str, source: str = "<string>") -> PolicySet:
    """Parse a version-1 policy document; ``PolicyError`` carries every error found in it
    (``FILE:LINE:COLUMN: reason`` each)."""
    reader = _Reader(source)
    try:
        return _parse(reader, text, source)
    except PolicyError:
        raise
    except RecursionError:
        problem = Problem(source, 1, 1, "YAML: nested too deeply to read")
    except Exception as exc:  # a bug, or a YAML input nobody foresaw: still FILE:LINE
        problem = Problem(source, 1, 1, f"cannot be read: {type(exc).__name__}: {exc}")
    raise PolicyError.of([*reader.problems, problem])


def _parse(reader: _Reader, text: str, source: str) -> PolicySet:
    policies: list[Policy] = []
    defaults: dict[str, Policy] = {}
    try:
        top = _top_level(reader, text, source)
        if "defaults" in top:
            defaults = reader.attempt(lambda: _read_defaults(reader, top["defaults"][1]), {})
        if "policies" in top:
            no_items: list[yaml.Node] = []
            items = reader.attempt(lambda: reader.sequence(top["policies"][1], "policies"),
                                   no_items)
            name_lines: dict[str, int] = {}
            for i, item in enumerate(items):
                try:
                    policy = _read_policy(reader, i, item, defaults, name_lines)
                except _Invalid as exc:
                    reader.problems.append(exc.problem)
                    continue
                if policy is not None:
                    policies.append(policy)
    except _Invalid as exc:  # nothing more can be read (a YAML syntax error, a version)
        reader.problems.append(exc.problem)
    if reader.problems:
        raise PolicyError.of(sorted(reader.problems,
                                    key=lambda p: (p.line or 0, p.column or 0)))
    return PolicySet(tuple(policies), defaults, source)


def _top_level(reader: _Reader, text: str, source: str) -> dict[str, _Entry]:
    """The document's top-level mapping, its ``version`` checked."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        column = mark.column + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "malformed"
        raise _Invalid(Problem(source, line, column, f"YAML syntax: {problem}")) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        before = text[:exc.position]
        line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise _Invalid(Problem(source, line, column, f"YAML: character U+{code:04X} is not "
                                                     "allowed")) from None
    except yaml.YAMLError as exc:
        raise _Invalid(Problem(source, 1, 1, f"YAML: {exc}")) from None
    except RecursionError:
        raise _Invalid(Problem(source, 1, 1, "YAML: nested too deeply to read")) from None
    if root is None:
        raise _Invalid(Problem(source, 1, 1,
                               "empty file; expected a mapping with 'version: 1'"))
    if not isinstance(root, yaml.MappingNode):
        raise reader.fail(root, "expected a mapping with 'version: 1' at the top, got "
                                f"{reader.describe(root)}")
    top = reader.mapping(root, "top level", _TOP_KEYS)
    if "version" not in top:
        reader.note(root, "missing 'version: 1' (the policy format version)")
        return top
    version_node = top["version"][1]
    version = reader.scalar(version_node) if isinstance(version_node, yaml.ScalarNode) else None
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise reader.fail(version_node, f"version: {reader.describe(version_node)} is not "
                                        f"supported; this floodwall reads version "
                                        f"{FORMAT_VERSION}")
    return top


def _read_defaults(reader: _Reader, node: yaml.Node) -> dict[str, Policy]:
    """The ``defaults`` list: one entry per vhost (entries with problems left out)."""
    defaults: dict[str, Policy] = {}
    default_lines: dict[str, int] = {}
    for i, item in enumerate(reader.sequence(node, "defaults")):
        where = f"defaults[{i}]"
        try:
            entry = reader.mapping(item, where, _DEFAULTS_KEYS, required=("vhost",))
            if "vhost" not in entry:
                continue
            vhost_node = entry["vhost"][1]
            vhost = reader.string(vhost_node, f"{where}.vhost")
        except _Invalid as exc:
            reader.problems.append(exc.problem)
            continue
        if vhost in default_lines:
            reader.note(vhost_node, f"{where}.vhost: defaults for vhost {vhost!r} "
                                    f"already given on line {default_lines[vhost]}")
            continue
        default_lines[vhost] = _line(vhost_node)
        resolved = _resolve(reader, entry, where, BUILTIN_DEFAULTS, "built-in",
                            name=f"defaults[{vhost}]", vhost=vhost, line=_line(item))
        if resolved is not None:
            defaults[vhost] = resolved
    return defaults


def _read_policy(reader: _Reader, i: int, item: yaml.Node, defaults: dict[str, Policy],
                 name_lines: dict[str, int]) -> Policy | None:
    """One entry of the ``policies`` list (``name_lines``: the names seen so far); None
    when it has problems (recorded)."""
    where = f"policies[{i}]" + _peek_name(item)
    entry = reader.mapping(item, where, _POLICY_KEYS, required=("name", "match"))
    name: str | None = None
    if "name" in entry:
        name_node = entry["name"][1]
        name = reader.attempt(lambda: reader.string(name_node, f"{where}.name"), None)
        if name is not None and not _NAME.fullmatch(name):
            reader.note(name_node, f"{where}.name: {name!r} must start with a letter "
                                   "or digit and use only letters, digits and _.:/-")
            name = None
        elif name is not None and name in name_lines:
            reader.note(name_node, f"{where}.name: duplicate policy name {name!r} "
                                   f"(first on line {name_lines[name]})")
            name = None
        elif name is not None:
            name_lines[name] = _line(name_node)
    match = (reader.attempt(lambda: _read_match(reader, entry["match"][1], where), None)
             if "match" in entry else None)
    vhost = match[0] if match is not None else "/"
    base = defaults.get(vhost, BUILTIN_DEFAULTS)
    label = f"from defaults for vhost {vhost!r}" if vhost in defaults else "built-in"
    if name is None or match is None:
        # Still read the limits: their problems are reported in the same run.
        _resolve(reader, entry, where, base, label, name="invalid", vhost=vhost)
        return None
    _, glob, regex = match
    return _resolve(reader, entry, where, base, label, name=name, vhost=vhost,
                    queue=glob, queue_regex=regex, line=_line(item), column=_column(item))


def _read_match(reader: _Reader, match_node: yaml.Node, where: str
                ) -> tuple[str, str | None, str | None] | None:
    """A policy's ``match``: (vhost, queue glob, queue regex), one of the two set; None
    when it has problems (recorded)."""
    before = len(reader.problems)
    match = reader.mapping(match_node, f"{where}.match", _MATCH_KEYS)
    vhost = "/"
    if "vhost" in match:
        vhost = reader.attempt(lambda: reader.string(match["vhost"][1], f"{where}.match.vhost"),
                               "/")
    glob: str | None = None
    regex: str | None = None
    if "queue" in match and "queue_regex" in match:
        reader.note(match["queue_regex"][0], f"{where}.match: give queue (a glob) or "
                                             "queue_regex, not both")
    elif "queue" in match:
        glob_node = match["queue"][1]
        glob = reader.attempt(lambda: reader.string(glob_node, f"{where}.match.queue"), None)
        if glob is not None:
            try:
                glob_to_regex(glob)
            except ValueError as exc:
                reader.note(glob_node, f"{where}.match.queue: bad glob: {exc}")
    elif "queue_regex" in match:
        regex_node = match["queue_regex"][1]
        regex = reader.attempt(lambda: reader.string(regex_node, f"{where}.match.queue_regex"),
                               None)
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                reader.note(regex_node, f"{where}.match.queue_regex: bad regex "
                                        f"{regex!r}: {exc}")
    else:
        reader.note(match_node, f"{where}.match: needs queue (a glob) or queue_regex")
    if len(reader.problems) > before:
        return None
    return vhost, glob, regex


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
                 path: str | os.PathLike[str] | None = None, shadow: bool = False) -> None:
        self.current = policies
        self.path = os.fspath(path) if path is not None else None
        self.generation = 0
        self.shadow = shadow  # ``--shadow``: every policy loaded is in shadow mode
        self._fingerprint: _Fingerprint | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], shadow: bool = False) -> PolicyStore:
        """Load at startup: a bad file raises ``PolicyError`` (no old policies to keep)."""
        store = cls(path=path, shadow=shadow)
        source = store._path(None)
        store._fingerprint = _fingerprint(source)
        store.current = store._load(source)
        store.generation = 1
        return store

    def _load(self, source: str) -> PolicySet:
        policies = load_policies(source)
        return policies.in_shadow() if self.shadow else policies

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
            new = self._load(source)
        except PolicyError as exc:
            return ReloadResult(ok=False, policies=self.current, reason=str(exc))
        except Exception as exc:  # never expected (the loader makes every error a
            # PolicyError); a reload must not end the watcher for all that
            return ReloadResult(ok=False, policies=self.current,
                                reason=f"{source}: cannot be read: {type(exc).__name__}: {exc}")
        changed = new != self.current
        self.current = new
        self.generation += 1
        return ReloadResult(ok=True, policies=new, changed=changed)

    def revert(self, policies: PolicySet) -> None:
        """Undo the last successful ``reload`` (its policies could not be applied): the
        given set is in effect again, and the file is read again at its next change."""
        self.current = policies
        self.generation -= 1

    def changed_since_last_load(self, path: str | os.PathLike[str] | None = None) -> bool:
        """True if the file's (mtime_ns, size, inode) differ from the last reload attempt."""
        source = self._path(path)
        if source != self.path:
            return True
        return _fingerprint(source) != self._fingerprint
