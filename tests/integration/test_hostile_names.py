"""Queue names that are only dots, end to end: ``floodwall run --spool-dir`` in front of the
real broker with spooling policies for queues ``.`` and ``..``. Publishes confirmed from the
spool land in each queue's own directory, ``floodwall spool ls`` shows them, a restarted
proxy replays every one of them, and the depth of each (read through the management API,
where ``..`` is not "the level above") stays known, as does every other policed queue's."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from click.testing import CliRunner

from floodwall.cli import main
from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    direct_params,
    drain_direct,
    numbered,
    pika_params,
    policy_file,
    ready_count,
    seq_of,
    start_flow,
    unique,
)

pytestmark = [pytest.mark.broker, pytest.mark.load_tolerant]

KIB = 1024
DOTS = (".", "..")
FAST = ("--depth-interval", "50ms", "--management-interval", "1s", "--drain-timeout", "1s")


def spooled(name: str, queue: str) -> str:
    return (f'{{name: {name}, match: {{queue: "{queue}"}}, capacity: 16KiB, resume: 8KiB, '
            "overflow: spool, deadline: 60s, "
            "spool: {max_bytes: 64MiB, fsync: group, group_commit_ms: 2}}")


@pytest.fixture
def dot_queues(broker: BrokerEndpoint) -> Iterator[tuple[str, ...]]:
    """Queues ``.`` and ``..`` (names no other test can make unique), empty, deleted after."""
    def reset(declare: bool) -> None:
        conn = pika.BlockingConnection(direct_params(broker))
        ch = conn.channel()
        for q in DOTS:
            ch.queue_delete(q)
            if declare:
                ch.queue_declare(q)
        conn.close()

    reset(True)
    yield DOTS
    reset(False)


def start(start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint,
          policies: Path, spool: Path) -> FlowProxy:
    return start_flow(start_floodwall, broker, policies, "--spool-dir", str(spool), *FAST)


def depth_known_everywhere(flow: FlowProxy, queues: list[str]) -> bool:
    states = [flow.queue_state(q) for q in queues]
    return all(s is not None and s["depth"]["known"] and s["depth"]["estimate"] is not None
               for s in states)


def management_messages(flow: FlowProxy, queue: str) -> int | None:
    state = flow.queue_state(queue)
    broker_depth = state["depth"]["broker"] if state is not None else None
    return None if broker_depth is None else int(broker_depth["messages"])


def test_dot_only_queues_spool_survive_a_restart_and_replay_everything(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint,
        dot_queues: tuple[str, ...], tmp_path: Path) -> None:
    other = unique("dots-other")
    policies = policy_file(tmp_path / "p.yaml", spooled("dot", "."), spooled("dotdot", ".."),
                           spooled("other", other))
    spool = tmp_path / "spool"
    flow = start(start_floodwall, broker, policies, spool)
    with pika.BlockingConnection(pika_params(flow.port)) as conn:
        conn.channel().queue_declare(other)
    watched = [*DOTS, other]
    wait_for(lambda: depth_known_everywhere(flow, watched), 30, what="depth of every queue")

    per_queue = 60
    with pika.BlockingConnection(pika_params(flow.port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(per_queue):
            for q in DOTS:
                ch.basic_publish("", q, numbered(i, KIB))  # returns once acked
    assert all(flow.tripped(q) for q in DOTS), [flow.queue_state(q) for q in DOTS]
    state = flow.proc.state()["spool"]
    assert isinstance(state, dict)
    on_disk = {q["queue"]: q["records"] for q in state["queues"]}
    assert set(on_disk) == set(DOTS) and all(n > 0 for n in on_disk.values()), on_disk
    # the management API reads each queue itself: nothing failed, every depth is known
    assert flow.log("management_api_failed") == []
    assert depth_known_everywhere(flow, watched)
    for q in DOTS:  # the management API's figures are this queue's own
        in_broker = ready_count(broker, q)
        wait_for(lambda q=q, n=in_broker: management_messages(flow, q) == n, 15,
                 what=f"the management figures of {q!r}: the broker's {in_broker} messages")

    flow.proc.stop()
    # each queue its own directory; nothing written into the root or the vhost's folder
    assert sorted(p.name for p in (spool / "%2F").iterdir()) == ["%2E", "%2E%2E"]
    assert not list(spool.glob("*.seg")) and not list((spool / "%2F").glob("*.seg"))
    listed = CliRunner().invoke(main, ["spool", "ls", "--json", "--spool-dir", str(spool)])
    assert listed.exit_code == 0, listed.output
    docs = {d["queue"]: d["records"] for d in json.loads(listed.output)}
    assert docs == on_disk, (docs, on_disk)

    again = start(start_floodwall, broker, policies, spool)
    wait_for(lambda: depth_known_everywhere(again, watched), 30, what="depth after restart")
    got: dict[str, list[bytes]] = {}

    def drain(q: str) -> None:
        got[q] = drain_direct(broker, q, per_queue, timeout=90)

    threads = [threading.Thread(target=drain, args=(q,)) for q in DOTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for q in DOTS:
        assert [seq_of(b) for b in got[q]] == list(range(per_queue)), q
    wait_for(lambda: again.proc.state()["spool"]["records"] == 0,  # type: ignore[index]
             15, what="an empty spool")
    assert again.log("management_api_failed") == []
    assert again.log("spool_entry_skipped") == []
