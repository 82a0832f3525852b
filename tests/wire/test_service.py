"""The provider service (``create_app``) over real loopback sockets: credentials, the OpenAPI
document, strict and typed refusals, every vocabulary error under its status, and the two
members that carry raw bytes.

Requests are made with the standard library's ``http.client`` (the service runs in a thread
of its own), so the server is judged by a client that is not ours.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import io
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from openapi_spec_validator import validate as validate_openapi
from websockets.asyncio.client import connect
from wire_rig import Driven, Service, peer

from checkfu.contract.checks import sha256_digest
from checkfu.contract.codec import decode
from checkfu.contract.envelope import MEMBERS
from checkfu.contract.errors import (
    ERROR_CLASSES,
    SandboxCapabilityUnavailable,
    SandboxError,
    SandboxProviderFailed,
    SandboxUnauthenticated,
    Unmet,
)
from checkfu.contract.frames import ErrorFrame, parse
from checkfu.contract.members import (
    ActivateRequest,
    InspectRequest,
    ReadFilesRequest,
    WriteFileRequest,
)
from checkfu.contract.mounts import MountFile, MountPlan
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.core.driver import Limits
from checkfu.core.journal import Journal, metadata, sqlite_url
from checkfu.core.mounts import DirectorySource, MountSpec, resolve_mount
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.testing import RAISING, MemoryProvider, Misbehaving, Requests, crash, memory_profile
from checkfu.wire.client import RemoteProvider
from checkfu.wire.credentials import OPERATION_SECRET
from checkfu.wire.errors import STATUS, WireError, status_of
from checkfu.wire.files import FILES_MEDIA_TYPE, REQUEST_HEADER
from enrolled import enroll_adapters

HTTP_MEMBERS = [m for m in MEMBERS if m != "openProcess"]


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[MemoryProvider, Misbehaving, Service]]:
    """One service for the tests that send requests it refuses, or make it raise: started once, it is honest
    again at the start of every test that uses it."""
    memory = MemoryProvider()
    misbehaving = Misbehaving(memory)
    service = Service(misbehaving)
    service.start()
    yield memory, misbehaving, service
    service.close()


@pytest.fixture
def memory_service(shared: tuple[MemoryProvider, Misbehaving, Service]) -> tuple[MemoryProvider, Service]:
    memory, misbehaving, service = shared
    misbehaving.rules.clear()
    memory.calls.clear()
    return memory, service


@pytest.fixture
def raising_service(shared: tuple[MemoryProvider, Misbehaving, Service]) -> tuple[Misbehaving, Service]:
    _, misbehaving, service = shared
    misbehaving.rules.clear()
    return misbehaving, service


def post(
    service: Service,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    method: str = "POST",
    credential: str | None = "",
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request with the standard library; ``credential=""`` sends the service's own."""
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    try:
        sent = {"content-type": "application/json", **(headers or {})}
        if credential == "":
            sent["authorization"] = f"Bearer {service.secret}"
        elif credential is not None:
            sent["authorization"] = credential
        conn.request(method, path, body=body, headers=sent)
        answer = conn.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        conn.close()


def typed(status: int, headers: http.client.HTTPMessage, body: bytes) -> WireError:
    """The answer is a typed wire error under a 4xx or 5xx status, with no traceback."""
    assert 400 <= status < 600, status
    assert headers.get_content_type() == "application/json", headers
    assert b"Traceback" not in body and b'File "' not in body
    return decode(WireError, body)


def valid_body(member: str, memory: MemoryProvider) -> bytes:
    """A well-formed request of ``member`` for an instance that does not exist."""
    r = Requests(memory.target)
    if member == "describe":
        return b"{}"
    if member == "materialize":
        return r.materialize().model_dump_json().encode()
    if member == "provision":
        return r.provision("ak-x", "sha256:" + "0" * 64).model_dump_json().encode()
    if member == "compensate":
        return json.dumps({**_call(r), "allocation_key": "ak-x", "runner_tag": "tag"}).encode()
    if member == "listAllocations":
        return json.dumps({**_call(r), "runner_tag": "tag"}).encode()
    return b""  # the rest are refused before their body matters


def _call(r: Requests) -> dict[str, Any]:
    good = json.loads(InspectRequest(**r.call(), allocation_key="ak-x", instance_id="i-x").model_dump_json())
    return {"target": good["target"], "lease": good["lease"]}


# Credentials ------------------------------------------------------------------------------


WRONG = ["missing", "wrong", "not-bearer", "empty-bearer", "prefix-of-the-secret", "secret-with-a-tail"]


def _authorization(kind: str, secret: str) -> str | None:
    return {
        "missing": None,
        "wrong": "Bearer not-the-credential",
        "not-bearer": f"Basic {secret}",
        "empty-bearer": "Bearer ",
        "prefix-of-the-secret": f"Bearer {secret[:-1]}",
        "secret-with-a-tail": f"Bearer {secret}x",
    }[kind]


@pytest.mark.parametrize("member", HTTP_MEMBERS)
def test_every_member_refuses_a_request_without_the_credential(
    memory_service: tuple[MemoryProvider, Service], member: str
) -> None:
    memory, service = memory_service
    for kind in WRONG:
        status, headers, body = post(
            service, f"/v1/{member}", valid_body(member, memory), credential=_authorization(kind, service.secret)
        )
        assert status == 401, (kind, status, body)
        error = typed(status, headers, body).error
        assert error.code == "SandboxUnauthenticated" and error.field == "authorization"
        assert service.secret.encode() not in body and service.secret not in str(headers)
    assert memory.calls == []  # the provider was never asked


def test_any_v1_path_is_refused_without_the_credential_and_typed_with_it(
    memory_service: tuple[MemoryProvider, Service],
) -> None:
    _, service = memory_service
    for path, method in [("/v1/noSuchMember", "POST"), ("/v1/describe", "GET"), ("/v1/", "POST"), ("/v1/a/b", "PUT")]:
        status, headers, body = post(service, path, b"{}", method=method, credential=None)
        assert status == 401 and typed(status, headers, body).error.code == "SandboxUnauthenticated", path
    status, headers, body = post(service, "/v1/noSuchMember", b"{}")
    assert status == 501 and typed(status, headers, body).error.code == "SandboxOperationUnsupported"
    status, headers, body = post(service, "/v1/openProcess", b"{}")  # a WebSocket: POST is not its method
    assert status == 405 and typed(status, headers, body).error.code == "SandboxProtocolViolation"
    assert headers["allow"] == "GET"
    status, headers, body = post(service, "/v1/openProcess", method="GET")  # GET, but without the Upgrade
    assert status == 400 and typed(status, headers, body).error.code == "SandboxProtocolViolation"
    status, headers, body = post(service, "/v1/describe", method="GET")
    assert status == 405 and typed(status, headers, body).error.code == "SandboxProtocolViolation"
    assert headers["allow"] == "POST"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", WRONG)
async def test_open_process_refuses_a_connection_without_the_credential(
    memory_service: tuple[MemoryProvider, Service], kind: str
) -> None:
    memory, service = memory_service
    authorization = _authorization(kind, service.secret)
    headers = {"authorization": authorization} if authorization is not None else {}
    async with connect(f"ws://127.0.0.1:{service.port}/v1/openProcess", additional_headers=headers) as ws:
        # Not even a start is read before the credential is checked.
        message = await asyncio.wait_for(ws.recv(), 10)
        frame = parse(message, "server")
        assert isinstance(frame, ErrorFrame)
        assert frame.error.code == "SandboxUnauthenticated" and frame.error.field == "authorization"
        assert service.secret not in str(message)
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert memory.calls == []


SECRET_LOGGERS = ["", "uvicorn", "uvicorn.error", "uvicorn.access", "websockets", "checkfu"]


@pytest.fixture
def every_log_line() -> Iterator[io.StringIO]:
    """Every log record of the process at DEBUG, whichever logger it goes to."""
    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    saved = [(name, logging.getLogger(name).level) for name in SECRET_LOGGERS]
    for name in SECRET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
        logging.getLogger(name).addHandler(handler)
    try:
        yield sink
    finally:
        for name, level in saved:
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).removeHandler(handler)


@pytest.mark.anyio
async def test_the_credential_is_never_logged_answered_or_journaled(
    serve: Callable[..., Service],
    tmp_path: Path,
    every_log_line: io.StringIO,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A whole Run through the runner, over the wire, with every logger at DEBUG, plus refused calls."""
    memory = MemoryProvider()
    misbehaving = Misbehaving(memory)
    service = serve(misbehaving)
    for name in SECRET_LOGGERS:  # starting uvicorn reconfigured its loggers: make them all talk again
        logging.getLogger(name).setLevel(logging.DEBUG)
    remote = service.remote()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    registry = Registry()
    registry.add(Adapter(envelope=memory.envelope, provider=remote, source=f"remote {service.url}"))
    enroll_adapters(journal, registry)
    runner = Runner(registry, journal, runner_tag="wire-secret-test", limits=Limits())
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README").write_bytes(b"hello\n")
    platform = memory.envelope.platforms[0]
    attempt = runner.start(memory.target, memory_profile("durable"), platform=platform, mount_count=1)
    session = attempt.session
    mount = resolve_mount(MountSpec(DirectorySource(workspace), "/ws"))
    mat = await session.materialize(memory_profile("durable"), platform)
    inst = await session.provision(memory_profile("durable"), platform, mat.image, [mount])
    await session.stage(inst, [mount])
    await session.activate(inst)
    assert (await session.exec(inst, ["cat", "/ws/README"], timeout=5)).stdout == b"hello\n"
    proc = await session.open_process(inst, ["cat"])
    await proc.send_stdin(b"ping")
    await proc.close_stdin()
    outputs = [e async for e in proc.events() if isinstance(e, ProcessOutput)]
    assert b"".join(e.data for e in outputs) == b"ping"
    assert (await session.read_files(inst, ["/ws/README"])).files[0].data == b"hello\n"
    snap = await session.snapshot(inst)
    await session.delete_snapshot(snap)
    misbehaving.set("inspect", crash)  # an error travels back, and is journaled
    with pytest.raises(SandboxProviderFailed):
        await session.inspect(inst)
    await session.release_all()
    runner.finish(attempt, status="succeeded", exit_code=0)
    # A second client with a wrong credential is refused; its refusal carries no credential either.
    stranger = RemoteProvider(service.url, "a-wrong-credential")
    with pytest.raises(SandboxUnauthenticated):
        await stranger.describe()
    await stranger.aclose()
    await remote.aclose()

    dumped: list[str] = []
    with journal.tx() as tx:
        for table in metadata.sorted_tables:
            for row in tx.execute(sa.select(table)):
                dumped.append(repr(tuple(row)))
    journal.close()
    raw_db = (tmp_path / "journal.sqlite").read_bytes()
    assert len(dumped) > 10 and any("SandboxProviderFailed" in line for line in dumped)
    out, err = capfd.readouterr()
    logs = every_log_line.getvalue()
    assert "authorization" in logs.lower(), "the DEBUG logs must cover the handshakes for this test to mean anything"
    operation_lines = [line for line in logs.splitlines() if OPERATION_SECRET.lower() in line.lower()]
    assert operation_lines, "the openProcess handshakes, with the operation's secret, are in the logs"
    assert all(line.rstrip().endswith("<credential>") for line in operation_lines), operation_lines
    for text, where in [("\n".join(dumped), "journal"), (logs, "log records"), (out + err, "stdout/stderr")]:
        assert service.secret not in text, where
    assert service.secret.encode() not in raw_db
    assert remote.__repr__().find(service.secret) < 0 and service.secret not in str(vars(remote).get("_credential"))


# The OpenAPI document ---------------------------------------------------------------------------


def test_openapi_is_a_valid_3_1_document_covering_every_member(memory_service: tuple[MemoryProvider, Service]) -> None:
    _, service = memory_service
    status, headers, body = post(service, "/openapi.json", method="GET", credential=None)
    assert status == 200 and headers.get_content_type() == "application/json"
    document = json.loads(body)
    assert document["openapi"].startswith("3.1")
    validate_openapi(document)
    assert {f"/v1/{m}" for m in MEMBERS} <= set(document["paths"])
    assert document["paths"]["/v1/openProcess"].keys() == {"get"}
    for member in HTTP_MEMBERS:
        operation = document["paths"][f"/v1/{member}"]["post"]
        assert operation["operationId"] == member and operation["security"] == [{"credential": []}]
        assert {"200", "401"} <= set(operation["responses"])


# Malformed requests ------------------------------------------------------------------------------


def _inspect_body(memory: MemoryProvider) -> dict[str, Any]:
    r = Requests(memory.target)
    return json.loads(InspectRequest(**r.call(), allocation_key="ak-x", instance_id="i-x").model_dump_json())


MALFORMED: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "not-json": lambda good: b"this is not json",
    "empty": lambda good: b"",
    "a-json-array": lambda good: b"[]",
    "a-json-string": lambda good: b'"inspect"',
    "unknown-field": lambda good: json.dumps({**good, "surprise": 1}).encode(),
    "missing-field": lambda good: json.dumps({k: v for k, v in good.items() if k != "instance_id"}).encode(),
    "wrong-type": lambda good: json.dumps({**good, "instance_id": 12}).encode(),
    "wrong-nested-type": lambda good: json.dumps({**good, "lease": {**good["lease"], "lease_epoch": "1"}}).encode(),
    "float-for-int": lambda good: json.dumps({**good, "lease": {**good["lease"], "lease_epoch": 1.0}}).encode(),
    "duplicate-key": lambda good: json.dumps(good)[:-1].encode() + b', "instance_id": "i-y"}',
    "nan": lambda good: json.dumps({**good, "lease": {**good["lease"], "lease_epoch": float("nan")}}).encode(),
    "huge-int": lambda good: json.dumps({**good, "lease": {**good["lease"], "lease_epoch": 1 << 80}}).encode(),
    "not-utf8": lambda good: b'{"instance_id": "\xff\xfe"}',
    "lone-surrogate": lambda good: json.dumps({**good, "instance_id": "\ud800"}).encode(),
    "deep-nesting": lambda good: b"[" * 100_000 + b"]" * 100_000,
    "nul-in-id": lambda good: json.dumps({**good, "instance_id": "i\u0000x"}).encode(),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_body_is_a_typed_4xx(memory_service: tuple[MemoryProvider, Service], kind: str) -> None:
    memory, service = memory_service
    status, headers, body = post(service, "/v1/inspect", MALFORMED[kind](_inspect_body(memory)))
    assert 400 <= status < 500, (status, body)
    assert typed(status, headers, body).error.code in ERROR_CLASSES
    assert "inspect" not in memory.calls


@pytest.mark.parametrize("member", HTTP_MEMBERS)
def test_every_member_refuses_a_body_that_is_not_json(
    memory_service: tuple[MemoryProvider, Service], member: str
) -> None:
    memory, service = memory_service
    headers = {REQUEST_HEADER: "not json"} if member == "writeFile" else {}
    status, answer, body = post(service, f"/v1/{member}", b"\x00not json", headers)
    assert 400 <= status < 500, (member, status, body)
    typed(status, answer, body)
    assert memory.calls == []


def test_describe_refuses_a_body(memory_service: tuple[MemoryProvider, Service]) -> None:
    _, service = memory_service
    status, headers, body = post(service, "/v1/describe", b'{"please": "describe"}')
    assert status == 400 and typed(status, headers, body).error.code == "SandboxProtocolViolation"
    for empty in (b"", b"{}", b" { } "):
        assert post(service, "/v1/describe", empty)[0] == 200, empty


def test_a_body_declared_over_the_limit_is_refused_unread(memory_service: tuple[MemoryProvider, Service]) -> None:
    memory, service = memory_service
    with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/inspect HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + service.secret.encode() + b"\r\ncontent-length: 67108865\r\n\r\n{"
        )
        answer = _read_answer(sock)
    status, _, body = answer
    assert status == 400 and decode(WireError, body).error.code == "SandboxProtocolViolation"
    assert memory.calls == []


def test_a_chunked_body_over_the_limit_is_refused(memory_service: tuple[MemoryProvider, Service]) -> None:
    memory, service = memory_service
    chunk = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/inspect HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + service.secret.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        try:
            for _ in range(70):  # 70 MiB: past the 64 MiB any message may have
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the service answered and closed before taking it all
        status, _, body = _read_answer(sock)
    assert status == 400 and decode(WireError, body).error.code == "SandboxProtocolViolation"
    assert memory.calls == []


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"the connection closed before an answer: {data!r}"
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        part = sock.recv(65536)
        assert part
        body += part
    return int(lines[0].split()[1]), headers, body


# Every vocabulary error, under its status -----------------------------------------------------------


def _raised(code: str) -> SandboxError:
    cls = ERROR_CLASSES[code]
    if cls is SandboxCapabilityUnavailable:
        return SandboxCapabilityUnavailable([Unmet("profile", "describe: raised on purpose")])
    return cls("describe: raised on purpose", field="on_purpose")


@pytest.mark.anyio
@pytest.mark.parametrize("code", sorted(ERROR_CLASSES))
async def test_each_vocabulary_error_travels_under_its_status(
    raising_service: tuple[Misbehaving, Service], code: str
) -> None:
    misbehaving, service = raising_service
    misbehaving.set("describe", RAISING[code])
    status, headers, body = await asyncio.to_thread(post, service, "/v1/describe", b"{}")
    sent = _raised(code)
    expected = STATUS[code] if not (STATUS[code] == 500 and sent.retryable) else 503
    assert status == expected == status_of(sent)
    error = typed(status, headers, body).error
    assert (error.code, error.retryable) == (code, sent.retryable)
    assert error.field == ("profile" if code == "SandboxCapabilityUnavailable" else "on_purpose")
    # And the client rebuilds exactly that class, by table.
    remote = service.remote()
    with pytest.raises(SandboxError) as caught:
        await remote.describe()
    await remote.aclose()
    assert type(caught.value) is ERROR_CLASSES[code]
    if code == "SandboxUnauthenticated":
        # A 401 refuses the caller's credential: the client says so itself, naming which credential to give,
        # so the runner reports it as it is rather than as the provider failing.
        assert caught.value.observed and caught.value.field == "credential" and not caught.value.retryable
        assert "--credential-file" in caught.value.message
        return
    assert (caught.value.field, caught.value.retryable) == (error.field, error.retryable)
    assert not caught.value.observed  # the provider reported it; the client found nothing itself


def test_a_foreign_exception_is_provider_failed_with_no_traceback(
    raising_service: tuple[Misbehaving, Service],
) -> None:
    misbehaving, service = raising_service
    misbehaving.set("describe", crash)
    status, headers, body = post(service, "/v1/describe", b"{}")
    error = typed(status, headers, body).error
    assert status == 503 and error.code == "SandboxProviderFailed" and error.retryable
    assert "RuntimeError" in error.message


# writeFile and readFiles carry raw bytes ------------------------------------------------------------


@pytest.mark.anyio
async def test_write_file_sends_the_bytes_raw_and_read_files_streams_them(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    _, driven = memory_wire
    data = os.urandom(3 << 20) + b"\x00\r\n\r\n" + bytes(range(256))
    digest = sha256_digest(data)
    r = driven.requests
    driven.image = (await driven.remote.materialize(r.materialize())).image
    plan = MountPlan(target="/ws", files=(MountFile(path="blob.bin", size=len(data), digest=digest),))
    inst = await driven.remote.provision(r.provision("ak-bytes", driven.image, [plan]))
    driven.instances.append(inst)

    seen = bytearray()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", driven.service.port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bool) -> None:
            while chunk := await src.read(1 << 16):
                if keep:
                    seen.extend(chunk)
                dst.write(chunk)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False), return_exceptions=True)
        finally:
            up_writer.transport.abort()

    async with peer(relay) as proxy:
        through = RemoteProvider(proxy.url, driven.service.secret)
        request = WriteFileRequest(**r.on(inst), path="/ws/blob.bin", size=len(data), digest=digest)
        written = await through.write_file(request, data)
        await through.aclose()
    assert (written.size, written.digest) == (len(data), digest)
    head, _, body = bytes(seen).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").lower().split("\r\n")
    assert lines[0].startswith("post /v1/writefile ")
    assert f"content-length: {len(data)}" in lines
    assert body == data  # the file's bytes, exactly, as the body: no base64, no JSON around them
    assert base64.b64encode(data[:64]) not in bytes(seen)
    assert any(line.startswith(REQUEST_HEADER.lower() + ":") for line in lines)

    await driven.remote.activate(ActivateRequest(**r.on(inst)))
    status, headers, streamed = await asyncio.to_thread(
        post,
        driven.service,
        "/v1/readFiles",
        ReadFilesRequest(**r.on(inst), paths=("/ws/blob.bin",), max_bytes=64 << 20).model_dump_json().encode(),
    )
    assert status == 200 and headers.get_content_type() == FILES_MEDIA_TYPE
    assert headers.get("content-length") is None  # streamed, not buffered into one sized body
    first, _, rest = streamed.partition(b"\n")
    assert json.loads(first)["files"][0]["size"] == len(data) and rest == data
    result = await driven.remote.read_files(ReadFilesRequest(**r.on(inst), paths=("/ws/blob.bin",), max_bytes=8 << 20))
    assert result.files[0].data == data and result.files[0].digest == digest
    assert hashlib.sha256(result.files[0].data).hexdigest() == digest.removeprefix("sha256:")


def test_write_file_refusals_are_typed(memory_service: tuple[MemoryProvider, Service]) -> None:
    memory, service = memory_service
    r = Requests(memory.target)
    good = WriteFileRequest(
        **r.call(), allocation_key="ak-x", instance_id="i-x", path="/ws/f", size=4, digest=sha256_digest(b"four")
    ).model_dump_json()
    cases = [
        ({}, b"four", 400),  # no request header
        ({REQUEST_HEADER: "{"}, b"four", 400),
        ({REQUEST_HEADER: good.replace('"size":4', '"size":4,"size":5')}, b"four", 400),
        ({REQUEST_HEADER: good}, b"four and far more than four", 400),  # over the declared size
    ]
    for headers, body, expected in cases:
        sent = {"content-type": "application/octet-stream", **headers}
        status, answer, raw = post(service, "/v1/writeFile", body, sent)
        assert status == expected, (headers, status, raw)
        typed(status, answer, raw)
    # A well-formed one reaches the provider, which refuses the unknown instance.
    status, answer, raw = post(service, "/v1/writeFile", b"four", {REQUEST_HEADER: good})
    assert status == 404 and typed(status, answer, raw).error.code == "SandboxNotFound"


@pytest.mark.anyio
async def test_an_open_process_over_the_wire_still_gives_the_exit(memory_wire: tuple[MemoryProvider, Driven]) -> None:
    """A smoke test of the fixtures the other files build on."""
    _, driven = memory_wire
    inst = await driven.active()
    proc = await driven.remote.open_process(driven.process_request(inst, "echo", "hi"))
    events = [e async for e in proc.events()]
    assert isinstance(events[-1], ProcessExit) and events[-1].exit_code == 0
