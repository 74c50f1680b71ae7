"""The spool's record format: one publish, length-prefixed and checksummed.

On disk a record is::

    magic   4 bytes  b"FWR1"
    length  u32      bytes of payload that follow the checksum
    crc32   u32      zlib.crc32 of the payload
    payload:
      seq          u64   the queue's spool sequence number (1, 2, ...)
      accepted_at  f64   unix time the proxy accepted the publish
      flags        u8    bit 0: mandatory; bit 1: an AMQP 1.0 message
      exchange     u8 length + UTF-8
      routing_key  u8 length + UTF-8
      properties   u32 length + the content header payload as the client sent it
                   (class id, weight, body size, property flags, property list)
      body         u32 length + bytes

An AMQP 1.0 record (flag bit 1) has an empty exchange and routing key; its ``properties``
are the transfer's message-format (u32) followed by the UTF-8 target address the message
was sent to (the link's target, or the message's ``to`` on an anonymous link), and its
``body`` is the message's encoded sections exactly as the client transferred them. It is
replayed over AMQP 1.0 to that address, so the broker stores what it would have stored.

All integers are big-endian, as in AMQP. A record whose magic, length or checksum does not
hold, at the end of the newest segment, is a torn write (a crash mid-append) and is dropped
on recovery; anywhere else it is damage: the reader skips to the next whole record
(``segments.scan_segment``), so only the damaged record is lost, and reports it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

MAGIC: Final = b"FWR1"
_HEAD = struct.Struct(">4sII")
_FIXED = struct.Struct(">QdB")
FLAG_MANDATORY: Final = 1
FLAG_AMQP10: Final = 2
HEAD_SIZE: Final = _HEAD.size
MAX_PAYLOAD: Final = 1 << 31


class RecordError(ValueError):
    """Bytes that are not a complete, intact record."""


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One spooled publish."""

    seq: int
    accepted_at: float
    exchange: str
    routing_key: str
    properties: bytes  # content header payload, byte-exact
    body: bytes
    mandatory: bool = False
    amqp10: bool = False

    @classmethod
    def amqp10_message(cls, seq: int, accepted_at: float, address: str, message_format: int,
                       message: bytes) -> SpoolRecord:
        """An AMQP 1.0 message sent to ``address``: its encoded sections, as transferred."""
        return cls(seq, accepted_at, "", "",
                   message_format.to_bytes(4, "big") + address.encode(), message, amqp10=True)

    @property
    def address(self) -> str:
        """An AMQP 1.0 record's target address ("" for a 0-9-1 record)."""
        return self.properties[4:].decode() if self.amqp10 else ""

    @property
    def message_format(self) -> int:
        """An AMQP 1.0 record's message-format (0: the standard AMQP message)."""
        return int.from_bytes(self.properties[:4], "big") if self.amqp10 else 0

    def encode(self) -> bytes:
        ex = self.exchange.encode()
        rk = self.routing_key.encode()
        payload = b"".join((
            _FIXED.pack(self.seq, self.accepted_at,
                        (FLAG_MANDATORY if self.mandatory else 0)
                        | (FLAG_AMQP10 if self.amqp10 else 0)),
            bytes([len(ex)]), ex, bytes([len(rk)]), rk,
            len(self.properties).to_bytes(4, "big"), self.properties,
            len(self.body).to_bytes(4, "big"), self.body,
        ))
        return _HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload

    @property
    def size(self) -> int:
        """Bytes on disk."""
        return (HEAD_SIZE + _FIXED.size + 2 + len(self.exchange.encode())
                + len(self.routing_key.encode()) + 8 + len(self.properties) + len(self.body))


def decode_at(buf: bytes | memoryview, offset: int) -> tuple[SpoolRecord, int]:
    """The record at ``offset`` and the offset after it; RecordError if it is not whole."""
    if len(buf) - offset < HEAD_SIZE:
        raise RecordError("truncated record header")
    magic, length, crc = _HEAD.unpack_from(buf, offset)
    if magic != MAGIC:
        raise RecordError(f"bad magic {bytes(magic)!r}")
    if length > MAX_PAYLOAD:
        raise RecordError(f"record length {length} too large")
    start = offset + HEAD_SIZE
    end = start + length
    if end > len(buf):
        raise RecordError("truncated record payload")
    payload = bytes(buf[start:end])
    if zlib.crc32(payload) != crc:
        raise RecordError("checksum mismatch")
    try:
        seq, accepted_at, flags = _FIXED.unpack_from(payload, 0)
        if flags & ~(FLAG_MANDATORY | FLAG_AMQP10):
            raise RecordError(f"unknown flags 0x{flags:02x}: not a record this version wrote")
        pos = _FIXED.size
        n = payload[pos]
        exchange = payload[pos + 1:pos + 1 + n].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1:pos + 1 + n].decode()
        pos += 1 + n
        n = int.from_bytes(payload[pos:pos + 4], "big")
        properties = payload[pos + 4:pos + 4 + n]
        pos += 4 + n
        n = int.from_bytes(payload[pos:pos + 4], "big")
        body = payload[pos + 4:pos + 4 + n]
        amqp10 = bool(flags & FLAG_AMQP10)
        if pos + 4 + n != len(payload) or len(properties) < (4 if amqp10 else 12):
            raise RecordError("record fields do not add up")
        if amqp10:
            properties[4:].decode()  # the address must be UTF-8
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise RecordError(f"undecodable record: {exc}") from None
    return SpoolRecord(seq, accepted_at, exchange, routing_key, properties, body,
                       bool(flags & FLAG_MANDATORY), amqp10), end
