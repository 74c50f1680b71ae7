"""The version-1 YAML policy file: parsed with ``FILE:LINE: reason`` errors, loaded, reloaded."""

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
    Overflow,
    Policy,
    PolicyError,
    PolicySet,
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
)

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


def _resolve(reader: _Reader, entry: dict[str, _Entry], where: str, base: Policy,
             base_label: str, **fixed: Any) -> Policy:
    """Build a Policy from an entry's limit keys, inheriting what it leaves out from base."""
    def node(key: str) -> yaml.Node | None:
        return entry[key][1] if key in entry else None

    values: dict[str, Any] = {}
    values.update(_byte_limits(reader, node, where, base, base_label))
    values.update(_count_limits(reader, node, where, base, base_label))
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
    n = node("spool")
    values["spool"] = base.spool if n is None else _spool_settings(reader, n, where, base.spool)
    return Policy(**fixed, **values)


_Node = Callable[[str], "yaml.Node | None"]


def _byte_limits(reader: _Reader, node: _Node, where: str, base: Policy,
                 base_label: str) -> dict[str, int]:
    """``capacity`` and ``resume``: inherited as a pair (a limit set alone resumes at itself)."""
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
    return {"capacity": capacity, "resume": resume}


def _count_limits(reader: _Reader, node: _Node, where: str, base: Policy,
                  base_label: str) -> dict[str, int | None]:
    """``max_messages`` and ``resume_messages``, inherited as a pair like the byte limits."""
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
    return {"max_messages": max_messages, "resume_messages": resume_messages}


def _spool_settings(reader: _Reader, n: yaml.Node, where: str,
                    spool: SpoolSettings) -> SpoolSettings:
    """An entry's ``spool`` mapping over the inherited settings."""
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
    return SpoolSettings(max_bytes=max_bytes, fsync=fsync, group_commit_ms=group_ms)


def parse_policies(text: str, source: str = "<string>") -> PolicySet:
    """Parse a version-1 policy document; raise ``PolicyError`` (``FILE:LINE: reason``)."""
    reader = _Reader(source)
    top = _top_level(reader, text, source)
    defaults = (_read_defaults(reader, top["defaults"][1]) if "defaults" in top else {})
    policies: list[Policy] = []
    name_lines: dict[str, int] = {}
    if "policies" in top:
        for i, item in enumerate(reader.sequence(top["policies"][1], "policies")):
            policies.append(_read_policy(reader, i, item, defaults, name_lines))
    return PolicySet(tuple(policies), defaults, source)


def _top_level(reader: _Reader, text: str, source: str) -> dict[str, _Entry]:
    """The document's top-level mapping, its ``version`` checked."""
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
    return top


def _read_defaults(reader: _Reader, node: yaml.Node) -> dict[str, Policy]:
    """The ``defaults`` list: one entry per vhost."""
    defaults: dict[str, Policy] = {}
    default_lines: dict[str, int] = {}
    for i, item in enumerate(reader.sequence(node, "defaults")):
        where = f"defaults[{i}]"
        entry = reader.mapping(item, where, _DEFAULTS_KEYS, required=("vhost",))
        vhost_node = entry["vhost"][1]
        vhost = reader.string(vhost_node, f"{where}.vhost")
        if vhost in defaults:
            raise reader.fail(vhost_node, f"{where}.vhost: defaults for vhost {vhost!r} "
                                          f"already given on line {default_lines[vhost]}")
        default_lines[vhost] = _line(vhost_node)
        defaults[vhost] = _resolve(reader, entry, where, BUILTIN_DEFAULTS, "built-in",
                                   name=f"defaults[{vhost}]", vhost=vhost, line=_line(item))
    return defaults


def _read_policy(reader: _Reader, i: int, item: yaml.Node, defaults: dict[str, Policy],
                 name_lines: dict[str, int]) -> Policy:
    """One entry of the ``policies`` list (``name_lines``: the names seen so far)."""
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
    vhost, glob, regex = _read_match(reader, entry["match"][1], where)
    base = defaults.get(vhost, BUILTIN_DEFAULTS)
    label = f"from defaults for vhost {vhost!r}" if vhost in defaults else "built-in"
    return _resolve(reader, entry, where, base, label, name=name, vhost=vhost,
                    queue=glob, queue_regex=regex, line=_line(item))


def _read_match(reader: _Reader, match_node: yaml.Node, where: str
                ) -> tuple[str, str | None, str | None]:
    """A policy's ``match``: (vhost, queue glob, queue regex), one of the two set."""
    match = reader.mapping(match_node, f"{where}.match", _MATCH_KEYS)
    vhost = (reader.string(match["vhost"][1], f"{where}.match.vhost")
             if "vhost" in match else "/")
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
        return vhost, glob, None
    if "queue_regex" in match:
        regex_node = match["queue_regex"][1]
        regex = reader.string(regex_node, f"{where}.match.queue_regex")
        try:
            re.compile(regex)
        except re.error as exc:
            raise reader.fail(regex_node, f"{where}.match.queue_regex: bad regex "
                                          f"{regex!r}: {exc}") from None
        return vhost, None, regex
    raise reader.fail(match_node, f"{where}.match: needs queue (a glob) or queue_regex")


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
