"""Structured log lines: one event per line, ``key=value`` (logfmt) or JSON; and the one place
the typed events of the gates and the flow controller become lines (``log_event``)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

from floodwall.control.events import AlarmCleared, AlarmRaised, QueueReleased, QueueTripped
from floodwall.enforce.events import (
    Answer,
    At,
    BrokerRejected,
    DeadlineExpired,
    EndedByProxy,
    NotSpooled,
    ProtocolName,
    PublisherHeld,
    Refused,
    Signalled,
    SpoolFellBack,
    WaitingForLookup,
    WouldHave,
)

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


_NAMED_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    """One character of a quoted value: ``\\ \" \\n \\r \\t`` by name, any other that does
    not print as itself as ``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH``, the rest as is."""
    named = _NAMED_ESCAPES.get(c)
    if named is not None:
        return named
    if c == " " or c.isprintable():
        return c
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else (
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def _logfmt_value(value: object) -> str:
    """A value as logfmt: bare when it is plain, else quoted with every character that could
    break the line or the terminal escaped (control characters C0 and C1, DEL, ESC, U+2028
    and U+2029, format and unassigned characters, lone surrogates): a client-chosen name
    never makes a second line or moves the cursor."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' ="\\'):
        return text
    return '"' + "".join(map(_escape, text)) + '"'


class LogfmtFormatter(logging.Formatter):
    """``ts=… level=… logger=… event=… key=value …``: greppable and machine-readable."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"event={_logfmt_value(record.getMessage())}",
        ]
        parts += [f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items()]
        if record.exc_info:
            parts.append(f"exc={_logfmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines that want it."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED}


def setup_logging(level: str = "info", fmt: str = "logfmt") -> None:
    """Send the proxy's log lines to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``event(log, "upstream_unreachable", peer=…, reason=…)``."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra=fields)


class LogLimiter:
    """At most ``burst`` lines per ``interval`` seconds for each kind of repeated event (a
    broker that is down makes every client attempt fail; a scanner sends garbage on every
    connection): ``event_limited`` lets them through, counts the rest, and the first line
    of the next window says how many were left out (``suppressed=N``)."""

    def __init__(self, interval: float = 10.0, burst: int = 10) -> None:
        self.interval = interval
        self.burst = burst
        self._window: dict[str, tuple[float, int]] = {}  # kind -> (window start, lines)
        self.suppressed: dict[str, int] = {}  # left out since the last line, per kind
        self.suppressed_total = 0

    def allow(self, kind: str, now: float) -> int | None:
        """None: leave this line out (counted). Else how many were left out before it."""
        start, lines = self._window.get(kind, (now, 0))
        if now - start >= self.interval:
            start, lines = now, 0
        if lines >= self.burst:
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            self.suppressed_total += 1
            return None
        self._window[kind] = (start, lines + 1)
        return self.suppressed.pop(kind, 0)


def event_limited(limiter: LogLimiter, now: float, logger: logging.Logger, name: str,
                  level: int = logging.INFO, kind: str | None = None, **fields: Any) -> None:
    """``event``, rate-limited by ``limiter`` per ``kind`` (default: the event's name)."""
    left_out = limiter.allow(kind or name, now)
    if left_out is None:
        return
    if left_out:
        fields["suppressed"] = left_out
        fields["suppressed_window"] = limiter.interval
    event(logger, name, level, **fields)


# -- typed events: the one place they become log lines -------------------------------------
_gate_log = logging.getLogger("floodwall.gate")  # the gates' events (enforce/)
_control_log = logging.getLogger("floodwall.control")  # the flow controller's events (control/)


def _link_fields(at: At) -> dict[str, Any]:
    """What a 1.0 event line says about its link (nothing for 0-9-1)."""
    return {} if at.link is None else {"link": at.link.name}


def _protocol(at: At) -> dict[str, Any]:
    return {} if at.protocol is ProtocolName.AMQP091 else {"protocol": at.protocol.value}


def _names(keys: Iterable[tuple[str, str]]) -> str:
    return ",".join(q for _, q in sorted(keys))


def _mode(shadow: bool) -> dict[str, Any]:
    """A shadow policy's trip says so (``mode=shadow``: nothing is held)."""
    return {"mode": "shadow"} if shadow else {}


def log_event(ev: object) -> None:
    """Log one typed event of a gate or of the flow controller (anything else: nothing)."""
    match ev:
        case PublisherHeld(at=at):
            link = {} if at.link is None else {"session": at.link.session,
                                               "handle": at.link.handle, "link": at.link.name}
            event(_gate_log, "publisher_held", logging.INFO, conn=at.conn, channel=at.channel,
                  **link, vhost=at.vhost, queues=_names(ev.queues), signalled=ev.signalled,
                  **_protocol(at))
        case WaitingForLookup(at=at):
            event(_gate_log, "publisher_waits_for_lookup", logging.DEBUG, conn=at.conn,
                  channel=at.channel, vhost=at.vhost, lookups=_names(ev.lookups))
        case Signalled(at=at):
            event(_gate_log, "publisher_signalled", conn=at.conn, channel=at.channel,
                  **_link_fields(at), active=ev.active, **_protocol(at))
        case Refused(at=at) if ev.answer is not Answer.CHANNEL_CLOSE:
            event(_gate_log, "publish_refused", logging.WARNING, conn=at.conn,
                  channel=at.channel, **_link_fields(at), queues=_names(ev.queues) or "?",
                  reason=ev.reason, answer=ev.answer.value, **_protocol(at))
        case DeadlineExpired(at=at) if ev.answer is not Answer.CHANNEL_CLOSE:
            detail = {} if at.link is None else {"link": at.link.name,
                                                 "queues": ",".join(ev.queues)}
            waited = {} if at.link is None else {"waited": ev.waited}
            event(_gate_log, "publish_refused", logging.WARNING, conn=at.conn,
                  channel=at.channel, **detail, reason=ev.reason, **waited,
                  answer=ev.answer.value, **_protocol(at))
        case EndedByProxy(at=at) if at.link is None:
            event(_gate_log, "channel_closed_by_proxy", logging.WARNING, conn=at.conn,
                  channel=at.channel, reason=ev.reason)
        case EndedByProxy(at=at):
            event(_gate_log, "link_detached_by_proxy", logging.WARNING, conn=at.conn,
                  channel=at.channel, **_link_fields(at), condition=ev.condition,
                  reason=ev.reason, **_protocol(at))
        case NotSpooled(at=at):
            event(_gate_log, "publish_not_spooled", conn=at.conn, channel=at.channel,
                  **_link_fields(at), queue=ev.queue, reason=ev.reason, action=ev.action,
                  **_protocol(at))
        case SpoolFellBack(at=at):
            event(_gate_log, "spool_refused", logging.WARNING, conn=at.conn,
                  channel=at.channel, **_link_fields(at), queue=ev.queue, reason=ev.reason,
                  action=ev.action, **_protocol(at))
        case BrokerRejected():
            info = {k: v for k, v in (("queue", ev.queue), ("reason", ev.reason)) if v}
            event(_gate_log, "broker_rejected", logging.WARNING, conn=ev.conn,
                  vhost=ev.vhost, session=ev.session, first=ev.first, last=ev.last,
                  rejected=ev.count, condition=ev.condition or "?",
                  description=ev.description, **info, protocol="amqp10")
        case WouldHave(at=at):
            event(_gate_log, "shadow_" + ev.action.value, conn=at.conn, channel=at.channel,
                  **_link_fields(at), vhost=at.vhost, queues=_names(ev.queues),
                  **_protocol(at))
        case _:
            _log_control_event(ev)


def _log_control_event(ev: object) -> None:
    """Log one typed event of the flow controller (anything else: nothing)."""
    match ev:
        case QueueTripped(key=(vhost, queue)):
            event(_control_log, "queue_tripped", logging.WARNING, vhost=vhost, queue=queue,
                  depth_bytes=ev.depth_bytes, depth_messages=ev.depth_messages,
                  capacity=ev.capacity, max_messages=ev.max_messages, policy=ev.policy,
                  publishers=ev.publishers, **_mode(ev.shadow),
                  **({} if ev.share_limit_bytes is None
                     else {"fleet_share_limit_bytes": ev.share_limit_bytes}))
        case QueueReleased(key=(vhost, queue)):
            event(_control_log, "queue_released", vhost=vhost, queue=queue,
                  depth_bytes=ev.depth_bytes, depth_messages=ev.depth_messages,
                  resume=ev.resume, policy=ev.policy, reason=ev.reason, blocked=ev.blocked,
                  **_mode(ev.shadow))
        case AlarmRaised():
            event(_control_log, "broker_alarm", logging.WARNING, reason=ev.reason,
                  action="every publish is held until it clears")
        case AlarmCleared():
            event(_control_log, "broker_alarm_cleared")
