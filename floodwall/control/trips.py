"""Which policed queues are tripped, as the gates see them: enforced (publishes wait on them)
or in shadow mode (watched: a gate only counts what it would have done).

A queue trips and releases by the same rule in both modes (``control.policy.should_trip``); its
policy's ``mode`` files the trip here. The broker alarm (``ALARM``) is filed as enforced
while some policy enforces, else as shadow. Pure bookkeeping, owned by ``FlowController``.
"""

from __future__ import annotations

QueueKey = tuple[str, str]  # (vhost, queue)
_NOTHING: frozenset[QueueKey] = frozenset()


class StampedAnswers:
    """Answers kept per key until their stamp changes (``FlowController.blocking``: per set of
    queue names, until a trip, release, backlog or awaited first figure changes)."""

    def __init__(self, limit: int) -> None:
        self._known: dict[tuple[str, frozenset[str]], frozenset[QueueKey]] = {}
        self._stamp: object = None
        self._limit = limit

    def get(self, stamp: object, key: tuple[str, frozenset[str]]) -> frozenset[QueueKey] | None:
        if stamp != self._stamp:  # something they depend on changed: forget them all
            self._known.clear()
            self._stamp = stamp
        return self._known.get(key)

    def put(self, key: tuple[str, frozenset[str]], answer: frozenset[QueueKey]
            ) -> frozenset[QueueKey]:
        if len(self._known) >= self._limit:
            self._known.clear()
        self._known[key] = answer
        return answer


class Trips:
    """The tripped queues: ``enforced`` and ``shadow`` (disjoint sets of keys)."""

    def __init__(self) -> None:
        self.enforced: set[QueueKey] = set()
        self.shadow: set[QueueKey] = set()
        self.version = 0  # changes with every trip, release and filing (a cache's stamp)

    def trip(self, key: QueueKey, shadow: bool) -> None:
        (self.shadow if shadow else self.enforced).add(key)
        self.version += 1

    def release(self, key: QueueKey) -> None:
        self.enforced.discard(key)
        self.shadow.discard(key)
        self.version += 1

    def file(self, key: QueueKey, shadow: bool) -> bool:
        """A tripped ``key``'s mode is now ``shadow`` (or not): move it. True when it left the
        enforced trips (what waited on it may go)."""
        self.version += 1
        if shadow:
            left = key in self.enforced
            self.enforced.discard(key)
            self.shadow.add(key)
            return left
        self.shadow.discard(key)
        self.enforced.add(key)
        return False

    def shadow_among(self, vhost: str, queues: frozenset[str], alarm: QueueKey) -> \
            frozenset[QueueKey]:
        """What the enforced blocking set would gain were every shadow policy enforced: the
        shadow trips among ``queues`` of ``vhost``, and ``alarm`` when it is filed as shadow."""
        shadow = self.shadow
        if not shadow:
            return _NOTHING
        found = frozenset(k for q in queues if (k := (vhost, q)) in shadow)
        return found | {alarm} if alarm in shadow else found

    def still_shadow(self, keys: frozenset[QueueKey]) -> frozenset[QueueKey]:
        """Those of ``keys`` still tripped in shadow mode."""
        return keys & self.shadow if keys else keys
