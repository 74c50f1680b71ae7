"""The AMQP 0-9-1 protocol errors a peer's byte stream can raise, with their spec reply codes."""

from __future__ import annotations

from typing import ClassVar


class ProtocolError(Exception):
    """A peer broke the AMQP 0-9-1 protocol in a way that ends the connection.

    ``offset`` is where the offending frame starts in the buffer that was being parsed, so
    the caller can still relay the complete frames before it. ``class_id``/``method_id``
    name the offending method when there is one (0 otherwise), for ``connection.close``.
    """

    reply_code: ClassVar[int] = 501
    reply_name: ClassVar[str] = "FRAME_ERROR"

    def __init__(self, reason: str, offset: int, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset
        self.class_id = class_id
        self.method_id = method_id

    @property
    def condition(self) -> str:
        """The reply code and its spec name, e.g. ``"501 FRAME_ERROR"``."""
        return f"{self.reply_code} {self.reply_name}"

    @property
    def reply_text(self) -> str:
        """The text for ``connection.close``, RabbitMQ style: ``"FRAME_ERROR - <reason>"``."""
        return f"{self.reply_name} - {self.reason}"


class FrameError(ProtocolError):
    """A malformed frame (spec 501 frame-error): bad end octet, oversize, unknown type..."""

    reply_code = 501
    reply_name = "FRAME_ERROR"


class MethodSyntaxError(ProtocolError):
    """A method the proxy must read has fields that do not decode (spec 502 syntax-error)."""

    reply_code = 502
    reply_name = "SYNTAX_ERROR"


class UnexpectedFrame(ProtocolError):
    """A well-formed frame that cannot appear where it did (spec 505 unexpected-frame)."""

    reply_code = 505
    reply_name = "UNEXPECTED_FRAME"


class NotAllowed(ProtocolError):
    """Well-formed, but not allowed by what was negotiated (spec 530 not-allowed): a
    connection.tune-ok whose frame_max is above the broker's connection.tune."""

    reply_code = 530
    reply_name = "NOT_ALLOWED"


class AccessRefused(ProtocolError):
    """Well-formed, but the proxy will not relay it (spec 403 access-refused): a client's
    SASL EXTERNAL login, which the broker would grant to the proxy's own certificate."""

    reply_code = 403
    reply_name = "ACCESS_REFUSED"
