"""Sans-IO AMQP 1.0: type codec, frame scanner, and the relay core for one proxied connection."""

from proxy.amqp10.connection import Connection
from proxy.amqp10.errors import DecodeError, FramingError, ProtocolError

__all__ = ["Connection", "DecodeError", "FramingError", "ProtocolError"]
