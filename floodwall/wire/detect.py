"""Protocol detection: the first 8 bytes of a client connection choose the core."""

from __future__ import annotations

from enum import Enum

HEADER_SIZE = 8

AMQP091_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"
AMQP10_SASL_HEADER = b"AMQP\x03\x01\x00\x00"


class Detected(Enum):
    """What a connection's protocol header asks for."""

    NEED_DATA = "need-data"
    AMQP091 = "amqp091"
    AMQP10 = "amqp10"  # plain or SASL header; the 1.0 core reads which
    UNSUPPORTED = "unsupported"


def detect(head: bytes) -> Detected:
    """Classify the start of a client's byte stream.

    Returns NEED_DATA while fewer than 8 bytes have arrived and they could still be a
    header we speak; UNSUPPORTED as soon as they cannot be.
    """
    prefix = head[:HEADER_SIZE]
    if len(prefix) < HEADER_SIZE:
        for known in (AMQP091_HEADER, AMQP10_HEADER, AMQP10_SASL_HEADER):
            if known.startswith(prefix):
                return Detected.NEED_DATA
        return Detected.UNSUPPORTED
    if prefix == AMQP091_HEADER:
        return Detected.AMQP091
    if prefix in (AMQP10_HEADER, AMQP10_SASL_HEADER):
        return Detected.AMQP10
    return Detected.UNSUPPORTED


def header_reply(head: bytes) -> bytes:
    """The header to send back before closing a connection whose header we do not speak.

    Both specs say the same: answer with the header of a protocol version we support, then
    close. A client that asked for AMQP 1.0 in some form (another protocol id such as TLS, or
    another revision) is told the 1.0 header nearest to its request; anything else, including
    0-9-1 variants (0-8, 0-9) and non-AMQP bytes, gets the 0-9-1 header, as RabbitMQ does.
    """
    if head[:4] == b"AMQP" and len(head) >= 6 and head[5] == 1:
        # A 1.0 header: protocol id 0 (AMQP), 2 (TLS) or 3 (SASL), major version 1.
        if head[4] == 0:
            return AMQP10_HEADER
        if head[4] in (2, 3):
            return AMQP10_SASL_HEADER  # we do not terminate TLS; SASL is the nearest
    return AMQP091_HEADER
