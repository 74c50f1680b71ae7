"""Proxy settings: parsing of addresses and secrets, one dataclass the I/O layer reads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    """A setting is malformed; the message names the setting and what was expected."""


def parse_hostport(value: str, setting: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``[v6]:PORT`` or ``PORT`` to (host, port)."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or default_host
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{setting}: {value!r} is not HOST:PORT") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{setting}: port {port} out of range 0-65535")
    return host, port


@dataclass(frozen=True)
class ManagementCredentials:
    """Login for the broker's management API; never taken from the command line."""

    username: str = "guest"
    password: str = "guest"

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> ManagementCredentials:
        env = dict(os.environ) if env is None else env
        username = env.get("FLOODWALL_MANAGEMENT_USERNAME", "guest")
        password_file = env.get("FLOODWALL_MANAGEMENT_PASSWORD_FILE")
        if password_file:
            try:
                password = Path(password_file).read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(f"FLOODWALL_MANAGEMENT_PASSWORD_FILE: {exc}") from None
        else:
            password = env.get("FLOODWALL_MANAGEMENT_PASSWORD", "guest")
        return cls(username, password)

    def __repr__(self) -> str:  # keep the password out of logs and tracebacks
        return f"ManagementCredentials(username={self.username!r}, password=***)"


@dataclass(frozen=True)
class ProxySettings:
    """Everything ``floodwall run`` was told."""

    listen: tuple[str, int]
    upstream: tuple[str, int]
    admin: tuple[str, int] | None = None
    management_url: str | None = None
    credentials: ManagementCredentials = ManagementCredentials()
    policies: Path | None = None
    connect_timeout: float = 5.0
    handshake_timeout: float = 10.0
    upstream_probe_interval: float = 5.0
    event_loop: str = "auto"  # auto | uvloop | asyncio
