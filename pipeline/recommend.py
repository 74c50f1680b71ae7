"""Recommended policies from the per-queue figures: the method of docs/pipeline.md, in code.

Pure Python (no Spark): the job collects one row per queue and this module turns each into
a policy entry with its reasoning as YAML comments. The text is checked with
``proxy.policy.parse_policies`` before anyone sees it.

The method, per queue:
- **capacity = drain rate x target drain time**, rounded up to 4 KiB and at least 64 KiB.
  The drain rate is what the consumers took while the queue had a backlog (egress over
  backlog buckets), so a queue at capacity empties in about the target time: a message
  that arrives at a full queue waits that long at most behind the others.
- **resume = capacity - burst**, rounded down to 4 KiB, and at least a quarter of capacity.
  The burst is what lands at once when the queue is released: the publishes held at the
  release (p90 over trips, summed over the sidecars that trip) plus one second of peak
  ingress (p99). A gap smaller than that re-trips the queue at once.
- **max_messages / resume_messages** the same way in messages, when the policy has them.
- **deadline**: raised to 1.5 x the p90 trip length (whole seconds) when publishes expired,
  kept otherwise.
- Without a backlog (the consumers kept up, or too little data) the current values stay.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from floodwall.control.policy import (
    FORMAT_VERSION,
    format_bytes,
    format_bytes_approx,
    format_duration,
    parse_policies,
)

KIB = 1024
ROUND = 4 * KIB
MIN_CAPACITY = 64 * KIB
DEFAULT_TARGET_DRAIN = 30.0
DEFAULT_DEADLINE = 30.0


@dataclass(frozen=True)
class Recommendation:
    vhost: str
    queue: str
    name: str
    capacity: int
    resume: int
    max_messages: int | None
    resume_messages: int | None
    deadline: float
    overflow: str
    reasons: list[str] = field(default_factory=list)
    changed: bool = True
    mode: str = "enforce"  # kept as observed: a shadow policy stays in shadow until you say


def _num(row: Mapping[str, object], key: str) -> float | None:
    value = row.get(key)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else float(value)
    return None


def _round_up(n: float, step: int) -> int:
    return int(math.ceil(n / step) * step)


def _round_down(n: float, step: int) -> int:
    return int(math.floor(n / step) * step)


def _b(n: float | None) -> str:
    return "?" if n is None else format_bytes_approx(int(n))


def _rate(n: float | None) -> str:
    return "?" if n is None else f"{format_bytes_approx(int(n))}/s"


def _glob_literal(name: str) -> str:
    """A glob that matches exactly ``name``."""
    return re.sub(r"([*?\[\\])", r"\\\1", name)


def _policy_name(vhost: str, queue: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.:/-]", "-", queue).strip("-") or "queue"
    if vhost != "/":
        base = re.sub(r"[^A-Za-z0-9_.:/-]", "-", vhost).strip("-") + "/" + base
    base = "rec-" + base
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    taken.add(name)
    return name


def recommend(row: Mapping[str, object], target_drain: float = DEFAULT_TARGET_DRAIN,
              taken: set[str] | None = None) -> Recommendation:
    """One queue's recommendation from its ``per_queue`` row (a dict)."""
    vhost, queue = str(row["vhost"]), str(row["queue"])
    name = _policy_name(vhost, queue, taken if taken is not None else set())
    capacity = int(_num(row, "capacity") or 0)
    resume = int(_num(row, "resume") or 0)
    max_messages = int(_num(row, "max_messages") or 0) or None
    resume_messages = int(_num(row, "resume_messages") or 0) if max_messages else None
    deadline = _num(row, "deadline") or DEFAULT_DEADLINE
    overflow = str(row.get("overflow") or "hold")
    reasons: list[str] = []

    observed = _num(row, "observed_seconds") or 0.0
    tripped_s = _num(row, "tripped_seconds") or 0.0
    trips = int(_num(row, "trips") or 0)
    reasons.append(
        f"observed {format_duration(round(observed))} on {int(_num(row, 'sidecars') or 0)} "
        f"sidecar(s), policy {row.get('policy')!r}: tripped {trips} time(s), "
        f"{tripped_s:.0f}s ({100 * (_num(row, 'tripped_share') or 0):.0f}% of the time)")
    reasons.append(
        f"depth p50 {_b(_num(row, 'depth_p50'))}, p99 {_b(_num(row, 'depth_p99'))}, max "
        f"{_b(_num(row, 'depth_max'))}; peak overshoot over capacity "
        f"{_b(_num(row, 'peak_overshoot'))}")
    drain = _num(row, "drain_rate")
    ingress_p99 = _num(row, "ingress_rate_p99") or 0.0
    reasons.append(
        f"ingress {_rate(_num(row, 'ingress_rate'))} mean, {_rate(ingress_p99)} p99; egress "
        f"{_rate(_num(row, 'egress_rate'))} mean, {_rate(drain)} while backlogged "
        f"({format_duration(round(_num(row, 'backlog_seconds') or 0))})")

    changed = False
    if capacity > 0:
        if drain is None or drain <= 0:
            reasons.append("capacity, resume: kept; no backlog was seen, so the consumers' "
                           "drain rate is unknown")
        else:
            new_cap = max(_round_up(drain * target_drain, ROUND), MIN_CAPACITY)
            held = _num(row, "held_at_release_p90") or 0.0
            burst = held + ingress_p99
            quarter = _round_down(new_cap / 4, ROUND)
            floored = new_cap - burst < quarter
            new_resume = min(max(_round_down(new_cap - burst, ROUND), quarter), new_cap)
            reasons.append(
                f"capacity {format_bytes(new_cap)} (was {format_bytes(capacity)}) = drain "
                f"{_rate(drain)} x {format_duration(target_drain)} target drain time = "
                f"{_b(drain * target_drain)}, rounded up to 4 KiB (at least 64 KiB)")
            floor_note = (" (floored at a quarter of capacity: the bursts are large for it)"
                          if floored else "")
            reasons.append(
                f"resume {format_bytes(new_resume)} (was {format_bytes(resume)}) = capacity - "
                f"burst {_b(burst)} (held at release p90 {_b(held)} + 1 s of p99 ingress "
                f"{_b(ingress_p99)}){floor_note}")
            changed = changed or (new_cap, new_resume) != (capacity, resume)
            capacity, resume = new_cap, new_resume
    if max_messages:
        drain_m = _num(row, "drain_rate_messages")
        if drain_m is None or drain_m <= 0:
            reasons.append("max_messages, resume_messages: kept (no backlog seen)")
        else:
            new_max = max(math.ceil(drain_m * target_drain), 1)
            burst_m = ((_num(row, "held_messages_at_release_p90") or 0.0)
                       + (_num(row, "ingress_messages_rate_p99") or 0.0))
            new_rm = min(max(math.floor(new_max - burst_m), new_max // 4), new_max)
            reasons.append(
                f"max_messages {new_max} (was {max_messages}) = drain {drain_m:.1f} msg/s x "
                f"{format_duration(target_drain)}; resume_messages {new_rm} (was "
                f"{resume_messages}) = max_messages - burst {burst_m:.0f} messages")
            changed = changed or (new_max, new_rm) != (max_messages, resume_messages)
            max_messages, resume_messages = new_max, new_rm
    expiries = int(_num(row, "deadline_expiries") or 0)
    trip_p90 = _num(row, "trip_seconds_p90")
    if expiries and trip_p90:
        new_deadline = float(max(math.ceil(trip_p90 * 1.5), math.ceil(deadline)))
        reasons.append(f"deadline {format_duration(new_deadline)} (was "
                       f"{format_duration(deadline)}): {expiries} publish(es) expired; trips "
                       f"last {trip_p90:.1f}s at p90, x 1.5")
        changed = changed or new_deadline != deadline
        deadline = new_deadline
    elif expiries:
        reasons.append(f"deadline kept: {expiries} publish(es) expired but no trip ended to "
                       "measure")
    else:
        reasons.append(f"deadline {format_duration(deadline)} kept: no publish expired")
    mode = "shadow" if row.get("mode") == "shadow" else "enforce"
    if mode == "shadow":
        reasons.append("mode: shadow kept (it was observed in shadow mode; set enforce when "
                       "these levels look right)")
    return Recommendation(vhost, queue, name, capacity, resume, max_messages, resume_messages,
                          deadline, overflow, reasons, changed, mode)


def render(recs: Sequence[Recommendation], header: Sequence[str] = ()) -> str:
    """The policies file: a header, then one commented entry per queue."""
    out = ["# recommended-policies.yaml, written by `floodwall analyze` (docs/pipeline.md).",
           *[f"# {line}" for line in header],
           "# Review it, then validate with: floodwall check recommended-policies.yaml",
           f"version: {FORMAT_VERSION}"]
    if not recs:
        out.append("policies: []  # no policed queue in the telemetry")
        return "\n".join(out) + "\n"
    out.append("policies:")
    for r in recs:
        out.append("")
        out.append(f"  # {r.queue} in vhost {r.vhost}"
                   + ("" if r.changed else " (no change recommended)"))
        out.extend(f"  #   {reason}" for reason in r.reasons)
        out.append(f"  - name: {json.dumps(r.name)}")
        out.append(f"    match: {{vhost: {json.dumps(r.vhost)}, "
                   f"queue: {json.dumps(_glob_literal(r.queue))}}}")
        out.append(f"    capacity: {format_bytes(r.capacity) if r.capacity else 0}")
        out.append(f"    resume: {format_bytes(r.resume) if r.resume else 0}")
        if r.max_messages:
            out.append(f"    max_messages: {r.max_messages}")
            out.append(f"    resume_messages: {r.resume_messages}")
        out.append(f"    overflow: {r.overflow}")
        out.append(f"    deadline: {format_duration(r.deadline)}")
        if r.mode != "enforce":
            out.append(f"    mode: {r.mode}")
    text = "\n".join(out) + "\n"
    parse_policies(text, "recommended-policies.yaml")  # never hand out a file check refuses
    return text


def recommend_all(rows: Sequence[Mapping[str, object]], target_drain: float = DEFAULT_TARGET_DRAIN,
                  ) -> list[Recommendation]:
    taken: set[str] = set()
    ordered = sorted(rows, key=lambda r: (str(r["vhost"]), str(r["queue"])))
    return [recommend(r, target_drain, taken) for r in ordered]
