"""Load on the memory provider: many Runs at once through one runner and a real SQLite journal.

All succeed or fail with a vocabulary error, nothing is left in the provider or open in the journal, a
reconciliation afterwards finds nothing to do, and the runner's memory stays within the stated bound. The
default test command runs 1000 Runs; ``CHECKFU_SLOW=1`` runs the full 10 000. A second, half-size batch with 50 in
flight then shows the memory reached a steady state: what one batch left behind, the next does not add to.
"""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract.vocabulary import Platform
from checkfu.core.reconcile import reconcile
from load import MIB, hold_load

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")

PEAK_BOUND_PER_RUN = 32 * 1024
"""The runner's resident memory may grow by at most 32 KiB per Run in flight at its peak (all of them start at
once), plus ``PEAK_BOUND_BASE`` for the allocator's and the journal's fixed costs."""
PEAK_BOUND_BASE = 64 * MIB
STEADY_BOUND_PER_RUN = 4 * 1024
"""Once warm, a second batch (at most 50 Runs in flight) may leave at most 4 KiB per Run behind. Measured: about
1.4 KiB, traced (tracemalloc) to the memory provider's record of each released instance, which it keeps so that
a second ``release`` stays idempotent, and about 150 B in the runner; a Run that leaked its session, journal rows
or results would exceed it many times over."""


async def held_load(rig: Any, n: int) -> None:
    """``rig`` is the runner tests' rig (``tests/runner/conftest.py``): a memory provider, a runner, a journal."""
    figures = await hold_load(rig.runner, rig.memory.target, rig.profile, AMD64, n)
    assert figures.untyped == [], figures.untyped[:5]
    assert figures.ok + sum(figures.failures.values()) == n
    assert figures.ok == n, f"the memory provider refuses nothing here: {dict(figures.failures)}"
    assert rig.memory.live_objects() == () and rig.memory.held_bytes() == 0
    assert rig.journal.open_allocations(runner_tag=rig.runner.runner_tag) == []
    assert rig.journal.unsettled_runs(runner_tag=rig.runner.runner_tag) == []
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.nothing_to_do and not report.unaccounted, report
    assert figures.growth_peak <= PEAK_BOUND_BASE + n * PEAK_BOUND_PER_RUN, str(figures)
    rig.memory.calls.clear()  # the test double's log of every call, not the runner's memory
    steady = await hold_load(rig.runner, rig.memory.target, rig.profile, AMD64, n // 2, concurrency=50)
    assert steady.ok == n // 2 and rig.memory.live_objects() == ()
    assert steady.rss_peak - figures.rss_after <= (n // 2) * STEADY_BOUND_PER_RUN, str(steady)


async def test_a_thousand_runs_at_once_leave_nothing(rig: Any) -> None:
    await held_load(rig, 1000)


@pytest.mark.slow
async def test_ten_thousand_runs_at_once_leave_nothing(rig: Any) -> None:
    await held_load(rig, 10_000)
