"""Load on the Docker tier: many sandboxes provisioned and released at once through one runner, against the real
engine and a real SQLite journal.

Each Run materializes, provisions, activates and releases its sandbox, all Runs at once. All succeed or fail with
a vocabulary error; afterwards nothing carries this test's own runner tag (containers, volumes, images), nothing
is open in the journal, a reconciliation finds nothing to do, and the runner's resident memory stayed within the
stated bound. The default test command runs 10 sandboxes; ``CHECKFU_SLOW=1`` runs the full 100.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_kit import LEASE, leftovers, resources

from checkfu.contract.members import CompensateRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import SystemClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.providers.docker import DockerProvider
from checkfu.providers.docker.envelope import host_facts
from load import MIB, hold_load

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PEAK_BOUND_BASE = 64 * MIB
PEAK_BOUND_PER_SANDBOX = 1 * MIB
"""The runner's resident memory may grow by at most 1 MiB per sandbox in flight at its peak (each holds a few
engine connections and worker threads' buffers), plus ``PEAK_BOUND_BASE``."""


@pytest.fixture
def tag(provider: DockerProvider, client: Any) -> Iterator[str]:
    """A runner tag of this test's own: only its objects are counted, and any left are reclaimed (and fail it)."""
    own = "tl" + uuid.uuid4().hex[:12]
    yield own
    for key in sorted({k for _, _, k in leftovers(client, own)}):
        asyncio.run(
            provider.compensate(
                CompensateRequest(target=provider.target, lease=LEASE, allocation_key=key, runner_tag=own)
            )
        )


async def held_load(provider: DockerProvider, client: Any, busybox_id: str, tag: str, tmp_path: Path, n: int) -> None:
    envelope = (await provider.describe()).envelope
    registry = Registry()
    registry.add(Adapter(envelope=envelope, provider=provider, source="entry point docker", in_tree=True))
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        runner = Runner(registry, journal, runner_tag=tag, clock=SystemClock())
        profile = SandboxProfile(
            tier="container",
            base_image=busybox_id,
            network_policy={"mode": "none"},
            resource_limits=resources(),
            retention_mode="ephemeral_zdr",
        )
        platform = Platform(os="linux", architecture=host_facts().architecture)
        figures = await hold_load(runner, envelope.target, profile, platform, n)
        assert figures.untyped == [], figures.untyped[:5]
        assert figures.ok + sum(figures.failures.values()) == n
        assert leftovers(client, tag) == []
        assert journal.open_allocations(runner_tag=tag) == [] and journal.unsettled_runs(runner_tag=tag) == []
        report = await reconcile(journal, registry, SystemClock(), runner_tag=tag)
        assert report.nothing_to_do and not report.unaccounted, report
        assert leftovers(client, tag) == []
        assert figures.growth_peak <= PEAK_BOUND_BASE + n * PEAK_BOUND_PER_SANDBOX, str(figures)
        assert figures.ok == n, f"every sandbox came up on an engine with room for them: {dict(figures.failures)}"
    finally:
        journal.close()


async def test_ten_sandboxes_at_once_leave_nothing(
    provider: DockerProvider, client: Any, busybox_id: str, tag: str, tmp_path: Path
) -> None:
    await held_load(provider, client, busybox_id, tag, tmp_path, 10)


@pytest.mark.slow
async def test_a_hundred_sandboxes_at_once_leave_nothing(
    provider: DockerProvider, client: Any, busybox_id: str, tag: str, tmp_path: Path
) -> None:
    await held_load(provider, client, busybox_id, tag, tmp_path, 100)
