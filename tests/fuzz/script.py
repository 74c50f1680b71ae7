"""How a fuzz input is read: a mode byte, then a script of steps (an op byte, a length byte and
that many bytes of argument).

The same reading serves atheris (``tests.fuzz.run``) and the plain regression tests
(``tests.fuzz.test_corpus``), so a crash input replays without atheris. A length byte of 255
takes the rest of the input; a script cut short ends where it is cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

REST = 255


@dataclass(frozen=True, slots=True)
class Step:
    op: int
    arg: bytes


def read_script(data: bytes) -> tuple[int, Iterator[Step]]:
    """(mode, steps) of an input; an empty input is mode 0 with no step."""
    if not data:
        return 0, iter(())
    return data[0], _steps(data, 1)


def _steps(data: bytes, pos: int) -> Iterator[Step]:
    n = len(data)
    while pos + 1 < n:
        op, length = data[pos], data[pos + 1]
        pos += 2
        end = n if length == REST else min(n, pos + length)
        yield Step(op, data[pos:end])
        pos = end


def write_script(mode: int, steps: list[tuple[int, bytes]]) -> bytes:
    """An input that reads back as ``mode`` and ``steps`` (long arguments are split into
    several steps of the same op, which every harness treats as one stream)."""
    out = bytearray([mode])
    for op, arg in steps:
        if not arg:
            out += bytes([op, 0])
        for start in range(0, len(arg), REST - 1):
            piece = arg[start : start + REST - 1]
            out += bytes([op, len(piece)]) + piece
    return bytes(out)
