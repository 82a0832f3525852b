"""The server side of ``openProcess``: one ``Operation`` per client-chosen operation id.

An operation outlives the connection that started it, so a client whose
connection dropped can reattach by the same id and resume from the last byte it
received; a ``start`` retried after a lost reply attaches instead of starting the
process again.

- The pump pulls the provider's events only while the bytes not yet acknowledged
  stay under the client's window: a slow reader stops the pump, the provider's
  ``events()`` is not pulled, and the process blocks on its own full pipe. No byte
  is dropped and memory stays within the window and one chunk.
- The log keeps what was pulled until the client acknowledges it (a ``window``
  grant acknowledges as many bytes); after a reattach it is sent again from the
  client's resume point. Ends and the exit stay until the client has them.
- Stdin the client sends is written by a task of its own, so a process that is
  slow to read its input never stops its output from flowing.
- The exit frame carries the exit the provider reported; a process still running
  never gets one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from checkfu.contract.errors import SandboxError, SandboxProtocolViolation, SandboxProviderFailed
from checkfu.contract.frames import (
    DEFAULT_WINDOW,
    MAX_DATA,
    Data,
    ErrEndFrame,
    ErrorDetail,
    ErrorFrame,
    Frame,
    OutEndFrame,
    ResumePoint,
    frame_of,
)
from checkfu.contract.members import OpenProcessRequest, ProcessStarted
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.contract.provider import ProcessStream

OPERATION_TTL = 600.0
"""How long an operation whose client went away unannounced waits for it to reattach."""


@dataclass
class Entry:
    """One frame of the log, and for data its offset in its stream."""

    frame: Frame
    offset: int = 0

    @property
    def size(self) -> int:
        return len(self.frame.data) if isinstance(self.frame, Data) else 0


def _stream_of(frame: OutEndFrame | ErrEndFrame) -> str:
    return "out" if isinstance(frame, OutEndFrame) else "err"


def _as_error(exc: BaseException) -> SandboxError:
    if isinstance(exc, SandboxError):
        return exc
    return SandboxProviderFailed(f"openProcess: the provider raised {type(exc).__name__}: {exc}"[:500])


class Operation:
    """A process started for one operation id, and everything a (re)attached client needs from it."""

    def __init__(
        self, operation_id: str, request: OpenProcessRequest, stream: ProcessStream, *, owner: bytes | None = None
    ) -> None:
        self.operation_id = operation_id
        self.request = request
        self.stream = stream
        self.owner = owner
        """The digest of the secret its starter sent (``credentials.operation_owner``): only a connection that
        presents the same secret may attach. ``None`` for a starter that sent none: then no one may reattach."""
        self.started: ProcessStarted = stream.started
        self.log: list[Entry] = []
        self.cursor = 0
        """How many entries at the front of the log the attached connection has sent."""
        self.unacked = 0
        """Data bytes in the log: pulled, not yet acknowledged."""
        self._ack_left = 0
        self.window = DEFAULT_WINDOW
        self.epoch = 0
        """Bumped by every attach; a connection of an older epoch stops."""
        self.offsets = {"out": 0, "err": 0}
        self.finished = False
        """The exit (or an error) is in the log: the pump has stopped."""
        self.stdin_received = 0
        self.stdin_written = 0
        self.stdin_queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.on_stdin_written: Callable[[int], Awaitable[None]] | None = None
        """Set by the attached connection: grants stdin credit back once bytes are written."""
        self.changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.attached = 0
        self.left_at = time.monotonic()
        self._pump = asyncio.ensure_future(self._run_pump())
        self._writer = asyncio.ensure_future(self._run_stdin())

    # the provider side ---------------------------------------------------------------------

    async def _run_pump(self) -> None:
        try:
            async for event in self.stream.events():
                while self.unacked >= self.window:
                    self._room.clear()
                    await self._room.wait()
                if isinstance(event, ProcessOutput):
                    for at in range(0, len(event.data), MAX_DATA):
                        piece = event.data[at : at + MAX_DATA]
                        self._append(Entry(Data(event.stream, piece), self.offsets[event.stream]))
                        self.offsets[event.stream] += len(piece)
                    continue
                self._append(Entry(frame_of(event)))
                if isinstance(event, ProcessExit):
                    self.finished = True
                    return
            self._fail(SandboxProtocolViolation("openProcess: the provider's stream ended without an exit"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # whatever the provider raised ends the conversation, typed
            self._fail(_as_error(exc))

    def _fail(self, error: SandboxError) -> None:
        self._append(Entry(ErrorFrame(type="error", error=ErrorDetail.of(error))))
        self.finished = True

    def _append(self, entry: Entry) -> None:
        self.log.append(entry)
        self.unacked += entry.size
        self.changed.set()

    async def _run_stdin(self) -> None:
        while True:
            data = await self.stdin_queue.get()
            try:
                if data is None:
                    await self.stream.close_stdin()
                    return
                await self.stream.send_stdin(data)
            except Exception:  # the process stopped reading: the rest of its input has nowhere to go
                while not self.stdin_queue.empty():
                    self.stdin_queue.get_nowait()
                return
            self.stdin_written += len(data)
            if self.on_stdin_written is not None:
                with contextlib.suppress(Exception):
                    await self.on_stdin_written(len(data))

    def queued_stdin(self) -> int:
        """Stdin bytes received and not yet written to the process."""
        return self.stdin_received - self.stdin_written

    # the client side -------------------------------------------------------------------------

    def attach(self, window: int, resume: ResumePoint | None) -> int:
        """A connection (re)attaches: drop what the client says it already has, resend the rest. Returns its epoch.

        A data entry the resume point falls inside is cut there, so no byte is sent twice.

        Raises:
            SandboxProtocolViolation: the resume point is not one this log can serve: it claims bytes
                never produced, or lies before bytes the client already acknowledged. Nothing changes then.
        """
        log = self.log
        if resume is not None:
            have = {"out": resume.out, "err": resume.err}
            log = []
            first: dict[str, int] = {}
            for entry in self.log:
                frame = entry.frame
                kept = entry
                if isinstance(frame, Data):
                    upto = have.get(frame.stream, 0)
                    if entry.offset + entry.size <= upto:
                        continue
                    if entry.offset < upto:
                        kept = Entry(Data(frame.stream, frame.data[upto - entry.offset :]), upto)
                    first.setdefault(frame.stream, kept.offset)
                elif isinstance(frame, OutEndFrame | ErrEndFrame) and _stream_of(frame) in resume.ended:
                    continue
                log.append(kept)
            for stream, upto in have.items():
                if upto > self.offsets[stream]:
                    raise SandboxProtocolViolation(
                        f"openProcess: resume at {stream} byte {upto}, but only {self.offsets[stream]} were produced",
                        field=f"resume.{stream}",
                    )
                if first.get(stream, self.offsets[stream]) > upto:
                    raise SandboxProtocolViolation(
                        f"openProcess: resume at {stream} byte {upto}, but the client acknowledged bytes past it",
                        field=f"resume.{stream}",
                    )
        self.log = log
        self.unacked = sum(entry.size for entry in log)
        self.window = window
        self.attached += 1
        self.epoch += 1
        self.cursor = 0
        self._ack_left = 0
        self._wake_pump()
        self.changed.set()
        return self.epoch

    def detach(self) -> None:
        self.attached -= 1
        self.left_at = time.monotonic()

    def next_frame(self, credit: int) -> Frame | None:
        """The next frame to send on the attached connection within ``credit``, or ``None`` for now.

        Consecutive data entries of one stream go out as one frame, up to the credit and the frame bound:
        a provider's small reads cost the wire fewer frames. An entry past the credit is split, so what goes
        out never exceeds the grant. The log keeps its entries; acknowledgements still drop them one by one.
        """
        if self.cursor >= len(self.log):
            return None
        first = self.log[self.cursor].frame
        if not isinstance(first, Data):
            self.cursor += 1
            return first
        room = min(credit, MAX_DATA)
        if room <= 0:
            return None
        parts: list[bytes] = []
        while self.cursor < len(self.log) and room > 0:
            entry = self.log[self.cursor]
            frame = entry.frame
            if not isinstance(frame, Data) or frame.stream != first.stream:
                break
            if entry.size > room:
                head = Entry(Data(frame.stream, frame.data[:room]), entry.offset)
                tail = Entry(Data(frame.stream, frame.data[room:]), entry.offset + room)
                self.log[self.cursor : self.cursor + 1] = [head, tail]
                entry, frame = head, head.frame
                assert isinstance(frame, Data)
            parts.append(frame.data)
            room -= entry.size
            self.cursor += 1
        return Data(first.stream, parts[0] if len(parts) == 1 else b"".join(parts))

    def acknowledge(self, n: int) -> None:
        """The client consumed ``n`` more bytes: drop that much sent data, in order, from the log."""
        self._ack_left += n
        i = 0
        while i < self.cursor:
            entry = self.log[i]
            if entry.size == 0:
                i += 1
                continue
            if entry.size > self._ack_left:
                break
            self._ack_left -= entry.size
            self.unacked -= entry.size
            del self.log[i]
            self.cursor -= 1
        self._wake_pump()

    def _wake_pump(self) -> None:
        if self.unacked < self.window:
            self._room.set()

    def expired(self, now: float) -> bool:
        return self.attached == 0 and now - self.left_at > OPERATION_TTL

    async def close(self) -> None:
        """Stop pumping and writing. The process itself is the provider's to end (release reaps it)."""
        for task in (self._pump, self._writer):
            task.cancel()
        for task in (self._pump, self._writer):
            with contextlib.suppress(BaseException):
                await task


__all__ = ["OPERATION_TTL", "Entry", "Operation"]
