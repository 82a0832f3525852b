"""What a client may send a provider service before its credential is checked is bounded in size and in time.

``checkfu provider serve memory`` runs as a process of its own on loopback, and the memory it holds is read from
its ``/proc/PID/status`` (``VmHWM``, the peak resident set: what an attack cost at its worst, even after the memory
was given back). Heads that are too large or have too many lines are refused ``431`` with a typed body, at once;
a head that arrives too slowly is refused ``408``; a body that stops arriving is cut. The timeouts are tested on
a service in this process with short limits (``RequestLimits``); the served process is held to the defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from checkfu.testing import MemoryProvider
from checkfu.wire.limits import RequestLimits
from checkfu.wire.server import create_app
from checkfu.wire.serving import served

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/status")

CHECKFU = str(Path(sys.executable).with_name("checkfu"))
DEFAULTS = RequestLimits()
ATTACK_BYTES = 16 << 20
"""How much header each hostile connection tries to send: far past any bound, small enough to finish fast."""
MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _peak_rss(pid: int) -> int:
    """The peak resident set of ``pid`` so far, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


class Served:
    """``checkfu provider serve memory`` in a process of its own."""

    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.secret = "heads-" + secrets.token_urlsafe(18)
        credential = tmp / "credential"
        credential.write_text(self.secret)
        argv = [CHECKFU, "provider", "serve", "memory", "--listen", f"127.0.0.1:{self.port}"]
        self.log = (tmp / "serve.log").open("wb")
        env = {**os.environ, "CHECKFU_STATE": str(tmp / "state")}
        self.proc = subprocess.Popen(
            [*argv, "--credential-file", str(credential)], stdout=self.log, stderr=self.log, env=env
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (tmp / "serve.log").read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the service did not start")

    def describe(self, extra: bytes = b"") -> tuple[int, bytes]:
        """A ``describe`` with the credential and ``extra`` header lines; the status and the body."""
        head = (
            f"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {self.secret}\r\n"
            "content-length: 2\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(head + extra + b"\r\n{}")
            return _answer(s)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("heads"))
    yield s
    s.close()


def _answer(s: socket.socket) -> tuple[int, bytes]:
    """The status and body of the one answer on ``s``, read to the close or the declared length."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        part = s.recv(65536)
        if not part:
            raise AssertionError(f"the connection closed without an answer: {buf[:200]!r}")
        buf += part
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        part = s.recv(65536)
        if not part:
            break
        body += part
    return int(lines[0].split()[1]), body[:length]


def _hostile(port: int, head: bytes, filler: bytes, total: int) -> tuple[int, bytes, float]:
    """Send ``head`` and then ``filler`` until ``total`` bytes went out or the service stopped taking them;
    the answer's status and body, and the seconds from the first byte to the answer."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        sent = 0
        with contextlib.suppress(OSError):  # a service that refused may reset what it no longer reads
            s.sendall(head)
            while sent < total:
                s.sendall(filler)
                sent += len(filler)
        try:
            status, body = _answer(s)
        except (TimeoutError, ConnectionResetError) as exc:
            raise AssertionError(f"no answer after {sent} bytes of head: {type(exc).__name__}") from None
        return status, body, time.monotonic() - start


def _refusal(body: bytes) -> tuple[str, str | None]:
    error = json.loads(body)["error"]
    return error["code"], error.get("field")


def test_an_endless_header_is_refused_at_once_and_costs_the_service_no_memory(service: Served) -> None:
    """Eight connections each send 16 MiB of one header line, without a credential, all at once."""
    before = _peak_rss(service.proc.pid)
    head = b"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\nx-filler: "
    results: list[tuple[int, bytes, float] | BaseException] = []

    def one() -> None:
        try:
            results.append(_hostile(service.port, head, b"a" * MIB, ATTACK_BYTES))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    grown = _peak_rss(service.proc.pid) - before
    for result in results:
        assert not isinstance(result, BaseException), result
        status, body, seconds = result
        assert status == 431, body
        assert _refusal(body) == ("SandboxProtocolViolation", "headers")
        assert seconds < 5
    assert len(results) == 8
    assert grown < 16 * MIB, f"the service grew by {grown / MIB:.1f} MiB"
    assert service.describe()[0] == 200  # and it still serves


def test_an_endless_request_line_is_refused_too(service: Served) -> None:
    status, body, _ = _hostile(service.port, b"POST /v1/", b"d" * MIB, 4 * MIB)
    assert status == 431
    assert _refusal(body) == ("SandboxProtocolViolation", "headers")


def test_a_head_at_the_bound_is_served_and_one_byte_past_it_is_refused(service: Served) -> None:
    probe = b"x-pad: \r\n"
    base = len(
        f"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {service.secret}\r\n"
        "content-length: 2\r\n\r\n"
    )
    pad = DEFAULTS.head_bytes - base - len(probe)
    assert service.describe(b"x-pad: " + b"p" * pad + b"\r\n")[0] == 200
    status, body = service.describe(b"x-pad: " + b"p" * (pad + 1) + b"\r\n")
    assert status == 431
    assert _refusal(body) == ("SandboxProtocolViolation", "headers")


def test_more_header_lines_than_the_bound_are_refused(service: Served) -> None:
    # the describe itself carries three: host, authorization, content-length
    lines = DEFAULTS.header_lines - 3
    assert service.describe(b"".join(b"x-n%d: 1\r\n" % i for i in range(lines)))[0] == 200
    status, body = service.describe(b"".join(b"x-n%d: 1\r\n" % i for i in range(lines + 1)))
    assert status == 431
    assert _refusal(body) == ("SandboxProtocolViolation", "headers")
    assert b"header lines" in body


def test_the_bounds_leave_room_for_what_the_runner_sends() -> None:
    from checkfu.wire.credentials import MAX_BYTES  # noqa: PLC0415
    from checkfu.wire.kit import largest_request_header  # noqa: PLC0415

    # the largest Checkfu-Request header, the longest credential, and the rest of a writeFile head, with room
    assert largest_request_header() + MAX_BYTES + 1024 < DEFAULTS.head_bytes // 2
    assert DEFAULTS.header_lines >= 32
    assert 1 <= DEFAULTS.head_seconds <= 30
    assert DEFAULTS.idle_seconds <= 120


# time: a service in this process with short limits -----------------------------------------------------------

SHORT = RequestLimits(head_seconds=0.5, idle_seconds=0.5)


@pytest.fixture
async def quick() -> AsyncIterator[tuple[str, int]]:
    async with served(create_app(MemoryProvider(), ["quick-secret"]), limits=SHORT) as url:
        host, _, port = url.removeprefix("http://").rpartition(":")
        yield host, int(port)


async def _read_all(reader: asyncio.StreamReader, within: float) -> bytes:
    async with asyncio.timeout(within):
        return await reader.read()


@pytest.mark.anyio
async def test_a_head_sent_one_byte_at_a_time_is_refused_when_its_time_is_up(quick: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*quick)
    head = b"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " + b"s" * 1000
    start = time.monotonic()

    async def dribble() -> None:
        with contextlib.suppress(OSError):
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)

    sending = asyncio.ensure_future(dribble())
    try:
        answer = await _read_all(reader, 5)
    finally:
        sending.cancel()
        writer.close()
    took = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert _refusal(answer.partition(b"\r\n\r\n")[2]) == ("SandboxProtocolViolation", "headers")
    assert SHORT.head_seconds <= took < SHORT.head_seconds + 2


@pytest.mark.anyio
async def test_a_connection_that_sends_nothing_is_closed_when_its_time_is_up(quick: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*quick)
    start = time.monotonic()
    try:
        answer = await _read_all(reader, 5)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert SHORT.head_seconds <= time.monotonic() - start < SHORT.head_seconds + 2


@pytest.mark.anyio
async def test_blank_lines_after_an_answer_do_not_hold_the_connection_open(quick: tuple[str, int]) -> None:
    """The parser skips a blank line between requests without starting a message, and any byte stops the
    keep-alive timer: so the next head's time starts at its first byte, blank or not."""
    reader, writer = await asyncio.open_connection(*quick)
    try:
        writer.write(b"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(5):
            first = await reader.readuntil(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 401 "), first[:80]
        sized = next(ln for ln in first.split(b"\r\n") if ln.lower().startswith(b"content-length:"))
        length = int(sized.split(b":")[1])
        await reader.readexactly(length)
        start = time.monotonic()
        for _ in range(3):
            writer.write(b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        answer = await _read_all(reader, 5)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b"", answer[:80]
    assert time.monotonic() - start < SHORT.head_seconds + 2


@pytest.mark.anyio
@pytest.mark.parametrize("credential", ["quick-secret", None])
async def test_a_body_that_stops_arriving_is_cut(quick: tuple[str, int], credential: str | None) -> None:
    """With the credential the service waits for the body; without it, it has answered and no longer reads it."""
    reader, writer = await asyncio.open_connection(*quick)
    auth = f"authorization: Bearer {credential}\r\n" if credential else ""
    writer.write(f"POST /v1/inspect HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}content-length: 1000\r\n\r\n{{".encode())
    await writer.drain()
    start = time.monotonic()
    try:
        await _read_all(reader, 5)  # to the close: what was answered before it does not matter here
    finally:
        writer.close()
    assert SHORT.idle_seconds <= time.monotonic() - start < SHORT.idle_seconds + 2


@pytest.mark.anyio
async def test_a_body_that_keeps_arriving_slowly_is_read_whole(quick: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*quick)
    body = b"{}"
    writer.write(
        b"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer quick-secret\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    for byte in body:
        await asyncio.sleep(SHORT.idle_seconds * 0.6)
        writer.write(bytes([byte]))  # each gap under the idle bound, the whole longer than it
    await writer.drain()
    try:
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")


@pytest.mark.anyio
async def test_a_body_the_service_is_slow_to_read_is_not_cut() -> None:
    """The service stops reading while its application has not taken what came: that pause is not the client's."""

    async def slow(request: Request) -> Response:
        await asyncio.sleep(SHORT.idle_seconds * 3)
        return Response(str(len(await request.body())))

    app = Starlette(routes=[Route("/slow", slow, methods=["POST"])])
    body = b"b" * (4 << 20)  # far over what uvicorn buffers before it pauses reading
    async with served(app, limits=SHORT) as url:
        host, _, port = url.removeprefix("http://").rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /slow HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        try:
            async with asyncio.timeout(10):
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                answer = await reader.readexactly(len(str(len(body))))
        finally:
            writer.close()
    assert head.startswith(b"HTTP/1.1 200 ") and answer == str(len(body)).encode()


@pytest.mark.anyio
async def test_a_kept_alive_connection_is_not_timed_out_while_the_service_works(quick: tuple[str, int]) -> None:
    """The head timer runs from a head's first byte, not from the end of the last answer."""
    reader, writer = await asyncio.open_connection(*quick)
    request = (
        b"POST /v1/describe HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer quick-secret\r\n"
        b"content-length: 2\r\n\r\n{}"
    )
    try:
        for _ in range(3):
            writer.write(request)
            await writer.drain()
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            assert head.startswith(b"HTTP/1.1 200 ")
            await asyncio.sleep(SHORT.head_seconds * 0.6)
    finally:
        writer.close()
