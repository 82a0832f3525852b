"""The server SDK: any ``Provider`` as an HTTP service.

``create_app(provider, credentials)`` returns an ASGI application (Starlette),
with no module globals:

- ``POST /v1/<member>`` for every member: a JSON request, a JSON result. Two
  members carry bytes: ``writeFile`` takes the file's bytes as the body (its
  request in the ``Checkfu-Request`` header) and ``readFiles`` streams them back
  (``checkfu.wire.files``).
- ``GET /v1/openProcess`` upgrades to a WebSocket carrying the frames of
  ``checkfu.contract.frames``.
- ``GET /openapi.json``: the OpenAPI document of all of it.

Every ``/v1`` request must carry an accepted credential (``Authorization: Bearer``),
compared in constant time, or it is answered ``SandboxUnauthenticated``. An
``openProcess`` operation belongs to the client that started it: every connection
that attaches to it must present the secret its start presented
(``Checkfu-Operation-Secret``), or the operation is not found, whatever credential
it carries. Errors
travel as ``{"error": {...}}`` under the status of ``checkfu.wire.errors.STATUS``.
Requests are decoded as strictly as the runner decodes results. What the provider
answers is sent as it is: judging it is the runner's job, at its own door.

Served over the wire, an envelope's ``runner_enforced`` axes are restated as
``provider_attested``: the runner at the other end did not set those controls,
the service did, and says so (``attest_enforcement=False`` serves it verbatim).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from checkfu.contract.codec import MAX_DOCUMENT_BYTES, decode, encode
from checkfu.contract.envelope import MEMBERS, Member, SandboxProviderCapabilities
from checkfu.contract.errors import (
    ERROR_CLASSES,
    SandboxError,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxUnauthenticated,
    error_for_code,
)
from checkfu.contract.frames import (
    DEFAULT_WINDOW,
    Data,
    ErrorDetail,
    ErrorFrame,
    ExitFrame,
    KillFrame,
    ProcessChannel,
    ResizeFrame,
    StartedFrame,
    StartFrame,
    StdinEndFrame,
    WindowFrame,
)
from checkfu.contract.members import MESSAGES, METHOD_NAMES, DescribeResult, OpenProcessRequest, WriteFileRequest
from checkfu.contract.provider import ProcessStream, Provider
from checkfu.wire.credentials import (
    OPERATION_SECRET,
    SERVER_LOGGERS,
    Accepted,
    Credential,
    operation_owner,
    redact_logs,
    same_owner,
)
from checkfu.wire.errors import WireError, status_of
from checkfu.wire.files import FILES_MEDIA_TYPE, REQUEST_HEADER, stream_files
from checkfu.wire.openapi import openapi_document
from checkfu.wire.operations import Operation

STDIN_WINDOW = DEFAULT_WINDOW
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""Every method a ``/v1`` path answers: a wrong one gets a typed refusal, after the credential."""
MAX_WRITE_BYTES = 1 << 40
"""No single staged file may be larger than this (1 TiB); the provider's own disk limit binds long before."""


def _error_response(exc: SandboxError, status: int | None = None, headers: dict[str, str] | None = None) -> Response:
    return Response(
        WireError.of(exc).model_dump_json(exclude_none=True),
        status_code=status or status_of(exc),
        media_type="application/json",
        headers=headers,
    )


def _as_error(member: str, exc: BaseException) -> SandboxError:
    if isinstance(exc, SandboxError):
        if exc.code in ERROR_CLASSES:
            return exc
        return error_for_code(exc.code, exc.message, field=exc.field, retryable=exc.retryable)
    return SandboxProviderFailed(f"{member}: the provider raised {type(exc).__name__}: {exc}"[:500])


def attested(envelope: SandboxProviderCapabilities) -> SandboxProviderCapabilities:
    """The envelope as a service states it: no axis ``runner_enforced``, since no runner across the wire set it."""
    axes = envelope.enforcement.model_dump()
    restated = {a: ("provider_attested" if v == "runner_enforced" else v) for a, v in axes.items()}
    return envelope.model_copy(update={"enforcement": type(envelope.enforcement)(**restated)})


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused once it grows past ``limit``.

    Raises:
        SandboxProtocolViolation: the body is larger than ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise SandboxProtocolViolation(f"the body of {declared} bytes is over the {limit} allowed", field="body")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise SandboxProtocolViolation(f"the body is over the {limit} bytes allowed", field="body")
    return bytes(buf)


def create_app(
    provider: Provider,
    credentials: Iterable[Credential | str] | Accepted,
    *,
    attest_enforcement: bool = True,
) -> Starlette:
    """An ASGI service for ``provider``, accepting ``credentials``.

    Raises:
        CredentialError: no credential to accept (a service that accepts nothing would serve nobody).
    """
    accepted = credentials if isinstance(credentials, Accepted) else Accepted(credentials)
    redact_logs(*SERVER_LOGGERS)
    operations: dict[str, Operation] = {}
    starting: dict[str, tuple[OpenProcessRequest, asyncio.Future[ProcessStream], bytes | None]] = {}
    """Operations whose provider start has not answered yet (request, start, owner), so a retried start waits."""

    def authorized(headers: Any) -> None:
        if not accepted.check(headers.get("authorization")):
            raise SandboxUnauthenticated("this request carries no accepted credential", field="authorization")

    def member_route(member: Member) -> Callable[[Request], Awaitable[Response]]:
        request_type, _ = MESSAGES[member]
        method: Callable[..., Awaitable[Any]] = getattr(provider, METHOD_NAMES[member])

        async def endpoint(request: Request) -> Response:
            try:
                if member == "writeFile":
                    return await write_file(request)
                body = await _read_body(request, MAX_DOCUMENT_BYTES)
                if member == "describe":
                    if body.strip():
                        decode(request_type, body)  # an empty object, strictly, or nothing at all
                    result = await method()
                    if attest_enforcement and isinstance(result, DescribeResult):
                        result = DescribeResult(envelope=attested(result.envelope))
                    return Response(encode(result), media_type="application/json")
                call = decode(request_type, body)
                result = await method(call)
                if member == "readFiles":
                    return StreamingResponse(stream_files(result), media_type=FILES_MEDIA_TYPE)
                return Response(encode(result), media_type="application/json")
            except Exception as exc:
                return _error_response(_as_error(member, exc))

        return endpoint

    endpoints = {m: member_route(m) for m in MEMBERS if m != "openProcess"}

    async def v1(request: Request) -> Response:
        """Every ``/v1`` HTTP request: the credential first, then the member, then its method."""
        try:
            authorized(request.headers)
            name = request.path_params["member"]
            endpoint = endpoints.get(name)
            if endpoint is None:
                if name == "openProcess":
                    if request.method != "GET":
                        wrong = SandboxProtocolViolation(
                            f"openProcess is a WebSocket: GET it with an Upgrade, not {request.method[:16]}",
                            field="method",
                        )
                        return _error_response(wrong, 405, {"allow": "GET"})
                    raise SandboxProtocolViolation("openProcess is a WebSocket: GET it with an Upgrade", field="method")
                raise SandboxOperationUnsupported(f"no member {name[:64]!r} on this service", field="path")
            if request.method != "POST":
                allow = {"allow": "POST"}
                wrong = SandboxProtocolViolation(f"{name} takes POST, not {request.method[:16]}", field="method")
                return _error_response(wrong, 405, allow)
        except SandboxError as exc:
            return _error_response(exc)
        return await endpoint(request)

    async def write_file(request: Request) -> Response:
        header = request.headers.get(REQUEST_HEADER)
        if header is None:
            raise SandboxProtocolViolation(
                f"writeFile needs its request in the {REQUEST_HEADER} header", field=REQUEST_HEADER
            )
        call = decode(WriteFileRequest, header)
        # The provider checks the bytes against the size and digest it was sent, as it does in-process;
        # the service only refuses to read more than one byte past the declared size.
        data = await _read_body(request, min(call.size, MAX_WRITE_BYTES) + 1)
        result = await provider.write_file(call, data)
        return Response(encode(result), media_type="application/json")

    async def openapi(_: Request) -> Response:
        return JSONResponse(openapi_document())

    async def open_process(ws: WebSocket) -> None:
        await ws.accept()
        channel = ProcessChannel("server")
        try:
            authorized(ws.headers)
            start = channel.receive(await _receive(ws))
            if not isinstance(start, StartFrame):
                raise SandboxProtocolViolation("openProcess: the first frame must be start", field="type")
            try:
                presented = operation_owner(ws.headers.get(OPERATION_SECRET))
            except ValueError as exc:
                raise SandboxProtocolViolation(f"openProcess: {exc}", field=OPERATION_SECRET) from None
            op = await _operation(start, presented)
        except SandboxError as exc:
            await _send_error(ws, channel, exc)
            return
        except WebSocketDisconnect:
            return
        await _attached(ws, channel, op, start)

    async def _operation(start: StartFrame, presented: bytes | None) -> Operation:
        """The operation ``start`` names: the one already running or being started under its id, else a new one.

        A start retried while the first is still waiting for the provider waits for that same
        start, so the provider is asked once. A start that resumes (``resume``) is a reattach:
        it never starts anything. A new operation belongs to the secret ``presented`` with its
        start; a connection that presents another is told the operation does not exist, in the
        same words as for an id never seen, so holding the credential and the id is not enough.

        Raises:
            SandboxNotFound: a reattach to an operation this service does not hold (it restarted, or forgot it),
                or to one another client started.
            SandboxProtocolViolation: the operation id was started for another request.
        """
        now = time.monotonic()
        for key in [k for k, o in operations.items() if o.expired(now)]:
            await operations.pop(key).close()
        op_id = start.operation_id
        op = operations.get(op_id)
        if op is not None:
            if not same_owner(op.owner, presented):
                raise _not_found(op_id)
            _same_request(op_id, op.request, start)
            return op
        if op_id in starting:
            request, opening, owner = starting[op_id]
            if not same_owner(owner, presented):
                raise _not_found(op_id)
            _same_request(op_id, request, start)
        elif start.resume is not None:
            raise _not_found(op_id)
        else:
            owner = presented
            opening = asyncio.ensure_future(_open(start))
            starting[op_id] = (start.request, opening, owner)
        try:
            stream = await asyncio.shield(opening)
        finally:
            if opening.done() and op_id in starting and starting[op_id][1] is opening:
                del starting[op_id]
        op = operations.get(op_id)  # whoever resumes first from the one start records it
        if op is None:
            op = operations[op_id] = Operation(op_id, start.request, stream, owner=owner)
        return op

    async def _open(start: StartFrame) -> ProcessStream:
        try:
            return await provider.open_process(start.request)
        except Exception as exc:
            raise _as_error("openProcess", exc) from None

    async def _attached(ws: WebSocket, channel: ProcessChannel, op: Operation, start: StartFrame) -> None:
        try:
            epoch = op.attach(start.window, start.resume)
        except SandboxError as exc:
            await _send_error(ws, channel, exc)
            return
        lock = asyncio.Lock()
        credit = asyncio.Event()
        killing: set[asyncio.Future[None]] = set()
        done_normally = False

        async def send(frame: Any) -> None:
            async with lock:
                message = channel.send(frame)
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                else:
                    await ws.send_text(message)

        async def stdin_written(n: int) -> None:
            if op.epoch == epoch and not channel.closed:
                await send(WindowFrame(type="window", bytes=n))

        grant = max(1, STDIN_WINDOW - op.queued_stdin())
        started = StartedFrame(
            type="start", operation_id=op.operation_id, started=op.started, window=grant, stdin=op.stdin_received
        )

        async def sender() -> None:
            while op.epoch == epoch:
                frame = op.next_frame(channel.credit)
                if frame is None:
                    op.changed.clear()
                    credit.clear()
                    waiters = [asyncio.ensure_future(op.changed.wait()), asyncio.ensure_future(credit.wait())]
                    try:
                        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for w in waiters:
                            w.cancel()
                    continue
                await send(frame)
                if isinstance(frame, ExitFrame | ErrorFrame):
                    return

        async def receiver() -> bool:
            """Returns whether the client closed normally."""
            while True:
                try:
                    message = await _receive(ws)
                except WebSocketDisconnect as gone:
                    return gone.code in (1000, 1001)
                if op.epoch != epoch:
                    return False  # the client reattached elsewhere: what still arrives here is stale
                frame = channel.receive(message)
                if isinstance(frame, Data):
                    op.stdin_received += len(frame.data)
                    op.stdin_queue.put_nowait(frame.data)
                elif isinstance(frame, StdinEndFrame):
                    op.stdin_queue.put_nowait(None)
                elif isinstance(frame, WindowFrame):
                    op.acknowledge(frame.bytes)
                    credit.set()
                elif isinstance(frame, KillFrame):
                    killing.add(asyncio.ensure_future(_kill(op)))
                elif isinstance(frame, ResizeFrame):
                    killing.add(asyncio.ensure_future(_resize(op, frame.rows, frame.cols)))

        send_task: asyncio.Future[None] | None = None
        recv_task: asyncio.Future[bool] | None = None
        try:
            await send(started)  # inside the try: a client gone before this reply still detaches
            op.on_stdin_written = stdin_written
            send_task = asyncio.ensure_future(sender())
            recv_task = asyncio.ensure_future(receiver())
            await asyncio.wait([send_task, recv_task], return_when=asyncio.FIRST_COMPLETED)
            if recv_task.done():
                send_task.cancel()
                done_normally = recv_task.result() if not recv_task.cancelled() else False
            else:
                send_task.result()
                # The exit (or an error) went out: wait for the client to close.
                done_normally = await recv_task
        except SandboxError as exc:
            with contextlib.suppress(Exception):
                await _send_error(ws, channel, exc)
        except Exception:  # a broken connection: the operation waits for a reattach
            pass
        finally:
            for task in (send_task, recv_task):
                if task is not None:
                    task.cancel()
            if op.on_stdin_written is stdin_written:
                op.on_stdin_written = None
            op.detach()
            if done_normally and op.finished and op.epoch == epoch:
                operations.pop(op.operation_id, None)
                await op.close()

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # A start still waiting on the provider ends with the service, as its client's connection does: the
            # provider's call is cancelled here, not left pending in a loop that is going away. What it may have
            # started is the provider's to end (release reaps it).
            pending = [opening for _, opening, _ in starting.values()]
            starting.clear()
            for opening in pending:
                opening.cancel()
            for opening in pending:
                with contextlib.suppress(BaseException):
                    await opening
            for op in list(operations.values()):
                await op.close()
            operations.clear()

    app = Starlette(
        routes=[
            WebSocketRoute("/v1/openProcess", open_process),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/v1/{member:path}", v1, methods=HTTP_METHODS),
        ],
        lifespan=lifespan,
    )
    app.state.operations = operations  # the open processes, for whoever runs the app to look at
    app.state.starting = starting  # the starts still waiting on the provider
    return app


def _not_found(op_id: str) -> SandboxNotFound:
    """An operation this connection may not attach to: never held, forgotten, or another client's (one answer)."""
    return SandboxNotFound(
        f"openProcess: no operation {op_id!r} to reattach to; its process is not known here", field="operation_id"
    )


def _same_request(op_id: str, request: OpenProcessRequest, start: StartFrame) -> None:
    if request != start.request:
        raise SandboxProtocolViolation(
            f"openProcess: operation {op_id!r} was started for another request", field="operation_id"
        )


async def _receive(ws: WebSocket) -> str | bytes:
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    if message.get("bytes") is not None:
        return bytes(message["bytes"])
    return str(message.get("text") or "")


async def _send_error(ws: WebSocket, channel: ProcessChannel, exc: SandboxError) -> None:
    frame = ErrorFrame(type="error", error=ErrorDetail.of(exc))
    channel.closed = True
    with contextlib.suppress(Exception):
        await ws.send_text(frame.model_dump_json(exclude_none=True))
        await ws.close(code=1000)


async def _kill(op: Operation) -> None:
    with contextlib.suppress(Exception):
        await op.stream.kill()


async def _resize(op: Operation, rows: int, cols: int) -> None:
    with contextlib.suppress(Exception):  # a stale size is harmless; the process's own end is what matters
        await op.stream.resize(rows, cols)


__all__ = ["attested", "create_app"]
