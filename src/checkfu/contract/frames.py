"""The ``openProcess`` wire: its frames, and the sans-I/O machine both ends run.

One WebSocket message is one frame. Output and input bytes travel as binary
messages: one tag byte, then the bytes (``0x01`` stdin, ``0x02`` out, ``0x03``
err). Every other frame is a JSON text message with a ``type``:

    client -> server   start, stdin, stdin_end, window, kill, resize
    server -> client   start, out, err, out_end, err_end, exit, window, error

- ``start`` (client) names a client-chosen ``operation_id`` and carries the
  ``OpenProcessRequest``, the client's first credit grant (``window``) and, when
  it reattaches after a dropped connection, ``resume``: how many bytes of each
  stream (and which ends) it needs no more; the server sends everything after
  that again, and refuses a ``resume`` for an operation it does not hold. A
  ``start`` for an operation the server already runs, or is still starting,
  attaches to it; it never starts the process twice.
- ``start`` (server) answers with the ``ProcessStarted`` result, the server's
  first stdin grant (``window``) and ``stdin``: how many stdin bytes it has, so
  a reattaching client resends only the rest.
- ``window`` grants the peer more credit: a sender may have at most the granted
  number of unacknowledged bytes in flight, in each direction. A grant also
  acknowledges: the receiver sends one as it consumes what arrived.
- ``out_end`` and ``err_end`` end their stream; ``exit`` comes after both and
  carries the real exit status; nothing comes after it.
- ``kill`` asks the server to end the process (and everything it started).
- ``resize`` gives a process started with ``tty`` a new window size (``rows``, ``cols``).
- ``error`` carries ``{"code", "message", "retryable", "field"?}`` and ends the
  conversation.

``ProcessChannel`` checks everything that arrives (order, direction, stream
ends, credit, chunk bounds) and everything its own side sends. A frame out of
order, after its stream's end or the exit, over the granted credit, or of an
unknown type is ``SandboxProtocolViolation``; a data frame over the chunk bound
is ``SandboxBoundExceeded``. The side that sent the exit (or an error) takes, and
drops, the grants, stdin and kills the peer sent before it saw it: they crossed
in flight, and are no breach. ``OutputOrder`` applies the same rules to the events
of an in-process ``ProcessStream``, so a process is checked the same way wherever
it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from checkfu.contract.codec import strict_json
from checkfu.contract.errors import (
    ErrorCode,
    SandboxBoundExceeded,
    SandboxError,
    SandboxProtocolViolation,
    error_for_code,
)
from checkfu.contract.members import OpenProcessRequest, ProcessStarted
from checkfu.contract.model import UNIQUE, UNIQUE_ITEMS, Bool, ExitCode, Identifier, Model, NonNegInt, PosInt, Str
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd

MAX_EXIT_CODE = 255
"""The largest exit status a process can have (``128 + n`` for death by signal ``n``)."""

MAX_DATA = 1 << 20
"""The largest data frame, in bytes, either side may send."""

DEFAULT_WINDOW = 8 << 20
"""The credit each side grants at start unless told otherwise."""

TAG_STDIN, TAG_OUT, TAG_ERR = 0x01, 0x02, 0x03
DataStream = Literal["stdin", "out", "err"]
TAGS: dict[int, DataStream] = {TAG_STDIN: "stdin", TAG_OUT: "out", TAG_ERR: "err"}
TAG_OF: dict[DataStream, int] = {v: k for k, v in TAGS.items()}

Role = Literal["client", "server"]


class ResumePoint(Model):
    """What a reattaching client needs no more: bytes of each output stream, and which ended.

    A client resumes from what it has consumed; what it received and had not consumed is sent again.
    """

    out: NonNegInt
    err: NonNegInt
    ended: Annotated[
        tuple[Literal["out", "err"], ...],
        Field(max_length=2, description="the streams whose end frame the client already received"),
        UNIQUE,
        UNIQUE_ITEMS,
    ] = ()


class StartFrame(Model):
    """Client: start (or reattach to) the process of ``operation_id``."""

    type: Literal["start"]
    operation_id: Identifier
    request: OpenProcessRequest
    window: PosInt = Field(description="credit granted for out and err together, in bytes")
    resume: ResumePoint | None = Field(
        default=None, description="on a reattach: what the client already received, so the server resends the rest"
    )


class StartedFrame(Model):
    """Server: the process runs (or was running); the first stdin grant and the stdin bytes it already has."""

    type: Literal["start"]
    operation_id: Identifier
    started: ProcessStarted
    window: PosInt = Field(description="credit granted for stdin, in bytes")
    stdin: NonNegInt = Field(description="stdin bytes the server has received for this operation")


class StdinEndFrame(Model):
    type: Literal["stdin_end"]


class WindowFrame(Model):
    """More credit for the peer, which also acknowledges that many consumed bytes."""

    type: Literal["window"]
    bytes: PosInt


class KillFrame(Model):
    type: Literal["kill"]


class ResizeFrame(Model):
    """Client: the process's pseudo-terminal has a new window size (only for a process started with ``tty``)."""

    type: Literal["resize"]
    rows: Annotated[int, Field(ge=1, le=65535)]
    cols: Annotated[int, Field(ge=1, le=65535)]


class OutEndFrame(Model):
    type: Literal["out_end"]


class ErrEndFrame(Model):
    type: Literal["err_end"]


class ExitFrame(Model):
    type: Literal["exit"]
    exit_code: ExitCode


class ErrorDetail(Model):
    """A vocabulary error as the wire carries it."""

    code: ErrorCode
    message: Str
    retryable: Bool
    field: Str | None = Field(default=None, description="the dotted path at fault, where there is one")

    @classmethod
    def of(cls, exc: SandboxError) -> ErrorDetail:
        code: ErrorCode = exc.code  # type: ignore[assignment]  # every raisable leaf's code is one of them
        return cls(code=code, message=exc.message, retryable=exc.retryable, field=exc.field)


class ErrorFrame(Model):
    """The conversation ends with this error."""

    type: Literal["error"]
    error: ErrorDetail


@dataclass(frozen=True, slots=True)
class Data:
    """A binary data frame."""

    stream: DataStream
    data: bytes


ClientFrame = StartFrame | StdinEndFrame | WindowFrame | KillFrame | ResizeFrame
ServerFrame = StartedFrame | OutEndFrame | ErrEndFrame | ExitFrame | WindowFrame | ErrorFrame
Frame = ClientFrame | ServerFrame | Data

_CLIENT_TYPES: dict[str, type[Model]] = {
    "start": StartFrame,
    "stdin_end": StdinEndFrame,
    "window": WindowFrame,
    "kill": KillFrame,
    "resize": ResizeFrame,
}
_SERVER_TYPES: dict[str, type[Model]] = {
    "start": StartedFrame,
    "out_end": OutEndFrame,
    "err_end": ErrEndFrame,
    "exit": ExitFrame,
    "window": WindowFrame,
    "error": ErrorFrame,
}
FRAME_TYPES: dict[Role, dict[str, type[Model]]] = {"client": _CLIENT_TYPES, "server": _SERVER_TYPES}
"""The text frames each side sends, by ``type``."""

_DATA_FROM: dict[Role, frozenset[DataStream]] = {"client": frozenset({"stdin"}), "server": frozenset({"out", "err"})}


def _violation(message: str, field: str = "frame") -> SandboxProtocolViolation:
    return SandboxProtocolViolation(f"openProcess: {message}", field=field)


def encode(frame: Frame) -> str | bytes:
    """The WebSocket message of one frame."""
    if isinstance(frame, Data):
        return bytes((TAG_OF[frame.stream],)) + frame.data
    return frame.model_dump_json(exclude_none=True)


def parse(message: str | bytes, sender: Role) -> Frame:
    """One message from ``sender``, decoded strictly.

    Raises:
        SandboxProtocolViolation: not a frame ``sender`` may send (unknown type or tag, wrong direction, bad body).
    """
    if isinstance(message, bytes | bytearray | memoryview):
        raw = bytes(message)
        if not raw:
            raise _violation("an empty binary frame")
        stream = TAGS.get(raw[0])
        if stream is None:
            raise _violation(f"unknown data tag {raw[0]:#04x}")
        if stream not in _DATA_FROM[sender]:
            raise _violation(f"the {sender} may not send {stream} data", field=stream)
        return Data(stream, raw[1:])
    try:
        doc = strict_json(message)
    except ValueError as exc:
        raise _violation(f"a text frame that is not JSON: {exc}"[:200]) from None
    kind = doc.get("type") if isinstance(doc, dict) else None
    model = FRAME_TYPES[sender].get(kind) if isinstance(kind, str) else None
    if model is None:
        raise _violation(f"unknown frame type {str(kind)[:40]!r} from the {sender}", field="type")
    try:
        return model.model_validate_json(message)  # type: ignore[return-value]
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "frame"
        raise _violation(f"{kind}: {where}: {first['msg']}", field=where) from None


def error_of(frame: ErrorFrame) -> SandboxError:
    """The vocabulary error an error frame carries, rebuilt by table (an unknown code is a provider failure)."""
    e = frame.error
    return error_for_code(e.code, e.message, field=e.field, retryable=e.retryable)


@dataclass
class _Flow:
    """Credit one way: ``allowed`` bytes may still arrive (or be sent) before the next grant."""

    allowed: int = 0


@dataclass
class ProcessChannel:
    """One end of an ``openProcess`` conversation, with no I/O.

    Feed ``receive`` every message that arrives; pass every frame this side sends
    through ``send``. Both raise on the first breach and leave the channel failed.
    """

    role: Role
    max_data: int = MAX_DATA
    started: bool = False
    closed: bool = False
    """An exit or an error has passed (either way): nothing more may."""
    ended_here: bool = False
    """This side sent the exit or the error: what the peer sent before it saw that crossed it in flight."""
    ended: set[str] = field(default_factory=set)
    stdin_ended: bool = False
    inbound: _Flow = field(default_factory=_Flow)
    outbound: _Flow = field(default_factory=_Flow)
    received: dict[str, int] = field(default_factory=lambda: {"stdin": 0, "out": 0, "err": 0})
    sent: dict[str, int] = field(default_factory=lambda: {"stdin": 0, "out": 0, "err": 0})

    @property
    def peer(self) -> Role:
        return "server" if self.role == "client" else "client"

    # what arrives ---------------------------------------------------------------------------

    def receive(self, message: str | bytes) -> Frame:
        """Parse and check one arriving message.

        Raises:
            SandboxProtocolViolation: a frame out of order, after its stream's end or the exit,
                over the granted credit, of an unknown type, or from the wrong side.
            SandboxBoundExceeded: a data frame over the chunk bound.
        """
        try:
            frame = parse(message, self.peer)
            self._admit_in(frame)
        except SandboxError:
            self.closed = True
            raise
        return frame

    def _admit_in(self, frame: Frame) -> None:
        if self.closed:
            if self.ended_here and isinstance(frame, WindowFrame | KillFrame | StdinEndFrame | ResizeFrame | Data):
                return  # sent before the peer saw this side's exit (or error): harmless, and nothing more is owed
            raise _violation(f"a {_name(frame)} frame after the conversation ended")
        if isinstance(frame, StartFrame | StartedFrame):
            if self.started:
                raise _violation("a second start")
            self.started = True
            self.outbound.allowed = frame.window  # the peer's first grant is for what this side sends
            return
        if isinstance(frame, ErrorFrame):
            self.closed = True
            return
        if not self.started:
            raise _violation(f"a {_name(frame)} frame before start")
        if isinstance(frame, WindowFrame):
            self.outbound.allowed += frame.bytes
        elif isinstance(frame, Data):
            self._data_in(frame)
        elif isinstance(frame, StdinEndFrame):
            if self.stdin_ended:
                raise _violation("stdin_end twice", field="stdin")
            self.stdin_ended = True
        elif isinstance(frame, OutEndFrame | ErrEndFrame):
            stream = "out" if isinstance(frame, OutEndFrame) else "err"
            if stream in self.ended:
                raise _violation(f"{stream}_end twice", field=stream)
            self.ended.add(stream)
        elif isinstance(frame, ExitFrame):
            missing = {"out", "err"} - self.ended
            if missing:
                raise _violation(f"exit before the end of {', '.join(sorted(missing))}", field="exit")
            self.closed = True

    def _data_in(self, frame: Data) -> None:
        size = len(frame.data)
        if size > self.max_data:
            raise SandboxBoundExceeded(f"openProcess: {frame.stream}: a frame of {size} bytes", field="data")
        if frame.stream == "stdin" and self.stdin_ended:
            raise _violation("stdin after stdin_end", field="stdin")
        if frame.stream in self.ended:
            raise _violation(f"{frame.stream}: output after its end", field=frame.stream)
        if size > self.inbound.allowed:
            raise _violation(
                f"{frame.stream}: {size} bytes over the credit ({self.inbound.allowed} bytes granted)",
                field="window",
            )
        self.inbound.allowed -= size
        self.received[frame.stream] += size

    # what this side sends ---------------------------------------------------------------------

    def grant(self, n: int) -> str | bytes:
        """The message granting the peer ``n`` more bytes (after consuming as much)."""
        return self.send(WindowFrame(type="window", bytes=n))

    def send(self, frame: Frame) -> str | bytes:
        """Check a frame this side is about to send, account for it, and encode it.

        Raises:
            SandboxProtocolViolation: this side would break the protocol (its own bug, caught before it goes out).
        """
        if self.closed:
            raise _violation(f"sending {_name(frame)} after the conversation ended")
        if isinstance(frame, StartFrame | StartedFrame):
            if self.started and self.role == "client":
                raise _violation("sending a second start")
            if self.role == "client":
                self.inbound.allowed = frame.window
            else:
                self.started = True
                self.inbound.allowed = frame.window
        elif isinstance(frame, WindowFrame):
            self.inbound.allowed += frame.bytes
        elif isinstance(frame, Data):
            if len(frame.data) > self.max_data:
                raise _violation(f"sending a {frame.stream} frame of {len(frame.data)} bytes", field="data")
            if len(frame.data) > self.outbound.allowed:
                raise _violation(f"sending {frame.stream} over the credit", field="window")
            self.outbound.allowed -= len(frame.data)
            self.sent[frame.stream] += len(frame.data)
        elif isinstance(frame, OutEndFrame | ErrEndFrame):
            self.ended.add("out" if isinstance(frame, OutEndFrame) else "err")
        elif isinstance(frame, ExitFrame | ErrorFrame):
            self.closed = self.ended_here = True
        elif isinstance(frame, StdinEndFrame):
            self.stdin_ended = True
        return encode(frame)

    @property
    def credit(self) -> int:
        """How many data bytes this side may send now."""
        return self.outbound.allowed


def _name(frame: Frame) -> str:
    return frame.stream if isinstance(frame, Data) else str(getattr(frame, "type", "?"))


class OutputOrder:
    """The same rules for an in-process ``ProcessStream``'s events: output only before its stream's end,
    chunks within the bound, both ends before the exit, nothing after it, and an exit at the end."""

    def __init__(self, max_chunk: int) -> None:
        self.max_chunk = max_chunk
        self.ended: set[str] = set()
        self.exited = False

    def feed(self, event: ProcessEvent) -> None:
        """Raises:
        SandboxProtocolViolation: output after its stream's end, an exit before both ends, anything after the exit,
            an exit status outside 0..255, or something that is no process event.
        SandboxBoundExceeded: a chunk over the bound.
        """
        if self.exited:
            raise _violation("the process stream went on after its exit", field="exit")
        if isinstance(event, ProcessOutput):
            if event.stream in self.ended:
                raise _violation(f"{event.stream}: output after its end", field=event.stream)
            if len(event.data) > self.max_chunk:
                raise SandboxBoundExceeded(f"{event.stream}: a chunk of {len(event.data)} bytes", field="data")
        elif isinstance(event, ProcessStreamEnd):
            if event.stream in self.ended:
                raise _violation(f"{event.stream}: ended twice", field=event.stream)
            self.ended.add(event.stream)
        elif isinstance(event, ProcessExit):
            missing = {"out", "err"} - self.ended
            if missing:
                raise _violation(f"exit before the end of {', '.join(sorted(missing))}", field="exit")
            code = event.exit_code
            if type(code) is not int or not 0 <= code <= MAX_EXIT_CODE:  # a model_construct'ed event skips the type
                raise _violation(f"exit_code: {code!r} is not an exit status 0..{MAX_EXIT_CODE}", field="exit_code")
            self.exited = True
        else:
            raise _violation(f"{type(event).__name__} is not a process event", field="event")

    def end(self) -> None:
        """Raises SandboxProtocolViolation: the stream ended without an exit."""
        if not self.exited:
            raise _violation("the process stream ended without an exit", field="exit")


def events_of(frame: Frame) -> ProcessEvent | None:
    """The process event a server frame stands for, if any."""
    if isinstance(frame, Data) and frame.stream != "stdin":
        return ProcessOutput(stream=frame.stream, data=frame.data)
    if isinstance(frame, OutEndFrame):
        return ProcessStreamEnd(stream="out")
    if isinstance(frame, ErrEndFrame):
        return ProcessStreamEnd(stream="err")
    if isinstance(frame, ExitFrame):
        return ProcessExit(exit_code=frame.exit_code)
    return None


def frame_of(event: ProcessEvent) -> Frame:
    """The server frame that carries a process event."""
    if isinstance(event, ProcessOutput):
        return Data(event.stream, event.data)
    if isinstance(event, ProcessStreamEnd):
        return OutEndFrame(type="out_end") if event.stream == "out" else ErrEndFrame(type="err_end")
    return ExitFrame(type="exit", exit_code=event.exit_code)


__all__ = [
    "DEFAULT_WINDOW",
    "FRAME_TYPES",
    "MAX_DATA",
    "Data",
    "ErrEndFrame",
    "ErrorDetail",
    "ErrorFrame",
    "ExitFrame",
    "KillFrame",
    "OutEndFrame",
    "OutputOrder",
    "ProcessChannel",
    "ResizeFrame",
    "ResumePoint",
    "StartFrame",
    "StartedFrame",
    "StdinEndFrame",
    "WindowFrame",
    "encode",
    "error_of",
    "events_of",
    "frame_of",
    "parse",
]
