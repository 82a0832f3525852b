"""A Run the fleet refuses is settled ``refused:<code>`` whatever the code, on SQLite and on PostgreSQL.

``runs.status`` was ``VARCHAR(32)``: SQLite does not enforce a length, PostgreSQL does, so a fleet on PostgreSQL
could not settle a Run refused as ``SandboxAdapterUnavailable`` (33 characters with ``refused:``) or
``SandboxCapabilityUnavailable`` (36), the commonest refusals of all (migration 0009).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from checkfu.contract.errors import ERROR_CLASSES
from checkfu.core.fleet import FleetConfig, FleetRunner
from checkfu.core.journal import Journal
from checkfu.core.queue import RunRequest
from checkfu.core.registry import Registry
from checkfu.fleet import submit_request
from checkfu.testing import memory_profile

pytestmark = pytest.mark.anyio


async def test_a_run_refused_for_want_of_an_adapter_is_settled_with_its_code(journal: Journal) -> None:
    async def load(spec: str) -> Registry:
        return Registry()  # nothing advertises what the Run asks for

    request = RunRequest(provider="memory", command=("true",), profile=memory_profile().model_dump(mode="json"))
    run_id = submit_request(journal, request, runner_tag="fleet-refusal")
    events: list[dict[str, Any]] = []
    config = FleetConfig(concurrency=1, lease_ttl=30.0, poll=0.02, reconcile_every=3600.0)
    fleet = FleetRunner(journal, load, runner_tag="fleet-refusal", config=config, emit=events.append)

    async def stop_when_settled() -> None:
        for _ in range(1000):
            if any(e.get("event") == "settled" for e in events):
                break
            await asyncio.sleep(0.01)
        fleet.stop()

    await asyncio.gather(fleet.serve(), stop_when_settled())
    run = journal.run(run_id)
    assert run is not None and run.status == "refused:SandboxAdapterUnavailable", (run, events)


def test_every_refusal_status_fits_the_journal() -> None:
    from checkfu.core.journal import runs  # noqa: PLC0415

    longest = max(len(f"refused:{code}") for code in ERROR_CLASSES)
    assert runs.c.status.type.length >= longest
