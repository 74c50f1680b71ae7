"""A throwaway RabbitMQ node from Debian's package, for the tests, the demo and benchmarks.

Runs the package's own server script as an ordinary process (not the wrapper that switches
user) with every path in a private directory and every port chosen free, so several nodes
can run side by side and nothing is left behind.

``LocalBroker(workdir, tls=BrokerTls(ca, cert, key))`` starts a node that speaks only TLS:
amqps on its AMQP port and https on its management port (no plain listener at all); with
``require_client_cert`` it also wants a client certificate (``fail_if_no_peer_cert``) and
offers SASL EXTERNAL (``rabbitmq_auth_mechanism_ssl``, the user is the certificate's CN).

``LocalBroker(workdir, release=BrokerRelease(root))`` runs the RabbitMQ installed in a Debian
root instead of the host's (``make rabbitmq4-root`` makes one with Debian 13's 4.0): the node
runs chrooted in a private mount namespace of its own, where ``proc``, ``/dev`` and the node's
``workdir`` (at the same path) are mounted. The mounts live and die with the node's processes:
nothing is ever mounted in the host's namespace, so a crash leaves nothing to unmount and any
number of nodes share one root, which is only read.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

SERVER_SCRIPT_CANDIDATES = (
    "/usr/lib/rabbitmq/bin/rabbitmq-server",
    "/usr/lib/rabbitmq/sbin/rabbitmq-server",
)
PLUGINS = ("rabbitmq_management", "rabbitmq_prometheus", "rabbitmq_amqp1_0",
           "rabbitmq_event_exchange")
#: The plugin that offers SASL EXTERNAL (the user is the client certificate's subject).
EXTERNAL_PLUGIN = "rabbitmq_auth_mechanism_ssl"
#: Where the suite, the demo and the benchmarks find the Debian root with RabbitMQ 4
#: (``make rabbitmq4-root`` makes it there); the variable names another.
ROOT_ENV = "FLOODWALL_RABBITMQ4_ROOT"
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "build" / "rabbitmq4-root"
_ROOT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Mounts proc, /dev and the node's directory inside the root, then chroots: run by unshare in
# a mount namespace of the node's own (private propagation), so they vanish with the node.
_IN_ROOT = ('set -e; r="$1"; w="$2"; shift 2; mount -t proc proc "$r/proc"; '
            'mount --rbind /dev "$r/dev"; mkdir -p "$r$w"; mount --bind "$w" "$r$w"; '
            'exec chroot "$r" "$@"')
# RabbitMQ's CLI tools take 35672-35682 for their own distribution ports.
_CLI_PORTS = range(35672, 35683)


class BrokerError(RuntimeError):
    """The broker could not be started or did not become ready."""


#: ``K/N``: this process takes only ports ``P`` with ``P % N == K``. Processes that start
#: brokers side by side (``make test``'s two services streams) each take their own stripe, so
#: a port one has chosen for a broker still booting is never the other's choice.
PORT_STRIPE_ENV = "FLOODWALL_PORT_STRIPE"
#: Ports ``free_port`` hands out: the 12,768 below the kernel's ephemeral range (32768 up by
#: default), which ``bind(("", 0))`` and ``connect`` never take. A broker binds its ports
#: seconds after they were chosen; from the ephemeral range, any socket of any process
#: could take one meanwhile (a management listener refused with eaddrinuse).
_SPAN = 12768
_handed_out: set[int] = set()
_rng = random.Random()  # its own: a test's random.seed() does not make it repeat


def _port_stripe() -> tuple[int, int]:
    text = os.environ.get(PORT_STRIPE_ENV, "")
    if not text:
        return 0, 1
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise BrokerError(f"{PORT_STRIPE_ENV}={text!r}: expected K/N, e.g. 1/2") from None
    if not 0 <= k < n:
        raise BrokerError(f"{PORT_STRIPE_ENV}={text!r}: K must be in 0..N-1")
    return k, n


def port_range() -> range:
    """Where ``free_port`` looks: below the kernel's ephemeral ports, above 1024."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1025, low - _SPAN), low)


def free_port() -> int:
    """A TCP port nothing listens on right now, in ``port_range()`` and this process's
    stripe (``PORT_STRIPE_ENV``), never one this process handed out before, and outside the
    CLI tools' range."""
    k, n = _port_stripe()
    ports = [p for p in port_range() if p % n == k and p not in _CLI_PORTS
             and p + 20000 not in _CLI_PORTS]
    fresh = [p for p in ports if p not in _handed_out]
    if not fresh:  # (a long-lived process: the ports it was given long ago are free again)
        _handed_out.clear()
        fresh = ports
    for _ in range(1000):
        port = _rng.choice(fresh)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise BrokerError(f"no free port in {port_range()} (stripe {k}/{n}) after 1000 tries")


def server_script() -> str:
    """Path of the package's own server script, or a BrokerError saying how to get it."""
    for path in SERVER_SCRIPT_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    raise BrokerError(
        "rabbitmq-server is not installed: `apt-get install rabbitmq-server` "
        "(make test and make demo do this)"
    )


def rabbitmq4_root() -> Path:
    """The Debian root with RabbitMQ 4 (``$FLOODWALL_RABBITMQ4_ROOT`` or build/rabbitmq4-root)."""
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT).resolve()


@dataclass(frozen=True)
class BrokerRelease:
    """Which RabbitMQ a node runs: the host's package (``root`` None) or the one installed
    in a Debian root, run there by chroot in a mount namespace of the node's own."""

    root: Path | None = None

    def lib_dir(self) -> Path:
        """The package's rabbitmq_server-X.Y.Z directory (its name gives the version)."""
        base = Path(str(self.root) + "/usr/lib/rabbitmq/lib") if self.root else Path(
            "/usr/lib/rabbitmq/lib")
        found = sorted(base.glob("rabbitmq_server-*"))
        if not found:
            if self.root is not None:
                raise BrokerError(f"no RabbitMQ in {self.root}: `make rabbitmq4-root "
                                  f"RABBITMQ4_ROOT={self.root}` makes one")
            raise BrokerError("rabbitmq-server is not installed: `apt-get install "
                              "rabbitmq-server` (make test and make demo do this)")
        return found[-1]

    @property
    def full_version(self) -> str:
        """``3.10.8``, ``4.0.5``: from the installed package's directory."""
        return self.lib_dir().name.removeprefix("rabbitmq_server-")

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor): what tests compare where the brokers behave differently."""
        major, minor = self.full_version.split(".")[:2]
        return int(major), int(minor)

    @property
    def name(self) -> str:
        """``rabbitmq3.10``, ``rabbitmq4.0``: the suite's test ids."""
        return "rabbitmq{}.{}".format(*self.version)

    def server_script(self) -> str:
        if self.root is None:
            return server_script()
        script = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        if not os.access(str(self.root) + script, os.X_OK):
            self.lib_dir()  # says how to make the root
            raise BrokerError(f"{self.root}{script} is missing or not executable")
        return script

    def command(self, argv: list[str], workdir: Path, env: dict[str, str]) -> list[str]:
        """``argv`` with ``env``, run by the host or chrooted into the root."""
        if self.root is None:
            return argv
        ensure_epmd()
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_ROOT,
                "sh", str(self.root), str(workdir), "env", "-i", _ROOT_PATH, "LANG=C.UTF-8",
                *(f"{k}={v}" for k, v in env.items()), *argv]

    def forget(self, workdir: Path) -> None:
        """Remove the empty directories that stood for ``workdir`` in the root (never the
        root's own top-level directories such as /tmp)."""
        if self.root is None:
            return
        inside = Path(str(self.root) + str(workdir))
        with contextlib.suppress(OSError):
            while inside.parent != self.root and inside.is_dir() and not any(inside.iterdir()):
                inside.rmdir()
                inside = inside.parent


def ensure_epmd() -> None:
    """Start the host's epmd (Erlang's port mapper, port 4369) if none runs, so that a node
    in a root registers with it rather than leave a daemon of its own running in its mount
    namespace. Nodes of either release share it (the protocol is the same); without the
    host's Erlang the node starts its own, as it would anyway."""
    epmd = shutil.which("epmd")
    if epmd is None:
        return
    with contextlib.suppress(OSError):
        with socket.create_connection(("127.0.0.1", 4369), 1):
            return
    subprocess.run([epmd, "-daemon"], check=False, timeout=10,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


HOST_RELEASE = BrokerRelease()
#: What ``--broker`` / ``BROKER=`` take: the host's package or the root's RabbitMQ 4.
RELEASE_NAMES = ("3.10", "4.0")


def release_named(name: str) -> BrokerRelease:
    """``3.10``: the host's package; ``4.0``: the root (``rabbitmq4_root()``)."""
    if name not in RELEASE_NAMES:
        raise BrokerError(f"broker {name!r}: expected one of {', '.join(RELEASE_NAMES)}")
    return HOST_RELEASE if name == "3.10" else BrokerRelease(rabbitmq4_root())


@dataclass(frozen=True)
class BrokerTls:
    """A broker that speaks only TLS: amqps on its AMQP port, https on its management port.

    ``ca`` signed ``cert`` (the broker's certificate, for ``key``) and is the CA it trusts for
    client certificates. ``require_client_cert``: ``verify_peer`` with
    ``fail_if_no_peer_cert = true`` and the ``rabbitmq_auth_mechanism_ssl`` plugin, so
    EXTERNAL logs a client in as its certificate's common name.
    """

    ca: Path
    cert: Path
    key: Path
    require_client_cert: bool = False

    def config(self, amqp_port: int, management_port: int) -> str:
        lines = [
            "listeners.tcp = none",
            f"listeners.ssl.default = {amqp_port}",
            f"ssl_options.cacertfile = {self.ca}",
            f"ssl_options.certfile = {self.cert}",
            f"ssl_options.keyfile = {self.key}",
            "ssl_options.verify = verify_peer",
            "ssl_options.fail_if_no_peer_cert = "
            + ("true" if self.require_client_cert else "false"),
            f"management.ssl.port = {management_port}",
            "management.ssl.ip = 127.0.0.1",
            f"management.ssl.cacertfile = {self.ca}",
            f"management.ssl.certfile = {self.cert}",
            f"management.ssl.keyfile = {self.key}",
        ]
        if self.require_client_cert:
            lines += ["auth_mechanisms.1 = PLAIN", "auth_mechanisms.2 = AMQPLAIN",
                      "auth_mechanisms.3 = EXTERNAL", "ssl_cert_login_from = common_name"]
        return "\n".join(lines) + "\n"


@dataclass
class BrokerEndpoint:
    """Where a broker listens and how to log in to its management API.

    ``tls_ca``: the broker speaks only TLS (amqps, https) with a certificate from this CA.
    """

    host: str
    amqp_port: int
    management_port: int
    username: str = "guest"
    password: str = "guest"
    tls_ca: Path | None = None
    #: (major, minor) of the RabbitMQ behind it: where the brokers behave differently, a test
    #: branches on this (and says why in a comment).
    version: tuple[int, int] = (3, 10)

    @property
    def management_url(self) -> str:
        scheme = "https" if self.tls_ca is not None else "http"
        return f"{scheme}://{self.host}:{self.management_port}"

    @property
    def upstream(self) -> str:
        """What ``floodwall run --upstream`` takes for this broker."""
        if self.tls_ca is not None:
            return f"amqps://{self.host}:{self.amqp_port}"
        return f"{self.host}:{self.amqp_port}"

    def api(
        self, method: str, path: str, body: object | None = None, timeout: float = 10
    ) -> object:
        """Call the management API; returns decoded JSON (or None for an empty reply)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.management_url + path, data=data, method=method)
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        req.add_header("Content-Type", "application/json")
        context = None
        if self.tls_ca is not None:
            context = ssl.create_default_context(cafile=str(self.tls_ca))
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    @classmethod
    def from_env(cls, value: str) -> BrokerEndpoint:
        """Parse FLOODWALL_TEST_BROKER: ``HOST:AMQP_PORT:MANAGEMENT_PORT[:USER:PASSWORD]``."""
        parts = value.split(":")
        if len(parts) not in (3, 5):
            raise BrokerError(
                f"FLOODWALL_TEST_BROKER={value!r}: expected HOST:AMQP_PORT:MANAGEMENT_PORT"
                "[:USER:PASSWORD]"
            )
        ep = cls(parts[0], int(parts[1]), int(parts[2]))
        if len(parts) == 5:
            ep.username, ep.password = parts[3], parts[4]
        return ep


@dataclass
class LocalBroker:
    """One RabbitMQ node running from ``workdir``; ``start()`` then ``stop()``."""

    workdir: Path
    config_extra: str = ""
    plugins: tuple[str, ...] = PLUGINS
    tls: BrokerTls | None = None  # amqps and https only
    release: BrokerRelease = HOST_RELEASE
    endpoint: BrokerEndpoint = field(init=False)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()  # the node runs with cwd=workdir
        self.endpoint = BrokerEndpoint("127.0.0.1", free_port(), free_port(),
                                       tls_ca=self.tls.ca if self.tls is not None else None,
                                       version=self.release.version)
        self.dist_port = free_port()
        self.prometheus_port = free_port()
        self.nodename = f"floodwall-{self.endpoint.amqp_port}@localhost"

    def _environment(self) -> dict[str, str]:
        """The node's own variables (with the caller's environment for the host's node)."""
        env = dict(os.environ) if self.release.root is None else {}
        w = self.workdir
        env.update(
            HOME=str(w),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_CONFIG_FILE=str(w / "rabbitmq.conf"),
            RABBITMQ_MNESIA_BASE=str(w / "mnesia"),
            RABBITMQ_LOG_BASE=str(w / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(w / "enabled_plugins"),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_PID_FILE=str(w / "rabbit.pid"),
        )
        # Erlang's cookie lives in HOME; a private HOME gets a private cookie.
        return env

    def _tls_inside(self, tls: BrokerTls) -> BrokerTls:
        """``tls`` with its files copied into the node's directory (a node in a root sees
        nothing else of the host)."""
        if self.release.root is None:
            return tls
        directory = self.workdir / "tls"
        directory.mkdir(exist_ok=True)
        for name, path in (("ca.pem", tls.ca), ("cert.pem", tls.cert), ("key.pem", tls.key)):
            shutil.copyfile(path, directory / name)
        return BrokerTls(directory / "ca.pem", directory / "cert.pem", directory / "key.pem",
                         require_client_cert=tls.require_client_cert)

    def start(self, timeout: float = 90.0) -> BrokerEndpoint:
        script = self.release.server_script()
        self.workdir.mkdir(parents=True, exist_ok=True)
        ep = self.endpoint
        if self.tls is None:
            listeners = (f"listeners.tcp.default = {ep.amqp_port}\n"
                         f"management.tcp.port = {ep.management_port}\n"
                         "management.tcp.ip = 127.0.0.1\n")
        else:
            listeners = self._tls_inside(self.tls).config(ep.amqp_port, ep.management_port)
        (self.workdir / "rabbitmq.conf").write_text(
            listeners +
            f"prometheus.tcp.port = {self.prometheus_port}\n"
            "prometheus.tcp.ip = 127.0.0.1\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = info\n" + self.config_extra
        )
        plugins = self.plugins
        if self.tls is not None and self.tls.require_client_cert:
            plugins = (*plugins, EXTERNAL_PLUGIN)
        (self.workdir / "enabled_plugins").write_text("[" + ",".join(plugins) + "].\n")
        out = open(self.workdir / "server.out", "wb")
        env = self._environment()
        self.process = subprocess.Popen(
            self.release.command([script], self.workdir, env),
            cwd=self.workdir,  # crash dumps land here, not in the caller's directory
            env=env if self.release.root is None else None,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # A process group of its own (the faults signal it whole), in the caller's
            # session: the scheduler weighs it with the caller's (``nice``) priority.
            process_group=0,
        )
        out.close()
        self._wait_ready(timeout)
        return self.endpoint

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerError(
                    f"rabbitmq-server exited with {self.process.returncode}; "
                    f"see {self.workdir / 'server.out'} and {self.workdir / 'log'}:\n"
                    + self.output_tail()
                )
            try:
                self.endpoint.api("GET", "/api/overview", timeout=2)
                with socket.create_connection(("127.0.0.1", self.endpoint.amqp_port), 2):
                    return
            except (OSError, urllib.error.URLError) as exc:
                last_error = str(exc)
            time.sleep(0.2)
        self.stop()
        raise BrokerError(
            f"rabbitmq-server not ready after {timeout:.0f}s ({last_error}):\n" + self.output_tail()
        )

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n NODE ARGS`` against this node; its stdout, or a BrokerError.

        The package's own script, not the /usr/sbin wrapper that switches user: the node's
        Erlang cookie is in the private HOME this environment points at.
        """
        script = Path(self.release.server_script()).with_name("rabbitmqctl")
        env = self._environment()
        proc = subprocess.run(
            self.release.command([str(script), "-n", self.nodename, *args], self.workdir, env),
            env=env if self.release.root is None else None, cwd=self.workdir,
            capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise BrokerError(f"rabbitmqctl {' '.join(args)} exited with {proc.returncode}: "
                              + (proc.stderr or proc.stdout).strip()[-2000:])
        return proc.stdout

    def output_tail(self, lines: int = 30) -> str:
        try:
            text = (self.workdir / "server.out").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- faults (the chaos tests) ---------------------------------------------------------
    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            raise BrokerError("the broker is not running")
        os.killpg(self.process.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP the node and everything it started: a hung broker (the kernel still
        completes TCP handshakes on its listening sockets, nothing answers)."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after ``freeze``."""
        self._signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9 the node (and its group): no clean shutdown; ``start()`` brings it back on
        the same ports and data directory (durable queues and persistent messages recover)."""
        proc = self.process
        if proc is None:
            return
        self.process = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the node and every process it started (its own process group)."""
        proc = self.process
        if proc is None:
            self.release.forget(self.workdir)
            return
        self.process = None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # beam may leave children (erl_child_setup, inet_gethost) in the group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.release.forget(self.workdir)

    def remove(self) -> None:
        """kill -9 the node and delete its directory: for a node whose data nobody wants (a
        test's, a benchmark's), where a clean shutdown (10 s and more) would buy nothing."""
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.release.forget(self.workdir)
