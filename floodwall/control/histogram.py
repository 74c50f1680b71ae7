"""Cumulative histograms of durations, plain arithmetic: the controller's hold times and the
I/O layer's latencies, read into Prometheus families at scrape time (``floodwall.ops``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Histogram:
    """Cumulative bucket counts and a sum, as a Prometheus histogram has them."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        """``(upper bound, cumulative count)`` pairs, ``+Inf`` last."""
        counts = self.counts or [0] * len(self.bounds)
        return [*((f"{b:g}", float(n)) for b, n in zip(self.bounds, counts, strict=True)),
                ("+Inf", float(self.count))]


#: Upper bounds (seconds) of the hold-time histograms.
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class HoldTimes:
    """How long channels and links were held, by (policy, outcome): from the block to the
    release that let them go (``released``), or to their close while still held
    (``closed``: a deadline, a reject, the client). A hold is known by its channel's
    reference; ``blocked`` adds the policies it waits on, ``ended`` records it once."""

    seconds: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    _policies: dict[tuple[int, int], frozenset[str]] = field(default_factory=dict)

    def blocked(self, ref: tuple[int, int], policies: frozenset[str]) -> None:
        if policies:
            self._policies[ref] = self._policies.get(ref, frozenset()) | policies

    def ended(self, ref: tuple[int, int], held: float | None, outcome: str) -> None:
        """The hold of ``ref`` ended after ``held`` seconds (None: it was not held)."""
        policies = self._policies.pop(ref, None)
        if not policies or held is None:
            return
        for policy in policies:
            histogram = self.seconds.get((policy, outcome))
            if histogram is None:
                histogram = self.seconds[(policy, outcome)] = Histogram(HOLD_BUCKETS)
            histogram.observe(held)
