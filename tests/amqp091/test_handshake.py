"""The hand-written decoders of the handshake's methods read, accept and refuse exactly what
pamqp's generic decoder (``decode_method``) does: on whole methods, on every cut of their
payloads and on corrupted bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from floodwall.wire.amqp091.errors import MethodSyntaxError
from floodwall.wire.amqp091.framing import decode_method
from floodwall.wire.amqp091.handshake import read_close, read_open, read_start_ok, read_tune
from tests.amqp091.wire import method, raw_frame

C = commands.Connection
PREFIX = b"\x08\x00\x00\x00\x00\x00\x00\xce"  # a heartbeat before: offsets are not 0


def _tune(cls: Any) -> Callable[[bytes, int, int], Any]:
    return lambda buf, offset, base: read_tune(buf, offset, cls.name, base)


# (pamqp's class, the hand decoder, what the core keeps of pamqp's object)
CASES: dict[str, tuple[Any, Callable[[bytes, int, int], Any], Callable[[Any], Any]]] = {
    "tune": (C.Tune, _tune(C.Tune), lambda m: (m.channel_max, m.frame_max, m.heartbeat)),
    "tune-ok": (C.TuneOk, _tune(C.TuneOk), lambda m: (m.channel_max, m.frame_max, m.heartbeat)),
    "open": (C.Open, read_open, lambda m: m.virtual_host),
    "close": (C.Close, read_close,
              lambda m: (m.reply_code, m.reply_text, m.class_id, m.method_id)),
    "start-ok": (C.StartOk, read_start_ok, lambda m: (m.client_properties, m.mechanism)),
}

WHOLE = {
    "tune": C.Tune(channel_max=2047, frame_max=131072, heartbeat=60),
    "tune-ok": C.TuneOk(channel_max=0, frame_max=4096, heartbeat=0),
    "open": C.Open(virtual_host="/prod é"),
    "close": C.Close(reply_code=320, reply_text="CONNECTION_FORCED - bye", class_id=60,
                     method_id=40),
    "start-ok": C.StartOk(
        client_properties={"product": "pika", "capabilities": {"basic.nack": True},
                           "n": 7, "list": [1, "a"]},
        mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"),
}


def both(name: str, payload: bytes, channel: int = 0) -> tuple[Any, Any]:
    """(pamqp's answer, the hand decoder's) for a method frame with ``payload`` after its
    class and method ids: the fields the core keeps, or the error's reason."""
    cls, hand, keep = CASES[name]
    frame = PREFIX + raw_frame(1, channel, cls.index.to_bytes(4, "big") + payload)
    answers = []
    for decode in (lambda: keep(decode_method(frame, len(PREFIX), cls, 100)),
                   lambda: hand(frame, len(PREFIX), 100)):
        try:
            answers.append(decode())
        except MethodSyntaxError as err:
            assert (err.class_id, err.method_id, err.offset) == (cls.index >> 16,
                                                                 cls.index & 0xFFFF, 8)
            answers.append(err.reason.split(":")[0])
    return answers[0], answers[1]


@pytest.mark.parametrize("name", list(WHOLE))
def test_a_whole_method_reads_as_pamqp_reads_it(name: str) -> None:
    payload = method(WHOLE[name])[11:-1]
    ours, pamqps = both(name, payload)
    assert ours == pamqps
    assert not isinstance(ours, str) or name == "open"  # decoded, not an error


@pytest.mark.parametrize("name", list(WHOLE))
def test_every_cut_of_a_method_is_refused_or_read_as_pamqp_does(name: str) -> None:
    payload = method(WHOLE[name])[11:-1]
    refused = 0
    for cut in range(len(payload)):
        theirs, ours = both(name, payload[:cut], channel=3)
        assert theirs == ours, (name, cut)
        refused += isinstance(ours, str) and ours.startswith("cannot decode")
    assert refused >= len(payload) - 5  # all but the cuts inside a trailing string


def test_the_error_names_the_method_channel_and_stream_offset() -> None:
    _, reason = both("close", b"\x01")
    assert reason == "cannot decode Connection.Close on channel 0 at offset 108"


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(list(WHOLE)), data=st.data())
def test_corrupted_methods_are_refused_or_read_as_pamqp_does(name: str, data: Any) -> None:
    payload = bytearray(method(WHOLE[name])[11:-1])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    theirs, ours = both(name, bytes(payload))
    assert theirs == ours


@settings(max_examples=200, deadline=None)
@given(vhost=st.text(max_size=40), code=st.integers(0, 0xFFFF), text=st.text(max_size=60),
       props=st.dictionaries(st.text(min_size=1, max_size=8),
                             st.one_of(st.integers(-2**31, 2**31 - 1), st.booleans(),
                                       st.text(max_size=10)), max_size=5))
def test_any_valid_method_reads_as_pamqp_reads_it(vhost: str, code: int, text: str,
                                                  props: dict[str, Any]) -> None:
    vhost = vhost.encode()[:255].decode("utf-8", "ignore")
    text = text.encode()[:255].decode("utf-8", "ignore")
    for name, value in (("open", C.Open(virtual_host=vhost)),
                        ("close", C.Close(reply_code=code, reply_text=text, class_id=0,
                                          method_id=0)),
                        ("start-ok", C.StartOk(client_properties=props, mechanism="PLAIN",
                                               response="x", locale="en_US"))):
        theirs, ours = both(name, method(value)[11:-1])
        assert theirs == ours
