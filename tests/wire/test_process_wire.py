"""``openProcess`` over its WebSocket, driven through ``RemoteProvider`` against the memory
provider and against the host-process provider (real processes), over loopback.

Streams in both directions with the real exit, a window that holds the service to it,
reattaching after a dropped connection without losing or repeating a byte, a start whose
reply was lost that never starts the process twice, no exit ever made up for a process
still running, ``kill``, and a hostile server whose frames break the rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from wire_rig import Driven, Peer, Service, peer

from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxError,
    SandboxNotFound,
    SandboxProtocolViolation,
    SandboxStateConflict,
)
from checkfu.contract.frames import (
    MAX_DATA,
    ErrEndFrame,
    ExitFrame,
    OutEndFrame,
    ProcessChannel,
    StartFrame,
    WindowFrame,
    encode,
    parse,
)
from checkfu.contract.members import OpenProcessRequest
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.contract.provider import ProcessStream
from checkfu.testing import KILLED_EXIT, MemoryProvider, Requests
from checkfu.wire import client as wire_client
from checkfu.wire.client import RemoteProcess, RemoteProvider

pytestmark = pytest.mark.anyio


async def collect(stream: ProcessStream, *, pause: float = 0.0) -> tuple[bytes, bytes, list[ProcessEvent]]:
    """Every event to the end; a stream that stalls for 20 s fails the test instead of hanging it."""
    out, err, tail = bytearray(), bytearray(), []
    async with asyncio.timeout(20):
        async for event in stream.events():
            if isinstance(event, ProcessOutput):
                (out if event.stream == "out" else err).extend(event.data)
                if pause:
                    await asyncio.sleep(pause)
            else:
                tail.append(event)
    return bytes(out), bytes(err), tail


def exit_of(tail: list[ProcessEvent]) -> int:
    """Both ends, in either order, then exactly one exit, last."""
    *ends, last = tail
    assert sorted(e.stream for e in ends if isinstance(e, ProcessStreamEnd)) == ["err", "out"] and len(ends) == 2
    assert isinstance(last, ProcessExit)
    return last.exit_code


async def open_on(driven: Driven, *argv: str, remote: RemoteProvider | None = None) -> RemoteProcess:
    inst = driven.instances[-1] if driven.instances else await driven.active()
    return await (remote or driven.remote).open_process(driven.process_request(inst, *argv))


# Streams both ways, and the real exit ----------------------------------------------------------------


async def test_memory_stdin_in_output_out_then_the_exit(memory_wire: tuple[MemoryProvider, Driven]) -> None:
    memory, driven = memory_wire
    proc = await open_on(driven, "cat")
    for piece in (b"hello ", b"wire ", b"x" * (3 * MAX_DATA + 17)):
        await proc.send_stdin(piece)
    await proc.close_stdin()
    with pytest.raises(SandboxStateConflict):
        await proc.send_stdin(b"late")
    out, err, tail = await collect(proc)
    assert (out, err) == (b"hello wire " + b"x" * (3 * MAX_DATA + 17), b"")
    assert exit_of(tail) == 0
    for argv, code, err_text in [(("false",), 1, b""), (("no-such-command",), 127, b"command not found")]:
        proc = await open_on(driven, *argv)
        out, err, tail = await collect(proc)
        assert exit_of(tail) == code and err_text in err
    assert memory.calls.count("openProcess") == 3


async def test_host_process_streams_and_its_real_exit_code(host_wire: tuple[Any, Driven]) -> None:
    _, driven = host_wire
    proc = await open_on(driven, "sh", "-c", "cat; echo done >&2; exit 7")
    assert proc.started.process_id.startswith("p-")
    await proc.send_stdin(b"to the process ")
    await proc.send_stdin(b"and back")
    await proc.close_stdin()
    out, err, tail = await collect(proc)
    assert (out, err) == (b"to the process and back", b"done\n")
    assert exit_of(tail) == 7
    proc = await open_on(driven, "sh", "-c", "kill -TERM $$")
    assert exit_of((await collect(proc))[2]) == 128 + 15


async def test_stdin_to_a_process_that_has_exited_is_a_state_conflict(host_wire: tuple[Any, Driven]) -> None:
    _, driven = host_wire
    proc = await open_on(driven, "sh", "-c", "exit 3")
    assert exit_of((await collect(proc))[2]) == 3
    with pytest.raises(SandboxStateConflict):
        await proc.send_stdin(b"nobody reads this")


async def test_stdin_blocked_on_a_process_that_exits_unread_does_not_hang(host_wire: tuple[Any, Driven]) -> None:
    _, driven = host_wire
    proc = await open_on(driven, "sleep", "0.5")  # never reads stdin
    with pytest.raises(SandboxStateConflict):
        await asyncio.wait_for(proc.send_stdin(b"z" * (24 << 20)), 10)  # past the window and the pipe
    assert exit_of((await asyncio.wait_for(collect(proc), 10))[2]) == 0


async def test_events_may_be_iterated_once(memory_wire: tuple[MemoryProvider, Driven]) -> None:
    _, driven = memory_wire
    proc = await open_on(driven, "echo", "once")
    events = proc.events()
    with pytest.raises(SandboxStateConflict):
        proc.events()
    assert [e async for e in events][-1] == ProcessExit(exit_code=0)


# Backpressure -----------------------------------------------------------------------------------------


async def test_a_slow_reader_holds_the_service_to_the_window(host_wire: tuple[Any, Driven]) -> None:
    _, driven = host_wire
    window = 256 << 10
    remote = driven.service.remote(window=window)
    total = 64 << 20
    proc = await open_on(driven, "sh", "-c", f"head -c {total} /dev/zero; cat >/dev/null", remote=remote)
    (op,) = driven.service.operations().values()
    peak = 0
    received = 0
    started = time.monotonic()
    async for event in proc.events():
        peak = max(peak, op.unacked)
        if isinstance(event, ProcessOutput):
            received += len(event.data)
            if received == total:
                await proc.close_stdin()
            if received < (8 << 20):
                await asyncio.sleep(0.002)  # slow at first: the process must wait for the reader
    peak = max(peak, op.unacked)
    await remote.aclose()
    assert received == total
    chunk = 256 << 10  # the most one read of the process's pipe hands over
    assert 0 < peak <= window + chunk, peak
    assert time.monotonic() - started < 30


async def test_a_slow_reader_gets_all_of_an_exited_processs_output(host_wire: tuple[Any, Driven]) -> None:
    """200 kB fits the pipe and the provider's buffer: the process exits at once, long before the reader
    (and the service's pump, held to a 64 KiB window) has taken it all."""
    _, driven = host_wire
    remote = driven.service.remote(window=64 << 10)
    proc = await open_on(driven, "head", "-c", "200000", "/dev/zero", remote=remote)
    await asyncio.sleep(0.5)  # well past the fixture's 50 ms drain grace
    out, _, tail = await collect(proc)
    await remote.aclose()
    assert exit_of(tail) == 0
    assert len(out) == 200000


# Reattaching ------------------------------------------------------------------------------------------


async def test_a_dropped_connection_reattaches_without_losing_or_repeating_a_byte(
    host_wire: tuple[Any, Driven],
) -> None:
    _, driven = host_wire
    remote = driven.service.remote(window=64 << 10)
    # The process stays until its output is all in: see the host-process drain test below.
    proc = await open_on(driven, "sh", "-c", "seq 1 300000; cat >/dev/null", remote=remote)
    expected = "".join(f"{i}\n" for i in range(1, 300001)).encode()
    out = bytearray()
    drops = 0
    async for event in proc.events():
        if isinstance(event, ProcessOutput):
            out.extend(event.data)
            if len(out) > (drops + 1) * 300_000 and drops < 5:
                proc._ws.transport.abort()  # type: ignore[union-attr]
                drops += 1
                (op,) = driven.service.operations().values()  # one operation, one process, throughout
                assert op.started == proc.started
            if len(out) >= len(expected):
                await proc.close_stdin()
            await asyncio.sleep(0.001)
        elif isinstance(event, ProcessExit):
            assert event.exit_code == 0
    await remote.aclose()
    assert drops == 5
    assert bytes(out) == expected
    for _ in range(200):  # the client closed normally after the exit: the service forgets the operation
        if not driven.service.operations():
            break
        await asyncio.sleep(0.01)
    assert driven.service.operations() == {}


async def test_reattaching_resends_unacknowledged_stdin_once(memory_wire: tuple[MemoryProvider, Driven]) -> None:
    memory, driven = memory_wire
    proc = await open_on(driven, "sha256sum")
    sent = bytearray()
    for i in range(40):
        piece = bytes([i]) * 50_000
        await proc.send_stdin(piece)
        sent.extend(piece)
        if i % 9 == 4:
            proc._ws.transport.abort()  # type: ignore[union-attr]
    await proc.close_stdin()
    out, _, tail = await asyncio.wait_for(collect(proc), 20)
    import hashlib  # noqa: PLC0415

    assert out == f"{hashlib.sha256(sent).hexdigest()}  -\n".encode()
    assert exit_of(tail) == 0 and memory.calls.count("openProcess") == 1


async def test_a_kill_sent_while_the_connection_is_down_still_kills(memory_wire: tuple[MemoryProvider, Driven]) -> None:
    _, driven = memory_wire
    proc = await open_on(driven, "sleep", "60")
    proc._ws.transport.abort()  # type: ignore[union-attr]
    await proc.kill()
    _, _, tail = await asyncio.wait_for(collect(proc), 10)
    assert exit_of(tail) == KILLED_EXIT


class SlowToStart:
    """A provider whose ``open_process`` takes a while to answer: a retried start arrives meanwhile."""

    def __init__(self, inner: MemoryProvider, delay: float) -> None:
        self.inner = inner
        self.delay = delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def open_process(self, request: OpenProcessRequest) -> Any:
        await asyncio.sleep(self.delay)
        return await self.inner.open_process(request)


class NeverStarts:
    """A provider whose ``open_process`` never answers; it says when it was entered and when it was cancelled."""

    def __init__(self, inner: MemoryProvider) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.cancelled = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def open_process(self, request: OpenProcessRequest) -> Any:
        self.entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_a_start_still_waiting_on_the_provider_is_cancelled_when_the_service_stops(
    serve: Callable[..., Service],
) -> None:
    """Stopping the service ends every ``openProcess`` its provider has not answered, rather than leaving the
    provider's call pending in a loop that is going away."""
    memory = MemoryProvider()
    slow = NeverStarts(memory)
    service = serve(slow)
    direct = Driven(service, service.remote(), Requests(memory.target))
    inst = await direct.active()
    remote = service.remote()
    opening = asyncio.ensure_future(remote.open_process(direct.process_request(inst, "cat")))
    try:
        assert await asyncio.to_thread(slow.entered.wait, 10), "the provider was never asked"
        assert service.app.state.starting, "the start is waiting on the provider"
        await asyncio.to_thread(service.run, service._stop(abort=True))
        assert slow.cancelled.is_set(), "the provider's open_process was left pending"
        assert not service.app.state.starting
    finally:
        opening.cancel()
        with contextlib.suppress(BaseException):
            await opening
        await remote.aclose()


def lossy_proxy(port: int, *, drop: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """Relays to ``port``; on its first connection it drops both sides once the client's start frame has gone
    through (``drop="after-start"``) or once the service's reply to it arrives (``drop="reply"``)."""
    state = {"connections": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        first = state["connections"] == 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        done = asyncio.Event()

        def cut() -> None:
            writer.transport.abort()
            up_writer.transport.abort()
            done.set()

        async def upstream() -> None:
            handshake_sent = False
            while chunk := await reader.read(1 << 16):
                up_writer.write(chunk)
                await up_writer.drain()
                if first and drop == "after-start":
                    if handshake_sent:
                        await asyncio.sleep(0.05)  # the service has read the start and is starting the process
                        cut()
                        return
                    handshake_sent = b"\r\n\r\n" in chunk

        async def downstream() -> None:
            head = b""
            while chunk := await up_reader.read(1 << 16):
                if first and drop == "reply" and b"\r\n\r\n" in head:
                    cut()  # the reply to the start: never delivered
                    return
                head += chunk
                writer.write(chunk)
                await writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait([*tasks, asyncio.ensure_future(done.wait())], return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait(tasks, timeout=30)
        finally:
            for t in tasks:
                t.cancel()
            up_writer.transport.abort()

    return handle


@pytest.mark.parametrize("drop", ["reply", "after-start"])
async def test_a_start_retried_after_a_lost_reply_never_starts_twice(serve: Callable[..., Service], drop: str) -> None:
    memory = MemoryProvider()
    service = serve(SlowToStart(memory, 0.3 if drop == "after-start" else 0.0))
    r = Requests(memory.target)
    direct = Driven(service, service.remote(), r)
    inst = await direct.active()
    async with peer(lossy_proxy(service.port, drop=drop)) as proxy:
        remote = RemoteProvider(proxy.url, service.secret)
        proc = await remote.open_process(direct.process_request(inst, "cat"))
        await proc.send_stdin(b"one process")
        await proc.close_stdin()
        out, _, tail = await asyncio.wait_for(collect(proc), 10)
        await remote.aclose()
        assert proxy.connections >= 2  # the first was dropped: the start was sent again
    assert out == b"one process" and exit_of(tail) == 0
    assert memory.calls.count("openProcess") == 1
    await direct.release_all()


async def test_grants_that_cross_the_exit_are_no_breach_and_the_operation_is_forgotten(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    """A client consuming output sends grants; the service's exit may pass them on the wire. The service
    must take them (and drop them), end normally, and forget the operation when the client closes."""
    _, driven = memory_wire
    inst = await driven.active()
    start = StartFrame(
        type="start", operation_id="op-crossing", request=driven.process_request(inst, "echo", "hi"), window=1 << 20
    )
    url = f"ws://127.0.0.1:{driven.service.port}/v1/openProcess"
    auth = {"authorization": f"Bearer {driven.service.secret}"}
    async with connect(url, additional_headers=auth) as ws:
        await ws.send(start.model_dump_json(exclude_none=True))
        await asyncio.sleep(0.3)  # the service has sent everything, the exit included, and we read none of it
        await ws.send(WindowFrame(type="window", bytes=3).model_dump_json())
        await ws.send(json.dumps({"type": "kill"}))
        frames = [parse(await asyncio.wait_for(ws.recv(), 5), "server") for _ in range(5)]
        assert [type(f).__name__ for f in frames] == ["StartedFrame", "Data", "OutEndFrame", "ErrEndFrame", "ExitFrame"]
        with contextlib.suppress(asyncio.TimeoutError):
            extra = await asyncio.wait_for(ws.recv(), 0.3)
            raise AssertionError(f"the service sent more after its exit: {extra!r}")
    for _ in range(200):
        if not driven.service.operations():
            break
        await asyncio.sleep(0.01)
    assert driven.service.operations() == {}


def test_only_the_side_that_sent_the_exit_takes_frames_that_crossed_it() -> None:
    request = _request(MemoryProvider())
    client, server = ProcessChannel("client"), ProcessChannel("server")
    server.receive(client.send(StartFrame(type="start", operation_id="op-x", request=request, window=10)))
    started = {**json.loads(request.model_dump_json(include={"target", "lease", "allocation_key", "instance_id"}))}
    client.receive(
        server.send(
            parse(
                json.dumps(
                    {
                        "type": "start",
                        "operation_id": "op-x",
                        "window": 10,
                        "stdin": 0,
                        "started": {**started, "process_id": "p-x"},
                    }
                ),
                "server",
            )
        )
    )
    for frame in (OutEndFrame(type="out_end"), ErrEndFrame(type="err_end"), ExitFrame(type="exit", exit_code=0)):
        server.send(frame)  # the exit is on its way; the client has not read it yet
    crossing = [client.send(WindowFrame(type="window", bytes=5)), b"\x01late", '{"type": "stdin_end"}']
    for message in [*crossing, '{"type": "kill"}']:
        server.receive(message)  # no breach
    with pytest.raises(SandboxProtocolViolation):
        server.receive('{"type": "start"}')
    for frame in (OutEndFrame(type="out_end"), ErrEndFrame(type="err_end"), ExitFrame(type="exit", exit_code=0)):
        client.receive(encode(frame))
    with pytest.raises(SandboxProtocolViolation):  # the side that received the exit takes nothing more
        client.receive('{"type": "window", "bytes": 1}')


# Never an exit the process did not have --------------------------------------------------------------


async def test_a_running_process_whose_service_is_gone_gets_a_typed_error_not_an_exit(
    memory_wire: tuple[MemoryProvider, Driven], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire_client, "REATTACH_PAUSE", 0.01)
    _, driven = memory_wire
    proc = await open_on(driven, "sleep", "60")
    await driven.service.crash(restart=False)
    with pytest.raises(SandboxError) as caught:
        async for event in proc.events():
            assert not isinstance(event, ProcessExit)
    assert type(caught.value) is SandboxProtocolViolation and caught.value.observed
    with pytest.raises(SandboxProtocolViolation):
        await asyncio.wait_for(proc.send_stdin(b"x"), 5)
    await proc.kill()  # quiet: there is nothing left to tell
    driven.instances.clear()


async def test_a_service_restarted_mid_stream_forgets_the_process_and_says_so(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    memory, driven = memory_wire
    proc = await open_on(driven, "cat")
    await proc.send_stdin(b"before the restart")
    events = proc.events()
    first = await anext(events)
    assert isinstance(first, ProcessOutput) and first.data == b"before the restart"
    await driven.service.crash(restart=True)  # a new service on the same port, with no operations

    async def rest() -> None:
        async for event in events:
            assert not isinstance(event, ProcessExit | ProcessOutput)

    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(rest(), 10)
    assert type(caught.value) is SandboxNotFound and caught.value.field == "operation_id"
    assert memory.calls.count("openProcess") == 1  # the reattach did not start it again


# kill, and a hostile server ---------------------------------------------------------------------------


async def test_kill_ends_the_process(memory_wire: tuple[MemoryProvider, Driven], host_wire: tuple[Any, Driven]) -> None:
    for driven in (memory_wire[1], host_wire[1]):
        proc = await open_on(driven, "sleep", "60")
        started = time.monotonic()
        await proc.kill()
        await proc.kill()
        _, _, tail = await asyncio.wait_for(collect(proc), 10)
        assert exit_of(tail) == KILLED_EXIT and time.monotonic() - started < 5
        await proc.kill()  # after the exit: nothing to do


Script = Callable[[ServerConnection, dict[str, Any]], Awaitable[None]]


@contextlib.asynccontextmanager
async def hostile(script: Script) -> AsyncIterator[str]:
    """A WebSocket server that answers the start properly, then runs ``script``."""
    memory = MemoryProvider()

    async def handler(ws: ServerConnection) -> None:
        start = json.loads(await ws.recv())
        started = {**json.loads(_instance(memory).model_dump_json(exclude={"state"})), "process_id": "p-h"}
        reply = {
            "type": "start",
            "operation_id": start["operation_id"],
            "started": started,
            "window": 1 << 20,
            "stdin": 0,
        }
        with contextlib.suppress(Exception):  # the client may drop the connection at any point
            await ws.send(json.dumps({**reply, **script.__dict__.get("reply", {})}))
            await script(ws, start)
            await asyncio.wait_for(ws.wait_closed(), 5)  # until the client, having refused, hangs up

    async with ws_serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


def _instance(memory: MemoryProvider) -> Any:
    from checkfu.contract.members import InstanceResult  # noqa: PLC0415

    r = Requests(memory.target)
    return InstanceResult(**r.call(), allocation_key="ak-h", instance_id="i-h", state="active")


def _request(memory: MemoryProvider) -> OpenProcessRequest:
    r = Requests(memory.target)
    return OpenProcessRequest(**r.on(_instance(memory)), argv=["x"])


async def over_the_credit(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(b"\x02" + b"o" * (start["window"] + 1))


async def after_its_end(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(json.dumps({"type": "out_end"}))
    await ws.send(b"\x02late")


async def an_unknown_frame(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(json.dumps({"type": "teleport"}))


async def an_unknown_tag(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(b"\x09data")


async def stdin_from_the_server(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(b"\x01data")


async def exit_before_the_ends(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(json.dumps({"type": "exit", "exit_code": 0}))


async def a_second_start(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(json.dumps({"type": "out_end"}))
    await ws.send(json.dumps({"type": "start", "operation_id": start["operation_id"]}))


async def an_oversized_frame(ws: ServerConnection, start: dict[str, Any]) -> None:
    await ws.send(b"\x02" + b"o" * (MAX_DATA + 1))


HOSTILE: dict[str, tuple[Script, type[SandboxError]]] = {
    "over-the-credit": (over_the_credit, SandboxProtocolViolation),
    "after-its-end": (after_its_end, SandboxProtocolViolation),
    "unknown-frame": (an_unknown_frame, SandboxProtocolViolation),
    "unknown-tag": (an_unknown_tag, SandboxProtocolViolation),
    "stdin-from-the-server": (stdin_from_the_server, SandboxProtocolViolation),
    "exit-before-the-ends": (exit_before_the_ends, SandboxProtocolViolation),
    "a-second-start": (a_second_start, SandboxProtocolViolation),
    "oversized-frame": (an_oversized_frame, SandboxBoundExceeded),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_a_hostile_servers_frames_are_refused(name: str) -> None:
    script, expected = HOSTILE[name]
    memory = MemoryProvider()
    async with hostile(script) as url:
        remote = RemoteProvider(url, "a-credential", window=1000)
        proc = await remote.open_process(_request(memory))
        with pytest.raises(SandboxError) as caught:
            await asyncio.wait_for(collect(proc), 10)
        await remote.aclose()
    assert type(caught.value) is expected and caught.value.observed, caught.value


async def test_a_start_answered_for_another_operation_is_refused() -> None:
    async def nothing(ws: ServerConnection, start: dict[str, Any]) -> None:
        return None

    nothing.__dict__["reply"] = {"operation_id": "op-someone-else"}
    memory = MemoryProvider()
    async with hostile(nothing) as url:
        remote = RemoteProvider(url, "a-credential")
        with pytest.raises(SandboxError) as caught:
            await remote.open_process(_request(memory))
        await remote.aclose()
    assert type(caught.value) is SandboxProtocolViolation and caught.value.field == "operation_id"


async def test_the_peer_fixture_counts_connections() -> None:
    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        return None

    async with peer(close) as p:
        assert isinstance(p, Peer)
        _, w = await asyncio.open_connection("127.0.0.1", int(p.url.rsplit(":", 1)[1]))
        await asyncio.sleep(0.05)
        w.close()
    assert p.connections == 1
