"""TLS for every connection the proxy makes or accepts: the ``ssl.SSLContext`` s built from the
settings' frozen TLS values (floodwall/ops/config.py), re-read when their files change, and TLS
failures turned into one sentence an operator can act on.

Three contexts per process, each built once and shared: the upstream's (relayed clients,
depth probes, both spool replayers, ``floodwall spool replay``), the management API's and the
listener's. Each is held by a ``ReloadingContext`` that the proxy asks every couple of seconds
whether its files changed; a changed set that builds completely replaces the context for the
connections made from then on (connections already up keep the one they were made with); one
that does not build (a half-written pair, a key that does not match) is logged and the old
context stays. The listener cannot hand asyncio a new context, so its context picks the
newest one for each handshake in its SNI callback (OpenSSL calls it for every ClientHello,
with or without a server name): certificate, key and client CAs swap together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path

from floodwall.ops.config import ListenerTls, ManagementTls, TlsVersion, UpstreamTls
from floodwall.ops.logs import event

log = logging.getLogger("floodwall.tls")

_VERSIONS = {TlsVersion.TLS1_2: ssl.TLSVersion.TLSv1_2, TlsVersion.TLS1_3: ssl.TLSVersion.TLSv1_3}

#: OpenSSL reasons (``SSLError.reason``) that have a likelier cause than their name says.
_HINTS = {
    "WRONG_VERSION_NUMBER": "the port does not speak TLS (amqps:// to a plain AMQP port?)",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the peer requires a client certificate",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the peer refused the handshake (a client certificate "
                                     "required, or no common cipher or version)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the peer refused our certificate",
    "TLSV1_ALERT_UNKNOWN_CA": "the peer does not trust the CA of our certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the peer says our certificate has expired",
    "TLSV1_ALERT_PROTOCOL_VERSION": "no TLS version both sides accept",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client presented no certificate, and one is "
                                         "required",
    "CERTIFICATE_VERIFY_FAILED": "the certificate is not from a CA we trust",
}


class TlsFailure(ConnectionError):
    """A TLS handshake to the upstream (or a peer's alert right after it) failed; the
    message says why, which name was verified and against which CA file."""


def explain(exc: BaseException, name: str | None, ca: Path | None) -> str:
    """One sentence for a TLS failure: what failed, the name verified, the CA file used."""
    trust = f"CA file {ca}" if ca is not None else "the system trust store"
    if isinstance(exc, ssl.SSLCertVerificationError):
        what = exc.verify_message or getattr(exc, "reason", None) or str(exc)
        if name is None:  # a client's certificate, verified by the listener
            return f"client certificate verify failed: {what} (against {trust})"
        return f"certificate verify failed: {what} (verified name {name!r} against {trust})"
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None) or ""
        text = reason.lower().replace("_", " ") if reason else str(exc)
        hint = _HINTS.get(reason)
        return f"TLS handshake failed: {text}" + (f": {hint}" if hint else "")
    return str(exc) or type(exc).__name__


def _stat(path: Path) -> tuple[int, ...]:
    """What changes when a file is replaced or rewritten (a symlink swap included)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return (-1, exc.errno or 0)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class ReloadingContext:
    """An SSLContext built by ``build`` from ``files``; ``check()`` rebuilds it when they
    changed. ``context`` is the newest one that built; ``error`` the last failed rebuild."""

    def __init__(self, what: str, files: tuple[Path, ...], build: Callable[[], ssl.SSLContext]
                 ) -> None:
        self.what = what
        self.files = files
        self._build = build
        self._seen = self._signature()
        self.context = build()  # raises (ssl.SSLError, OSError) at start-up: refuse to start
        self.reloads = 0
        self.error: str | None = None

    def _signature(self) -> tuple[tuple[int, ...], ...]:
        return tuple(_stat(p) for p in self.files)

    def check(self) -> bool:
        """Rebuild when a file changed; True when a new context took over."""
        seen = self._signature()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            context = self._build()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            self.error = explain(exc, None, None) if isinstance(exc, ssl.SSLError) else (
                str(exc) or type(exc).__name__)
            event(log, "tls_reload_failed", logging.WARNING, what=self.what,
                  files=",".join(map(str, self.files)), reason=self.error,
                  action="keeping the previous certificate; retrying when the files change")
            return False
        self.context = context
        self.error = None
        self.reloads += 1
        self._installed(context)
        event(log, "tls_reloaded", what=self.what, files=",".join(map(str, self.files)),
              reloads=self.reloads)
        return True

    def _installed(self, context: ssl.SSLContext) -> None:
        """Hook: a new context took over."""


class UpstreamTlsContext(ReloadingContext):
    """The upstream's client context and how to name the broker."""

    def __init__(self, settings: UpstreamTls) -> None:
        self.settings = settings
        super().__init__("upstream", settings.files, lambda: client_context(settings))

    def server_name(self, host: str) -> str:
        return self.settings.name_for(host)

    def failure(self, exc: BaseException, host: str) -> TlsFailure:
        return TlsFailure(explain(exc, self.server_name(host), self.settings.ca))


class ManagementTlsContext(ReloadingContext):
    """The management API's https context."""

    def __init__(self, settings: ManagementTls) -> None:
        self.settings = settings
        super().__init__("management", settings.files, lambda: management_context(settings))


class ListenerTlsContext(ReloadingContext):
    """The listener's server context: ``front`` goes to asyncio once; each handshake is
    switched to the newest context in the SNI callback."""

    def __init__(self, settings: ListenerTls) -> None:
        self.settings = settings
        super().__init__("listener", settings.files, lambda: listener_context(settings))
        self.front = self.context
        self.front.sni_callback = self._pick

    def _pick(self, sslobj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
              context: ssl.SSLContext) -> None:
        current = self.context
        if current is not context:
            sslobj.context = current


def _base(purpose: ssl.Purpose, min_version: TlsVersion) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT if purpose is ssl.Purpose.SERVER_AUTH
                             else ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[min_version]
    return context


def client_context(settings: UpstreamTls) -> ssl.SSLContext:
    """The upstream's context: verify the broker (unless insecure), our certificate if any."""
    context = _base(ssl.Purpose.SERVER_AUTH, settings.min_version)
    if settings.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif settings.ca is not None:
        context.load_verify_locations(cafile=str(settings.ca))
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if settings.cert is not None and settings.key is not None:
        context.load_cert_chain(str(settings.cert), str(settings.key))
    return context


def management_context(settings: ManagementTls) -> ssl.SSLContext:
    """https to the management API: verify it against ``ca`` (else the system store)."""
    context = _base(ssl.Purpose.SERVER_AUTH, TlsVersion.TLS1_2)
    if settings.ca is not None:
        context.load_verify_locations(cafile=str(settings.ca))
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if settings.cert is not None and settings.key is not None:
        context.load_cert_chain(str(settings.cert), str(settings.key))
    return context


def listener_context(settings: ListenerTls) -> ssl.SSLContext:
    """The listener's context: our certificate; with a client CA, a verified client
    certificate is required."""
    context = _base(ssl.Purpose.CLIENT_AUTH, settings.min_version)
    context.load_cert_chain(str(settings.cert), str(settings.key))
    if settings.client_ca is not None:
        context.load_verify_locations(cafile=str(settings.client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def open_upstream(host: str, port: int, tls: UpstreamTlsContext | None,
                        name: str | None = None
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to the broker at ``host``, over TLS when ``tls`` is given (``name``: the
    node's name when ``host`` is one of its addresses, for SNI and the name verified). A
    failed handshake raises ``TlsFailure`` (an OSError) saying why; the caller bounds the
    time."""
    if tls is None:
        return await asyncio.open_connection(host, port)
    named = name or host
    try:
        return await asyncio.open_connection(host, port, ssl=tls.context,
                                             server_hostname=tls.server_name(named))
    except ssl.SSLError as exc:
        raise tls.failure(exc, named) from None


def ended_after_handshake(tls: UpstreamTlsContext, how: str) -> TlsFailure:
    """The broker ended the connection (``how``: reset, EOF) right after the TLS handshake,
    before its first AMQP bytes. With TLS 1.3 a broker refuses a client certificate (or its
    absence) after the handshake: when our protocol header crosses its alert on the wire,
    all we see is the socket reset or closed, so that is what this names."""
    given = ("the client certificate we sent" if tls.settings.cert is not None
             else "the absence of a client certificate (none is configured)")
    return TlsFailure(
        f"the broker closed the connection right after the TLS handshake, before its first "
        f"AMQP bytes ({how}): with TLS 1.3 that is how a broker refuses {given}; check the "
        f"upstream cert/key and the broker's ssl_options.verify and fail_if_no_peer_cert")


def tls_error(exc: BaseException, tls: UpstreamTlsContext | None, host: str, *,
              greeted: bool = False) -> BaseException:
    """``exc`` as a ``TlsFailure`` when it is a TLS error on the upstream, else itself: the
    alert a TLS 1.3 broker sends after the handshake, or the reset or EOF it shows as when
    it comes before the broker's first bytes (``greeted`` False)."""
    if tls is None:
        return exc
    if isinstance(exc, ssl.SSLError):
        return tls.failure(exc, host)
    if not greeted and isinstance(exc, (ConnectionResetError, BrokenPipeError,
                                        asyncio.IncompleteReadError)):
        return ended_after_handshake(tls, type(exc).__name__)
    return exc


__all__ = [
    "ListenerTlsContext",
    "ManagementTlsContext",
    "ReloadingContext",
    "TlsFailure",
    "UpstreamTlsContext",
    "client_context",
    "ended_after_handshake",
    "explain",
    "listener_context",
    "management_context",
    "open_upstream",
    "tls_error",
]
