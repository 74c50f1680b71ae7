"""The ``floodwall`` command line: every flag has a FLOODWALL_* variable and a config-file key.

The top of the import graph: the one place that runs the proxy (``floodwall.io.app``) and,
lazily, the PySpark pipeline (``floodwall_pipeline``). ``spool`` is ``floodwall spool ...``,
``tls`` the upstream options both share.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from floodwall import __version__
from floodwall.cli.tls import upstream_settings, upstream_tls_options
from floodwall.control.memory import CGROUP_FILES, cgroup_limit, default_budget
from floodwall.control.policy import (
    PolicyError,
    PolicySet,
    Problem,
    Severity,
    format_bytes,
    format_duration,
    load_policies,
    overlaps,
    parse_bytes,
    parse_duration,
    parse_policies,
    policy_document,
    render_policies,
)
from floodwall.ops.config import (
    DEFAULT_ADMIN_MAX_CONNECTIONS,
    DEFAULT_ADMIN_TIMEOUT,
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_HOLD_BUDGET,
    DEFAULT_SPLICE_THRESHOLD,
    AdminLimits,
    AmqpCredentials,
    ConfigError,
    ListenerTls,
    ManagementCredentials,
    ManagementTls,
    ProxySettings,
    TlsVersion,
    UpstreamTls,
    parse_hostport,
    parse_management_urls,
)
from floodwall.ops.logs import setup_logging
from floodwall.spool.manager import DEFAULT_MAX_MESSAGE, DEFAULT_MIN_FREE, DEFAULT_TOTAL_MAX


def _units(parse: Callable[[object], float], example: str, zero_ok: bool = False
           ) -> Callable[[click.Context, click.Parameter, object], Any]:
    """A click callback parsing a value with units (``parse``), refusing <= 0 unless
    ``zero_ok`` (``--drain-timeout 0``: do not wait; ``--spool-min-free 0``)."""

    def callback(ctx: click.Context, param: click.Parameter, value: object) -> Any:
        try:
            parsed = parse(value)
        except ValueError as exc:
            raise click.BadParameter(f"{exc} (e.g. {example})", ctx=ctx, param=param) from None
        if parsed < 0 or (parsed == 0 and not zero_ok):
            raise click.BadParameter(f"{value!r} must be more than 0", ctx=ctx, param=param)
        return parsed

    return callback


_duration = _units(parse_duration, "200ms, 5s, 1m")


def _fleet_name(ctx: click.Context, param: click.Parameter, value: object) -> str | None:
    """--fleet: a name (letters, digits, ``_.-``, at most 64), or ``off`` (None)."""
    text = str(value).strip()
    if text.lower() == "off":
        return None
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", text):
        raise click.BadParameter(f"{text!r}: letters, digits, '_', '.', '-' (at most 64), "
                                 "or off", ctx=ctx, param=param)
    return text

_duration_or_zero = _units(parse_duration, "200ms, 5s, 1m", zero_ok=True)
_size = _units(parse_bytes, "16MiB, 512KiB")
_size_or_zero = _units(parse_bytes, "16MiB, 512KiB", zero_ok=True)


def _load_config_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """--config FILE: its keys (flag names, - or _) become defaults below flags and env vars."""
    if not value:
        return
    try:
        doc = yaml.safe_load(Path(value).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="--config") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise click.BadParameter(f"{value}: expected a mapping of settings", ctx=ctx,
                                 param_hint="--config")
    known = {p.name for p in ctx.command.params if p.name}
    defaults: dict[str, Any] = {}
    for key, val in doc.items():
        name = str(key).replace("-", "_")
        if name not in known or name == "config":
            raise click.BadParameter(
                f"{value}: unknown setting {key!r}; known: "
                + ", ".join(sorted(k for k in known if k != "config")),
                ctx=ctx, param_hint="--config")
        defaults[name] = val
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="floodwall")
def main() -> None:
    """floodwall: per-queue producer flow control for AMQP brokers, as a sidecar proxy."""


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), is_eager=True,
              expose_value=False, callback=_load_config_file, envvar="FLOODWALL_CONFIG",
              help="YAML file of settings (keys are these flags' names).")
@click.option("--listen", default="0.0.0.0:5673", show_default=True, envvar="FLOODWALL_LISTEN",
              help="Where clients connect (AMQP 0-9-1 and 1.0 on one port); 'off' for none "
                   "(then --listen-tls).")
@click.option("--listen-tls", default=None, metavar="HOST:PORT", envvar="FLOODWALL_LISTEN_TLS",
              help="A TLS listener (0-9-1 and 1.0 on one port) beside --listen; needs "
                   "--listen-tls-cert and --listen-tls-key.")
@click.option("--listen-tls-cert", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_LISTEN_TLS_CERT",
              help="The TLS listener's certificate (PEM, chain); re-read when it changes.")
@click.option("--listen-tls-key", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_LISTEN_TLS_KEY",
              help="Its private key (PEM, unencrypted); re-read when it changes.")
@click.option("--listen-tls-client-ca", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_LISTEN_TLS_CLIENT_CA",
              help="Require client certificates issued by this CA (PEM) on the TLS listener.")
@click.option("--listen-tls-min-version", type=click.Choice([v.value for v in TlsVersion]),
              default="1.2", show_default=True, envvar="FLOODWALL_LISTEN_TLS_MIN_VERSION",
              help="Lowest TLS version the TLS listener accepts.")
@click.option("--upstream", default="127.0.0.1:5672", show_default=True,
              envvar="FLOODWALL_UPSTREAM",
              help="The broker: HOST:PORT or amqp://HOST[:PORT] (plain), amqps://HOST[:PORT] "
                   "(TLS, port 5671 by default); a cluster's nodes as a comma-separated "
                   "list (connections go to the first that answers; a DNS name's every "
                   "address is a node).")
@click.option("--upstream-probe-interval", default="5s", callback=_duration,
              metavar="DURATION", show_default=True, envvar="FLOODWALL_UPSTREAM_PROBE_INTERVAL",
              help="How often every node is sent the AMQP header (readiness): a node that "
                   "stops answering is left, and the connections on it ended, within this "
                   "+ 3 s; one that answers again takes new connections again within this.")
@upstream_tls_options
@click.option("--upstream-tls-relay-external", is_flag=True, default=False,
              envvar="FLOODWALL_UPSTREAM_TLS_RELAY_EXTERNAL",
              help="Let clients log in with SASL EXTERNAL through the proxy. They are then "
                   "logged in as the proxy's certificate (--upstream-tls-cert), not their "
                   "own: off, EXTERNAL is refused.")
@click.option("--admin", default="127.0.0.1:9090", show_default=True, envvar="FLOODWALL_ADMIN",
              help="HTTP endpoint for /metrics /healthz /readyz /state; 'off' to disable.")
@click.option("--admin-max-connections", type=click.IntRange(1, 1024),
              default=DEFAULT_ADMIN_MAX_CONNECTIONS, show_default=True,
              envvar="FLOODWALL_ADMIN_MAX_CONNECTIONS",
              help="Admin connections served at once; one more is answered 503 at once.")
@click.option("--admin-timeout", default=format_duration(DEFAULT_ADMIN_TIMEOUT),
              callback=_duration, metavar="DURATION", show_default=True,
              envvar="FLOODWALL_ADMIN_TIMEOUT",
              help="How long an admin client may take to send its request, and again to "
                   "take the answer, before it is cut off.")
@click.option("--management", default=None, envvar="FLOODWALL_MANAGEMENT",
              help="The broker's management API URL, or each node's, comma-separated (tried in "
                   "order), without a login (credentials from "
                   "FLOODWALL_MANAGEMENT_USERNAME / _PASSWORD / _PASSWORD_FILE); default "
                   "http://<upstream host>:15672 (https://<upstream host>:15671 with an "
                   "amqps upstream) when --policies is given.")
@click.option("--prometheus", default=None, envvar="FLOODWALL_PROMETHEUS",
              help="The broker's Prometheus endpoints (comma-separated, one per node: each "
                   "reports the queues it runs), read for queue depth when the management API "
                   "has no figures (statistics off) or does not answer in time (a cluster "
                   "with a hung node); default: each management URL's scheme and host on "
                   "port 15692; 'off' never reads them.")
@click.option("--management-tls-ca", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_MANAGEMENT_TLS_CA",
              help="CA file (PEM) for an https management URL; default: --upstream-tls-ca, "
                   "else the system's trust store.")
@click.option("--management-tls-cert", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_MANAGEMENT_TLS_CERT",
              help="Client certificate (PEM) for the management API, if it asks for one.")
@click.option("--management-tls-key", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_MANAGEMENT_TLS_KEY", help="Its private key (PEM).")
@click.option("--policies", type=click.Path(dir_okay=False), default=None,
              envvar="FLOODWALL_POLICIES",
              help="YAML policies file; a bad one refuses to start. Reloaded on SIGHUP and "
                   "when it changes.")
@click.option("--shadow", is_flag=True, default=False, envvar="FLOODWALL_SHADOW",
              help="Shadow mode for every policy: trips and what the proxy would do are "
                   "logged, counted (floodwall_shadow_*) and written to the telemetry, but "
                   "every frame passes untouched.")
@click.option("--depth-interval", default="200ms", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_DEPTH_INTERVAL",
              help="How often each policed queue's ready count is read (passive declare).")
@click.option("--hot-interval", default="5ms", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_HOT_INTERVAL",
              help="Least time between two ready counts of a hot queue (held, or predicted "
                   "to fill before the next --depth-interval): counted back to back, one "
                   "passive declare in flight, at most one per this interval. Longer costs "
                   "the broker less and lets a consumer that stops dead leave its queue "
                   "further over capacity (docs/design/pace.md, \"Bounds\").")
@click.option("--management-interval", default="5s", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_MANAGEMENT_INTERVAL",
              help="How often each policed queue is sampled from the management API.")
@click.option("--topology-interval", default="30s", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_TOPOLOGY_INTERVAL",
              help="How often the routing model is checked against the management API's full "
                   "listing (the safety net under the broker's topology events and lookups).")
@click.option("--topology-events", type=click.Choice(["on", "off"]), default="on",
              show_default=True, envvar="FLOODWALL_TOPOLOGY_EVENTS",
              help="Follow the broker's topology events (amq.rabbitmq.event, the "
                   "rabbitmq_event_exchange plugin) when it has them.")
@click.option("--fleet", default="default", metavar="NAME|off", show_default=True,
              envvar="FLOODWALL_FLEET", callback=_fleet_name,
              help="Sidecars on the same broker with the same fleet name find each other "
                   "through it (an exchange floodwall.fleet.NAME per policed vhost) and show "
                   "each other's demand and shares; off: none of it runs.")
@click.option("--alarm-interval", default="2s", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_ALARM_INTERVAL",
              help="How often the management API is asked for the broker's memory and disk "
                   "alarms.")
@click.option("--management-timeout", default="5s", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_MANAGEMENT_TIMEOUT",
              help="Longest one management API request may take (connecting included).")
@click.option("--management-connections", type=click.IntRange(1, 64), default=4,
              show_default=True, envvar="FLOODWALL_MANAGEMENT_CONNECTIONS",
              help="Keep-alive connections pooled to the management API: requests in flight "
                   "at most.")
@click.option("--hold-budget", default=format_bytes(DEFAULT_HOLD_BUDGET), callback=_size,
              metavar="SIZE", show_default=True, envvar="FLOODWALL_HOLD_BUDGET",
              help="Bytes of held publishes per connection before the proxy stops reading it.")
@click.option("--splice-threshold", default=format_bytes(DEFAULT_SPLICE_THRESHOLD),
              callback=_size_or_zero, metavar="SIZE", show_default=True,
              envvar="FLOODWALL_SPLICE_THRESHOLD",
              help="AMQP 0-9-1 body bytes of one frame still to come from which they move "
                   "socket to socket with splice(2), never read by the proxy (plain TCP on "
                   "both sides, Linux). 0: off, bodies are copied.")
@click.option("--memory-budget", default="auto", metavar="SIZE", show_default=True,
              envvar="FLOODWALL_MEMORY_BUDGET",
              help="Bytes of held publishes of all connections together; at it the proxy "
                   "stops reading the connections that hold publishes. auto: a third of the "
                   "container's memory limit (cgroup), else 96MiB.")
@click.option("--telemetry-dir", type=click.Path(file_okay=False), default=None,
              envvar="FLOODWALL_TELEMETRY_DIR",
              help="Write telemetry (NDJSON, docs/telemetry.md) here; needs --policies.")
@click.option("--telemetry-interval", default="1s", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_TELEMETRY_INTERVAL",
              help="How often each policed queue is sampled into the telemetry.")
@click.option("--telemetry-file-size", default="16MiB", callback=_size, metavar="SIZE",
              show_default=True, envvar="FLOODWALL_TELEMETRY_FILE_SIZE",
              help="Start a new telemetry file past this size ...")
@click.option("--telemetry-file-age", default="1h", callback=_duration, metavar="DURATION",
              show_default=True, envvar="FLOODWALL_TELEMETRY_FILE_AGE",
              help="... or this age.")
@click.option("--telemetry-max-total", default="256MiB", callback=_size, metavar="SIZE",
              show_default=True, envvar="FLOODWALL_TELEMETRY_MAX_TOTAL",
              help="Delete the oldest telemetry files past this total.")
@click.option("--spool-dir", type=click.Path(file_okay=False), default=None,
              envvar="FLOODWALL_SPOOL_DIR",
              help="Where overflow: spool writes (needs --policies); without it spool acts "
                   "as hold. `floodwall spool` inspects it.")
@click.option("--spool-total-max", default=format_bytes(DEFAULT_TOTAL_MAX), callback=_size,
              metavar="SIZE", show_default=True, envvar="FLOODWALL_SPOOL_TOTAL_MAX",
              help="Most bytes the spool holds, all queues (policies set each queue's).")
@click.option("--spool-min-free", default=format_bytes(DEFAULT_MIN_FREE),
              callback=_size_or_zero, metavar="SIZE", show_default=True,
              envvar="FLOODWALL_SPOOL_MIN_FREE",
              help="The spool takes no more when its filesystem has less free than this.")
@click.option("--spool-max-message", default=format_bytes(DEFAULT_MAX_MESSAGE), callback=_size,
              metavar="SIZE", show_default=True, envvar="FLOODWALL_SPOOL_MAX_MESSAGE",
              help="The broker's max_message_size (RabbitMQ 4's default; 3.x: 128MiB): a "
                   "larger message is held, not spooled, and the broker refuses it itself.")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True,
              envvar="FLOODWALL_CONNECT_TIMEOUT", help="Seconds to reach the broker.")
@click.option("--handshake-timeout", type=float, default=10.0, show_default=True,
              envvar="FLOODWALL_HANDSHAKE_TIMEOUT",
              help="Seconds a client has to send its protocol header.")
@click.option("--drain-timeout", default=format_duration(DEFAULT_DRAIN_TIMEOUT),
              callback=_duration_or_zero, metavar="DURATION", show_default=True,
              envvar="FLOODWALL_DRAIN_TIMEOUT",
              help="On SIGTERM: stop accepting, then wait this long for connections to "
                   "finish (held publishes keep being released) before closing the rest.")
@click.option("--event-loop", type=click.Choice(["auto", "uvloop", "asyncio"]), default="auto",
              show_default=True, envvar="FLOODWALL_EVENT_LOOP")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True, envvar="FLOODWALL_LOG_LEVEL")
@click.option("--log-format", type=click.Choice(["logfmt", "json"]), default="logfmt",
              show_default=True, envvar="FLOODWALL_LOG_FORMAT")
def run(listen: str, listen_tls: str | None, listen_tls_cert: str | None,
        listen_tls_key: str | None, listen_tls_client_ca: str | None, listen_tls_min_version: str,
        upstream: str, upstream_probe_interval: float, upstream_tls_relay_external: bool,
        admin: str,
        admin_max_connections: int, admin_timeout: float, management: str | None,
        prometheus: str | None, management_tls_ca: str | None, management_tls_cert: str | None,
        management_tls_key: str | None, policies: str | None, shadow: bool, depth_interval: float,
        hot_interval: float, management_interval: float, topology_interval: float,
        topology_events: str, fleet: str | None, alarm_interval: float, management_timeout: float,
        management_connections: int, hold_budget: int, splice_threshold: int,
        memory_budget: str,
        telemetry_dir: str | None, telemetry_interval: float, telemetry_file_size: int,
        telemetry_file_age: float, telemetry_max_total: int, spool_dir: str | None,
        spool_total_max: int, spool_min_free: int, spool_max_message: int,
        connect_timeout: float, handshake_timeout: float, drain_timeout: float,
        event_loop: str, log_level: str, log_format: str, **upstream_tls_options: Any) -> None:
    """Relay AMQP between clients and the broker, policing queues by the policies."""
    setup_logging(log_level, log_format)
    try:
        credentials = ManagementCredentials.from_environment()
        upstream_nodes, upstream_tls = upstream_settings(
            upstream, relay_external=upstream_tls_relay_external, **upstream_tls_options)
        plain_listener, tls_listener, listener_tls = _listeners(
            listen, listen_tls, listen_tls_cert, listen_tls_key, listen_tls_client_ca,
            listen_tls_min_version)
        management_tls = _management_tls(management_tls_ca, management_tls_cert,
                                         management_tls_key, upstream_tls)
        admin_at = None if admin.lower() == "off" else parse_hostport(admin, "--admin", "127.0.0.1")
        budget, budget_source = _memory_budget(memory_budget)
        settings = ProxySettings(
            listen=plain_listener, upstreams=upstream_nodes, admin=admin_at, shadow=shadow,
            upstream_probe_interval=upstream_probe_interval,
            admin_limits=AdminLimits(admin_max_connections, admin_timeout),
            management_url=parse_management_urls(management) if management else None,
            prometheus_url=_prometheus_setting(prometheus),
            upstream_tls=upstream_tls, listen_tls=tls_listener, listener_tls=listener_tls,
            management_tls=management_tls, credentials=credentials,
            amqp_credentials=AmqpCredentials.from_environment(fallback=credentials),
            policies=Path(policies) if policies else None, depth_interval=depth_interval,
            hot_interval=hot_interval, management_interval=management_interval,
            topology_interval=topology_interval, topology_events=topology_events == "on",
            fleet=fleet, alarm_interval=alarm_interval, management_timeout=management_timeout,
            hold_budget=hold_budget, management_connections=management_connections,
            splice_threshold=splice_threshold,
            memory_budget=budget, memory_budget_source=budget_source,
            telemetry_dir=Path(telemetry_dir) if telemetry_dir else None,
            telemetry_interval=telemetry_interval, telemetry_file_bytes=telemetry_file_size,
            telemetry_file_age=telemetry_file_age, telemetry_total_bytes=telemetry_max_total,
            spool_dir=Path(spool_dir) if spool_dir else None, spool_total_max=spool_total_max,
            spool_min_free=spool_min_free, spool_max_message=spool_max_message,
            connect_timeout=connect_timeout, handshake_timeout=handshake_timeout,
            drain_timeout=drain_timeout, event_loop=event_loop)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if telemetry_max_total < telemetry_file_size:
        raise click.UsageError("--telemetry-max-total must be at least --telemetry-file-size")
    _run(settings)


def _memory_budget(value: str) -> tuple[int, str]:
    """--memory-budget: a size, or ``auto`` (from the cgroup memory limit when there is one);
    the bytes and where they came from (for the start-up line)."""
    if value.strip().lower() != "auto":
        try:
            size = int(parse_bytes(value))
        except ValueError as exc:
            raise ConfigError(f"--memory-budget: {exc} (e.g. 96MiB, or auto)") from None
        if size <= 0:
            raise ConfigError(f"--memory-budget: {value!r} must be more than 0")
        return size, "--memory-budget"
    for path in CGROUP_FILES:
        try:
            limit = cgroup_limit(path.read_text())
        except OSError:
            continue
        if limit is not None:
            return default_budget(limit), f"a third of the cgroup memory limit ({path}: " \
                                          f"{format_bytes(limit)})"
    return default_budget(None), "no cgroup memory limit: the fixed default"


def _listeners(listen: str, listen_tls: str | None, cert: str | None, key: str | None,
               client_ca: str | None, min_version: str
               ) -> tuple[tuple[str, int] | None, tuple[str, int] | None, ListenerTls | None]:
    """--listen and --listen-tls: the plain address (None: off), the TLS one, its TLS."""
    plain = None if listen.strip().lower() == "off" else parse_hostport(listen, "--listen")
    tls_listener = parse_hostport(listen_tls, "--listen-tls") if listen_tls else None
    listener_tls = None
    if tls_listener is not None:
        listener_tls = ListenerTls.checked(
            Path(cert) if cert else None, Path(key) if key else None,
            Path(client_ca) if client_ca else None,
            TlsVersion.parse(min_version, "--listen-tls-min-version"))
    elif cert or key or client_ca:
        raise ConfigError("--listen-tls-cert/-key/-client-ca given without --listen-tls "
                          "HOST:PORT")
    if plain is None and tls_listener is None:
        raise ConfigError("--listen off needs --listen-tls: clients must connect somewhere")
    return plain, tls_listener, listener_tls


def _prometheus_setting(value: str | None) -> str | None:
    """--prometheus: None (the default, beside the management API), "" for 'off', or URLs."""
    if value is None:
        return None
    return "" if value.lower() == "off" else value


def _management_tls(ca: str | None, cert: str | None, key: str | None,
                    upstream_tls: UpstreamTls | None) -> ManagementTls | None:
    """--management-tls-*: the upstream's CA unless one is given; None without any."""
    if not (ca or cert or key):
        return None
    return ManagementTls.checked(
        Path(ca) if ca else (upstream_tls.ca if upstream_tls is not None else None),
        Path(cert) if cert else None, Path(key) if key else None)


def _run(settings: ProxySettings) -> None:
    """Run the proxy; a file it cannot use (policies, spool dir, TLS) refuses the start."""
    from floodwall.io.app import run_proxy
    from floodwall.spool.log import SpoolError

    try:
        run_proxy(settings)
    except (PolicyError, SpoolError, ConfigError) as exc:  # policies, spool dir, TLS files
        click.echo(f"floodwall: refusing to start: {exc}", err=True)
        raise SystemExit(1) from None


@dataclass(frozen=True)
class CheckedFile:
    """What ``floodwall check`` found in one file."""

    source: str
    policies: PolicySet | None  # None: refused
    errors: tuple[Problem, ...]
    warnings: tuple[Problem, ...]


def check_file(path: str) -> CheckedFile:
    """Every error of a policies file (``-``: standard input) and, if it loads, the
    warnings about policies that are shadowed or overlap."""
    try:
        if path == "-":
            policies = parse_policies(sys.stdin.read(), "<stdin>")
        else:
            policies = load_policies(path)
    except PolicyError as exc:
        return CheckedFile("<stdin>" if path == "-" else path, None, exc.problems, ())
    warnings = tuple(Problem(policies.source, o.later.line, o.later.column, o.reason(),
                             Severity.WARNING) for o in overlaps(policies))
    return CheckedFile(policies.source, policies, (), warnings)


@main.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--queue", "queues", multiple=True, metavar="QUEUE",
              help="Also say which policy polices this queue (repeatable).")
@click.option("--vhost", default="/", show_default=True, help="The vhost of --queue.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="text: the effective policies on stdout, problems on stderr; json: one "
                   "document with both.")
def check(files: tuple[str, ...], queues: tuple[str, ...], vhost: str, output: str) -> None:
    """Validate policy FILEs ('-': standard input) and print the effective policies.

    Every error is reported in one run, as FILE:LINE:COLUMN: reason (YAML syntax errors
    too), and warnings for policies that can never match (shadowed by an earlier one) or
    that overlap an earlier one. Exit 1 if any file has an error; warnings do not fail.
    """
    checked = [check_file(path) for path in files]
    failed = any(c.errors for c in checked)
    if output == "json":
        click.echo(json.dumps({"valid": not failed,
                               "files": [_check_document(c, queues, vhost) for c in checked]},
                              indent=2))
    else:
        for c in checked:
            for problem in (*c.errors, *c.warnings):
                click.echo(str(problem), err=True)
            if c.policies is None:
                continue
            click.echo(render_policies(c.policies), nl=False)
            for queue in queues:
                found = c.policies.for_queue(vhost, queue)
                verdict = f"policy {found.name!r}" if found is not None else "not policed"
                click.echo(f"# queue {queue!r} in vhost {vhost!r}: {verdict}")
    if failed:
        raise SystemExit(1)


def _check_document(c: CheckedFile, queues: tuple[str, ...], vhost: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "file": c.source, "valid": not c.errors,
        "errors": [p.as_dict() for p in c.errors],
        "warnings": [p.as_dict() for p in c.warnings],
        "policies": None, "defaults": None, "queues": [],
    }
    if c.policies is not None:
        doc["policies"] = [policy_document(p) for p in c.policies.policies]
        doc["defaults"] = [policy_document(d) for d in c.policies.defaults.values()]
        for queue in queues:
            found = c.policies.for_queue(vhost, queue)
            doc["queues"].append({"vhost": vhost, "queue": queue,
                                  "policy": found.name if found is not None else None})
    return doc


@main.command()
@click.argument("telemetry", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Directory for report.html, plots/, recommended-policies.yaml, "
                   "summary.json.")
@click.option("--master", default=None, envvar="FLOODWALL_SPARK_MASTER",
              help="Spark master URL (spark://host:7077, yarn, k8s://...); default local[*].")
@click.option("--resolution", default="5s", callback=_duration, metavar="DURATION",
              show_default=True, help="Time buckets of the report's plots (not of the "
                                      "figures or recommendations).")
@click.option("--target-drain", default="30s", callback=_duration, metavar="DURATION",
              show_default=True,
              help="Recommended capacity empties in this long at the observed drain rate.")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
              help="More Spark settings (repeatable), e.g. for s3a:// credentials.")
@click.option("--since", default=None, metavar="UTC",
              help="Only records from then on (2026-11-21 or 2026-11-21T06:00).")
@click.option("--until", default=None, metavar="UTC",
              help="Only records before then; with --since, only the files needed are read.")
@click.option("--what-if", "what_if", multiple=True, metavar="CANDIDATE.yaml",
              help="Replay the telemetry through this policy file (repeatable): "
                   "what-if.json and a report section per file.")
def analyze(telemetry: tuple[str, ...], out: str, master: str | None, resolution: float,
            target_drain: float, confs: tuple[str, ...], since: str | None,
            until: str | None, what_if: tuple[str, ...]) -> None:
    """Turn TELEMETRY (files or directories, local or s3a://) into a report and policies.

    A PySpark job (the [pipeline] extra): docs/pipeline.md says what it computes and how it
    runs on a cluster.
    """
    conf: dict[str, str] = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        conf[key] = value
    try:
        from floodwall_pipeline.cli import run_analysis
    except ImportError as exc:
        raise click.ClickException(f"the analysis needs the [pipeline] extra "
                                   f"(pip install 'floodwall[pipeline]'): {exc}") from None
    code = run_analysis(list(telemetry), Path(out), master=master, resolution=resolution,
                        target_drain=target_drain, conf=conf, since=since, until=until,
                        what_if=list(what_if))
    raise SystemExit(code)


# `floodwall spool ...` lives in floodwall/cli/spool.py (registered here).
from floodwall.cli.spool import spool as _spool_group  # noqa: E402

main.add_command(_spool_group)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
