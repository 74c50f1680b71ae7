"""The connection-class methods every core reads, decoded by hand (the cost of a connection).

A handshake passes six of them (start-ok, tune, tune-ok, open, and a close each way); pamqp's
generic decoder (``framing.decode_method``) walked each one's fields by name and type and cost
a new connection about a third of the core's time. These read only the fields the core keeps,
straight from the frame, and accept and refuse exactly what pamqp does (tests/amqp091/
test_handshake.py checks them against it on cut and corrupted payloads):

- a field that runs past the payload is a syntax error, except a string that is the
  method's last field (start-ok's ``locale``), which pamqp cuts short;
- a short string is UTF-8 or the method does not decode; a long string (start-ok's
  ``response``) may be any bytes;
- bytes after the last field are ignored.

Each raises ``MethodSyntaxError`` (502) with the frame's place and method ids
(``framing.method_syntax_error``, as ``decode_method`` does).
"""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.common import FieldTable
from pamqp.decode import field_table

from floodwall.wire.amqp091.framing import Buffer, method_payload, method_syntax_error

_TUNE = struct.Struct(">HIH")  # channel_max, frame_max, heartbeat (tune and tune-ok alike)
_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_CLASS_METHOD = struct.Struct(">HH")

_C = commands.Connection


def _shortstr(data: bytes, pos: int, last: bool = False) -> tuple[str, int]:
    """The short string at ``pos`` and the position after it; one that runs past the data
    is an error unless it is the method's ``last`` field."""
    if pos >= len(data):
        raise ValueError("Could not unpack short string value")
    end = pos + 1 + data[pos]
    if end > len(data) and not last:
        raise ValueError("short string runs past the payload")
    return data[pos + 1 : end].decode("utf-8"), end


def read_tune(buf: Buffer, offset: int, name: str, base: int = 0) -> tuple[int, int, int]:
    """``(channel_max, frame_max, heartbeat)`` of the connection.tune or tune-ok at
    ``offset`` (``name``: which, for the error)."""
    try:
        channel_max, frame_max, heartbeat = _TUNE.unpack_from(method_payload(buf, offset))
    except Exception as exc:  # as decode_method: any failure means "does not decode"
        raise method_syntax_error(buf, offset, name, base, exc) from exc
    return channel_max, frame_max, heartbeat


def read_open(buf: Buffer, offset: int, base: int = 0) -> str:
    """The virtual host of the connection.open at ``offset``."""
    data = method_payload(buf, offset)
    try:
        vhost, pos = _shortstr(data, 0)
        _, pos = _shortstr(data, pos)  # capabilities (reserved)
        if pos >= len(data):
            raise ValueError("Could not unpack bit value")  # insist (reserved)
    except Exception as exc:
        raise method_syntax_error(buf, offset, _C.Open.name, base, exc) from exc
    return vhost


def read_close(buf: Buffer, offset: int, base: int = 0) -> tuple[int, str, int, int]:
    """``(reply_code, reply_text, class_id, method_id)`` of the connection.close at
    ``offset``."""
    data = method_payload(buf, offset)
    try:
        code = _SHORT.unpack_from(data)[0]
        text, pos = _shortstr(data, 2)
        class_id, method_id = _CLASS_METHOD.unpack_from(data, pos)
    except Exception as exc:
        raise method_syntax_error(buf, offset, _C.Close.name, base, exc) from exc
    return code, text, class_id, method_id


def read_start_ok(buf: Buffer, offset: int, base: int = 0) -> tuple[FieldTable, str]:
    """``(client_properties, mechanism)`` of the connection.start-ok at ``offset``; the
    response (the credentials) is stepped over, never kept."""
    data = method_payload(buf, offset)
    try:
        pos, properties = field_table(data)
        mechanism, pos = _shortstr(data, pos)
        pos += 4 + _LONG.unpack_from(data, pos)[0]  # response
        _shortstr(data, pos, last=True)  # locale
    except Exception as exc:
        raise method_syntax_error(buf, offset, _C.StartOk.name, base, exc) from exc
    return properties, mechanism
