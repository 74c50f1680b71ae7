"""Giving freed memory back to the system after held publishes leave.

Held bodies are bytes objects of up to a frame (128 KiB by default) that the C library's
``malloc`` takes from its heap rather than mapping them one by one; freed, they stay the
process' resident memory until ``malloc_trim`` hands the free pages back. So once held
bytes have fallen well below their high-water mark, the proxy trims (glibc only; elsewhere
this does nothing). bench/memory.py measures both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Final

#: Trim once held bytes fell this much below their high-water mark since the last trim.
TRIM_AFTER: Final = 8 * 1024 * 1024


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MemoryReturn:
    """Follows the held bytes (``held()``, checked by the caller's timer) and trims the heap
    when they fell ``TRIM_AFTER`` below their high-water mark since the last trim."""

    def __init__(self, held: Callable[[], int], threshold: int = TRIM_AFTER) -> None:
        self.held = held
        self.threshold = threshold
        self.high = 0
        self._trim = _malloc_trim()

    def check(self) -> bool:
        """True when it trimmed."""
        now = self.held()
        if now > self.high:
            self.high = now
            return False
        if self.high - now < self.threshold:
            return False
        self.high = now
        if self._trim is None:
            return False
        self._trim(0)
        return True
