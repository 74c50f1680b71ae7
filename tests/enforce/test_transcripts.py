"""The 0-9-1 gate as transcripts: what goes in (frames, a release, the time) and the commands
that come out of its outbox, in order (mitmproxy's playbooks are the model). The byte-level
behaviour through the core is tested in tests/amqp091/test_flow.py; here the commands."""

from __future__ import annotations

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import parse_policies
from floodwall.enforce import events as ev
from floodwall.enforce.amqp091.gate import PublishFlow
from floodwall.enforce.commands import Command, ToClient, ToServer
from floodwall.wire.amqp091.hooks import ClientInfo
from tests.amqp091.wire import CH, decode_all, method, publish
from tests.fakes import Board, Clock, DefaultExchange

V = "/orders"
CAPPED = (V, "capped")
POLICIES = """
version: 1
policies:
  - {name: capped, match: {vhost: "/orders", queue: "capped*"}, capacity: 2000, resume: 1000}
  - {name: refusing, match: {vhost: "/orders", queue: "refusing"}, capacity: 2000,
     overflow: reject}
"""


class Transcript:
    """A gate, its controller and the time; ``publish`` and ``release`` return what the gate
    put in its outbox meanwhile."""

    def __init__(self, client: str = "pytest-client") -> None:
        self.clock = Clock()
        self.fc = FlowController(DefaultExchange(), parse_policies(POLICIES))
        self.board = Board(self.fc, self.clock)
        for q in ("capped", "refusing", "free"):
            self.fc.queue_seen((V, q), self.clock.t)
            self.sample(q, 0)
        self.gate = PublishFlow(self.board.enforcement, 7)
        self.gate.vhost_opened(V)
        self.gate.client_identified(ClientInfo(client, None, "Java", None, {}))

    def sample(self, queue: str, nbytes: int) -> None:
        self.clock.t += 1
        self.fc.sampled_management((V, queue), ManagementSample(
            self.clock.t, nbytes // 100, 0, nbytes, nbytes, 0), self.clock.t)

    def publish(self, channel: int, queue: str, size: int = 100) -> tuple[bool, list[Command]]:
        """A whole publish (method, header, body) read at once: (taken by the gate, commands)."""
        method, header, *body = publish(channel, b"x" * size, routing_key=queue)
        buf = method + header + b"".join(body)
        took = self.gate.on_publish(channel, buf, 0, len(method), len(method) + len(header),
                                    self.clock.t)
        if took is not None:  # held: its body frames follow through on_content
            pos = took
            for frame in body:
                self.gate.on_content(channel, buf, pos, pos + len(frame), self.clock.t)
                pos += len(frame)
        return took is not None, self.gate.take_output()

    def release(self) -> list[Command]:
        """The queue drains: what the switchboard hands the gate, and the gate's answer."""
        self.sample("capped", 0)
        freed = self.board.settle()  # the controller hands back the freed channel ...
        assert [(f.conn, f.channel) for f in freed] == [(7, 1)]
        self.gate.channel_released(1, self.clock.t)  # ... which io/ gives to the gate
        return self.gate.take_output()


def methods(out: list[Command]) -> list[tuple[str, object]]:
    """The commands as (kind, what): a frame as its method's name ("content" for a header or
    body), an event as it is."""
    seen: list[tuple[str, object]] = []
    for c in out:
        if isinstance(c, ToClient | ToServer):
            kind = "client" if isinstance(c, ToClient) else "server"
            (_, frame), = decode_all(c.data)
            name = type(frame).__name__
            seen.append((kind, name if c.data[0] == 1 else "content"))
        else:
            seen.append(("event", c))
    return seen


def test_a_publish_that_passes_makes_no_command() -> None:
    t = Transcript()
    assert t.publish(1, "free") == (False, [])


def test_a_tripped_queue_holds_says_so_and_signals_a_client_that_honours_flow() -> None:
    t = Transcript(client="RabbitMQ")
    t.sample("capped", 5000)
    taken, out = t.publish(1, "capped")
    assert taken
    at = ev.At(ev.ProtocolName.AMQP091, 7, V, 1)
    assert out == [ev.PublisherHeld(at, frozenset({CAPPED}), True),
                   ToClient(out[1].data),  # type: ignore[union-attr]
                   ev.Signalled(at, False)]
    assert methods(out)[1] == ("client", "Flow")
    assert t.board.counters.held_messages == 1


def test_the_release_sends_the_held_frames_in_order_then_resumes_the_client() -> None:
    t = Transcript(client="RabbitMQ")
    t.sample("capped", 5000)
    t.publish(1, "capped")
    out = t.release()
    assert methods(out) == [("server", "Publish"), ("server", "content"),
                            ("server", "content"), ("client", "Flow"),
                            ("event", ev.Signalled(ev.At(ev.ProtocolName.AMQP091, 7, V, 1),
                                                   True))]
    assert t.board.counters.held_messages == 0


def test_a_client_not_known_to_honour_flow_is_held_without_a_signal() -> None:
    t = Transcript()
    t.sample("capped", 5000)
    _, out = t.publish(1, "capped")
    assert [type(c) for c in out] == [ev.PublisherHeld]


def test_reject_in_confirm_mode_is_a_nack_and_a_refused_event() -> None:
    t = Transcript()
    t.gate.on_confirm_select(1)
    t.sample("refusing", 5000)
    _, out = t.publish(1, "refusing")
    assert methods(out)[0] == ("client", "Nack")
    (refused,) = [c for c in out if isinstance(c, ev.Refused)]
    assert refused.answer is ev.Answer.NACK and refused.queues == {(V, "refusing")}
    assert t.board.counters.rejects == 1


def test_reject_without_confirms_closes_the_channel_on_both_sides() -> None:
    t = Transcript()
    t.sample("refusing", 5000)
    _, out = t.publish(1, "refusing")
    kinds = methods(out)
    assert kinds[0][0] == "event" and isinstance(kinds[0][1], ev.EndedByProxy)
    assert kinds[1:3] == [("client", "Close"), ("server", "Close")]
    assert isinstance(out[3], ev.Refused) and out[3].answer is ev.Answer.CHANNEL_CLOSE
    # both close-oks are the proxy's to absorb; then the channel is forgotten
    close_ok = method(CH.CloseOk(), 1)
    assert t.gate.on_method_while_held(1, CH.CloseOk.index, close_ok, 0, len(close_ok))
    assert t.gate.on_broker_close_ok(1)
    assert [type(c).__name__ for c in t.gate.take_output()] == ["ForgetChannel"]


def test_past_the_deadline_a_confirmed_publish_is_nacked() -> None:
    t = Transcript()
    t.gate.on_confirm_select(1)
    t.sample("capped", 5000)
    t.publish(1, "capped")
    assert t.gate.expire(t.clock.t + 29) == 0 and t.gate.take_output() == []
    assert t.gate.expire(t.clock.t + 31) == 1
    out = t.gate.take_output()
    assert isinstance(out[0], ev.DeadlineExpired) and out[0].answer is ev.Answer.NACK
    assert methods(out)[1] == ("client", "Nack")
