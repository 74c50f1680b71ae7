"""The image in a pod, for real: floodwall's container laid out as the chart's sidecar
template renders it (tests/deploy/pod.py), beside a RabbitMQ container (3.10 from Debian 12's
package, 4.0 from Debian 13's), clients on the host publishing through it.

Per broker: the probes answer; ``--memory-budget auto`` reads the container's memory limit
(256Mi: the budget in /state is a third of it); publishers into a capped queue are held
within the cap + 256 KiB and nothing is lost; a spool outlives a restart of the container
through its volume; SIGTERM drains and exits 0 within the pod's grace period.

Images are built once and found again by the hash of what goes into them
(floodwall/dev/image.py): a warm run builds nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.control.memory import default_budget
from floodwall.dev import image
from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.deploy.pod import SidecarLayout, container_api, render_example
from tests.integration.support import DepthWatch, drain_direct, numbered, seq_of

pytestmark = pytest.mark.timeout(1800)  # a cold first test builds three images

KIB = 1024
HOLD_QUEUE, SPOOL_QUEUE, DRAIN_QUEUE = "pod.hold", "pod.spool", "pod.drain"
HOLD_CAP = 256 * KIB
#: The test's values over the worked example's. The broker is in the pod (127.0.0.1); the
#: listener binds every address because the test's clients come from the host through a
#: published port (in a real pod the application is on the pod's loopback).
POD_VALUES: dict[str, Any] = {"floodwall": {
    "upstream": "127.0.0.1:5672",
    "management": {"url": "http://127.0.0.1:15672", "existingSecret": ""},
    "listen": {"host": "0.0.0.0"},
    "drain": {"timeoutSeconds": 10},
    "networkPolicy": {"enabled": False},
    "extraArgs": ["--memory-budget", "auto", "--depth-interval", "50ms",
                  "--management-interval", "1s"],
    "policies": {"config": {"version": 1, "policies": [
        {"name": "hold", "match": {"vhost": "/", "queue": HOLD_QUEUE},
         "capacity": "256KiB", "resume": "128KiB", "overflow": "hold", "deadline": "120s"},
        {"name": "spool", "match": {"vhost": "/", "queue": SPOOL_QUEUE},
         "capacity": "32KiB", "resume": "16KiB", "overflow": "spool", "deadline": "60s",
         "spool": {"max_bytes": "64MiB"}},
    ]}},
}}


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    from testcontainers.core.config import testcontainers_config

    preset = bool(os.environ.get("DOCKER_HOST"))
    with container_api() as host, pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", host)
        if preset and shutil.which("docker") and not os.environ.get("FLOODWALL_IMAGE_ENGINE"):
            # the engine DOCKER_HOST names builds the images too (the docker CLI reads it)
            mp.setenv("FLOODWALL_IMAGE_ENGINE", "docker")
        # Ryuk (the reaper) is an image from a registry; every container here is removed by
        # the fixture that started it.
        mp.setattr(testcontainers_config, "ryuk_disabled", True)
        yield host


@pytest.fixture(scope="session")
def floodwall_tag(docker_host: str) -> str:
    return image.floodwall_image()


@dataclass
class Pod:
    layout: SidecarLayout
    broker: BrokerEndpoint
    amqp_port: int
    admin_port: int
    floodwall: Any  # testcontainers DockerContainer
    logs_before: str = ""

    @property
    def container(self) -> Any:
        return self.floodwall.get_wrapped_container()

    def http(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}",
                                        timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def probe(self, kind: str) -> int:
        path, port = self.layout.probe_path(kind)
        assert port == self.layout.ports["floodwall-admin"]
        return self.http(path)[0]

    def state(self) -> dict[str, Any]:
        status, body = self.http("/state")
        assert status == 200, body
        doc: dict[str, Any] = json.loads(body)
        return doc

    def queue(self, name: str) -> dict[str, Any] | None:
        for q in (self.state().get("flow") or {}).get("queues", []):
            if q["queue"] == name:
                return dict(q)
        return None

    def tripped(self, name: str) -> bool:
        q = self.queue(name)
        return bool(q and q["tripped"])

    def policed(self, name: str) -> bool:
        q = self.queue(name)
        return bool(q and q["depth"]["estimate"] is not None)

    def spool_records(self) -> int:
        return int((self.state().get("spool") or {}).get("records", 0))

    def logs(self) -> str:
        return bytes(self.container.logs()).decode(errors="replace")

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.amqp_port, connection_attempts=3, retry_delay=1,
            socket_timeout=10, blocked_connection_timeout=120))


def _start(container: Any, what: str) -> None:
    try:
        container.start()
    except Exception as exc:  # the engine's message is the useful part
        raise AssertionError(f"{what} did not start: {exc}") from exc


@pytest.fixture(scope="module", params=["3.10", "4.0"])
def pod(request: pytest.FixtureRequest, docker_host: str, floodwall_tag: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    import docker
    from testcontainers.core.container import DockerContainer

    version = request.param
    rabbitmq = image.debian_image(image.RABBITMQ[version])
    work = tmp_path_factory.mktemp(f"pod-{version}")
    layout = SidecarLayout.from_render(render_example(POD_VALUES, work))
    prefix = f"floodwall-pod-{uuid.uuid4().hex[:8]}"
    # the broker's container holds the pod's network namespace and publishes its ports
    broker = DockerContainer(rabbitmq).with_exposed_ports(5672, 15672,
                                                          *layout.ports.values())
    floodwall = None
    try:
        _start(broker, f"RabbitMQ {version} ({rabbitmq})")
        endpoint = BrokerEndpoint("127.0.0.1", int(broker.get_exposed_port(5672)),
                                  int(broker.get_exposed_port(15672)))

        def broker_up() -> bool:
            try:
                return bool(endpoint.api("GET", "/api/overview", timeout=3))
            except OSError:
                return False

        wait_for(broker_up, 180, interval=0.5, what=f"RabbitMQ {version}'s management API")
        floodwall = DockerContainer(
            floodwall_tag, command=layout.args, env=layout.env,
            network_mode=f"container:{broker.get_wrapped_container().id}",
            mem_limit=layout.memory_limit, **layout.security())
        for source, target, mode in layout.volumes(prefix, work / "configmaps"):
            floodwall.with_volume_mapping(source, target, mode)
        _start(floodwall, "floodwall")
        yield Pod(layout, endpoint, int(broker.get_exposed_port(layout.ports["floodwall-amqp"])),
                  int(broker.get_exposed_port(layout.ports["floodwall-admin"])), floodwall)
    finally:
        for container in (floodwall, broker):
            if container is not None and container._container is not None:
                container.stop()
        client = docker.from_env()
        for volume in client.volumes.list(filters={"name": prefix}):
            volume.remove(force=True)
        client.close()


def test_probes_answer_and_the_memory_budget_is_a_third_of_the_limit(pod: Pod) -> None:
    wait_for(lambda: pod.probe("readiness") == 200, 120, interval=0.2,
             what="/readyz 200 (the readiness probe)")
    assert pod.probe("liveness") == 200
    assert pod.layout.memory_limit == 256 * 2**20
    budget = pod.state()["memory_budget"]["bytes"]
    assert budget == default_budget(pod.layout.memory_limit) == 256 * 2**20 // 3
    assert "a third of the cgroup memory limit" in pod.logs()
    # the image: its HEALTHCHECK kept; `floodwall --version` answers; uid 10001 on a
    # read-only root; no pip
    config = image.image_config(pod.container.image.id)
    assert "/healthz" in " ".join(config["Healthcheck"]["Test"])
    assert config["Entrypoint"] == ["floodwall"] and config["Cmd"] == ["run"]
    version = pod.container.exec_run(["floodwall", "--version"])
    assert version.exit_code == 0 and b"floodwall, version" in version.output
    whoami = pod.container.exec_run(["python", "-c", "import os; print(os.getuid())"])
    assert whoami.output.strip() == b"10001"
    assert pod.container.exec_run(["python", "-c", "open('/x', 'w')"]).exit_code != 0
    assert pod.container.exec_run(["python", "-c", "import pip"]).exit_code != 0


class Publisher(threading.Thread):
    """Publishes ``count`` numbered bodies with publisher confirms through the proxy."""

    def __init__(self, pod: Pod, queue: str, first: int, count: int, size: int) -> None:
        super().__init__(daemon=True, name=f"publisher-{first}")
        self.pod, self.queue, self.seqs, self.size = pod, queue, range(first, first + count), size
        self.acked: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = self.pod.connect()
            ch = conn.channel()
            ch.confirm_delivery()
            for seq in self.seqs:
                ch.basic_publish("", self.queue, numbered(seq, self.size))
                self.acked.append(seq)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def declare(pod: Pod, queue: str) -> None:
    conn = pod.connect()
    conn.channel().queue_declare(queue)
    conn.close()
    wait_for(lambda: pod.policed(queue), 30, interval=0.1, what=f"{queue} policed")


def test_publishers_are_held_within_the_cap_and_nothing_is_lost(pod: Pod) -> None:
    wait_for(lambda: pod.probe("readiness") == 200, 120, interval=0.2, what="ready")
    declare(pod, HOLD_QUEUE)
    watch = DepthWatch(pod.broker, pod, HOLD_QUEUE)  # type: ignore[arg-type]
    watch.start()
    per, size = 64, 16 * KIB
    publishers = [Publisher(pod, HOLD_QUEUE, i * per, per, size) for i in range(4)]
    for p in publishers:
        p.start()
    try:
        wait_for(lambda: pod.tripped(HOLD_QUEUE)
                 and (pod.state()["flow"].get("held") or {}).get("messages", 0) > 0,
                 60, interval=0.1, what="the queue tripped and publishes held")
        total = per * len(publishers)
        landed = drain_direct(pod.broker, HOLD_QUEUE, total, timeout=180)
        for p in publishers:
            p.join(60)
    finally:
        watch.stop()
        watch.join(10)
    for p in publishers:
        assert p.error is None, p.error
    assert watch.error is None, watch.error
    assert sorted(map(seq_of, landed)) == list(range(total)), "a publish was lost"
    assert sum(len(p.acked) for p in publishers) == total
    assert watch.tripped_seen
    # the broker's count every 50 ms (real time) times the body size, and the management
    # API's bytes (sampled every few seconds by the broker)
    peak = max(watch.max_ready * size, watch.max_message_bytes)
    assert 0 < peak <= HOLD_CAP + 256 * KIB, (
        f"{peak} bytes in the queue: the cap is {HOLD_CAP} + 256 KiB")
    print(f"pod hold: {total} x {size // KIB} KiB, 0 lost, queue peak {peak // KIB} KiB "
          f"({watch.max_ready} messages; cap {HOLD_CAP // KIB} KiB)")


def test_the_spool_survives_a_container_restart(pod: Pod) -> None:
    wait_for(lambda: pod.probe("readiness") == 200, 120, interval=0.2, what="ready")
    declare(pod, SPOOL_QUEUE)
    count = 120
    publisher = Publisher(pod, SPOOL_QUEUE, 0, count, KIB)
    publisher.run()  # no consumer: the queue trips at 32 KiB, the rest goes to the spool
    assert publisher.error is None, publisher.error
    assert len(publisher.acked) == count
    spooled = pod.spool_records()
    assert spooled > 0
    pod.container.stop(timeout=pod.layout.grace_seconds)
    pod.container.reload()
    assert pod.container.attrs["State"]["ExitCode"] == 0
    pod.container.start()
    wait_for(lambda: pod.probe("readiness") == 200, 120, interval=0.2, what="ready again")
    # what the first run spooled, read back from the volume by the second (the replay may
    # have moved a few records to the broker meanwhile: their count is not compared)
    recovered = [line for line in pod.logs().splitlines()
                 if "event=spool_recovered" in line and f"queue={SPOOL_QUEUE}" in line]
    assert len(recovered) == 1, pod.logs()[-3000:]
    records = int(recovered[0].split(" records=")[1].split()[0])
    assert 0 < records <= spooled
    landed = drain_direct(pod.broker, SPOOL_QUEUE, count, timeout=180)
    assert sorted(map(seq_of, landed)) == list(range(count)), "a spooled publish was lost"
    print(f"pod spool: {spooled} of {count} publishes spooled, {records} recovered from the "
          f"volume after a restart, 0 lost")


def test_sigterm_drains_and_exits_0_within_the_grace_period(pod: Pod) -> None:
    """Last of the module: it stops the floodwall container."""
    wait_for(lambda: pod.probe("readiness") == 200, 120, interval=0.2, what="ready")
    conn = pod.connect()
    ch = conn.channel()
    ch.queue_declare(DRAIN_QUEUE)
    ch.confirm_delivery()
    ch.basic_publish("", DRAIN_QUEUE, numbered(0))
    started = time.monotonic()
    pod.container.kill(signal="SIGTERM")

    def unready() -> bytes | None:
        status, body = pod.http("/readyz")
        return body if status == 503 else None

    assert b"draining" in bytes(wait_for(unready, 10, interval=0.05,  # type: ignore[arg-type]
                                         what="/readyz 503 while draining"))
    ch.basic_publish("", DRAIN_QUEUE, numbered(1))  # an open connection is still relayed
    conn.close()
    result = pod.container.wait(timeout=pod.layout.grace_seconds)
    took = time.monotonic() - started
    assert result["StatusCode"] == 0, pod.logs()[-2000:]
    assert took < pod.layout.grace_seconds
    assert "event=stopped" in pod.logs().strip().splitlines()[-1]
    landed = drain_direct(pod.broker, DRAIN_QUEUE, 2, timeout=30)
    assert sorted(map(seq_of, landed)) == [0, 1]
    print(f"pod drain: exited 0 {took:.1f} s after SIGTERM (grace "
          f"{pod.layout.grace_seconds} s)")


def test_the_pod_is_the_charts_sidecar(tmp_path: Path) -> None:
    """What the pod tests take from the render is the chart's: the args, env, probes and
    limits the worked example renders, only the test's values changed."""
    layout = SidecarLayout.from_render(render_example(POD_VALUES, tmp_path))
    assert layout.args[:1] == ["run"] and "--memory-budget" in layout.args
    env = layout.env
    assert env["FLOODWALL_ADMIN"] == "0.0.0.0:9090"
    assert env["FLOODWALL_POLICIES"] == "/etc/floodwall/policies/policies.yaml"
    assert layout.probe_path("readiness") == ("/readyz", 9090)
    assert layout.probe_path("liveness") == ("/healthz", 9090)
    assert layout.grace_seconds == 10 + 10
    mounts = {target: source for source, target, _ in layout.volumes("p", tmp_path / "c")}
    assert mounts["/var/lib/floodwall/spool"] == "p-floodwall-spool"
    assert (Path(mounts["/etc/floodwall/policies"]) / "policies.yaml").exists()
    assert layout.security() == {"user": "10001:10001", "read_only": True,
                                 "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"]}
