"""The seed corpus: small valid inputs for each harness (handshakes, publishes, transfers,
records, policies), written to ``tests/fuzz/corpus/TARGET/`` by
``python -m tests.fuzz.seeds``. The files are kept in the tree; this script says how they
were made and makes them again (the same bytes)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.fuzz.script import write_script

CORPUS = Path(__file__).parent / "corpus"
KNOWN = Path(__file__).parent / "known"
DICTS = Path(__file__).parent / "dicts"
ROOT = Path(__file__).resolve().parents[2]

# ops, as the harnesses read them
CLIENT, SERVER, CLIENT_BYTEWISE, TIME, TRIP, RELEASE, EXPIRE, ALARM = range(8)
HANDSHAKE, CONFIRMS = 1, 2
HELD, REFUSED, SPOOLED, SHADOWED = (1 << 2, 1 << 3, 1 << 4, 1 << 5)
TOPOLOGY = 1 << 6
CLIENT_FRAMES, SERVER_FRAMES = 8, 9


def amqp091() -> Iterator[tuple[str, bytes]]:
    from pamqp import commands

    from tests.amqp091.wire import (
        HEARTBEAT,
        client_handshake,
        content,
        method,
        publish,
        server_handshake,
    )

    B, CH, C = commands.Basic, commands.Channel, commands.Connection

    def pub(channel: int, queue: str, size: int = 100) -> bytes:
        return b"".join(publish(channel, b"x" * size, routing_key=queue))

    opens = method(CH.Open(), 1) + method(CH.Open(), 2)
    opened = method(CH.OpenOk(), 1) + method(CH.OpenOk(), 2)
    yield "handshake", write_script(0, [
        (SERVER, b"".join(server_handshake())), (CLIENT, b"".join(client_handshake())),
        (CLIENT, opens), (SERVER, opened),
        (CLIENT, pub(1, "free") + pub(2, "held")),
        (CLIENT, method(CH.Close(200, "bye", 0, 0), 1)), (SERVER, method(CH.CloseOk(), 1)),
        (CLIENT, method(C.Close(200, "bye", 0, 0))), (SERVER, method(C.CloseOk())),
    ])
    yield "bytewise-handshake", write_script(0, [
        (SERVER, b"".join(server_handshake())),
        (CLIENT_BYTEWISE, b"".join(client_handshake())),
    ])
    everything = HANDSHAKE | CONFIRMS | HELD | REFUSED | SPOOLED | SHADOWED
    yield "publish-each-queue", write_script(everything, [
        (CLIENT, method(commands.Confirm.Select(), 1) + pub(1, "held") + pub(1, "free")),
        (CLIENT, pub(1, "refused") + pub(1, "spooled") + pub(1, "shadowed")),
        (CLIENT, pub(2, "held") + pub(2, "refused") + pub(2, "spooled", 3000)),
        (SERVER, method(B.Ack(delivery_tag=1, multiple=True), 1)),
        (RELEASE, b"\x00"), (TIME, b"\x06"), (EXPIRE, b""),
    ])
    yield "hold-and-release", write_script(HANDSHAKE | HELD, [
        (CLIENT, pub(1, "held") + method(B.Qos(prefetch_count=5), 1) + pub(1, "free")),
        (CLIENT, method(CH.FlowOk(active=False), 1) + HEARTBEAT),
        (RELEASE, b"\x00"), (TRIP, b"\x00"), (CLIENT, pub(1, "held", 10)),
        (ALARM, b"\x01"), (CLIENT, pub(2, "free")), (ALARM, b"\x00"),
        (CLIENT, method(C.Close(200, "bye", 0, 0))),
    ])
    yield "spool-multi-frame", write_script(HANDSHAKE | CONFIRMS | SPOOLED, [
        (CLIENT, method(B.Publish(exchange="", routing_key="spooled"), 1)),
        (CLIENT, content(1, b"y" * 1500, frame_max=600)[0]),
        (CLIENT, b"".join(content(1, b"y" * 1500, frame_max=600)[1:])),
        (EXPIRE, b""), (RELEASE, b"\x02"),
    ])
    yield "reject-channel-close", write_script(HANDSHAKE | REFUSED, [
        (CLIENT, pub(1, "refused")), (SERVER, method(CH.CloseOk(), 1)),
        (CLIENT, method(CH.CloseOk(), 1) + opens[:len(method(CH.Open(), 1))]),
        (SERVER, method(CH.OpenOk(), 1)),
    ])
    def framed(*frames: bytes) -> bytes:
        """Whole 0-9-1 frames as op 8's argument: (type, channel, length, payload) each."""
        return b"".join(bytes([f[0] % 4, f[2], len(f) - 8]) + f[7:-1] for f in frames)

    header, body = content(1, b"f" * 40)
    yield "framed-publish", write_script(HANDSHAKE | HELD | SPOOLED, [
        (CLIENT_FRAMES, framed(method(B.Publish(exchange="", routing_key="spooled"), 1),
                               header, body)),
        (CLIENT_FRAMES, framed(method(B.Publish(exchange="", routing_key="held"), 1),
                               header, body, HEARTBEAT)),
        (SERVER_FRAMES, framed(method(CH.Flow(active=True), 1))),
    ])
    declare = commands.Queue.Declare(queue="held2", durable=True)
    yield "topology-watch", write_script(HANDSHAKE | TOPOLOGY, [
        (CLIENT, method(declare, 1)), (SERVER, method(commands.Queue.DeclareOk("held2", 0, 0), 1)),
        (CLIENT, method(commands.Queue.Bind(queue="held2", exchange="amq.direct",
                                            routing_key="k"), 1)),
        (SERVER, method(commands.Queue.BindOk(), 1)),
        (CLIENT, method(commands.Exchange.Declare(exchange="x", exchange_type="fanout"), 2)),
        (SERVER, method(commands.Exchange.DeclareOk(), 2)),
        (CLIENT, method(commands.Queue.Delete(queue="held2"), 1)),
        (SERVER, method(commands.Queue.DeleteOk(0), 1)),
    ])
    yield "tx-and-mandatory", write_script(HANDSHAKE | SPOOLED, [
        (CLIENT, method(commands.Tx.Select(), 1)
         + b"".join([method(B.Publish(exchange="", routing_key="spooled", mandatory=True), 2),
                     *content(2, b"m" * 10)]) + pub(1, "spooled")),
    ])


def amqp10() -> Iterator[tuple[str, bytes]]:
    from floodwall.wire.amqp10.types import Described, ULong, encode
    from floodwall.wire.relaycore import Side
    from tests.amqp10.streams import (
        EMPTY_FRAME,
        continuation,
        conversation,
        data_section,
        detach,
        disposition,
        flow,
        transfer,
    )

    for use_sasl in (True, False):
        talk = conversation(use_sasl=use_sasl)
        steps = [(CLIENT if who is Side.CLIENT else SERVER, data) for who, data in talk.events]
        yield f"conversation-sasl-{use_sasl}", write_script(2 if use_sasl else 0, steps)

    def message(size: int, to: str | None = None) -> bytes:
        props = b"" if to is None else encode(Described(ULong(0x73), [None, None, to]))
        return props + data_section(b"x" * size)

    everything = HANDSHAKE | HELD | REFUSED | SPOOLED | SHADOWED
    yield "transfer-each-link", write_script(everything, [
        (CLIENT, b"".join(transfer(0, h, h, message(100)) for h in range(5))),
        (CLIENT, transfer(0, 5, 5, message(50, "/amq/queue/spooled"))
         + transfer(0, 5, 6, message(50, "/queue/free"))),
        (SERVER, disposition(3, True, 0, 6) + EMPTY_FRAME),
        (RELEASE, b"\x00"), (TIME, b"\x10"), (EXPIRE, b""),
    ])
    def framed(*frames: bytes) -> bytes:
        """Whole 1.0 frames as op 8's argument: (type, channel, length, body) each."""
        return b"".join(bytes([f[5], f[7], len(f) - 8]) + f[8:] for f in frames)

    yield "framed-transfers", write_script(everything, [
        (CLIENT_FRAMES, framed(transfer(0, 2, 0, message(60)), transfer(0, 0, 1, message(9)),
                               transfer(0, 3, 2, message(9), more=True),
                               continuation(0, 3, message(9), more=False))),
        (SERVER_FRAMES, framed(flow(3, 10, 5), disposition(3, True, 0, 2))),
    ])
    big = message(1800)
    yield "spool-multi-frame", write_script(HANDSHAKE | SPOOLED, [
        (CLIENT, transfer(0, 2, 0, big[:700], more=True)),
        (CLIENT, continuation(0, 2, big[700:1400], more=True)),
        (CLIENT, continuation(0, 2, big[1400:], more=False)),
        (EXPIRE, b""), (RELEASE, b"\x02"),
    ])
    yield "hold-flow-detach", write_script(HANDSHAKE | HELD, [
        (CLIENT, transfer(0, 0, 0, message(10)) + flow(0, 0, 0)),
        (SERVER, flow(3, 10, 50)), (RELEASE, b"\x00"), (TRIP, b"\x00"),
        (CLIENT_BYTEWISE, transfer(0, 0, 1, message(5))),
        (CLIENT, detach(0, 0)), (SERVER, detach(3, 10)),
    ])


def spool() -> Iterator[tuple[str, bytes]]:
    from floodwall.spool.records import SpoolRecord

    def records(first: int, n: int) -> bytes:
        return b"".join(
            SpoolRecord(seq, 1000.0 + seq, "ex", f"q{seq}", bytes(14), b"b" * seq,
                        mandatory=seq % 2 == 0).encode() for seq in range(first, first + n))

    amqp10 = SpoolRecord.amqp10_message(1, 5.0, "/amq/queue/spooled", 0, b"\x00Sw\xa1\x02hi")
    yield "record", amqp10.encode()
    yield "segments", write_script(0, [
        (0, (1).to_bytes(4, "big") + records(1, 3)),
        (0, (4).to_bytes(4, "big") + records(4, 2)),
        (1, b"2\n"),
    ])
    torn = records(1, 2)
    yield "torn-tail", write_script(0, [
        (0, (1).to_bytes(4, "big") + torn), (0, (3).to_bytes(4, "big") + records(3, 1)[:-5]),
    ])
    payloads = b"".join(bytes([len(r) - 12]) + r[12:] for r in
                        (SpoolRecord(seq, 9.0, "", "q", bytes(14), b"p").encode()
                         for seq in (1, 2, 7)))
    yield "sealed-payloads", write_script(0, [(4, (1).to_bytes(4, "big") + payloads)])
    yield "stray-entries", write_script(0, [
        (0, (1).to_bytes(4, "big") + records(1, 1)), (2, b"\x05notes"), (3, b"\x04tmp1"),
    ])


def policy() -> Iterator[tuple[str, bytes]]:
    from tests.fuzz.harnesses import _policies

    for path in sorted((ROOT / "tests" / "policy_corpus").glob("*.yaml")):
        yield path.stem, path.read_bytes()
    yield "harness", _policies("/").encode()
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        yield f"shipped-{path.stem}", path.read_bytes()


SEEDS = {"amqp091": amqp091, "amqp10": amqp10, "spool": spool, "policy": policy}


def known_defects() -> Iterator[tuple[str, str, bytes]]:
    """(target, name, input): the reproductions of the defects a review found, written by hand
    in the harnesses' format (``tests/fuzz/known/``); the fuzzer's own finds are kept
    beside them."""
    import struct

    from pamqp import commands

    from floodwall.spool.records import SpoolRecord
    from tests.amqp091.wire import client_handshake, method, raw_frame, server_handshake
    from tests.amqp10.streams import continuation, transfer

    publish = method(commands.Basic.Publish(exchange="", routing_key="held"), 1)
    short_header = raw_frame(2, 1, b"\x00\x3c\x00\x00")  # 4 bytes: a content header is 14+
    yield "amqp091", "short-content-header-before-login", write_script(
        0, [(CLIENT, publish + short_header)])
    yield "amqp091", "short-content-header-held", write_script(
        HANDSHAKE | HELD, [(CLIENT, publish + short_header)])
    yield "amqp091", "tune-ok-frame-max-0-body-4gib", write_script(0, [
        (SERVER, b"".join(server_handshake())), (CLIENT, b"".join(client_handshake(0))),
        (CLIENT, struct.pack(">BHI", 3, 1, 0xFFFFFFF0) + b"x" * 100)])
    spool_publish = method(commands.Basic.Publish(exchange="", routing_key="spooled"), 1)
    yield "amqp091", "spool-capture-body-size-2-40", write_script(HANDSHAKE | SPOOLED, [
        (CLIENT, spool_publish + raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 1 << 40, 0))
         + raw_frame(3, 1, b"z" * 100))])
    section = b"\x00Su\xb0\x00\x00\x10\x00"  # a data section announcing 4 KiB
    yield "amqp10", "spool-capture-past-the-limit", write_script(HANDSHAKE | SPOOLED, [
        (CLIENT, transfer(0, 2, 0, section + b"a" * 900, more=True)),
        *[(CLIENT, continuation(0, 2, b"b" * 900, more=True)) for _ in range(3)]])
    base = 'version: 1\npolicies:\n  - name: x\n    match: {vhost: "/", queue: q}\n'
    yield "policy", "yaml-tag-bool", (base + "    capacity: 1MiB\n    signal: !!bool maybe\n"
                                      ).encode()
    yield "policy", "yaml-tag-timestamp", (base + "    capacity: !!timestamp x\n").encode()
    record = (1).to_bytes(4, "big") + SpoolRecord(1, 1.0, "", "q", bytes(14), b"b").encode()
    dot_seg = b"x.seg"
    yield "spool", "stray-x-seg-file", write_script(0, [(0, record), (2, b"\x05" + dot_seg)])
    yield "spool", "directory-5-seg", write_script(0, [(3, b"\x055.seg")])


def dictionaries() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """libFuzzer dictionaries (``tests/fuzz/dicts/TARGET.dict``): tokens a mutation may
    insert whole (frame starts, method ids, performative descriptors, keys, YAML tags)."""
    from pamqp import commands as c

    from floodwall.wire.amqp10 import performatives as p

    def ids(method: type) -> bytes:
        index = method.index  # type: ignore[attr-defined]
        return (index >> 16).to_bytes(2, "big") + (index & 0xFFFF).to_bytes(2, "big")

    words = [(q.lower(), q.encode()) for q in ("held", "refused", "spooled", "shadowed",
                                                "free", "EXTERNAL", "PLAIN", "ANONYMOUS")]
    amqp091 = [("method_ch1", b"\x01\x00\x01"), ("header_ch1", b"\x02\x00\x01"),
               ("body_ch1", b"\x03\x00\x01"), ("heartbeat", b"\x08\x00\x00\x00\x00\x00\x00\xce"),
               ("frame_end", b"\xce"), ("content_class", b"\x00\x3c\x00\x00"),
               ("size_max", b"\xff\xff\xff\xff"), ("size_zero", b"\x00\x00\x00\x00")]
    for m in (c.Basic.Publish, c.Basic.Ack, c.Basic.Nack, c.Confirm.Select, c.Tx.Select,
              c.Channel.Open, c.Channel.OpenOk, c.Channel.Close, c.Channel.CloseOk,
              c.Channel.Flow, c.Channel.FlowOk, c.Connection.StartOk, c.Connection.Tune,
              c.Connection.TuneOk, c.Connection.Open, c.Connection.Close,
              c.Connection.CloseOk, c.Queue.Declare, c.Queue.DeclareOk, c.Queue.Bind,
              c.Queue.Delete, c.Exchange.Declare):
        amqp091.append((m.name.replace(".", "_").lower(), ids(m)))
    yield "amqp091", amqp091 + words
    amqp10 = [("amqp_header", b"AMQP\x00\x01\x00\x00"), ("sasl_header", b"AMQP\x03\x01\x00\x00"),
              ("frame_start", b"\x02\x00\x00\x00"), ("sasl_frame_start", b"\x02\x01\x00\x00"),
              ("data_section", b"\x00\x53\x75"), ("properties", b"\x00\x53\x73"),
              ("list8", b"\xc0"), ("list32", b"\xd0"), ("true", b"\x41"), ("uint0", b"\x43"),
              ("null", b"\x40")]
    for name in ("OPEN", "BEGIN", "ATTACH", "FLOW", "TRANSFER", "DISPOSITION", "DETACH", "END",
                 "CLOSE", "SASL_INIT", "SASL_MECHANISMS", "SASL_OUTCOME"):
        amqp10.append((name.lower(), bytes([0x00, 0x53, getattr(p, name)])))
    for address in ("/amq/queue/held", "/amq/queue/spooled", "/queue/free", "vhost:/"):
        amqp10.append((f"address{len(amqp10)}", address.encode()))
    yield "amqp10", amqp10 + words
    keys = ("version:", "policies:", "defaults:", "name:", "match:", "vhost:", "queue:",
            "queue_regex:", "capacity:", "resume:", "max_messages:", "resume_messages:",
            "overflow:", "deadline:", "signal:", "on_unknown_depth:", "spool:", "mode:",
            "max_bytes:", "fsync:", "group_commit_ms:", "hold", "reject", "spool", "shadow",
            "enforce", "auto", "never", "group", "always", "MiB", "KiB", "GiB", "ms", "!!int",
            "!!bool", "!!timestamp", "!!float", "!!str", "!!binary", "!!set", "!!omap",
            "!!null", "!!seq", "!!map", "&a", "*a", "<<:", "---", "...", ".inf", ".nan", "0x",
            "0o", "1e9", "~", "in_flight_allowance:")
    yield "policy", [(f"t{i}", k.encode()) for i, k in enumerate(keys)]
    yield "spool", [("seg", b".seg"), ("cursor", b"cursor"), ("magic", b"FWR1"),
                    ("zeros", b"00000000000000000001"), ("dot", b"."), ("dotdot", b"..")]


def _dict_line(name: str, token: bytes) -> str:
    return f'{name}="' + "".join(f"\\x{b:02x}" for b in token) + '"'


def main(argv: list[str]) -> int:
    for target, tokens in dictionaries():
        DICTS.mkdir(parents=True, exist_ok=True)
        (DICTS / f"{target}.dict").write_text(
            "".join(_dict_line(name, token) + "\n" for name, token in tokens))
    for target, name, data in known_defects():
        folder = KNOWN / target
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    for target in argv or list(SEEDS):
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in SEEDS[target]():
            digest = hashlib.sha1(data).hexdigest()[:8]
            (folder / f"{name}-{digest}").write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
