"""A serving runner lets go of every provider it loaded: one replaced because a site was down once nothing that
began before the replacement still runs, and the rest when serving ends.

A provider holds connections and threads (the Docker tier's engine client, a wire client's pool). Left to the
garbage collector, a TLS engine's sockets were reported unclosed, at random, in whatever test ran next (stop 37's
CI); a runner whose site stays down loaded a new registry every ``site_refresh`` seconds and kept every old
client open.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from checkfu.core.clock import ManualClock
from checkfu.core.fleet import Adapters, FleetConfig, FleetRunner
from checkfu.core.journal import Journal
from checkfu.core.queue import RunQueue, RunRequest, is_terminal
from checkfu.core.registry import Adapter, Registry
from checkfu.fleet import submit_request
from checkfu.testing import MemoryProvider, memory_profile

pytestmark = pytest.mark.anyio


class Closing(MemoryProvider):
    """The memory provider, counting how often it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Loads:
    """A loader handing out a new registry (one ``Closing`` provider, and site ``b`` down) at each call."""

    def __init__(self) -> None:
        self.providers: list[Closing] = []

    async def __call__(self, spec: str) -> Registry:
        provider = Closing()
        registry = Registry()
        registry.add(Adapter(envelope=provider.envelope, provider=provider, source=f"memory #{len(self.providers)}"))
        registry.mark_unavailable("site b", "its engine does not answer", site="b")
        self.providers.append(provider)
        return registry


async def test_a_registry_replaced_while_its_site_is_down_is_closed_once_what_began_before_has_ended() -> None:
    clock = ManualClock()
    loads = Loads()
    adapters = Adapters(loads, clock, refresh=15.0)
    async with adapters.hold():  # an attempt under way, which may be using the first registry
        await adapters.get("memory")
        clock.advance(16.0)  # stale: site b is down, so the name is loaded again
        await adapters.get("memory")
        assert len(loads.providers) == 2
        async with adapters.hold():  # begun after the replacement: it cannot see the first registry
            pass
        assert [p.closed for p in loads.providers] == [0, 0]  # the first attempt may still be using it
    assert [p.closed for p in loads.providers] == [1, 0]
    await adapters.close()
    assert [p.closed for p in loads.providers] == [1, 1]
    assert adapters.combined.adapters == ()


async def test_an_attempt_that_never_reached_a_registry_does_not_keep_it_open() -> None:
    """Only what a hold reached pins a registry: a long Run elsewhere does not keep every registry replaced during
    it (one per ``site_refresh`` while a site is down) open."""
    clock = ManualClock()
    loads = Loads()
    adapters = Adapters(loads, clock, refresh=15.0)
    async with adapters.hold():  # a long attempt that has not reached the name's registry (nor combined)
        async with adapters.hold():
            await adapters.get("memory")
        clock.advance(16.0)
        async with adapters.hold():
            await adapters.get("memory")
        assert [p.closed for p in loads.providers] == [1, 0]
        async with adapters.hold():
            assert len(adapters.combined.adapters) == 1  # reaches the second registry through combined
            clock.advance(16.0)
            await adapters.get("memory")
            assert [p.closed for p in loads.providers] == [1, 0, 0]
        assert [p.closed for p in loads.providers] == [1, 1, 0]


async def test_a_registry_replaced_with_nothing_under_way_is_closed_at_once() -> None:
    clock = ManualClock()
    loads = Loads()
    adapters = Adapters(loads, clock, refresh=15.0)
    await adapters.get("memory")
    clock.advance(16.0)
    await adapters.get("memory")
    await adapters.get("memory")  # fresh again: not loaded a third time
    assert [p.closed for p in loads.providers] == [1, 0]


async def test_a_runner_closes_what_it_loaded_when_it_stops_serving(journal: Journal) -> None:
    provider = Closing()
    registry = Registry()
    registry.add(Adapter(envelope=provider.envelope, provider=provider, source="memory"))

    async def load(spec: str) -> Registry:
        return registry

    request = RunRequest(provider="memory", command=("true",), profile=memory_profile().model_dump(mode="json"))
    run_id = submit_request(journal, request, runner_tag="fleet-closes")
    events: list[dict[str, Any]] = []
    config = FleetConfig(concurrency=1, lease_ttl=30.0, poll=0.02, reconcile_every=3600.0)
    fleet = FleetRunner(journal, load, runner_tag="fleet-closes", config=config, emit=events.append)

    async def stop_when_settled() -> None:
        for _ in range(1000):
            if any(e.get("event") == "settled" for e in events):
                break
            await asyncio.sleep(0.01)
        assert provider.closed == 0  # in use while serving
        fleet.stop()

    await asyncio.gather(fleet.serve(), stop_when_settled())
    run = journal.run(run_id)
    assert run is not None and is_terminal(run.status) and run.status == "succeeded", run
    assert provider.closed == 1
    assert RunQueue(journal, ManualClock()).counts().get("running", 0) == 0
