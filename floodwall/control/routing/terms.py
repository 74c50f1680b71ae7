"""Binding argument and header values as RabbitMQ compares them: type-exact, hashable terms."""

from __future__ import annotations

import calendar
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import TypeAlias

# --------------------------------------------------------------------------- field values

_Term: TypeAlias = object  # an Erlang-like term: tuples of str/bytes/int/float


def _timestamp(value: datetime) -> int:
    return calendar.timegm(value.utctimetuple())


def _decimal_term(value: Decimal) -> tuple[object, ...]:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return ("opaque", repr(value))  # NaN and infinities have no AMQP encoding
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    if exponent > 0:
        return ("decimal", 0, unscaled * 10**exponent)
    return ("decimal", -exponent, unscaled)


def _type_tag(value: object) -> str:
    """The AMQP type a decoded value most likely had, for comparisons inside tables and arrays."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, datetime):
        return "timestamp"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    return "opaque"


def _term(value: object) -> _Term:
    """``value`` as RabbitMQ holds it, so that Python ``==`` on terms is Erlang ``==``."""
    if value is None:
        return ("atom", "undefined")
    if isinstance(value, bool):
        return ("atom", "true" if value else "false")
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("binary", value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return ("binary", bytes(value))
    if isinstance(value, Decimal):
        return _decimal_term(value)
    if isinstance(value, datetime):
        return ("number", _timestamp(value))
    if isinstance(value, Mapping):
        return ("table", tuple(
            (_key_bytes(k), _type_tag(v), _term(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple((_type_tag(v), _term(v)) for v in value))
    # Nothing a decoder should produce; equal only to an equal repr, and never a crash on
    # the publish path.
    return ("opaque", type(value).__name__, repr(value))


def _key_bytes(key: object) -> bytes:
    if isinstance(key, bytes):
        return key
    return str(key).encode()


def _identity(value: object) -> _Term:
    """A hashable, type-exact key for a binding argument value (``True`` is not ``1``)."""
    if isinstance(value, Mapping):
        return ("table", tuple((k, _identity(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_identity(v) for v in value))
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    term = _term(value)
    return (_type_tag(value), term if isinstance(term, tuple) and term[0] == "opaque" else value)


def _arguments_identity(arguments: Mapping[str, object]) -> _Term:
    # RabbitMQ sorts a binding's top-level arguments before comparing bindings.
    return tuple(sorted(((k, _identity(v)) for k, v in arguments.items()),
                        key=lambda item: str(item[0])))


def _frozen(arguments: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(arguments or {}))
