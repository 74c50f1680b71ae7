"""The pod lifecycle, with the real process and real signals.

SIGTERM (what Kubernetes sends) drains: new connections are refused, ``/readyz`` is 503 with
reason ``draining``, open connections keep being relayed and held publishes keep being
released until the clients are gone or ``--drain-timeout`` passes; the process exits 0 and
its last log line says what was left. SIGHUP, or a ConfigMap-style symlink swap of the
policies file, reloads the policies without touching connections.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import header
from pamqp.commands import Basic

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from floodwall.spool.manager import SpoolLimits, SpoolManager
from floodwall.spool.records import SpoolRecord
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    Raw091,
    capped,
    delete_queue,
    drain_direct,
    http_status,
    log_lines,
    numbered,
    pika_connection,
    policy_file,
    ready_count,
    seq_of,
    unique,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


@pytest.fixture
def proxies(broker: BrokerEndpoint, tmp_path: Path) -> Iterator[list[ProxyProcess]]:
    """Proxies a test starts; any still running afterwards are stopped."""
    started: list[ProxyProcess] = []
    yield started
    for proc in started:
        proc.stop()


def start(proxies: list[ProxyProcess], broker: BrokerEndpoint, tmp_path: Path,
          *args: str) -> ProxyProcess:
    proc = ProxyProcess(f"{broker.host}:{broker.amqp_port}",
                        tmp_path / f"floodwall-{len(proxies)}.log", list(args))
    proxies.append(proc)
    return proc.start()


def wait_exit(proc: ProxyProcess, timeout: float) -> tuple[int, float]:
    """(exit code, seconds waited) of the proxy's process."""
    assert proc.process is not None
    t0 = time.monotonic()
    try:
        rc = proc.process.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"floodwall still running {timeout}s after SIGTERM:\n{proc.log_tail()}")
    return rc, time.monotonic() - t0


def last_line(proc: ProxyProcess) -> str:
    lines = proc.logfile.read_text(errors="replace").strip().splitlines()
    assert lines, "no log lines"
    return lines[-1]


def fields(line: str) -> dict[str, str]:
    """``key=value`` pairs of a logfmt line (the values these tests read have no spaces)."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def readyz(proc: ProxyProcess) -> tuple[int, dict[str, object]]:
    status, body = http_status(proc.admin_url + "/readyz")
    doc: dict[str, object] = json.loads(body)
    return status, doc


def test_sigterm_drains_an_idle_connection_then_exits_0(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    proc = start(proxies, broker, tmp_path, "--drain-timeout", "30s")
    assert readyz(proc)[0] == 200
    with pika_connection(proc.port) as conn:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        proc.signal(signal.SIGTERM)
        wait_for(lambda: readyz(proc)[0] == 503, 5, what="/readyz to turn 503")
        _, doc = readyz(proc)
        assert doc["ready"] is False and doc["reason"] == "draining", doc
        draining = doc["draining"]
        assert isinstance(draining, dict) and draining["connections"] == 1, doc
        assert 0 < float(draining["seconds_left"]) <= 30, doc
        assert refused(proc.port), "the listener still accepts during the drain"
        # the open connection is still relayed during the drain
        ch.basic_publish("", queue, b"during the drain")
        method, _, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"during the drain", method
        assert proc.process is not None and proc.process.poll() is None
        t_close = time.monotonic()
    rc, _ = wait_exit(proc, 15)
    assert rc == 0, proc.log_tail()
    assert time.monotonic() - t_close < 5, "exit should follow the last client, not the deadline"
    line = last_line(proc)
    assert "event=stopped" in line, line
    f = fields(line)
    assert (f["drained"], f["connections_left"], f["held_messages_left"]) == ("True", "0", "0")
    (stopping,) = log_lines(proc.logfile, "stopping")
    assert "reason=SIGTERM" in stopping and "drain_timeout=30.0" in stopping, stopping


def test_sigterm_with_a_connection_that_never_closes_exits_at_the_deadline(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    proc = start(proxies, broker, tmp_path, "--drain-timeout", "2s")
    with pika_connection(proc.port) as conn:
        conn.channel()
        t0 = time.monotonic()
        proc.signal(signal.SIGTERM)
        rc, _ = wait_exit(proc, 15)
        took = time.monotonic() - t0
        assert rc == 0, proc.log_tail()
        assert 1.8 <= took < 8, f"exited after {took:.1f}s with --drain-timeout 2s"
        line = last_line(proc)
        assert "event=stopped" in line and "level=warning" in line, line
        f = fields(line)
        assert (f["drained"], f["connections_left"]) == ("False", "1"), line
        assert (f["held_messages_left"], f["held_bytes_left"]) == ("0", "0"), line
        # the client sees its connection go
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            for _ in range(50):
                conn.process_data_events(0.1)


def test_second_sigterm_ends_the_drain_at_once(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    proc = start(proxies, broker, tmp_path, "--drain-timeout", "60s")
    raw = Raw091.connect(proc.port)
    try:
        raw.handshake(name=unique("second-sigterm"))
        proc.signal(signal.SIGTERM)
        wait_for(lambda: readyz(proc)[0] == 503, 5, what="draining")
        t0 = time.monotonic()
        proc.signal(signal.SIGTERM)
        rc, _ = wait_exit(proc, 10)
        assert rc == 0 and time.monotonic() - t0 < 5, proc.log_tail()
    finally:
        raw.close()
    assert log_lines(proc.logfile, "drain_cut_short")
    assert "connections_left=1" in last_line(proc)


def test_second_sigterm_ends_the_spools_drain_at_once(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    """The spool's part of the drain (replay until empty or the deadline) ends with the
    drain on a second signal too: records for a queue that is gone cannot be replayed, and
    the proxy exits at once, keeping them on disk."""
    queue = unique("drain-spool-gone")  # never declared
    spool = tmp_path / "spool"
    manager = SpoolManager(spool, SpoolLimits(min_free_bytes=0))
    for i in range(5):
        body = numbered(i)
        props = bytes(header.ContentHeader(0, len(body), Basic.Properties()).marshal())
        manager.append(("/", queue), SpoolRecord(0, time.time(), "", queue, props, body),
                       1 << 30)
    manager.sync()
    manager.close()
    flow = _flow_proxy(proxies, broker, tmp_path,
                       policy_file(tmp_path / "p.yaml", capped("spooled", queue,
                                                                overflow="spool")),
                       "--spool-dir", str(spool), "--drain-timeout", "60s")
    wait_for(lambda: log_lines(flow.proc.logfile, "spool_queue_unroutable"), 15,
             what="the spool's replay refused")
    flow.proc.signal(signal.SIGTERM)
    wait_for(lambda: log_lines(flow.proc.logfile, "spool_draining"), 5, what="draining")
    t0 = time.monotonic()
    flow.proc.signal(signal.SIGTERM)
    rc, _ = wait_exit(flow.proc, 15)
    assert rc == 0 and time.monotonic() - t0 < 5, flow.proc.log_tail()
    assert "records_left=5" in " ".join(log_lines(flow.proc.logfile, "spool_stopped"))


def _flow_proxy(proxies: list[ProxyProcess], broker: BrokerEndpoint, tmp_path: Path,
                policies: Path, *args: str) -> FlowProxy:
    proc = start(proxies, broker, tmp_path, "--policies", str(policies), "--management",
                 broker.management_url, *args)
    return FlowProxy(proc, policies)


def test_sigterm_keeps_releasing_held_publishes_while_draining(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    queue = unique("drain-held")
    flow = _flow_proxy(proxies, broker, tmp_path,
                       policy_file(tmp_path / "p.yaml", capped("held", queue)),
                       "--drain-timeout", "60s")
    try:
        with pika_connection(flow.port) as conn:
            ch = conn.channel()
            ch.queue_declare(queue)
            wait_for(lambda: flow.policed(queue), 15, what=f"{queue} policed")
            for i in range(100):  # 100 KiB into a 64 KiB queue: some are held
                ch.basic_publish("", queue, numbered(i))
            conn.process_data_events(0)
            wait_for(lambda: flow.tripped(queue) and flow.held()["messages"] > 0, 15,
                     what="the queue tripped with publishes held")
            held = flow.held()["messages"]
            flow.proc.signal(signal.SIGTERM)
            wait_for(lambda: readyz(flow.proc)[0] == 503, 5, what="draining")
            assert refused(flow.port)
            # a consumer drains the queue at the broker: the gate releases the held ones
            landed = drain_direct(broker, queue, 100, timeout=30)
            wait_for(lambda: flow.held()["messages"] == 0, 15, what="held publishes released")
            assert sorted(map(seq_of, landed)) == list(range(100)), f"{held} were held"
        rc, _ = wait_exit(flow.proc, 15)
    finally:
        delete_queue(broker, queue)
    assert rc == 0, flow.proc.log_tail()
    f = fields(last_line(flow.proc))
    assert (f["event"], f["drained"], f["held_messages_left"]) == ("stopped", "True", "0")
    assert not log_lines(flow.proc.logfile, "held_publishes_lost")


def test_publishes_still_held_at_the_deadline_are_counted_in_the_last_line(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    queue = unique("deadline-held")
    flow = _flow_proxy(proxies, broker, tmp_path,
                       policy_file(tmp_path / "p.yaml", capped("held", queue)),
                       "--drain-timeout", "2s")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", flow.port))
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        wait_for(lambda: flow.policed(queue), 15, what=f"{queue} policed")
        for i in range(100):
            ch.basic_publish("", queue, numbered(i))
        conn.process_data_events(0)
        wait_for(lambda: flow.tripped(queue) and flow.held()["messages"] > 0, 15,
                 what="the queue tripped with publishes held")
        # every one of the 100 is either in the queue or held: no more will arrive at the
        # proxy, so the held figures below are the ones SIGTERM must report
        wait_for(lambda: ready_count(broker, queue) + flow.held()["messages"] == 100, 15,
                 what="all 100 publishes in the queue or held")
        held = flow.held()
        flow.proc.signal(signal.SIGTERM)
        rc, took = wait_exit(flow.proc, 15)
        assert rc == 0 and 1.8 <= took < 8, (rc, took, flow.proc.log_tail())
        f = fields(last_line(flow.proc))
        left = int(f["held_messages_left"])
        # Held publishes may still be admitted at the queue's pace until the proxy stops
        # (admission while held): the last line counts what was held then, which with
        # what reached the queue is every publish.
        wait_for(lambda: ready_count(broker, queue) + left == 100, 10,
                 what=f"{left} left held and the rest in the queue")
    finally:
        if conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn.close()
        delete_queue(broker, queue)
    assert (f["event"], f["drained"], f["connections_left"]) == ("stopped", "False", "1")
    assert 0 < left <= held["messages"], (f, held)
    per_message = held["bytes"] // held["messages"]  # (the 100 bodies are one size)
    assert int(f["held_bytes_left"]) == left * per_message, (f, held)


def test_sighup_reloads_policies_and_keeps_the_connection(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    policies = policy_file(tmp_path / "p.yaml", capped("one", unique("hup-a")))
    flow = _flow_proxy(proxies, broker, tmp_path, policies)
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        policy_file(policies, capped("one", unique("hup-a")), capped("two", unique("hup-b")))
        flow.proc.signal(signal.SIGHUP)
        line = wait_for(lambda: [x for x in flow.log("policies_reloaded")
                                 if "trigger=SIGHUP" in x], 10, what="the SIGHUP reload")
        assert "generation=2" in str(line), line
        ch.basic_publish("", queue, b"after the reload")
        assert ch.basic_get(queue, auto_ack=True)[2] == b"after the reload"
        assert readyz(flow.proc)[0] == 200
        assert flow.proc.process is not None and flow.proc.process.poll() is None


def _atomic_writer(directory: Path, files: dict[str, str], generation: int) -> None:
    """What the kubelet does to a mounted ConfigMap: a new timestamped directory, then the
    ``..data`` symlink swapped with rename(2); each key is a symlink through ``..data``."""
    new = directory / f"..2024_01_01_00_00_0{generation}.000000000"
    new.mkdir()
    for name, text in files.items():
        (new / name).write_text(text)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(new.name)
    os.replace(tmp, directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)


def test_configmap_symlink_swap_reloads_in_place(
        broker: BrokerEndpoint, tmp_path: Path, proxies: list[ProxyProcess]) -> None:
    mount = tmp_path / "policies"
    mount.mkdir()
    first = policy_file(tmp_path / "first.yaml", capped("one", unique("cm-a"))).read_text()
    second = policy_file(tmp_path / "second.yaml", capped("one", unique("cm-a")),
                         capped("two", unique("cm-b"))).read_text()
    _atomic_writer(mount, {"policies.yaml": first}, 1)
    flow = _flow_proxy(proxies, broker, tmp_path, mount / "policies.yaml")
    with pika_connection(flow.port) as conn:
        conn.channel()
        _atomic_writer(mount, {"policies.yaml": second}, 2)
        wait_for(lambda: [x for x in flow.log("policies_reloaded")
                          if 'trigger="file changed"' in x], 15,
                 what="the reload after the ConfigMap swap")
        assert conn.is_open
        conn.process_data_events(0)
