"""A small HTTP/1.1 client over asyncio streams, with keep-alive connections.

The runner makes many small calls to one service, and a general-purpose client
spends most of such a call in its own layers. This one writes a request in one
piece and reads the answer's framing as RFC 9112 section 6.3 orders it:
informational answers are skipped, 204 and 304 have no body, then
``Transfer-Encoding: chunked``, then ``Content-Length``, else the body runs to
the close. Chunk sizes and lengths are read strictly (ASCII digits, bounded).

An idle connection the server has closed is never used: it is dropped before a
request is written on it. A reused connection that ends without one byte of an
answer is ambiguous (the server may have closed it as the request went out, or
read the request and died), so the request is sent again, once and on a fresh
connection, only when the caller says it may be (``retry``): a request that
allocates or runs something must not be acted on twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

READ_SIZE = 256 << 10
MAX_HEAD = 64 << 10
MAX_LENGTH_DIGITS = 18
"""A Content-Length, or a chunk size in hex, with more digits than this is refused (an exabyte is enough)."""


class HttpError(Exception):
    """The conversation broke: ``connect`` says whether the service could be reached at all; ``tls`` whether
    that was in the TLS handshake: ``"verify"`` (its certificate could not be verified) or ``"handshake"``."""

    def __init__(
        self, message: str, *, connect: bool = False, tls: Literal["verify", "handshake"] | None = None
    ) -> None:
        super().__init__(message)
        self.connect = connect
        self.tls = tls


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False
    reusable: bool = True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.writer.get_extra_info("sslcontext") is not None:
                # No TLS close_notify exchange: it would need the event loop after this call, which a pool
                # closed as its loop shuts down does not get, and the framing never relies on it.
                self.writer.transport.abort()
            else:
                self.writer.close()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


class _Stale(Exception):
    """A reused connection was closed by the server before any answer: safe to try again."""


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP token (RFC 9110 section 5.6.2): what a header name is made of."""


def _token(value: str) -> bool:
    return _TOKEN.fullmatch(value) is not None


def _length(text: str) -> int:
    """A Content-Length: ASCII decimal digits only."""
    if not (0 < len(text) <= MAX_LENGTH_DIGITS and text.isascii() and text.isdigit()):
        raise HttpError(f"a malformed Content-Length: {text[:40]!r}")
    return int(text)


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _chunk_size(line: bytes) -> int:
    """The size of a chunk from its size line (extensions dropped): ASCII hex digits only."""
    text = line.split(b";", 1)[0].strip(b" \t")
    if not (0 < len(text) <= MAX_LENGTH_DIGITS and all(c in _HEX for c in text)):
        raise HttpError(f"a malformed chunk size in the answer: {text[:40]!r}")
    return int(text, 16)


def _buffered(reader: asyncio.StreamReader) -> int:
    """Bytes the server sent that nobody has read yet (``StreamReader`` keeps them in ``_buffer``)."""
    return len(getattr(reader, "_buffer", b""))


class HttpPool:
    """Keep-alive connections to one origin, for one event loop.

    An ``https://`` origin is reached over TLS with ``tls`` (a client context: it verifies the certificate
    and the host name); a handshake that fails is an ``HttpError`` with ``connect`` and ``tls`` set.
    """

    def __init__(
        self, url: str, headers: Mapping[str, str], *, max_idle: int = 16, tls: ssl.SSLContext | None = None
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"{url!r}: only http:// and https:// service URLs are supported", connect=True)
        if parts.scheme == "https" and tls is None:
            raise HttpError(f"{url!r}: an https:// URL needs a TLS context", connect=True)
        self.tls = tls if parts.scheme == "https" else None
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if self.tls is not None else 80)
        except ValueError:
            raise HttpError(f"{url!r}: the port is not a number from 0 to 65535", connect=True) from None
        self.authority = parts.netloc
        self.base_path = parts.path.rstrip("/")
        self.headers = "".join(f"{k.lower()}: {v}\r\n" for k, v in headers.items())
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._unsolicited: str | None = None
        """Set when the server sent what no request asked for; the next request fails on it, typed."""

    async def _open(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, limit=MAX_HEAD, ssl=self.tls, server_hostname=self.host if self.tls else None
            )
        except ssl.SSLCertVerificationError as exc:
            why = exc.verify_message or exc.reason or "certificate verify failed"
            raise HttpError(
                f"cannot verify the TLS certificate of {self.authority}: {why}", connect=True, tls="verify"
            ) from None
        except ssl.SSLError as exc:
            raise HttpError(
                f"the TLS handshake with {self.authority} failed: {exc.reason or exc} (does it serve TLS?)",
                connect=True,
                tls="handshake",
            ) from None
        except OSError as exc:
            raise HttpError(f"cannot connect to {self.authority}: {exc.strerror or exc}", connect=True) from None
        return _Conn(reader, writer)

    async def _checkout(self) -> _Conn:
        """An idle connection the server has not closed, or a new one.

        Raises:
            HttpError: the server sent bytes on an idle connection that no request asked for (an answer
                sent twice, say): the conversation is out of step, and nothing is sent.
        """
        while self._idle:
            conn = self._idle.pop()
            self._note_unsolicited(conn)
            if conn.reader.at_eof() or conn.writer.is_closing() or conn.reader.exception() is not None:
                conn.close()  # the server closed it while it was idle
                continue
            self._raise_unsolicited()
            return conn
        self._raise_unsolicited()
        return await self._open()

    def _note_unsolicited(self, conn: _Conn) -> None:
        """Close ``conn`` and remember it when the server has sent bytes on it after its last answer."""
        extra = _buffered(conn.reader)
        if extra:
            conn.close()
            conn.reader.feed_eof()
            self._unsolicited = self._unsolicited or (
                f"the service sent {extra} bytes after an answer that no request asked for (an answer sent twice?)"
            )

    def _raise_unsolicited(self) -> None:
        if self._unsolicited is not None:
            message, self._unsolicited = self._unsolicited, None
            raise HttpError(message)

    def _give_back(self, conn: _Conn) -> None:
        self._note_unsolicited(conn)
        if conn.reusable and not conn.writer.is_closing() and len(self._idle) < self.max_idle:
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()

    def _head(self, method: str, path: str, size: int, headers: Mapping[str, str]) -> bytes:
        for k, v in headers.items():
            if not _token(k) or any(c in v for c in "\r\n\0"):
                raise HttpError(f"a header that cannot be sent: {k!r}")
        extra = "".join(f"{k.lower()}: {v}\r\n" for k, v in headers.items())
        return (
            f"{method} {self.base_path}{path} HTTP/1.1\r\nhost: {self.authority}\r\ncontent-length: {size}\r\n"
            f"{self.headers}{extra}\r\n"
        ).encode("latin-1")

    async def _read_head(self, conn: _Conn) -> tuple[int, dict[str, str]]:
        """The status and headers of the next final answer.

        Raises:
            _Stale: the reused connection ended before any byte of an answer.
        """
        while True:
            try:
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if conn.reused and not exc.partial:
                    raise _Stale from None
                raise HttpError("the connection closed in the middle of an answer's head") from None
            except asyncio.LimitOverrunError:
                raise HttpError(f"an answer's head is over {MAX_HEAD} bytes") from None
            lines = raw[:-4].decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not (len(code) == 3 and code.isascii() and code.isdigit()):
                raise HttpError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep or not _token(name):
                    raise HttpError(f"a malformed header line in the answer: {line[:80]!r}")
                key = name.lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            status = int(code)
            if 100 <= status < 200:
                continue
            if version == "HTTP/1.0" or "close" in headers.get("connection", "").lower():
                conn.reusable = False
            return status, headers

    async def _body(self, conn: _Conn, status: int, headers: Mapping[str, str]) -> AsyncIterator[bytes]:
        reader = conn.reader
        try:
            if status in (204, 304):
                return
            coding = headers.get("transfer-encoding", "").lower()
            if coding:
                if coding.split(",")[-1].strip() != "chunked":
                    raise HttpError(f"a transfer coding this client does not read: {coding!r}")
                while True:
                    line = await reader.readuntil(b"\r\n")
                    size = _chunk_size(line[:-2])
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailers are read and dropped
                        return
                    left = size
                    while left:
                        part = await reader.read(min(left, READ_SIZE))
                        if not part:
                            raise asyncio.IncompleteReadError(b"", left)
                        left -= len(part)
                        yield part
                    if await reader.readexactly(2) != b"\r\n":
                        raise HttpError("a chunk not followed by CRLF")
            length_text = headers.get("content-length")
            if length_text is not None:
                left = _length(length_text)
                while left:
                    part = await reader.read(min(left, READ_SIZE))
                    if not part:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(part)
                    yield part
                return
            conn.reusable = False
            while part := await reader.read(READ_SIZE):
                yield part
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            conn.reusable = False
            raise HttpError(f"the body was cut short: {type(exc).__name__}") from None
        except asyncio.LimitOverrunError:
            conn.reusable = False
            raise HttpError("a chunk line that does not end") from None

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        retry: bool = False,
    ) -> AsyncIterator[tuple[int, Mapping[str, str], AsyncIterator[bytes]]]:
        """Send one request; yields the status, the headers and the body's chunks as they arrive.

        ``retry``: the request may be acted on twice, so a reused connection that ended without
        an answer may be replaced by a fresh one and the request sent again (once).

        Raises:
            HttpError: the connection could not be made, or broke, or the answer is not HTTP.
        """
        head = self._head(method, path, len(body), headers or {})
        conn: _Conn | None = None
        status, answer_headers = 0, dict[str, str]()
        for attempt in range(2):
            conn = await self._checkout() if attempt == 0 else await self._open()
            try:
                conn.writer.write(head + body if len(body) < READ_SIZE else head)
                if len(body) >= READ_SIZE:
                    conn.writer.write(body)
                await conn.writer.drain()
                status, answer_headers = await self._read_head(conn)
            except _Stale:
                conn.close()
                if attempt == 0 and retry:
                    continue
                raise HttpError("the service closed the connection without answering") from None
            except (OSError, asyncio.IncompleteReadError) as exc:
                conn.close()
                if attempt == 0 and conn.reused and retry:
                    continue
                raise HttpError(f"the connection broke: {type(exc).__name__}: {exc}") from None
            except BaseException:
                conn.close()
                raise
            break
        assert conn is not None
        finished = False

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal finished
            async for part in self._body(conn, status, answer_headers):
                yield part
            finished = True

        try:
            yield status, answer_headers, chunks()
        finally:
            if finished:
                self._give_back(conn)
            else:
                conn.close()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        limit: int = 64 << 20,
        retry: bool = False,
    ) -> Answer:
        """One whole request and answer; a body over ``limit`` bytes is refused. ``retry`` as for ``stream``.

        Raises:
            HttpError: the conversation broke, or the body is over ``limit``.
        """
        async with self.stream(method, path, body, headers, retry=retry) as (status, answer_headers, parts):
            buf = bytearray()
            async for part in parts:
                buf += part
                if len(buf) > limit:
                    raise HttpError(f"the answer is over {limit} bytes")
        return Answer(status, answer_headers, bytes(buf))

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
