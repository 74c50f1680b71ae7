"""Log lines (``ops.logs``): a client-chosen string in a field never breaks the line, never
reaches the terminal as a control sequence, and reads back as it was."""

from __future__ import annotations

import codecs
import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.ops.logs import JsonFormatter, LogfmtFormatter, _logfmt_value

CONTROLS = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]] + [
    "\u2028", "\u2029", "\u200e", "\u202e", "\u2066", "\ufeff", "\u00ad", "\ud800", "\udfff",
    "\U000e0001", "\U0010ffff"]


def unquote(value: str) -> str:
    """A logfmt value read back (the quoted form uses Python's escapes)."""
    if not value.startswith('"'):
        return value
    inner = value[1:-1].encode("latin-1", "backslashreplace")
    return codecs.decode(inner, "unicode_escape")


def line_for(**fields: object) -> str:
    record = logging.LogRecord("floodwall.relay", logging.INFO, __file__, 1, "client_said",
                               (), None)
    record.__dict__.update(fields)
    return LogfmtFormatter().format(record)


@pytest.mark.parametrize("c", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_every_control_character_is_escaped(c: str) -> None:
    value = _logfmt_value(f"a{c}b")
    assert c not in value
    assert value.isascii() and value.isprintable()
    assert unquote(value) == f"a{c}b"
    value.encode("utf-8")  # a lone surrogate would not encode


def test_a_forged_line_stays_in_its_field() -> None:
    queue = "orders\r\nts=2024-01-01T00:00:00Z level=error event=forged \x1b[2J\u2028x"
    line = line_for(queue=queue, vhost="/")
    assert len(line.splitlines()) == 1 and "\x1b" not in line and "\r" not in line
    field = line.split(" queue=", 1)[1].rsplit(" vhost=", 1)[0]
    assert unquote(field) == queue


def test_plain_values_stay_bare_and_printable_unicode_stays_readable() -> None:
    assert _logfmt_value("orders.eu-1") == "orders.eu-1"
    assert _logfmt_value(42) == "42"
    assert _logfmt_value("") == '""'
    assert _logfmt_value("a b") == '"a b"'
    assert _logfmt_value('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert _logfmt_value("commandes-été") == "commandes-été"
    assert _logfmt_value("é\t") == '"é\\t"'


@given(st.text())
@settings(max_examples=500)
def test_any_text_is_one_printable_line_that_reads_back(text: str) -> None:
    value = _logfmt_value(text)
    assert value.isprintable() and "\n" not in value
    assert unquote(value) == text
    value.encode("utf-8")


def test_json_lines_escape_them_too() -> None:
    record = logging.LogRecord("floodwall.relay", logging.INFO, __file__, 1, "client_said",
                               (), None)
    record.__dict__["queue"] = "q\r\n\x1b\u2028\ud800"
    line = JsonFormatter().format(record)
    assert line.isascii() and line.isprintable()
    assert json.loads(line)["queue"] == "q\r\n\x1b\u2028\ud800"
