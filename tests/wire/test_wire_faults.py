"""Provider faults that only a wire has, driven through the runner: the service restarts in the
middle of a call or of a stream, the connection drops, an answer comes after its deadline.

Each ends in a typed error; the allocation is compensated by its key through the (restarted)
service, the journal says so, and nothing is left in the provider.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from wire_rig import Service

from checkfu.contract.envelope import MEMBERS
from checkfu.contract.errors import (
    SandboxError,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
)
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.runner.driver import Limits, RunSession
from checkfu.runner.journal import Journal, sqlite_url
from checkfu.runner.registry import Adapter, Registry
from checkfu.runner.runner import Runner
from checkfu.testing import Invocation, MemoryProvider, Misbehaving, Misbehaviour, hang, memory_profile
from checkfu.wire.client import RemoteProvider

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
