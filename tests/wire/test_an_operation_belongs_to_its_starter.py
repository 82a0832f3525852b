"""An ``openProcess`` operation belongs to the client that started it, not to every holder of the credential.

Client A starts ``cat`` through ``RemoteProvider``; client B holds the same credential and has learnt A's
operation id and request (from a log, say). B may neither reattach (which would take A's output and stdin
over), nor join the start while the provider is still starting it, nor start it again: each is answered
``SandboxNotFound`` in exactly the words an id never seen gets, and A's process runs on untouched. A client
that sends no secret at all (older than it) still starts a process, but no connection can reattach to it: an
operation bound to nobody belongs to nobody.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from test_process_wire import SlowToStart, collect, exit_of
from websockets.asyncio.client import connect
from wire_rig import Driven, Service

from checkfu.contract.errors import SandboxNotFound
from checkfu.contract.frames import ErrorFrame, ResumePoint, StartedFrame, StartFrame, parse
from checkfu.contract.members import OpenProcessRequest
from checkfu.testing import MemoryProvider, Requests
from checkfu.wire.client import NOTHING_CONSUMED, RemoteProcess
from checkfu.wire.credentials import OPERATION_SECRET

pytestmark = pytest.mark.anyio

WINDOW = 1 << 20


async def _start_as(
    service: Service, start: StartFrame, secret: str | None, *, close: bool = True
) -> tuple[ErrorFrame | StartedFrame, Any]:
    """One connection with the service's credential (and ``secret``, if any) that sends ``start``; its answer."""
    headers = {"authorization": f"Bearer {service.secret}"}
    if secret is not None:
        headers[OPERATION_SECRET] = secret
    ws = await connect(f"ws://127.0.0.1:{service.port}/v1/openProcess", additional_headers=headers)
    await ws.send(start.model_dump_json(exclude_none=True))
    frame = parse(await asyncio.wait_for(ws.recv(), 5), "server")
    assert isinstance(frame, ErrorFrame | StartedFrame), frame
    if close:
        await ws.close()
    return frame, ws


def _refused(frame: Any, op_id: str) -> str:
    assert isinstance(frame, ErrorFrame), frame
    assert (frame.error.code, frame.error.field) == ("SandboxNotFound", "operation_id")
    return frame.error.message.replace(op_id, "ID")


async def test_another_holder_of_the_credential_cannot_take_over_a_running_process(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    memory, driven = memory_wire
    inst = await driven.active()
    request = driven.process_request(inst, "cat")
    mine = await driven.remote.open_process(request)
    service = driven.service
    op = service.operations()[mine.operation_id]
    unknown = f"op-{secrets.token_hex(8)}"
    never_seen, _ = await _start_as(
        service,
        StartFrame(type="start", operation_id=unknown, request=request, window=WINDOW, resume=NOTHING_CONSUMED),
        None,
    )
    for secret in (None, secrets.token_urlsafe(32)):
        for resume in (NOTHING_CONSUMED, ResumePoint(out=0, err=0, ended=()), None):
            start = StartFrame(
                type="start", operation_id=mine.operation_id, request=request, window=WINDOW, resume=resume
            )
            frame, _ = await _start_as(service, start, secret)
            assert _refused(frame, mine.operation_id) == _refused(never_seen, unknown)  # nothing tells them apart
    # through the client too: another RemoteProvider with the same credential, given the id
    theirs = RemoteProcess(service.remote(), request, operation_id=mine.operation_id, window=WINDOW)
    with pytest.raises(SandboxNotFound):
        await theirs.start()
    assert op.epoch == 1, "nobody else attached to it"
    await mine.send_stdin(b"still mine")
    await mine.close_stdin()
    out, err, tail = await collect(mine)
    assert (out, err, exit_of(tail)) == (b"still mine", b"", 0)
    assert memory.calls.count("openProcess") == 1


async def test_a_start_still_waiting_on_the_provider_cannot_be_joined_by_another_client(
    serve: Callable[..., Service],
) -> None:
    memory = MemoryProvider()
    service = serve(SlowToStart(memory, 0.5))
    driven = Driven(service, service.remote(), Requests(memory.target))
    inst = await driven.active()
    request = driven.process_request(inst, "cat")
    mine = RemoteProcess(driven.remote, request, operation_id=f"op-{secrets.token_hex(8)}", window=WINDOW)
    starting = asyncio.ensure_future(mine.start())
    for _ in range(200):
        if mine.operation_id in service.app.state.starting:
            break
        await asyncio.sleep(0.005)
    assert mine.operation_id in service.app.state.starting
    for secret in (None, secrets.token_urlsafe(32)):
        start = StartFrame(type="start", operation_id=mine.operation_id, request=request, window=WINDOW)
        frame, _ = await _start_as(service, start, secret)
        _refused(frame, mine.operation_id)
    await asyncio.wait_for(starting, 10)
    await mine.close_stdin()
    out, _, tail = await collect(mine)
    assert (out, exit_of(tail)) == (b"", 0)
    assert memory.calls.count("openProcess") == 1
    await driven.release_all()


async def test_a_client_that_sends_no_secret_starts_but_no_one_can_reattach(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    """A client older than the secret: its process starts, but once its connection drops no one (whoever holds
    the credential, and whatever secret or none they send) can take it over."""
    memory, driven = memory_wire
    inst = await driven.active()
    request: OpenProcessRequest = driven.process_request(inst, "cat")
    op_id = f"op-{secrets.token_hex(8)}"
    first, ws = await _start_as(
        driven.service, StartFrame(type="start", operation_id=op_id, request=request, window=WINDOW), None, close=False
    )
    assert isinstance(first, StartedFrame)
    ws.transport.abort()  # dropped, not closed: the operation waits for a reattach
    resume = StartFrame(type="start", operation_id=op_id, request=request, window=WINDOW, resume=NOTHING_CONSUMED)
    for secret in (None, secrets.token_urlsafe(32)):
        again, _ = await _start_as(driven.service, resume, secret)
        _refused(again, op_id)
    assert memory.calls.count("openProcess") == 1


@pytest.mark.parametrize("secret", ["short", "x" * 129, "not base64url!" * 3])
async def test_a_malformed_secret_is_refused_naming_its_header(
    memory_wire: tuple[MemoryProvider, Driven], secret: str
) -> None:
    memory, driven = memory_wire
    inst = await driven.active()
    start = StartFrame(
        type="start", operation_id="op-malformed", request=driven.process_request(inst, "cat"), window=WINDOW
    )
    frame, _ = await _start_as(driven.service, start, secret)
    assert isinstance(frame, ErrorFrame)
    assert (frame.error.code, frame.error.field) == ("SandboxProtocolViolation", OPERATION_SECRET)
    assert memory.calls.count("openProcess") == 0
