"""A small HTTP/1.1 client over asyncio streams, with keep-alive connections; llhttp reads the answers.

The runner makes many small calls to one service, and a general-purpose client
spends most of such a call in its own layers. This one writes a request in one
piece and hands every byte of the answer to ``httptools.HttpResponseParser`` (llhttp,
the parser Node.js and uvicorn use; strict): it reads the framing as RFC 9112 section
6.3 orders it (informational answers, 204 and 304 without a body, ``Transfer-Encoding:
chunked``, ``Content-Length``, else to the close), refuses a malformed status line,
header, length or chunk size, and says whether the connection may carry another
request. This module keeps what the parser leaves to its caller: the sockets, TLS, the
pool, the bounds on a head and a body, the end of a body that runs to the close, and
when a request may be sent twice. (h11 was tried first: its state machine cost about
100 us more a call, five times this whole client side, on the machine B3 ran on.)

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

import httptools

READ_SIZE = 256 << 10
MAX_HEAD = 64 << 10
"""An answer's head (status line and headers, informational answers included) over this many bytes is refused."""


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
    answer: _Answer | None = None
    """The answer last read on this connection (the parser holds its end, and what came after it)."""

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


def _buffered(reader: asyncio.StreamReader) -> int:
    """Bytes the server sent that nobody has read yet (``StreamReader`` keeps them in ``_buffer``)."""
    return len(getattr(reader, "_buffer", b""))


class _Unasked(Exception):
    """An answer began after the one that was asked for had ended."""


class _Answer:
    """One answer as the parser tells it (its callbacks), for one request."""

    __slots__ = ("body", "done", "extra", "head", "head_size", "headers", "keep_alive", "parser", "status", "to_close")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_size = 0
        self.head = False
        """The final answer's head has been read (informational answers are skipped)."""
        self.to_close = False
        """Its body runs to the close: the parser cannot see that end, this module does."""
        self.body: list[bytes] = []
        """Body bytes read and not yet handed on."""
        self.done = False
        self.keep_alive = False
        self.extra = False
        """Bytes came after the answer: an answer no request asked for."""

    def on_message_begin(self) -> None:
        if self.done:
            raise _Unasked

    def on_status(self, status: bytes) -> None:
        self.head_size += len(status) + 15  # "HTTP/1.1 200 " and its CRLF

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head:
            return  # a trailer of a chunked body: read and dropped
        self.head_size += len(name) + len(value) + 4
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.headers = {}  # an informational answer: the final one follows
            return
        self.status, self.head = status, True
        self.to_close = (
            status not in (204, 304)
            and "content-length" not in self.headers
            and not self.headers.get("transfer-encoding")
        )

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head:
            self.done = True
            self.keep_alive = self.parser.should_keep_alive()

    def feed(self, data: bytes) -> None:
        """Parse ``data``; bytes after the end of the answer only set ``extra``.

        Raises:
            HttpError: the answer is not HTTP/1.1, or its body's framing is malformed.
        """
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise HttpError("not an HTTP/1.1 answer: it switched protocols") from None
        except httptools.HttpParserError as exc:
            if self.done:
                self.extra = True  # the parser stopped where the next answer began
            elif self.head:
                raise HttpError(f"a malformed answer body: {exc}") from None
            else:
                raise HttpError(f"not an HTTP/1.1 answer: {exc}") from None


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
        if extra or (conn.answer is not None and conn.answer.extra):
            conn.close()
            conn.reader.feed_eof()
            sent = f"{extra} bytes" if extra else "bytes"
            self._unsolicited = self._unsolicited or (
                f"the service sent {sent} after an answer that no request asked for (an answer sent twice?)"
            )

    def _raise_unsolicited(self) -> None:
        if self._unsolicited is not None:
            message, self._unsolicited = self._unsolicited, None
            raise HttpError(message)

    def _give_back(self, conn: _Conn) -> None:
        if conn.answer is None or not conn.answer.keep_alive:
            conn.reusable = False  # ``connection: close``, HTTP/1.0, or a body that ran to the close
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
        """The status and headers of the next final answer (read into a new ``conn.answer``).

        Raises:
            _Stale: the reused connection ended before any byte of an answer.
            HttpError: the answer's head is not HTTP/1.1, is over ``MAX_HEAD`` bytes, or was cut short.
        """
        answer = conn.answer = _Answer()
        received = 0
        while not answer.head:
            data = await conn.reader.read(READ_SIZE)
            if not data:
                if received:
                    raise HttpError("the connection closed in the middle of an answer's head")
                if conn.reused:
                    raise _Stale
                raise HttpError("the service closed the connection without answering")
            received += len(data)
            answer.feed(data)
            if not answer.head and received > MAX_HEAD:
                raise HttpError(f"an answer's head is over {MAX_HEAD} bytes")
        if answer.head_size > MAX_HEAD:
            raise HttpError(f"an answer's head is over {MAX_HEAD} bytes")
        coding = answer.headers.get("transfer-encoding", "").lower()
        if coding and coding.split(",")[-1].strip() != "chunked":
            raise HttpError(f"a transfer coding this client does not read: {coding!r}")
        return answer.status, answer.headers

    async def _body(self, conn: _Conn) -> AsyncIterator[bytes]:
        """The answer's body as the parser frames it; ends at its end.

        Raises:
            HttpError: the body was cut short or its framing is malformed (the connection is not reused).
        """
        answer = conn.answer
        assert answer is not None
        try:
            while True:
                if answer.body:
                    parts, answer.body = answer.body, []
                    for part in parts:
                        yield part
                if answer.done:
                    return
                data = await conn.reader.read(READ_SIZE)
                if not data:
                    if answer.to_close:
                        answer.done = True  # the end the parser cannot see; keep_alive stays False
                        return
                    raise HttpError("the body was cut short: the connection closed")
                answer.feed(data)
        except HttpError:
            conn.reusable = False
            raise
        except ConnectionError as exc:
            conn.reusable = False
            raise HttpError(f"the body was cut short: {type(exc).__name__}") from None

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
            except OSError as exc:
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
            async for part in self._body(conn):
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
