"""What a client is told when the proxy cannot reach the broker, in the client's protocol.

Closing the socket right after the protocol header makes client libraries guess (pika:
``IncompatibleProtocolError``). Instead the proxy plays the server's first steps itself and
then closes with the reason:

- AMQP 0-9-1: ``connection.start``; after the client's ``start-ok``, ``connection.close``
  320 (connection-forced) ``floodwall: broker unreachable: REASON``.
- AMQP 1.0: with SASL, ``sasl-mechanisms`` (PLAIN, ANONYMOUS, AMQPLAIN) and after the
  client's ``sasl-init`` a ``sasl-outcome`` ok (nothing is logged in: the connection ends
  next); then the AMQP header, an ``open`` and a ``close`` with the error
  ``amqp:connection:forced`` and the same description.

Sans-IO: ``receive(data)`` takes the client's bytes (its protocol header first) and returns
the bytes to send; ``done`` says when the socket can be closed after writing them.
"""

from __future__ import annotations

import struct
from typing import Final

from pamqp import commands

from floodwall.wire.amqp091.framing import encode_method
from floodwall.wire.amqp10.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER, frame
from floodwall.wire.amqp10.performatives import (
    SASL_MECHANISMS,
    SASL_OK,
    SASL_OUTCOME,
    close_body,
    encode_performative,
    open_body,
)
from floodwall.wire.amqp10.types import Array, Symbol, UByte
from floodwall.wire.detect import HEADER_SIZE, Detected

#: connection-forced: "an operator intervened to close the connection"; the client may retry.
REPLY_CODE: Final = 320
CONDITION_10: Final = "amqp:connection:forced"
CONTAINER_ID: Final = "floodwall"
_SYM8: Final = 0xA3
_FRAME_SIZE_091: Final = struct.Struct(">BHI")
_MAX_INPUT: Final = 64 * 1024  # more than any start-ok or sasl-init: stop listening


def reason_text(reason: str) -> str:
    return f"floodwall: broker unreachable: {reason}"


def connection_start_091() -> bytes:
    """A 0-9-1 ``connection.start`` from the proxy (0-9, PLAIN and AMQPLAIN)."""
    return encode_method(commands.Connection.Start(
        version_major=0, version_minor=9,
        server_properties={"product": "floodwall", "information": "broker unreachable"},
        mechanisms="PLAIN AMQPLAIN", locales="en_US"), 0)


def connection_close_091(reason: str) -> bytes:
    text = reason_text(reason).encode()[:255].decode("utf-8", "ignore")
    return encode_method(commands.Connection.Close(REPLY_CODE, text, 0, 0), 0)


class UnreachableAnswer:
    """The server's side of a handshake that ends in a close naming ``reason``."""

    def __init__(self, protocol: Detected, reason: str) -> None:
        self.protocol = protocol
        self.reason = reason
        self.done = False
        self._buf = bytearray()
        self._step = 0  # how far the answer has got (per protocol, see receive)

    def receive(self, data: bytes) -> bytes:
        """The client's bytes (its protocol header first); the bytes to send it."""
        if self.done:
            return b""
        self._buf += data
        if len(self._buf) > _MAX_INPUT:
            self.done = True
            return b""
        if self.protocol is Detected.AMQP091:
            return self._receive_091()
        return self._receive_10()

    def _receive_091(self) -> bytes:
        out = b""
        if self._step == 0 and len(self._buf) >= HEADER_SIZE:
            del self._buf[:HEADER_SIZE]
            self._step = 1
            out += connection_start_091()
        if self._step == 1 and self._whole_091_frame():
            self._step = 2
            self.done = True
            out += connection_close_091(self.reason)
        return out

    def _whole_091_frame(self) -> bool:
        if len(self._buf) < _FRAME_SIZE_091.size:
            return False
        _, _, size = _FRAME_SIZE_091.unpack_from(self._buf)
        return len(self._buf) >= _FRAME_SIZE_091.size + int(size) + 1

    def _receive_10(self) -> bytes:
        out = b""
        if self._step == 0 and len(self._buf) >= HEADER_SIZE:
            header = bytes(self._buf[:HEADER_SIZE])
            del self._buf[:HEADER_SIZE]
            if header == SASL_HEADER:
                self._step = 1
                mechanisms = Array(_SYM8, (Symbol("PLAIN"), Symbol("ANONYMOUS"),
                                           Symbol("AMQPLAIN")))
                out += SASL_HEADER + frame(encode_performative(
                    SASL_MECHANISMS, sasl_server_mechanisms=mechanisms), 0, SASL_FRAME)
            else:
                self._step = 3
                out += self._close_10()
        if self._step == 1 and self._whole_10_frame():  # the sasl-init
            size = struct.unpack_from(">I", self._buf)[0]
            del self._buf[:size]
            self._step = 2
            out += frame(encode_performative(SASL_OUTCOME, code=UByte(SASL_OK)), 0, SASL_FRAME)
        if self._step == 2 and len(self._buf) >= HEADER_SIZE:  # the client's AMQP header
            del self._buf[:HEADER_SIZE]
            self._step = 3
            out += self._close_10()
        return out

    def _whole_10_frame(self) -> bool:
        if len(self._buf) < 8:
            return False
        return len(self._buf) >= int(struct.unpack_from(">I", self._buf)[0])

    def _close_10(self) -> bytes:
        self.done = True
        return (AMQP_HEADER + frame(open_body(CONTAINER_ID))
                + frame(close_body(CONDITION_10, reason_text(self.reason))))
