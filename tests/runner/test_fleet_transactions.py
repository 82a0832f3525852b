"""The journal transactions one Run of the fleet makes: a budget, so that a transaction added is seen.

A Run of the fleet writes what its ordering needs and no more (issue 33): the claim; the placement with its
``select`` event; each provider call's fence (the lease renewed, with the calls recorded since the last write); a
journaled allocation with the fence of the call that makes it; a row settled with the call that settled it; the
Run's open rows read once it released them; the settlement with the rest of its output and calls. Every write of
the attempt stays fenced by its lease, and every allocation is committed before the provider is asked for it
(``tests/runner/test_runner_fleet.py``, ``test_runner_leases.py`` and ``test_runner_misbehaviour.py`` hold those).

Throughput is measured in ``bench/b14_fleet.py`` (B14), not here: this counts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

from checkfu.core.clock import ManualClock
from checkfu.core.fleet import FleetConfig, FleetRunner
from checkfu.core.journal import Journal
from checkfu.core.queue import RunQueue, RunRequest
from checkfu.core.registry import Adapter, Registry
from checkfu.fleet import submit_request
from checkfu.testing import MemoryProvider, memory_profile

pytestmark = pytest.mark.anyio

BUDGET = 10
"""Transactions per Run of the fleet with a provider in-process, at most; over the wire one more (the enrollment
read). The issue's target (B14's) is 12: this is what a Run needs now, so that a transaction added is seen."""


async def test_one_run_of_the_fleet_keeps_to_its_transaction_budget_and_its_whole_history(journal: Journal) -> None:
    provider = MemoryProvider()
    registry = Registry()
    registry.add(Adapter(envelope=provider.envelope, provider=provider, source="memory"))

    async def load(spec: str) -> Registry:
        return registry

    commits = 0

    @sa.event.listens_for(journal.engine, "commit")
    def count(_conn: Any) -> None:
        nonlocal commits
        commits += 1

    request = RunRequest(provider="memory", command=("echo", "hi"), profile=memory_profile().model_dump(mode="json"))
    run_id = submit_request(journal, request, runner_tag="fleet-budget")
    at: dict[str, int] = {}

    def emit(event: dict[str, Any]) -> None:
        if event.get("event") in ("claimed", "settled"):
            at.setdefault(str(event["event"]), commits)  # emitted right after the claim's and the settlement's commit

    # One worker, and no heartbeat or reconcile during the Run: every commit between its claim and its settlement
    # is the Run's own.
    config = FleetConfig(concurrency=1, lease_ttl=30.0, heartbeat=3600.0, poll=0.02, reconcile_every=3600.0)
    fleet = FleetRunner(journal, load, runner_tag="fleet-budget", config=config, emit=emit)

    async def stop_when_settled() -> None:
        for _ in range(1000):
            if "settled" in at:
                break
            await asyncio.sleep(0.01)
        fleet.stop()

    await asyncio.gather(fleet.serve(), stop_when_settled())
    run = journal.run(run_id)
    assert run is not None and run.status == "succeeded", run
    made = at["settled"] - at["claimed"] + 1  # the claim's own commit, then every one up to the settlement's
    assert made <= BUDGET, f"one Run of the fleet made {made} journal transactions; its budget is {BUDGET}"
    # batched, not dropped: every call is in the Run's history, in order, and nothing is left open
    assert [e.member for e in journal.events_for_run(run_id)] == [
        "select",
        "materialize",
        "provision",
        "activate",
        "openProcess",
        "release",
        "settle",
    ]
    assert journal.open_allocations(run_id=run_id) == []
    assert provider.live_objects() == ()
    kept = RunQueue(journal, ManualClock()).output_since(run_id, 0)
    assert b"".join(c.data for c in kept if c.stream == "out") == b"hi\n"
