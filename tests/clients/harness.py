"""Drive real non-Python AMQP clients from pytest: each runs as a subprocess that prints one
JSON object a line on stdout, read by a thread into ``ForeignClient.events``.

Programs (see their headers for arguments and events):
- ``java/FloodProducer.java``: RabbitMQ Java client 5.0 (Debian's librabbitmq-client-java),
  compiled once per session with javac; reports Channel.Flow and the time basicPublish spent
  blocked on it.
- ``node/producer.js``: amqplib (AMQP 0-9-1).
- ``node/rhea_send.js``, ``node/rhea_receive.js``: rhea (AMQP 1.0).
- ``go/producer.go``: amqp091-go 1.5 (Debian's golang-github-rabbitmq-amqp091-go-dev), built
  once per session with Debian's Go without modules (``GO111MODULE=off
  GOPATH=/usr/share/gocode``).
- ``ruby/producer.rb``: Bunny 2.19 (ruby-bunny).
- ``php/producer.php``: php-amqplib 3.5 (php-amqplib, php-cli).
- ``c/producer.c``: rabbitmq-c 0.11 (librabbitmq-dev), built once per session with gcc.

The 0-9-1 producers take the same arguments (HOST PORT QUEUE COUNT RATE BODY_SIZE [confirm]),
send the same bodies and report the same events (ready, progress, flow where the client
lets a program see Channel.Flow, error, done).

``make deps`` installs the toolchains (JDK, the jars, node, npm, Go, Ruby, PHP, gcc and the
client packages) and runs ``npm ci`` in ``node/``. ``ToolchainMissing`` says what is absent;
the fixtures turn it into a skip, or a failure on CI, where ``make test`` has installed
everything.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JAVA_SOURCE = HERE / "java" / "FloodProducer.java"
JAVA_MAIN_CLASS = "FloodProducer"
NODE_DIR = HERE / "node"
NODE_PACKAGES = ("amqplib", "rhea")
GO_SOURCE = HERE / "go" / "producer.go"
GO_PATH = Path("/usr/share/gocode")  # Debian's golang-*-dev packages put their sources here
GO_CLIENT = GO_PATH / "src" / "github.com" / "rabbitmq" / "amqp091-go"
C_SOURCE = HERE / "c" / "producer.c"
C_HEADER = Path("/usr/include/amqp.h")
RUBY_SCRIPT = HERE / "ruby" / "producer.rb"
PHP_SCRIPT = HERE / "php" / "producer.php"
PHP_CLIENT = Path("/usr/share/php/PhpAmqpLib/autoload.php")

# Debian's librabbitmq-client-java puts the client at /usr/share/java/amqp-client.jar; it
# needs slf4j-api (libslf4j-java, a dependency of the package); slf4j-nop keeps SLF4J quiet.
JAR_DIRS = (Path("/usr/share/java"),)
JAVA_JARS = ("amqp-client.jar", "slf4j-api.jar", "slf4j-nop.jar")
JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")

Event = dict[str, Any]


class ToolchainMissing(RuntimeError):
    """A client's toolchain or library is not installed (``make deps`` installs it)."""


class ForeignClientError(AssertionError):
    """A foreign client did not do what the test waited for; the message has its output."""


# --- toolchains ----------------------------------------------------------------------------

def _which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolchainMissing(f"`{name}` is not installed (make deps installs it)")
    return path


def java_jars() -> list[Path]:
    """The jars FloodProducer needs on its classpath, or ToolchainMissing."""
    found = []
    for jar in JAVA_JARS:
        for folder in JAR_DIRS:
            if (folder / jar).is_file():
                found.append(folder / jar)
                break
        else:
            raise ToolchainMissing(
                f"{jar} not found in {', '.join(map(str, JAR_DIRS))}: apt-get install "
                "librabbitmq-client-java libslf4j-java (make deps does)")
    return found


@dataclass(frozen=True)
class JavaProgram:
    """FloodProducer compiled into ``classes``; ``command(args)`` is what runs it."""

    java: str
    classes: Path
    jars: tuple[Path, ...]

    @property
    def classpath(self) -> str:
        return os.pathsep.join([str(self.classes), *map(str, self.jars)])

    def command(self, args: Sequence[object]) -> list[str]:
        return [self.java, *JVM_OPTIONS, "-cp", self.classpath, JAVA_MAIN_CLASS,
                *map(str, args)]


_compiled: dict[tuple[str, Path], JavaProgram] = {}
_compile_lock = threading.Lock()


def compile_java(build_root: Path) -> JavaProgram:
    """Compile FloodProducer.java with javac under ``build_root`` (once per source version).

    Cached in this process and on disk: ``build_root/<hash of the source>/`` is reused when
    it already holds the class.
    """
    javac = _which("javac")
    java = _which("java")
    jars = tuple(java_jars())
    source = JAVA_SOURCE.read_bytes()
    digest = hashlib.sha256(source + "\0".join(map(str, jars)).encode()).hexdigest()[:16]
    key = (digest, build_root.resolve())
    with _compile_lock:
        if key in _compiled:
            return _compiled[key]
        classes = build_root / digest
        if not (classes / f"{JAVA_MAIN_CLASS}.class").is_file():
            tmp = build_root / f"{digest}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            result = subprocess.run(
                [javac, "-nowarn", "-encoding", "UTF-8", "-cp",
                 os.pathsep.join(map(str, jars)), "-d", str(tmp), str(JAVA_SOURCE)],
                capture_output=True, text=True, timeout=300, check=False)
            if result.returncode != 0:
                raise RuntimeError(f"javac failed ({result.returncode}):\n"
                                   f"{result.stdout}{result.stderr}")
            shutil.rmtree(classes, ignore_errors=True)
            tmp.rename(classes)
        program = JavaProgram(java, classes, jars)
        _compiled[key] = program
        return program


@dataclass(frozen=True)
class BuiltProgram:
    """A client program compiled once per session; ``command(args)`` is what runs it."""

    binary: Path

    def command(self, args: Sequence[object]) -> list[str]:
        return [str(self.binary), *map(str, args)]


_built: dict[tuple[str, Path], BuiltProgram] = {}


def _build_once(source: Path, build_root: Path, tool: str,
                build: Callable[[Path, Path], list[str]], env: Mapping[str, str]) -> BuiltProgram:
    """Build ``source`` into ``build_root/<hash of source and tool>/`` with the command
    ``build(tmp_dir, output)`` (once: reused in this process and from disk)."""
    digest = hashlib.sha256(source.read_bytes() + tool.encode()).hexdigest()[:16]
    key = (digest, build_root.resolve())
    with _compile_lock:
        if key in _built:
            return _built[key]
        folder = build_root / digest
        binary = folder / source.stem
        if not binary.is_file():
            tmp = build_root / f"{digest}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            result = subprocess.run(build(tmp, tmp / source.stem), capture_output=True,
                                    text=True, timeout=600, check=False,
                                    env={**os.environ, **env}, cwd=tmp)
            if result.returncode != 0:
                raise RuntimeError(f"building {source.name} failed ({result.returncode}):\n"
                                   f"{result.stdout}{result.stderr}")
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        program = BuiltProgram(binary)
        _built[key] = program
        return program


def build_go(build_root: Path) -> BuiltProgram:
    """go/producer.go built with Debian's Go and amqp091-go, without modules."""
    go = _which("go")
    if not GO_CLIENT.is_dir():
        raise ToolchainMissing(f"amqp091-go is not in {GO_CLIENT}: apt-get install "
                               "golang-github-rabbitmq-amqp091-go-dev (make deps does)")
    version = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60,
                             check=False).stdout.strip()
    env = {"GO111MODULE": "off", "GOPATH": str(GO_PATH), "GOFLAGS": "",
           "GOCACHE": str(build_root / "go-cache")}
    return _build_once(GO_SOURCE, build_root, version,
                       lambda _tmp, out: [go, "build", "-o", str(out), str(GO_SOURCE)], env)


def build_c(build_root: Path) -> BuiltProgram:
    """c/producer.c built with gcc against rabbitmq-c."""
    gcc = _which("gcc")
    if not C_HEADER.is_file():
        raise ToolchainMissing(f"{C_HEADER} is missing: apt-get install librabbitmq-dev "
                               "(make deps does)")
    return _build_once(C_SOURCE, build_root, gcc,
                       lambda _tmp, out: [gcc, "-O2", "-Wall", "-Werror", "-o", str(out),
                                          str(C_SOURCE), "-lrabbitmq"], {})


@functools.cache
def ruby_binary() -> str:
    """Path of ``ruby`` once Bunny loads, or ToolchainMissing."""
    ruby = _which("ruby")
    loads = subprocess.run([ruby, "-e", "require 'bunny'"], capture_output=True, text=True,
                           timeout=60, check=False)
    if loads.returncode != 0:
        raise ToolchainMissing("Bunny does not load (`ruby -e \"require 'bunny'\"`: "
                               f"{loads.stderr.strip()[:200]}): apt-get install ruby-bunny "
                               "(make deps does)")
    return ruby


def php_binary() -> str:
    """Path of ``php`` once php-amqplib is installed, or ToolchainMissing."""
    php = _which("php")
    if not PHP_CLIENT.is_file():
        raise ToolchainMissing(f"{PHP_CLIENT} is missing: apt-get install php-amqplib "
                               "(make deps does)")
    return php


def node_binary() -> str:
    """Path of ``node`` once node and the npm packages are installed, or ToolchainMissing."""
    node = _which("node")
    for package in NODE_PACKAGES:
        if not (NODE_DIR / "node_modules" / package / "package.json").is_file():
            raise ToolchainMissing(
                f"npm package {package} is not installed in {NODE_DIR}/node_modules: "
                "make deps (npm ci) installs it")
    return node


def node_command(script: str, args: Sequence[object]) -> list[str]:
    return [node_binary(), str(NODE_DIR / script), *map(str, args)]


def _named(name: str) -> Callable[[Event], bool]:
    return lambda event: event.get("event") == name


# --- one running client --------------------------------------------------------------------

class ForeignClient:
    """One client program running as a subprocess; its JSON lines arrive in ``events``.

    Lines that are not JSON objects arrive as ``{"event": "raw", "line": ...}``. Every event
    also gets ``_rx``: the local time.monotonic() when the harness read it.
    """

    def __init__(self, name: str, argv: Sequence[str], process: subprocess.Popen[str]) -> None:
        self.name = name
        self.argv = list(argv)
        self.process = process
        self.events: list[Event] = []
        self.stderr_lines: collections.deque[str] = collections.deque(maxlen=400)
        self._cond = threading.Condition()
        self._stdout_done = False
        self._threads = [
            threading.Thread(target=self._read_stdout, name=f"{name}-stdout", daemon=True),
            threading.Thread(target=self._read_stderr, name=f"{name}-stderr", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def start(cls, argv: Sequence[str], *, name: str | None = None, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> ForeignClient:
        """Start ``argv`` with stdout and stderr piped, in a process group of its own (in
        the caller's session, so it shares the caller's ``nice`` priority)."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
            bufsize=1, cwd=cwd, env=full_env, process_group=0)
        return cls(name or Path(argv[0]).name, argv, process)

    # reader threads
    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                event = {"event": "raw", "line": line}
            event["_rx"] = time.monotonic()
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._stdout_done = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    # queries
    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def of(self, name: str) -> list[Event]:
        """Every event called ``name`` so far."""
        with self._cond:
            return [e for e in self.events if e.get("event") == name]

    def last(self, name: str) -> Event | None:
        """The latest event called ``name``, or None."""
        found = self.of(name)
        return found[-1] if found else None

    def describe(self, events: int = 15, stderr: int = 30) -> str:
        """The command, exit code, the last events and the last stderr lines."""
        with self._cond:
            tail = self.events[-events:]
        lines = [f"{self.name}: {' '.join(self.argv)}",
                 f"  exit code: {self.returncode}",
                 f"  last {len(tail)} of {len(self.events)} events:"]
        lines += [f"    {json.dumps({k: v for k, v in e.items() if k != '_rx'})}"
                  for e in tail]
        err = list(self.stderr_lines)[-stderr:]
        if err:
            lines.append("  stderr:")
            lines += [f"    {line}" for line in err]
        return "\n".join(lines)

    # waiting
    def wait_for(self, predicate: Callable[[Event], object] | str, timeout: float = 30.0,
                 since: int = 0) -> Event:
        """The first event (from index ``since``) for which ``predicate`` is true.

        ``predicate`` may be an event name. Fails at once, with the client's output, if the
        client exits without such an event, and at ``timeout`` seconds otherwise.
        """
        check = _named(predicate) if isinstance(predicate, str) else predicate
        deadline = time.monotonic() + timeout
        index = since
        with self._cond:
            while True:
                while index < len(self.events):
                    event = self.events[index]
                    index += 1
                    if check(event):
                        return event
                if self._stdout_done:
                    why = "exited without it"
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    why = f"timed out after {timeout}s"
                    break
                self._cond.wait(min(left, 0.5))
        if self._stdout_done:
            self._wait_quietly(2)
        raise ForeignClientError(f"waiting for an event from {self.name}: {why}\n"
                                 + self.describe())

    def wait_event(self, name: str, timeout: float = 30.0, **fields: object) -> Event:
        """The first event called ``name`` whose fields include ``fields``."""
        return self.wait_for(
            lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items()),
            timeout)

    def _wait_quietly(self, timeout: float) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        for thread in self._threads:
            thread.join(1)

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Wait for the program to exit by itself; its exit code."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ForeignClientError(f"{self.name} still running after {timeout}s\n"
                                     + self.describe()) from None
        for thread in self._threads:
            thread.join(5)
        return code

    def finish(self, timeout: float = 60.0) -> Event:
        """Wait for a clean end: exit code 0 and a ``done`` event, which is returned."""
        code = self.wait_exit(timeout)
        done = self.last("done")
        errors = self.of("error")
        if code != 0 or done is None or errors:
            raise ForeignClientError(f"{self.name} did not finish cleanly (exit {code}, "
                                     f"{len(errors)} error events)\n" + self.describe())
        return done

    def stop(self, timeout: float = 5.0) -> int | None:
        """End the program if it still runs (SIGTERM, then SIGKILL); its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        for thread in self._threads:
            thread.join(2)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode

    def __repr__(self) -> str:
        return (f"<ForeignClient {self.name} pid={self.process.pid} rc={self.returncode} "
                f"events={len(self.events)}>")


# --- starting the programs ------------------------------------------------------------------

def start_java_producer(program: JavaProgram, host: str, port: int, queue: str,
                        count: int = 1000, rate: float = 0, body_size: int = 100,
                        confirm: bool = False) -> ForeignClient:
    args: list[object] = [host, port, queue, count, rate, body_size]
    if confirm:
        args.append("confirm")
    return ForeignClient.start(program.command(args), name="java-producer")


def start_node_producer(host: str, port: int, queue: str, count: int = 1000,
                        rate: float = 0, body_size: int = 100,
                        confirm: bool = False) -> ForeignClient:
    args: list[object] = [host, port, queue, count, rate, body_size]
    if confirm:
        args.append("confirm")
    return ForeignClient.start(node_command("producer.js", args), name="amqplib-producer",
                               cwd=NODE_DIR)


def start_rhea_sender(host: str, port: int, address: str, count: int = 500,
                      rate: float = 0, body_size: int = 100) -> ForeignClient:
    return ForeignClient.start(
        node_command("rhea_send.js", [host, port, address, count, rate, body_size]),
        name="rhea-sender", cwd=NODE_DIR)


def start_rhea_receiver(host: str, port: int, address: str, count: int = 0,
                        prefetch: int = 100, rate: float = 0) -> ForeignClient:
    return ForeignClient.start(
        node_command("rhea_receive.js", [host, port, address, count, prefetch, rate]),
        name="rhea-receiver", cwd=NODE_DIR)


def _producer_args(host: str, port: int, queue: str, count: int, rate: float, body_size: int,
                   confirm: bool) -> list[object]:
    args: list[object] = [host, port, queue, count, rate, body_size]
    if confirm:
        args.append("confirm")
    return args


def start_go_producer(program: BuiltProgram, host: str, port: int, queue: str,
                      count: int = 1000, rate: float = 0, body_size: int = 100,
                      confirm: bool = False, connection_name: str | None = None
                      ) -> ForeignClient:
    """``connection_name``: set the documented way (NewConnectionProperties), which leaves
    out the library's product, version and platform."""
    env = {"FLOODWALL_CONNECTION_NAME": connection_name or ""}
    return ForeignClient.start(
        program.command(_producer_args(host, port, queue, count, rate, body_size, confirm)),
        name="go-producer", env=env)


def start_c_producer(program: BuiltProgram, host: str, port: int, queue: str,
                     count: int = 1000, rate: float = 0, body_size: int = 100,
                     confirm: bool = False) -> ForeignClient:
    return ForeignClient.start(
        program.command(_producer_args(host, port, queue, count, rate, body_size, confirm)),
        name="c-producer")


def start_ruby_producer(host: str, port: int, queue: str, count: int = 1000, rate: float = 0,
                        body_size: int = 100, confirm: bool = False) -> ForeignClient:
    return ForeignClient.start(
        [ruby_binary(), str(RUBY_SCRIPT),
         *map(str, _producer_args(host, port, queue, count, rate, body_size, confirm))],
        name="ruby-producer")


def start_php_producer(host: str, port: int, queue: str, count: int = 1000, rate: float = 0,
                       body_size: int = 100, confirm: bool = False) -> ForeignClient:
    return ForeignClient.start(
        [php_binary(), str(PHP_SCRIPT),
         *map(str, _producer_args(host, port, queue, count, rate, body_size, confirm))],
        name="php-producer")
