"""What one relayed connection costs when idle: the fd limit the proxy raises
at start and the connections it allows, and the relay objects' footprint."""

from __future__ import annotations

import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import floodwall
from floodwall.io.fds import FD_RESERVE, connection_capacity
from floodwall.io.relay import RelayedConnection, RelaySettings, UpstreamSide, make_core
from floodwall.io.upstreams import Upstreams
from floodwall.ops.metrics import RelayStats
from floodwall.wire.amqp091.connection import Connection
from floodwall.wire.detect import HEADER_SIZE, Detected

HEADER = b"AMQP\x00\x00\x09\x01"


def test_connection_capacity_is_two_descriptors_each_after_the_reserve() -> None:
    assert connection_capacity(1024) == (1024 - FD_RESERVE) // 2 == 480
    assert connection_capacity(20_000 + 2 * 32 + FD_RESERVE) == 10_032
    assert connection_capacity(10) == 0
    assert connection_capacity(resource.RLIM_INFINITY) >= 10_000


def _run_with_soft_limit(soft: int) -> str:
    code = ("from floodwall.io.fds import raise_fd_limit; l = raise_fd_limit(); "
            "print(l.was, l.soft, l.hard, l.connections)")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return subprocess.run([sys.executable, "-c", code], preexec_fn=lower, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def test_the_soft_fd_limit_is_raised_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip(f"a hard RLIMIT_NOFILE of {hard} leaves nothing to raise to here")
    was, soft, got_hard, connections = map(int, _run_with_soft_limit(256).split())
    assert was == 256
    assert soft == got_hard == hard
    assert connections == (hard - FD_RESERVE) // 2


def test_an_idle_relayed_connection_has_no_instance_dict() -> None:
    """Slots: no per-connection ``__dict__`` on the relay's two protocol objects."""
    stats = RelayStats()
    conn = RelayedConnection(RelaySettings(Upstreams([("127.0.0.1", 5672)])), stats, 1)
    assert not hasattr(conn, "__dict__")
    assert not hasattr(UpstreamSide(conn), "__dict__")


def test_an_idle_relayed_0_9_1_connection_takes_under_3_kib_of_heap() -> None:
    """The Python objects of one idle 0-9-1 connection (relay, upstream side, core with
    both directions' tables), measured over 500 of them; the stop sets the scan uses are
    shared, not one per connection (one per connection, they would be 1.2 KiB of its 4.3 KiB)."""
    settings = RelaySettings(Upstreams([("127.0.0.1", 5672)]))
    stats = RelayStats()
    count = 500
    keep = []
    make_core(Detected.AMQP091, HEADER[:HEADER_SIZE], 0, settings)  # warm up caches
    # Only what floodwall's code allocates: threads left by earlier tests in the same
    # process (client libraries, log readers) allocate meanwhile, and counted they made a
    # 2.9 KiB connection read as 3.0 after the integration tests.
    here = tracemalloc.Filter(True, str(Path(floodwall.__file__).parent) + "/*",
                              all_frames=True)
    tracemalloc.start(64)
    try:
        before = tracemalloc.take_snapshot().filter_traces([here])
        for n in range(count):
            conn = RelayedConnection(settings, stats, n)
            conn.core, conn.gate = make_core(Detected.AMQP091, HEADER, n, settings)
            keep.append((conn, UpstreamSide(conn)))
        after = tracemalloc.take_snapshot().filter_traces([here])
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_connection = grown / count
    assert per_connection < 3 * 1024, f"{per_connection:.0f} bytes per connection"
    cores = [c.core for c, _ in keep if isinstance(c.core, Connection)]
    assert len(cores) == count
    assert all(c._client_in.stop_at is cores[0]._client_in.stop_at for c in cores)
