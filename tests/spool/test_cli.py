"""``floodwall spool ls|show|replay|purge`` on a stopped proxy's spool directory."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from floodwall.cli import main
from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.spool.manager import SpoolLimits, SpoolManager
from floodwall.spool.records import SpoolRecord

pika = pytest.importorskip("pika")


def props(size: int) -> bytes:
    return (60).to_bytes(2, "big") + b"\0\0" + size.to_bytes(8, "big") + b"\0\0"


def make_spool(root: Path, key: tuple[str, str], count: int, age: float = 0.0,
               exchange: str = "orders-x") -> list[SpoolRecord]:
    m = SpoolManager(root, SpoolLimits(min_free_bytes=0), segment_bytes=4096)
    recs = []
    for i in range(count):
        body = f"body {i:04d} ".encode() + b"z" * 100
        r = SpoolRecord(0, time.time() - age + i * 0.001, exchange, f"rk.{i}", props(len(body)),
                        body)
        m.append(key, r, 1 << 40)
        recs.append(r)
    m.sync()
    m.close()
    return recs


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["spool", *args], input=input, env=env)


def test_ls_table_and_json(tmp_path: Path) -> None:
    make_spool(tmp_path, ("/", "orders.eu"), 50, age=90)
    make_spool(tmp_path, ("billing", "audit"), 3)
    m = SpoolManager(tmp_path)  # confirm 10 of orders.eu: they no longer count
    spool = m.spool(("/", "orders.eu"))
    spool.confirmed_through(10, sum(r.size for r in list(spool.records())[:10]), 10)
    m.close()
    out = invoke("ls", "--spool-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split()[:6] == ["VHOST", "QUEUE", "RECORDS", "BYTES", "OLDEST", "SEGMENTS"]
    orders = next(line for line in lines if "orders.eu" in line).split()
    assert orders[0] == "/" and orders[2] == "40" and 85 < float(orders[4].rstrip("s")) < 100
    assert int(orders[5]) >= 1
    assert "# 43 records" in lines[-1]
    doc = json.loads(invoke("ls", "--spool-dir", str(tmp_path), "--json").output)
    by = {d["queue"]: d for d in doc}
    assert by["audit"]["vhost"] == "billing" and by["audit"]["records"] == 3
    assert by["orders.eu"]["first_seq"] == 11 and by["orders.eu"]["last_seq"] == 50
    assert 80 < by["orders.eu"]["oldest_age_seconds"] < 100


def test_ls_reports_a_torn_tail_without_touching_it(tmp_path: Path) -> None:
    make_spool(tmp_path, ("/", "q"), 5)
    seg = sorted((tmp_path / "%2F" / "q").glob("*.seg"))[-1]
    with open(seg, "ab") as f:
        f.write(b"FWR1\0\0")
    size = seg.stat().st_size
    out = invoke("ls", "--spool-dir", str(tmp_path))
    assert "torn tail 6 B" in out.output
    assert seg.stat().st_size == size  # read only


def test_show_lists_records_with_limit(tmp_path: Path) -> None:
    make_spool(tmp_path, ("/", "orders"), 30)
    out = invoke("show", "orders", "--spool-dir", str(tmp_path), "--limit", "5", "--peek", "9")
    assert out.exit_code == 0, out.output
    rows = [line.split("\t") for line in out.output.splitlines()[1:-1]]
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"]
    assert rows[2][2:5] == ["orders-x", "rk.2", "110"] and rows[2][5] == "b'body 0002'..."
    assert "first 5 shown" in out.output
    missing = invoke("show", "nope", "--spool-dir", str(tmp_path))
    assert missing.exit_code == 1 and "spooled queues: orders@/" in missing.output


def test_purge_asks_then_deletes_and_refuses_a_running_proxys_spool(tmp_path: Path) -> None:
    make_spool(tmp_path, ("/", "orders"), 8)
    no = invoke("purge", "orders", "--spool-dir", str(tmp_path), input="n\n")
    assert no.exit_code == 1 and "Delete 8 spooled records" in no.output
    assert (tmp_path / "%2F" / "orders").is_dir()
    running = SpoolManager(tmp_path)
    running.lock()
    locked = invoke("purge", "orders", "--spool-dir", str(tmp_path), "--yes")
    assert locked.exit_code == 1 and "in use by another process" in locked.output
    running.close()
    yes = invoke("purge", "orders", "--spool-dir", str(tmp_path), input="y\n")
    assert yes.exit_code == 0 and "purged 8 records" in yes.output
    assert not (tmp_path / "%2F" / "orders").exists()
    assert "0 records" in invoke("ls", "--spool-dir", str(tmp_path)).output


# --- replay against the broker --------------------------------------------------------

@pytest.fixture
def channel(broker: BrokerEndpoint) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.amqp_port,
        credentials=pika.PlainCredentials(broker.username, broker.password)))
    yield conn.channel()
    conn.close()


def replay_with_login(broker: BrokerEndpoint, queue: str, spool_dir: Path) -> Any:
    """``floodwall spool replay QUEUE`` to the broker, its login from the environment."""
    env = {"FLOODWALL_AMQP_USERNAME": broker.username,
           "FLOODWALL_AMQP_PASSWORD": broker.password}
    return invoke("replay", queue, "--spool-dir", str(spool_dir),
                  "--upstream", f"{broker.host}:{broker.amqp_port}", env=env)


def take_all(channel: Any, queue: str) -> list[tuple[Any, bytes]]:
    """Every message in ``queue`` now, in order, as (method, body)."""
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((method, body))


@pytest.mark.broker
def test_replay_publishes_in_order_and_deletes(broker: BrokerEndpoint, channel: Any,
                                               tmp_path: Path) -> None:
    q = f"cli-replay-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(q)
    recs = make_spool(tmp_path, ("/", q), 500)
    out = replay_with_login(broker, q, tmp_path)
    assert out.exit_code == 0, out.output
    assert "replayed 500 records" in out.output and "0 left" in out.output
    got = take_all(channel, q)
    assert all(m.exchange == "" and m.routing_key == q for m, _ in got)
    assert [body for _, body in got] == [r.body for r in recs]
    assert not list((tmp_path / "%2F" / q).glob("*.seg"))
    channel.queue_delete(q)


@pytest.mark.broker
def test_replay_of_a_damaged_spool_says_what_it_skipped_and_replays_the_rest(
        broker: BrokerEndpoint, channel: Any, tmp_path: Path) -> None:
    q = f"cli-damaged-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(q)
    recs = make_spool(tmp_path, ("/", q), 100)  # several 4 KiB segments
    first = sorted((tmp_path / "%2F" / q).glob("*.seg"))[0]
    damaged = bytearray(first.read_bytes())
    damaged[200] ^= 0xFF  # inside the second record
    first.write_bytes(bytes(damaged))
    (tmp_path / "%2F" / q / "x.seg").write_bytes(b"not a segment")
    shown = invoke("show", q, "--spool-dir", str(tmp_path), "--limit", "0")
    assert "bytes skipped" in shown.output and "x.seg" in shown.output
    out = replay_with_login(broker, q, tmp_path)
    assert out.exit_code == 0, out.output
    assert "damaged bytes skipped, 1 unconfirmed records in them lost" in out.output
    assert "x.seg: not a segment name" in out.output
    assert "replayed 99 records" in out.output
    assert [body for _, body in take_all(channel, q)] == [r.body for r in recs[:1] + recs[2:]]
    channel.queue_delete(q)


@pytest.mark.broker
def test_replay_to_a_missing_queue_keeps_the_records(broker: BrokerEndpoint,
                                                     tmp_path: Path) -> None:
    q = f"cli-missing-{uuid.uuid4().hex[:8]}"
    make_spool(tmp_path, ("/", q), 20)
    out = invoke("replay", q, "--spool-dir", str(tmp_path),
                 "--upstream", f"{broker.host}:{broker.amqp_port}")
    assert out.exit_code == 1 and "returned" in out.output and "queue there?" in out.output
    assert "# 20 records" in invoke("ls", "--spool-dir", str(tmp_path)).output


@pytest.mark.broker
def test_show_and_replay_amqp10_records(broker: BrokerEndpoint, channel: Any,
                                        tmp_path: Path) -> None:
    """1.0 records are shown with their address and replayed over AMQP 1.0 to the queue."""
    from tests.io.test_spool_service import amqp10_record, body_of

    q = f"cli-replay10-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(q)
    m = SpoolManager(tmp_path, SpoolLimits(min_free_bytes=0))
    recs = [amqp10_record(i, "/exchange/amq.fanout") for i in range(50)]
    for r in recs:
        m.append(("/", q), r, 1 << 40)
    m.sync()
    m.close()
    shown = invoke("show", q, "--spool-dir", str(tmp_path), "--limit", "1")
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[1].split("\t")[2] == "(amqp10) /exchange/amq.fanout"
    out = replay_with_login(broker, q, tmp_path)
    assert out.exit_code == 0, out.output
    assert "replayed 50 records" in out.output and "0 left" in out.output
    assert [body for _, body in take_all(channel, q)] == [body_of(r) for r in recs]
    channel.queue_delete(q)


@pytest.mark.broker
def test_replay_of_amqp10_records_to_a_missing_queue_keeps_them(broker: BrokerEndpoint,
                                                                tmp_path: Path) -> None:
    """RabbitMQ 3.10 accepts (and drops) a 1.0 transfer to a missing queue: the replay
    asks whether the queue is there first."""
    from tests.io.test_spool_service import amqp10_record

    q = f"cli-missing10-{uuid.uuid4().hex[:8]}"
    m = SpoolManager(tmp_path, SpoolLimits(min_free_bytes=0))
    for i in range(20):
        m.append(("/", q), amqp10_record(i, f"/amq/queue/{q}"), 1 << 40)
    m.sync()
    m.close()
    out = invoke("replay", q, "--spool-dir", str(tmp_path),
                 "--upstream", f"{broker.host}:{broker.amqp_port}")
    assert out.exit_code == 1 and "returned" in out.output and "queue there?" in out.output
    assert "# 20 records" in invoke("ls", "--spool-dir", str(tmp_path)).output
