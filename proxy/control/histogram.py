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
