"""The Prometheus text exposition format (version 0.0.4), sans-IO: a page's bytes in, typed
samples out; and the queue figures floodwall reads from RabbitMQ's detailed endpoint.

RabbitMQ with management statistics off (``management_agent.disable_metrics_collector``)
answers ``/api/queues`` with names only; its Prometheus endpoint
(``/metrics/detailed?vhost=V&family=queue_coarse_metrics&family=queue_metrics``) still has
each queue's ready messages and ready bytes. ``ExpositionParser`` takes the page in pieces
of any size (``feed``, then ``close``) and hands back the samples of complete lines, only
those of the metric names asked for when given (the others are skipped by their name);
``queue_figures`` picks each queue's figures out of them.

Anything that is not the format (a bad name, label, escape or value, a line that is not
UTF-8) raises ``ExpositionError`` with the line's number; nothing else is ever raised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

READY_MESSAGES: Final = "rabbitmq_detailed_queue_messages_ready"
READY_BYTES: Final = "rabbitmq_detailed_queue_messages_ready_bytes"
UNACKED_MESSAGES: Final = "rabbitmq_detailed_queue_messages_unacked"
UNACKED_BYTES: Final = "rabbitmq_detailed_queue_messages_unacked_bytes"
QUEUE_METRICS: Final = frozenset({READY_MESSAGES, READY_BYTES, UNACKED_MESSAGES, UNACKED_BYTES})
"""The metrics ``queue_figures`` reads (families ``queue_coarse_metrics``, ``queue_metrics``)."""
FAMILIES: Final = ("queue_coarse_metrics", "queue_metrics")

MAX_LINE: Final = 1 << 16
"""Longest line taken (a queue's sample is some 100 bytes; a longer one is not a page)."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}
_SPECIAL: Final = {"NaN": math.nan, "+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf}
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class ExpositionError(ValueError):
    """A page that is not the Prometheus text format; ``line`` is the 1-based line."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: the metric's name, its labels in order, its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        for name, value in self.labels:
            if name == key:
                return value
        return None


class ExpositionParser:
    """Complete lines of a page fed in pieces; ``names``: keep only these metrics."""

    def __init__(self, names: frozenset[str] | None = None) -> None:
        self.names = names
        self._tail = bytearray()
        self._line = 0

    def feed(self, data: bytes) -> list[Sample]:
        """The samples of the lines ``data`` completes."""
        out: list[Sample] = []
        buf = self._tail + data if self._tail else data
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            self._take(bytes(buf[start:end]), out)
            start = end + 1
        rest = buf[start:]
        if len(rest) > MAX_LINE:
            raise ExpositionError(self._line + 1, f"a line longer than {MAX_LINE} bytes")
        self._tail = bytearray(rest)
        return out

    def close(self) -> list[Sample]:
        """The samples of a last line without its newline: the page is over."""
        out: list[Sample] = []
        if self._tail:
            self._take(bytes(self._tail), out)
            self._tail = bytearray()
        return out

    def _take(self, raw: bytes, out: list[Sample]) -> None:
        self._line += 1
        if len(raw) > MAX_LINE:
            raise ExpositionError(self._line, f"a line longer than {MAX_LINE} bytes")
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ExpositionError(self._line, "not UTF-8") from None
        if not line or line.startswith("#"):
            return
        names = self.names
        if names is not None:
            match = _NAME.match(line)
            if match is None or match.group() not in names:
                if match is None:
                    raise ExpositionError(self._line, f"no metric name at {line[:40]!r}")
                return
        out.append(parse_line(line, self._line))


def parse_line(line: str, number: int = 1) -> Sample:
    """One sample line (no comment, not blank): ``name{labels} value [timestamp]``."""
    match = _NAME.match(line)
    if match is None:
        raise ExpositionError(number, f"no metric name at {line[:40]!r}")
    name = match.group()
    pos = match.end()
    labels: tuple[tuple[str, str], ...] = ()
    if pos < len(line) and line[pos] == "{":
        labels, pos = _labels(line, pos + 1, number)
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (pos < len(line) and not line[pos].isspace()):
        raise ExpositionError(number, f"{name}: expected a value (and a timestamp)")
    value = _value(rest[0], number)
    if len(rest) == 2 and not re.fullmatch(r"-?\d+", rest[1]):
        raise ExpositionError(number, f"{name}: timestamp {rest[1][:20]!r} is not an integer")
    return Sample(name, labels, value)


def _labels(line: str, pos: int, number: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """The labels from ``line[pos]`` (after ``{``) and where they end (after ``}``)."""
    found: list[tuple[str, str]] = []
    size = len(line)
    while True:
        while pos < size and line[pos] == " ":
            pos += 1
        if pos < size and line[pos] == "}":
            return tuple(found), pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            raise ExpositionError(number, f"bad label name at column {pos + 1}")
        key = match.group()
        pos = match.end()
        if line[pos:pos + 2] != '="':
            raise ExpositionError(number, f"label {key}: expected =\"")
        value, pos = _quoted(line, pos + 2, number)
        found.append((key, value))
        while pos < size and line[pos] == " ":
            pos += 1
        if pos < size and line[pos] == ",":
            pos += 1
        elif pos >= size or line[pos] != "}":
            raise ExpositionError(number, f"label {key}: expected , or }}")


def _quoted(line: str, pos: int, number: int) -> tuple[str, int]:
    """A label value from after its opening quote; the text and where it ends."""
    out: list[str] = []
    size = len(line)
    while pos < size:
        c = line[pos]
        if c == '"':
            return "".join(out), pos + 1
        if c == "\\":
            escaped = _ESCAPES.get(line[pos + 1:pos + 2])
            if escaped is None:
                raise ExpositionError(number, f"bad escape at column {pos + 1}")
            out.append(escaped)
            pos += 2
            continue
        out.append(c)
        pos += 1
    raise ExpositionError(number, "label value without its closing quote")


def _value(text: str, number: int) -> float:
    special = _SPECIAL.get(text)
    if special is not None:
        return special
    if _FLOAT.fullmatch(text) is None:
        raise ExpositionError(number, f"value {text[:20]!r} is not a number")
    return float(text)


def parse_page(data: bytes, names: frozenset[str] | None = None) -> list[Sample]:
    """Every sample of a whole page (of ``names`` only, when given)."""
    parser = ExpositionParser(names)
    return parser.feed(data) + parser.close()


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One queue's figures from the detailed endpoint (None: the page had none)."""

    ready_messages: int | None = None
    ready_bytes: int | None = None
    unacked_messages: int | None = None
    unacked_bytes: int | None = None

    @property
    def complete(self) -> bool:
        """Ready messages and ready bytes both given: a depth floodwall can use."""
        return self.ready_messages is not None and self.ready_bytes is not None


_FIELDS: Final = {READY_MESSAGES: "ready_messages", READY_BYTES: "ready_bytes",
                  UNACKED_MESSAGES: "unacked_messages", UNACKED_BYTES: "unacked_bytes"}


def queue_figures(samples: Iterable[Sample], vhost: str) -> dict[str, QueueFigures]:
    """Each queue of ``vhost``'s figures among ``samples`` (other vhosts' are left out; a
    value that is not a finite number >= 0 counts as none)."""
    found: dict[str, dict[str, int]] = {}
    for sample in samples:
        field = _FIELDS.get(sample.name)
        if field is None or sample.label("vhost") != vhost:
            continue
        queue = sample.label("queue")
        value = sample.value
        if queue is None or not math.isfinite(value) or value < 0:
            continue
        found.setdefault(queue, {})[field] = int(value)
    return {queue: QueueFigures(f.get("ready_messages"), f.get("ready_bytes"),
                                f.get("unacked_messages"), f.get("unacked_bytes"))
            for queue, f in found.items()}
