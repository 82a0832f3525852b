"""The client adapter: any provider service as a ``Provider`` the runner drives like an in-tree one.

``RemoteProvider(url, credential)`` turns each member into an HTTP call and each
answer back into the contract's models, strictly:

- a ``200`` answer is decoded as the member's result (``SandboxResultInvalid``
  when it does not decode);
- any other status must carry the wire's error body, rebuilt through the
  vocabulary's one code-to-class table (an unknown code is
  ``SandboxProviderFailed`` naming it);
- a body that is not JSON, one cut short, a dropped connection
  (``SandboxProtocolViolation``), a service that cannot be reached
  (``SandboxProviderFailed``) and a call past its deadline
  (``SandboxProviderTimeout``) are typed too.

``open_process`` speaks the WebSocket frames of ``checkfu.contract.frames``
through a ``ProcessChannel``; its stream reattaches by operation id when the
connection drops and resumes from the last byte it received.

An ``https://`` service is reached over TLS, and its WebSocket over ``wss://``, with
its certificate verified (``checkfu.wire.tls``): one that cannot be verified is
``SandboxProviderFailed``, field ``tls``, naming how to trust it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import ssl
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from checkfu.contract.codec import decode, strict_json
from checkfu.contract.deadlines import DEFAULT_DEADLINES
from checkfu.contract.envelope import Member
from checkfu.contract.errors import (
    ERROR_CLASSES,
    SandboxAdapterUnavailable,
    SandboxError,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxStateConflict,
    SandboxUnauthenticated,
    observed_by_runner,
)
from checkfu.contract.frames import (
    DEFAULT_WINDOW,
    MAX_DATA,
    Data,
    ErrorFrame,
    ExitFrame,
    KillFrame,
    ProcessChannel,
    ResizeFrame,
    ResumePoint,
    StartedFrame,
    StartFrame,
    StdinEndFrame,
    WindowFrame,
    error_of,
    events_of,
)
from checkfu.contract.members import (
    MESSAGES,
    ActivateRequest,
    CloneRequest,
    CloneResult,
    CompensateRequest,
    CompensateResult,
    DeleteSnapshotRequest,
    DeleteSnapshotResult,
    DescribeResult,
    ExecRequest,
    ExecResult,
    InspectRequest,
    InstanceResult,
    ListAllocationsRequest,
    ListAllocationsResult,
    ListDirRequest,
    ListDirResult,
    MaterializeRequest,
    MaterializeResult,
    OpenProcessRequest,
    ProcessStarted,
    ProvisionRequest,
    ReadFilesRequest,
    ReadFilesResult,
    ReleaseRequest,
    ReleaseResult,
    ResumeRequest,
    ResumeResult,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    WriteFileResult,
)
from checkfu.contract.model import Model
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.wire.credentials import ENROLLED, ENV, OPERATION_SECRET, REDACTED, Credential
from checkfu.wire.errors import STATUS, WireError
from checkfu.wire.files import FILES_MEDIA_TYPE, REQUEST_HEADER, read_files_body
from checkfu.wire.http import HttpError, HttpPool
from checkfu.wire.tls import TRUST_HINT, TlsError, client_context

M = TypeVar("M", bound=Model)

DEADLINES = DEFAULT_DEADLINES
"""The client's own bound on each call (``exec`` adds its request's timeout), so none hangs even outside a runner."""

_REPEATABLE: tuple[Member, ...] = ("describe", "materialize", "writeFile", "inspect", "compensate", "readFiles")
REPEATABLE: frozenset[Member] = frozenset((*_REPEATABLE, "listAllocations", "listDir", "deleteSnapshot"))
"""Members a service may be asked twice without harm (the contract makes each idempotent). Only these are
sent again when a reused connection ends after the request went out and before any answer: the service
may have acted on it, and an allocation, an exec or an activation must not happen twice."""

UNAUTHENTICATED = STATUS["SandboxUnauthenticated"]
"""The status of a request the service refused for its credential (``401``)."""

REATTACH_ATTEMPTS = 6
NOTHING_CONSUMED = ResumePoint(out=0, err=0, ended=())
"""A reattach that has consumed nothing yet: what a retried start sends once its first start went out."""
REATTACH_PAUSE = 0.05

WS_LOG = logging.getLogger("checkfu.wire.websocket")
"""Where the WebSocket library logs the client's handshakes: with the credential blanked."""
WS_LOG.addFilter(REDACTED)


def _decoded(model: type[M], body: bytes) -> M:
    """A result decoded strictly; a failure is the runner's own finding about the answer."""
    try:
        return decode(model, body)
    except SandboxError as exc:
        raise observed_by_runner(exc) from None


def decode_answer(member: str, model: type[M], status: int, body: bytes) -> M:
    """A JSON answer to ``member``: its result, decoded strictly, when the status is 200.

    Raises:
        SandboxError: the result does not decode, or the error the answer carries (a typed one when it
            carries none); never anything else.
    """
    if status != 200:
        raise _unexpected(member, status, body)
    return _decoded(model, body)


def _unexpected(member: str, status: int, body: bytes) -> SandboxError:
    """A non-200 answer: the wire's error body, or a typed error saying it was not one."""
    try:
        return decode(WireError, body).to_exception()
    except SandboxError:
        pass
    try:
        doc = strict_json(body)  # bounded: a body nested too deeply is a ValueError here, not a RecursionError
    except ValueError:
        return observed_by_runner(
            SandboxProtocolViolation(f"{member}: HTTP {status} with a body that is not JSON", field="body")
        )
    code = doc.get("error", {}).get("code") if isinstance(doc, dict) and isinstance(doc.get("error"), dict) else None
    if isinstance(code, str) and code not in ERROR_CLASSES:
        message = str(doc["error"].get("message", ""))[:500]
        return SandboxProviderFailed(f"{member}: the service answered unknown error code {code[:64]!r}: {message}")
    return observed_by_runner(
        SandboxProtocolViolation(f"{member}: HTTP {status} with a body that is not a wire error", field="body")
    )


async def _closed_with_the_loop(pool: HttpPool) -> AsyncGenerator[None, None]:
    """Held open for the life of an event loop: asyncio closes it (and so the pool) as the loop shuts down."""
    try:
        yield
    finally:
        pool.close()


class RemoteProvider:
    """A provider service at ``url``, driven as a ``Provider``.

    Args:
        url: the service's base URL (``http://host:port`` or ``https://host:port``).
        credential: the credential issued at enrollment (``CHECKFU_PROVIDER_CREDENTIAL`` when omitted).
        window: the credit this side grants an open process's output, in bytes.
        ca_file: for an ``https://`` URL, a CA (PEM) to trust besides the system's (``CHECKFU_PROVIDER_CA``
            when omitted; ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` replace the system's).

    Raises:
        SandboxAdapterUnavailable: the CA file cannot be used (field ``ca_file``).
    """

    def __init__(
        self,
        url: str,
        credential: Credential | str | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        ca_file: str | Path | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        if credential is None:
            from checkfu.wire.credentials import read_credential  # noqa: PLC0415

            credential = read_credential()
        self._credential = Credential(credential) if isinstance(credential, str) else credential
        self.window = window
        self.tls: ssl.SSLContext | None = None
        """The client TLS context of an ``https://`` URL (``None`` for ``http://``)."""
        if self.url.startswith("https://"):
            try:
                self.tls = client_context(ca_file)
            except TlsError as exc:
                raise SandboxAdapterUnavailable(f"{self.url}: {exc}", field="ca_file") from None
        self._pool: HttpPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keeper: AsyncGenerator[None, None] | None = None

    def __repr__(self) -> str:
        return f"RemoteProvider({self.url!r})"

    @property
    def service_url(self) -> str:
        """Where this provider is served: the registry places its adapter at this endpoint, so what it allocates
        is journaled with where to reach it again."""
        return self.url

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": self._credential.header} if self._credential is not None else {}

    def _http(self) -> HttpPool:
        """The connection pool of this event loop (connections cannot outlive the loop they were made in)."""
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            try:
                pool = HttpPool(self.url, self.headers, tls=self.tls)
            except HttpError as exc:
                raise observed_by_runner(SandboxProviderFailed(f"{self.url!r}: {exc}", field="url")) from None
            keeper = _closed_with_the_loop(pool)
            with contextlib.suppress(StopIteration):  # started in this loop, which closes it as it shuts down
                keeper.asend(None).send(None)
            self._keeper = keeper
            self._pool, self._loop = pool, loop
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._pool = None

    # the calls --------------------------------------------------------------------------------

    async def _post(
        self,
        member: Member,
        result: type[M],
        body: bytes,
        *,
        extra: float = 0.0,
        headers: dict[str, str] | None = None,
    ) -> M:
        deadline = DEADLINES[member] + extra
        try:
            async with asyncio.timeout(deadline):
                answer = await self._http().request(
                    "POST",
                    f"/v1/{member}",
                    body,
                    {"content-type": "application/json", **(headers or {})},
                    retry=member in REPEATABLE,
                )
        except TimeoutError:
            raise observed_by_runner(
                SandboxProviderTimeout(f"{member}: no answer within {deadline:g} s", field=member)
            ) from None
        except HttpError as exc:
            raise self._transport(member, exc) from None
        if answer.status == UNAUTHENTICATED:
            raise self._refused(member, _unexpected(member, answer.status, answer.body))
        return decode_answer(member, result, answer.status, answer.body)

    def _refused(self, member: str, error: SandboxError) -> SandboxError:
        """A ``401`` answer: when it is the wire's ``SandboxUnauthenticated``, that error as the runner's own
        finding (the caller's credential was refused: no fault of the provider's, and retrying will not help),
        saying which credential to give; anything else as it is."""
        if not isinstance(error, SandboxUnauthenticated):
            return error
        where = f"the provider service at {self.url}"
        give = "give the service's credential with --credential-file FILE (- for standard input) or " + ENV
        cred = self._credential
        if cred is None:
            why = f"{where} refused the request: it carries no credential; {give}, or enroll the service "
            why += "(checkfu provider enroll), which issues one"
        elif cred.source.startswith(ENROLLED):
            why = f"{where} refused the credential issued when it was enrolled{cred.source[len(ENROLLED) :]}: "
            why += f"configure the service with that file (its --credential-file), or {give}"
        else:
            what = f"the credential from {cred.source}" if cred.source else "the credential this runner sent"
            why = f"{where} refused {what}: it is not one the service accepts; {give}"
        return observed_by_runner(SandboxUnauthenticated(f"{member}: {why}", field="credential", retryable=False))

    def _transport(self, member: str, exc: HttpError) -> SandboxError:
        if exc.tls is not None:
            return observed_by_runner(self._tls_failed(member, str(exc), verify=exc.tls == "verify"))
        if exc.connect:
            error: SandboxError = SandboxProviderFailed(
                f"{member}: cannot reach the provider service at {self.url}: {exc}"
            )
        else:
            error = SandboxProtocolViolation(f"{member}: {exc}", field="body")
        return observed_by_runner(error)

    def _tls_failed(self, member: str, why: str, *, verify: bool) -> SandboxError:
        """The service's TLS handshake failed: retrying will not help; trusting its CA may, when it was verification."""
        hint = f"; {TRUST_HINT}" if verify else ""
        return SandboxProviderFailed(
            f"{member}: no TLS connection to the provider service at {self.url}: {why}{hint}",
            field="tls",
            retryable=False,
        )

    async def _call(self, member: Member, request: Model, *, extra: float = 0.0) -> Any:
        _, result = MESSAGES[member]
        return await self._post(member, result, request.model_dump_json().encode(), extra=extra)

    async def describe(self) -> DescribeResult:
        return await self._post("describe", DescribeResult, b"{}")

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult:
        return await self._call("materialize", request)  # type: ignore[no-any-return]

    async def provision(self, request: ProvisionRequest) -> InstanceResult:
        return await self._call("provision", request)  # type: ignore[no-any-return]

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult:
        header = json.dumps(request.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":"))
        headers = {"content-type": "application/octet-stream", REQUEST_HEADER: header}
        return await self._post("writeFile", WriteFileResult, data, headers=headers)

    async def activate(self, request: ActivateRequest) -> InstanceResult:
        return await self._call("activate", request)  # type: ignore[no-any-return]

    async def exec(self, request: ExecRequest) -> ExecResult:
        return await self._call("exec", request, extra=request.timeout_ms / 1000)  # type: ignore[no-any-return]

    async def inspect(self, request: InspectRequest) -> InstanceResult:
        return await self._call("inspect", request)  # type: ignore[no-any-return]

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        return await self._call("release", request)  # type: ignore[no-any-return]

    async def compensate(self, request: CompensateRequest) -> CompensateResult:
        return await self._call("compensate", request)  # type: ignore[no-any-return]

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult:
        deadline = DEADLINES["readFiles"]
        body = request.model_dump_json().encode()
        try:
            async with asyncio.timeout(deadline):
                pool = self._http()
                async with pool.stream(
                    "POST", "/v1/readFiles", body, {"content-type": "application/json"}, retry=True
                ) as (status, headers, parts):
                    if status != 200:
                        buf = bytearray()
                        async for part in parts:
                            buf += part
                            if len(buf) > 1 << 20:
                                break
                        error = _unexpected("readFiles", status, bytes(buf))
                        raise self._refused("readFiles", error) if status == UNAUTHENTICATED else error
                    kind = headers.get("content-type", "").split(";")[0].strip()
                    if kind != FILES_MEDIA_TYPE:
                        raise observed_by_runner(
                            SandboxProtocolViolation(f"readFiles: answered as {kind!r}", field="content-type")
                        )
                    try:
                        return await read_files_body(parts, request.max_bytes)
                    except SandboxError as exc:
                        raise observed_by_runner(exc) from None
        except TimeoutError:
            raise observed_by_runner(
                SandboxProviderTimeout(f"readFiles: no answer within {deadline:g} s", field="readFiles")
            ) from None
        except HttpError as exc:
            raise self._transport("readFiles", exc) from None

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult:
        return await self._call("listAllocations", request)  # type: ignore[no-any-return]

    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        return await self._call("listDir", request)  # type: ignore[no-any-return]

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        return await self._call("snapshot", request)  # type: ignore[no-any-return]

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult:
        return await self._call("deleteSnapshot", request)  # type: ignore[no-any-return]

    async def clone(self, request: CloneRequest) -> CloneResult:
        return await self._call("clone", request)  # type: ignore[no-any-return]

    async def resume(self, request: ResumeRequest) -> ResumeResult:
        return await self._call("resume", request)  # type: ignore[no-any-return]

    async def open_process(self, request: OpenProcessRequest) -> RemoteProcess:
        process = RemoteProcess(self, request, operation_id=f"op-{uuid.uuid4().hex}", window=self.window)
        await process.start()
        return process

    def ws_url(self) -> str:
        if self.url.startswith("https://"):
            return "wss://" + self.url[len("https://") :] + "/v1/openProcess"
        if self.url.startswith("http://"):
            return "ws://" + self.url[len("http://") :] + "/v1/openProcess"
        raise SandboxProtocolViolation(f"openProcess: {self.url!r} is not an http(s) URL", field="url")


class RemoteProcess:
    """An open process across the wire: a ``ProcessStream`` whose output arrives within the granted credit.

    A reader task takes every frame as it comes (grants for stdin, output up to the window) and puts
    output in the inbox; ``events()`` hands it out and grants the credit back as it is consumed, so a
    grant acknowledges exactly the bytes the caller has taken, on the connection they came by.

    When the connection drops before the exit, the reader reattaches by operation id. It resumes from
    the bytes the caller has consumed: what arrived and was not yet taken is dropped and sent again
    (the service keeps every byte until it is acknowledged), so the new connection gets the whole
    window and no grant ever acknowledges bytes it did not carry. Stdin the service has not received
    is sent again, in order, before anything new; a ``kill`` is sent again. The reattached process
    must be the one that was started. When reattaching is impossible, the events end in a typed error,
    never in an exit the process did not have.

    Every connection of the operation carries a secret made here (``Checkfu-Operation-Secret``) and never
    shown: the service binds the operation to it at the start, so only this object can reattach to it,
    read its output, write its stdin or kill it, whoever else holds the credential and learns its id.
    """

    def __init__(
        self, provider: RemoteProvider, request: OpenProcessRequest, *, operation_id: str, window: int
    ) -> None:
        self.provider = provider
        self.request = request
        self.operation_id = operation_id
        self.window = window
        self._secret = secrets.token_urlsafe(32)
        """Binds the operation to this object at the service; sent on each connection, never logged."""
        self._start_sent = False
        """Whether a start frame went out: from then on a retry may only reattach, never start again."""
        self._ws: ClientConnection | None = None
        self._channel = ProcessChannel("client")
        self._started: ProcessStarted | None = None
        self._inbox: deque[tuple[int, ProcessEvent | SandboxError]] = deque()
        """What arrived and was not yet taken, each with the connection (generation) it came by."""
        self._generation = 0
        self._arrived = asyncio.Event()
        self._credit = asyncio.Event()
        self._consumed = {"out": 0, "err": 0}
        self._consumed_ends: list[Literal["out", "err"]] = []
        self._buffered = 0
        self._to_grant = 0
        self._iterating = False
        self._stdin_acked = 0
        self._stdin_sent = 0
        self._stdin_unacked = bytearray()
        self._stdin_ended = False
        self._kill_requested = False
        self._exited = False
        self._broken: SandboxError | None = None
        self._reader: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self.stdin_grant: int | None = None
        """The stdin credit the service granted at the start (its first ``start.window``)."""
        self.reattached = 0
        """How many times the stream reattached after its connection dropped."""

    @property
    def started(self) -> ProcessStarted:
        assert self._started is not None, "start() first"
        return self._started

    # connecting ---------------------------------------------------------------------------

    async def _connect(self, resume: ResumePoint | None) -> StartedFrame:
        """One connection and its start; the answer is the server's start.

        Raises:
            SandboxError: the server refused (its error frame), or the conversation broke.
            ConnectionClosed, OSError: the connection itself failed (the caller may retry).
        """
        url = self.provider.ws_url()
        ws = await connect(
            url,
            ssl=self.provider.tls if url.startswith("wss://") else None,
            additional_headers={**self.provider.headers, OPERATION_SECRET: self._secret},
            max_size=MAX_DATA + 64 + (64 << 20),
            max_queue=4,
            compression=None,  # output is already dense base64; deflating it cost more than the network
            open_timeout=DEADLINES["openProcess"],
            logger=WS_LOG,
        )
        channel = ProcessChannel("client")
        window = max(1, self.window - self._buffered)
        start = StartFrame(
            type="start", operation_id=self.operation_id, request=self.request, window=window, resume=resume
        )
        try:
            await ws.send(channel.send(start))
            self._start_sent = True
            frame = channel.receive(await ws.recv())
        except SandboxError as exc:
            await ws.close()
            raise observed_by_runner(exc) from None
        except BaseException:
            ws.transport.abort()
            raise
        if isinstance(frame, ErrorFrame):
            await ws.close()
            raise error_of(frame)
        if not isinstance(frame, StartedFrame):
            await ws.close()
            raise observed_by_runner(
                SandboxProtocolViolation("openProcess: the server did not answer start with start", field="type")
            )
        if frame.operation_id != self.operation_id:
            await ws.close()
            raise observed_by_runner(
                SandboxProtocolViolation(
                    f"openProcess: start answered for operation {frame.operation_id!r}, not {self.operation_id!r}",
                    field="operation_id",
                )
            )
        if self._started is not None and frame.started != self._started:
            await ws.close()
            raise observed_by_runner(
                SandboxProtocolViolation(
                    "openProcess: the reattached operation is not the process that was started", field="started"
                )
            )
        self._ws, self._channel = ws, channel
        return frame

    async def start(self) -> None:
        """Start the process; a lost reply is retried under the same operation id, which never starts it twice.

        Once a start has gone out, a retry only reattaches (it resumes from nothing consumed): a service that
        restarted meanwhile and forgot the operation answers ``SandboxNotFound`` instead of starting the
        process a second time.
        """
        last: BaseException | None = None
        for attempt in range(REATTACH_ATTEMPTS):
            try:
                async with asyncio.timeout(DEADLINES["openProcess"]):
                    frame = await self._connect(NOTHING_CONSUMED if self._start_sent else None)
                break
            except SandboxError:
                raise
            except TimeoutError:
                raise observed_by_runner(
                    SandboxProviderTimeout("openProcess: the service did not start the process in time")
                ) from None
            except ssl.SSLCertVerificationError as exc:  # it will not be verified on a retry either
                why = f"cannot verify its certificate: {exc.verify_message or exc.reason}"
                raise observed_by_runner(self.provider._tls_failed("openProcess", why, verify=True)) from None
            except ssl.SSLError as exc:
                why = f"the TLS handshake failed: {exc.reason or exc} (does it serve TLS?)"
                raise observed_by_runner(self.provider._tls_failed("openProcess", why, verify=False)) from None
            except InvalidStatus as exc:
                refused = _refused_upgrade(exc)
                if refused is not None:  # the service answered the upgrade with a wire error: it will again
                    raise refused from None
                last = exc
                await asyncio.sleep(REATTACH_PAUSE * (2**attempt))
            except (ConnectionClosed, OSError, InvalidHandshake, InvalidURI) as exc:
                last = exc
                await asyncio.sleep(REATTACH_PAUSE * (2**attempt))
        else:
            raise observed_by_runner(
                SandboxProtocolViolation(f"openProcess: cannot open the process stream: {last}", field="connection")
            )
        self._started = decode(ProcessStarted, frame.started.model_dump_json())
        self.stdin_grant = frame.window
        self._reader = asyncio.ensure_future(self._read())

    def interrupt(self) -> None:
        """Drop the current connection at once, as a network fault would; the stream reattaches by itself.

        For conformance and tests: what the service owes a client whose connection broke (the operation kept,
        the output after the resume point sent again, the stdin it lacks taken again) is checked this way.
        """
        self._abort()

    async def _reattach(self) -> bool:
        """Connect again and resume from what the caller consumed; false when the service cannot be reached.

        Raises:
            SandboxError: the service refused the reattach, or answered against the protocol.
        """
        for attempt in range(REATTACH_ATTEMPTS):
            await asyncio.sleep(REATTACH_PAUSE * (2**attempt))
            async with self._send_lock:  # nothing new goes out before what the service lacks
                # What arrived and was not taken is sent again: the new connection carries it.
                self._inbox.clear()
                self._generation += 1
                self._buffered = self._to_grant = 0
                resume = ResumePoint(
                    out=self._consumed["out"], err=self._consumed["err"], ended=tuple(self._consumed_ends)
                )
                try:
                    async with asyncio.timeout(DEADLINES["openProcess"]):
                        frame = await self._connect(resume)
                        await self._resend(frame.stdin)
                except (ConnectionClosed, OSError, InvalidHandshake, TimeoutError):
                    self._abort()
                    continue  # this connection failed too: try again, from the same point
            self._credit.set()
            self.reattached += 1
            return True
        return False

    # reading ------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                ws = self._ws
                assert ws is not None
                try:
                    message = await ws.recv()
                except ConnectionClosed:
                    if self._exited:
                        return
                    try:
                        reattached = await self._reattach()
                    except SandboxError as exc:  # the service refused the reattach, or its answer broke a rule
                        self._put(exc)
                        return
                    if not reattached:
                        lost = SandboxProtocolViolation(
                            "openProcess: the connection dropped and the process could not be reattached",
                            field="connection",
                        )
                        self._put(observed_by_runner(lost))
                        return
                    continue
                try:
                    frame = self._channel.receive(message)
                except SandboxError as exc:
                    self._put(observed_by_runner(exc))
                    return
                if isinstance(frame, WindowFrame):
                    self._stdin_acked += frame.bytes
                    del self._stdin_unacked[: frame.bytes]
                    self._credit.set()
                    continue
                if isinstance(frame, ErrorFrame):
                    self._put(error_of(frame))
                    return
                event = events_of(frame)
                if event is None:
                    continue
                if isinstance(event, ProcessOutput):
                    self._buffered += len(event.data)
                self._put(event)
                if isinstance(frame, ExitFrame):
                    self._exited = True
                    await self._close()  # the server forgets the operation once the client closes normally
                    return
        except SandboxError as exc:
            self._put(exc)
        except Exception as exc:
            self._put(
                observed_by_runner(
                    SandboxProtocolViolation(f"openProcess: the stream broke: {type(exc).__name__}: {exc}")
                )
            )
        finally:
            if not self._exited:
                self._abort()  # cancelled or broken: nothing more will be read on it
            self._credit.set()  # stdin waiting for credit learns the stream is over

    def _put(self, item: ProcessEvent | SandboxError) -> None:
        if isinstance(item, SandboxError):
            self._broken = item
        self._inbox.append((self._generation, item))
        self._arrived.set()

    def events(self) -> AsyncIterator[ProcessEvent]:
        """The process's events, then its exit, or a typed error. Iterate once.

        Raises:
            SandboxStateConflict: the events are already being consumed.
        """
        if self._iterating:
            raise SandboxStateConflict("openProcess: the events are already being consumed", field="events")
        self._iterating = True
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessEvent]:
        while True:
            while not self._inbox:
                self._arrived.clear()
                await self._arrived.wait()
            generation, item = self._inbox.popleft()
            if isinstance(item, SandboxError):
                raise item
            if isinstance(item, ProcessOutput):
                self._consumed[item.stream] += len(item.data)
            elif isinstance(item, ProcessStreamEnd):
                self._consumed_ends.append(item.stream)
            yield item
            if isinstance(item, ProcessOutput) and generation == self._generation:
                # Granted on the connection it came by; what came by an older one was resumed past.
                self._buffered -= len(item.data)
                self._to_grant += len(item.data)
                if self._to_grant >= min(self.window // 8, MAX_DATA) or not self._inbox:
                    n, self._to_grant = self._to_grant, 0
                    await self._grant(n, generation)
            if isinstance(item, ProcessExit):
                return

    # writing ------------------------------------------------------------------------------

    async def _send_now(self, frame: Any) -> None:
        """Send on the current connection; the caller holds the send lock."""
        ws = self._ws
        assert ws is not None
        await ws.send(self._channel.send(frame))

    async def _send_quietly(self, frame: Any) -> None:
        """A grant or a kill on a connection that may be gone (a reattach resends what matters)."""
        with contextlib.suppress(ConnectionClosed, SandboxError, OSError):
            async with self._send_lock:
                await self._send_now(frame)

    async def _grant(self, n: int, generation: int) -> None:
        """Grant ``n`` consumed bytes back, on the connection they came by: after a reattach the service has
        resumed past them, and a grant on the new connection would acknowledge bytes it has not delivered."""
        with contextlib.suppress(ConnectionClosed, SandboxError, OSError):
            async with self._send_lock:
                if generation == self._generation:
                    await self._send_now(WindowFrame(type="window", bytes=n))

    def _over(self) -> SandboxError | None:
        """Why no stdin can go to the process any more, if it cannot."""
        if self._exited:
            return SandboxStateConflict("stdin: the process has exited", field="stdin")
        if self._broken is not None or (self._reader is not None and self._reader.done()):
            why = self._broken.message if self._broken is not None else "the stream ended"
            return observed_by_runner(SandboxProtocolViolation(f"stdin: the process stream broke: {why}"))
        return None

    async def send_stdin(self, data: bytes) -> None:
        """Send ``data`` within the stdin credit; waits while the process is not reading.

        Raises:
            SandboxStateConflict: stdin was closed, or the process has exited.
            SandboxProtocolViolation: the stream broke and could not be reattached.
        """
        if self._stdin_ended:
            raise SandboxStateConflict("stdin: already closed", field="stdin")
        view = memoryview(data)
        while view:
            async with self._send_lock:
                over = self._over()
                if over is not None:
                    raise over
                credit = self._channel.credit
                if credit > 0:
                    piece = bytes(view[: min(len(view), credit, MAX_DATA)])
                    with contextlib.suppress(ConnectionClosed):  # the reattach sends it again
                        await self._send_now(Data("stdin", piece))
                    self._stdin_unacked += piece
                    self._stdin_sent += len(piece)
                    view = view[len(piece) :]
                    continue
                self._credit.clear()
            await self._credit.wait()

    async def _resend(self, server_has: int) -> None:
        """After a reattach: the stdin bytes the server never received, its end if it was sent, and a kill
        if one was asked for. The caller holds the send lock.

        What was sent and not acknowledged never exceeds a window, so it fits the server's fresh grant.
        """
        pending = bytes(self._stdin_unacked[max(0, server_has - self._stdin_acked) :])
        if len(pending) > self._channel.credit:
            raise observed_by_runner(
                SandboxProtocolViolation("openProcess: the stdin to resend is over the server's grant", field="stdin")
            )
        for at in range(0, len(pending), MAX_DATA):
            await self._send_now(Data("stdin", pending[at : at + MAX_DATA]))
        if self._stdin_ended:
            await self._send_now(StdinEndFrame(type="stdin_end"))
        if self._kill_requested:
            await self._send_now(KillFrame(type="kill"))

    async def close_stdin(self) -> None:
        if not self._stdin_ended:
            self._stdin_ended = True
            await self._send_quietly(StdinEndFrame(type="stdin_end"))

    async def resize(self, rows: int, cols: int) -> None:
        """Send the terminal's new size; quiet when the stream is over (a lost resize is only a stale size)."""
        if not self._exited:
            await self._send_quietly(ResizeFrame(type="resize", rows=rows, cols=cols))

    async def kill(self) -> None:
        """Ask the service to end the process; idempotent, quiet when the stream is already over, and sent
        again after a reattach when the connection was down."""
        if not self._exited:
            self._kill_requested = True
            await self._send_quietly(KillFrame(type="kill"))

    async def _close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close(code=1000)

    def _abort(self) -> None:
        """Drop the connection at once (the caller is being cancelled); the server keeps the operation."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.transport.abort()


def _refused_upgrade(exc: InvalidStatus) -> SandboxError | None:
    """The wire error a service answered an ``openProcess`` upgrade with (``501 SandboxOperationUnsupported`` from
    a service that does not serve it, a ``401``), or ``None`` when the answer carries none: a status alone
    (a proxy's ``502``, say) may pass, so the caller tries again."""
    response = exc.response
    try:
        return decode(WireError, bytes(response.body or b"")).to_exception()
    except SandboxError:
        return None


def create(url: str, credential_file: str | None = None, ca_file: str | None = None, **options: Any) -> RemoteProvider:
    """The adapters-file factory: ``factory = "checkfu.wire.client:create"`` with ``options = {url = ...}``
    (and ``credential_file``, and for an ``https://`` URL ``ca_file``).

    Raises:
        CredentialError: the credential file cannot be read.
        SandboxAdapterUnavailable: the CA file cannot be used.
    """
    from checkfu.wire.credentials import read_credential  # noqa: PLC0415

    if options:
        raise ValueError(f"unknown options of a remote provider: {', '.join(sorted(options))}")
    credential = read_credential(Path(credential_file) if credential_file else None)
    return RemoteProvider(url, credential, ca_file=ca_file)
