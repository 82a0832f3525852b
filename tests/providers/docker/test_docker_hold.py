"""Held sandboxes (the warm pool's, issue 18): started and at once frozen at ``provision``, thawed by ``activate``.

What must stay true of a held sandbox: nothing runs in it before ``activate`` (the engine reports it paused and
refuses to exec in it; the provider refuses ``exec`` as a state conflict), a cold provider reads it as
``provisioning``, mounts staged by another provider (the adopting Run's) are in place and sealed when it thaws,
its writable areas work, and release and cold compensation leave nothing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from docker_kit import LEASE, Box, Kit, leftovers, plans_for

from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxProviderFailed, SandboxStateConflict
from checkfu.contract.members import ActivateRequest, CompensateRequest, InspectRequest, SnapshotRequest
from checkfu.providers.docker import DockerProvider, create
from checkfu.providers.docker import labels as L

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def held(provider: DockerProvider, client: Any, runner_tag: str, busybox_id: str) -> Iterator[Kit]:
    """A provider that holds what it provisions, sharing the session provider's state directory and tag."""
    p = DockerProvider(state_dir=provider.state_dir, cache_tag=runner_tag, workers=4, hold=True)
    try:
        yield Kit(p, client, runner_tag, busybox_id, docker=p)
    finally:
        p.close()


@pytest.fixture
def adopter(provider: DockerProvider, client: Any, runner_tag: str, busybox_id: str) -> Kit:
    """The session provider, which did not provision the held sandbox: it finds it on the engine, as a Run would."""
    return Kit(provider, client, runner_tag, busybox_id, docker=provider)


async def test_a_held_sandbox_waits_frozen_and_thaws_with_its_mounts_staged_and_sealed(
    held: Kit, adopter: Kit, client: Any
) -> None:
    files = {"/workspace/f": b"staged while frozen\n"}
    key, made = await held.provision("held", mounts=plans_for(files))
    box = Box(adopter, key, made.instance_id)
    try:
        info = client.api.inspect_container(made.instance_id)
        assert info["State"]["Status"] == "paused" and info["State"]["Paused"]
        assert info["Config"]["Labels"][L.HOLD] == "1"
        assert info["HostConfig"]["ReadonlyRootfs"] and info["HostConfig"]["NetworkMode"] == "none"
        # Nothing runs in it: the engine refuses an exec into a frozen container, and the provider refuses exec
        # before activate.
        with pytest.raises(Exception, match="paused"):
            client.containers.get(made.instance_id).exec_run(["true"])
        with pytest.raises(SandboxStateConflict):
            await box.exec("true")
        assert (await adopter.provider.inspect(InspectRequest(**box.call))).state == "provisioning"

        await adopter.stage(box.call, files)
        await adopter.provider.activate(ActivateRequest(**box.call))
        state = client.api.inspect_container(made.instance_id)["State"]
        assert state["Running"] and not state["Paused"]
        assert (await adopter.provider.inspect(InspectRequest(**box.call))).state == "active"
        seen = await box.sh("cat /workspace/f; echo x > /workspace/g || echo SEALED; echo ok > ~/w && cat ~/w")
        assert seen.exit_code == 0, seen
        assert seen.stdout.split(b"\n")[:1] == [b"staged while frozen"]
        assert b"SEALED" in seen.stdout and seen.stdout.endswith(b"ok\n")
        with pytest.raises(SandboxStateConflict):
            await adopter.provider.activate(ActivateRequest(**box.call))
    finally:
        await box.release()
    assert not [o for o in leftovers(client, adopter.runner_tag) if o[2] == key]


async def test_a_held_sandbox_whose_last_upload_fails_is_frozen_again(held: Kit, adopter: Kit, client: Any) -> None:
    """A held sandbox thaws while its mounts' last files go up; when that upload fails, it is paused again and
    reads ``provisioning`` (no thaw mark), so nothing runs in it, and its release leaves nothing."""
    files = {"/workspace/f": b"never lands\n"}
    key, made = await held.provision("held-fails", mounts=plans_for(files))
    box = Box(adopter, key, made.instance_id)
    try:
        await adopter.stage(box.call, files)  # spooled: it goes up at activate
        client.api.remove_container(L.stager_name(made.instance_id), force=True)  # behind the provider's back
        with pytest.raises(SandboxProviderFailed, match="activate: uploading staged files"):
            await adopter.provider.activate(ActivateRequest(**box.call))
        state = client.api.inspect_container(made.instance_id)["State"]
        assert state["Paused"], state
        assert (await adopter.provider.inspect(InspectRequest(**box.call))).state == "provisioning"
    finally:
        await box.release()
    assert not [o for o in leftovers(client, adopter.runner_tag) if o[2] == key]


async def test_a_held_sandbox_is_reclaimed_cold(held: Kit, client: Any, tmp_path: Any) -> None:
    key, made = await held.provision("held-cold", mounts=plans_for({"/data/x": b"x"}))
    assert client.api.inspect_container(made.instance_id)["State"]["Paused"]
    cold = DockerProvider(state_dir=tmp_path, cache_tag=held.runner_tag, workers=4)
    try:
        request = CompensateRequest(target=held.target, lease=LEASE, allocation_key=key, runner_tag=held.runner_tag)
        assert (await cold.compensate(request)).reclaimed >= 2 + 3 + 1  # sandbox, stager, areas, mount volume
    finally:
        cold.close()
    deadline = time.monotonic() + 10
    while [o for o in leftovers(client, held.runner_tag) if o[2] == key] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [o for o in leftovers(client, held.runner_tag) if o[2] == key]


def test_the_hold_option_is_yes_or_no(tmp_path: Any) -> None:
    p = create(state_dir=str(tmp_path), workers="2", hold="yes")
    try:
        assert p.hold
    finally:
        p.close()
    with pytest.raises(SandboxAdapterUnavailable) as refused:
        create(state_dir=str(tmp_path), hold="maybe")
    assert refused.value.field == "hold"


async def test_a_thawed_held_sandbox_paused_by_a_snapshot_still_reads_active(
    held: Kit, adopter: Kit, client: Any
) -> None:
    key, made = await held.provision("held-thawed")
    box = Box(adopter, key, made.instance_id)
    try:
        await adopter.provider.activate(ActivateRequest(**box.call))
        client.api.pause(made.instance_id)  # what a snapshot does for the moment it reads the areas
        try:
            cold = DockerProvider(state_dir=adopter.docker.state_dir, cache_tag=adopter.runner_tag, workers=2)
            try:
                assert (await cold.inspect(InspectRequest(**box.call))).state == "active"
            finally:
                cold.close()
        finally:
            client.api.unpause(made.instance_id)
    finally:
        await box.release()
    assert not [o for o in leftovers(client, adopter.runner_tag) if o[2] == key]


async def test_a_release_waits_for_a_snapshot_whose_call_was_cancelled(adopter: Kit, client: Any) -> None:
    # The snapshot's await is cancelled (a deadline) while its thread goes on reading the areas through a handle
    # it makes; the release that follows must still take the handle and the areas it holds.
    box = await adopter.up("cut-snapshot")
    await box.sh("head -c 200000 /dev/urandom > ~/blob")
    snap_key = adopter.key("cut-snap")
    task = asyncio.ensure_future(
        adopter.provider.snapshot(SnapshotRequest(**box.call, snapshot_allocation_key=snap_key))
    )
    await asyncio.sleep(0.02)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await box.release()
    try:
        assert not [o for o in leftovers(client, adopter.runner_tag) if o[2] == box.key]
    finally:
        await adopter.provider.compensate(
            CompensateRequest(
                target=adopter.target, lease=LEASE, allocation_key=snap_key, runner_tag=adopter.runner_tag
            )
        )
