"""The spool manager: limits, draining, the lock, sync modes, batched reads, and a disk that
fills up for real (a 2 MiB tmpfs) without a corrupt segment or an unexpected exception."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from floodwall.spool.log import QueueSpool, SpoolError
from floodwall.spool.manager import SpoolFull, SpoolLimits, SpoolLocked, SpoolManager
from floodwall.spool.records import SpoolRecord

KEY = ("/", "orders")
BIG = 1 << 40


def props(body_size: int) -> bytes:
    # basic class, weight 0, body size, no property flags
    return (60).to_bytes(2, "big") + b"\0\0" + body_size.to_bytes(8, "big") + b"\0\0"


def rec(i: int, size: int = 100) -> SpoolRecord:
    body = f"{i:08d}".encode().ljust(size, b".")
    return SpoolRecord(0, 1_000_000.0 + i, "ex", f"rk.{i}", props(len(body)), body)


def test_per_queue_limit_total_limit_and_free_disk(tmp_path: Path) -> None:
    one = rec(0).size
    m = SpoolManager(tmp_path, SpoolLimits(total_max_bytes=5 * one, min_free_bytes=0))
    for i in range(3):
        m.append(KEY, rec(i), max_bytes=3 * one)
    with pytest.raises(SpoolFull, match="at its limit"):
        m.append(KEY, rec(3), max_bytes=3 * one)
    m.append(("/", "other"), rec(4), BIG)
    m.append(("/", "other"), rec(5), BIG)
    with pytest.raises(SpoolFull, match="total"):
        m.append(("/", "other"), rec(6), BIG)
    assert m.full == {"queue_limit": 1, "total_limit": 1}
    # confirmed records no longer count
    m.sync()
    m.spool(KEY).confirmed_through(1, one, 1)
    m.append(KEY, rec(7), max_bytes=3 * one)

    tight = SpoolManager(tmp_path / "t", SpoolLimits(min_free_bytes=1 << 62))
    with pytest.raises(SpoolFull, match="free"):
        tight.append(KEY, rec(0), BIG)
    assert tight.full["min_free"] == 1 and not tight.spools  # nothing was created


def test_a_message_larger_than_the_brokers_max_message_size_is_refused(tmp_path: Path) -> None:
    """The broker would refuse it at replay (after the client had its ack): the spool says no
    with the reason, writes nothing, and takes the next message that fits."""
    m = SpoolManager(tmp_path, SpoolLimits(min_free_bytes=0, max_message_bytes=1000))
    with pytest.raises(SpoolFull, match=r"1001 bytes is larger than the broker's "
                                        r"max_message_size \(1000 bytes\)") as refused:
        m.append(KEY, rec(0, size=1001), BIG)
    assert refused.value.errno == errno.EFBIG
    assert m.full == {"message_size": 1} and not m.spools
    assert m.append(KEY, rec(1, size=1000), BIG) == 1
    assert SpoolLimits().max_message_bytes == 16 * 1024 * 1024  # RabbitMQ 4's default


def test_not_accepting_refuses_as_draining(tmp_path: Path) -> None:
    m = SpoolManager(tmp_path)
    m.append(KEY, rec(0), BIG)
    m.accepting = False
    with pytest.raises(SpoolFull, match="draining"):
        m.append(KEY, rec(1), BIG)
    assert m.full["draining"] == 1
    assert m.spool(KEY).pending_records == 1


def test_unsynced_and_sync_modes(tmp_path: Path) -> None:
    m = SpoolManager(tmp_path)
    m.append(KEY, rec(0), BIG)
    m.append(("v", "q"), rec(1), BIG)
    assert sorted(m.unsynced()) == sorted([KEY, ("v", "q")])
    fsynced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        fsynced.append(fd)
        real(fd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", counting)
        durable = m.sync(lambda key: key != KEY)  # KEY: fsync never
    assert durable == {KEY: 1, ("v", "q"): 1}
    assert len(fsynced) == 2  # ("v", "q"): its segment and its directory; KEY: none
    assert m.unsynced() == [] and m.sync() == {}


def test_lock_is_exclusive_until_closed(tmp_path: Path) -> None:
    a = SpoolManager(tmp_path)
    a.lock()
    b = SpoolManager(tmp_path)
    with pytest.raises(SpoolLocked, match=f"pid {os.getpid()}"):
        b.lock()
    a.close()
    b.lock()
    b.close()


def test_read_batch_follows_positions_across_segments(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path, segment_bytes=1000)
    for i in range(40):
        spool.append(rec(i, size=90 if i != 17 else 5000))  # one record bigger than a chunk
    assert spool.read_batch(0) == []  # nothing durable yet
    spool.sync()
    assert spool.segment_count > 5
    got: list[int] = []
    after, position = 0, None
    while True:
        batch = spool.read_batch(after, max_bytes=300, position=position)
        if not batch:
            break
        assert 1 <= len(batch) <= 3
        got += [r.seq for r, _ in batch]
        after, position = batch[-1][0].seq, batch[-1][1]
    assert got == list(range(1, 41))
    # a stale position (different `after`) is ignored: the read starts over from `after`
    assert [r.seq for r, _ in spool.read_batch(5, 1 << 20, position)][:2] == [6, 7]
    # records appended later are read on from the same position once durable
    spool.append(rec(40))
    assert spool.read_batch(after, position=position) == []
    spool.sync()
    assert [r.seq for r, _ in spool.read_batch(after, position=position)] == [41]


def test_rotated_segment_is_fsynced_by_the_next_sync(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path, segment_bytes=200)
    fsynced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        fsynced.append(fd)
        real(fd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", counting)
        for i in range(3):
            spool.append(rec(i, 200))  # each one past 200 bytes: a segment each
        spool.sync()
    assert spool.segment_count == 3
    assert len(fsynced) == 3 + 1  # three segments and the directory


def test_a_write_that_cannot_be_cut_back_moves_to_a_new_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = QueueSpool(tmp_path)
    spool.append(rec(0))
    real_write = os.write
    calls = {"n": 0}

    def half_then_eio(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:20])  # a torn record ...
        raise OSError(errno.EIO, "I/O error")

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "I/O error")  # ... that cannot be cut off again

    with monkeypatch.context() as mp:
        mp.setattr(os, "write", half_then_eio)
        mp.setattr(os, "ftruncate", no_truncate)
        with pytest.raises(SpoolError):
            spool.append(rec(1))
    spool.append(rec(2))
    spool.sync()
    spool.close()
    again = QueueSpool(tmp_path)
    assert again.report.corrupt and "20 bytes dropped" in again.report.corrupt[0]
    assert [r.routing_key for r in again.records()] == ["rk.0", "rk.2"]


# --- a real full disk -------------------------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for this test (needs root and mount permission)."""
    mnt = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("body", [1000, 70_000])
def test_disk_full_never_corrupts_and_only_raises_spool_errors(tiny_fs: Path,
                                                               body: int) -> None:
    m = SpoolManager(tiny_fs / "spool", SpoolLimits(min_free_bytes=0), segment_bytes=256 * 1024)
    written: list[SpoolRecord] = [rec(0, body)]
    m.append(KEY, written[0], BIG)  # the manager has looked at the free space now ...
    filler = tiny_fs / "filler"  # ... and someone else fills most of what is left
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        f.write(b"\0" * (os.statvfs(tiny_fs).f_bavail * os.statvfs(tiny_fs).f_frsize
                         - 5 * body - 8192))
    errors: list[SpoolError] = []
    i = 1
    while len(errors) < 5:  # keep trying past the first failure
        r = rec(i, body)
        i += 1
        try:
            m.append(KEY, r, BIG)
        except SpoolError as exc:  # SpoolFull is one; anything else fails the test
            errors.append(exc)
            continue
        written.append(r)
    assert written, "nothing fitted at all"
    real = [e for e in errors if not isinstance(e, SpoolFull)]
    assert real and all(e.errno == errno.ENOSPC for e in real), errors
    assert m.write_errors == len(real)
    durable = m.sync()  # fsync on a full tmpfs is fine
    spool = m.spool(KEY)
    assert durable[KEY] == spool.next_seq - 1 == len(written)
    # what was acknowledged is all there, whole, in order
    assert [r.body for r in spool.records()] == [r.body for r in written]
    m.close()
    reopened = QueueSpool(m.directory(KEY), 256 * 1024)
    assert reopened.report.corrupt == [] and reopened.report.torn_tail_bytes == 0
    assert reopened.report.records == len(written)
    # confirming on the full disk: the cursor may not be writable, which must not raise;
    # the whole segments below the cursor are deleted all the same
    half = len(written) // 2 + 1
    segments_before = reopened.segment_count
    reopened.confirmed_through(half, sum(r.size for r in written[:half]), half)
    assert reopened.pending_records == len(written) - half
    if body > 10_000:
        assert reopened.segment_count < segments_before
    filler.unlink()
    m2 = SpoolManager(tiny_fs / "spool", SpoolLimits(min_free_bytes=0), segment_bytes=256 * 1024)
    m2.spools[KEY] = reopened
    m2.append(KEY, rec(10_000, body), BIG)
    m2.sync()
    m2.close()
    final = QueueSpool(m.directory(KEY), 256 * 1024)
    assert final.report.corrupt == [] and final.report.torn_tail_bytes == 0
    assert [r.body for r in final.records()][-1] == rec(10_000, body).body
