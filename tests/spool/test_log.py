"""The spool's segment log: append, sync, read, confirm, recover (torn tails, corruption)."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.spool.log import QueueSpool, SpoolError
from floodwall.spool.records import RecordError, SpoolRecord, decode_at

PROPS = bytes.fromhex("003c0000000000000000000a0000")  # basic class, body size 10, no props


def rec(i: int, body: bytes | None = None) -> SpoolRecord:
    return SpoolRecord(0, 1000.0 + i, "ex", f"rk.{i}", PROPS, body or f"body-{i}".encode())


def test_record_round_trip_and_every_truncation_is_refused() -> None:
    r = SpoolRecord(7, 12.5, "exchange", "routing.key", PROPS, b"x" * 300, mandatory=True)
    data = r.encode()
    assert len(data) == r.size
    assert decode_at(data, 0) == (r, len(data))
    for cut in range(len(data)):
        with pytest.raises(RecordError):
            decode_at(data[:cut], 0)


def test_a_record_with_flags_this_version_never_writes_is_refused() -> None:
    """Every record that decodes encodes back to its bytes: unknown flag bits (a foreign or
    damaged record whose checksum holds) are refused, not dropped on the way."""
    payload = bytearray(SpoolRecord(7, 12.5, "ex", "rk", PROPS, b"x").encode()[12:])
    payload[16] |= 0x60  # the flags byte, after seq (u64) and accepted_at (f64)
    head = struct.pack(">4sII", b"FWR1", len(payload), zlib.crc32(payload))
    with pytest.raises(RecordError, match="unknown flags 0x60"):
        decode_at(head + payload, 0)


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_garbage_never_decodes_as_a_record(junk: bytes) -> None:
    try:
        decode_at(junk, 0)
    except RecordError:
        return
    raise AssertionError("garbage decoded")  # pragma: no cover


def test_append_sync_read_in_order(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path)
    seqs = [spool.append(rec(i)) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert list(spool.records()) == []  # not durable yet
    assert spool.sync() == 5
    got = list(spool.records())
    assert [r.seq for r in got] == seqs
    assert [r.routing_key for r in got] == [f"rk.{i}" for i in range(5)]
    assert spool.pending_records == 5


def test_segments_rotate_and_go_once_confirmed(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path, segment_bytes=300)
    for i in range(10):
        spool.append(rec(i, b"y" * 100))
    spool.sync()
    assert len(list(tmp_path.glob("*.seg"))) >= 4
    spool.confirmed_through(6, sizes=6 * rec(0, b"y" * 100).size, count=6)
    left = sorted(int(p.stem) for p in tmp_path.glob("*.seg"))
    assert left and left[0] <= 7
    assert [r.seq for r in spool.records()] == [7, 8, 9, 10]
    spool.confirmed_through(10, sizes=4 * rec(0, b"y" * 100).size, count=4)
    assert list(tmp_path.glob("*.seg")) == []
    assert spool.empty
    assert spool.append(rec(11)) == 11  # numbering goes on


def test_recovery_drops_a_torn_tail_and_keeps_every_whole_record(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path)
    for i in range(4):
        spool.append(rec(i))
    spool.sync()
    spool.close()
    (seg,) = tmp_path.glob("*.seg")
    whole = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(rec(99).encode()[:-5])  # a crash mid-append
    again = QueueSpool(tmp_path)
    assert again.report.torn_tail_bytes > 0
    assert seg.stat().st_size == whole
    assert [r.seq for r in again.records()] == [1, 2, 3, 4]
    assert again.append(rec(5)) == 5


def test_recovery_skips_what_was_confirmed(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path)
    for i in range(4):
        spool.append(rec(i))
    spool.sync()
    spool.confirmed_through(2, sizes=0, count=2)
    spool.close()
    again = QueueSpool(tmp_path)
    assert [r.seq for r in again.records()] == [3, 4]
    assert again.report.records == 2


def test_corruption_in_an_older_segment_loses_only_the_damaged_record(tmp_path: Path) -> None:
    spool = QueueSpool(tmp_path, segment_bytes=200)
    for i in range(6):
        spool.append(rec(i, b"z" * 80))
    spool.sync()
    spool.close()
    first = sorted(tmp_path.glob("*.seg"))[0]
    data = bytearray(first.read_bytes())
    data[30] ^= 0xFF
    first.write_bytes(bytes(data))
    again = QueueSpool(tmp_path)
    assert again.report.corrupt and str(first) in again.report.corrupt[0]
    assert [r.seq for r in again.records()] == [2, 3, 4, 5, 6]
    assert again.report.lost_records == 1


def test_a_failed_write_leaves_the_segment_whole(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from floodwall.spool import log as spool_log

    spool = QueueSpool(tmp_path)
    spool.append(rec(0))
    real_write = os.write
    calls = {"n": 0}

    def flaky(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            real_write(fd, data[:10])  # part of the record reaches the file
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(spool_log.os, "write", flaky)
    with pytest.raises(spool_log.SpoolError, match="No space left"):
        spool.append(rec(1))
    monkeypatch.setattr(spool_log.os, "write", real_write)
    assert spool.append(rec(2)) == 2
    spool.sync()
    assert [r.routing_key for r in spool.records()] == ["rk.0", "rk.2"]


@pytest.mark.parametrize("text", [b"9" * 57, b"18446744073709551616", b"-3", b"5_000",
                                  b"\xff\xfe", b"12 34"])
def test_a_cursor_no_record_can_have_is_unreadable_and_everything_replays(
        tmp_path: Path, text: bytes) -> None:
    first = QueueSpool(tmp_path)
    first.append(SpoolRecord(0, 1.0, "", "q", bytes(14), b"a"))
    first.sync(False)
    first.close()
    (tmp_path / "cursor").write_bytes(text)
    spool = QueueSpool(tmp_path)
    assert spool.confirmed_seq == 0
    assert any("unreadable cursor" in c for c in spool.report.corrupt)
    assert [r.seq for r in spool.records()] == [1]
    assert spool.append(SpoolRecord(0, 2.0, "", "q", bytes(14), b"b")) == 2
    spool.close()


def test_the_last_sequence_number_is_the_last(tmp_path: Path) -> None:
    (tmp_path / "cursor").write_bytes(b"%d\n" % ((1 << 64) - 1))
    spool = QueueSpool(tmp_path)
    with pytest.raises(SpoolError, match="every sequence number"):
        spool.append(SpoolRecord(0, 1.0, "", "q", bytes(14), b"a"))
    spool.close()
