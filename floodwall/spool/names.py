"""How a vhost or queue name becomes one directory name under the spool root, and back.

Any name RabbitMQ accepts gets a directory of its own, directly under its parent:

- percent-encoding of every byte but ``A-Z a-z 0-9 _ . - ~`` (so ``/``, NUL, ``%`` and
  every control character are escaped);
- a name made only of dots (``.``, ``..``, ``...``) has its dots encoded too (``%2E%2E``):
  ``.`` and ``..`` would otherwise name the parent itself or the one above it;
- the empty name (never a vhost RabbitMQ creates) is ``%``;
- a name whose encoding is longer than a file name may be (``NAME_MAX``) is ``%%`` and the
  SHA-256 of the name, the name itself kept in the file ``.name`` inside the directory.

Every resolved path is checked to stay where it belongs (``queue_directory``): under the
root, exactly two levels down. Spools written before dot-only names were escaped used the
plain encoding (``...``); ``existing_queue_directory`` still finds them, so they are
recovered, shown and purged like any other.
"""

from __future__ import annotations

import errno
import hashlib
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

QueueKey = tuple[str, str]  # (vhost, queue)

#: The longest directory name written (Linux's NAME_MAX is 255 bytes).
NAME_MAX = 255
#: The file that names a directory whose name is a digest (``%%...``).
NAME_FILE = ".name"
_DIGEST_PREFIX = "%%"


class SpoolPathError(OSError):
    """A name that would resolve outside its place under the spool root."""


def _dots_only(name: str) -> bool:
    return bool(name) and name.strip(".") == ""


def dir_name(name: str) -> str:
    """The directory name of a vhost or queue name (see the module's rules)."""
    if _dots_only(name):
        return "%2E" * len(name)
    encoded = urllib.parse.quote(name, safe="") or "%"
    if len(encoded.encode()) > NAME_MAX:
        return _DIGEST_PREFIX + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return encoded


def legacy_dir_name(name: str) -> str:
    """The directory name the spool used before dot-only names were escaped."""
    return urllib.parse.quote(name, safe="") or "%"


def name_of(directory: Path) -> str | None:
    """The vhost or queue name a directory holds; None when it cannot be told (a digest
    directory without its ``.name`` file)."""
    text = directory.name
    if text == "%":
        return ""
    if text.startswith(_DIGEST_PREFIX):
        try:
            return (directory / NAME_FILE).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    return urllib.parse.unquote(text)


def queue_directory(root: Path, key: QueueKey) -> Path:
    """Where ``key``'s spool lives under ``root``; ``SpoolPathError`` if that path would
    resolve anywhere but two levels under the root (a symbolic link pointing away)."""
    path = root / dir_name(key[0]) / dir_name(key[1])
    check_under(root, path, key)
    return path


def existing_queue_directory(root: Path, key: QueueKey) -> Path:
    """``queue_directory``, or the directory an older floodwall made for ``key`` (a
    dot-only name, unescaped) when only that one exists."""
    path = queue_directory(root, key)
    if not (_dots_only(key[0]) or _dots_only(key[1])) or path.is_dir():
        return path  # (the old encoding differs only for dot-only names)
    vhosts = [n for n in dict.fromkeys((dir_name(key[0]), legacy_dir_name(key[0])))
              if n not in (".", "..")]
    queue = legacy_dir_name(key[1])
    if queue in (".", ".."):
        return path  # never stored: the old encoding put these into a parent
    for vhost in vhosts:
        legacy = root / vhost / queue
        if legacy != path and legacy.is_dir():
            check_under(root, legacy, key)
            return legacy
    return path


def check_under(root: Path, path: Path, key: QueueKey) -> None:
    """``SpoolPathError`` unless ``path`` resolves to a directory two levels under ``root``."""
    top = root.resolve()
    resolved = path.resolve()
    if resolved.parent.parent != top:
        raise SpoolPathError(errno.EINVAL, f"the spool of queue {key[1]!r} in vhost "
                             f"{key[0]!r} would be {resolved}, not a directory two levels "
                             f"under the spool root {top}; refusing it")


def make_queue_directory(root: Path, key: QueueKey) -> Path:
    """Create (if needed) and return ``key``'s directory, ``.name`` files included where a
    name is a digest."""
    path = existing_queue_directory(root, key)
    path.mkdir(parents=True, exist_ok=True)
    for directory, name in ((path.parent, key[0]), (path, key[1])):
        if directory.name.startswith(_DIGEST_PREFIX) and not (directory / NAME_FILE).exists():
            _write_name(directory, name)
    check_under(root, path, key)  # what was just made (a link raced in: refused)
    return path


def _write_name(directory: Path, name: str) -> None:
    tmp = directory / (NAME_FILE + ".tmp")
    tmp.write_text(name, encoding="utf-8")
    tmp.replace(directory / NAME_FILE)


@dataclass(frozen=True, slots=True)
class UnreadableEntry:
    """Something under the spool root that is not a queue's spool directory."""

    path: Path
    reason: str


def queue_directories(root: Path) -> Iterator[tuple[QueueKey, Path] | UnreadableEntry]:
    """Every queue directory under ``root`` (sorted), as (key, path); what cannot be one
    (a directory whose name cannot be told, a link out of the root) as ``UnreadableEntry``.
    Plain files (``.lock``) are not queues and are passed over silently."""
    if not root.is_dir():
        return
    for vdir in sorted(p for p in root.iterdir() if p.is_dir()):
        vhost = name_of(vdir)
        if vhost is None:
            yield UnreadableEntry(vdir, f"no readable {NAME_FILE} file: vhost name unknown")
            continue
        for qdir in sorted(p for p in vdir.iterdir() if p.is_dir()):
            queue = name_of(qdir)
            if queue is None:
                yield UnreadableEntry(qdir, f"no readable {NAME_FILE} file: queue name "
                                            "unknown")
                continue
            try:
                check_under(root, qdir, (vhost, queue))
            except SpoolPathError as exc:
                yield UnreadableEntry(qdir, exc.strerror or str(exc))
                continue
            yield (vhost, queue), qdir
