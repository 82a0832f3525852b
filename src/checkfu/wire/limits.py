"""How much a client may send a provider service before the service reads its request, and how slowly.

uvicorn parses requests with httptools (llhttp), which bounds neither the size nor the number of a
request's header lines and times out neither a head that never ends nor a body that stops coming; the
credential is checked only once a head is complete. So any client that can connect could make the
service hold 128 MiB of one header per connection (eight of them took it to 1.4 GiB and minutes of CPU,
the parser joining the pieces again at every read), or hold a connection open for ever.
``bounded_http(limits)`` is uvicorn's httptools protocol with ``RequestLimits`` added where they can act:
on the bytes as they arrive, before the parser buffers them.

- A head (request line and header lines) over ``head_bytes``, or with more than ``header_lines`` header
  lines, is answered ``431`` with a ``SandboxProtocolViolation`` body (field ``headers``) and the
  connection is closed: the parser never sees more than ``head_bytes`` of it, plus at most one read
  (256 KiB) when the head began in the middle of one.
- A head not complete ``head_seconds`` after its first byte (or after the connection opened, for the
  first) is answered ``408``, typed the same way, and the connection is closed. Between requests uvicorn's
  keep-alive timeout closes an idle connection.
- While a request's body is incomplete, ``idle_seconds`` without a byte of it closes the connection,
  unless the service itself stopped reading (it has not consumed what came). A body that keeps coming,
  however slowly, is read whole.

After a refusal the service stops sending, reads and drops what the client still sends for up to
``LINGER`` seconds (so the client can read the refusal instead of a reset), then closes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from checkfu.contract.errors import SandboxProtocolViolation
from checkfu.wire.errors import WireError

LINGER = 2.0
"""How long a refused connection is drained before it is closed."""

_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """What a provider service accepts of a request before its application sees it."""

    head_bytes: int = 64 << 10
    """The request line and every header line together, in bytes. The runner's largest head (a ``writeFile``
    with its ``Checkfu-Request`` header at its longest and the longest credential) is under half of this."""
    header_lines: int = 100
    head_seconds: float = 10.0
    """From a head's first byte (or the connection's opening) to its end. The runner writes a head in one piece."""
    idle_seconds: float = 30.0
    """The longest pause in a body the service is waiting for."""


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol held to ``limits``; ``bounded_http`` makes one for given limits."""

    limits: ClassVar[RequestLimits] = RequestLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._head_bytes = 0
        self._header_lines = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_open = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._too_many: str | None = None
        """Set when a header line past the bound stopped the parser: the refusal to send instead of its 400."""
        self._refused = False

    # the connection -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        resume = self.flow.resume_reading

        def resumed() -> None:
            # The client's quiet is timed from when the service reads again, not from the last look the idle timer
            # took while it was paused: else a client that sent on at once after a long pause of the service's was
            # cut as idle (seen on a loaded machine, where the next bytes arrive a moment later).
            if self.flow.read_paused:
                self._last_read = self.loop.time()
            resume()

        self.flow.resume_reading = resumed  # type: ignore[method-assign]
        self._begin_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # drained, never parsed
        self._last_read = self.loop.time()
        if not self._in_head and not self._body_open:
            # between messages: the next head's time starts at its first byte, even a blank line's, which the
            # parser skips without beginning a message (while any byte stops uvicorn's keep-alive timer)
            self._begin_head()
        if not self._in_head:
            super().data_received(data)
            self._watch_body()
            return
        room = self.limits.head_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            self._watch_body()
            return
        self._head_bytes += room
        super().data_received(data[:room])  # the head may end in these bytes
        if self._refused or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # refused, failed, or upgraded to a WebSocket (which takes no bytes sent before its answer)
        if self._in_head:
            self._refuse(431, f"the request head is over {self.limits.head_bytes} bytes")
            return
        self.data_received(data[room:])

    # the parser's events -----------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._begin_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        if self._header_lines > self.limits.header_lines:
            self._too_many = f"the request head has over {self.limits.header_lines} header lines"
            raise _TooManyLines  # stops the parser; uvicorn answers through send_400_response
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_open = not self.parser.should_upgrade()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_open = False
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if self._too_many is not None:
            self._refuse(431, self._too_many)
        else:
            super().send_400_response(msg)

    # the bounds ----------------------------------------------------------------------------------------

    def _begin_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._header_lines = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.head_seconds, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self._in_head and not self._refused and not self.transport.is_closing():
            self._refuse(408, f"the request head did not arrive within {self.limits.head_seconds:g} s")

    def _watch_body(self) -> None:
        """After a read: time the pause in a body that is still incomplete."""
        if self._body_open and self._idle_timer is None and not self.transport.is_closing():
            self._idle_timer = self.loop.call_later(self.limits.idle_seconds, self._body_quiet)

    def _body_quiet(self) -> None:
        self._idle_timer = None
        if not self._body_open or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        now = self.loop.time()
        if self.flow.read_paused:
            self._last_read = now  # the service is not reading: the pause is not the client's
        quiet = now - self._last_read
        if quiet < self.limits.idle_seconds:
            self._idle_timer = self.loop.call_later(max(self.limits.idle_seconds - quiet, 0.001), self._body_quiet)
            return
        self.transport.close()  # the application waiting for the rest learns the client is gone

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a typed body, stop sending, drain for a while, close."""
        self._refused = True
        self._in_head = False
        self._stop_timers()
        body = WireError.of(SandboxProtocolViolation(message, field="headers")).model_dump_json(exclude_none=True)
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body.encode())
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER, self.transport.close)
        else:
            self.transport.close()

    def _stop_timers(self) -> None:
        for timer in (self._head_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._idle_timer = None


class _TooManyLines(Exception):
    """Raised in the parser's header callback to stop it; never leaves this module."""


def bounded_http(limits: RequestLimits) -> type[BoundedHttp]:
    """A ``BoundedHttp`` protocol class held to ``limits``, for ``uvicorn.Config(http=...)``."""

    class Bounded(BoundedHttp):
        pass

    Bounded.limits = limits
    return Bounded


__all__ = ["LINGER", "BoundedHttp", "RequestLimits", "bounded_http"]
