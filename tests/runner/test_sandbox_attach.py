"""A long-lived sandbox is held through the session core's transitions: any process attaches to it under its
lease as it stands, and letting go of it (detach) leaves it live for the next holder; a reclaim fences them all.
On the memory provider and a real SQLite or PostgreSQL journal."""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract.errors import SandboxLeaseFenced
from checkfu.contract.vocabulary import Platform
from checkfu.core.sandboxes import SandboxHost

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
RigFactory = Any  # conftest's make_rig


async def test_a_process_attaches_to_a_detached_sandbox_and_letting_go_leaves_it_live(
    make_rig: RigFactory, journal_url: str
) -> None:
    rig = make_rig(url=journal_url)
    host = SandboxHost(rig.registry, rig.journal, runner_tag=rig.runner.runner_tag, clock=rig.clock)
    made = await host.create(rig.memory.target, rig.profile, AMD64, detached=True, ttl=600)
    [held] = rig.held_keys()

    other = SandboxHost(rig.registry, rig.journal, runner_tag=rig.runner.runner_tag, clock=rig.clock)
    attached = other.attach(made.sandbox_id)  # another process, under the sandbox's one lease as it stands
    assert attached.session.lease == made.session.lease
    assert (await attached.exec(["echo", "hi"])).stdout == b"hi\n"

    attached.detach()
    assert await attached.session.release_all() == {}  # its wind-up leaves what it let go of alone
    assert rig.held_keys() == {held}
    row = rig.journal.allocation(held)
    assert row is not None and row.state == "live"
    assert host.record(made.sandbox_id).state == "live"

    again = other.attach(made.sandbox_id)  # the next holder finds it as it was
    assert (await again.exec(["true"])).exit_code == 0
    await again.release()
    assert rig.held_keys() == set() and host.record(made.sandbox_id).state == "released"
    with pytest.raises(SandboxLeaseFenced):  # every holder of the sandbox is fenced once it is released
        await made.exec(["true"])
