"""The openProcess frame machine, with no sockets: every breach typed, every good conversation accepted.

The property test feeds any sequence of frames to a client channel: it either
raises a vocabulary error or accepts a well-formed stream, never anything else.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkfu.contract import examples as ex
from checkfu.contract.codec import decode_value
from checkfu.contract.errors import SandboxBoundExceeded, SandboxError, SandboxProtocolViolation
from checkfu.contract.frames import (
    Data,
    ErrEndFrame,
    ExitFrame,
    KillFrame,
    OutEndFrame,
    OutputOrder,
    ProcessChannel,
    StartedFrame,
    StartFrame,
    StdinEndFrame,
    WindowFrame,
    encode,
    parse,
)
from checkfu.contract.members import OpenProcessRequest, ProcessStarted
from checkfu.contract.process import ProcessExit, ProcessOutput, ProcessStreamEnd

REQUEST = decode_value(OpenProcessRequest, ex.messages()["OpenProcessRequest"][0])
STARTED = ProcessStarted(
    target=REQUEST.target,
    lease=REQUEST.lease,
    allocation_key=REQUEST.allocation_key,
    instance_id=REQUEST.instance_id,
    process_id="p-1",
)


def start(window: int = 100) -> StartFrame:
    return StartFrame(type="start", operation_id="op-1", request=REQUEST, window=window)


def started(window: int = 100) -> StartedFrame:
    return StartedFrame(type="start", operation_id="op-1", started=STARTED, window=window, stdin=0)


def client(window: int = 100, stdin_window: int = 100) -> ProcessChannel:
    """A client channel that has sent its start and received the server's."""
    ch = ProcessChannel("client")
    ch.send(start(window))
    ch.receive(encode(started(stdin_window)))
    return ch


def server(window: int = 100, stdin_window: int = 100) -> ProcessChannel:
    ch = ProcessChannel("server")
    ch.receive(encode(start(window)))
    ch.send(started(stdin_window))
    return ch


def out(data: bytes, stream: str = "out") -> bytes:
    return encode(Data(stream, data))  # type: ignore[arg-type]


def test_a_whole_conversation_from_both_ends() -> None:
    c, s = ProcessChannel("client"), ProcessChannel("server")
    s.receive(c.send(start(window=10)))
    c.receive(s.send(started(window=4)))
    s.receive(c.send(Data("stdin", b"ab")))
    s.receive(c.send(StdinEndFrame(type="stdin_end")))
    c.receive(s.send(Data("out", b"0123456789")))
    assert s.credit == 0
    s.receive(c.grant(10))
    c.receive(s.send(Data("err", b"e")))
    for frame in (OutEndFrame(type="out_end"), ErrEndFrame(type="err_end"), ExitFrame(type="exit", exit_code=3)):
        c.receive(s.send(frame))
    assert c.closed and s.closed
    assert c.received == {"stdin": 0, "out": 10, "err": 1} and s.received["stdin"] == 2


@pytest.mark.parametrize(
    ("setup", "message", "error", "field"),
    [
        (lambda: ProcessChannel("client"), out(b"x"), SandboxProtocolViolation, "frame"),  # before start
        (client, out(b"x" * 101), SandboxProtocolViolation, "window"),  # over the credit
        (lambda: client(window=1 << 30), out(b"x" * ((1 << 20) + 1)), SandboxBoundExceeded, "data"),
        (client, encode(Data("stdin", b"x")), SandboxProtocolViolation, "stdin"),  # wrong direction
        (client, b"\x09oops", SandboxProtocolViolation, "frame"),  # unknown tag
        (client, b"", SandboxProtocolViolation, "frame"),
        (client, '{"type": "teleport"}', SandboxProtocolViolation, "type"),
        (client, "not json", SandboxProtocolViolation, "frame"),
        (client, '{"type": "exit", "exit_code": 1}', SandboxProtocolViolation, "exit"),  # before the ends
        (client, '{"type": "exit", "exit_code": 1.0}', SandboxProtocolViolation, "exit_code"),
        (client, '{"type": "window", "bytes": 0}', SandboxProtocolViolation, "bytes"),
        (client, '{"type": "kill"}', SandboxProtocolViolation, "type"),  # a client frame, from the server
        (client, encode(started()), SandboxProtocolViolation, "frame"),  # a second start
    ],
)
def test_what_a_client_refuses(setup: Any, message: str | bytes, error: type[SandboxError], field: str) -> None:
    ch = setup()
    with pytest.raises(error) as caught:
        ch.receive(message)
    assert caught.value.field == field
    assert ch.closed  # nothing more is taken after a breach


def test_output_after_its_end_and_anything_after_the_exit() -> None:
    ch = client()
    ch.receive(encode(OutEndFrame(type="out_end")))
    with pytest.raises(SandboxProtocolViolation) as caught:
        ch.receive(out(b"late"))
    assert caught.value.field == "out"
    ch = client()
    for frame in (OutEndFrame(type="out_end"), ErrEndFrame(type="err_end"), ExitFrame(type="exit", exit_code=0)):
        ch.receive(encode(frame))
    with pytest.raises(SandboxProtocolViolation):
        ch.receive(encode(WindowFrame(type="window", bytes=1)))


def test_what_a_server_refuses() -> None:
    with pytest.raises(SandboxProtocolViolation):
        ProcessChannel("server").receive(encode(Data("stdin", b"x")))  # before start
    ch = server(stdin_window=2)
    with pytest.raises(SandboxProtocolViolation) as caught:
        ch.receive(encode(Data("stdin", b"abc")))
    assert caught.value.field == "window"
    ch = server()
    ch.receive(encode(StdinEndFrame(type="stdin_end")))
    with pytest.raises(SandboxProtocolViolation):
        ch.receive(encode(Data("stdin", b"x")))
    with pytest.raises(SandboxProtocolViolation):
        server().receive(out(b"x"))  # out is the server's to send


def test_a_side_cannot_send_over_the_credit_it_was_granted() -> None:
    ch = server(window=3)
    ch.send(Data("out", b"abc"))
    with pytest.raises(SandboxProtocolViolation):
        ch.send(Data("out", b"d"))
    ch.receive(encode(WindowFrame(type="window", bytes=1)))
    ch.send(Data("out", b"d"))
    assert ch.sent["out"] == 4


def test_parse_names_the_sender() -> None:
    assert isinstance(parse(encode(KillFrame(type="kill")), "client"), KillFrame)
    with pytest.raises(SandboxProtocolViolation):
        parse(encode(KillFrame(type="kill")), "server")
    frame = parse(json.dumps({"type": "window", "bytes": 5}), "server")
    assert isinstance(frame, WindowFrame) and frame.bytes == 5


def test_in_process_events_follow_the_same_rules() -> None:
    order = OutputOrder(max_chunk=3)
    order.feed(ProcessOutput(stream="out", data=b"abc"))
    order.feed(ProcessStreamEnd(stream="out"))
    with pytest.raises(SandboxProtocolViolation):
        order.feed(ProcessOutput(stream="out", data=b"x"))
    with pytest.raises(SandboxBoundExceeded):
        OutputOrder(max_chunk=3).feed(ProcessOutput(stream="err", data=b"abcd"))
    with pytest.raises(SandboxProtocolViolation):
        OutputOrder(max_chunk=3).feed(ProcessExit(exit_code=0))  # before the ends
    done = OutputOrder(max_chunk=3)
    for event in (ProcessStreamEnd(stream="out"), ProcessStreamEnd(stream="err"), ProcessExit(exit_code=0)):
        done.feed(event)
    done.end()
    with pytest.raises(SandboxProtocolViolation):
        done.feed(ProcessOutput(stream="err", data=b""))
    with pytest.raises(SandboxProtocolViolation):
        OutputOrder(max_chunk=3).end()


# Any sequence of frames: a typed error or a correct stream, never anything else ---------------------

SERVER_FRAMES = st.one_of(
    st.binary(max_size=40).map(out),
    st.binary(max_size=40).map(lambda b: out(b, "err")),
    st.just(encode(OutEndFrame(type="out_end"))),
    st.just(encode(ErrEndFrame(type="err_end"))),
    st.integers(-300, 300).map(lambda n: json.dumps({"type": "exit", "exit_code": n})),  # outside 0..255 too
    st.integers(1, 50).map(lambda n: encode(WindowFrame(type="window", bytes=n))),
    st.just(encode(started())),
    st.just(encode(KillFrame(type="kill"))),
    st.binary(max_size=8),
    st.text(max_size=30),
    st.dictionaries(st.sampled_from(["type", "bytes", "exit_code", "x"]), st.integers() | st.text(max_size=5)).map(
        json.dumps
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(SERVER_FRAMES, max_size=25), st.integers(1, 120))
def test_any_frame_sequence_ends_typed_or_well_formed(messages: list[str | bytes], window: int) -> None:
    ch = client(window=window)
    events = []
    for message in messages:
        try:
            ch.receive(message)
        except SandboxError:
            assert ch.closed
            return
        events.append(message)
    # Accepted: never more output than granted, nothing after an exit, exit only after both ends.
    assert ch.received["out"] + ch.received["err"] <= window
    if ch.closed:
        assert {"out", "err"} <= ch.ended
