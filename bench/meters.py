"""CPU and memory meters for the benchmark's processes, and the statistics we report."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil


def cpu_seconds(proc: psutil.Process | None) -> float:
    """User + system CPU seconds of one process (0.0 when there is none or it is gone)."""
    if proc is None:
        return 0.0
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle, all cores added up."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)


def syscalls(proc: psutil.Process | None) -> tuple[int, int]:
    """Read and write system calls of one process so far (Linux ``syscr``/``syscw``: libuv
    reads a socket with read() and writes it with write()/writev(); (0, 0) if unknown)."""
    if proc is None:
        return 0, 0
    try:
        io = proc.io_counters()
    except (psutil.Error, AttributeError):
        return 0, 0
    return int(io.read_count), int(io.write_count)


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float
    relay: float  # the target's relay process (floodwall or pump); 0 for direct
    broker: float
    client: float  # this process
    machine: float
    relay_reads: int = 0  # the relay's read() calls (socket reads)
    relay_writes: int = 0  # the relay's write()/writev() calls


class CpuMeter:
    """Snapshots of CPU time of the relay, the broker, this client and the whole machine."""

    def __init__(self, broker: psutil.Process | None) -> None:
        self.broker = broker
        self.me = psutil.Process(os.getpid())

    def snapshot(self, relay: psutil.Process | None) -> CpuSnapshot:
        reads, writes = syscalls(relay)
        return CpuSnapshot(time.perf_counter(), cpu_seconds(relay), cpu_seconds(self.broker),
                           cpu_seconds(self.me), machine_busy_seconds(), reads, writes)

    @staticmethod
    def delta(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, float]:
        """CPU seconds used between two snapshots; ``other`` is everything else on the machine
        (other people's processes: noise)."""
        relay, broker, client = b.relay - a.relay, b.broker - a.broker, b.client - a.client
        machine = b.machine - a.machine
        return {
            "wall_s": b.wall - a.wall,
            "relay_cpu_s": relay,
            "broker_cpu_s": broker,
            "client_cpu_s": client,
            "machine_cpu_s": machine,
            "other_cpu_s": max(0.0, machine - relay - broker - client),
            "relay_reads": b.relay_reads - a.relay_reads,
            "relay_writes": b.relay_writes - a.relay_writes,
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of already sorted values, nearest-rank."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def median(values: Sequence[float]) -> float:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    return float(statistics.median(clean)) if clean else math.nan


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mann-Whitney U of ``a`` against ``b`` (ties a half) and its two-sided p by the normal
    approximation (fair from some eight values a side): whether ``a`` and ``b`` differ by
    more than their spread explains."""
    if not a or not b:
        return math.nan, math.nan
    u = sum((x > y) + 0.5 * (x == y) for x in a for y in b)
    n1, n2 = len(a), len(b)
    z = (u - n1 * n2 / 2) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return u, math.erfc(abs(z) / math.sqrt(2))


def rss_bytes(proc: psutil.Process) -> int:
    return int(proc.memory_info().rss)
