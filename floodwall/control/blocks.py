"""Which channels (0-9-1) and sender links (1.0) are blocked, on which queues, since when.

The controller's table of holds: a channel is blocked on a *set* of queues and freed only
when the set is empty. Pure bookkeeping; the controller decides when to add and
drop, and ends each hold's time in ``HoldTimes``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

QueueKey = tuple[str, str]  # (vhost, queue)
Ref = tuple[int, int]  # (connection id, channel or 1.0 link ref)
_NOTHING: frozenset[QueueKey] = frozenset()


@dataclass(frozen=True)
class Blocked:
    """One blocked channel, for /state and logs."""

    conn_id: int
    channel: int
    queues: frozenset[QueueKey]
    since: float
    starved_since: float | None = None  # 1.0: out of link credit since (None: has some)
    wants_bytes: int = 0  # 1.0: the message bytes its credit window would let it send


class BlockTable:
    """Blocked refs: the queues each waits on, when it was blocked, when it starved."""

    def __init__(self) -> None:
        self._on: dict[Ref, set[QueueKey]] = {}
        self._since: dict[Ref, float] = {}
        self._starved_since: dict[Ref, float] = {}
        self._wants: dict[Ref, int] = {}  # 1.0 links: their window's bytes (``Blocked``)
        # Held 1.0 links' admitted credit not used yet: (messages, body bytes) each.
        self._reserved: dict[Ref, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._on)

    def __contains__(self, ref: object) -> bool:
        return ref in self._on

    def add(self, ref: Ref, queues: set[QueueKey], now: float, wants: int = 0) -> bool:
        """Block ``ref`` on ``queues`` as well; True if it was not blocked before.
        ``wants``: a 1.0 link's window in bytes (what it would send if it had credit)."""
        blocked_on = self._on.get(ref)
        if wants:
            self._wants[ref] = wants
        if blocked_on is None:
            self._on[ref] = queues
            self._since[ref] = now
            return True
        blocked_on |= queues
        return False

    def remove(self, ref: Ref) -> float | None:
        """``ref`` is blocked no more; when it was blocked (None: it was not)."""
        self._on.pop(ref, None)
        self._starved_since.pop(ref, None)
        self._wants.pop(ref, None)
        self._reserved.pop(ref, None)
        return self._since.pop(ref, None)

    def on(self, ref: Ref) -> frozenset[QueueKey]:
        return frozenset(self._on.get(ref, _NOTHING))

    def of_connection(self, conn: int) -> list[Ref]:
        return [r for r in self._on if r[0] == conn]

    def starved(self, ref: Ref, since: float) -> None:
        if ref in self._on:
            self._starved_since[ref] = since

    def drop_queue(self, key: QueueKey) -> list[Ref]:
        """Drop ``key`` from every blocked set; the refs whose set emptied (still listed)."""
        freed: list[Ref] = []
        for ref, qs in self._on.items():
            if key in qs:
                qs.discard(key)
                if not qs:
                    freed.append(ref)
        return freed

    def reserve(self, ref: Ref, messages: int, body_bytes: int) -> None:
        """Blocked 1.0 link ``ref`` has ``messages`` (``body_bytes``) of admitted credit
        left (0: none): counted against the tokens of every queue it waits on
        (``reserved_on``) until it says less or its block ends."""
        if ref not in self._on:
            return
        if messages > 0:
            self._reserved[ref] = (messages, body_bytes)
        else:
            self._reserved.pop(ref, None)

    @property
    def reserving(self) -> bool:
        return bool(self._reserved)

    def reserved_on(self, key: QueueKey, but: Ref | None = None) -> tuple[int, int]:
        """(body bytes, messages) of admitted credit not used yet on ``key``, ``but``'s
        own left out."""
        b = m = 0
        for ref, (messages, body_bytes) in self._reserved.items():
            if ref != but and key in self._on[ref]:
                b += body_bytes
                m += messages
        return b, m

    def channels_waiting(self, key: QueueKey) -> bool:
        """Whether a 0-9-1 channel (a ref that is not a 1.0 link's) waits on ``key``."""
        return any(key in qs for ref, qs in self._on.items() if ref not in self._wants)

    def waiting_on(self, key: QueueKey) -> Iterator[Ref]:
        return (ref for ref, qs in self._on.items() if key in qs)

    def views(self) -> list[Blocked]:
        return [Blocked(ref[0], ref[1], frozenset(qs), self._since[ref],
                        self._starved_since.get(ref), self._wants.get(ref, 0))
                for ref, qs in self._on.items()]
