"""Run ``floodwall run`` as a child process on free ports, for the tests, demo and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import floodwall
from floodwall.dev.devbroker import free_port


def child_env(extra: dict[str, str] | None = None, root: Path | None = None) -> dict[str, str]:
    """The environment for a ``python -m floodwall`` child: this one's, with the folder this
    process imported ``floodwall`` from (or ``root``, another checkout) first on the path,
    so the child runs that code, where an installed floodwall would otherwise win."""
    env = {**os.environ, **(extra or {})}
    first = str(root or Path(floodwall.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (first, env.get("PYTHONPATH")) if p)
    return env


class ProxyProcessError(RuntimeError):
    """The proxy did not start, or died."""


@dataclass
class ProxyProcess:
    """``floodwall run`` in a child process; ``start()``, use ``port``, then ``stop()``."""

    upstream: str
    logfile: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    # Another checkout to run (a benchmark's baseline), and the module it runs as there
    # (``proxy`` before the import name was floodwall); None: this process's floodwall.
    root: Path | None = None
    module: str = "floodwall"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 30.0, wait_ready: bool = True) -> ProxyProcess:
        cmd = [sys.executable, "-m", self.module, "run",
               "--listen", f"127.0.0.1:{self.port}", "--upstream", self.upstream,
               "--admin", f"127.0.0.1:{self.admin_port}", *self.extra_args]
        log = open(self.logfile, "ab")
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL,
                                        env=child_env(self.env, self.root), cwd=self.root)
        log.close()
        deadline = time.monotonic() + timeout
        path = "/readyz" if wait_ready else "/healthz"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ProxyProcessError(
                    f"floodwall exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.get(path)
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.05)
        self.stop()
        raise ProxyProcessError(f"floodwall not ready after {timeout}s:\n{self.log_tail()}")

    def get(self, path: str, timeout: float = 5.0) -> bytes:
        with urllib.request.urlopen(self.admin_url + path, timeout=timeout) as resp:
            data: bytes = resp.read()
            return data

    def state(self) -> dict[str, object]:
        doc: dict[str, object] = json.loads(self.get("/state"))
        return doc

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample from /metrics (0.0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            mname, _, lab = key.partition("{")
            if mname != name:
                continue
            got = ",".join(sorted(lab.rstrip("}").split(","))) if lab else ""
            if got == want:
                return float(value)
        return 0.0

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.process is not None:
            self.process.send_signal(sig)

    def stop(self, timeout: float = 15.0, drain: float = 2.0) -> int | None:
        """SIGTERM (the drain), a second SIGTERM after ``drain`` seconds (close what is
        left), SIGKILL after ``timeout``; the exit code."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(drain)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        return proc.returncode
