"""The relay's read buffers (``floodwall.io.read_buffers``): a small read is copied out and its
buffer serves the next; a large one is lent as a read-only view, and its buffer is read into
again only once no view of it is left; at most ``MAX_LENT`` are out at once."""

from __future__ import annotations

from floodwall.io.read_buffers import LEND_MIN, MAX_LENT, ReadBuffers

SIZE = 1 << 20


def _read(bufs: ReadBuffers, data: bytes, lend: bool = True) -> bytes | memoryview:
    """What libuv and ``buffer_updated`` do for one read."""
    view = bufs.view(SIZE)
    view[: len(data)] = data
    del view  # the event loop lets go of it after the read
    return bufs.take(len(data), lend)


def test_a_small_read_is_copied_and_its_buffer_serves_the_next() -> None:
    bufs = ReadBuffers(SIZE)
    first = _read(bufs, b"a" * (LEND_MIN - 1))
    buffer = bufs.view(SIZE).obj
    second = _read(bufs, b"b" * 10)
    assert type(first) is bytes and first == b"a" * (LEND_MIN - 1) and second == b"b" * 10
    assert bufs.view(SIZE).obj is buffer and bufs.out == 0


def test_a_large_read_is_lent_and_its_buffer_is_not_read_into_while_a_view_lives() -> None:
    bufs = ReadBuffers(SIZE)
    lent = _read(bufs, b"a" * SIZE)
    assert type(lent) is memoryview and lent.readonly and bufs.out == 1
    piece = lent[SIZE - 5:]  # what a core keeps: a frame cut by the read's end
    first_buffer = id(lent.obj)  # not the buffer itself: a reference would keep it out
    del lent
    # Reads go on, large and small; none goes into the buffer the piece is a view of.
    for n in range(6):
        other = _read(bufs, bytes([n]) * SIZE)
        assert isinstance(other, memoryview) and id(other.obj) != first_buffer
        del other
        _read(bufs, b"z" * 100)
    assert bytes(piece) == b"aaaaa"
    assert bufs.out == 2  # the piece's buffer, and the last read's (not looked at since)
    del piece
    lent = _read(bufs, b"c" * SIZE)
    # The piece gone, its buffer came back with the last read's: only this read's is out.
    assert bufs.out == 1 and bytes(lent) == b"c" * SIZE


def test_a_read_that_may_be_held_is_copied_and_past_the_most_lent_reads_are_copied() -> None:
    bufs = ReadBuffers(SIZE)
    assert type(_read(bufs, b"a" * SIZE, lend=False)) is bytes
    kept = [_read(bufs, bytes([n % 256]) * LEND_MIN) for n in range(MAX_LENT)]
    assert all(type(v) is memoryview for v in kept) and bufs.out == MAX_LENT
    extra = _read(bufs, b"x" * SIZE)
    assert type(extra) is bytes and extra == b"x" * SIZE  # copied: no buffer to lend
    assert all(bytes(v) == bytes([n % 256]) * LEND_MIN for n, v in enumerate(kept))
    del kept
    assert type(_read(bufs, b"y" * SIZE)) is memoryview  # they came back
    assert bufs.out == 1
