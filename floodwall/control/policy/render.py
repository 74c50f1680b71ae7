"""The effective policies, for people: every field resolved, as commented YAML that loads back."""

from __future__ import annotations

from typing import Final

from floodwall.control.policy.model import FORMAT_VERSION, Policy, PolicySet
from floodwall.control.policy.units import format_bytes, format_duration

# --- the effective policies, for people -----------------------------------------------

_COMMENT_COLUMN: Final = 32


def _quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that reads back as ``text``: printable ASCII
    as it is, every other character escaped by its code point (``\\xXX``, ``\\uXXXX``,
    ``\\UXXXXXXXX``: one escape a character, so nothing beyond the BMP is split into a
    surrogate pair, and no line break or BOM is left for YAML to fold or drop)."""
    return '"' + "".join(_escape(c) for c in text) + '"'


def _escape(c: str) -> str:
    code = ord(c)
    if c in '"\\':
        return "\\" + c
    if 0x20 <= code < 0x7F:
        return c
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _limit_lines(p: Policy) -> list[tuple[str, str]]:
    """``(yaml, comment)`` lines of every resolved setting of a policy or defaults entry."""
    lines: list[tuple[str, str]] = []
    exact = "" if p.capacity < 1024 else f"{p.capacity} bytes"
    lines.append((f"capacity: {format_bytes(p.capacity)}",
                  "no byte limit" if p.capacity == 0 else exact))
    lines.append((f"resume: {format_bytes(p.resume)}",
                  "" if p.resume < 1024 else f"{p.resume} bytes"))
    if p.max_messages is None:
        lines.append(("max_messages: 0", "no count limit (so no resume_messages)"))
    else:
        lines.append((f"max_messages: {p.max_messages}", ""))
        lines.append((f"resume_messages: {p.resume_messages}", ""))
    note = ""
    without_spool = p.effective_overflow(spooling=False)
    if p.overflow is not without_spool:
        note = (f"NOTE: {p.overflow.value} needs --spool-dir at run time "
                f"(acts as {without_spool.value} without it)")
    lines.append((f"overflow: {p.overflow.value}", note))
    lines.append((f"deadline: {format_duration(p.deadline)}", ""))
    lines.append((f"signal: {p.signal.value}", ""))
    lines.append((f"on_unknown_depth: {p.on_unknown_depth.value}", ""))
    lines.append((f"mode: {p.mode.value}",
                  "watched only: nothing is held, rejected or spooled" if not p.enforced else ""))
    if p.in_flight_allowance is None:
        lines.append(("in_flight_allowance: auto", ""))
    else:
        lines.append((f"in_flight_allowance: {format_bytes(p.in_flight_allowance)}",
                      "AMQP 1.0 senders: the depth may reach capacity plus this"))
    sp = p.spool
    lines.append((f"spool: {{max_bytes: {format_bytes(sp.max_bytes)}, fsync: {sp.fsync.value}, "
                  f"group_commit_ms: {sp.group_commit_ms}}}", ""))
    return lines


def _emit(out: list[str], indent: str, text: str, comment: str = "") -> None:
    line = indent + text
    if comment:
        line = f"{line.ljust(_COMMENT_COLUMN - 1)} # {comment}"
    out.append(line)


def render_policies(policies: PolicySet) -> str:
    """The effective policies as commented YAML: every field resolved, sizes in units.

    The text is itself a valid policy file that loads to an equal ``PolicySet``.
    """
    out: list[str] = [
        f"# {policies.source}: valid, {len(policies.policies)} "
        f"polic{'y' if len(policies.policies) == 1 else 'ies'}, defaults for "
        f"{len(policies.defaults)} vhost{'' if len(policies.defaults) == 1 else 's'}.",
        "# Every field is resolved (inherited values filled in). First matching policy wins,",
        "# then the vhost's defaults if they set a limit; anything else is not policed.",
        f"version: {FORMAT_VERSION}",
    ]
    if policies.defaults:
        out.append("defaults:")
        for vhost, d in policies.defaults.items():
            where = f"line {d.line}" if d.line is not None else ""
            _emit(out, "  - ", f"vhost: {_quote(vhost)}", where)
            for text, comment in _limit_lines(d):
                _emit(out, "    ", text, comment)
            if not d.is_limited:
                out.append(f"    # sets no limit: queues of {_quote(vhost)} that no policy "
                           "matches are not policed")
    if policies.policies:
        out.append("policies:")
        for p in policies.policies:
            where = f"line {p.line}" if p.line is not None else ""
            _emit(out, "  - ", f"name: {_quote(p.name)}", where)
            if p.queue_regex is not None:
                what = f"queue_regex: {_quote(p.queue_regex)}"
            else:
                what = f"queue: {_quote(p.queue if p.queue is not None else '*')}"
            _emit(out, "    ", f"match: {{vhost: {_quote(p.vhost)}, {what}}}")
            for text, comment in _limit_lines(p):
                _emit(out, "    ", text, comment)
            if not p.is_limited:
                out.append("    # sets no limit: the queues it matches are exempt (not policed)")
    else:
        out.append("policies: []")
    return "\n".join(out) + "\n"


def policy_document(p: Policy) -> dict[str, object]:
    """One resolved policy or defaults entry as JSON-ready values (bytes, seconds)."""
    return {
        "name": p.name, "vhost": p.vhost, "queue": p.queue, "queue_regex": p.queue_regex,
        "policed": p.is_limited, "capacity": p.capacity, "resume": p.resume,
        "max_messages": p.max_messages, "resume_messages": p.resume_messages,
        "overflow": p.overflow.value, "deadline": p.deadline, "signal": p.signal.value,
        "on_unknown_depth": p.on_unknown_depth.value, "mode": p.mode.value,
        "in_flight_allowance": p.in_flight_allowance,
        "spool": {"max_bytes": p.spool.max_bytes, "fsync": p.spool.fsync.value,
                  "group_commit_ms": p.spool.group_commit_ms},
        "line": p.line,
    }
