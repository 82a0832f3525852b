"""Provider faults that only a wire has, driven through the runner: the service restarts in the
middle of a call or of a stream, the connection drops, an answer comes after its deadline.

Each ends in a typed error; the allocation is compensated by its key through the (restarted)
service, the journal says so, and nothing is left in the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from wire_rig import Service, peer, read_request

from checkfu.contract.envelope import MEMBERS
from checkfu.contract.errors import (
    SandboxError,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxResultInvalid,
)
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.core.driver import Limits, RunSession
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.testing import Invocation, MemoryProvider, Misbehaving, Misbehaviour, hang, memory_profile
from checkfu.wire.client import RemoteProvider
from enrolled import enroll_adapters

pytestmark = pytest.mark.anyio

PROFILE = memory_profile()


@dataclass
class WireRun:
    memory: MemoryProvider
    provider: Misbehaving
    service: Service
    remote: RemoteProvider
    journal: Journal
    session: RunSession

    @property
    def platform(self) -> Any:
        return self.memory.envelope.platforms[0]

    def row_state(self, key: str) -> str:
        row = self.journal.allocation(key)
        assert row is not None
        return row.state


@pytest.fixture
async def wire_run(serve: Callable[..., Service], tmp_path: Path) -> AsyncIterator[Callable[..., WireRun]]:
    made: list[WireRun] = []

    def make(limits: Limits | None = None) -> WireRun:
        memory = MemoryProvider()
        provider = Misbehaving(memory)
        service = serve(provider)
        remote = service.remote()
        journal = Journal(sqlite_url(tmp_path / f"journal-{len(made)}.sqlite"))
        registry = Registry()
        registry.add(Adapter(envelope=memory.envelope, provider=remote, source=f"remote {service.url}"))
        enroll_adapters(journal, registry)
        runner = Runner(registry, journal, runner_tag="wire-faults", limits=limits or Limits())
        session = runner.start(memory.target, PROFILE, platform=memory.envelope.platforms[0]).session
        run = WireRun(memory, provider, service, remote, journal, session)
        made.append(run)
        return run

    yield make
    for run in made:
        await run.remote.aclose()
        run.journal.close()


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_a_service_restarted_in_the_middle_of_a_provision(wire_run: Callable[..., WireRun]) -> None:
    run = wire_run()
    image = (await run.session.materialize(PROFILE, run.platform)).image
    run.provider.set("provision", hang)  # allocates, then never answers
    call = asyncio.ensure_future(run.session.provision(PROFILE, run.platform, image))
    await until(lambda: len(run.memory.live_objects()) == 1)
    run.provider.set("provision", None)
    await run.service.crash(restart=True)  # the call's connection drops; a new service listens
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(call, 10)
    assert type(caught.value) is SandboxProtocolViolation  # not retried: the service may have allocated
    assert run.memory.calls.count("provision") == 1
    assert run.memory.calls[-1] == "compensate" and run.memory.live_objects() == ()
    (row,) = run.journal.allocations_for_run(run.session.run_id)
    assert row.state == "compensated"


async def test_a_service_restarted_between_calls_costs_no_call(wire_run: Callable[..., WireRun]) -> None:
    run = wire_run()
    image = (await run.session.materialize(PROFILE, run.platform)).image
    inst = await run.session.provision(PROFILE, run.platform, image)
    await run.session.activate(inst)
    await run.service.crash(restart=True)  # every idle connection of the client is dead now
    await asyncio.sleep(0.05)
    out = await run.session.exec(inst, ["echo", "still here"], timeout=5)
    assert out.stdout == b"still here\n" and run.memory.calls.count("exec") == 1
    await run.session.release_all()
    assert run.memory.live_objects() == ()


async def test_a_stream_whose_service_restarted_ends_typed_and_the_instance_is_reclaimed(
    wire_run: Callable[..., WireRun],
) -> None:
    run = wire_run()
    image = (await run.session.materialize(PROFILE, run.platform)).image
    inst = await run.session.provision(PROFILE, run.platform, image)
    await run.session.activate(inst)
    proc = await run.session.open_process(inst, ["cat"])
    await proc.send_stdin(b"before")
    events = proc.events()
    first = await anext(events)
    assert isinstance(first, ProcessOutput) and first.data == b"before"
    await run.service.crash(restart=True)

    async def rest() -> None:
        async for event in events:
            assert not isinstance(event, ProcessExit | ProcessOutput)

    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(rest(), 10)
    assert type(caught.value) is SandboxProviderFailed and caught.value.reported_code == "SandboxNotFound"
    assert run.memory.calls.count("openProcess") == 1
    await run.session.release_all()
    assert run.memory.live_objects() == ()
    assert {r.state for r in run.journal.allocations_for_run(run.session.run_id)} <= {"released", "compensated"}


async def test_a_dropped_stream_resumes_through_the_runner(wire_run: Callable[..., WireRun]) -> None:
    run = wire_run()
    image = (await run.session.materialize(PROFILE, run.platform)).image
    inst = await run.session.provision(PROFILE, run.platform, image)
    await run.session.activate(inst)
    proc = await run.session.open_process(inst, ["cat"])
    sent = b"".join(bytes([i]) * 10_000 for i in range(50))
    out = bytearray()

    async def feed() -> None:
        for at in range(0, len(sent), 50_000):
            await proc.send_stdin(sent[at : at + 50_000])
            if at % 150_000 == 0:
                proc.stream._ws.transport.abort()  # type: ignore[attr-defined]
        await proc.close_stdin()

    feeding = asyncio.ensure_future(feed())
    async for event in proc.events():
        if isinstance(event, ProcessOutput):
            out.extend(event.data)
        elif isinstance(event, ProcessExit):
            assert event.exit_code == 0
    await feeding
    assert bytes(out) == sent and run.memory.calls.count("openProcess") == 1
    await run.session.release_all()
    assert run.memory.live_objects() == ()


async def _late(inv: Invocation) -> Any:
    result = await inv.proceed()
    await asyncio.sleep(1.0)  # the answer comes, but after the runner's deadline
    return result


late = Misbehaviour("late", frozenset(MEMBERS), _late)


async def test_an_answer_after_its_deadline_is_a_timeout_and_the_instance_is_reclaimed(
    wire_run: Callable[..., WireRun],
) -> None:
    run = wire_run(Limits(deadlines={"inspect": 0.4, "provision": 0.4}))
    image = (await run.session.materialize(PROFILE, run.platform)).image
    inst = await run.session.provision(PROFILE, run.platform, image)
    await run.session.activate(inst)
    run.provider.set("inspect", late)
    with pytest.raises(SandboxProviderTimeout):
        await run.session.inspect(inst)
    assert run.memory.live_objects() == () and run.row_state(inst.allocation_key) == "compensated"
    # A late provision: allocated by the time the runner gave up, reclaimed by its key all the same.
    run.provider.set("provision", late)
    with pytest.raises(SandboxProviderTimeout):
        await run.session.provision(PROFILE, run.platform, image)
    await asyncio.sleep(1.0)  # the late answer lands on a connection the client has closed
    assert run.memory.live_objects() == ()
    assert {r.state for r in run.journal.allocations_for_run(run.session.run_id)} == {"compensated"}
    # The client is not confused by answers that arrived after it gave up.
    run.provider.set("provision", None)
    again = await run.session.provision(PROFILE, run.platform, image)
    assert again.state == "provisioning"
    await run.session.release_all()
    assert run.memory.live_objects() == ()


# A service restarted in the middle of each member: typed, reclaimed, and never acted on twice --------------

ONCE_ONLY: tuple[str, ...] = ("provision", "activate", "exec", "openProcess", "snapshot", "clone", "release")
"""Members the client must never send again: each allocates, starts or ends something."""


async def _scene(run: WireRun) -> tuple[Any, Any]:
    image = (await run.session.materialize(PROFILE, run.platform)).image
    inst = await run.session.provision(PROFILE, run.platform, image)
    await run.session.activate(inst)
    return image, inst


def _call(run: WireRun, member: str, image: str, inst: Any) -> Any:
    s, p = run.session, run.platform
    if member == "provision":
        return s.provision(PROFILE, p, image)
    if member == "activate":
        return s.activate(inst)  # an active instance: the service would refuse, but it is hung first
    if member == "exec":
        return s.exec(inst, ["echo", "once"], timeout=5)
    if member == "openProcess":
        return s.open_process(inst, ["echo", "once"])
    if member == "snapshot":
        return s.snapshot(inst)
    if member == "clone":
        return s.clone(inst, PROFILE, p, image)
    return s.release(inst)


@pytest.mark.parametrize("member", ONCE_ONLY)
async def test_a_service_restarted_mid_call_never_acts_twice(wire_run: Callable[..., WireRun], member: str) -> None:
    run = wire_run()
    image, inst = await _scene(run)
    if member == "activate":
        inst = await run.session.provision(PROFILE, run.platform, image)  # one still provisioning
    before = run.memory.calls.count(member)
    run.provider.set(member, hang)  # does the work, then never answers
    call = asyncio.ensure_future(_call(run, member, image, inst))
    await until(lambda: run.memory.calls.count(member) == before + 1)
    run.provider.set(member, None)
    await run.service.crash(restart=True)
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(call, 15)
    assert isinstance(caught.value, SandboxProtocolViolation | SandboxProviderFailed), caught.value
    await asyncio.sleep(0.2)  # anything sent again would have landed by now
    assert run.memory.calls.count(member) == before + 1, run.memory.calls  # never sent again
    await run.session.release_all()
    assert run.memory.live_objects() == ()
    assert {r.state for r in run.journal.allocations_for_run(run.session.run_id)} <= {"released", "compensated"}


@pytest.mark.parametrize("member", ["inspect", "readFiles", "listDir"])
async def test_an_idempotent_call_cut_by_a_restart_is_sent_again_and_answered(
    wire_run: Callable[..., WireRun], member: str
) -> None:
    run = wire_run()
    _, inst = await _scene(run)
    await run.session.exec(inst, ["sh", "-c", "echo kept > /tmp/f"], timeout=5)
    calls = {
        "inspect": lambda: run.session.inspect(inst),
        "readFiles": lambda: run.session.read_files(inst, ["/tmp/f"]),
        "listDir": lambda: run.session.list_dir(inst, "/tmp"),
    }
    await calls[member]()  # the connection is a reused one from here on
    run.provider.set(member, hang)
    call = asyncio.ensure_future(calls[member]())
    await until(lambda: run.memory.calls.count(member) == 2)
    run.provider.set(member, None)
    await run.service.crash(restart=True)
    answer = await asyncio.wait_for(call, 15)  # the contract makes it idempotent: asked again, answered
    assert answer is not None and run.memory.calls.count(member) == 3
    await run.session.release_all()
    assert run.memory.live_objects() == ()


# A service whose answers arrive twice, or are cut in the middle of a body ----------------------------


@contextlib.asynccontextmanager
async def relay(service: Service, answer: Callable[[str, bytes, asyncio.StreamWriter], Awaitable[None]]) -> Any:
    """A loopback relay in front of ``service``: each request goes to it on a connection of its own, and
    ``answer(member, response, writer)`` decides what the client gets of the whole response."""
    upstream = urlsplit(service.url)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head, body = await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            member = head.split(b" ", 2)[1].decode().rsplit("/", 1)[-1]
            lines = [ln for ln in head[:-4].split(b"\r\n") if not ln.lower().startswith(b"connection:")]
            up_reader, up_writer = await asyncio.open_connection(upstream.hostname, upstream.port)
            up_writer.write(b"\r\n".join([*lines, b"connection: close"]) + b"\r\n\r\n" + body)
            await up_writer.drain()
            response = await up_reader.read(-1)  # the service closes after one answer
            up_writer.close()
            resp_head, _, resp_body = response.partition(b"\r\n\r\n")
            kept = [ln for ln in resp_head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
            await answer(member, b"\r\n".join(kept) + b"\r\n\r\n" + resp_body, writer)

    async with peer(handle) as made:
        yield made


async def test_an_answer_sent_twice_is_a_protocol_violation_and_reclaimed(wire_run: Callable[..., WireRun]) -> None:
    run = wire_run()

    async def twice(member: str, response: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response + (response if member == "provision" else b""))
        await writer.drain()

    async with relay(run.service, twice) as relayed:
        remote = RemoteProvider(relayed.url, run.service.secret)
        try:
            session = _session_over(run, remote)
            image = (await session.materialize(PROFILE, run.platform)).image
            inst = await session.provision(PROFILE, run.platform, image)
            await asyncio.sleep(0.05)  # the second copy of the answer is on the connection by now
            with pytest.raises(SandboxProtocolViolation, match="no request asked for"):
                await session.activate(inst)
            assert run.memory.calls.count("activate") == 0  # nothing was sent on a connection out of step
            assert run.memory.live_objects() == ()  # compensated by its key
            (row,) = run.journal.allocations_for_run(session.run_id)
            assert row.state == "compensated"
        finally:
            await remote.aclose()


async def test_a_body_cut_in_the_middle_is_typed_and_the_instance_reclaimed(
    wire_run: Callable[..., WireRun],
) -> None:
    run = wire_run()

    async def cut(member: str, response: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response if member != "readFiles" else response[: len(response) - 40])
        await writer.drain()
        if member == "readFiles":
            writer.transport.abort()

    async with relay(run.service, cut) as relayed:
        remote = RemoteProvider(relayed.url, run.service.secret)
        try:
            session = _session_over(run, remote)
            image = (await session.materialize(PROFILE, run.platform)).image
            inst = await session.provision(PROFILE, run.platform, image)
            await session.activate(inst)
            await session.exec(inst, ["sh", "-c", "echo 0123456789012345678901234567890123456789 > /tmp/f"], timeout=5)
            with pytest.raises(SandboxError) as caught:
                await session.read_files(inst, ["/tmp/f"])
            assert isinstance(caught.value, SandboxProtocolViolation | SandboxResultInvalid), caught.value
            assert run.memory.live_objects() == ()
            assert {r.state for r in run.journal.allocations_for_run(session.run_id)} == {"compensated"}
        finally:
            await remote.aclose()


def _session_over(run: WireRun, remote: RemoteProvider) -> RunSession:
    registry = Registry()
    registry.add(Adapter(envelope=run.memory.envelope, provider=remote, source="relay"))
    enroll_adapters(run.journal, registry)
    runner = Runner(registry, run.journal, runner_tag="wire-faults")
    return runner.start(run.memory.target, PROFILE, platform=run.platform).session
