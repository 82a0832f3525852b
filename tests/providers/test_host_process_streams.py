"""``openProcess`` on the host-process provider: streamed stdin and output, backpressure, kill."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_host_process import Kit, kit, needs_cgroups, pids_of

from checkfu.contract.errors import SandboxStateConflict
from checkfu.contract.members import OpenProcessRequest
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.contract.provider import ProcessStream
from checkfu.providers.host_process import procfs
from checkfu.providers.host_process.streams import HIGH_WATER

__all__ = ["kit"]


async def start(kit: Kit, call: dict[str, Any], *argv: str, **fields: Any) -> ProcessStream:
    return await kit.provider.open_process(OpenProcessRequest(**call, argv=list(argv), **fields))


async def collect(stream: ProcessStream) -> tuple[bytes, bytes, list[ProcessEvent]]:
    out, err, tail = bytearray(), bytearray(), []
    async for event in stream.events():
        if isinstance(event, ProcessOutput):
            (out if event.stream == "out" else err).extend(event.data)
        else:
            tail.append(event)
    return bytes(out), bytes(err), tail


def well_formed(tail: list[ProcessEvent]) -> int:
    """One end per stream, then exactly one exit, last; returns the exit code."""
    *ends, last = tail
    assert sorted(e.stream for e in ends if isinstance(e, ProcessStreamEnd)) == ["err", "out"]
    assert len(ends) == 2
    assert isinstance(last, ProcessExit)
    return last.exit_code


@pytest.mark.anyio
async def test_stdin_in_output_out(kit: Kit) -> None:
    call = await kit.active("ak-cat")
    stream = await start(kit, call, "sh", "-c", "cat; echo done >&2")
    assert (stream.started.allocation_key, stream.started.instance_id) == (call["allocation_key"], call["instance_id"])
    assert stream.started.process_id.startswith("p-")
    await stream.send_stdin(b"hello ")
    await stream.send_stdin(b"world")
    await stream.close_stdin()
    with pytest.raises(SandboxStateConflict):
        await stream.send_stdin(b"late")
    out, err, tail = await collect(stream)
    assert (out, err) == (b"hello world", b"done\n")
    assert well_formed(tail) == 0
    with pytest.raises(SandboxStateConflict):
        stream.events()


@pytest.mark.anyio
async def test_pulling_is_the_backpressure(kit: Kit) -> None:
    call = await kit.active("ak-bp")
    total = 8 * HIGH_WATER
    stream = await start(kit, call, "head", "-c", str(total), "/dev/zero")
    await asyncio.sleep(0.3)
    leader = int(stream.started.process_id.removeprefix("p-"))
    state = procfs.stat(leader)
    assert state is not None and state.running, "the writer finished although nobody read: output was not bounded"
    out, err, tail = await collect(stream)
    assert (len(out), err) == (total, b"")
    assert well_formed(tail) == 0


@pytest.mark.anyio
async def test_kill_ends_the_process_and_everything_it_started(kit: Kit) -> None:
    needs_cgroups(kit)
    call = await kit.active("ak-kill")
    stream = await start(kit, call, "sh", "-c", "setsid sleep 60 & echo $!; sleep 60")
    events = stream.events()
    first = await anext(events)
    assert isinstance(first, ProcessOutput)
    (pid,) = [int(p) for p in first.data.split()]
    start_time = procfs.start_time(pid)
    assert start_time is not None
    await stream.kill()
    await stream.kill()
    rest = [event async for event in events]
    assert well_formed([e for e in rest if not isinstance(e, ProcessOutput)]) == 137
    assert not procfs.is_alive(pid, start_time)


@pytest.mark.anyio
async def test_a_background_child_does_not_hold_the_stream_open(kit: Kit) -> None:
    call = await kit.active("ak-bgs")
    stream = await start(kit, call, "sh", "-c", "sleep 30 & echo $!")
    out, _, tail = await asyncio.wait_for(collect(stream), 10)
    assert well_formed(tail) == 0
    ((pid, start_time),) = pids_of(out)
    await kit.release(call)
    assert not procfs.is_alive(pid, start_time)


@pytest.mark.anyio
async def test_a_program_that_cannot_start_streams_its_reason(kit: Kit) -> None:
    call = await kit.active("ak-nx")
    stream = await start(kit, call, "checkfu-no-such-program")
    out, err, tail = await collect(stream)
    assert out == b""
    assert b"cannot start 'checkfu-no-such-program'" in err
    assert well_formed(tail) == 127
    with pytest.raises(SandboxStateConflict):
        await stream.send_stdin(b"x")


@pytest.mark.anyio
async def test_open_process_needs_an_active_instance(kit: Kit) -> None:
    call = await kit.provisioned("ak-prov")
    with pytest.raises(SandboxStateConflict):
        await start(kit, call, "true")


@pytest.mark.anyio
async def test_release_ends_an_open_process(kit: Kit) -> None:
    call = await kit.active("ak-rel")
    stream = await start(kit, call, "sleep", "60")
    await kit.release(call)
    _, _, tail = await asyncio.wait_for(collect(stream), 10)
    assert well_formed(tail) in (137, 143)


@pytest.mark.anyio
async def test_a_slow_reader_gets_every_byte_an_exited_process_wrote(kit: Kit) -> None:
    """The drain grace (50 ms here) bounds the wait for a pipe a background child holds open; it never drops
    output that already reached its end, however long the reader takes to pull it."""
    call = await kit.active("ak-slow-reader")
    stream = await start(kit, call, "head", "-c", "200000", "/dev/zero")
    await stream.close_stdin()
    await asyncio.sleep(0.5)  # the process exited long ago; nothing has been read yet
    out, _, tail = await collect(stream)
    assert len(out) == 200000
    assert well_formed(tail) == 0
