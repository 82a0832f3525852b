"""The memory provider, driven member by member: every claim of its envelope, proven."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from checkfu.contract import (
    AXES,
    ActivateRequest,
    CompensateRequest,
    DeleteSnapshotRequest,
    InspectRequest,
    InstanceResult,
    ListAllocationsRequest,
    ListDirRequest,
    MountFile,
    MountPlan,
    OpenProcessRequest,
    ProcessExit,
    ProcessOutput,
    ProcessStreamEnd,
    Provider,
    ReadFilesRequest,
    ReleaseRequest,
    SandboxProviderCapabilities,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    assess,
    decode_value,
    examples,
    revalidate,
)
from checkfu.contract.checks import check_echo, sha256_digest
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxCapabilityUnavailable,
    SandboxDigestMismatch,
    SandboxEnvelopeInvalid,
    SandboxIdentityMismatch,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxPathRejected,
    SandboxStateConflict,
)
from checkfu.contract.members import DescribeResult, ExecResult
from checkfu.contract.profile import NetworkPolicy
from checkfu.testing import KILLED_EXIT, TIMEOUT_EXIT, MemoryProvider, Requests, create, memory_envelope, memory_profile

pytestmark = pytest.mark.anyio

README = b"hello\n"
RUN_SH = b"#!/bin/sh\necho run\n"


def plan(target: str = "/workspace", files: dict[str, bytes] | None = None) -> MountPlan:
    files = {"README": README, "src/run.sh": RUN_SH} if files is None else files
    return MountPlan(
        target=target,
        files=[MountFile(path=p, size=len(b), digest=sha256_digest(b)) for p, b in files.items()],
    )


CONTENT = {"/workspace/README": README, "/workspace/src/run.sh": RUN_SH}


class InstantClock:
    """Time passes only when someone sleeps; nobody waits."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)


async def image_of(p: MemoryProvider, r: Requests) -> str:
    return (await p.materialize(r.materialize())).image


async def stage(p: MemoryProvider, r: Requests, inst: InstanceResult, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        req = WriteFileRequest(**r.on(inst), path=path, size=len(data), digest=sha256_digest(data))
        await p.write_file(req, data)


async def active(p: MemoryProvider, r: Requests, key: str = "ak-1") -> InstanceResult:
    inst = await p.provision(r.provision(key, await image_of(p, r), [plan()]))
    await stage(p, r, inst, CONTENT)
    return await p.activate(ActivateRequest(**r.on(inst)))


async def run(p: MemoryProvider, r: Requests, inst: InstanceResult, *argv: str, **kw: Any) -> ExecResult:
    return await p.exec(r.exec(inst, *argv, **kw))


@pytest.fixture
def p() -> MemoryProvider:
    return MemoryProvider()


@pytest.fixture
def r(p: MemoryProvider) -> Requests:
    return Requests(p.target)


# The envelope -------------------------------------------------------------------------------


async def test_envelope_is_valid_honest_and_what_describe_returns(p: MemoryProvider) -> None:
    env = memory_envelope()
    assert revalidate(DescribeResult, await p.describe()).envelope == env
    assert env.placement == "test" and env.network_modes == ("none",)
    assert env.enforcement.not_counting() == list(AXES)  # it confines nothing
    assert len(env.declared_members()) == 17
    assert all(value for _, value in env.lifecycle_assurances)
    assert assess(env).tier == "durable"  # no allowlist egress, so not Docker parity
    assert isinstance(p, Provider)


async def test_create_factory_decodes_an_envelope() -> None:
    day_one = examples.day_one_envelope()
    assert (await create(envelope=day_one).describe()).envelope.provider == "acme-sandbox"
    assert (await create().describe()).envelope == memory_envelope()
    with pytest.raises(SandboxEnvelopeInvalid):
        create(envelope={**day_one, "snapshots": "yes"})


# The lifecycle, end to end -------------------------------------------------------------------


async def test_full_lifecycle(p: MemoryProvider, r: Requests) -> None:
    m1 = await p.materialize(r.materialize())
    m2 = await p.materialize(r.materialize())
    digest = memory_profile().digest
    expected = "sha256:" + hashlib.sha256(f"{digest} memory-images 1".encode()).hexdigest()
    assert (m1.built, m2.built, m1.image, m2.image) == (True, False, expected, expected)
    assert m1.materialization_revision == "memory-images 1" and m1.profile_digest == digest

    inst = await p.provision(r.provision("ak-1", m1.image, [plan()]))
    assert inst.state == "provisioning" and inst.instance_id.startswith("mem-")
    check_echo(inst, target=r.target, lease=r.lease, allocation_key="ak-1")
    req = WriteFileRequest(**r.on(inst), path="/workspace/README", size=len(README), digest=sha256_digest(README))
    written = await p.write_file(req, README)
    assert (written.path, written.size, written.digest) == (req.path, req.size, req.digest)
    await stage(p, r, inst, {"/workspace/src/run.sh": RUN_SH})
    act = await p.activate(ActivateRequest(**r.on(inst)))
    assert act.state == "active"

    out = await run(p, r, inst, "cat", "/workspace/README")
    assert (out.exit_code, out.stdout, out.stderr) == (0, README, b"")
    check_echo(out, target=r.target, lease=r.lease, allocation_key="ak-1", instance_id=inst.instance_id)
    assert (await run(p, r, inst, "write", "/work/notes", "before")).exit_code == 0

    read = await p.read_files(ReadFilesRequest(**r.on(inst), paths=["/workspace/README", "/nope"], max_bytes=100))
    assert [(f.path, f.data, f.digest, f.mode) for f in read.files] == [
        ("/workspace/README", README, sha256_digest(README), 0o644)
    ]
    assert read.missing == ("/nope",)
    listing = await p.list_dir(ListDirRequest(**r.on(inst), path="/workspace", recursive=True, max_entries=10))
    assert [(e.path, e.kind) for e in listing.entries] == [
        ("/workspace/README", "file"),
        ("/workspace/src", "dir"),
        ("/workspace/src/run.sh", "file"),
    ]
    assert listing.truncated is False

    snap = await p.snapshot(SnapshotRequest(**r.on(inst), snapshot_allocation_key="ak-snap"))
    assert (snap.instance_id, snap.snapshot_allocation_key) == (inst.instance_id, "ak-snap")
    assert (await run(p, r, inst, "write", "/work/notes", "after")).exit_code == 0

    resumed = await p.resume(r.resume(snap, "ak-2", m1.image))
    assert resumed.state == "provisioning" and resumed.snapshot_id == snap.snapshot_id
    assert resumed.instance_id != inst.instance_id
    await p.activate(ActivateRequest(**r.on(resumed)))
    assert (await run(p, r, resumed, "cat", "/work/notes")).stdout == b"before"

    clone = await p.clone(r.clone(inst, "ak-3", m1.image))
    assert clone.state == "provisioning" and clone.source_instance_id == inst.instance_id
    assert clone.instance_id not in (inst.instance_id, resumed.instance_id)
    await p.activate(ActivateRequest(**r.on(clone)))
    await run(p, r, clone, "write", "/work/notes", "clone")
    await run(p, r, clone, "write", "/clone-only/file", "x")
    assert b"clone-only" not in (await run(p, r, inst, "ls", "/")).stdout
    await run(p, r, inst, "write", "/work/source-only", "x")
    assert (await run(p, r, inst, "cat", "/work/notes")).stdout == b"after"
    assert (await run(p, r, clone, "cat", "/work/notes")).stdout == b"clone"
    assert (await run(p, r, clone, "cat", "/work/source-only")).exit_code == 1
    assert (await run(p, r, resumed, "cat", "/work/notes")).stdout == b"before"

    delete = DeleteSnapshotRequest(**r.call(), snapshot_allocation_key="ak-snap", snapshot_id=snap.snapshot_id)
    assert (await p.delete_snapshot(delete)).deleted is True
    assert (await p.delete_snapshot(delete)).deleted is True  # idempotent
    with pytest.raises(SandboxNotFound):
        await p.resume(r.resume(snap, "ak-4", m1.image))

    listed = await p.list_allocations(ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag))
    assert sorted((a.allocation_key, a.kind) for a in listed.allocations) == [
        ("ak-1", "instance"),
        ("ak-2", "instance"),
        ("ak-3", "instance"),
    ]
    first = await p.release(ReleaseRequest(**r.on(inst)))
    second = await p.release(ReleaseRequest(**r.on(inst)))
    assert first == second and first.state == "released" and first.destroyed is True
    assert (await p.inspect(InspectRequest(**r.on(inst)))).state == "released"
    with pytest.raises(SandboxStateConflict):
        await run(p, r, inst, "true")

    for key in ("ak-1", "ak-2", "ak-3"):
        await p.compensate(CompensateRequest(**r.call(), allocation_key=key, runner_tag=r.runner_tag))
    assert p.live_objects() == ()
    listed = await p.list_allocations(ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag))
    assert listed.allocations == ()


async def test_release_destroys_the_files_and_nothing_stays_held(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    [held] = p.live_objects()
    assert (held.kind, held.object_id, held.allocation_key) == ("instance", inst.instance_id, "ak-1")
    assert p.held_bytes() == len(README) + len(RUN_SH)
    await p.release(ReleaseRequest(**r.on(inst)))
    assert (p.live_objects(), p.held_bytes()) == ((), 0)
    with pytest.raises(SandboxStateConflict):
        await p.read_files(ReadFilesRequest(**r.on(inst), paths=["/workspace/README"], max_bytes=100))
    reclaimed = await p.compensate(CompensateRequest(**r.call(), allocation_key="ak-1", runner_tag=r.runner_tag))
    assert reclaimed.reclaimed == 0


async def test_ephemeral_release_takes_its_snapshots_durable_keeps_them() -> None:
    for retention, survives in (("ephemeral_zdr", False), ("durable", True)):
        p = MemoryProvider()
        r = Requests(p.target, profile=memory_profile(retention))
        inst = await active(p, r)
        await p.snapshot(SnapshotRequest(**r.on(inst), snapshot_allocation_key="ak-snap"))
        await p.release(ReleaseRequest(**r.on(inst)))
        assert [h.kind for h in p.live_objects()] == (["snapshot"] if survives else [])
        assert p.held_bytes() == (len(README) + len(RUN_SH) if survives else 0)


# Built-in commands ---------------------------------------------------------------------------


async def test_cat(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    both = await run(p, r, inst, "cat", "/workspace/README", "src/run.sh", cwd="/workspace")
    assert (both.exit_code, both.stdout) == (0, README + RUN_SH)
    missing = await run(p, r, inst, "cat", "/workspace/README", "/nope")
    assert (missing.exit_code, missing.stdout) == (1, README)
    assert missing.stderr == b"cat: /nope: No such file or directory\n"
    assert (await run(p, r, inst, "cat", "/workspace")).stderr == b"cat: /workspace: Is a directory\n"
    assert (await run(p, r, inst, "/bin/cat", stdin=b"piped")).stdout == b"piped"


async def test_echo_env_true_false_and_unknown(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    assert (await run(p, r, inst, "echo", "a", "b c")).stdout == b"a b c\n"
    assert (await run(p, r, inst, "env", env={"B": "2", "A": "1"})).stdout == b"A=1\nB=2\n"
    assert (await run(p, r, inst, "true")).exit_code == 0
    assert (await run(p, r, inst, "false")).exit_code == 1
    unknown = await run(p, r, inst, "sh", "-c", "true")
    assert (unknown.exit_code, unknown.stderr) == (127, b"sh: command not found\n")
    nowhere = await run(p, r, inst, "true", cwd="/nowhere")
    assert nowhere.exit_code == 127 and b"/nowhere" in nowhere.stderr


async def test_ls(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    await run(p, r, inst, "write", "/workspace-b/zeta", "")
    assert (await run(p, r, inst, "ls", "/workspace")).stdout == b"README\nsrc\n"
    assert (await run(p, r, inst, "ls", cwd="/workspace/src")).stdout == b"run.sh\n"
    assert (await run(p, r, inst, "ls", "/")).stdout == b"workspace\nworkspace-b\n"
    assert (await run(p, r, inst, "ls", "/workspace/README")).stdout == b"/workspace/README\n"
    gone = await run(p, r, inst, "ls", "/gone")
    assert (gone.exit_code, gone.stderr) == (2, b"ls: cannot access '/gone': No such file or directory\n")


async def test_sha256sum(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    out = await run(p, r, inst, "sha256sum", "/workspace/README", "/nope")
    assert out.stdout == f"{hashlib.sha256(README).hexdigest()}  /workspace/README\n".encode()
    assert (out.exit_code, out.stderr) == (1, b"sha256sum: /nope: No such file or directory\n")
    piped = await run(p, r, inst, "sha256sum", stdin=b"abc")
    assert piped.stdout == f"{hashlib.sha256(b'abc').hexdigest()}  -\n".encode()


async def test_write_is_refused_under_a_sealed_mount(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    sealed = await run(p, r, inst, "write", "/workspace/README", "overwritten")
    assert (sealed.exit_code, sealed.stderr) == (1, b"write: /workspace/README: Read-only file system\n")
    assert (await run(p, r, inst, "write", "/workspace/new", "x")).exit_code == 1
    assert (await run(p, r, inst, "cat", "/workspace/README")).stdout == README
    assert (await run(p, r, inst, "write", "/tmp")).exit_code == 0
    not_dir = await run(p, r, inst, "write", "/tmp/x", "y")
    assert (not_dir.exit_code, not_dir.stderr) == (1, b"write: /tmp/x: Not a directory\n")
    assert (await run(p, r, inst, "write", "/home/first")).exit_code == 0
    assert (await run(p, r, inst, "write", "rel", "z", cwd="/home")).exit_code == 0
    assert (await run(p, r, inst, "cat", "/home/rel")).stdout == b"z"


async def test_sleep_honours_the_timeout_on_the_injected_clock(r: Requests) -> None:
    clock = InstantClock()
    p = MemoryProvider(clock=clock)
    inst = await active(p, r)
    done = await run(p, r, inst, "sleep", "2", "0.5", timeout_ms=3000)
    assert (done.exit_code, done.timed_out, clock.t) == (0, False, 2.5)
    late = await run(p, r, inst, "sleep", "3600", timeout_ms=1000)
    assert (late.exit_code, late.timed_out, clock.t) == (TIMEOUT_EXIT, True, 3.5)
    assert (await run(p, r, inst, "sleep", "soon")).exit_code == 1
    assert (await run(p, r, inst, "sleep")).exit_code == 1


# Bounds --------------------------------------------------------------------------------------


async def test_exec_output_is_capped_per_stream(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    out = await run(p, r, inst, "cat", "/workspace/README", "/nope", max_output_bytes=4)
    assert (out.stdout, out.stdout_truncated, out.stderr, out.stderr_truncated) == (b"hell", True, b"cat:", True)
    exact = await run(p, r, inst, "echo", "abc", max_output_bytes=4)
    assert (exact.stdout, exact.stdout_truncated, exact.stderr_truncated) == (b"abc\n", False, False)


async def test_read_files_bound_and_list_dir_truncation(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    both = ["/workspace/README", "/workspace/src/run.sh"]
    fits = await p.read_files(ReadFilesRequest(**r.on(inst), paths=both, max_bytes=len(README) + len(RUN_SH)))
    assert [f.data for f in fits.files] == [README, RUN_SH]
    with pytest.raises(SandboxBoundExceeded):
        await p.read_files(ReadFilesRequest(**r.on(inst), paths=both, max_bytes=len(README) + len(RUN_SH) - 1))
    flat = await p.list_dir(ListDirRequest(**r.on(inst), path="/workspace", max_entries=1))
    assert ([e.path for e in flat.entries], flat.truncated) == (["/workspace/README"], True)
    flat = await p.list_dir(ListDirRequest(**r.on(inst), path="/workspace", max_entries=2))
    assert ([(e.path, e.size, e.mode) for e in flat.entries], flat.truncated) == (
        [("/workspace/README", len(README), 0o644), ("/workspace/src", 0, 0o755)],
        False,
    )


async def test_list_dir_answers_a_file_or_nothing_in_band(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    answers = {"/workspace": "dir", "/workspace/README": "file", "/nope": "missing", "/workspace/README/x": "missing"}
    for path, kind in answers.items():
        got = await p.list_dir(ListDirRequest(**r.on(inst), path=path, recursive=True, max_entries=10))
        assert (got.path, got.kind, got.entries == (), got.truncated) == (path, kind, kind != "dir", False)


# Refusals ------------------------------------------------------------------------------------


async def test_write_file_refusals(p: MemoryProvider, r: Requests) -> None:
    inst = await p.provision(r.provision("ak-1", await image_of(p, r), [plan()]))
    good = sha256_digest(README)
    with pytest.raises(SandboxPathRejected):
        await p.write_file(WriteFileRequest(**r.on(inst), path="/etc/passwd", size=6, digest=good), README)
    with pytest.raises(SandboxPathRejected):  # the mount target is a directory
        await p.write_file(WriteFileRequest(**r.on(inst), path="/workspace", size=6, digest=good), README)
    with pytest.raises(SandboxDigestMismatch):
        await p.write_file(WriteFileRequest(**r.on(inst), path="/workspace/README", size=5, digest=good), README)
    with pytest.raises(SandboxDigestMismatch):
        bad = sha256_digest(b"other!")
        await p.write_file(WriteFileRequest(**r.on(inst), path="/workspace/README", size=6, digest=bad), README)


async def test_state_conflicts_come_from_the_lifecycle_table(p: MemoryProvider, r: Requests) -> None:
    image = await image_of(p, r)
    inst = await p.provision(r.provision("ak-1", image, [plan()]))
    with pytest.raises(SandboxStateConflict):
        await run(p, r, inst, "true")
    with pytest.raises(SandboxStateConflict):
        await p.snapshot(SnapshotRequest(**r.on(inst), snapshot_allocation_key="s"))
    with pytest.raises(SandboxStateConflict):
        await p.clone(r.clone(inst, "ak-2", image))
    await p.activate(ActivateRequest(**r.on(inst)))
    with pytest.raises(SandboxStateConflict):
        await p.activate(ActivateRequest(**r.on(inst)))
    with pytest.raises(SandboxStateConflict):
        await stage(p, r, inst, {"/workspace/README": README})
    assert (await p.inspect(InspectRequest(**r.on(inst)))).state == "active"


async def test_identity_refusals(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    other = Requests(decode_value(SandboxProviderCapabilities, examples.day_one_envelope()).target)
    with pytest.raises(SandboxIdentityMismatch):
        await p.inspect(InspectRequest(**{**r.on(inst), "target": other.target}))
    with pytest.raises(SandboxIdentityMismatch):
        await p.materialize(other.materialize())
    with pytest.raises(SandboxNotFound):
        await p.inspect(InspectRequest(**{**r.on(inst), "instance_id": "mem-unknown"}))
    with pytest.raises(SandboxNotFound):
        await p.inspect(InspectRequest(**{**r.on(inst), "allocation_key": "ak-other"}))
    with pytest.raises(SandboxNotFound):  # a root image this provider never materialized
        await p.provision(r.provision("ak-2", "sha256:" + "0" * 64))


async def test_a_profile_it_cannot_serve_is_refused_with_every_reason(p: MemoryProvider, r: Requests) -> None:
    wants = memory_profile().model_copy(
        update={"network_policy": NetworkPolicy(mode="allowlist", allowlist=["example.com:443"])}
    )
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        await p.materialize(Requests(p.target, profile=wants).materialize())
    assert [u.field for u in caught.value.unmet] == ["profile.network_policy.mode"]
    many = [plan(f"/m{i}", {}) for i in range(65)]
    with pytest.raises(SandboxCapabilityUnavailable):
        await p.provision(r.provision("ak-1", await image_of(p, r)).model_copy(update={"mounts": tuple(many)}))


async def test_undeclared_members_are_refused_under_the_day_one_envelope() -> None:
    day_one = decode_value(SandboxProviderCapabilities, examples.day_one_envelope())
    p = MemoryProvider(day_one)
    r = Requests(day_one.target)
    inst = await active(p, r)
    assert (await run(p, r, inst, "echo", "day one")).stdout == b"day one\n"
    on = r.on(inst)
    nowhere = "sha256:" + "0" * 64
    snap = SnapshotResult(**on, snapshot_allocation_key="s", snapshot_id="x")
    refused: dict[str, Callable[[], Awaitable[object]]] = {
        "openProcess": lambda: p.open_process(OpenProcessRequest(**on, argv=["true"])),
        "readFiles": lambda: p.read_files(ReadFilesRequest(**on, paths=["/workspace/README"], max_bytes=10)),
        "listAllocations": lambda: p.list_allocations(ListAllocationsRequest(**r.call(), runner_tag="t")),
        "listDir": lambda: p.list_dir(ListDirRequest(**on, path="/", max_entries=1)),
        "snapshot": lambda: p.snapshot(SnapshotRequest(**on, snapshot_allocation_key="s")),
        "deleteSnapshot": lambda: p.delete_snapshot(
            DeleteSnapshotRequest(**r.call(), snapshot_allocation_key="s", snapshot_id="x")
        ),
        "clone": lambda: p.clone(r.clone(inst, "ak-2", nowhere)),
        "resume": lambda: p.resume(r.resume(snap, "ak-3", nowhere)),
    }
    for member, call in refused.items():
        with pytest.raises(SandboxOperationUnsupported, match=member):
            await call()
    assert p.calls[-8:] == list(refused)
    assert (await p.release(ReleaseRequest(**on))).destroyed is True


async def test_calls_are_recorded_in_order_refused_ones_included(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    with pytest.raises(SandboxNotFound):
        await p.inspect(InspectRequest(**{**r.on(inst), "instance_id": "mem-unknown"}))
    await p.describe()
    assert p.calls == ["materialize", "provision", "writeFile", "writeFile", "activate", "inspect", "describe"]


# Cold compensation ---------------------------------------------------------------------------


async def test_compensation_after_a_restart_reclaims_by_label_alone(p: MemoryProvider) -> None:
    r = Requests(p.target, profile=memory_profile("durable"))  # its snapshot outlives the instance
    inst = await active(p, r)
    await p.snapshot(SnapshotRequest(**r.on(inst), snapshot_allocation_key="ak-snap"))
    half = await p.provision(r.provision("ak-half", await image_of(p, r)))
    opened = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["sleep", "60"]))
    p.forget()
    with pytest.raises(SandboxNotFound):
        await p.inspect(InspectRequest(**r.on(inst)))
    with pytest.raises(SandboxNotFound):
        await p.inspect(InspectRequest(**r.on(half)))
    listed = await p.list_allocations(ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag))
    assert sorted((a.allocation_key, a.kind) for a in listed.allocations) == [
        ("ak-1", "instance"),
        ("ak-half", "instance"),
        ("ak-snap", "snapshot"),
    ]
    other_tag = await p.compensate(CompensateRequest(**r.call(), allocation_key="ak-1", runner_tag="someone-else"))
    assert other_tag.reclaimed == 0
    for key in ("ak-1", "ak-half", "ak-snap"):
        req = CompensateRequest(**r.call(), allocation_key=key, runner_tag=r.runner_tag)
        first, again = await p.compensate(req), await p.compensate(req)
        assert (first.reclaimed, again.reclaimed, first.allocation_key) == (1, 0, key)
        check_echo(first, target=r.target, lease=r.lease)
    assert p.live_objects() == ()
    events = [e async for e in opened.events()]
    assert events[-1] == ProcessExit(exit_code=KILLED_EXIT)


# Open processes ------------------------------------------------------------------------------


async def test_open_process_streams_stdin_to_stdout_until_stdin_closes(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    proc = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["cat"]))
    check_echo(proc.started, target=r.target, lease=r.lease, allocation_key="ak-1", instance_id=inst.instance_id)
    events = proc.events()
    await proc.send_stdin(b"one")
    assert await anext(events) == ProcessOutput(stream="out", data=b"one")
    await proc.send_stdin(b"two")
    assert await anext(events) == ProcessOutput(stream="out", data=b"two")
    await proc.close_stdin()
    with pytest.raises(SandboxStateConflict):
        await proc.send_stdin(b"three")
    rest = [e async for e in events]
    assert rest == [ProcessStreamEnd(stream="out"), ProcessStreamEnd(stream="err"), ProcessExit(exit_code=0)]


async def test_open_process_reports_stderr_and_exit_codes(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    proc = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["cat", "/workspace/README", "/nope"]))
    events = [e async for e in proc.events()]
    assert events == [
        ProcessOutput(stream="out", data=README),
        ProcessOutput(stream="err", data=b"cat: /nope: No such file or directory\n"),
        ProcessStreamEnd(stream="out"),
        ProcessStreamEnd(stream="err"),
        ProcessExit(exit_code=1),
    ]
    await proc.send_stdin(b"ignored")  # the process has exited: dropped, like a closed pipe
    await proc.kill()  # idempotent after exit


async def test_output_waits_for_the_reader(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    proc = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["cat"]))
    sent = 0

    async def feed() -> None:
        nonlocal sent
        for i in range(100):
            await proc.send_stdin(b"%d," % i)
            sent += 1

    feeding = asyncio.ensure_future(feed())
    await asyncio.sleep(0.05)
    assert 10 < sent < 40  # nobody reads the output, so the writer is held back
    events = asyncio.ensure_future(_drain(proc.events()))
    await asyncio.wait_for(feeding, timeout=5)  # the reader drains, so the writer goes on
    await proc.close_stdin()
    data = b"".join(e.data for e in await asyncio.wait_for(events, timeout=5) if isinstance(e, ProcessOutput))
    assert data == b"".join(b"%d," % i for i in range(100))


async def test_release_ends_running_processes(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    sleeper = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["sleep", "60"]))
    reader = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["cat"]))
    execing = asyncio.ensure_future(run(p, r, inst, "sleep", "60", timeout_ms=120_000))
    await asyncio.sleep(0.01)
    assert not execing.done()
    await asyncio.wait_for(p.release(ReleaseRequest(**r.on(inst))), timeout=5)
    assert (await asyncio.wait_for(execing, timeout=5)).exit_code == KILLED_EXIT
    for proc in (sleeper, reader):
        events = await asyncio.wait_for(_drain(proc.events()), timeout=5)
        assert events[-3:] == [
            ProcessStreamEnd(stream="out"),
            ProcessStreamEnd(stream="err"),
            ProcessExit(exit_code=KILLED_EXIT),
        ]


async def test_kill_ends_one_process(p: MemoryProvider, r: Requests) -> None:
    inst = await active(p, r)
    proc = await p.open_process(OpenProcessRequest(**r.on(inst), argv=["sleep", "60"]))
    await asyncio.wait_for(proc.kill(), timeout=5)
    assert (await _drain(proc.events()))[-1] == ProcessExit(exit_code=KILLED_EXIT)
    assert (await run(p, r, inst, "true")).exit_code == 0


async def _drain(events: Any) -> list[Any]:
    return [e async for e in events]
