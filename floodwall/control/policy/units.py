"""Sizes and durations as policies and flags write them (``64MiB``, ``30s``): parsed, formatted."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Final

# --- units ----------------------------------------------------------------------------

_BYTE_UNITS: Final[dict[str, int]] = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
}
_DURATION_UNITS: Final[dict[str, Decimal]] = {
    "ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600),
}
_QUANTITY = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*")
# How Helm (Go) writes a large float64: 6.7108864e+07, 1e+07 (YAML reads the first as a
# float, the second as a string).
_EXPONENT = re.compile(r"\s*[0-9]+(?:\.[0-9]+)?[eE][-+]?[0-9]+\s*")


#: The largest size or count taken (2^63 - 1 bytes, about 8 EiB): past it a value is refused
#: before it is computed (``1e1000000000`` would be a number of a billion digits).
MAX_WHOLE: Final = (1 << 63) - 1


def _bounded(number: Decimal, value: object) -> Decimal:
    """``number`` if its magnitude is at most ``MAX_WHOLE``; else a ValueError."""
    if number.is_finite() and number.adjusted() <= 18 and abs(number) <= MAX_WHOLE:
        return number
    raise ValueError(f"{_short(value)} is larger than {MAX_WHOLE} (about 8 EiB), the "
                     "largest taken")


def _short(value: object) -> str:
    """``value`` for a message, however long it is."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def whole_number(value: object) -> int | None:
    """``value`` as a whole number, if it is one: an int, a float without a fraction, or a
    float written with an exponent as Helm writes large numbers (``6.7108864e+07``,
    ``"1e+07"``); None otherwise (booleans included). ValueError for a whole number past
    ``MAX_WHOLE``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = Decimal(value) if abs(value) <= MAX_WHOLE else Decimal("Infinity")
    elif isinstance(value, float):
        if not value.is_integer():
            return None
        number = Decimal(value)
    elif isinstance(value, str) and _EXPONENT.fullmatch(value):
        number = Decimal(value.strip())
        if number.adjusted() <= 18 and number != number.to_integral_value():
            return None
    else:
        return None
    return int(_bounded(number, value))


def _unit_hint(unit: str, known: Mapping[str, object]) -> str:
    for name in known:
        if name.lower() == unit.lower():
            return f"unknown unit {unit!r} (did you mean {name!r}?)"
    return f"unknown unit {unit!r}; use one of {', '.join(known)}"


def parse_bytes(value: object) -> int:
    """``64MiB``, ``512KiB``, ``1.5GB``, ``65536`` or ``"65536"`` to a byte count (>= 0).

    A whole number written as a float (``6.7108864e+07``, as Helm renders 64MiB given as
    a plain number) is that many bytes.

    KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024, units are case-sensitive.
    A fraction is allowed only with a unit above B and is rounded down to whole bytes.
    Raises ``ValueError`` with a reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 64MiB, got {value!r}")
    whole = whole_number(value)
    if whole is not None:
        if whole < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return whole
    if isinstance(value, float) or (isinstance(value, str) and _EXPONENT.fullmatch(value)):
        raise ValueError(f"size {value!r} is not a whole number of bytes; use a unit, "
                         "e.g. 1.5MiB")
    if not isinstance(value, str):
        raise ValueError(f"expected a size such as 64MiB, got {_describe(value)}")
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a size; write e.g. 64MiB, 512KiB, 10GB or 65536")
    number, unit = Decimal(m["number"]), m["unit"] or "B"
    if unit not in _BYTE_UNITS:
        raise ValueError(f"{value!r}: {_unit_hint(unit, _BYTE_UNITS)}")
    multiplier = _BYTE_UNITS[unit]
    if multiplier == 1 and number != number.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(_bounded(number * multiplier, value))


def parse_duration(value: object) -> float:
    """``500ms``, ``30s``, ``5m``, ``1h`` or a plain number of seconds to seconds (>= 0).

    Raises ``ValueError`` with a reason.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value or value == float("inf"):
            raise ValueError(f"duration must be a finite number >= 0, got {_short(value)}")
        return _seconds(value, value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 30s, got {_describe(value)}")
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 30s, 5m, 1h or 30")
    unit = m["unit"] or "s"
    if unit not in _DURATION_UNITS:
        raise ValueError(f"{value!r}: {_unit_hint(unit, _DURATION_UNITS)}")
    try:
        return _seconds(Decimal(m["number"]) * _DURATION_UNITS[unit], value)
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{value!r} is not a duration") from None


#: The longest duration taken (2^31 s, about 68 years): timers are set with it, and a
#: longer one is a typo, not a wish.
MAX_SECONDS: Final = float(1 << 31)


def _seconds(seconds: float | Decimal, value: object) -> float:
    """``seconds`` as a float, if at most ``MAX_SECONDS`` (compared before converting)."""
    if seconds > MAX_SECONDS:
        raise ValueError(f"{_short(value)} is longer than {MAX_SECONDS:.0f}s (about 68 "
                         "years), the longest taken")
    return float(seconds)


def format_bytes(n: int) -> str:
    """A byte count in the largest unit that divides it exactly (``256KiB``, ``10MB``, ``1000``).

    The result parses back to ``n`` with ``parse_bytes``.
    """
    if n <= 0:
        return str(n)
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"):
        mult = _BYTE_UNITS[unit]
        if n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def format_bytes_approx(n: int) -> str:
    """A byte count rounded to one decimal in binary units, for people (``1.2 MiB``)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        mult = _BYTE_UNITS[unit]
        if n >= mult:
            return f"{n / mult:.1f} {unit}"
    return f"{n} B"


def format_duration(seconds: float) -> str:
    """Seconds in the largest unit that divides them exactly (``2m``, ``500ms``, ``1.5s``)."""
    ms = Decimal(repr(seconds)) * 1000
    if ms == ms.to_integral_value():
        whole = int(ms)
        for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if whole and whole % size == 0:
                return f"{whole // size}{unit}"
        return f"{whole}ms"
    return f"{seconds!r}s"


def _describe(value: object) -> str:
    if isinstance(value, _Composite):
        return value.what
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    return f"a {type(value).__name__}"


class _Composite:
    """Stands in for a list or mapping where a scalar was expected, for error messages."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what
