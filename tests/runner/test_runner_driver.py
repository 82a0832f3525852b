"""The checked driver: the transition table, declared members only, deadlines, strict decoding, every echo.

The full lifecycle runs against the memory provider with a real directory mount and a
real Git mount; every member call lands in the journal with its duration and outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract import examples as ex
from checkfu.contract.codec import decode_value
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxIdentityMismatch,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxPathRejected,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxResultInvalid,
    SandboxStateConflict,
)
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.contract.vocabulary import Platform
from checkfu.core import session as session_module
from checkfu.core.driver import Instance, Limits, RunSession, Snapshot
from checkfu.core.mounts import DirectorySource, GitSource, MountSpec, ResolvedMount, resolve_mount
from checkfu.testing import Misbehaving, crash, hang, memory_profile, unknown_field

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["in-process", "wire"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every lifecycle test runs against the provider in-process and behind the wire."""
    return str(request.param)


AMD64 = Platform(os="linux", architecture="amd64")
PROFILE = memory_profile()


def day_one() -> SandboxProviderCapabilities:
    return decode_value(SandboxProviderCapabilities, ex.day_one_envelope())


async def provisioned(session: RunSession, mounts: list[ResolvedMount] | None = None) -> tuple[Instance, str]:
    image = (await session.materialize(PROFILE, AMD64)).image
    inst = await session.provision(PROFILE, AMD64, image, mounts or [])
    if mounts:
        await session.stage(inst, mounts)
    return inst, image


async def active(session: RunSession, mounts: list[ResolvedMount] | None = None) -> tuple[Instance, str]:
    inst, image = await provisioned(session, mounts)
    await session.activate(inst)
    return inst, image


# The happy path -----------------------------------------------------------------------------


async def test_the_whole_lifecycle(rig: Any, workspace: Path, git_repo: Any) -> None:
    rig.profile = memory_profile("durable")
    profile = rig.profile
    session = rig.start(mount_count=2)
    mounts = [
        resolve_mount(MountSpec(DirectorySource(workspace), "/workspace")),
        resolve_mount(MountSpec(GitSource(git_repo.path, "v1"), "/code")),
    ]
    mat = await session.materialize(profile, AMD64)
    assert mat.profile_digest == profile.digest
    inst = await session.provision(profile, AMD64, mat.image, mounts)
    assert inst.state == "provisioning" and inst.mount_roots == ("/workspace", "/code")
    staged = await session.stage(inst, mounts)
    assert staged == sum(m.plan.total_bytes for m in mounts)
    await session.activate(inst)
    assert inst.state == "active"

    readme = (workspace / "README").read_bytes()
    out = await session.exec(inst, ["cat", "/workspace/README"], timeout=5)
    assert (out.exit_code, out.stdout, out.stderr) == (0, readme, b"")
    out = await session.exec(inst, ["cat", "/code/data.bin"], timeout=5)
    assert out.stdout == git_repo.files["data.bin"]

    got = await session.read_files(inst, ["/code/tool.py", "/workspace/src/run.sh", "/workspace/absent"])
    assert {f.path: f.data for f in got.files} == {
        "/code/tool.py": git_repo.files["tool.py"],
        "/workspace/src/run.sh": (workspace / "src" / "run.sh").read_bytes(),
    }
    assert {f.path: f.mode for f in got.files} == {"/code/tool.py": 0o755, "/workspace/src/run.sh": 0o755}
    assert got.missing == ("/workspace/absent",)

    listing = await session.list_dir(inst, "/code", recursive=True)
    files = {e.path for e in listing.entries if e.kind == "file"}
    assert files == {f"/code/{name}" for name in git_repo.files}

    assert (await session.exec(inst, ["write", "/scratch/before", "snapshotted"], timeout=5)).exit_code == 0
    snap = await session.snapshot(inst)
    assert (await session.exec(inst, ["write", "/scratch/after", "not in the snapshot"], timeout=5)).exit_code == 0

    resumed = await session.resume(snap, profile, AMD64, mat.image)
    assert resumed.instance_id not in (inst.instance_id, snap.snapshot_id)
    await session.activate(resumed)
    assert (await session.exec(resumed, ["cat", "/scratch/before"], timeout=5)).stdout == b"snapshotted"
    assert (await session.exec(resumed, ["cat", "/scratch/after"], timeout=5)).exit_code == 1

    clone = await session.clone(inst, profile, AMD64, mat.image)
    assert clone.instance_id not in {inst.instance_id, resumed.instance_id}
    await session.activate(clone)
    await session.exec(clone, ["write", "/scratch/clone-only", "x"], timeout=5)
    await session.exec(inst, ["write", "/scratch/source-only", "y"], timeout=5)
    assert (await session.exec(inst, ["cat", "/scratch/clone-only"], timeout=5)).exit_code == 1
    assert (await session.exec(clone, ["cat", "/scratch/source-only"], timeout=5)).exit_code == 1
    assert (await session.exec(clone, ["cat", "/workspace/README"], timeout=5)).stdout == readme

    assert (await session.inspect(inst)).state == "active"
    deleted = await session.delete_snapshot(snap)
    assert deleted.deleted and snap.deleted
    for i in (clone, resumed, inst):
        released = await session.release(i)
        assert released.instance_id == i.instance_id and i.state == "released"
    assert (await session.inspect(inst)).state == "released"
    assert rig.memory.live_objects() == ()

    rows = {r.allocation_key: r for r in rig.journal.allocations_for_run(session.run_id)}
    assert {r.kind: r.state for r in rows.values()} == {
        "instance": "released",
        "snapshot": "released",
        "resume": "released",
        "clone": "released",
    }
    assert rows[resumed.allocation_key].parent_key == snap.allocation_key
    assert rows[clone.allocation_key].parent_key == inst.allocation_key

    events = rig.journal.events_for_run(session.run_id)[1:]
    assert [e.member for e in events] == rig.memory.calls
    assert all(e.outcome == "ok" and e.duration_ms >= 0 for e in events)
    expected = {
        "materialize", "provision", "writeFile", "activate", "exec", "readFiles", "listDir",
        "snapshot", "resume", "clone", "inspect", "deleteSnapshot", "release",
    }  # fmt: skip
    assert {e.member for e in events} == expected
    assert sum(e.member == "writeFile" for e in events) == 2 + len(git_repo.files)


async def test_stage_reports_progress_and_release_all_winds_up(rig: Any, workspace: Path) -> None:
    session = rig.start(mount_count=1)
    mounts = [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))]
    other, image = await provisioned(session)
    inst = await session.provision(PROFILE, AMD64, image, mounts)
    progress: list[tuple[int, int]] = []
    await session.stage(inst, mounts, progress=lambda d, t: progress.append((d, t)))
    total = mounts[0].plan.total_bytes
    assert progress == [(mounts[0].plan.files[0].size, total), (total, total)]
    await session.activate(inst)
    await session.release_all()  # one provisioning and one active instance
    assert rig.memory.live_objects() == ()
    assert inst.state == other.state == "released"
    assert {r.state for r in rig.journal.allocations_for_run(session.run_id)} == {"released"}


# Declared members only --------------------------------------------------------------------------


UNDECLARED_ON_DAY_ONE = [
    "snapshot",
    "readFiles",
    "listDir",
    "openProcess",
    "clone",
    "resume",
    "deleteSnapshot",
    "listAllocations",
]


@pytest.mark.parametrize("member", UNDECLARED_ON_DAY_ONE)
async def test_the_day_one_envelope_is_never_asked_for_what_it_does_not_declare(make_rig: Any, member: str) -> None:
    rig = make_rig(envelope=day_one())
    session = rig.start()
    inst, image = await active(session)
    before = list(rig.memory.calls)
    snap = Snapshot(allocation_key="ak-x", snapshot_id="snap-x", source=inst)
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "snapshot": lambda: session.snapshot(inst),
        "readFiles": lambda: session.read_files(inst, ["/etc/hostname"]),
        "listDir": lambda: session.list_dir(inst, "/"),
        "openProcess": lambda: session.open_process(inst, ["true"]),
        "clone": lambda: session.clone(inst, PROFILE, AMD64, image),
        "resume": lambda: session.resume(snap, PROFILE, AMD64, image),
        "deleteSnapshot": lambda: session.delete_snapshot(snap),
        "listAllocations": session.list_allocations,
    }
    with pytest.raises(SandboxOperationUnsupported) as caught:
        await calls[member]()
    assert caught.value.field == member
    assert rig.memory.calls == before  # the provider was not called at all, not even to compensate
    assert [r.allocation_key for r in rig.journal.allocations_for_run(session.run_id)] == [inst.allocation_key]
    (event,) = [e for e in rig.journal.events_for_run(session.run_id) if e.outcome == "error"]
    assert (event.member, event.error_code) == (member, "SandboxOperationUnsupported")
    # The one-shot floor still works: exec, then release.
    assert (await session.exec(inst, ["echo", "hi"], timeout=5)).stdout == b"hi\n"
    await session.release_all()
    assert rig.memory.live_objects() == ()
    assert all(r.state in ("released", "compensated") for r in rig.journal.allocations_for_run(session.run_id))


# The transition table ---------------------------------------------------------------------------


async def test_wrong_state_calls_never_reach_the_provider(rig: Any, workspace: Path) -> None:
    session = rig.start(mount_count=1)
    mounts = [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))]
    inst, image = await provisioned(session, mounts)
    conflicts: list[Callable[[], Awaitable[Any]]] = [  # provisioning: nothing that needs an active instance
        lambda: session.exec(inst, ["true"], timeout=5),
        lambda: session.read_files(inst, ["/workspace/README"]),
        lambda: session.list_dir(inst, "/workspace"),
        lambda: session.snapshot(inst),
        lambda: session.clone(inst, PROFILE, AMD64, image),
        lambda: session.open_process(inst, ["true"]),
    ]
    await _all_conflict(rig, conflicts)
    await session.activate(inst)
    await _all_conflict(
        rig,
        [  # active: no more staging, no second activation
            lambda: session.activate(inst),
            lambda: session.write_file(inst, "/workspace/late", b"x"),
        ],
    )
    snap = await session.snapshot(inst)
    await session.release(inst)
    await _all_conflict(
        rig,
        [  # released: only inspect, release and compensate remain
            lambda: session.exec(inst, ["true"], timeout=5),
            lambda: session.activate(inst),
            lambda: session.write_file(inst, "/workspace/late", b"x"),
            lambda: session.snapshot(inst),
            lambda: session.clone(inst, PROFILE, AMD64, image),
            lambda: session.read_files(inst, ["/workspace/README"]),
        ],
    )
    await session.release(inst)  # released -> released is in the table: idempotent
    await session.delete_snapshot(snap)
    await _all_conflict(rig, [lambda: session.resume(snap, PROFILE, AMD64, image)])
    assert rig.memory.live_objects() == ()


async def _all_conflict(rig: Any, calls: list[Callable[[], Awaitable[Any]]]) -> None:
    for call in calls:
        before = list(rig.memory.calls)
        with pytest.raises(SandboxStateConflict):
            await call()
        assert rig.memory.calls == before


# Paths the runner sends ---------------------------------------------------------------------------


async def test_request_paths_are_admitted_before_the_provider_is_asked(rig: Any, workspace: Path) -> None:
    session = rig.start(mount_count=1)
    mounts = [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))]
    inst, _ = await provisioned(session, mounts)
    before = list(rig.memory.calls)
    for path in ("/elsewhere/file", "/workspace/../etc/passwd", "relative", "/workspace//x", "/workspace/a\x00b"):
        with pytest.raises(SandboxPathRejected):
            await session.write_file(inst, path, b"x")
    await session.activate(inst)
    before = list(rig.memory.calls)
    for bad in ("/a/../b", "", "/a/./b", "/" + "a" * 5000):
        with pytest.raises(SandboxPathRejected):
            await session.read_files(inst, ["/workspace/README", bad])
        with pytest.raises(SandboxPathRejected):
            await session.list_dir(inst, bad)
    assert rig.memory.calls == before
    await session.release_all()


# Deadlines, decoding and failures -------------------------------------------------------------------


async def test_a_hang_is_a_timeout_and_the_instance_is_reclaimed(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving, limits=Limits(deadlines={"inspect": 0.2}))
    session = rig.start()
    inst, _ = await active(session)
    rig.provider.set("inspect", hang)
    with pytest.raises(SandboxProviderTimeout) as caught:
        await session.inspect(inst)
    assert caught.value.field == "inspect" and caught.value.retryable
    assert rig.memory.calls[-2:] == ["inspect", "compensate"]
    assert rig.memory.live_objects() == () and inst.state == "released"
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "compensated"
    event = next(e for e in rig.journal.events_for_run(session.run_id) if e.member == "inspect")
    assert event.error_code == "SandboxProviderTimeout" and 150 <= event.duration_ms < 5000


async def test_exec_deadline_adds_the_commands_own_timeout(make_rig: Any) -> None:
    rig = make_rig(limits=Limits(deadlines={"exec": 0.05}))
    session = rig.start()
    inst, _ = await active(session)
    # The command sleeps 0.3 s: longer than the member's figure, within figure + its own timeout.
    out = await session.exec(inst, ["sleep", "0.3"], timeout=2)
    assert out.exit_code == 0 and not out.timed_out
    await session.release_all()


async def test_an_unknown_field_is_refused_by_the_decoder(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    session = rig.start()
    inst, _ = await active(session)
    rig.provider.set("exec", unknown_field)
    with pytest.raises(SandboxResultInvalid):
        await session.exec(inst, ["true"], timeout=5)
    assert rig.memory.live_objects() == ()


async def test_a_foreign_exception_becomes_provider_failed(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    session = rig.start()
    inst, _ = await active(session)
    rig.provider.set("exec", crash)
    with pytest.raises(SandboxProviderFailed) as caught:
        await session.exec(inst, ["true"], timeout=5)
    assert "RuntimeError" in caught.value.message and type(caught.value) is SandboxProviderFailed
    assert rig.memory.live_objects() == ()


async def test_an_error_a_provider_raises_is_its_fault_and_reclaims(make_rig: Any) -> None:
    """Whatever code a provider raises, it has failed: the runner reports a provider failure naming the
    code, and reclaims the instance by key (the matrix over every member and code is in the misbehaviour tests)."""

    def wrap(memory: Any) -> Any:
        class Raising(Misbehaving):
            async def inspect(self, request: Any) -> Any:
                raise SandboxNotFound("no such instance", field="instance_id")

        return Raising(memory)

    rig = make_rig(wrap=wrap)
    session = rig.start()
    inst, _ = await active(session)
    with pytest.raises(SandboxProviderFailed) as caught:
        await session.inspect(inst)
    assert caught.value.reported_code == "SandboxNotFound"
    assert "SandboxNotFound" in caught.value.message
    assert inst.state == "released" and inst.allocation_key not in rig.held_keys()
    assert rig.journal.allocation(inst.allocation_key).state == "compensated"
    await session.release_all()
    assert rig.memory.live_objects() == ()


class PeerNotFound(SandboxNotFound):
    """A peer's subclass: its wire code is its own name, which the table does not hold."""


async def test_a_peers_subclass_is_rebuilt_from_the_table(make_rig: Any) -> None:
    def wrap(memory: Any) -> Any:
        class Raising(Misbehaving):
            async def inspect(self, request: Any) -> Any:
                raise PeerNotFound("gone", field="instance_id")

        return Raising(memory)

    rig = make_rig(wrap=wrap)
    session = rig.start()
    inst, _ = await active(session)
    with pytest.raises(SandboxProviderFailed) as caught:
        await session.inspect(inst)
    assert type(caught.value) is SandboxProviderFailed and "PeerNotFound" in caught.value.message
    await session.release_all()
    assert rig.memory.live_objects() == ()


async def test_output_over_the_runners_bound_is_refused(make_rig: Any) -> None:
    rig = make_rig(limits=Limits(max_output_bytes=8))
    session = rig.start()
    inst, _ = await active(session)
    # An honest provider truncates to the bound the runner sent, and says so.
    out = await session.exec(inst, ["echo", "0123456789abcdef"], timeout=5)
    assert out.stdout == b"01234567" and out.stdout_truncated
    await session.release_all()


async def test_list_dir_over_the_entry_bound(make_rig: Any, workspace: Path) -> None:
    rig = make_rig(limits=Limits(max_list_entries=1))
    session = rig.start(mount_count=1)
    inst, _ = await active(session, [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))])
    listing = await session.list_dir(inst, "/workspace", recursive=True)
    assert len(listing.entries) == 1 and listing.truncated
    await session.release_all()


async def test_read_files_bound_is_sent_and_honoured(make_rig: Any, workspace: Path) -> None:
    rig = make_rig(limits=Limits(max_read_bytes=4))
    session = rig.start(mount_count=1)
    inst, _ = await active(session, [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))])
    with pytest.raises(SandboxProviderFailed) as caught:  # the provider refused to go over it
        await session.read_files(inst, ["/workspace/README"])
    assert caught.value.reported_code == "SandboxBoundExceeded"
    # a refusal the contract lists for readFiles is about the request: the instance is kept (issue 29), and usable
    assert rig.memory.calls[-1] == "readFiles" and inst.state == "active"
    assert (await session.read_files(inst, ["/workspace/none"])).missing == ("/workspace/none",)
    await session.release_all()
    assert rig.memory.calls[-1] == "release"
    assert rig.memory.live_objects() == ()


async def test_open_process_events(rig: Any) -> None:
    session = rig.start()
    inst, _ = await active(session)
    proc = await session.open_process(inst, ["cat"])
    assert proc.started.instance_id == inst.instance_id
    await proc.send_stdin(b"ping")
    await proc.close_stdin()
    out = b""
    code = None
    async for event in proc.events():
        if isinstance(event, ProcessOutput):
            out += event.data
        elif isinstance(event, ProcessExit):
            code = event.exit_code
    assert (out, code) == (b"ping", 0)
    await session.release_all()


async def test_identity_echo_on_a_foreign_allocation_key(make_rig: Any) -> None:
    from checkfu.testing import corrupting  # noqa: PLC0415

    other_key = corrupting(
        "other_key", {"exec"}, lambda r, inv: r.model_copy(update={"allocation_key": "ak-someone-else"})
    )
    rig = make_rig(wrap=Misbehaving)
    session = rig.start()
    inst, _ = await active(session)
    rig.provider.set("exec", other_key)
    with pytest.raises(SandboxIdentityMismatch) as caught:
        await session.exec(inst, ["true"], timeout=5)
    assert caught.value.field == "allocation_key"
    assert rig.memory.live_objects() == ()


async def test_a_cancelled_allocation_is_compensated_before_the_cancellation_propagates(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    session = rig.start()
    image = (await session.materialize(PROFILE, AMD64)).image
    rig.provider.set("provision", hang)  # allocates, then never answers
    task = asyncio.create_task(session.provision(PROFILE, AMD64, image))
    for _ in range(200):
        await asyncio.sleep(0.005)
        if rig.memory.live_objects():
            break
    assert len(rig.memory.live_objects()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.memory.live_objects() == ()
    (row,) = rig.journal.allocations_for_run(session.run_id)
    assert row.state == "compensated"


async def test_stage_hashes_a_directory_file_once_and_the_provider_still_checks_it(
    rig: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging reads a directory file again and checks its SHA-256 against the plan; that digest goes into the
    writeFile request as it is (the request is not hashed a second time), and the provider checks it itself."""
    session = rig.start(mount_count=1)
    mounts = [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))]
    _, image = await provisioned(session)
    inst = await session.provision(PROFILE, AMD64, image, mounts)
    hashed: list[int] = []
    original = session_module.sha256_digest

    def counting(data: bytes) -> str:
        hashed.append(len(data))
        return original(data)

    monkeypatch.setattr(session_module, "sha256_digest", counting)
    staged = await session.stage(inst, mounts)
    assert staged == mounts[0].plan.total_bytes and hashed == []
    await session.activate(inst)
    out = await session.exec(inst, ["cat", "/workspace/README"], timeout=5)
    assert out.stdout == (workspace / "README").read_bytes()
    # a caller's digest that is not the bytes' own is still refused by the provider (the door names its code)
    other = await session.provision(PROFILE, AMD64, image, mounts)
    with pytest.raises(SandboxProviderFailed, match="the provider raised SandboxDigestMismatch"):
        await session.write_file(other, "/workspace/README", b"not these", digest=mounts[0].plan.files[0].digest)
