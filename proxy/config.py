"""Proxy settings: parsing of addresses and secrets, one dataclass the I/O layer reads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from proxy.spool.manager import DEFAULT_MIN_FREE, DEFAULT_TOTAL_MAX


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


def _login_from_environment(env: dict[str, str], prefix: str, username: str, password: str
                            ) -> tuple[str, str]:
    """``{prefix}_USERNAME`` and ``{prefix}_PASSWORD_FILE`` (wins) or ``{prefix}_PASSWORD``."""
    username = env.get(f"{prefix}_USERNAME", username)
    password_file = env.get(f"{prefix}_PASSWORD_FILE")
    if password_file:
        try:
            password = Path(password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"{prefix}_PASSWORD_FILE: {exc}") from None
    else:
        password = env.get(f"{prefix}_PASSWORD", password)
    return username, password


@dataclass(frozen=True)
class ManagementCredentials:
    """Login for the broker's management API; never taken from the command line."""

    username: str = "guest"
    password: str = "guest"

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> ManagementCredentials:
        env = dict(os.environ) if env is None else env
        return cls(*_login_from_environment(env, "FLOODWALL_MANAGEMENT", "guest", "guest"))

    def __repr__(self) -> str:  # keep the password out of logs and tracebacks
        return f"ManagementCredentials(username={self.username!r}, password=***)"


@dataclass(frozen=True)
class AmqpCredentials:
    """Login for the proxy's own AMQP connections (queue probes, alarm notices).

    ``FLOODWALL_AMQP_USERNAME`` and ``FLOODWALL_AMQP_PASSWORD`` / ``_PASSWORD_FILE``; each
    one left unset falls back to the management API's username or password.
    """

    username: str = "guest"
    password: str = "guest"

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None,
                         fallback: ManagementCredentials | None = None) -> AmqpCredentials:
        env = dict(os.environ) if env is None else env
        if fallback is None:
            fallback = ManagementCredentials.from_environment(env)
        return cls(*_login_from_environment(env, "FLOODWALL_AMQP", fallback.username,
                                            fallback.password))

    def __repr__(self) -> str:
        return f"AmqpCredentials(username={self.username!r}, password=***)"


#: Per-connection budget of held publishes before the proxy stops reading that connection.
DEFAULT_HOLD_BUDGET = 16 * 1024 * 1024
#: The management API's port when --management is not given (RabbitMQ's default).
DEFAULT_MANAGEMENT_PORT = 15672
#: Seconds SIGTERM waits for connections to finish before closing what is left.
DEFAULT_DRAIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class ProxySettings:
    """Everything ``floodwall run`` was told."""

    listen: tuple[str, int]
    upstream: tuple[str, int]
    admin: tuple[str, int] | None = None
    management_url: str | None = None
    credentials: ManagementCredentials = ManagementCredentials()
    amqp_credentials: AmqpCredentials | None = None  # None: the management credentials
    policies: Path | None = None
    connect_timeout: float = 5.0
    handshake_timeout: float = 10.0
    upstream_probe_interval: float = 5.0
    event_loop: str = "auto"  # auto | uvloop | asyncio
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # SIGTERM: longest wait for connections
    # Flow control (used when ``policies`` is set).
    depth_interval: float = 0.2  # passive queue.declare of each policed queue
    management_interval: float = 5.0  # management API sample of each policed queue
    hold_budget: int = DEFAULT_HOLD_BUDGET  # bytes held per connection (the relay's)
    alarm_interval: float = 2.0  # management API node alarms
    topology_interval: float = 30.0  # management API exchanges/queues/bindings re-sync
    topology_events: bool = True  # consume the broker's topology events when it has them
    policy_poll_interval: float = 2.0  # has the policy file changed?
    holding_log_interval: float = 5.0  # repeat the "publishes held" lines this often
    # Telemetry (proxy/io/telemetry.py; needs ``policies``): None writes none.
    telemetry_dir: Path | None = None
    telemetry_interval: float = 1.0
    telemetry_file_bytes: int = 16 * 1024 * 1024  # rotate past this size ...
    telemetry_file_age: float = 3600.0  # ... or this age (seconds)
    telemetry_total_bytes: int = 256 * 1024 * 1024  # oldest files deleted past this
    # Spool (proxy/io/spool.py; needs ``policies``): None: ``overflow: spool`` acts as hold.
    spool_dir: Path | None = None
    spool_total_max: int = DEFAULT_TOTAL_MAX  # bytes, all queues
    spool_min_free: int = DEFAULT_MIN_FREE  # bytes left free on the spool's filesystem

    @property
    def effective_management_url(self) -> str:
        """``management_url``, else ``http://<upstream host>:15672``."""
        if self.management_url:
            return self.management_url
        host = self.upstream[0]
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{DEFAULT_MANAGEMENT_PORT}"

    @property
    def effective_amqp_credentials(self) -> AmqpCredentials:
        if self.amqp_credentials is not None:
            return self.amqp_credentials
        return AmqpCredentials(self.credentials.username, self.credentials.password)
