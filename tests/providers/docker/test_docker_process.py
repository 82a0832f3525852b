"""openProcess (the exec attach stream as the contract's events), listAllocations, and the stream decoder."""

from __future__ import annotations

import asyncio
import struct

import pytest
from docker_kit import LEASE, Box, Kit

from checkfu.contract.errors import SandboxProviderFailed, SandboxStateConflict
from checkfu.contract.members import ListAllocationsRequest, OpenProcessRequest
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.providers.docker.process import Capture, FrameDecoder, running_pid

pytestmark = [pytest.mark.docker]


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def test_decoder_splits_frames_across_any_chunking() -> None:
    wire = frame(1, b"hello") + frame(2, b"") + frame(2, b"err") + frame(1, b"x" * 70000)
    for size in (1, 7, 8, 9, 4096, len(wire)):
        decoder = FrameDecoder()
        frames = []
        for i in range(0, len(wire), size):
            frames += decoder.feed(wire[i : i + size])
        assert frames == [(1, b"hello"), (2, b""), (2, b"err"), (1, b"x" * 70000)]
        assert decoder.pending == 0


def test_capture_keeps_the_cap_and_counts_the_rest() -> None:
    c = Capture(5)
    for chunk in (b"abc", b"def", b"ghi"):
        c.add(chunk)
    assert (bytes(c.data), c.dropped, c.truncated) == (b"abcde", 4, True)


async def collect(events: object) -> list[ProcessEvent]:
    return [e async for e in events]  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_open_process_streams_stdin_stdout_stderr_and_exit(kit: Kit) -> None:
    box = await kit.up("proc")
    try:
        proc = await kit.provider.open_process(
            OpenProcessRequest(
                **box.call, argv=("sh", "-c", "while read l; do echo out:$l; echo err:$l >&2; done; exit 7")
            )
        )
        assert proc.started.instance_id == box.instance_id and proc.started.allocation_key == box.key
        await proc.send_stdin(b"one\n")
        await proc.send_stdin(b"two\n")
        await proc.close_stdin()
        with pytest.raises(SandboxStateConflict):
            await proc.send_stdin(b"late\n")
        events = await collect(proc.events())
        out = b"".join(e.data for e in events if isinstance(e, ProcessOutput) and e.stream == "out")
        err = b"".join(e.data for e in events if isinstance(e, ProcessOutput) and e.stream == "err")
        assert (out, err) == (b"out:one\nout:two\n", b"err:one\nerr:two\n")
        ends = [e.stream for e in events if isinstance(e, ProcessStreamEnd)]
        assert sorted(ends) == ["err", "out"] and events[-1] == ProcessExit(exit_code=7)
        assert all(not isinstance(e, ProcessOutput) for e in events[events.index(ProcessStreamEnd(stream="out")) :])
    finally:
        await box.release()


@pytest.mark.anyio
async def test_open_process_kill_ends_the_group(kit: Kit) -> None:
    box = await kit.up("killed")
    try:
        proc = await kit.provider.open_process(
            OpenProcessRequest(**box.call, argv=("sh", "-c", "echo started; sleep 60 & sleep 61; echo never"))
        )
        events = proc.events()
        first = await anext(events)  # type: ignore[call-overload]
        assert first == ProcessOutput(stream="out", data=b"started\n")
        await proc.kill()
        rest = [e async for e in events]  # type: ignore[attr-defined]
        assert rest[-1] == ProcessExit(exit_code=137)
        await proc.kill()
        assert (await box.sh("ps -o args | grep -c '[s]leep 6' || true")).stdout.strip() == b"0"
    finally:
        await box.release()


class Inspections:
    """exec_inspect answers in order, the last one repeated: the engine's view of one exec over time."""

    def __init__(self, *answers: dict[str, object]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def exec_inspect(self, exec_id: str) -> dict[str, object]:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_running_exec_whose_pid_is_not_yet_recorded_is_waited_for_never_taken_as_ended() -> None:
    api = Inspections({"Running": True, "Pid": 0}, {"Running": True, "Pid": 0}, {"Running": True, "Pid": 4242})
    assert running_pid(api, "e" * 64) == 4242 and api.calls == 3
    assert running_pid(Inspections({"Running": False, "Pid": 0}), "e" * 64) is None
    with pytest.raises(SandboxProviderFailed, match="running with no pid"):
        running_pid(Inspections({"Running": True, "Pid": 0}), "e" * 64, limit=0.05)


@pytest.mark.anyio
async def test_a_kill_right_after_the_first_output_always_lands(kit: Kit) -> None:
    """The engine records an exec's pid a moment after its output starts; a kill in that moment still ends it."""
    box = await kit.up("kill-early")
    try:
        for _ in range(12):
            proc = await kit.provider.open_process(
                OpenProcessRequest(**box.call, argv=("sh", "-c", "echo started; sleep 30"))
            )
            events = proc.events()
            assert await anext(events) == ProcessOutput(stream="out", data=b"started\n")  # type: ignore[call-overload]
            await proc.kill()
            rest = await asyncio.wait_for(collect(events), 10)  # type: ignore[arg-type]
            assert rest[-1] == ProcessExit(exit_code=137)
    finally:
        await box.release()


@pytest.mark.anyio
async def test_open_process_needs_an_active_instance(kit: Kit) -> None:
    key, inst = await kit.provision("notyet")
    box = Box(kit, key, inst.instance_id)
    try:
        with pytest.raises(SandboxStateConflict):
            await kit.provider.open_process(OpenProcessRequest(**box.call, argv=("true",)))
    finally:
        await box.release()


@pytest.mark.anyio
async def test_list_allocations_enumerates_by_runner_tag(kit: Kit) -> None:
    p = kit.provider
    box = await kit.up("listed", files={"/workspace/f": b"x"})
    half_key, half = await kit.provision("listed-half", mounts=())
    try:
        listing = await p.list_allocations(
            ListAllocationsRequest(target=kit.target, lease=LEASE, runner_tag=kit.runner_tag)
        )
        assert listing.runner_tag == kit.runner_tag
        mine = {(a.allocation_key, a.kind) for a in listing.allocations}
        assert (box.key, "instance") in mine and (half_key, "instance") in mine and (box.key, "volume") in mine
        assert sum(1 for a in listing.allocations if a.allocation_key == box.key and a.kind == "volume") == 4
        other = await p.list_allocations(
            ListAllocationsRequest(target=kit.target, lease=LEASE, runner_tag="nobody-here")
        )
        assert other.allocations == ()
    finally:
        await asyncio.gather(box.release(), Box(kit, half_key, half.instance_id).release())
    listing = await p.list_allocations(
        ListAllocationsRequest(target=kit.target, lease=LEASE, runner_tag=kit.runner_tag)
    )
    assert not {a for a in listing.allocations if a.allocation_key in (box.key, half_key)}


@pytest.mark.anyio
async def test_a_process_that_closes_its_output_early_gets_its_real_exit(kit: Kit) -> None:
    """Output ends before the process does: the exit reported is the one it really has, never a made-up one."""
    box = await kit.up("early-eof")
    script = "exec >&- 2>&-; sleep 1.5; exit 5"
    try:
        proc = await kit.provider.open_process(OpenProcessRequest(**box.call, argv=("sh", "-c", script)))
        await proc.close_stdin()
        events = [e async for e in proc.events()]
        assert isinstance(events[-1], ProcessExit) and events[-1].exit_code == 5
        ran = await box.sh("exec >&- 2>&-; sleep 1.5; exit 4", timeout_ms=20_000)
        assert (ran.exit_code, ran.timed_out) == (4, False)
        ran = await box.sh("exec >&- 2>&-; sleep 30", timeout_ms=1_000)
        assert ran.timed_out and ran.exit_code == 137  # past its deadline it is ended, and says so
    finally:
        await box.release()
