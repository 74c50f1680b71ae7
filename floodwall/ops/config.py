"""Proxy settings: parsing of addresses and secrets, one dataclass the I/O layer reads."""

from __future__ import annotations

import enum
import ipaddress
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from floodwall.control.admission import HOT_INTERVAL
from floodwall.control.memory import DEFAULT_MEMORY_BUDGET
from floodwall.control.schedule import DEPTH_INTERVAL
from floodwall.spool.manager import DEFAULT_MAX_MESSAGE, DEFAULT_MIN_FREE, DEFAULT_TOTAL_MAX


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


#: amqps' port when ``--upstream amqps://HOST`` names none (IANA's).
AMQPS_PORT = 5671
#: amqp's port when ``--upstream amqp://HOST`` names none.
AMQP_PORT = 5672
#: The management API's https port when --management is not given and the upstream is amqps.
DEFAULT_MANAGEMENT_TLS_PORT = 15671


class TlsVersion(enum.Enum):
    """The lowest TLS version a connection accepts (never below 1.2)."""

    TLS1_2 = "1.2"
    TLS1_3 = "1.3"

    @classmethod
    def parse(cls, value: str, setting: str) -> TlsVersion:
        for version in cls:
            if version.value == value.strip():
                return version
        raise ConfigError(f"{setting}: {value!r} is not a TLS version floodwall accepts "
                          f"({', '.join(v.value for v in cls)})")


def _readable(path: Path | None, setting: str) -> Path | None:
    """``path`` when it names a readable file; a ConfigError that says which setting if not."""
    if path is None:
        return None
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
    return path


@dataclass(frozen=True)
class UpstreamTls:
    """How the proxy speaks TLS to the broker: relayed clients, depth probes, both spool
    replayers and ``floodwall spool replay`` all use this one value (floodwall/io/tls.py turns
    it into the ``ssl.SSLContext``).

    ``ca`` None: the system's trust store. ``cert``/``key``: the client certificate the
    broker sees (mutual TLS); ``sasl_external``: the proxy's own connections log in with
    SASL EXTERNAL (the broker takes the user from that certificate) instead of PLAIN.
    ``relay_external``: relayed clients may choose SASL EXTERNAL too, and then log in as the
    proxy's certificate, not as themselves (off: refused, see docs/design/tls.md).
    ``server_name`` None: the upstream host, for SNI and the name verified.
    ``insecure``: nothing is verified (warned at start-up and in /readyz).
    """

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None
    insecure: bool = False
    min_version: TlsVersion = TlsVersion.TLS1_2
    sasl_external: bool = False
    relay_external: bool = False

    @classmethod
    def checked(cls, *, ca: Path | None = None, cert: Path | None = None,
                key: Path | None = None, server_name: str | None = None,
                insecure: bool = False, min_version: TlsVersion = TlsVersion.TLS1_2,
                sasl_external: bool = False, relay_external: bool = False,
                prefix: str = "--upstream-tls") -> UpstreamTls:
        """Build one, refusing combinations that cannot work (each names its flag)."""
        if (cert is None) != (key is None):
            raise ConfigError(f"{prefix}-cert and {prefix}-key go together "
                              f"(got only {prefix}-{'cert' if key is None else 'key'})")
        if sasl_external and cert is None:
            raise ConfigError(f"{prefix}-sasl-external needs {prefix}-cert and -key: SASL "
                              "EXTERNAL logs in as the client certificate's subject")
        if relay_external and cert is None:
            raise ConfigError(f"{prefix}-relay-external needs {prefix}-cert and -key: "
                              "without the proxy's certificate no broker offers EXTERNAL")
        if server_name is not None and not server_name.strip():
            raise ConfigError(f"{prefix}-server-name: empty")
        return cls(_readable(ca, f"{prefix}-ca"), _readable(cert, f"{prefix}-cert"),
                   _readable(key, f"{prefix}-key"), server_name, insecure, min_version,
                   sasl_external, relay_external)

    def name_for(self, host: str) -> str:
        """The name sent as SNI and verified: ``server_name``, else the upstream host."""
        return self.server_name or host

    @property
    def files(self) -> tuple[Path, ...]:
        """The files it is built from (re-read when they change)."""
        return tuple(p for p in (self.ca, self.cert, self.key) if p is not None)


@dataclass(frozen=True)
class ListenerTls:
    """TLS for clients on ``--listen-tls``: the proxy's certificate and key, and with
    ``client_ca`` a required, verified client certificate. Re-read when the files change."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    min_version: TlsVersion = TlsVersion.TLS1_2

    @classmethod
    def checked(cls, cert: Path | None, key: Path | None, client_ca: Path | None = None,
                min_version: TlsVersion = TlsVersion.TLS1_2) -> ListenerTls:
        if cert is None or key is None:
            raise ConfigError("--listen-tls needs --listen-tls-cert and --listen-tls-key")
        return cls(_readable(cert, "--listen-tls-cert") or cert,
                   _readable(key, "--listen-tls-key") or key,
                   _readable(client_ca, "--listen-tls-client-ca"), min_version)

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert, self.key, self.client_ca) if p is not None)


@dataclass(frozen=True)
class ManagementTls:
    """https to the management API: ``ca`` None is the system's trust store; ``cert`` and
    ``key`` a client certificate when the API asks for one."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @classmethod
    def checked(cls, ca: Path | None = None, cert: Path | None = None,
                key: Path | None = None) -> ManagementTls:
        if (cert is None) != (key is None):
            raise ConfigError("--management-tls-cert and --management-tls-key go together")
        return cls(_readable(ca, "--management-tls-ca"), _readable(cert, "--management-tls-cert"),
                   _readable(key, "--management-tls-key"))

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.ca, self.cert, self.key) if p is not None)


def parse_upstream(value: str, setting: str = "--upstream") -> tuple[str, int, bool]:
    """``HOST:PORT`` or ``amqp://HOST[:PORT]`` (plain) or ``amqps://HOST[:PORT]`` (TLS, port
    5671 by default) to (host, port, tls). Any other scheme, a path other than ``/``, or a
    login in the URL is refused: credentials never come from the command line."""
    text = value.strip()
    if "://" not in text:
        host, port = parse_hostport(text, setting, default_host="127.0.0.1")
        return host, port, False
    url = urllib.parse.urlsplit(text)
    scheme = url.scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise ConfigError(f"{setting}: scheme {url.scheme!r} in {value!r} is not amqp:// or "
                          "amqps://")
    if url.username is not None or url.password is not None:
        raise ConfigError(f"{setting}: no login in the URL (use FLOODWALL_AMQP_USERNAME / "
                          "_PASSWORD_FILE); the proxy relays each client's own login")
    if url.path not in ("", "/") or url.query or url.fragment:
        raise ConfigError(f"{setting}: {value!r}: only amqp[s]://HOST[:PORT] (clients choose "
                          "their vhost)")
    if not url.hostname:
        raise ConfigError(f"{setting}: {value!r} names no host")
    try:
        given = url.port
    except ValueError:
        raise ConfigError(f"{setting}: {value!r}: port out of range 0-65535") from None
    tls = scheme == "amqps"
    return url.hostname, given if given is not None else (AMQPS_PORT if tls else AMQP_PORT), tls


#: A host name as DNS has it (RFC 1123 labels; ``_`` tolerated, as some records use it).
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def check_host(host: str, setting: str, value: str) -> str:
    """``host`` if it is an IP address or a well-formed DNS name; else a ConfigError naming
    what is wrong, so that a typo is refused at start, not by every client's connect."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if name and len(name) <= 253 and all(_HOST_LABEL.fullmatch(p) for p in name.split(".")):
        return host
    raise ConfigError(f"{setting}: {host!r} in {value!r} is not a host name or IP address")


def parse_upstreams(value: str, setting: str = "--upstream"
                    ) -> tuple[tuple[tuple[str, int], ...], bool]:
    """A comma-separated list of ``parse_upstream`` items (a cluster's nodes, tried in this
    order) to ((host, port), ...) and whether they speak TLS. Every item is checked here,
    at start; the nodes must agree on TLS (one set of --upstream-tls-* options serves all),
    and a node named twice is refused."""
    items = [item.strip() for item in value.split(",")]
    if not any(items):
        raise ConfigError(f"{setting}: names no broker")
    if not all(items):
        raise ConfigError(f"{setting}: {value!r} has an empty item (a stray comma?)")
    nodes: list[tuple[str, int]] = []
    kinds: set[bool] = set()
    for item in items:
        host, port, tls = parse_upstream(item, setting)
        check_host(host, setting, value)
        if (host, port) in nodes:
            raise ConfigError(f"{setting}: {host}:{port} is named twice in {value!r}")
        nodes.append((host, port))
        kinds.add(tls)
    if len(kinds) > 1:
        raise ConfigError(f"{setting}: {value!r} mixes amqps:// and plain nodes: one TLS "
                          "setting serves every node")
    return tuple(nodes), kinds.pop()


def parse_management_url(value: str, setting: str = "--management") -> str:
    """The management API's ``http[s]://HOST[:PORT][/PATH]``, without a trailing slash.

    A login in the URL is refused, with where it goes instead: a command line is read by
    anyone who can list processes, and the URL is logged and shown in ``/state``; the
    password belongs in ``FLOODWALL_MANAGEMENT_PASSWORD_FILE`` (or ``_PASSWORD``). The
    refusal never repeats what was given (it may hold the password)."""
    text = value.strip()
    try:
        url = urllib.parse.urlsplit(text)
        _ = url.port  # ValueError when out of range
    except ValueError:
        raise ConfigError(f"{setting}: not a URL with a valid port (expected "
                          "http[s]://HOST[:PORT][/PATH])") from None
    if "@" in url.netloc:
        raise ConfigError(
            f"{setting}: no login in the URL: it would be seen in the process list, the logs "
            "and /state. Give the user in FLOODWALL_MANAGEMENT_USERNAME and the password in "
            "FLOODWALL_MANAGEMENT_PASSWORD_FILE (a mounted secret) or "
            "FLOODWALL_MANAGEMENT_PASSWORD")
    if url.scheme.lower() not in ("http", "https"):
        raise ConfigError(f"{setting}: scheme {url.scheme!r} is not http or https (expected "
                          "http[s]://HOST[:PORT][/PATH])")
    if not url.hostname:
        raise ConfigError(f"{setting}: the URL names no host")
    if url.query or url.fragment:
        raise ConfigError(f"{setting}: no query or fragment (the API's base URL)")
    return text.rstrip("/")


def parse_management_urls(value: str, setting: str = "--management") -> str:
    """One URL, or each node's of a cluster, comma-separated (tried in this order): each
    checked as ``parse_management_url``; the list as given, without trailing slashes."""
    items = [item.strip() for item in value.split(",")]
    if not all(items):
        raise ConfigError(f"{setting}: an empty item in the list (a stray comma?)")
    return ",".join(parse_management_url(item, setting) for item in items)


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


#: Per-connection budget of held publishes before the proxy stops reading that connection:
#: a share of the process-wide memory budget (``--memory-budget``), so that one connection
#: cannot take all of it.
DEFAULT_HOLD_BUDGET = 8 * 1024 * 1024
#: ``--splice-threshold``: 0-9-1 body bytes of one frame still to come from which the relay
#: moves them with splice(2) instead of reading them (0: never; docs/configuration.md).
DEFAULT_SPLICE_THRESHOLD = 0
#: The management API's port when --management is not given (RabbitMQ's default).
DEFAULT_MANAGEMENT_PORT = 15672
#: Admin connections served at once (/metrics, probes, people): one more is answered 503.
DEFAULT_ADMIN_MAX_CONNECTIONS = 16
#: Seconds an admin client has to send its request, and again to take the answer.
DEFAULT_ADMIN_TIMEOUT = 5.0


@dataclass(frozen=True)
class AdminLimits:
    """What one admin client may cost: the connections served at once and how long each
    may take to ask and to be answered (``--admin-max-connections``, ``--admin-timeout``)."""

    max_connections: int = DEFAULT_ADMIN_MAX_CONNECTIONS
    timeout: float = DEFAULT_ADMIN_TIMEOUT


#: The broker's Prometheus endpoint's port when --prometheus is not given (RabbitMQ's default).
DEFAULT_PROMETHEUS_PORT = 15692
#: Seconds SIGTERM waits for connections to finish before closing what is left.
DEFAULT_DRAIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class ProxySettings:
    """Everything ``floodwall run`` was told."""

    listen: tuple[str, int] | None  # None: no plain listener (``--listen off``)
    upstreams: tuple[tuple[str, int], ...]  # the broker's nodes, tried in this order
    admin: tuple[str, int] | None = None
    admin_limits: AdminLimits = AdminLimits()
    management_url: str | None = None
    # The broker's Prometheus endpoints (a comma-separated list: one per node): queue depth
    # when the management API has no figures (statistics off). None: each management host
    # on DEFAULT_PROMETHEUS_PORT; "" off.
    prometheus_url: str | None = None
    # TLS (floodwall/io/tls.py builds the contexts). None: plain.
    upstream_tls: UpstreamTls | None = None
    listen_tls: tuple[str, int] | None = None  # a TLS listener beside (or instead of) listen
    listener_tls: ListenerTls | None = None  # its certificate, key, client CA
    management_tls: ManagementTls | None = None  # used when the management URL is https
    tls_reload_interval: float = 2.0  # how often certificate files are checked for changes
    credentials: ManagementCredentials = ManagementCredentials()
    amqp_credentials: AmqpCredentials | None = None  # None: the management credentials
    policies: Path | None = None
    shadow: bool = False  # every policy in shadow mode: computed, logged, counted; none held
    connect_timeout: float = 5.0
    handshake_timeout: float = 10.0
    upstream_probe_interval: float = 5.0
    event_loop: str = "auto"  # auto | uvloop | asyncio
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # SIGTERM: longest wait for connections
    # Flow control (used when ``policies`` is set).
    depth_interval: float = DEPTH_INTERVAL  # passive queue.declare of each policed queue
    hot_interval: float = HOT_INTERVAL  # ... of a hot one: at most one count per this
    management_interval: float = 5.0  # management API sample of each policed queue
    hold_budget: int = DEFAULT_HOLD_BUDGET  # bytes held per connection (the relay's)
    splice_threshold: int = DEFAULT_SPLICE_THRESHOLD  # 0: bodies are always copied
    memory_budget: int = DEFAULT_MEMORY_BUDGET  # bytes held, all connections together
    memory_budget_source: str = "the fixed default"  # said in the start-up line
    alarm_interval: float = 2.0  # management API node alarms
    management_timeout: float = 5.0  # longest one management API request may take
    management_connections: int = 4  # pooled keep-alive connections to the management API
    topology_interval: float = 30.0  # management API exchanges/queues/bindings re-sync
    topology_events: bool = True  # consume the broker's topology events when it has them
    fleet: str | None = "default"  # the fleet's name (floodwall/io/fleet.py); None: off
    policy_poll_interval: float = 2.0  # has the policy file changed?
    holding_log_interval: float = 5.0  # repeat the "publishes held" lines this often
    # Telemetry (floodwall/io/telemetry.py; needs ``policies``): None writes none.
    telemetry_dir: Path | None = None
    telemetry_interval: float = 1.0
    telemetry_file_bytes: int = 16 * 1024 * 1024  # rotate past this size ...
    telemetry_file_age: float = 3600.0  # ... or this age (seconds)
    telemetry_total_bytes: int = 256 * 1024 * 1024  # oldest files deleted past this
    # Spool (floodwall/io/spool.py; needs ``policies``): None: ``overflow: spool`` acts as hold.
    spool_dir: Path | None = None
    spool_total_max: int = DEFAULT_TOTAL_MAX  # bytes, all queues
    spool_min_free: int = DEFAULT_MIN_FREE  # bytes left free on the spool's filesystem
    spool_max_message: int = DEFAULT_MAX_MESSAGE  # the broker's max_message_size

    @property
    def effective_management_urls(self) -> tuple[str, ...]:
        """``management_url`` (a comma-separated list: one per node, tried in order), else
        ``http://<node>:15672`` for each upstream node, or ``https://<node>:15671`` when the
        upstream is amqps."""
        if self.management_url:
            return tuple(url.strip() for url in self.management_url.split(",") if url.strip())
        urls = []
        for host, _ in self.upstreams:
            if ":" in host:  # IPv6 literal
                host = f"[{host}]"
            if self.upstream_tls is not None:
                urls.append(f"https://{host}:{DEFAULT_MANAGEMENT_TLS_PORT}")
            else:
                urls.append(f"http://{host}:{DEFAULT_MANAGEMENT_PORT}")
        return tuple(urls)

    @property
    def effective_prometheus_urls(self) -> tuple[str, ...]:
        """``prometheus_url`` (a comma-separated list: each node reports the queues it
        runs), else each management URL's scheme and host on port 15692
        (``DEFAULT_PROMETHEUS_PORT``); none when turned off (``--prometheus off``)."""
        if self.prometheus_url is not None:
            return tuple(url.strip() for url in self.prometheus_url.split(",") if url.strip())
        return tuple(dict.fromkeys(prometheus_url_of(url)
                                   for url in self.effective_management_urls))

    @property
    def effective_management_tls(self) -> ManagementTls:
        """``management_tls``, else one trusting the upstream's CA file (or the system's)."""
        if self.management_tls is not None:
            return self.management_tls
        return ManagementTls(self.upstream_tls.ca if self.upstream_tls is not None else None)

    @property
    def effective_amqp_credentials(self) -> AmqpCredentials:
        if self.amqp_credentials is not None:
            return self.amqp_credentials
        return AmqpCredentials(self.credentials.username, self.credentials.password)


def prometheus_url_of(management_url: str) -> str:
    """The Prometheus endpoint beside a management API: its scheme and host, port 15692."""
    parts = urllib.parse.urlsplit(management_url)
    host = parts.hostname or "localhost"
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{parts.scheme or 'http'}://{host}:{DEFAULT_PROMETHEUS_PORT}"
