"""The misbehaving doubles do what they say: each preset really produces its fault.

The runner's own handling is tested elsewhere; here the contract's pure checks
show that each fault is one the runner can catch, and that the work behind a
lying answer is real (so compensation by allocation key can reclaim it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

import checkfu.testing
from checkfu.contract import (
    MEMBERS,
    MESSAGES,
    ActivateRequest,
    CompensateRequest,
    DeleteSnapshotRequest,
    InspectRequest,
    InstanceResult,
    ListAllocationsRequest,
    ListDirRequest,
    Member,
    MountFile,
    MountPlan,
    OpenProcessRequest,
    ProcessExit,
    Provider,
    ReadFilesRequest,
    ReleaseRequest,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    decode,
    encode,
    revalidate,
)
from checkfu.contract.checks import (
    check_bound,
    check_echo,
    check_new_identity,
    check_returned_paths,
    check_state,
    sha256_digest,
)
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxIdentityMismatch,
    SandboxLeaseFenced,
    SandboxNotFound,
    SandboxPathRejected,
    SandboxResultInvalid,
    SandboxStateConflict,
)
from checkfu.testing import (
    PRESETS,
    MemoryProvider,
    Misbehaving,
    Misbehaviour,
    Requests,
    clone_returns_source,
    constructed_garbage,
    crash,
    dotdot_path,
    exec_over_bound,
    foreign_instance_id,
    forge_instance_id,
    hang,
    memory_profile,
    nul_path,
    overlong_path,
    release_echoes_other_instance,
    returns_held_id,
    snapshot_echoes_other_instance,
    stale_epoch,
    unasked_path,
    unknown_field,
    wrong_lease_id,
    wrong_state,
    wrong_target,
)

pytestmark = pytest.mark.anyio

DATA = b"hello\n"
MOUNT = MountPlan(target="/workspace", files=[MountFile(path="README", size=len(DATA), digest=sha256_digest(DATA))])


@dataclass
class World:
    """An honest memory provider behind a double, with instances in every state the members need."""

    mem: MemoryProvider
    m: Misbehaving
    r: Requests
    image: str
    a: InstanceResult  # active, with the mount staged
    b: InstanceResult  # active
    p: InstanceResult  # provisioning, mount not yet staged
    s: SnapshotResult  # of a

    def real_id(self, allocation_key: str) -> str:
        [held] = [h for h in self.mem.live_objects() if h.allocation_key == allocation_key]
        return held.object_id


async def world() -> World:
    mem = MemoryProvider()
    m = Misbehaving(mem)
    r = Requests(mem.target, profile=memory_profile("durable"))
    image = (await m.materialize(r.materialize())).image
    insts = []
    for key in ("ak-a", "ak-b", "ak-p"):
        inst = await m.provision(r.provision(key, image, [MOUNT]))
        if key != "ak-p":
            await stage(m, r, inst)
            inst = await m.activate(ActivateRequest(**r.on(inst)))
        insts.append(inst)
    a, b, p = insts
    s = await m.snapshot(SnapshotRequest(**r.on(a), snapshot_allocation_key="ak-snap"))
    return World(mem, m, r, image, a, b, p, s)


async def stage(m: Provider, r: Requests, inst: InstanceResult) -> None:
    req = WriteFileRequest(**r.on(inst), path="/workspace/README", size=len(DATA), digest=sha256_digest(DATA))
    await m.write_file(req, DATA)


async def invoke(w: World, member: Member) -> tuple[Any, str | None, str | None]:
    """Call ``member`` well, through the double: its answer, and the allocation key and instance id it must echo."""
    m, r = w.m, w.r
    match member:
        case "describe":
            return await m.describe(), None, None
        case "materialize":
            return await m.materialize(r.materialize()), None, None
        case "provision":
            got = await m.provision(r.provision("ak-new", w.image))
            return got, "ak-new", w.real_id("ak-new")
        case "writeFile":
            req = WriteFileRequest(**r.on(w.p), path="/workspace/README", size=len(DATA), digest=sha256_digest(DATA))
            return await m.write_file(req, DATA), "ak-p", w.p.instance_id
        case "activate":
            return await m.activate(ActivateRequest(**r.on(w.p))), "ak-p", w.p.instance_id
        case "exec":
            return await m.exec(r.exec(w.a, "true")), "ak-a", w.a.instance_id
        case "inspect":
            return await m.inspect(InspectRequest(**r.on(w.a))), "ak-a", w.a.instance_id
        case "release":
            return await m.release(ReleaseRequest(**r.on(w.b))), "ak-b", w.b.instance_id
        case "compensate":
            req = CompensateRequest(**r.call(), allocation_key="ak-none", runner_tag=r.runner_tag)
            return await m.compensate(req), "ak-none", None
        case "openProcess":
            return await m.open_process(OpenProcessRequest(**r.on(w.a), argv=["true"])), "ak-a", w.a.instance_id
        case "readFiles":
            req = ReadFilesRequest(**r.on(w.a), paths=["/workspace/README"], max_bytes=100)
            return await m.read_files(req), "ak-a", w.a.instance_id
        case "listAllocations":
            return await m.list_allocations(ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag)), None, None
        case "listDir":
            req = ListDirRequest(**r.on(w.a), path="/workspace", max_entries=10)
            return await m.list_dir(req), "ak-a", w.a.instance_id
        case "snapshot":
            req = SnapshotRequest(**r.on(w.a), snapshot_allocation_key="ak-snap-2")
            return await m.snapshot(req), "ak-a", w.a.instance_id
        case "deleteSnapshot":
            req = DeleteSnapshotRequest(**r.call(), snapshot_allocation_key="ak-snap", snapshot_id=w.s.snapshot_id)
            return await m.delete_snapshot(req), None, None
        case "clone":
            return await m.clone(r.clone(w.a, "ak-clone", w.image)), "ak-clone", w.real_id("ak-clone")
        case "resume":
            return await m.resume(r.resume(w.s, "ak-resume", w.image)), "ak-resume", w.real_id("ak-resume")
    raise AssertionError(member)


def statement(result: Any) -> Any:
    return result if not hasattr(result, "started") else result.started


def cases(*presets: Misbehaviour) -> list[Any]:
    return [pytest.param(p, member, id=f"{p.name}-{member}") for p in presets for member in sorted(p.members)]


# Every member a preset claims, really corrupted ------------------------------------------------


@pytest.mark.parametrize("member", MEMBERS)
async def test_without_rules_the_double_is_honest(member: Member) -> None:
    w = await world()
    assert isinstance(w.m, Provider)
    result, key, instance_id = await invoke(w, member)
    if member != "describe":
        check_echo(statement(result), target=w.r.target, lease=w.r.lease, allocation_key=key, instance_id=instance_id)
    revalidate(MESSAGES[member][1], statement(result))


@pytest.mark.parametrize(("preset", "member"), cases(forge_instance_id, foreign_instance_id))
async def test_instance_id_faults(preset: Misbehaviour, member: Member) -> None:
    w = await world()
    w.m.set(member, preset)
    result, key, instance_id = await invoke(w, member)
    returned = statement(result).instance_id
    with pytest.raises(SandboxIdentityMismatch):
        check_echo(statement(result), target=w.r.target, lease=w.r.lease, allocation_key=key, instance_id=instance_id)
    real = set(w.m.instance_ids)
    assert (returned in real) == (preset is foreign_instance_id)


@pytest.mark.parametrize(("preset", "member"), cases(wrong_lease_id, stale_epoch, wrong_target))
async def test_echo_faults(preset: Misbehaviour, member: Member) -> None:
    w = await world()
    w.m.set(member, preset)
    result, key, instance_id = await invoke(w, member)
    # A result carrying another lease or epoch is fenced (contract section 6), as the author kit says.
    expected = SandboxIdentityMismatch if preset is wrong_target else SandboxLeaseFenced
    with pytest.raises(expected):
        check_echo(statement(result), target=w.r.target, lease=w.r.lease, allocation_key=key, instance_id=instance_id)
    if preset is stale_epoch:
        assert statement(result).lease.lease_epoch == w.r.lease.lease_epoch - 1


@pytest.mark.parametrize(("preset", "member"), cases(unknown_field, constructed_garbage))
async def test_results_the_decoder_must_refuse(preset: Misbehaviour, member: Member) -> None:
    w = await world()
    w.m.set(member, preset)
    result, _, _ = await invoke(w, member)
    model = MESSAGES[member][1]
    forged = statement(result)
    assert isinstance(forged, model)  # it passes for the class at a glance
    with pytest.raises(SandboxResultInvalid):
        revalidate(model, forged)
    if preset is unknown_field:
        with pytest.raises(SandboxResultInvalid):
            decode(model, encode(forged))


@pytest.mark.parametrize(("preset", "member"), cases(hang, crash))
async def test_hangs_and_crashes_after_doing_the_work(preset: Misbehaviour, member: Member) -> None:
    w = await world()
    w.m.set(member, preset)
    before = len(w.mem.calls)
    with pytest.raises(TimeoutError if preset is hang else RuntimeError):
        await asyncio.wait_for(invoke(w, member), timeout=0.1)
    assert w.mem.calls[before] == member  # the honest provider was asked, and answered


# Faults that need a particular member ---------------------------------------------------------


async def test_forged_provision_id_hides_a_real_allocation_compensation_reclaims() -> None:
    w = await world()
    w.m.set("provision", forge_instance_id)
    got = await w.m.provision(w.r.provision("ak-lost", w.image))
    real = w.real_id("ak-lost")
    assert got.instance_id != real
    with pytest.raises(SandboxNotFound):
        await w.mem.inspect(InspectRequest(**w.r.on(got)))
    req = CompensateRequest(**w.r.call(), allocation_key="ak-lost", runner_tag=w.r.runner_tag)
    assert (await w.m.compensate(req)).reclaimed == 1
    assert "ak-lost" not in {h.allocation_key for h in w.mem.live_objects()}


async def test_foreign_provision_id_with_nothing_seen_allocates_a_second_real_instance() -> None:
    mem = MemoryProvider()
    m = Misbehaving(mem, {"provision": foreign_instance_id})
    r = Requests(mem.target)
    image = (await m.materialize(r.materialize())).image
    got = await m.provision(r.provision("ak-1", image))
    ids = [h.object_id for h in mem.live_objects()]
    assert len(ids) == 2 and got.instance_id in ids
    second = await m.provision(r.provision("ak-2", image))
    with pytest.raises(SandboxIdentityMismatch):
        check_new_identity("instance_id", second.instance_id, set(ids))
    reclaim = CompensateRequest(**r.call(), allocation_key="ak-1", runner_tag=r.runner_tag)
    assert (await m.compensate(reclaim)).reclaimed == 2


async def test_snapshot_echoing_another_instance() -> None:
    w = await world()
    w.m.set("snapshot", snapshot_echoes_other_instance)
    got = await w.m.snapshot(SnapshotRequest(**w.r.on(w.b), snapshot_allocation_key="ak-snap-b"))
    assert got.instance_id in w.m.instance_ids and got.instance_id != w.b.instance_id
    with pytest.raises(SandboxIdentityMismatch):
        check_echo(got, target=w.r.target, lease=w.r.lease, instance_id=w.b.instance_id)
    assert w.real_id("ak-snap-b").startswith("snap-")  # the snapshot itself is real


async def test_clone_returning_its_source() -> None:
    w = await world()
    w.m.set("clone", clone_returns_source)
    got = await w.m.clone(w.r.clone(w.a, "ak-clone", w.image))
    assert got.instance_id == w.a.instance_id
    with pytest.raises(SandboxIdentityMismatch):
        check_new_identity("instance_id", got.instance_id, {w.a.instance_id, w.b.instance_id})
    req = CompensateRequest(**w.r.call(), allocation_key="ak-clone", runner_tag=w.r.runner_tag)
    assert (await w.m.compensate(req)).reclaimed == 1


@pytest.mark.parametrize("member", ["clone", "resume"])
async def test_clone_or_resume_returning_a_held_id(member: Member) -> None:
    w = await world()
    w.m.set(member, returns_held_id)
    got, _, real = await invoke(w, member)
    held = {w.a.instance_id, w.b.instance_id, w.p.instance_id}
    assert got.instance_id in held and got.instance_id != real
    with pytest.raises(SandboxIdentityMismatch):
        check_new_identity("instance_id", got.instance_id, held)


async def test_release_echoing_another_instance() -> None:
    w = await world()
    w.m.set("release", release_echoes_other_instance)
    got = await w.m.release(ReleaseRequest(**w.r.on(w.b)))
    with pytest.raises(SandboxIdentityMismatch):
        check_echo(got, target=w.r.target, lease=w.r.lease, instance_id=w.b.instance_id)
    assert (await w.mem.inspect(InspectRequest(**w.r.on(w.b)))).state == "released"  # really released


async def test_exec_output_over_the_bound_without_the_flag() -> None:
    w = await world()
    w.m.set("exec", exec_over_bound)
    got = await w.m.exec(w.r.exec(w.a, "echo", "hi", max_output_bytes=8))
    assert (len(got.stdout), got.stdout_truncated) == (9, False)
    with pytest.raises(SandboxBoundExceeded):
        check_bound("stdout", len(got.stdout), 8)


@pytest.mark.parametrize("preset", [unasked_path, dotdot_path, nul_path, overlong_path], ids=lambda p: p.name)
@pytest.mark.parametrize("member", ["readFiles", "listDir"])
async def test_path_faults(preset: Misbehaviour, member: Member) -> None:
    w = await world()
    w.m.set(member, preset)
    got, _, _ = await invoke(w, member)
    asked = ["/workspace/README"] if member == "readFiles" else ["/workspace"]
    paths = [f.path for f in got.files] if member == "readFiles" else [e.path for e in got.entries]
    check_returned_paths("paths", paths[:-1], asked)  # the honest entries pass
    with pytest.raises(SandboxPathRejected):
        check_returned_paths("paths", paths, asked)


@pytest.mark.parametrize("member", sorted(wrong_state.members))
async def test_wrong_state(member: Member) -> None:
    w = await world()
    w.m.set(member, wrong_state)
    got, _, _ = await invoke(w, member)
    expected = "active" if member in ("activate", "inspect") else "provisioning"
    with pytest.raises(SandboxStateConflict):
        check_state(got.state, expected, member=member)


async def test_open_process_with_a_forged_start_still_runs() -> None:
    w = await world()
    w.m.set("openProcess", forge_instance_id)
    proc = await w.m.open_process(OpenProcessRequest(**w.r.on(w.a), argv=["cat", "/workspace/README"]))
    assert proc.started.instance_id != w.a.instance_id
    events = [e async for e in proc.events()]
    assert events[-1] == ProcessExit(exit_code=0)
    await proc.send_stdin(b"")
    await proc.close_stdin()
    await proc.kill()


# Rules ------------------------------------------------------------------------------------------


async def test_rules_are_per_member_and_refused_where_they_cannot_apply() -> None:
    w = await world()
    with pytest.raises(ValueError, match="exec_over_bound"):
        Misbehaving(w.mem, {"provision": exec_over_bound})
    with pytest.raises(ValueError):
        w.m.set("describe", wrong_lease_id)
    w.m.set("inspect", forge_instance_id)
    assert (await w.m.exec(w.r.exec(w.a, "true"))).instance_id == w.a.instance_id  # others stay honest
    w.m.set("inspect", None)
    assert (await w.m.inspect(InspectRequest(**w.r.on(w.a)))).instance_id == w.a.instance_id


def test_presets_are_named_and_cover_every_fault() -> None:
    assert all(name == rule.name for name, rule in PRESETS.items())
    assert len(PRESETS) == 29
    assert all(rule.members for rule in PRESETS.values())
    assert all(getattr(checkfu.testing, name) is rule for name, rule in PRESETS.items())  # each one is public
    assert set(checkfu.testing.__all__) <= set(dir(checkfu.testing))
