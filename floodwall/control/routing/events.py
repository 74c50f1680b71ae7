"""RabbitMQ's topology events (the ``rabbitmq_event_exchange`` plugin) read as model changes.

The plugin publishes one message to ``amq.rabbitmq.event`` (a topic exchange in the vhost
``/``) for every change any client, the management UI, a definitions import or the broker
itself (exclusive and auto-delete queues) makes, in every vhost. The routing key names the
event (``queue.created``, ``binding.deleted``, ...); the body is empty; the headers carry the
fields. As RabbitMQ 3.10.8 sends them (read off a running broker):

- ``queue.created``: ``vhost``, ``name``, ``type`` (``rabbit_quorum_queue``, ...) or the
  ``x-queue-type`` argument; ``queue.deleted``: ``vhost``, ``name``;
- ``exchange.created``: ``vhost``, ``name``, ``type``, ``durable``, ``auto_delete``,
  ``internal``, ``arguments``; ``exchange.deleted``: ``vhost``, ``name``;
- ``binding.created`` / ``binding.deleted``: ``vhost``, ``source_name``,
  ``destination_kind``, ``destination_name``, ``routing_key``, ``arguments``;
- ``vhost.created`` / ``vhost.deleted``: ``name``;
- ``policy.set`` / ``policy.cleared``: a policy can give exchanges an alternate exchange, so
  the supervisor re-syncs.

``arguments`` is not a table: it is an array of strings, each an Erlang term
``{<<"key">>,type,value}`` as ``~p`` prints it (``{<<"x-match">>,longstr,<<"any">>}``,
``{<<"n">>,signedint,1}``, tables and arrays nested). ``erlang_arguments`` reads them back
into the values a client's frame would have decoded to; a term it cannot read raises
``EventError`` (the caller then asks for a full sync rather than guess).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from floodwall.wire.topology import ChangeKind, QueueType, TopologyChange

__all__ = [
    "EVENT_BINDING_KEYS",
    "EVENT_EXCHANGE",
    "EventError",
    "EventNote",
    "erlang_arguments",
    "read_event",
]

EVENT_EXCHANGE: Final = "amq.rabbitmq.event"
#: What the proxy's event queue is bound to: every event that changes routing.
EVENT_BINDING_KEYS: Final = ("binding.*", "queue.*", "exchange.*", "vhost.*", "policy.*")


class EventError(ValueError):
    """An event whose fields the model cannot read."""


class EventNote(enum.Enum):
    """An event that is not one change to apply."""

    POLICY_CHANGED = "policy changed"  # re-read policies (alternate exchanges)


# --------------------------------------------------------------------------- Erlang terms

class _Atom(str):
    """An Erlang atom as read (``true``, ``longstr``, ``undefined``...)."""


_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "e": "\x1b", "s": " ", "b": "\b",
                   "f": "\f", "v": "\v", "d": "\x7f", "\\": "\\", '"': '"', "'": "'"}


class _Reader:
    """A recursive-descent reader of the Erlang terms ``~p`` prints for AMQP field values."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> EventError:
        return EventError(f"cannot read Erlang term {self.text!r} at {self.pos}: {what}")

    def skip_space(self) -> None:
        text = self.text
        while self.pos < len(text) and text[self.pos] in " \t\r\n":
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, token: str) -> None:
        self.skip_space()
        if not self.text.startswith(token, self.pos):
            raise self.fail(f"expected {token!r}")
        self.pos += len(token)

    def term(self) -> object:
        c = self.peek()
        if c == "{":
            return tuple(self.sequence("{", "}"))
        if c == "[":
            return self.sequence("[", "]")
        if c == "<" and self.text.startswith("<<", self.pos):
            return self.binary()
        if c == '"':
            return self.string()
        if c == "-" or c.isdigit():
            return self.number()
        if c.isalpha() or c == "'":
            return self.atom()
        raise self.fail("unexpected character")

    def sequence(self, open_: str, close: str) -> list[object]:
        self.expect(open_)
        items: list[object] = []
        if self.peek() == close:
            self.pos += 1
            return items
        while True:
            items.append(self.term())
            c = self.peek()
            self.pos += 1
            if c == close:
                return items
            if c != ",":
                raise self.fail(f"expected ',' or {close!r}")

    def string(self) -> str:
        self.expect('"')
        text, out = self.text, list[str]()
        while True:
            if self.pos >= len(text):
                raise self.fail("unterminated string")
            c = text[self.pos]
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c != "\\":
                out.append(c)
                continue
            if self.pos >= len(text):
                raise self.fail("unterminated escape")
            e = text[self.pos]
            self.pos += 1
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
            elif e in "01234567":
                digits = e
                while len(digits) < 3 and self.pos < len(text) and text[self.pos] in "01234567":
                    digits += text[self.pos]
                    self.pos += 1
                out.append(chr(int(digits, 8)))
            elif e == "x" and self.text.startswith("{", self.pos):
                end = text.index("}", self.pos)
                out.append(chr(int(text[self.pos + 1:end], 16)))
                self.pos = end + 1
            elif e == "x":
                out.append(chr(int(text[self.pos:self.pos + 2], 16)))
                self.pos += 2
            else:
                raise self.fail(f"unknown escape \\{e}")

    def binary(self) -> bytes:
        """``<<"text">>``, ``<<"text"/utf8>>`` or ``<<1,2,3>>``."""
        self.expect("<<")
        out = bytearray()
        if self.peek() == ">":
            self.expect(">>")
            return bytes(out)
        while True:
            if self.peek() == '"':
                # The broker prints text binaries as the characters they encode (seen:
                # <<"héllo">> for UTF-8 bytes), with or without a /utf8 suffix.
                out += self.string().encode()
                if self.text.startswith("/utf8", self.pos):
                    self.pos += len("/utf8")
            else:
                value = self.number()
                if not isinstance(value, int) or not 0 <= value <= 255:
                    raise self.fail("byte out of range")
                out.append(value)
            c = self.peek()
            if c == ",":
                self.pos += 1
                continue
            self.expect(">>")
            return bytes(out)

    def number(self) -> int | float:
        self.skip_space()
        start = self.pos
        text = self.text
        if self.pos < len(text) and text[self.pos] == "-":
            self.pos += 1
        while self.pos < len(text) and (text[self.pos].isdigit() or text[self.pos] in ".e+-#"):
            if text[self.pos] in "+-" and text[self.pos - 1] != "e":
                break
            self.pos += 1
            if text[self.pos - 1] == "#":  # base#digits: the digits may be letters
                while self.pos < len(text) and text[self.pos].isalnum():
                    self.pos += 1
                break
        token = text[start:self.pos]
        try:
            if "#" in token:
                base, digits = token.lstrip("-").split("#", 1)
                value = int(digits, int(base))
                return -value if token.startswith("-") else value
            if any(ch in token for ch in ".e"):
                return float(token)
            return int(token)
        except ValueError:
            raise self.fail(f"bad number {token!r}") from None

    def atom(self) -> _Atom:
        self.skip_space()
        text = self.text
        if text[self.pos] == "'":
            end = text.index("'", self.pos + 1)
            name = text[self.pos + 1:end]
            self.pos = end + 1
            return _Atom(name)
        start = self.pos
        while self.pos < len(text) and (text[self.pos].isalnum() or text[self.pos] in "_@"):
            self.pos += 1
        return _Atom(text[start:self.pos])


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str):
        return str(value)
    raise EventError(f"expected a binary, got {value!r}")


def _field_value(type_name: object, value: object) -> object:
    """An AMQP field value from its RabbitMQ type atom and its Erlang value."""
    t = str(type_name)
    if t in ("longstr", "shortstr"):
        return _text(value)
    if t == "binary":
        if not isinstance(value, bytes):
            raise EventError(f"binary field is {value!r}")
        return value
    if t in ("signedint", "long", "short", "byte", "unsignedbyte", "unsignedshort",
             "unsignedint", "timestamp"):
        if not isinstance(value, int):
            raise EventError(f"{t} field is {value!r}")
        return value
    if t in ("float", "double"):
        if not isinstance(value, int | float):
            raise EventError(f"{t} field is {value!r}")
        return float(value)
    if t == "bool":
        if value not in ("true", "false"):
            raise EventError(f"bool field is {value!r}")
        return value == "true"
    if t == "void":
        return None
    if t == "decimal":
        if not (isinstance(value, tuple) and len(value) == 2
                and all(isinstance(v, int) for v in value)):
            raise EventError(f"decimal field is {value!r}")
        scale, unscaled = value
        return Decimal(unscaled).scaleb(-int(scale))
    if t == "table":
        if not isinstance(value, list):
            raise EventError(f"table field is {value!r}")
        return dict(_table_entry(entry) for entry in value)
    if t == "array":
        if not isinstance(value, list):
            raise EventError(f"array field is {value!r}")
        out = []
        for entry in value:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise EventError(f"array element {entry!r}")
            out.append(_field_value(entry[0], entry[1]))
        return out
    raise EventError(f"unknown field type {t!r}")


def _table_entry(entry: object) -> tuple[str, object]:
    if not (isinstance(entry, tuple) and len(entry) == 3):
        raise EventError(f"table entry {entry!r}")
    key, type_name, value = entry
    return _text(key), _field_value(type_name, value)


def erlang_arguments(value: object) -> dict[str, object]:
    """An event's ``arguments`` (an array of ``{<<"key">>,type,value}`` strings, or a table)
    as the dict a client's frame would have decoded to."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if not isinstance(value, list):
        raise EventError(f"arguments is {type(value).__name__}, expected an array")
    found: dict[str, object] = {}
    for item in value:
        if isinstance(item, bytes):
            item = item.decode(errors="replace")
        if not isinstance(item, str):
            raise EventError(f"argument {item!r} is not a string")
        reader = _Reader(item)
        try:
            term = reader.term()
            if reader.peek():
                raise reader.fail("trailing characters")
        except EventError:
            raise
        except (ValueError, IndexError, OverflowError, RecursionError) as exc:
            raise reader.fail(str(exc)) from None
        key, argument = _table_entry(term)
        found[key] = argument
    return found


# --------------------------------------------------------------------------- events

def _header(headers: Mapping[str, object], key: str) -> str:
    value = headers.get(key)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if not isinstance(value, str):
        raise EventError(f"event header {key!r} is missing or not a string: {value!r}")
    return value


def _flag(headers: Mapping[str, object], key: str, default: bool) -> bool:
    value = headers.get(key, default)
    return value if isinstance(value, bool) else default


@dataclass(frozen=True, slots=True)
class _BindingFields:
    vhost: str
    source: str
    kind: str
    destination: str
    routing_key: str
    arguments: dict[str, object]


def _binding(headers: Mapping[str, object]) -> _BindingFields:
    return _BindingFields(
        _header(headers, "vhost"), _header(headers, "source_name"),
        _header(headers, "destination_kind"), _header(headers, "destination_name"),
        _header(headers, "routing_key"), erlang_arguments(headers.get("arguments")))


def read_event(routing_key: str, headers: Mapping[str, object] | None
               ) -> TopologyChange | EventNote | None:
    """The model change one event means; None for events routing does not depend on.

    Raises ``EventError`` for an event of interest whose fields cannot be read.
    """
    h: Mapping[str, object] = headers or {}
    if routing_key == "queue.created":
        queue_type = QueueType.of(h.get("type"))
        if queue_type is QueueType.CLASSIC:
            queue_type = QueueType.of(erlang_arguments(h.get("arguments")).get("x-queue-type"))
        return TopologyChange(ChangeKind.DECLARE_QUEUE, _header(h, "vhost"),
                              _header(h, "name"), queue_type=queue_type)
    if routing_key == "queue.deleted":
        return TopologyChange(ChangeKind.DELETE_QUEUE, _header(h, "vhost"), _header(h, "name"))
    if routing_key == "exchange.created":
        return TopologyChange(ChangeKind.DECLARE_EXCHANGE, _header(h, "vhost"),
                              _header(h, "name"),
                              arguments=erlang_arguments(h.get("arguments")),
                              exchange_type=_header(h, "type"),
                              durable=_flag(h, "durable", True),
                              auto_delete=_flag(h, "auto_delete", False),
                              internal=_flag(h, "internal", False))
    if routing_key == "exchange.deleted":
        return TopologyChange(ChangeKind.DELETE_EXCHANGE, _header(h, "vhost"),
                              _header(h, "name"))
    if routing_key in ("binding.created", "binding.deleted"):
        b = _binding(h)
        created = routing_key == "binding.created"
        if b.kind == "queue":
            kind = ChangeKind.BIND_QUEUE if created else ChangeKind.UNBIND_QUEUE
        elif b.kind == "exchange":
            kind = ChangeKind.BIND_EXCHANGE if created else ChangeKind.UNBIND_EXCHANGE
        else:
            raise EventError(f"binding destination_kind {b.kind!r}")
        return TopologyChange(kind, b.vhost, b.destination, b.source, b.routing_key,
                              b.arguments)
    if routing_key == "vhost.created":
        return TopologyChange(ChangeKind.DECLARE_VHOST, _header(h, "name"), _header(h, "name"))
    if routing_key == "vhost.deleted":
        return TopologyChange(ChangeKind.DELETE_VHOST, _header(h, "name"), _header(h, "name"))
    if routing_key in ("policy.set", "policy.cleared"):
        return EventNote.POLICY_CHANGED
    return None
