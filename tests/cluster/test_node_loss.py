"""A three-node cluster loses the node floodwall uses, under load: killed (kill -9) or hung
(SIGSTOP: its ports still take TCP connections, nothing answers), with floodwall given the
node list, and with floodwall behind a TCP load balancer (HAProxy).

Each test runs a publisher with confirms through floodwall at full speed into a capped
queue, a paced consumer and a depth watch straight at the cluster, and asserts the bounds
docs/operations.md states for a failover: publishing resumes within 15 s, no confirmed
message is lost, the queue stays within capacity + 256 KiB throughout, and ``/readyz``
answers ready while a node answers.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.error
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint, free_port
from floodwall.dev.devproxy import ProxyProcess
from floodwall.dev.rabbitcluster import LocalCluster
from tests.cluster.traffic import (
    SIZE,
    ConfirmedPublisher,
    DepthMax,
    PacedConsumer,
    close_quietly,
    stop_all,
)
from tests.conftest import wait_for
from tests.integration.support import capped, direct_params, policy_file, seq_of, unique

pytestmark = pytest.mark.broker

KIB = 1024
CAPACITY, RESUME = 256 * KIB, 192 * KIB
OVERSHOOT = 256 * KIB  # the bound: depth <= capacity + 256 KiB
RESUMES_WITHIN = 15.0  # seconds from the fault to the next confirmed publish
CONSUMER_RATE = 300.0  # messages a second (1 KiB each): slower than the publisher
PREFETCH = 20
FAST = ("--depth-interval", "50ms", "--management-interval", "1s")
#: A hung node is found by the readiness probe: its interval (5 s) + the answer it waits
#: for (3 s), + slack for a loaded machine.
NODE_LEFT_WITHIN = 5 + 3 + 4.0
#: Seconds of load after a hang: past the time the depth would go unknown without figures
#: (3 management intervals + the timeout: 8 s here), and past 15 s from there.
HUNG_LOAD = 8 + RESUMES_WITHIN + 2


def logged_at(line: str) -> float:
    """The wall-clock time of a floodwall log line (``ts=2026-...Z``)."""
    stamp = line.split(" ", 1)[0].removeprefix("ts=").replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def declare(ep: BrokerEndpoint, queue: str, kind: str) -> None:
    """Declare ``queue`` on the node at ``ep`` (a quorum queue's leader starts there)."""
    conn = pika.BlockingConnection(direct_params(ep))
    try:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
    finally:
        conn.close()


def leader_of(cluster: LocalCluster, queue: str) -> str:
    """The node that holds ``queue`` (a quorum queue's leader, a classic queue's home)."""
    for node in cluster.answering:
        try:
            doc = node.endpoint.api("GET", f"/api/queues/%2F/{queue}")
        except (OSError, urllib.error.URLError):
            continue
        assert isinstance(doc, dict)
        return str(doc.get("leader") or doc.get("node"))
    raise AssertionError("no node answers the management API")


def readyz(proc: ProxyProcess) -> int:
    try:
        proc.get("/readyz", timeout=3)
        return 200
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return 0


def tripped(proc: ProxyProcess, queue: str) -> bool:
    """Whether ``proc`` holds ``queue``'s publishers now."""
    flow = proc.state().get("flow") or {}
    return any(q["queue"] == queue and q["tripped"]
               for q in flow.get("queues", []))  # type: ignore[union-attr]


def through_a_fault(cluster: LocalCluster, procs: Sequence[ProxyProcess], queue: str,
                    fault: Callable[[], None], resumes_within: float = RESUMES_WITHIN,
                    watch_ready: bool = True, tripped_first: bool = False,
                    watch_from: int = 0, load_after: float = 0.0) -> dict[str, float]:
    """Load through each of ``procs`` (a publisher each) into ``queue``, ``fault()`` after
    1,500 confirms (``tripped_first``: and at a moment the first of ``procs`` holds the
    queue), and the figures the bounds are about; the assertions common to every fault are
    made here (``resumes_within``: seconds from the fault to the next confirm on every
    publisher). The consumer and the depth watch start on node ``watch_from``; the load
    goes on for 1,000 confirms after the fault, and ``load_after`` seconds at least."""
    consumer = PacedConsumer(cluster, queue, CONSUMER_RATE, PREFETCH, first=watch_from)
    depth = DepthMax(cluster, queue, PREFETCH, first=watch_from)
    publishers = [ConfirmedPublisher(proc.port, queue, producer=i)
                  for i, proc in enumerate(procs)]
    started = time.monotonic()
    for thread in [consumer, depth, *publishers]:
        thread.start()

    def total() -> int:
        return sum(len(p.confirmed) for p in publishers)
    try:
        wait_for(lambda: total() > 1500, timeout=60,
                 what="1,500 confirmed publishes before the fault")
        if tripped_first:
            # The queue trips only where the publishers outrun the consumer: on a slow
            # machine their confirmed rate can fall below CONSUMER_RATE.
            rate = total() / (time.monotonic() - started)
            consumer.rate = min(consumer.rate, rate / 2)
            wait_for(lambda: tripped(procs[0], queue), timeout=60, interval=0.05,
                     what="the queue tripped")
        before = total()
        moment, wall = time.monotonic(), time.time()
        fault()
        not_ready: list[int] = []

        def resumed() -> bool:
            if watch_ready:
                not_ready.extend(s for s in map(readyz, procs) if s != 200)
            return all(p.first_confirm_after(moment + 0.5) is not None for p in publishers)
        wait_for(resumed, timeout=resumes_within + 30, interval=0.2,
                 what="a confirmed publish after the fault on every publisher")
        resumed_after = 0.0
        for publisher in publishers:
            first = publisher.first_confirm_after(moment + 0.5)
            assert first is not None
            resumed_after = max(resumed_after,
                                first - max(publisher.last_confirm_before(moment), moment))
        wait_for(lambda: total() > before + 1000
                 and time.monotonic() > moment + load_after, timeout=90 + load_after,
                 what="1,000 more confirmed publishes after the fault")
        stop_all(publishers)
        longest_pause = max(p.longest_pause_after(moment) for p in publishers)
        consumer.drain.set()
        confirmed = set().union(*(p.tagged() for p in publishers))
        wait_for(lambda: confirmed <= consumer.seen, timeout=120, interval=0.2,
                 what="every confirmed message consumed")
    finally:  # no thread outlives the test, whatever failed
        stop_all([*publishers, consumer, depth])
    assert resumed_after <= resumes_within, (
        f"publishing resumed {resumed_after:.1f}s after the fault")
    assert depth.samples > 50
    assert depth.max_bytes <= CAPACITY + OVERSHOOT, (
        f"the queue reached {depth.max_bytes // KIB} KiB")
    if watch_ready:
        assert not not_ready, f"/readyz answered {not_ready} while two nodes answered"
    return {"resumed_after": resumed_after, "depth_max": depth.max_bytes,
            "confirmed": len(confirmed), "fault_at": wall, "longest_pause": longest_pause}


def policies(tmp_path: Path, queue: str) -> Path:
    return policy_file(tmp_path / "p.yaml",
                       capped("failover", queue, f"{CAPACITY // KIB}KiB",
                              f"{RESUME // KIB}KiB", deadline="120s"))


@pytest.mark.parametrize("kind", ["quorum", "classic"])
def test_the_node_floodwall_uses_killed_under_load(cluster: LocalCluster, sidecar: Any,
                                                   tmp_path: Path, kind: str) -> None:
    """floodwall given the node list; the first node (which every connection uses) killed.
    A quorum queue has its leader there; a classic queue lives on the last node (a classic
    queue on a lost node is lost with it, with or without floodwall)."""
    first, _, last = cluster.nodes
    queue = unique(f"failover-{kind}")
    declare((first if kind == "quorum" else last).endpoint, queue, kind)
    proc = sidecar(cluster.upstream, "--policies", str(policies(tmp_path, queue)),
                   "--management", cluster.management, *FAST)
    wait_for(lambda: all(n == "up" for n in proc.state()["upstream_nodes"].values())
             and len(proc.state()["upstream_nodes"]) == 3, timeout=30,
             what="every node probed and answering")
    if kind == "quorum":
        assert leader_of(cluster, queue) == first.nodename
    figures = through_a_fault(cluster, [proc], queue, first.kill)
    nodes = proc.state()["upstream_nodes"]
    assert nodes[str(first.endpoint.upstream)] == "down"
    assert figures["confirmed"] > 2500


def test_a_hung_node_is_left_and_its_connections_ended(cluster: LocalCluster, sidecar: Any,
                                                      tmp_path: Path) -> None:
    """The first node (which every connection uses) frozen (SIGSTOP) while the queue is
    tripped: the readiness probe finds it silent, floodwall ends the connections on it
    (theirs would wait for heartbeats) and new ones go to the next node. Every node's
    management API stalls on the hung node (RabbitMQ gathers queue figures across the
    cluster) until the cluster counts it gone (``net_ticktime``, 60-75 s): the depth rounds
    read the live nodes' Prometheus endpoints meanwhile, so the tripped queue is released
    on fresh figures and publishing resumes within 15 s. The quorum queue's leader is on
    the last node (with the leader itself hung, no node confirms until the cluster counts
    it gone, whatever floodwall does: docs/operations.md)."""
    first, _, last = cluster.nodes
    queue = unique("hung")
    declare(last.endpoint, queue, "quorum")
    proc = sidecar(cluster.upstream, "--policies", str(policies(tmp_path, queue)),
                   "--management", cluster.management, "--prometheus", cluster.prometheus,
                   *FAST)
    figures = through_a_fault(cluster, [proc], queue, lambda: cluster.freeze(first),
                              tripped_first=True, watch_from=2, load_after=HUNG_LOAD)
    print(f"hung node, queue tripped: publishing resumed {figures['resumed_after']:.1f}s "
          f"after the hang, its longest pause {figures['longest_pause']:.1f}s, the queue at "
          f"most {figures['depth_max'] // KIB:.0f} KiB")
    assert figures["longest_pause"] <= RESUMES_WITHIN, (
        f"publishing stopped for {figures['longest_pause']:.1f}s after the hang")
    assert proc.state()["upstream_nodes"][str(first.endpoint.upstream)] == "down"
    lines = proc.logfile.read_text().splitlines()
    left = [logged_at(line) - figures["fault_at"] for line in lines
            if "event=upstream_node_lost" in line]
    assert left, "no connection was ended on the hung node"
    assert max(left) <= NODE_LEFT_WITHIN, f"connections left the hung node after {left}s"
    switched = [line for line in lines if "event=depth_source_switched" in line]
    assert switched and "source=prometheus" in switched[0], switched


#: HAProxy's health check as a team would put it in front of RabbitMQ: a TCP connect, which a
#: hung node passes (its port still completes handshakes).
TCP_CHECK = "    default-server check inter 1s fall 2 rise 2\n"
#: A check that speaks AMQP: the protocol header out, the first bytes of ``connection.start``
#: (a method frame on channel 0) back within 2 s; sessions to a node marked down are cut, so
#: connections on a hung node end and reconnect to the next (docs/operations.md).
AMQP_CHECK = """    option tcp-check
    tcp-check connect
    tcp-check send-binary 414d515000000901
    tcp-check expect binary 010000
    timeout check 2s
    default-server check inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
"""


@contextlib.contextmanager
def _haproxy(cluster: LocalCluster, tmp_path: Path, check: str) -> Iterator[BrokerEndpoint]:
    """HAProxy in TCP mode in front of the cluster, ``balance first`` with ``check``, on a
    port of its own."""
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.fail("haproxy is not installed: `make test` installs it (Debian's haproxy)")
    port = free_port()
    servers = "\n".join(f"    server n{i} {ep.host}:{ep.amqp_port}"
                        for i, ep in enumerate(cluster.endpoints))
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"""global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend amqp
    bind 127.0.0.1:{port}
    default_backend rabbit
backend rabbit
    balance first
{check}{servers}
""")
    proc = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        first = cluster.endpoints[0]
        wait_for(lambda: _connects("127.0.0.1", port), timeout=20, what="haproxy listening")
        yield BrokerEndpoint("127.0.0.1", port, first.management_port)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def haproxy(cluster: LocalCluster, tmp_path: Path) -> Iterator[BrokerEndpoint]:
    with _haproxy(cluster, tmp_path, TCP_CHECK) as endpoint:
        yield endpoint


@pytest.fixture
def haproxy_amqp_check(cluster: LocalCluster, tmp_path: Path) -> Iterator[BrokerEndpoint]:
    with _haproxy(cluster, tmp_path, AMQP_CHECK) as endpoint:
        yield endpoint


def _connects(host: str, port: int) -> bool:
    import socket
    try:
        with socket.create_connection((host, port), 1):
            return True
    except OSError:
        return False


def test_behind_a_load_balancer_the_node_behind_it_killed(
        cluster: LocalCluster, sidecar: Any, haproxy: BrokerEndpoint, tmp_path: Path) -> None:
    """floodwall's upstream is HAProxy (one address); the node HAProxy sends everything to
    is killed, with the quorum queue's leader on it. HAProxy's TCP check finds it gone."""
    first = cluster.nodes[0]
    queue = unique("balanced")
    declare(first.endpoint, queue, "quorum")
    proc = sidecar(haproxy.upstream, "--policies", str(policies(tmp_path, queue)),
                   "--management", cluster.management, *FAST)
    # /readyz is not watched: behind a balancer floodwall's probe sees what the balancer
    # routes to, the dead node included until the balancer's own checks drop it
    through_a_fault(cluster, [proc], queue, first.kill, watch_ready=False)


def test_behind_a_load_balancer_with_an_amqp_check_the_node_behind_it_hung(
        cluster: LocalCluster, sidecar: Any, haproxy_amqp_check: BrokerEndpoint,
        tmp_path: Path) -> None:
    """floodwall's upstream is HAProxy; the node it sends everything to is frozen (SIGSTOP)
    while the queue is tripped. A TCP check passes a hung node; HAProxy's AMQP check finds it
    silent, marks it down and cuts the sessions to it, so floodwall's connections end and
    reconnect through HAProxy to the next node; the depth comes from the live nodes'
    Prometheus endpoints while every management API stalls on the hung node."""
    first, _, last = cluster.nodes
    queue = unique("balanced-hung")
    declare(last.endpoint, queue, "quorum")
    proc = sidecar(haproxy_amqp_check.upstream, "--policies",
                   str(policies(tmp_path, queue)), "--management", cluster.management,
                   "--prometheus", cluster.prometheus, *FAST)
    figures = through_a_fault(cluster, [proc], queue, lambda: cluster.freeze(first),
                              tripped_first=True, watch_from=2, load_after=HUNG_LOAD,
                              watch_ready=False)
    print(f"behind HAProxy, hung node, queue tripped: publishing resumed "
          f"{figures['resumed_after']:.1f}s after the hang, its longest pause "
          f"{figures['longest_pause']:.1f}s")
    assert figures["longest_pause"] <= RESUMES_WITHIN, (
        f"publishing stopped for {figures['longest_pause']:.1f}s after the hang")


def test_a_bad_node_list_is_refused_at_start(tmp_path: Path) -> None:
    proc = ProxyProcess("127.0.0.1:1,,127.0.0.1:2", tmp_path / "bad.log")
    with pytest.raises(Exception, match="empty item"):
        proc.start(timeout=20)



def rotated(items: Sequence[str], start: int) -> str:
    return ",".join([*items[start:], *items[:start]])


def test_a_fleet_on_three_nodes_holds_its_capacity_through_the_loss_of_one(
        cluster: LocalCluster, sidecar: Any, tmp_path: Path) -> None:
    """Three sidecars, each with the node list starting at a different node (so the fleet's
    members, and their own queues, sit on different nodes), a publisher with confirms each
    at full speed into one quorum queue. The node of the second sidecar is killed: it moves
    to the next node and rejoins the fleet; the shared capacity holds throughout."""
    queue = unique("fleet-failover")
    declare(cluster.nodes[2].endpoint, queue, "quorum")
    upstreams = [ep.upstream for ep in cluster.endpoints]
    managements = [ep.management_url for ep in cluster.endpoints]
    fleet = [sidecar(rotated(upstreams, i), "--policies", str(policies(tmp_path, queue)),
                     "--management", rotated(managements, i), "--fleet", "failover", *FAST)
             for i in range(3)]

    def members(proc: ProxyProcess) -> int:
        """The fleet's size as ``proc`` sees it (its members list names the others)."""
        doc = (proc.state().get("flow") or {}).get("fleet") or {}
        return len(doc.get("members", [])) + 1
    wait_for(lambda: all(members(p) == 3 for p in fleet), timeout=60,
             what="every sidecar seeing the fleet of three")
    through_a_fault(cluster, fleet, queue, cluster.nodes[1].kill)
    wait_for(lambda: all(members(p) == 3 for p in fleet), timeout=60,
             what="the moved sidecar back in the fleet")


#: The stream test's capacity: reached after the failover (a stream keeps what it is sent).
STREAM_CAPACITY = 2048 * KIB


def read_stream(ep: BrokerEndpoint, queue: str) -> list[int]:
    """Every number in stream ``queue``, from its first offset, in order (read on ``ep``)."""
    conn = pika.BlockingConnection(direct_params(ep))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        got: list[int] = []
        for method, _, body in ch.consume(queue, arguments={"x-stream-offset": "first"},
                                          inactivity_timeout=3.0):
            if method is None:
                break
            ch.basic_ack(method.delivery_tag)
            got.append(seq_of(body))
        ch.cancel()
        return got
    finally:
        close_quietly(conn)


def test_a_stream_through_the_loss_of_the_node_floodwall_uses(
        cluster: LocalCluster, sidecar: Any, tmp_path: Path) -> None:
    """A stream (its leader on the first node, replicas on the others) policed through
    floodwall, a publisher with confirms at full speed; the first node, which every
    connection uses, killed: publishing resumes within 15 s on the next node, the policy
    still polices the stream there (a stream's depth is what it retains: consumers do not
    shrink it, so at capacity it stays tripped), nothing confirmed is lost and the stream
    holds within capacity + 256 KiB."""
    first, second, _ = cluster.nodes
    queue = unique("failover-stream")
    declare(first.endpoint, queue, "stream")
    proc = sidecar(cluster.upstream, "--policies",
                   str(policy_file(tmp_path / "p.yaml",
                                   capped("stream", queue, f"{STREAM_CAPACITY // KIB}KiB",
                                          f"{STREAM_CAPACITY // 2 // KIB}KiB"))),
                   "--management", cluster.management, "--prometheus", cluster.prometheus,
                   *FAST)
    assert leader_of(cluster, queue) == first.nodename
    publisher = ConfirmedPublisher(proc.port, queue)
    publisher.start()
    try:
        wait_for(lambda: len(publisher.confirmed) > 500, timeout=60,
                 what="500 confirmed publishes before the fault")
        moment = time.monotonic()
        first.kill()
        wait_for(lambda: publisher.first_confirm_after(moment + 0.5) is not None,
                 timeout=RESUMES_WITHIN + 30, interval=0.2,
                 what="a confirmed publish after the kill")
        resumed = publisher.first_confirm_after(moment + 0.5)
        assert resumed is not None
        resumed_after = resumed - max(publisher.last_confirm_before(moment), moment)
        wait_for(lambda: tripped(proc, queue), timeout=90, interval=0.1,
                 what="the stream tripped at capacity on the next node")
        # A stream keeps what it is sent: tripped, it stays tripped (held publishes are
        # admitted only into room its estimate, which errs high, turns out to have), at every
        # look for 3 s (time for a publisher not held to go past the bound).
        until = time.monotonic() + 3
        while time.monotonic() < until:
            assert tripped(proc, queue)
            time.sleep(0.1)
        state = next(q for q in proc.state()["flow"]["queues"]  # type: ignore[index]
                     if q["queue"] == queue)
    finally:
        stop_all([publisher])  # (a publish held by the tripped stream ends with the sidecar)
    confirmed = publisher.tagged()
    kept = read_stream(second.endpoint, queue)
    print(f"stream: publishing resumed {resumed_after:.1f}s after the kill; {len(confirmed)} "
          f"confirmed, {len(kept)} in the stream ({len(kept) * SIZE // KIB} KiB); floodwall's "
          f"estimate {state['depth']['estimate']}, ready count {state['depth']['ready_count']}")
    assert resumed_after <= RESUMES_WITHIN, f"publishing resumed {resumed_after:.1f}s after"
    assert confirmed <= set(kept), f"{len(confirmed - set(kept))} confirmed messages lost"
    assert len(kept) * SIZE <= STREAM_CAPACITY + OVERSHOOT, f"{len(kept)} messages kept"
    assert proc.state()["upstream_nodes"][str(first.endpoint.upstream)] == "down"


def connection_nodes(proc: ProxyProcess) -> set[str]:
    return {str(c.get("node")) for c in proc.state()["connections"]}  # type: ignore[union-attr]


def test_a_node_back_takes_connections_again_in_its_place(cluster: LocalCluster,
                                                         sidecar: Any) -> None:
    """The first node killed: new connections go to the second; started again, the probe
    finds it answering and new connections go to it again (the order given), while the
    connection already on the second node stays there."""
    first, second, _ = cluster.nodes
    proc = sidecar(cluster.upstream, "--upstream-probe-interval", "1s")
    wait_for(lambda: proc.state()["upstream_nodes"].get(first.endpoint.upstream) == "up",
             timeout=30, what="the first node probed")

    def client() -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, connection_attempts=1, socket_timeout=5))
    on_first = client()
    assert connection_nodes(proc) == {first.endpoint.upstream}
    first.kill()
    wait_for(lambda: not on_first.is_open or _closed_by_peer(on_first), timeout=30,
             what="the client's connection on the killed node ended")
    on_second = client()
    assert connection_nodes(proc) == {second.endpoint.upstream}
    first.start()
    wait_for(lambda: proc.state()["upstream_nodes"].get(first.endpoint.upstream) == "up",
             timeout=60, what="the restarted node found answering")
    again = client()
    assert connection_nodes(proc) == {first.endpoint.upstream, second.endpoint.upstream}
    for conn in (on_second, again):
        conn.close()


def _closed_by_peer(conn: pika.BlockingConnection) -> bool:
    try:
        conn.process_data_events(0.1)
    except (pika.exceptions.AMQPError, OSError):
        return True
    return not conn.is_open


def test_topology_made_at_any_node_is_learned_from_its_events(
        cluster: LocalCluster, sidecar: Any, tmp_path: Path) -> None:
    """floodwall on the first node; a queue that its policy matches is declared straight at
    the last node after floodwall started: the broker's topology events (published by the
    node that made the change, consumed on another) police it, with no full sync (an hour
    apart here) and no publish asking for it."""
    first, _, last = cluster.nodes
    prefix = unique("anynode")
    proc = sidecar(cluster.upstream, "--policies",
                   str(policy_file(tmp_path / "p.yaml", capped("anynode", f"{prefix}.*"))),
                   "--management", cluster.management, "--topology-interval", "1h", *FAST)
    wait_for(lambda: any("event=topology_events_up" in line
                         for line in proc.logfile.read_text().splitlines()),
             timeout=30, what="floodwall consuming the topology events")
    own = [line for line in proc.logfile.read_text().splitlines()
           if "event=own_connection_up" in line]
    assert own and all(f"upstream={first.endpoint.upstream}" in line for line in own), own
    queue = f"{prefix}.orders"
    declare(last.endpoint, queue, "quorum")

    def policed() -> bool:
        flow = proc.state().get("flow") or {}
        return any(q["queue"] == queue for q in flow.get("queues", []))  # type: ignore[union-attr]
    wait_for(policed, timeout=30, what="the queue declared at another node policed")
    lines = [line for line in proc.logfile.read_text().splitlines()
             if "event=queues_policed" in line and queue in line]
    assert lines and "learned_by=event" in lines[0], lines
