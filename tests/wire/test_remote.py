"""The client adapter (``RemoteProvider``) against peers that misbehave on purpose, over loopback.

Each peer is a few lines of asyncio written here: it answers with an unknown error code,
a body that is not JSON, a body cut short, a chunked body that stops, a connection dropped
mid-answer, or nothing at all. Every one must end in the exact typed error the client
promises, within its deadline; keep-alive connections are reused, and one the service
closed while idle never costs a call.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from wire_rig import Service, peer, read_request

from checkfu.contract.codec import encode
from checkfu.contract.errors import (
    SandboxError,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxResultInvalid,
)
from checkfu.contract.members import DescribeResult, InspectRequest, ReadFilesRequest
from checkfu.core.driver import Limits
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, Requests, memory_profile
from checkfu.wire import client as wire_client
from checkfu.wire.client import RemoteProvider
from checkfu.wire.files import FILES_MEDIA_TYPE
from enrolled import enroll_adapters

pytestmark = pytest.mark.anyio

MEMORY = MemoryProvider()
R = Requests(MEMORY.target)
INSPECT = InspectRequest(**R.call(), allocation_key="ak-remote", instance_id="i-remote")
DESCRIBED = encode(DescribeResult(envelope=MEMORY.envelope))

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answer(status: int, body: bytes, *, content_type: str = "application/json", extra: str = "") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 500: "Internal Server Error", 503: "Service Unavailable"}[status]
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def once(raw: bytes, *, then: str = "close") -> Handler:
    """A peer that reads one request, writes ``raw``, then closes, or hangs with the connection open."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        if then == "hang":
            await asyncio.sleep(3600)

    return handle


async def failure(handle: Handler, call: Callable[[RemoteProvider], Awaitable[object]] | None = None) -> SandboxError:
    async with peer(handle) as p:
        remote = RemoteProvider(p.url, "a-credential")
        try:
            with pytest.raises(SandboxError) as caught:
                await (call or (lambda r: r.inspect(INSPECT)))(remote)
        finally:
            await remote.aclose()
    return caught.value


# What the client makes of a bad answer -------------------------------------------------------------


async def test_an_unknown_error_code_is_provider_failed_naming_it() -> None:
    body = json.dumps({"error": {"code": "SandboxSomethingNew", "message": "made up", "retryable": False}}).encode()
    error = await failure(once(answer(500, body)))
    assert type(error) is SandboxProviderFailed
    assert "SandboxSomethingNew" in error.message and "made up" in error.message


async def test_an_error_status_with_a_body_that_is_not_json_is_a_protocol_violation() -> None:
    error = await failure(once(answer(503, b"<html>upstream gone</html>", content_type="text/html")))
    assert type(error) is SandboxProtocolViolation and error.observed


async def test_an_error_status_with_json_that_is_not_a_wire_error_is_a_protocol_violation() -> None:
    error = await failure(once(answer(500, b'{"detail": "Internal Server Error"}')))
    assert type(error) is SandboxProtocolViolation and error.observed


async def test_a_result_that_is_not_json_is_result_invalid() -> None:
    error = await failure(once(answer(200, b"all good!")))
    assert type(error) is SandboxResultInvalid and error.observed


async def test_a_body_shorter_than_its_content_length_is_a_protocol_violation() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n"
    error = await failure(once(head + DESCRIBED[:100]))
    assert type(error) is SandboxProtocolViolation and error.observed and "cut short" in error.message


async def test_a_chunked_body_cut_short_is_a_protocol_violation() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (len(DESCRIBED), DESCRIBED)
    for cut in (chunk[:3], chunk[:50], chunk[:-2], chunk):  # inside the size line, the data, its CRLF, before 0
        error = await failure(once(head + cut))
        assert type(error) is SandboxProtocolViolation and error.observed, cut[:20]


@pytest.mark.parametrize("size_line", [b"-10", b"+a", b"0x10", b"1_0", b" ", b"zz", b"1" * 40])
async def test_a_malformed_chunk_size_is_a_protocol_violation_at_once(size_line: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    started = time.monotonic()
    error = await failure(once(head + size_line + b"\r\n" + b"x" * 64, then="hang"))
    assert type(error) is SandboxProtocolViolation and error.observed, size_line
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("length", ["\u00b2", "-1", "1e3", "+10", "0x10", "10, 11"])
async def test_a_malformed_content_length_is_a_protocol_violation(length: str) -> None:
    raw = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n".encode("latin-1")
    error = await failure(once(raw + b"{}", then="hang"))
    assert type(error) is SandboxProtocolViolation and error.observed, length


@pytest.mark.parametrize("cut", [0, 9, 30])
async def test_a_connection_dropped_mid_answer_is_a_protocol_violation(cut: int) -> None:
    error = await failure(once(answer(200, DESCRIBED)[:cut]))
    assert type(error) is SandboxProtocolViolation and error.observed


@pytest.mark.parametrize("piece", [b"a" * (1 << 20), b"x-n: 1\r\n" * (1 << 17)], ids=["one-line", "many-lines"])
async def test_an_endless_answer_head_is_a_protocol_violation_at_once(piece: bytes) -> None:
    """A hostile service sends 256 MiB of head; the client stops reading at its bound and says so."""
    sent = 0

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-filler: ")
        while sent < 256 << 20:
            writer.write(piece)
            await writer.drain()
            sent += len(piece)

    started = time.monotonic()
    error = await failure(endless)
    assert type(error) is SandboxProtocolViolation and error.observed
    assert "head is over 65536 bytes" in error.message
    assert time.monotonic() - started < 5
    assert sent < 16 << 20  # the client stopped reading: what it held is its bound and the socket's buffers


async def test_something_that_is_not_http_is_a_protocol_violation() -> None:
    error = await failure(once(b"SSH-2.0-OpenSSH_9.0\r\n\r\n"))
    assert type(error) is SandboxProtocolViolation and error.observed


async def test_read_files_answers_that_break_the_stream_are_protocol_violations() -> None:
    request = ReadFilesRequest(**R.call(), allocation_key="ak-r", instance_id="i-r", paths=("/w/f",), max_bytes=1 << 20)
    head = {
        **json.loads(INSPECT.model_dump_json(include={"target", "lease"})),
        "allocation_key": "ak-r",
        "instance_id": "i-r",
        "files": [{"path": "/w/f", "mode": 420, "digest": "sha256:" + "0" * 64, "size": 10}],
        "missing": [],
    }
    line = json.dumps(head).encode() + b"\n"
    for body, kind in [
        (line + b"12345", FILES_MEDIA_TYPE),  # fewer bytes than the head promised
        (line + b"0123456789EXTRA", FILES_MEDIA_TYPE),  # more
        (b'{"not": "a head"', FILES_MEDIA_TYPE),  # no head line at all
        (line + b"0123456789", "application/json"),  # not the files media type
    ]:
        error = await failure(once(answer(200, body, content_type=kind)), lambda r: r.read_files(request))
        assert type(error) in (SandboxProtocolViolation, SandboxResultInvalid) and error.observed, body[-20:]
        if body.startswith(line):
            assert type(error) is SandboxProtocolViolation


# Deadlines, and a service that is not there ---------------------------------------------------------


async def test_a_service_that_never_answers_times_out_within_the_clients_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(wire_client.DEADLINES, "inspect", 0.3)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(3600)

    started = time.monotonic()
    error = await failure(silent)
    assert type(error) is SandboxProviderTimeout and error.observed and error.retryable
    assert 0.25 < time.monotonic() - started < 2


async def test_an_answer_that_stalls_midway_times_out_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(wire_client.DEADLINES, "inspect", 0.3)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n"
    started = time.monotonic()
    error = await failure(once(head + DESCRIBED[:100], then="hang"))
    assert type(error) is SandboxProviderTimeout
    assert time.monotonic() - started < 2


async def test_the_runners_deadline_stops_a_silent_service(tmp_path: Path) -> None:
    """Through the runner's door: its deadline fires long before the client's own."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(3600)

    async with peer(silent) as p:
        remote = RemoteProvider(p.url, "a-credential")
        registry = Registry()
        registry.add(Adapter(envelope=MEMORY.envelope, provider=remote, source="silent peer"))
        journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
        enroll_adapters(journal, registry)
        runner = Runner(registry, journal, runner_tag="silent", limits=Limits(deadlines={"materialize": 0.3}))
        session = runner.start(MEMORY.target, memory_profile(), platform=MEMORY.envelope.platforms[0]).session
        started = time.monotonic()
        with pytest.raises(SandboxProviderTimeout) as caught:
            await session.materialize(memory_profile(), MEMORY.envelope.platforms[0])
        assert time.monotonic() - started < 2 and caught.value.field == "materialize"
        (event,) = [e for e in journal.events_for_run(session.run_id) if e.member == "materialize"]
        assert event.error_code == "SandboxProviderTimeout"
        journal.close()
        await remote.aclose()


async def test_a_service_that_cannot_be_reached_is_provider_failed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connection is refused
        remote = RemoteProvider(f"http://127.0.0.1:{port}", "a-credential")
        with pytest.raises(SandboxError) as caught:
            await remote.inspect(INSPECT)
    assert type(caught.value) is SandboxProviderFailed and caught.value.observed and caught.value.field is None
    assert f"127.0.0.1:{port}" in caught.value.message
    for url in ("https://127.0.0.1:1", "ftp://127.0.0.1:1", "not a url"):
        with pytest.raises(SandboxError) as caught:
            await RemoteProvider(url, "a-credential").describe()
        assert type(caught.value) is SandboxProviderFailed, url


# Keep-alive -------------------------------------------------------------------------------------------


def keep_alive(requests: list[bytes], *, close_after: int = 0, hold: asyncio.Event | None = None) -> Handler:
    """Answers ``describe`` on one connection for as long as the client likes (``close_after`` answers, if set)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        while True:
            try:
                head, _ = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            requests.append(head.split(b"\r\n", 1)[0])
            if hold is not None:
                await hold.wait()
            writer.write(answer(200, DESCRIBED))
            await writer.drain()
            answered += 1
            if close_after and answered >= close_after:
                return  # closes the connection, idle, without saying so

    return handle


async def test_keep_alive_reuses_one_connection() -> None:
    seen: list[bytes] = []
    async with peer(keep_alive(seen)) as p:
        remote = RemoteProvider(p.url, "a-credential")
        for _ in range(5):
            assert (await remote.describe()).envelope == MEMORY.envelope
        await remote.aclose()
    assert p.connections == 1 and len(seen) == 5


async def test_connections_the_service_closed_while_idle_cost_no_call() -> None:
    seen: list[bytes] = []
    hold = asyncio.Event()
    async with peer(keep_alive(seen, close_after=1, hold=hold)) as p:
        remote = RemoteProvider(p.url, "a-credential")
        both = asyncio.gather(remote.describe(), remote.describe())  # two calls at once: two connections
        while len(seen) < 2:
            await asyncio.sleep(0.01)
        hold.set()
        await both
        await asyncio.sleep(0.05)  # both idle connections are closed by now
        for _ in range(3):
            assert (await remote.describe()).envelope == MEMORY.envelope
        await remote.aclose()
    assert len(seen) == 5 and p.connections == 5


async def test_a_request_the_service_may_have_acted_on_is_never_sent_twice() -> None:
    """A reused connection that closes after the request went out, with no answer: an idempotent
    member is tried once more on a fresh connection; provision (which allocates) is not."""
    heads: list[bytes] = []

    async def answers_once_then_drops(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        heads.append(head.split(b"\r\n", 1)[0])
        writer.write(answer(200, DESCRIBED))
        await writer.drain()
        head, _ = await read_request(reader)  # the second request on this connection is read, never answered
        heads.append(head.split(b"\r\n", 1)[0])

    async with peer(answers_once_then_drops) as p:
        remote = RemoteProvider(p.url, "a-credential")
        await remote.describe()
        request = R.provision("ak-once", "sha256:" + "0" * 64)
        with pytest.raises(SandboxError) as caught:
            await remote.provision(request)
        assert type(caught.value) is SandboxProtocolViolation
        assert [h for h in heads if b"provision" in h] == [b"POST /v1/provision HTTP/1.1"]  # sent once only
        heads.clear()
        await remote.describe()
        await remote.describe()  # the peer drops this one after reading it: describe is asked again
        await remote.aclose()
    assert heads == [b"POST /v1/describe HTTP/1.1"] * 3


async def test_a_real_service_keeps_one_connection_for_many_calls(serve: Callable[..., Service]) -> None:
    service = serve(MEMORY)
    remote = service.remote()
    for _ in range(20):
        await remote.describe()
    pool = remote._http()
    assert len(pool._idle) == 1
    await remote.aclose()
