"""The contract between the I/O layer and a sans-IO protocol core: one proxied connection."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

EXTERNAL_REFUSED = (
    "SASL EXTERNAL through floodwall would log in as the proxy's own TLS certificate, not "
    "the client's: refused (--upstream-tls-relay-external allows it)")
"""Why both cores refuse a client's SASL EXTERNAL by default (docs/architecture.md, "TLS"):
RabbitMQ's EXTERNAL takes the user from the certificate on *its* side of the socket, which
is the proxy's; a relayed EXTERNAL login would give every client the proxy's identity."""


class Side(Enum):
    """Which peer of a proxied connection a byte stream comes from."""

    CLIENT = "client"
    SERVER = "server"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a core gave up on its connection.

    The core has already queued the protocol's close frame for ``side``'s peer where the
    protocol has one (0-9-1 ``connection.close`` 501, 1.0 ``close`` with an error); the I/O
    layer flushes what the core queued, logs ``reason`` once and closes both sockets.
    """

    side: Side
    condition: str  # "501 FRAME_ERROR", "amqp:decode-error", ...
    reason: str
    refused: bool = False  # well-formed, but the proxy refuses it (SASL EXTERNAL relayed)


@dataclass(slots=True)
class FrameCounts:
    """Frames and bytes a core has relayed in one direction; plain ints for the hot path."""

    frames: int = 0
    bytes: int = 0


class RelayCore(Protocol):
    """One proxied connection's protocol state, both directions, no I/O.

    The I/O layer feeds what it reads from each socket into ``receive_from_client`` /
    ``receive_from_server`` and writes what ``data_for_server`` / ``data_for_client`` hand
    back. Frames the core does not change leave exactly as they came, in order; a partial
    frame is kept until the rest arrives. After a call, ``failure`` set means: flush, close.
    """

    failure: Failure | None
    from_client: FrameCounts
    from_server: FrameCounts

    def receive_from_client(self, data: bytes) -> None: ...

    def receive_from_server(self, data: bytes) -> None: ...

    def data_for_server(self) -> bytes: ...

    def data_for_client(self) -> bytes: ...
