"""The fuzz harnesses: one function per target, taking one input's bytes.

The rule of each (h11's): any input either works or raises the module's own protocol error,
never anything else, and what the code buffers stays within the limits it should. A harness
returns normally when the rule held and raises ``RuleBroken`` (or lets the unexpected
exception through) when it did not. They need no atheris: ``tests.fuzz.run`` drives them
under atheris, ``tests.fuzz.test_corpus`` replays the corpus and every crash input kept.

- ``amqp091``: a 0-9-1 core with its publish gate (policies that hold, reject, spool and
  shadow), fed client and broker bytes, the time, trips, releases, expiries and spool
  acknowledgements. The core's own error is ``failure`` set (``RelayCore``): nothing may
  leave ``receive_from_client`` / ``receive_from_server``.
- ``amqp10``: the same for a 1.0 core with its credit gate (SASL, open, begin, attach,
  transfer, flow, disposition).
- ``spool``: ``decode_at`` on raw bytes (a record or ``RecordError``), and a queue's
  directory of segment files, cursor and stray entries opened (recovery), read both ways and
  appended to (``SpoolError`` only).
- ``policy``: YAML text into ``parse_policies`` (a ``PolicySet`` or ``PolicyError``).
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import PolicyError, PolicySet, parse_policies, render_policies
from floodwall.enforce.amqp091.gate import PublishFlow
from floodwall.enforce.amqp10.gate import CreditFlow
from floodwall.enforce.states import PublishPhase
from floodwall.spool.log import SpoolError
from floodwall.spool.records import MAGIC, RecordError, SpoolRecord, decode_at
from floodwall.wire.amqp091.connection import Connection as Connection091
from floodwall.wire.amqp091.framing import FRAME_MIN_SIZE, FRAME_OVERHEAD
from floodwall.wire.amqp10.connection import Connection as Connection10
from floodwall.wire.amqp10.connection import Phase
from floodwall.wire.amqp10.framing import AMQP_HEADER, MIN_MAX_FRAME_SIZE, SASL_HEADER
from tests.fakes import Board, Clock, DefaultExchange, FakeSpool
from tests.fuzz.script import read_script


class RuleBroken(AssertionError):
    """The harness's rule did not hold for this input (what it buffered, what it counted)."""


# --- what the gated harnesses share ------------------------------------------------------

SPOOL_LIMIT: Final = 2048
"""The spooling policy's ``max_bytes``: small, so a capture past it fits in a fuzz input."""
DEPTH_TRIPPED: Final = 1_000_000
HUGE_SEQ: Final = 1 << 62


def _policies(vhost: str) -> str:
    return f"""
version: 1
policies:
  - {{name: held, match: {{vhost: "{vhost}", queue: "held*"}}, capacity: 2000, resume: 1000,
     deadline: 5s}}
  - {{name: refused, match: {{vhost: "{vhost}", queue: "refused*"}}, capacity: 2000,
     resume: 1000, overflow: reject}}
  - {{name: spooled, match: {{vhost: "{vhost}", queue: "spooled*"}}, capacity: 2000,
     resume: 1000, overflow: spool, spool: {{max_bytes: {SPOOL_LIMIT}B}}}}
  - {{name: shadowed, match: {{vhost: "{vhost}", queue: "shadowed*"}}, capacity: 2000,
     resume: 1000, mode: shadow}}
"""


QUEUES: Final = ("held", "refused", "spooled", "shadowed", "free")
POLICED: Final = QUEUES[:4]
_PARSED: dict[str, PolicySet] = {}  # parsed once per vhost: YAML costs more than a run


def _policy_set(vhost: str) -> PolicySet:
    parsed = _PARSED.get(vhost)
    if parsed is None:
        parsed = _PARSED[vhost] = parse_policies(_policies(vhost))
    return parsed


class Policed:
    """A flow controller over the four policies, a clock, the in-memory spool and the
    ``Board`` (what io/ does around a gate); ``step`` carries out the non-byte ops."""

    def __init__(self, vhost: str, tripped: int) -> None:
        self.vhost = vhost
        self.clock = Clock()
        self.fc = FlowController(DefaultExchange(), _policy_set(vhost))
        self.spool = FakeSpool()
        self.board = Board(self.fc, self.clock, self.spool)
        for q in QUEUES:
            self.fc.queue_seen((vhost, q), self.clock.t)
        for i, q in enumerate(POLICED):
            self.sample(q, DEPTH_TRIPPED if tripped >> i & 1 else 0)

    def sample(self, queue: str, nbytes: int) -> None:
        self.clock.t += 1
        self.fc.sampled_management((self.vhost, queue), ManagementSample(
            self.clock.t, nbytes // 100, 0, nbytes, nbytes, 0), self.clock.t)
        self.board.settle()

    def step(self, op: int, arg: bytes) -> None:
        """The ops that are not bytes: 3 time, 4 trip, 5 release, 6 expiry and spool
        durability, 7 a broker alarm raised or cleared."""
        pick = arg[0] if arg else 0
        if op == 3:
            self.clock.t += pick + 0.5
        elif op == 4:
            self.sample(POLICED[pick % len(POLICED)], DEPTH_TRIPPED)
        elif op == 5:
            self.sample(POLICED[pick % len(POLICED)], 0)
        elif op == 6:
            self.board.expire(self.clock.t)
            self.board.spool_durable({key: HUGE_SEQ for key in self.spool.records})
            self.board.settle()
        elif op == 7:
            self.fc.set_alarm("fuzz alarm" if pick & 1 else None)
            self.board.settle()

    def spool_limit(self, key: QueueKey) -> int:
        q = self.fc.queues.get(key)
        settings = q.policy.spool if q is not None else None
        return settings.max_bytes if settings is not None else 1 << 30


def _op(op: int, arg: bytes, frames: Callable[[bytes], bytes]) -> tuple[int, bytes]:
    """Ops 8 and 9: the argument is a list of frames the harness completes (their sizes and
    ends right, so mutations reach what is inside them), sent as ops 0 and 1."""
    op %= 16
    if op in (8, 9):
        return op - 8, frames(arg)
    return op % 8, arg


# --- AMQP 0-9-1 ---------------------------------------------------------------------------

V091: Final = "/orders"
FRAME_MAX_091: Final = 131072


def _handshake_091() -> tuple[bytes, bytes]:
    """(client, server) bytes of a whole handshake and channels 1 and 2 opened."""
    from pamqp import commands

    from tests.amqp091.wire import client_handshake, method, server_handshake
    ch = commands.Channel
    client = b"".join(client_handshake(FRAME_MAX_091)) + method(ch.Open(), 1) \
        + method(ch.Open(), 2)
    server = b"".join(server_handshake(FRAME_MAX_091)) + method(ch.OpenOk(), 1) \
        + method(ch.OpenOk(), 2)
    return client, server


_HANDSHAKE_091: tuple[bytes, bytes] | None = None


def amqp091(data: bytes) -> None:
    """Mode bits: 0 handshake done (broker frame_max 131072); 1 confirms on channel 1;
    2-5 which of held, refused, spooled, shadowed start tripped; 6 the topology watch on
    (declares, deletes, binds read); 7 SASL EXTERNAL relayed. Ops: 0 client bytes,
    1 broker bytes, 2 client bytes one at a time, 3-7 ``Policed.step``, 8 and 9 client and
    broker frames the harness frames (``_frames_091``), 10-15 as 2-7."""
    global _HANDSHAKE_091
    mode, steps = read_script(data)
    world = Policed(V091, mode >> 2)
    gate = PublishFlow(world.board.enforcement, 1)
    core = Connection091(gate, conn_id=1, watch_topology=bool(mode & 64),
                         refuse_external=not mode & 128)
    world.board.attach(1, core, gate)
    if mode & 1:
        if _HANDSHAKE_091 is None:
            _HANDSHAKE_091 = _handshake_091()
        client, server = _HANDSHAKE_091
        core.receive_from_server(server, world.clock.t)
        core.receive_from_client(client, world.clock.t)
        if mode & 2:
            gate.on_confirm_select(1)
    for step in steps:
        op, arg = _op(step.op, step.arg, _frames_091)
        if op == 0:
            core.receive_from_client(arg, world.clock.t)
        elif op == 1:
            core.receive_from_server(arg, world.clock.t)
        elif op == 2:
            for i in range(len(arg)):
                core.receive_from_client(arg[i : i + 1], world.clock.t)
        else:
            world.step(op, arg)
        core.data_for_server()
        core.data_for_client()
        core.events()
        _bounded_091(core, gate, world)
        if core.failure is not None:
            break
    gate.close()
    world.board.settle()
    if world.board.counters.held_bytes != 0:
        raise RuleBroken(f"held bytes left counted after the connection closed: "
                         f"{world.board.counters.held_bytes}")


def _frames_091(raw: bytes) -> bytes:
    """Frames from (type, channel, length, that many payload bytes) each: type 1 method,
    2 content header, 3 body, 0 heartbeat; the frame end added."""
    out, pos = bytearray(), 0
    while pos + 3 <= len(raw):
        ftype, channel, n = (8, 1, 2, 3)[raw[pos] % 4], raw[pos + 1], raw[pos + 2]
        payload = raw[pos + 3 : pos + 3 + n]
        out += struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"
        pos += 3 + n
    return bytes(out)


def frame_limit_091(core: Connection091) -> int | None:
    """The largest frame the client may send: FRAME_MIN_SIZE until tune-ok, then the lower
    of the broker's tune and the client's tune-ok (0 = none; None: neither sets one)."""
    if not core.tuned:
        return FRAME_MIN_SIZE
    limits = [t.frame_max for t in (core.server_tune, core.client_tune)
              if t is not None and t.frame_max]
    return max(min(limits), FRAME_MIN_SIZE) if limits else None


def _bounded_091(core: Connection091, gate: PublishFlow, world: Policed) -> None:
    inbound = core._client_in
    held = bytes(inbound.tail) if inbound.tail else (
        bytes(inbound.parts[0][:7]) if inbound.parts else b"")
    limit = frame_limit_091(core)
    if len(held) >= 7 and limit is not None:
        size = struct.unpack_from(">I", held, 3)[0]
        if size + FRAME_OVERHEAD > limit:
            raise RuleBroken(f"a partial client frame of {size} bytes is held while the "
                             f"frame limit is {limit}")
    counted = 0
    for ch in gate.channels.values():
        phase = {PublishPhase.AWAITING_HEADER: ch.awaiting is not None,
                 PublishPhase.FILLING: ch.filling is not None,
                 PublishPhase.DISCARDING: ch.discard_content > 0}
        if any(phase.values()) is (ch.publish is PublishPhase.READY) \
                or (ch.publish is not PublishPhase.READY and not phase[ch.publish]):
            raise RuleBroken(f"channel {ch.channel} is {ch.publish.value} with {phase}")
        item = ch.filling
        if item is not None and item.spool_to is not None:
            room = world.spool_limit(item.spool_to)
            if item.body_size > room:
                raise RuleBroken(f"a publish of {item.body_size} body bytes is assembled for "
                                 f"a spool of {room} bytes")
        kept = sum(i.nbytes if not isinstance(i, bytes) else len(i) for i in ch.held)
        if kept > ch.held_bytes or ch.held_bytes < 0:
            raise RuleBroken(f"channel {ch.channel} keeps {kept} bytes, counts "
                             f"{ch.held_bytes}")
        counted += ch.held_bytes
    if counted != gate.held_bytes:
        raise RuleBroken(f"the channels hold {counted} bytes, the gate counts "
                         f"{gate.held_bytes}")


# --- AMQP 1.0 -----------------------------------------------------------------------------

V10: Final = "/"
MAX_FRAME_10: Final = 131072
SERVER_CH: Final = 3
LINKS_10: Final = (("held", "/amq/queue/held"), ("refused", "/amq/queue/refused"),
                   ("spooled", "/amq/queue/spooled"), ("shadowed", "/amq/queue/shadowed"),
                   ("free", "/queue/free"), ("anon", None))


def _handshake_10() -> tuple[bytes, bytes]:
    """(client, server) bytes: open, begin, a sender per queue and an anonymous one, and the
    broker's credit for each."""
    from floodwall.wire.amqp10.performatives import ATTACH, FLOW, SOURCE, TARGET, performative
    from floodwall.wire.amqp10.types import UByte, UInt
    from tests.amqp10.streams import amqp, begin, open_

    def attach(channel: int, name: str, handle: int, role: bool, target: str | None) -> bytes:
        return amqp(ATTACH, channel, name=name, handle=UInt(handle), role=role,
                    snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0),
                    source=performative(SOURCE, address=None),
                    target=performative(TARGET, address=target),
                    initial_delivery_count=None if role else UInt(0))

    client = open_("client", MAX_FRAME_10, hostname="vhost:/") + begin(0)
    server = AMQP_HEADER + open_("broker", MAX_FRAME_10) + begin(SERVER_CH, remote_channel=0)
    for h, (name, target) in enumerate(LINKS_10):
        client += attach(0, name, h, False, target)
        server += attach(SERVER_CH, name, 10 + h, True, target)
        server += amqp(FLOW, SERVER_CH, next_incoming_id=UInt(0), incoming_window=UInt(5000),
                       next_outgoing_id=UInt(0), outgoing_window=UInt(5000),
                       handle=UInt(10 + h), delivery_count=UInt(0), link_credit=UInt(1000))
    return client, server


_HANDSHAKE_10: tuple[bytes, bytes] | None = None


def amqp10(data: bytes) -> None:
    """Mode bits: 0 open, begin and six sender links done (both peers' max-frame-size
    131072); 1 (without bit 0) the SASL header; 2-5 which of held, refused, spooled,
    shadowed start tripped; 6 SASL EXTERNAL relayed. Ops as ``amqp091`` (frames by
    ``_frames_10``)."""
    global _HANDSHAKE_10
    mode, steps = read_script(data)
    world = Policed(V10, mode >> 2)
    gate = CreditFlow(world.board.enforcement, 1)
    header = SASL_HEADER if mode & 3 == 2 else AMQP_HEADER
    core = Connection10(header, gate, conn_id=1, refuse_external=not mode & 64)
    world.board.attach(1, core, gate)
    if mode & 1:
        if _HANDSHAKE_10 is None:
            _HANDSHAKE_10 = _handshake_10()
        client, server = _HANDSHAKE_10
        core.receive_from_client(client, world.clock.t)
        core.receive_from_server(server, world.clock.t)
    for step in steps:
        op, arg = _op(step.op, step.arg, _frames_10)
        if op == 0:
            core.receive_from_client(arg, world.clock.t)
        elif op == 1:
            core.receive_from_server(arg, world.clock.t)
        elif op == 2:
            for i in range(len(arg)):
                core.receive_from_client(arg[i : i + 1], world.clock.t)
        else:
            world.step(op, arg)
        core.data_for_server()
        core.data_for_client()
        core.events()
        _bounded_10(core, gate, world)
        if core.failure is not None:
            break
    gate.close()
    world.board.settle()


def _frames_10(raw: bytes) -> bytes:
    """Frames from (type, channel, length, that many body bytes) each: type even AMQP, odd
    SASL; doff 2, the size right."""
    out, pos = bytearray(), 0
    while pos + 3 <= len(raw):
        ftype, channel, n = raw[pos] & 1, raw[pos + 1], raw[pos + 2]
        body = raw[pos + 3 : pos + 3 + n]
        out += struct.pack(">IBBH", 8 + len(body), 2, ftype, channel) + body
        pos += 3 + n
    return bytes(out)


def _bounded_10(core: Connection10, gate: CreditFlow, world: Policed) -> None:
    stream = core._client
    tail = bytes(stream.tail[:8])
    # Judged with the whole frame header (size, doff, type): a few bytes held say nothing.
    if len(tail) >= 8 and stream.phase in (Phase.AMQP, Phase.SASL) and tail[:4] != b"AMQP":
        server_open = core.server.open
        if stream.phase is Phase.SASL or server_open is None:
            limit = MIN_MAX_FRAME_SIZE
        else:
            limit = max(server_open.max_frame_size, MIN_MAX_FRAME_SIZE)
        size = struct.unpack_from(">I", tail)[0]
        if size > limit:
            raise RuleBroken(f"a partial client frame of {size} bytes is held while the "
                             f"broker's max-frame-size is {limit}")
    for session in gate.sessions.values():
        for link in session.links.values():
            capture = getattr(link, "capture", None)
            if capture is None:
                continue
            kept = sum(len(p) for p in capture.parts)
            room = world.spool_limit(capture.key)
            if kept > room:
                raise RuleBroken(f"a delivery of {kept} bytes so far is captured for a spool "
                                 f"of {room} bytes")


# --- the spool ----------------------------------------------------------------------------

SEGMENT_BYTES: Final = 4096
_SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def spool(data: bytes) -> None:
    """A record at offset 0 (and one at the mode byte's offset) decoded; then a queue's
    directory made of the script and opened. Ops: 0 a segment named after the 4 bytes
    that start its argument (its seq), 1 the cursor, 2 a file named by its argument's first
    byte's worth of the rest (lower-case letters, digits and dots as they are, other bytes
    mapped to them), 3 a directory so named,
    4 a segment as 0 whose records' payloads are the pieces of the rest (a length byte,
    that many bytes), each sealed with a valid head and checksum."""
    _record(data, 0)
    _record(_sealed(data), 0)
    mode, steps = read_script(data)
    if data:
        _record(data, mode % len(data))
    root = Path(tempfile.mkdtemp(prefix="fuzz-spool-", dir=_SCRATCH))
    try:
        directory = root / "q"
        directory.mkdir()
        for step in steps:
            _entry(directory, step.op % 5, step.arg)
        _open_spool(directory)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _record(data: bytes, offset: int) -> None:
    try:
        rec, end = decode_at(data, offset)
    except RecordError:
        return
    if not offset < end <= len(data):
        raise RuleBroken(f"decode_at({offset}) ended at {end} of {len(data)}")
    if rec.encode() != data[offset:end]:
        raise RuleBroken("a decoded record does not encode back to its bytes")


def _sealed(payload: bytes) -> bytes:
    """``payload`` behind a record head that holds (magic, length, checksum)."""
    return struct.pack(">4sII", MAGIC, len(payload), zlib.crc32(payload)) + payload


def _sealed_records(raw: bytes) -> bytes:
    out, pos = bytearray(), 0
    while pos < len(raw):
        n = raw[pos]
        out += _sealed(raw[pos + 1 : pos + 1 + n])
        pos += 1 + n
    return bytes(out)


def _name(raw: bytes) -> str:
    allowed = "abcdefghijklmnopqrstuvwxyz0123456789."
    name = "".join(chr(b) if chr(b) in allowed else allowed[b % len(allowed)]
                   for b in raw[:24])
    return name if name not in ("", ".", "..") else "x"


def _entry(directory: Path, kind: int, arg: bytes) -> None:
    if kind in (0, 4):
        seq = int.from_bytes(arg[:4].rjust(4, b"\0"), "big")
        content = arg[4:] if kind == 0 else _sealed_records(arg[4:])
        (directory / f"{seq:020d}.seg").write_bytes(content)
    elif kind == 1:
        (directory / "cursor").write_bytes(arg)
    else:
        n = arg[0] % 25 if arg else 0
        path = directory / _name(arg[1 : 1 + n])
        if path.exists():
            return
        if kind == 2:
            path.write_bytes(arg[1 + n :])
        else:
            path.mkdir()


def _open_spool(directory: Path) -> None:
    from floodwall.spool.log import QueueSpool
    try:
        queue = QueueSpool(directory, SEGMENT_BYTES)
    except SpoolError:
        return
    try:
        listed = [r.seq for r in queue.records()]
        read: list[int] = []
        after, position = queue.confirmed_seq, None
        while True:
            batch = queue.read_batch(after, 1, position)
            if not batch:
                break
            read += [r.seq for r, _ in batch]
            after, position = batch[-1][1].after, batch[-1][1]
            if len(read) > len(listed) + 1:
                raise RuleBroken(f"read_batch read more records than records(): {read}")
        seq = queue.append(SpoolRecord(0, 1.0, "", "spooled", bytes(14), b"body"))
        queue.sync(False)
        if seq not in [r.seq for r in queue.records()]:
            raise RuleBroken(f"record {seq}, appended and synced, is not read back")
        queue.confirmed_through(seq)
    except SpoolError:
        return
    finally:
        queue.close()


# --- the policy loader --------------------------------------------------------------------

SKIP_TAGS: Final = os.environ.get("FUZZ_POLICY_SKIP_TAGS") == "1"
"""Skip inputs with a YAML tag (``!``): lets a run look past a crash on tags it already
found (``FUZZ_POLICY_SKIP_TAGS=1``); never set in the suite."""

def policy(data: bytes) -> None:
    """The input as UTF-8 (undecodable bytes replaced) parsed; a policy set that parses is
    rendered and parsed again, to the same policies."""
    text = data.decode("utf-8", "replace")
    if SKIP_TAGS and "!" in text:
        return
    try:
        policies = parse_policies(text, "fuzz.yaml")
    except PolicyError as exc:
        if not exc.problems or any(p.line is None or p.line < 1 for p in exc.problems):
            raise RuleBroken(f"a policy error without a FILE:LINE: {exc!r}") from None
        return
    again = parse_policies(render_policies(policies), "rendered.yaml")
    if again.policies != policies.policies:
        raise RuleBroken("rendered policies parse to different policies")


TARGETS: Final[dict[str, Callable[[bytes], None]]] = {
    "amqp091": amqp091,
    "amqp10": amqp10,
    "spool": spool,
    "policy": policy,
}

KNOWN_FAILURES: Final = (
    (struct.error, "unpack_from requires a buffer"),  # a short content header
    (RuleBroken, "is held while the frame limit is"),  # the frame limit from tune-ok
    (RuleBroken, "is assembled for a spool of"),  # a 0-9-1 spool capture
    (RuleBroken, "is captured for a spool of"),  # a 1.0 spool capture
    (ValueError, "invalid literal for int() with base 10"),  # a stray *.seg file
    (IsADirectoryError, ".seg"),  # a directory named *.seg
)
"""How the defects of ``tests/fuzz/known/`` fail, for ``past_known``."""


def past_known(target: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``target``, with a failure like a known defect's taken as a pass: lets a run look
    past defects already found until their fixes are in (``FUZZ_SKIP_KNOWN=1`` in
    ``tests.fuzz.run``; never in the suite)."""
    def run(data: bytes) -> None:
        try:
            target(data)
        except Exception as exc:
            if not any(isinstance(exc, kind) and text in str(exc)
                       for kind, text in KNOWN_FAILURES):
                raise
    return run

__all__ = ["TARGETS", "RuleBroken", "past_known"]
