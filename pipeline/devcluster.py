"""A Spark standalone cluster on this machine, from the installed pyspark: one master and N
workers started with its ``bin/spark-class`` (no download, no Docker), on free ports, in one
directory. For the tests, the benchmark, and trying the cluster path by hand::

    python -m floodwall_pipeline.devcluster --workers 2 --cores 1  # prints the master URL

Each daemon is the leader of its own process group, and the executors a worker launches
stay in its group, so ``stop()`` ends every JVM the cluster started (``alive()`` says which
are left: none, once ``stop()`` returned). Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
LEADER = "I have been elected leader"
REGISTERED = "Successfully registered with master"


class ClusterError(RuntimeError):
    """A daemon did not come up (its log says why)."""


def spark_home() -> Path:
    """The installed pyspark's directory: a Spark distribution (bin/, jars/) of the driver's
    own version."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env(directory: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_LOG_DIR": str(directory),
        "SPARK_PID_DIR": str(directory),
        # No REST submission server: it listens on a fixed port (6066) that two clusters
        # on one machine would fight over, and nothing here submits through it.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_DAEMON_MEMORY": "512m",
    })
    env.pop("SPARK_CONF_DIR", None)
    return env


def _group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, pattern: re.Pattern[str] | str, deadline: float) -> re.Match[str] | str:
        while True:
            text = self.text()
            found = (pattern.search(text) if isinstance(pattern, re.Pattern)
                     else (pattern if pattern in text else None))
            if found:
                return found
            if self.process.poll() is not None:
                raise ClusterError(f"{self.name} exited ({self.process.returncode}) before "
                                   f"it was ready; its log: {self.log}\n{text[-2000:]}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} not ready in time; its log: {self.log}\n"
                                   f"{text[-2000:]}")
            time.sleep(0.1)


@dataclass
class StandaloneCluster:
    """A running master and its workers."""

    directory: Path
    url: str = ""
    master: Daemon | None = None
    workers: list[Daemon] = field(default_factory=list)
    cores: int = 1

    @property
    def daemons(self) -> list[Daemon]:
        return [*self.workers, *([self.master] if self.master else [])]

    def alive(self) -> list[int]:
        """Every live process the cluster started (daemons and executors)."""
        return [pid for d in self.daemons for pid in _group_alive(d.process.pid)]

    def executor_logs(self) -> list[Path]:
        """The stderr of every executor the workers launched (work-N/APP/EXECUTOR/stderr)."""
        return sorted(self.directory.glob("work-*/*/*/stderr"))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM each daemon's process group (workers first: they take their executors
        along), SIGKILL what is left at the deadline, and reap the daemons."""
        for d in self.daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for d in self.daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.process.wait(max(deadline - time.monotonic(), 0.1))
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        for d in self.daemons:
            if _group_alive(d.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(d.process.pid, signal.SIGKILL)
            if d.process.poll() is None:
                d.process.kill()
            d.process.wait()
        kill_deadline = time.monotonic() + 10
        while self.alive() and time.monotonic() < kill_deadline:
            time.sleep(0.1)


def _spawn(name: str, args: list[str], directory: Path, log: Path) -> Daemon:
    spark_class = spark_home() / "bin" / "spark-class"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(spark_class), *args], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, cwd=directory,
                                env=_env(directory), process_group=0)
    return Daemon(name, proc, log)


def start(directory: Path, workers: int = 1, cores: int = 1, memory: str = "1g",
          timeout: float = 120.0) -> StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, every port
    chosen by the OS (the master's URL is read from its log)."""
    directory.mkdir(parents=True, exist_ok=True)
    cluster = StandaloneCluster(directory, cores=cores)
    deadline = time.monotonic() + timeout
    try:
        cluster.master = _spawn("spark master", [
            MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            directory, directory / "master.log")
        found = cluster.master.wait_for(MASTER_URL, deadline)
        assert isinstance(found, re.Match)
        cluster.url = found.group(1)
        cluster.master.wait_for(LEADER, deadline)
        for i in range(workers):
            work = directory / f"work-{i}"
            work.mkdir(exist_ok=True)
            cluster.workers.append(_spawn(f"spark worker {i}", [
                WORKER_CLASS, cluster.url, "--host", "127.0.0.1", "--port", "0",
                "--webui-port", "0", "--cores", str(cores), "--memory", memory,
                "--work-dir", str(work)], directory, directory / f"worker-{i}.log"))
        for w in cluster.workers:
            w.wait_for(REGISTERED, deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running(directory: Path, workers: int = 1, cores: int = 1, memory: str = "1g"
            ) -> Iterator[StandaloneCluster]:
    cluster = start(directory, workers, cores, memory)
    try:
        yield cluster
    finally:
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path("spark-cluster"))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--cores", type=int, default=1, help="cores per worker")
    p.add_argument("--memory", default="1g", help="memory per worker")
    a = p.parse_args()
    with running(a.dir.resolve(), a.workers, a.cores, a.memory) as c:
        print(f"master: {c.url}  (logs and executors' work directories in {a.dir})\n"
              f"floodwall analyze TELEMETRY --out REPORT --master {c.url}\nCtrl-C stops it.",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while all(d.process.poll() is None for d in c.daemons):
                time.sleep(1)


if __name__ == "__main__":
    main()
