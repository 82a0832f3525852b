"""snapshot, resume, clone and deleteSnapshot: the writable areas' contents survive; custody is labelled."""

from __future__ import annotations

from typing import Any

import pytest
from docker_kit import LEASE, Box, Kit, plans_for

from checkfu.contract.checks import check_echo, check_new_identity
from checkfu.contract.errors import SandboxNotFound, SandboxStateConflict
from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    CompensateRequest,
    DeleteSnapshotRequest,
    ListAllocationsRequest,
    ResumeRequest,
    SnapshotRequest,
)
from checkfu.providers.docker import labels as L

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

WRITE = (
    "cd $HOME && mkdir -p a/b && printf home > a/b/f && chmod 640 a/b/f && ln -s a/b/f link"
    " && printf tmp > /tmp/t && printf shm > /dev/shm/s"
)
CHECK = "cat $HOME/a/b/f /tmp/t /dev/shm/s; stat -c %a $HOME/a/b/f; readlink $HOME/link; cat /workspace/README"
EXPECTED = b"hometmpshm640\na/b/f\nhello\n"
FILES = {"/workspace/README": b"hello\n"}


async def snapshot(kit: Kit, box: Box) -> tuple[str, str]:
    key = kit.key("snap")
    result = await kit.provider.snapshot(SnapshotRequest(**box.call, snapshot_allocation_key=key))
    check_echo(result, target=kit.target, lease=LEASE, allocation_key=box.key, instance_id=box.instance_id)
    assert result.snapshot_allocation_key == key
    return key, result.snapshot_id


def resume_request(kit: Kit, snap_key: str, snap_id: str, **over: Any) -> ResumeRequest:
    base = kit.provision_request(kit.key("resumed"), mounts=plans_for(FILES), profile=kit.profile(retention="durable"))
    fields = {**base.model_dump(), "snapshot_allocation_key": snap_key, "snapshot_id": snap_id, **over}
    return ResumeRequest(**fields)


async def activate(kit: Kit, key: str, instance_id: str) -> Box:
    box = Box(kit, key, instance_id)
    await kit.stage(box.call, FILES)
    await kit.provider.activate(ActivateRequest(**box.call))
    return box


async def test_resume_restores_every_writable_area(kit: Kit, client: Any) -> None:
    source = await kit.up("durable", files=FILES, profile=kit.profile(retention="durable"))
    assert (await source.sh(WRITE)).exit_code == 0
    snap_key, snap_id = await snapshot(kit, source)
    image = client.images.get(snap_id)
    assert image.labels[L.ALLOCATION_KEY] == snap_key and image.labels[L.RUNNER_TAG] == kit.runner_tag
    assert image.labels[L.KIND] == "snapshot" and image.labels[L.SOURCE_KEY] == source.key
    await source.sh("rm -rf $HOME/a /tmp/t")
    await source.release()
    assert client.images.get(snap_id), "a durable release keeps the snapshot"
    request = resume_request(kit, snap_key, snap_id)
    resumed = await kit.provider.resume(request)
    check_echo(resumed, target=kit.target, lease=LEASE, allocation_key=request.allocation_key)
    assert resumed.state == "provisioning" and resumed.snapshot_id == snap_id
    check_new_identity("instance_id", resumed.instance_id, {source.instance_id})
    box = await activate(kit, request.allocation_key, resumed.instance_id)
    try:
        r = await box.sh(CHECK)
        assert r.stdout == EXPECTED, r.stderr
        owner = await box.sh("stat -c %u:%g $HOME/a/b/f /tmp/t")
        assert owner.stdout == b"1000:1000\n1000:1000\n"
    finally:
        await box.release()
    delete = DeleteSnapshotRequest(
        target=kit.target, lease=LEASE, snapshot_allocation_key=snap_key, snapshot_id=snap_id
    )
    assert (await kit.provider.delete_snapshot(delete)).deleted is True
    assert (await kit.provider.delete_snapshot(delete)).deleted is False
    with pytest.raises(SandboxNotFound):
        await kit.provider.resume(resume_request(kit, snap_key, snap_id))


async def test_clone_is_independent(kit: Kit, client: Any) -> None:
    source = await kit.up("origin", files=FILES)
    try:
        await source.sh(WRITE)
        base = kit.provision_request(kit.key("clone"), mounts=plans_for(FILES))
        request = CloneRequest(
            **base.model_dump(), source_allocation_key=source.key, source_instance_id=source.instance_id
        )
        cloned = await kit.provider.clone(request)
        assert cloned.source_instance_id == source.instance_id and cloned.state == "provisioning"
        check_new_identity("instance_id", cloned.instance_id, {source.instance_id})
        carriers = client.images.list(filters={"label": f"{L.ALLOCATION_KEY}={request.allocation_key}"})
        assert len(carriers) == 1
        clone = await activate(kit, request.allocation_key, cloned.instance_id)
        try:
            assert not client.images.list(filters={"label": f"{L.ALLOCATION_KEY}={request.allocation_key}"})
            assert (await clone.sh(CHECK)).stdout == EXPECTED
            await clone.sh("printf c > $HOME/only-clone; printf x > /tmp/t")
            await source.sh("printf s > $HOME/only-source")
            assert (await source.sh("ls $HOME; cat /tmp/t")).stdout.split() == [b"a", b"link", b"only-source", b"tmp"]
            assert (await clone.sh("ls $HOME; cat /tmp/t")).stdout.split() == [b"a", b"link", b"only-clone", b"x"]
        finally:
            await clone.release()
    finally:
        await source.release()


async def test_foreign_or_unknown_snapshots_are_refused(kit: Kit) -> None:
    box = await kit.up("owner", files=FILES)
    try:
        snap_key, snap_id = await snapshot(kit, box)
        with pytest.raises(SandboxNotFound):
            await kit.provider.resume(resume_request(kit, kit.key("other"), snap_id))
        with pytest.raises(SandboxNotFound):
            await kit.provider.resume(resume_request(kit, snap_key, snap_id, runner_tag=kit.runner_tag + "x"))
        with pytest.raises(SandboxNotFound):
            await kit.provider.resume(resume_request(kit, snap_key, "sha256:" + "0" * 64))
        with pytest.raises(SandboxNotFound):
            await kit.provider.delete_snapshot(
                DeleteSnapshotRequest(
                    target=kit.target, lease=LEASE, snapshot_allocation_key=kit.key("x"), snapshot_id=snap_id
                )
            )
        listing = await kit.provider.list_allocations(
            ListAllocationsRequest(target=kit.target, lease=LEASE, runner_tag=kit.runner_tag)
        )
        assert {(a.allocation_key, a.kind) for a in listing.allocations} >= {
            (snap_key, "snapshot"),
            (box.key, "instance"),
        }
        reclaimed = await kit.provider.compensate(
            CompensateRequest(target=kit.target, lease=LEASE, allocation_key=snap_key, runner_tag=kit.runner_tag)
        )
        assert reclaimed.reclaimed == 1
    finally:
        await box.release()


async def test_ephemeral_release_leaves_no_snapshot_bytes(kit: Kit, client: Any) -> None:
    box = await kit.up("zdr", files=FILES)
    await box.sh(WRITE)
    _, snap_id = await snapshot(kit, box)
    assert client.images.get(snap_id)
    await box.release()
    assert not client.images.list(filters={"label": f"{L.SOURCE_KEY}={box.key}"})
    with pytest.raises(SandboxStateConflict):
        await kit.provider.snapshot(SnapshotRequest(**box.call, snapshot_allocation_key=kit.key("late")))
