"""How the relay hands a core's output pieces to a transport (``floodwall.io.relay._write``):
one piece as it is when it keeps no more bytes alive than it writes, large output as one
vectored write, small pieces joined."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from floodwall.io.relay import VECTORED_WRITE_MIN, _write


class Recorder:
    """A transport that records the calls it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def write(self, data: Any) -> None:
        self.calls.append(("write", data))

    def writelines(self, pieces: Any) -> None:
        self.calls.append(("writelines", list(pieces)))


def write(chunks: list[Any]) -> list[tuple[str, Any]]:
    t = Recorder()
    _write(cast(asyncio.Transport, t), chunks)
    return t.calls


def test_one_bytes_piece_is_written_as_the_same_object() -> None:
    data = b"x" * 100
    assert write([data]) == [("write", data)] and write([data])[0][1] is data


def test_a_view_of_most_of_a_read_is_written_as_the_view() -> None:
    read = bytes(range(256)) * 8
    view = memoryview(read)[: len(read) // 2]
    (call,) = write([view])
    assert call[0] == "write" and call[1] is view


def test_a_view_of_a_small_part_of_a_read_is_copied_not_kept() -> None:
    read = b"y" * 10_000
    view = memoryview(read)[:100]
    (call,) = write([view])
    assert call == ("write", b"y" * 100) and type(call[1]) is bytes


def test_small_pieces_are_joined_large_output_goes_as_its_pieces() -> None:
    small = [b"a" * 10, memoryview(b"b" * 20)[:5]]
    assert write(small) == [("write", b"a" * 10 + b"b" * 5)]
    large = [b"c" * VECTORED_WRITE_MIN, memoryview(b"d" * 100)[:10]]
    (call,) = write(large)
    assert call[0] == "writelines" and call[1] == large


def test_a_bytearray_piece_is_joined_into_bytes() -> None:
    (call,) = write([bytearray(b"z" * 10)])
    assert call == ("write", b"z" * 10) and type(call[1]) is bytes
