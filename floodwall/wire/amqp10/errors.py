"""The exceptions the AMQP 1.0 core raises for bad input, each carrying its AMQP error condition."""

from __future__ import annotations


class ProtocolError(Exception):
    """Input that breaks the AMQP 1.0 specification; ``condition`` is the spec's error symbol."""

    condition = "amqp:internal-error"
    offset: int | None = None
    """Set by the frame scanner: where the offending frame starts (bytes before it are valid)."""
    frames_before: int = 0
    """Set by the frame scanner: how many valid frames it passed before the offending one."""


class DecodeError(ProtocolError):
    """Bytes that do not decode to a valid AMQP 1.0 value or performative."""

    condition = "amqp:decode-error"


class FramingError(ProtocolError):
    """A frame or protocol header that breaks the transport's framing rules."""

    condition = "amqp:connection:framing-error"


class SaslRefused(ProtocolError):
    """Well-formed, but the proxy will not relay it: a client's SASL EXTERNAL, which the
    broker would grant to the proxy's own certificate. The client gets sasl-outcome auth."""

    condition = "amqp:unauthorized-access"
