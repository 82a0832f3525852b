"""Every misbehaviour preset on every member it can corrupt: the exact error, compensation, nothing left.

``Misbehaving`` does the honest work first (the inner memory provider really
allocates, under the request's key), then lies about it. For each case the runner
must raise the one error the check amounts to, compensate the allocation the lie
was about by its key (the journal row ends ``compensated``, never ``live``), and
leave nothing of it in the provider.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.envelope import Member
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxError,
    SandboxIdentityMismatch,
    SandboxLeaseFenced,
    SandboxPathRejected,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxResultInvalid,
    SandboxStateConflict,
)
from checkfu.contract.process import ProcessExit
from checkfu.contract.provider import REFUSALS
from checkfu.contract.vocabulary import Platform
from checkfu.core.driver import Instance, Limits, RunSession, Snapshot
from checkfu.core.mounts import DirectorySource, MountSpec, ResolvedMount, resolve_mount
from checkfu.testing import PRESETS, RAISING, Misbehaving, Misbehaviour, forge_instance_id, memory_profile

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
PROFILE = memory_profile()
DEADLINE = 0.2

EXPECTED: dict[str, type[SandboxError]] = {
    "forge_instance_id": SandboxIdentityMismatch,
    "foreign_instance_id": SandboxIdentityMismatch,
    "wrong_lease_id": SandboxLeaseFenced,  # a result carrying another lease is fenced (contract section 6)
    "stale_epoch": SandboxLeaseFenced,
    "wrong_target": SandboxIdentityMismatch,
    "snapshot_echoes_other_instance": SandboxIdentityMismatch,
    "clone_returns_source": SandboxIdentityMismatch,
    "returns_held_id": SandboxIdentityMismatch,
    "release_echoes_other_instance": SandboxIdentityMismatch,
    "exec_over_bound": SandboxBoundExceeded,
    "unasked_path": SandboxPathRejected,
    "dotdot_path": SandboxPathRejected,
    "nul_path": SandboxPathRejected,
    "overlong_path": SandboxPathRejected,
    "duplicate_path": SandboxResultInvalid,
    "dropped_path": SandboxResultInvalid,
    "file_and_missing": SandboxResultInvalid,
    "path_below_file": SandboxResultInvalid,
    "exit_status_negative": SandboxResultInvalid,  # exec's result does not decode; openProcess: see below
    "exit_status_over_255": SandboxResultInvalid,
    "unknown_field": SandboxResultInvalid,
    "constructed_garbage": SandboxResultInvalid,
    "hang": SandboxProviderTimeout,
    "crash": SandboxProviderFailed,
    "wrong_state": SandboxStateConflict,
    "release_keeps": SandboxResultInvalid,  # the envelope promises release_destroys
    "expiry_in_the_past": SandboxResultInvalid,  # field expires_at
    "expiry_past_the_asked": SandboxResultInvalid,
    "expiry_never": SandboxResultInvalid,
}
ALLOCATING: frozenset[Member] = frozenset({"provision", "clone", "resume"})
DRIVEN: tuple[Member, ...] = (
    "materialize",
    "provision",
    "writeFile",
    "activate",
    "exec",
    "inspect",
    "release",
    "openProcess",
    "readFiles",
    "listAllocations",
    "listDir",
    "snapshot",
    "deleteSnapshot",
    "clone",
    "resume",
)
"""Every member the runner calls in a session; ``describe`` is the registry's, ``compensate`` has its own tests."""


def cases() -> list[Any]:
    out = []
    for name, preset in PRESETS.items():
        for member in DRIVEN:
            if member not in preset.members:
                continue
            if preset is forge_instance_id and member in ALLOCATING:
                continue  # a brand-new forged id cannot be told from a real one; see the test below
            out.append(pytest.param(name, member, id=f"{name}-{member}"))
    return out


def test_every_preset_has_an_expected_error_and_a_case() -> None:
    assert set(EXPECTED) == set(PRESETS)
    covered = {c.values[0] for c in cases()}
    assert covered == set(PRESETS)


@dataclass
class Scene:
    session: RunSession
    double: Misbehaving
    inst: Instance
    bystander: Instance
    image: str
    mounts: list[ResolvedMount]
    snap: Snapshot | None = None


async def build_scene(rig: Any, workspace: Path, member: Member) -> Scene:
    """An active instance with a staged mount, another active instance beside it, and what ``member`` needs."""
    session = rig.start(mount_count=1)
    mounts = [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))]
    image = (await session.materialize(PROFILE, AMD64)).image
    bystander = await session.provision(PROFILE, AMD64, image)
    await session.activate(bystander)
    inst = await session.provision(PROFILE, AMD64, image, mounts)
    if member != "writeFile":
        await session.stage(inst, mounts)
        if member != "activate":
            await session.activate(inst)
    scene = Scene(session, rig.provider, inst, bystander, image, mounts)
    if member in ("resume", "deleteSnapshot"):
        scene.snap = await session.snapshot(inst)
    return scene


def faulted_call(scene: Scene, member: Member) -> Callable[[], Awaitable[Any]]:
    s, inst = scene.session, scene.inst
    snap = scene.snap
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "materialize": lambda: s.materialize(PROFILE, AMD64),
        "provision": lambda: s.provision(PROFILE, AMD64, scene.image),
        "writeFile": lambda: s.write_file(inst, "/workspace/README", b"staged\n"),
        "activate": lambda: s.activate(inst),
        "exec": lambda: s.exec(inst, ["cat", "/workspace/README"], timeout=0.05),
        "inspect": lambda: s.inspect(inst),
        "release": lambda: s.release(inst),
        "openProcess": lambda: _run_to_exit(s, inst),
        "readFiles": lambda: s.read_files(inst, ["/workspace/README"]),
        "listAllocations": s.list_allocations,
        "listDir": lambda: s.list_dir(inst, "/workspace"),
        "snapshot": lambda: s.snapshot(inst, keep_seconds=3600),  # a lifetime asked: every expiry check applies
        "deleteSnapshot": lambda: s.delete_snapshot(snap),  # type: ignore[arg-type]
        "clone": lambda: s.clone(inst, PROFILE, AMD64, scene.image),
        "resume": lambda: s.resume(snap, PROFILE, AMD64, scene.image),  # type: ignore[arg-type]
    }
    return calls[member]


async def _run_to_exit(session: RunSession, inst: Instance) -> int:
    """Open ``true`` and read its events to the exit: a fault of ``started`` or of any event surfaces."""
    proc = await session.open_process(inst, ["true"])
    try:
        await proc.close_stdin()
        async for event in proc.events():
            if isinstance(event, ProcessExit):
                return event.exit_code
    finally:
        await proc.kill()
    raise AssertionError("no exit")


STREAMED: dict[tuple[str, Member], type[SandboxError]] = {
    ("exit_status_negative", "openProcess"): SandboxProtocolViolation,
    ("exit_status_over_255", "openProcess"): SandboxProtocolViolation,
}
"""Faults that arrive on a process's event stream, where the frame rules (not a result's decoder) catch them."""


def faulted_key(scene: Scene, member: Member, before: set[str], after: set[str]) -> str | None:
    """The allocation the lie was about: a new one for allocating members, else the one acted on."""
    if member in ("materialize", "listAllocations"):
        assert after == before
        return None
    if member in ("provision", "clone", "resume", "snapshot"):
        (new,) = after - before
        return new
    if member == "deleteSnapshot":
        assert scene.snap is not None
        return scene.snap.allocation_key
    return scene.inst.allocation_key


@pytest.fixture
def misbehaving_rig(make_rig: Any) -> Callable[[Member], Any]:
    def make(member: Member) -> Any:
        return make_rig(wrap=Misbehaving, limits=Limits(deadlines={member: DEADLINE}))

    return make


@pytest.mark.parametrize(("preset", "member"), cases())
async def test_misbehaviour(
    misbehaving_rig: Callable[[Member], Any], workspace: Path, preset: str, member: Member
) -> None:
    expected = STREAMED.get((preset, member), EXPECTED[preset])
    error = await assert_faulted(misbehaving_rig(member), workspace, member, PRESETS[preset], expected)
    assert type(error) is expected, error


@pytest.mark.parametrize("code", sorted(RAISING))
@pytest.mark.parametrize("member", DRIVEN)
async def test_any_code_a_provider_raises_is_its_own_failure(
    misbehaving_rig: Callable[[Member], Any], workspace: Path, member: Member, code: str
) -> None:
    """A provider that raises any code of the vocabulary, even one that names a fault of the request,
    has failed: the runner reports SandboxProviderFailed naming the code, and reclaims like any fault; except a
    refusal the contract lists as the request's own (``REFUSALS``: readFiles over its bound, exec's cwd), which
    keeps the instance (issue 29: it must not cost the user their sandbox)."""
    kept = code in REFUSALS.get(member, frozenset())
    error = await assert_faulted(
        misbehaving_rig(member), workspace, member, RAISING[code], SandboxProviderFailed, kept=kept
    )
    assert isinstance(error, SandboxProviderFailed)
    if code == "SandboxProviderFailed":
        assert error.reported_code is None
    else:
        assert error.reported_code == code and code in error.message


async def assert_faulted(
    rig: Any, workspace: Path, member: Member, fault: Misbehaviour, expected: type[SandboxError], *, kept: bool = False
) -> SandboxError:
    """Call ``member`` under ``fault``: the one typed error, compensation by key (none when ``kept``: the instance
    stays active and held), nothing left behind."""
    scene = await build_scene(rig, workspace, member)
    session = scene.session
    keys_before = {r.allocation_key for r in rig.journal.allocations_for_run(session.run_id)}
    events_before = len(rig.journal.events_for_run(session.run_id))
    rig.provider.set(member, fault)

    with pytest.raises(SandboxError) as caught:
        await faulted_call(scene, member)()
    assert type(caught.value) is expected, caught.value
    rig.provider.set(member, None)

    keys_after = {r.allocation_key for r in rig.journal.allocations_for_run(session.run_id)}
    key = faulted_key(scene, member, keys_before, keys_after)
    new_events = rig.journal.events_for_run(session.run_id)[events_before:]
    faulted = [e for e in new_events if e.member == member][-1]  # an open process's stream fault comes after its start
    assert (faulted.outcome, faulted.error_code) == ("error", expected.__name__)
    compensations = [e for e in new_events if e.member == "compensate"]
    if kept:
        assert compensations == [] and key is not None and key in rig.held_keys()
        assert scene.inst.state == "active"
        row = rig.journal.allocation(key)
        assert row is not None and row.state == "live"
    elif key is None:
        assert compensations == []  # nothing was allocated, so nothing to reclaim
    else:
        # compensation ran, by the allocation key, and succeeded ...
        assert [(e.allocation_key, e.outcome) for e in compensations] == [(key, "ok")]
        row = rig.journal.allocation(key)
        assert row is not None and row.state == "compensated"
        # ... and nothing of that allocation is left in the provider
        assert key not in rig.held_keys()
        if key == scene.inst.allocation_key:
            assert scene.inst.state == "released"

    # Nothing is left at all once the Run is wound up; no row is left pending.
    await session.release_all()
    assert rig.memory.live_objects() == ()
    states = {r.allocation_key: r.state for r in rig.journal.allocations_for_run(session.run_id)}
    assert "pending" not in states.values(), states
    if key is not None:
        assert states[key] == ("released" if kept else "compensated")
    return caught.value


@pytest.mark.parametrize("member", sorted(ALLOCATING))
async def test_a_forged_new_id_is_caught_at_the_next_call_and_reclaimed_by_key(
    misbehaving_rig: Callable[[Member], Any], workspace: Path, member: Member
) -> None:
    rig = misbehaving_rig(member)
    scene = await build_scene(rig, workspace, "resume" if member == "resume" else "exec")
    session = scene.session
    rig.provider.set(member, forge_instance_id)
    forged = await faulted_call(scene, member)()
    rig.provider.set(member, None)
    # The id is new and well-formed, so no echo can tell; the real object sits under the key the runner chose.
    assert forged.instance_id.startswith("forged-")
    assert forged.allocation_key in rig.held_keys()
    with pytest.raises(SandboxProviderFailed) as caught:  # the provider knows no such instance
        await session.inspect(forged)
    assert caught.value.reported_code == "SandboxNotFound"
    await session.release_all()
    assert rig.memory.live_objects() == ()
    row = rig.journal.allocation(forged.allocation_key)
    assert row is not None and row.state == "compensated"


async def test_a_double_refuses_a_rule_it_cannot_apply(make_rig: Any) -> None:
    with pytest.raises(ValueError, match="cannot corrupt"):
        Misbehaving(make_rig().memory, {"materialize": PRESETS["exec_over_bound"]})


async def test_a_misbehaving_compensate_leaves_the_row_for_reconciliation(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    session = rig.start()
    image = (await session.materialize(PROFILE, AMD64)).image
    inst = await session.provision(PROFILE, AMD64, image)
    await session.activate(inst)
    rig.provider.set("compensate", PRESETS["wrong_lease_id"])
    with pytest.raises(SandboxLeaseFenced):
        await session.compensate(inst.allocation_key)
    # The provider did reclaim; the runner cannot take its word for it: the row stays open.
    assert rig.memory.live_objects() == ()
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "live"
    rig.provider.set("compensate", None)
    await session.compensate(inst.allocation_key)
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "compensated"


def test_presets_are_named_for_what_they_do() -> None:
    for name, preset in PRESETS.items():
        assert isinstance(preset, Misbehaviour) and preset.name == name
