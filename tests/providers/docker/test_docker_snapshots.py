"""snapshot, resume, clone and deleteSnapshot: the writable areas' contents survive; custody is labelled."""

from __future__ import annotations

import asyncio
import tarfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from docker_kit import LEASE, Box, Kit, leftovers, plans_for, resources

from checkfu.contract.checks import check_echo, check_expiry, check_new_identity
from checkfu.contract.errors import SandboxNotFound, SandboxResultInvalid, SandboxStateConflict
from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    CompensateRequest,
    DeleteSnapshotRequest,
    ListAllocationsRequest,
    ReleaseRequest,
    ResumeRequest,
    SnapshotRequest,
)
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.driver import RunSession
from checkfu.core.expiry import sweep_expired_snapshots
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.providers.docker import DockerProvider, snapshots
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.envelope import host_facts
from checkfu.testing import Misbehaving, expiry_in_the_past

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
        owner = await box.sh("stat -c %u:%g $HOME/a/b/f /tmp/t; touch $HOME/a/b/new; stat -c %u:%g $HOME/a/b/new")
        # a process runs under a group of its own, but what it makes in a restored directory is the user's group
        assert owner.stdout == b"1000:1000\n1000:1000\n1000:1000\n", owner
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
        assert not client.images.list(filters={"label": f"{L.ALLOCATION_KEY}={request.allocation_key}"})
        carrier = kit.docker.carriers.get(cloned.instance_id, kit.runner_tag).path
        assert carrier.is_file(), "the source's areas wait in the clone's carrier file"
        clone = await activate(kit, request.allocation_key, cloned.instance_id)
        try:
            assert not carrier.exists(), "consumed at activation"
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


# Snapshots that expire --------------------------------------------------------------------------


async def test_a_snapshot_asked_a_lifetime_expires_and_leaves_nothing(
    kit: Kit, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = await kit.up("expiring", files=FILES, profile=kit.profile(retention="durable"))
    try:
        key = kit.key("snap-expiring")
        asked = time.time()
        result = await kit.provider.snapshot(SnapshotRequest(**box.call, snapshot_allocation_key=key, keep_seconds=60))
        answered = time.time()
        # The provider read its clock between the two, and states the expiry to the second.
        assert int(asked + 60) <= check_expiry(result.expires_at, now=answered, keep_seconds=60) <= int(answered + 60)
        image = client.images.get(result.snapshot_id)
        assert image.labels[L.EXPIRES_AT] == result.expires_at
        assert image.labels[L.ROOT_IMAGE] == client.containers.get(box.instance_id).image.id
        assert await kit.docker.sweep_expired(kit.runner_tag) == []  # not yet
    finally:
        await box.release()  # durable: the snapshot stays
    monkeypatch.setattr(kit.docker, "wall", lambda: time.time() + 61)  # a minute on, without waiting for it
    assert await kit.docker.sweep_expired(kit.runner_tag) == [result.snapshot_id]
    assert [o for o in leftovers(client, kit.runner_tag) if o[2] == key] == []  # nothing of it is left
    with pytest.raises(SandboxNotFound):
        await kit.provider.resume(resume_request(kit, key, result.snapshot_id))


async def test_an_expired_snapshot_is_deleted_when_asked_to_resume_it(
    kit: Kit, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = await kit.up("expiring2", files=FILES, profile=kit.profile(retention="durable"))
    try:
        key = kit.key("snap-expiring2")
        result = await kit.provider.snapshot(SnapshotRequest(**box.call, snapshot_allocation_key=key, keep_seconds=5))
    finally:
        await box.release()
    monkeypatch.setattr(kit.docker, "wall", lambda: time.time() + 6)
    with pytest.raises(SandboxNotFound):
        await kit.provider.resume(resume_request(kit, key, result.snapshot_id))
    assert [o for o in leftovers(client, kit.runner_tag) if o[2] == key] == []


async def test_a_snapshot_asked_no_lifetime_is_kept(kit: Kit, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    box = await kit.up("kept", files=FILES, profile=kit.profile(retention="durable"))
    try:
        key, snap_id = await snapshot(kit, box)
    finally:
        await box.release()
    assert L.EXPIRES_AT not in client.images.get(snap_id).labels
    monkeypatch.setattr(kit.docker, "wall", lambda: time.time() + 10 * 365 * 86400)
    assert snap_id not in await kit.docker.sweep_expired(kit.runner_tag)
    assert client.images.get(snap_id)
    delete = DeleteSnapshotRequest(target=kit.target, lease=LEASE, snapshot_allocation_key=key, snapshot_id=snap_id)
    assert (await kit.provider.delete_snapshot(delete)).deleted is True


@pytest.fixture
def own_tag(provider: DockerProvider, client: Any) -> Iterator[str]:
    """A runner tag of this test's own: only its objects are counted, and any left are reclaimed (and fail it)."""
    own = "tx" + uuid.uuid4().hex[:12]
    yield own
    left = leftovers(client, own)
    for key in sorted({k for _, _, k in left}):
        asyncio.run(
            provider.compensate(
                CompensateRequest(target=provider.target, lease=LEASE, allocation_key=key, runner_tag=own)
            )
        )
    assert left == []


async def test_the_runner_deletes_an_expired_snapshot_and_refuses_a_provider_lying_about_expiry(
    provider: DockerProvider, client: Any, busybox_id: str, own_tag: str, tmp_path: Path
) -> None:
    envelope = (await provider.describe()).envelope
    assert envelope.snapshot_custody == "runner"  # the engine is on the runner's host: the runner deletes
    registry = Registry()
    registry.add(Adapter(envelope=envelope, provider=provider, source="entry point docker", in_tree=True))
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    clock = ManualClock(time.time())
    try:
        runner = Runner(registry, journal, runner_tag=own_tag, clock=clock)
        profile = SandboxProfile(
            tier="container",
            base_image=busybox_id,
            network_policy={"mode": "none"},
            resource_limits=resources(),
            retention_mode="durable",
        )
        platform = Platform(os="linux", architecture=host_facts().architecture)
        attempt = runner.start(envelope.target, profile, platform=platform)
        s = attempt.session
        image = (await s.materialize(profile, platform)).image
        inst = await s.provision(profile, platform, image)
        await s.activate(inst)
        snap = await s.snapshot(inst, keep_seconds=60)
        kept = await s.snapshot(inst)  # no lifetime: kept until deleted

        liar = RunSession(
            provider=Misbehaving(provider, {"snapshot": expiry_in_the_past}),
            envelope=envelope,
            journal=journal,
            leases=s.leases,
            lease=s.lease,
            run_id=s.run_id,
            runner_tag=own_tag,
            clock=clock,
        )
        liar.instances[inst.allocation_key] = inst
        with pytest.raises(SandboxResultInvalid) as caught:
            await liar.snapshot(inst, keep_seconds=60)
        assert caught.value.field == "expires_at"
        lied = [r for r in journal.allocations_for_run(s.run_id) if r.state == "compensated"]
        assert len(lied) == 1 and [o for o in leftovers(client, own_tag) if o[2] == lied[0].allocation_key] == []

        await s.release(inst)
        clock.advance(61)
        report = await sweep_expired_snapshots(journal, registry, clock, runner_tag=own_tag)
        assert (report.deleted, report.failed, report.skipped) == ([snap.allocation_key], {}, {})
        held = {k for _, _, k in leftovers(client, own_tag)}
        assert snap.allocation_key not in held and kept.allocation_key in held
        await s.delete_snapshot(kept)
        runner.finish(attempt, status="succeeded", exit_code=0)
        assert leftovers(client, own_tag) == []
    finally:
        journal.close()


# Every area, through one handle ------------------------------------------------------------------

EVERY_AREA = (
    "cd $HOME && mkdir -p d/e && printf h > d/e/f && printf s > setid && chmod 4755 setid && ln d/e/f hard"
    " && mkdir -p /tmp/t1 && printf t > /tmp/t1/f && ln /tmp/t1/f /tmp/hard && printf m > /dev/shm/m"
)
EVERY_CHECK = (
    "cat $HOME/d/e/f /tmp/t1/f /dev/shm/m; echo; stat -c %a $HOME/setid;"
    " [ $HOME/d/e/f -ef $HOME/hard ] && [ /tmp/t1/f -ef /tmp/hard ] && echo linked; cat /workspace/README"
)
EVERY_EXPECTED = b"htm\n755\nlinked\nhello\n"


def handles(client: Any, tag: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": [f"{L.RUNNER_TAG}={tag}", f"{L.KIND}=handle"]}))


async def test_every_area_survives_snapshot_resume_and_clone_and_no_handle_is_left(kit: Kit, client: Any) -> None:
    """Home, /tmp and /dev/shm (hard links within an area kept, set-id bits cleared) come back whole in a
    resumed snapshot and in a clone, and the sandbox's mount is staged again rather than captured. The handle
    (a never-started container on the area volumes alone, through which they are read and filled) is kept for
    the next capture and goes with its instance, its areas with it."""
    source = await kit.up("every", files=FILES, profile=kit.profile(retention="durable"))
    try:
        assert (await source.sh(EVERY_AREA)).exit_code == 0
        snap_key, snap_id = await snapshot(kit, source)
        (handle,) = handles(client, kit.runner_tag)
        assert handle.labels[L.ALLOCATION_KEY] == source.key and handle.status == "created", "never started"
        mounts = {m["Destination"]: m for m in handle.attrs["Mounts"]}
        assert sorted(mounts) == [f"/.checkfu-areas/{i}" for i in range(3)], "the areas alone, not the mount"
        areas = {m["Destination"]: m["Name"] for m in source.container().attrs["Mounts"]}
        assert [mounts[f"/.checkfu-areas/{i}"]["Name"] for i in range(3)] == [
            areas["/home/sandbox"],
            areas["/tmp"],
            areas["/dev/shm"],
        ]
        again = await snapshot(kit, source)  # the next capture reads through the same handle
        assert [h.id for h in handles(client, kit.runner_tag)] == [handle.id]
        names = client.images.get(snap_id).history()
        assert len(names) == 1, "a snapshot is one layer"
        request = resume_request(kit, snap_key, snap_id)
        resumed = await kit.provider.resume(request)
        box = await activate(kit, request.allocation_key, resumed.instance_id)
        base = kit.provision_request(kit.key("every-clone"), mounts=plans_for(FILES))
        clone_request = CloneRequest(
            **base.model_dump(), source_allocation_key=source.key, source_instance_id=source.instance_id
        )
        cloned = await kit.provider.clone(clone_request)
        clone = await activate(kit, clone_request.allocation_key, cloned.instance_id)
        owners = sorted(h.labels[L.ALLOCATION_KEY] for h in handles(client, kit.runner_tag))
        assert owners == sorted([source.key, box.key, clone.key]), "a restored instance keeps its filling handle"
        try:
            for made in (box, clone):
                r = await made.sh(EVERY_CHECK)
                assert r.stdout == EVERY_EXPECTED, (r.stdout, r.stderr)
        finally:
            await box.release()
            await clone.release()
        assert [h.labels[L.ALLOCATION_KEY] for h in handles(client, kit.runner_tag)] == [source.key]
        for key, sid in ((snap_key, snap_id), again):
            delete = DeleteSnapshotRequest(target=kit.target, lease=LEASE, snapshot_allocation_key=key, snapshot_id=sid)
            assert (await kit.provider.delete_snapshot(delete)).deleted is True
    finally:
        await source.release()
    assert handles(client, kit.runner_tag) == []
    gone = {source.key, snap_key, box.key, clone.key}
    assert [o for o in leftovers(client, kit.runner_tag) if o[2] in gone] == [], "no handle, area or image left"


async def test_a_release_by_another_provider_removes_the_handle_and_the_areas_it_holds(
    kit: Kit, client: Any, runner_tag: str, tmp_path: Path
) -> None:
    """A provider that did not make the handle (another process, or one restarted) still removes it, and the
    areas it mounts, when it releases the instance."""
    box = await kit.up("elsewhere", files=FILES)
    _, snap_id = await snapshot(kit, box)
    assert [h.labels[L.ALLOCATION_KEY] for h in handles(client, kit.runner_tag)] == [box.key]
    other = DockerProvider(state_dir=tmp_path, cache_tag=runner_tag, workers=4)
    try:
        await other.release(ReleaseRequest(**box.call))
    finally:
        other.close()
    assert [o for o in leftovers(client, kit.runner_tag) if o[2] == box.key] == []
    assert not client.images.list(filters={"label": f"{L.SOURCE_KEY}={box.key}"}), "ephemeral: its snapshot goes"
    with pytest.raises(Exception, match="No such image"):
        client.images.get(snap_id)


def test_a_capture_cut_short_makes_no_image(client: Any, runner_tag: str) -> None:
    """The archive streams into the import: when reading it fails halfway, the import's body is cut short and
    the engine makes no image of what arrived (a truncated archive is never taken for a whole snapshot)."""
    key = f"{runner_tag}-cut-{uuid.uuid4().hex[:8]}"
    labels = L.object_labels(key, runner_tag, "snapshot")
    pipe = snapshots._Pipe()
    with ThreadPoolExecutor(max_workers=1) as pool:
        importing = pool.submit(snapshots._import_from, client.api, pipe, labels)
        member = tarfile.TarInfo("home/sandbox/f")
        member.size = 1024
        pipe.write(member.tobuf(format=tarfile.PAX_FORMAT))
        pipe.write(b"x" * 1024)  # a whole entry: a body that merely ended here would be imported as an image
        pipe.fail(OSError("the archive stopped"))
        with pytest.raises(Exception) as caught:
            importing.result(timeout=60)
    assert "stopped" in repr(caught.value) + repr(caught.value.__cause__) + repr(caught.value.__context__)
    assert client.images.list(filters={"label": f"{L.ALLOCATION_KEY}={key}"}) == []


async def test_a_clone_never_activated_leaves_no_carrier_after_compensate(kit: Kit, client: Any) -> None:
    source = await kit.up("unactivated-source", files=FILES)
    try:
        assert (await source.sh(WRITE)).exit_code == 0
        base = kit.provision_request(kit.key("unactivated"), mounts=plans_for(FILES))
        request = CloneRequest(
            **base.model_dump(), source_allocation_key=source.key, source_instance_id=source.instance_id
        )
        cloned = await kit.provider.clone(request)
        carrier = kit.docker.carriers.get(cloned.instance_id, kit.runner_tag).path
        assert carrier.is_file()
        assert b"a/b/f" in carrier.read_bytes(), "the carrier holds the source's areas"
        reclaimed = await kit.provider.compensate(
            CompensateRequest(
                target=kit.target, lease=LEASE, allocation_key=request.allocation_key, runner_tag=kit.runner_tag
            )
        )
        assert reclaimed.reclaimed >= 2  # its container (with its areas) and its carrier file
        assert not carrier.exists() and not list(carrier.parent.glob(f"{cloned.instance_id}~*"))
        assert [o for o in leftovers(client, kit.runner_tag) if o[2] == request.allocation_key] == []
    finally:
        await source.release()
