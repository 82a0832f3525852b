"""Snapshots of the working directory (runner custody): snapshot, resume, clone, deleteSnapshot."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from test_host_process import LEASE, OTHER_TAG, TAG, Kit, kit, make_kit

from checkfu.contract.checks import check_expiry
from checkfu.contract.errors import (
    SandboxCapabilityUnavailable,
    SandboxNotFound,
    SandboxProviderFailed,
    SandboxStateConflict,
)
from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    DeleteSnapshotRequest,
    InspectRequest,
    ResumeRequest,
    SnapshotRequest,
    SnapshotResult,
)
from checkfu.providers.host_process import HostProcessProvider, tarballs
from checkfu.providers.host_process.state import Layout

__all__ = ["kit"]


async def snap(kit: Kit, call: dict[str, Any], key: str) -> SnapshotResult:
    return await kit.provider.snapshot(SnapshotRequest(**call, snapshot_allocation_key=key))


async def resume(kit: Kit, key: str, taken: SnapshotResult, **overrides: Any) -> dict[str, Any]:
    request = ResumeRequest(
        **kit.allocating(key, **overrides),
        snapshot_allocation_key=taken.snapshot_allocation_key,
        snapshot_id=taken.snapshot_id,
    )
    result = await kit.provider.resume(request)
    assert (result.state, result.snapshot_id) == ("provisioning", taken.snapshot_id)
    call = kit.call(result)
    await kit.provider.activate(ActivateRequest(**call))
    return call


async def delete(kit: Kit, taken: SnapshotResult) -> bool:
    done = await kit.provider.delete_snapshot(
        DeleteSnapshotRequest(
            target=kit.target,
            lease=LEASE,
            snapshot_allocation_key=taken.snapshot_allocation_key,
            snapshot_id=taken.snapshot_id,
        )
    )
    assert (done.snapshot_allocation_key, done.snapshot_id) == (taken.snapshot_allocation_key, taken.snapshot_id)
    return done.deleted


@pytest.mark.anyio
async def test_a_file_written_before_the_snapshot_is_there_after_resume(kit: Kit) -> None:
    call = await kit.active("ak-src")
    await kit.sh(call, "mkdir -p d && printf 'kept' > d/f && chmod 751 d && ln -s /etc/hostname link && mkfifo fifo")
    taken = await snap(kit, call, "ak-snap")
    assert (taken.allocation_key, taken.instance_id, taken.lease) == (
        call["allocation_key"],
        call["instance_id"],
        LEASE,
    )
    await kit.sh(call, "echo later > d/f")
    await kit.release(call)  # durable: the snapshot outlives its instance
    back = await resume(kit, "ak-resumed", taken)
    assert back["instance_id"] != call["instance_id"]
    assert (await kit.run(back, "cat", "d/f")).stdout == b"kept"
    assert (await kit.run(back, "stat", "-c", "%a", "d")).stdout == b"751\n"
    assert (await kit.run(back, "readlink", "link")).stdout == b"/etc/hostname\n"
    assert (await kit.run(back, "test", "-p", "fifo")).exit_code == 0
    assert ("ak-snap", "snapshot", taken.snapshot_id) in await kit.allocations()


@pytest.mark.anyio
async def test_a_snapshot_stores_symlinks_not_what_they_point_at(kit: Kit, tmp_path: Path) -> None:
    secret = tmp_path / "outside"
    secret.write_text("not part of the instance")
    call = await kit.active("ak-link")
    await kit.run(call, "ln", "-s", str(secret), "link")
    taken = await snap(kit, call, "ak-link-snap")
    with tarfile.open(Layout(kit.provider.state_dir).snapshot_tar("ak-link-snap")) as tar:
        (member,) = [m for m in tar.getmembers() if m.name == "./link"]
        assert member.issym() and member.linkname == str(secret)
        contents = [(tar.extractfile(m) or io.BytesIO()).read() for m in tar if m.isfile()]
        assert all(b"not part of the instance" not in data for data in contents)
    assert await delete(kit, taken)


@pytest.mark.anyio
async def test_a_clone_is_independent(kit: Kit) -> None:
    source = await kit.active("ak-orig")
    await kit.sh(source, "echo shared > f")
    request = CloneRequest(
        **kit.allocating("ak-clone"),
        source_allocation_key=source["allocation_key"],
        source_instance_id=source["instance_id"],
    )
    cloned = await kit.provider.clone(request)
    assert (cloned.state, cloned.source_instance_id) == ("provisioning", source["instance_id"])
    assert cloned.instance_id != source["instance_id"]
    copy = kit.call(cloned)
    await kit.provider.activate(ActivateRequest(**copy))
    assert (await kit.run(copy, "cat", "f")).stdout == b"shared\n"
    await kit.sh(copy, "echo clone > only-in-clone; echo changed > f")
    await kit.sh(source, "echo source > only-in-source")
    assert (await kit.run(source, "cat", "f")).stdout == b"shared\n"
    assert (await kit.run(source, "test", "-e", "only-in-clone")).exit_code == 1
    assert (await kit.run(copy, "test", "-e", "only-in-source")).exit_code == 1
    assert not Layout(kit.provider.state_dir).clone_tar("ak-clone").exists()
    assert (await kit.provider.inspect(InspectRequest(**source))).state == "active"


@pytest.mark.anyio
async def test_a_clone_needs_a_live_source(kit: Kit) -> None:
    source = await kit.provisioned("ak-notyet")
    request = CloneRequest(
        **kit.allocating("ak-c2"), source_allocation_key="ak-notyet", source_instance_id=source["instance_id"]
    )
    with pytest.raises(SandboxStateConflict):
        await kit.provider.clone(request)
    missing = request.model_copy(update={"source_instance_id": "hp-missing"})
    with pytest.raises(SandboxNotFound) as refused:
        await kit.provider.clone(missing)
    assert refused.value.field == "source_instance_id"
    assert [k for k, _, _ in await kit.allocations()] == ["ak-notyet"]


@pytest.mark.anyio
async def test_snapshot_lifecycle_delete_and_foreign(kit: Kit) -> None:
    call = await kit.active("ak-life")
    taken = await snap(kit, call, "ak-life-snap")
    with pytest.raises(SandboxStateConflict) as taken_twice:
        await snap(kit, call, "ak-life-snap")
    assert taken_twice.value.field == "snapshot_allocation_key"
    with pytest.raises(SandboxNotFound):  # another runner's tag: a foreign snapshot
        await resume(kit, "ak-foreign", taken, runner_tag=OTHER_TAG)
    wrong_id = taken.model_copy(update={"snapshot_id": "hs-forged"})
    with pytest.raises(SandboxNotFound):
        await resume(kit, "ak-forged", wrong_id)
    with pytest.raises(SandboxNotFound):
        await delete(kit, wrong_id)
    assert await delete(kit, taken) is True
    assert await delete(kit, taken) is False
    assert not Layout(kit.provider.state_dir).snapshot_tar("ak-life-snap").exists()
    with pytest.raises(SandboxNotFound):
        await resume(kit, "ak-deleted", taken)
    assert [kind for _, kind, _ in await kit.allocations()] == ["instance"]


@pytest.mark.anyio
async def test_snapshot_needs_an_active_instance(kit: Kit) -> None:
    call = await kit.provisioned("ak-early")
    with pytest.raises(SandboxStateConflict):
        await snap(kit, call, "ak-early-snap")
    assert not Layout(kit.provider.state_dir).snapshot_label("ak-early-snap").exists()


@pytest.mark.anyio
async def test_resume_refuses_a_profile_it_cannot_serve_before_reading_the_snapshot(kit: Kit) -> None:
    call = await kit.active("ak-r0")
    taken = await snap(kit, call, "ak-r0-snap")
    confined = kit.profile(network_policy={"mode": "none"})
    with pytest.raises(SandboxCapabilityUnavailable) as refused:
        await resume(kit, "ak-r1", taken, profile=confined)
    assert refused.value.field == "profile.network_policy.mode"
    assert [k for k, _, _ in await kit.allocations()] == ["ak-r0", "ak-r0-snap"]


@pytest.mark.anyio
async def test_compensate_reclaims_a_snapshot_cold(kit: Kit) -> None:
    call = await kit.active("ak-s")
    taken = await snap(kit, call, "ak-s-snap")
    layout = Layout(kit.provider.state_dir)
    fresh = HostProcessProvider(state_dir=kit.provider.state_dir)
    assert await kit.compensate("ak-s-snap", OTHER_TAG, provider=fresh) == 0
    assert await kit.compensate("ak-s-snap", TAG, provider=fresh) == 1
    assert not layout.snapshot_tar("ak-s-snap").exists()
    assert not layout.snapshot_label("ak-s-snap").exists()
    with pytest.raises(SandboxNotFound):
        await resume(make_kit(fresh), "ak-s2", taken)


@pytest.mark.anyio
async def test_a_snapshot_that_fails_leaves_nothing(kit: Kit) -> None:
    call = await kit.active("ak-fail")
    workdir = Layout(kit.provider.state_dir).workdir("ak-fail")
    workdir.rename(workdir.with_name("gone"))  # the working directory vanished under the provider
    try:
        with pytest.raises(SandboxProviderFailed):
            await snap(kit, call, "ak-fail-snap")
    finally:
        workdir.with_name("gone").rename(workdir)
    layout = Layout(kit.provider.state_dir)
    assert not layout.snapshot_label("ak-fail-snap").exists()
    assert not layout.snapshot_partial("ak-fail-snap").exists()


@pytest.mark.anyio
async def test_a_snapshot_holds_still_while_the_instance_writes(kit: Kit) -> None:
    """With cgroups the instance is frozen while its tarball is written; the tarball is whole either way."""
    call = await kit.active("ak-busy")
    await kit.sh(call, "i=0; while :; do i=$((i+1)); echo $i > count; echo $i >> log; done >/dev/null 2>&1 &")
    for n in range(3):
        taken = await snap(kit, call, f"ak-busy-{n}")
        with tarfile.open(Layout(kit.provider.state_dir).snapshot_tar(f"ak-busy-{n}")) as tar:
            names = tar.getnames()
            assert "./log" in names
            for member in tar:
                if member.isfile():
                    assert len((tar.extractfile(member) or io.BytesIO()).read()) == member.size
        assert await delete(kit, taken)


def test_extraction_refuses_a_member_outside_the_working_directory(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tarfile.TarError):
        tarballs.extract(evil, dest)
    assert not (tmp_path / "escaped").exists()


@pytest.mark.anyio
async def test_a_snapshot_asked_a_lifetime_states_its_expiry(kit: Kit) -> None:
    # Runner custody: the provider states the expiry, the runner deletes the snapshot once it passes.
    call = await kit.active("ak-src")
    asked = time.time()
    taken = await kit.provider.snapshot(SnapshotRequest(**call, snapshot_allocation_key="ak-snap", keep_seconds=90))
    assert check_expiry(taken.expires_at, now=time.time(), keep_seconds=90) == int(asked + 90)
    forever = await snap(kit, call, "ak-snap-2")
    assert forever.expires_at is None
    assert await delete(kit, taken) and await delete(kit, forever)
    await kit.release(call)
