"""Reading a segment past damage (``spool.segments``), bytes in, records and skips out; and
the same through a queue's recovery and ``floodwall spool ls`` on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.cli import main
from floodwall.spool.log import QueueSpool
from floodwall.spool.records import SpoolRecord
from floodwall.spool.segments import RecordAt, Skipped, scan_segment

PROPS = bytes.fromhex("003c0000000000000000000a0000")


def record(seq: int, body: bytes | None = None) -> SpoolRecord:
    return SpoolRecord(seq, 1000.0 + seq, "ex", f"rk.{seq}", PROPS,
                       body if body is not None else bytes([seq % 251]) * (seq * 7 % 40))


def segment(first: int, count: int) -> tuple[bytes, list[tuple[int, int]]]:
    """``count`` records from seq ``first`` and the byte range of each."""
    out = bytearray()
    spans = []
    for seq in range(first, first + count):
        data = record(seq).encode()
        spans.append((len(out), len(out) + len(data)))
        out += data
    return bytes(out), spans


def seqs(items: list[RecordAt | Skipped]) -> list[int]:
    return [i.record.seq for i in items if isinstance(i, RecordAt)]


def test_an_intact_segment_is_every_record_in_order() -> None:
    data, spans = segment(5, 6)
    items = list(scan_segment(data, 5, 11))
    assert seqs(items) == [5, 6, 7, 8, 9, 10]
    assert [(i.start, i.end) for i in items if isinstance(i, RecordAt)] == spans


@pytest.mark.parametrize("value", [0xFF, 0x01, 0x80])
def test_every_byte_flipped_in_a_non_final_segment_loses_only_its_record(value: int) -> None:
    data, spans = segment(1, 5)
    for pos in range(len(data)):
        damaged = bytearray(data)
        damaged[pos] ^= value
        hit = next(i for i, (start, end) in enumerate(spans) if start <= pos < end)
        items = list(scan_segment(bytes(damaged), 1, 6))
        assert seqs(items) == [s for s in range(1, 6) if s != hit + 1], pos
        skipped = [i for i in items if isinstance(i, Skipped)]
        assert len(skipped) == 1, pos
        start, end = spans[hit]
        assert (skipped[0].start, skipped[0].end) == (start, end), pos
        assert skipped[0].at_end == (hit == 4), pos


def test_the_records_after_the_damage_keep_their_bytes_and_offsets() -> None:
    data, spans = segment(1, 4)
    damaged = bytearray(data)
    damaged[spans[1][0] + 9] ^= 0x55  # inside the second record's checksum
    items = list(scan_segment(bytes(damaged), 1, None))
    assert [type(i).__name__ for i in items] == ["RecordAt", "Skipped", "RecordAt", "RecordAt"]
    third = items[2]
    assert isinstance(third, RecordAt) and third.record == record(3)
    assert (third.start, third.end) == spans[2]
    assert isinstance(items[1], Skipped) and "checksum" in items[1].reason


def test_garbage_between_records_is_one_skipped_range() -> None:
    data, spans = segment(1, 3)
    junk = b"FWR1\x00\x00\x00\x10" + b"\x00" * 30 + b"not a record"
    mixed = data[:spans[1][0]] + junk + data[spans[1][0]:]
    items = list(scan_segment(mixed, 1, 4))
    assert seqs(items) == [1, 2, 3]
    (skip,) = [i for i in items if isinstance(i, Skipped)]
    assert skip.size == len(junk) and not skip.at_end


def test_a_record_inside_a_damaged_records_body_is_not_taken_for_a_real_one() -> None:
    inner = record(1, b"inner").encode()  # seq 1: below the records around it
    outer = record(8, b"A" * 10 + inner + b"B" * 10)
    data = record(7).encode() + outer.encode() + record(9).encode()
    damaged = bytearray(data)
    damaged[len(record(7).encode())] ^= 0xFF  # the outer record's magic
    items = list(scan_segment(bytes(damaged), 7, 10))
    assert seqs(items) == [7, 9]


def test_a_record_from_beyond_the_next_segment_is_not_taken_either() -> None:
    stray = record(50).encode()
    data = record(1).encode() + b"\x00" * 5 + stray + record(2).encode()
    assert seqs(list(scan_segment(data, 1, 40))) == [1, 2]


def test_damage_at_the_end_is_at_end_and_nothing_follows() -> None:
    data, _ = segment(1, 3)
    items = list(scan_segment(data + b"FWR1\x00\x00", 1, None))
    assert seqs(items) == [1, 2, 3]
    assert isinstance(items[-1], Skipped) and items[-1].at_end and items[-1].size == 6


def test_all_garbage_is_one_skip() -> None:
    items = list(scan_segment(b"\x00" * 100 + b"FWR1" + b"\xff" * 50, 1, None))
    assert items == [Skipped(0, 154, "bad magic b'\\x00\\x00\\x00\\x00'", at_end=True)]
    assert list(scan_segment(b"", 1, None)) == []


def partition(items: list[RecordAt | Skipped], size: int) -> None:
    """The items cover the bytes end to end, in order, without overlap."""
    pos = 0
    for item in items:
        assert item.start == pos and item.end > item.start
        pos = item.end
    assert pos == size


@given(st.binary(max_size=600))
@settings(max_examples=300)
def test_any_bytes_are_records_and_skips_end_to_end(data: bytes) -> None:
    items = list(scan_segment(data, 1, None))
    partition(items, len(data))
    assert all(not i.at_end for i in items[:-1] if isinstance(i, Skipped))


@given(st.lists(st.binary(max_size=40), min_size=6, max_size=6))
@settings(max_examples=300)
def test_junk_between_records_loses_no_record(junk: list[bytes]) -> None:
    data, _ = segment(1, 5)
    pieces = [record(seq).encode() for seq in range(1, 6)]
    mixed = b"".join(j + p for j, p in zip(junk, [*pieces, b""], strict=True))
    items = list(scan_segment(mixed, 1, 6))
    partition(items, len(mixed))
    assert seqs(items) == [1, 2, 3, 4, 5]
    assert sum(i.size for i in items if isinstance(i, Skipped)) == len(mixed) - len(data)


# -- through recovery, on disk --------------------------------------------------------------

def written(directory: Path, count: int, segment_bytes: int) -> list[Path]:
    spool = QueueSpool(directory, segment_bytes=segment_bytes)
    for seq in range(1, count + 1):
        spool.append(record(seq))
    spool.sync()
    spool.close()
    return sorted(directory.glob("*.seg"))


def test_recovery_after_any_flipped_byte_in_an_older_segment_loses_one_record(
        tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    paths = written(pristine, 8, 200)
    assert len(paths) >= 3
    first = paths[0].read_bytes()
    _, spans = segment(1, len([1 for _ in scan_segment(first, 1, None)]))
    for pos in range(0, len(first), 3):
        case = tmp_path / f"case-{pos}"
        case.mkdir()
        for p in paths:
            (case / p.name).write_bytes(p.read_bytes())
        damaged = bytearray(first)
        damaged[pos] ^= 0xFF
        (case / paths[0].name).write_bytes(bytes(damaged))
        hit = next(i for i, (start, end) in enumerate(spans) if start <= pos < end) + 1
        again = QueueSpool(case, segment_bytes=200)
        assert [r.seq for r in again.records()] == [s for s in range(1, 9) if s != hit], pos
        assert again.report.lost_records == 1, pos
        assert again.report.skipped_bytes == spans[hit - 1][1] - spans[hit - 1][0], pos
        assert again.append(record(0)) == 9  # numbering goes on
        again.sync()
        again.close()
        clean = QueueSpool(case, segment_bytes=200)  # rewritten: nothing damaged any more
        assert clean.report.problems == [], pos
        assert [r.seq for r in clean.records()] == [s for s in range(1, 10) if s != hit], pos
        clean.close()


def test_a_flipped_byte_in_the_newest_segment_keeps_the_records_after_it(
        tmp_path: Path) -> None:
    (seg,) = written(tmp_path, 6, 1 << 20)
    _, spans = segment(1, 6)
    damaged = bytearray(seg.read_bytes())
    damaged[spans[2][0] + 20] ^= 0x10
    seg.write_bytes(bytes(damaged))
    again = QueueSpool(tmp_path)
    assert [r.seq for r in again.records()] == [1, 2, 4, 5, 6]
    assert again.report.torn_tail_bytes == 0 and again.report.lost_records == 1
    assert again.append(record(0)) == 7


def test_stray_entries_are_skipped_and_reported(tmp_path: Path) -> None:
    written(tmp_path, 3, 1 << 20)
    (tmp_path / "x.seg").write_bytes(b"junk")
    (tmp_path / "5.seg").mkdir()
    (tmp_path / "notes.txt").write_text("an operator's note")
    again = QueueSpool(tmp_path)
    assert [r.seq for r in again.records()] == [1, 2, 3]
    assert len(again.report.bad_entries) == 2
    assert any("x.seg" in b and "not a segment name" in b for b in again.report.bad_entries)
    assert any("5.seg" in b and "not a regular file" in b for b in again.report.bad_entries)
    assert (tmp_path / "x.seg").exists() and (tmp_path / "5.seg").is_dir()  # left alone


def test_spool_ls_shows_skipped_bytes_and_stray_entries(tmp_path: Path) -> None:
    queue_dir = tmp_path / "%2F" / "orders"
    paths = written(queue_dir, 8, 200)
    damaged = bytearray(paths[0].read_bytes())
    damaged[3] ^= 0xFF
    paths[0].write_bytes(bytes(damaged))
    (queue_dir / "x.seg").write_bytes(b"junk")
    out = CliRunner().invoke(main, ["spool", "ls", "--spool-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "damaged" in out.output and "skipped" in out.output and "x.seg" in out.output
    row = next(line.split() for line in out.output.splitlines() if "orders" in line)
    assert row[:3] == ["/", "orders", "7"]  # 8 records, one damaged
    doc = json.loads(CliRunner().invoke(
        main, ["spool", "ls", "--json", "--spool-dir", str(tmp_path)]).output)
    assert doc[0]["records"] == 7 and doc[0]["skipped_bytes"] > 0
    assert any("x.seg" in p for p in doc[0]["problems"])
    assert paths[0].read_bytes() == bytes(damaged)  # ls changes nothing
