"""Where the relay's reads land: one buffer at a time that libuv reads into, lent whole to
the core when a read is large, copied out of when it is small.

A relayed connection's sides are ``asyncio.BufferedProtocol``\\ s: libuv reads into the
buffer ``get_buffer`` hands it, and ``buffer_updated(n)`` says how much it read. The core
keeps views of what it is given (a frame cut by the read's end, the pieces of its output
waiting in a write buffer), so what it is given must never change. A small read is copied
out into ``bytes``, and the buffer serves the next read. A large one (``LEND_MIN``) is lent:
the core gets a read-only view of the buffer itself, and the next read goes into another
buffer; a lent buffer is read into again only once no view of it is left (its reference
count says so: the views hold it through their shared managed buffer). A 1 MiB read lent
is a 1 MiB copy less, about a tenth of the relay's CPU a 1 MiB message
(docs/performance.md, "Large messages").

What is lent is bounded: at most ``MAX_LENT`` buffers out at once (then reads are copied, as
before any were lent); at most ``KEEP_FREE`` returned buffers are kept for reuse.
A connection that may hold what it reads for long (a client with a gate: its held
publishes) is never lent to (``take(lend=False)``): a held publish would keep a whole buffer
alive, where the hold budget counts only its bytes.
"""

from __future__ import annotations

import sys
from typing import Final

#: A read at least this large is lent rather than copied: below it the copy costs less than
#: a buffer kept out for its views, and a view of a few bytes keeps less alive.
LEND_MIN: Final = 256 * 1024
#: Buffers lent out at once at most (64 MiB at 1 MiB each); past it, reads are copied.
MAX_LENT: Final = 64
#: Returned buffers kept for the next reads; more are freed.
KEEP_FREE: Final = 4
#: Whether a buffer's views can be told from its reference count (CPython's, where each
#: live view's managed buffer holds one); elsewhere every read is copied.
COUNTS_VIEWS: Final = sys.implementation.name == "cpython"


class ReadBuffers:
    """The buffer the next read of any connection goes into (the event loop reads one socket
    at a time, so the process needs one), and the buffers lent out."""

    __slots__ = ("_current", "_free", "_lent", "_view", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._current = bytearray(size)
        self._view = memoryview(self._current)
        self._lent: list[bytearray] = []  # lent out, or waiting to be found returned
        self._free: list[bytearray] = []  # returned: the next reads' buffers

    def view(self, limit: int) -> memoryview:
        """Where the next read goes, at most ``limit`` bytes of it."""
        return self._view if limit >= self.size else self._view[:limit]

    def take(self, n: int, lend: bool) -> bytes | memoryview:
        """The ``n`` bytes just read: a read-only view of the buffer, which is not read into
        again while any view of it lives (``lend``, and at least ``LEND_MIN``), else a
        copy."""
        if lend and n >= LEND_MIN and COUNTS_VIEWS and self._rotate():
            return memoryview(self._lent[-1])[:n].toreadonly()
        return self._view[:n].tobytes()

    def _rotate(self) -> bool:
        """Lend the current buffer (to the end of ``_lent``) and take another for the next
        read; False if too many are out."""
        self._reclaim()
        if len(self._lent) >= MAX_LENT:
            return False
        self._lent.append(self._current)
        self._current = self._free.pop() if self._free else bytearray(self.size)
        # The old view goes with the buffer: the event loop still holds it for this read,
        # and lets it go once the read's callback returns.
        self._view = memoryview(self._current)
        return True

    def _reclaim(self) -> None:
        """Lent buffers no view keeps alive come back (``_lent`` holds the one reference
        left: ``getrefcount`` counts its own argument too)."""
        lent = self._lent
        i = 0
        while i < len(lent):
            if sys.getrefcount(lent[i]) > 2:
                i += 1
                continue
            buf = lent.pop(i)
            if len(self._free) < KEEP_FREE:
                self._free.append(buf)

    @property
    def out(self) -> int:
        """Buffers lent out now (views of them may still live)."""
        return len(self._lent)
