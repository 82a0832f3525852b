"""The session core on its own: plans built, answers judged, faults labelled, with no provider and no database.

Every answer here is built by hand from the contract's models, the way a provider
would send it; the core is fed it and must accept it (moving its tables and saying
what to journal) or refuse it (saying what to reclaim). Nothing here awaits.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract import examples as ex
from checkfu.contract.codec import decode_value
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxIdentityMismatch,
    SandboxLeaseFenced,
    SandboxOperationUnsupported,
    SandboxPathRejected,
    SandboxResultInvalid,
    SandboxStateConflict,
)
from checkfu.contract.members import (
    CompensateResult,
    DeleteSnapshotResult,
    ExecResult,
    InstanceResult,
    ListDirResult,
    ReleaseResult,
    SnapshotResult,
    WriteFileResult,
)
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import Lease
from checkfu.contract.vocabulary import Platform
from checkfu.core import session as core_module
from checkfu.core.session import (
    Compensate,
    Instance,
    JournalAllocation,
    Limits,
    SessionCore,
    SettleRow,
    Snapshot,
    compensate_plan,
    describe_plan,
)

AMD64 = Platform(os="linux", architecture="amd64")
LEASE = Lease(lease_id="lease-core", lease_epoch=2)
IMAGE = "sha256:" + "c" * 64


def envelope(**changes: Any) -> SandboxProviderCapabilities:
    doc = {
        **ex.day_one_envelope(),
        "snapshots": True,
        "list_dir": True,
        "retention_modes": ["durable", "ephemeral_zdr"],
        **changes,
    }
    return decode_value(SandboxProviderCapabilities, doc)


def profile() -> SandboxProfile:
    return decode_value(SandboxProfile, ex.profile())


def mount() -> MountPlan:
    return decode_value(MountPlan, ex.mount())


@pytest.fixture
def core() -> SessionCore:
    return SessionCore(envelope=envelope(), lease=LEASE, runner_tag="runner-core", limits=Limits())


def echo(core: SessionCore, **fields: Any) -> dict[str, Any]:
    return {"target": core.target, "lease": core.lease, **fields}


def provisioned(core: SessionCore, *, mounts: tuple[MountPlan, ...] = ()) -> Instance:
    plan = core.provision(profile(), AMD64, IMAGE, mounts)
    key = plan.allocation_key
    done = plan.accept(InstanceResult(**echo(core, allocation_key=key, instance_id="i-1", state="provisioning")))
    return done.value


def active(core: SessionCore) -> Instance:
    inst = provisioned(core)
    plan = core.activate(inst)
    plan.accept(InstanceResult(**echo(core, allocation_key=inst.allocation_key, instance_id="i-1", state="active")))
    return inst


# No I/O: what importing the core loads, and what it imports ------------------------------------


def test_importing_the_core_loads_no_io_layer() -> None:
    code = "import checkfu.core.session, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(out.stdout))
    forbidden = (
        "asyncio",
        "sqlalchemy",
        "sqlite3",
        "docker",
        "httpx",
        "checkfu.providers",
        "checkfu.testing",
        "checkfu.core.journal",
        "checkfu.core.door",
        "checkfu.core.driver",
        "checkfu.core.leases",
        "checkfu.core.registry",
    )
    offending = sorted(m for m in loaded for bad in forbidden if m == bad or m.startswith(bad + "."))
    assert offending == []


def test_the_core_module_imports_nothing_that_does_io() -> None:
    tree = ast.parse(Path(core_module.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    io = {"asyncio", "os", "socket", "subprocess", "pathlib", "sqlalchemy", "threading", "time"}
    assert not {m.split(".")[0] for m in imported} & io
    assert all(m.startswith(("checkfu.contract", "checkfu.core.deadlines")) for m in imported if "checkfu" in m)


# Allocation: journal first, settle after the checks, compensate on any fault ----------------------


def test_provision_journals_before_the_call_and_settles_after_the_checks(core: SessionCore) -> None:
    plan = core.provision(profile(), AMD64, IMAGE, (mount(),))
    key = plan.allocation_key
    assert key is not None and plan.member == "provision"
    assert plan.before == (JournalAllocation(key, "instance"),)
    assert core.rows == {key: "pending"}
    done = plan.accept(InstanceResult(**echo(core, allocation_key=key, instance_id="i-1", state="provisioning")))
    assert done.effects == (SettleRow(key, "live", "i-1"),)
    assert done.value.state == "provisioning" and done.value.mount_roots == (mount().target,)
    assert core.rows == {key: "live"} and core.instances[key] is done.value


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        ({"allocation_key": "ak-other"}, SandboxIdentityMismatch, "allocation_key"),
        ({"state": "active"}, SandboxStateConflict, "state"),
        ({"lease": Lease(lease_id="lease-core", lease_epoch=1)}, SandboxLeaseFenced, "lease.lease_epoch"),
        ({"lease": Lease(lease_id="lease-else", lease_epoch=2)}, SandboxLeaseFenced, "lease.lease_id"),
    ],
)
def test_a_provision_answer_out_of_contract_is_refused_and_reclaimed(
    core: SessionCore, change: dict[str, Any], error: type[Exception], field: str
) -> None:
    plan = core.provision(profile(), AMD64, IMAGE)
    key = plan.allocation_key
    answer = {**echo(core, allocation_key=key, instance_id="i-1", state="provisioning"), **change}
    with pytest.raises(error) as caught:
        plan.accept(InstanceResult(**answer))
    assert getattr(caught.value, "field", None) == field
    assert core.instances == {} and core.rows == {key: "pending"}
    assert plan.on_fault(caught.value) == (Compensate(key),)  # type: ignore[arg-type]
    assert plan.on_abandon() == (Compensate(key),)


def test_an_answer_of_another_type_does_not_decode(core: SessionCore) -> None:
    plan = core.provision(profile(), AMD64, IMAGE)
    with pytest.raises(SandboxResultInvalid):
        plan.accept({"instance_id": "i-1"})


def test_a_clone_must_not_reuse_a_held_id(core: SessionCore) -> None:
    source = active(core)
    plan = core.clone(source, profile(), AMD64, IMAGE)
    key = plan.allocation_key
    answer = echo(core, allocation_key=key, instance_id="i-1", state="provisioning", source_instance_id="i-1")
    from checkfu.contract.members import CloneResult  # noqa: PLC0415 - only this case needs it

    with pytest.raises(SandboxIdentityMismatch):
        plan.accept(CloneResult(**answer))
    assert plan.before == (JournalAllocation(key, "clone", source.allocation_key),)


# Instance calls: the table moves only on accepted answers; a fault reclaims by key -----------------


def test_activate_moves_the_instance_only_when_the_answer_is_accepted(core: SessionCore) -> None:
    inst = provisioned(core)
    plan = core.activate(inst)
    assert inst.state == "provisioning"
    wrong = echo(core, allocation_key=inst.allocation_key, instance_id="i-1", state="provisioning")
    with pytest.raises(SandboxStateConflict):
        plan.accept(InstanceResult(**wrong))
    assert inst.state == "provisioning"
    right = {**wrong, "state": "active"}
    plan.accept(InstanceResult(**right))
    assert inst.state == "active"


def test_a_fault_on_an_instance_reclaims_it_by_key(core: SessionCore) -> None:
    inst = active(core)
    plan = core.exec(inst, ["true"])
    effects = plan.on_fault(SandboxResultInvalid("bad"))
    assert effects == (Compensate(inst.allocation_key),)
    assert inst.state == "released"
    with pytest.raises(SandboxStateConflict):  # the table refuses further work before any call
        core.exec(inst, ["true"])


def test_an_illegal_state_is_refused_before_any_plan(core: SessionCore) -> None:
    inst = provisioned(core)
    with pytest.raises(SandboxStateConflict) as caught:
        core.exec(inst, ["true"])
    assert "provisioning" in caught.value.message and "exec" in caught.value.message
    assert inst.state == "provisioning"


def test_an_undeclared_member_is_refused_before_any_plan() -> None:
    core = SessionCore(
        envelope=decode_value(SandboxProviderCapabilities, ex.day_one_envelope()), lease=LEASE, runner_tag="t"
    )
    inst = active(core)
    for build in (lambda: core.snapshot(inst), lambda: core.read_files(inst, ["/x"]), core.list_allocations):
        with pytest.raises(SandboxOperationUnsupported):
            build()
    assert core.rows == {inst.allocation_key: "live"}  # the refused snapshot journaled nothing


def test_write_file_sends_the_digest_and_checks_the_echo(core: SessionCore) -> None:
    inst = provisioned(core, mounts=(mount(),))
    path = mount().target + "/a.txt"
    plan = core.write_file(inst, path, b"hello")
    assert plan.data == b"hello"
    req: Any = plan.request
    ok = echo(core, allocation_key=inst.allocation_key, instance_id="i-1", path=path, size=5, digest=req.digest)
    plan.accept(WriteFileResult(**ok))
    with pytest.raises(SandboxIdentityMismatch):
        plan.accept(WriteFileResult(**{**ok, "size": 4}))
    with pytest.raises(SandboxPathRejected):
        core.write_file(inst, "/etc/passwd", b"x")


def test_exec_bounds_and_deadline(core: SessionCore) -> None:
    core = SessionCore(envelope=envelope(), lease=LEASE, runner_tag="t", limits=Limits(max_output_bytes=4))
    inst = active(core)
    plan = core.exec(inst, ["cat"], timeout=7)
    assert plan.deadline == Limits().deadline("exec") + 7
    base = echo(
        core,
        allocation_key=inst.allocation_key,
        instance_id="i-1",
        exit_code=0,
        timed_out=False,
        stdout=b"",
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
    )
    plan.accept(ExecResult(**{**base, "stdout": b"1234"}))
    with pytest.raises(SandboxBoundExceeded):
        plan.accept(ExecResult(**{**base, "stdout": b"12345"}))


def test_list_dir_may_return_only_what_was_asked(core: SessionCore) -> None:
    inst = active(core)
    plan = core.list_dir(inst, "/workspace")
    base = echo(
        core, allocation_key=inst.allocation_key, instance_id="i-1", path="/workspace", kind="dir", truncated=False
    )
    plan.accept(ListDirResult(**base, entries=({"path": "/workspace/a", "kind": "file", "size": 1, "mode": 0o644},)))
    with pytest.raises(SandboxPathRejected):
        plan.accept(ListDirResult(**base, entries=({"path": "/etc/a", "kind": "file", "size": 1, "mode": 0o644},)))


def test_release_settles_the_row_and_the_instance(core: SessionCore) -> None:
    inst = active(core)
    plan = core.release(inst)
    done = plan.accept(
        ReleaseResult(
            **echo(core, allocation_key=inst.allocation_key, instance_id="i-1", state="released", destroyed=True)
        )
    )
    assert done.effects == (SettleRow(inst.allocation_key, "released"),)
    assert inst.state == "released" and core.rows[inst.allocation_key] == "released"
    assert core.unreleased() == []


# Snapshots: their own table -------------------------------------------------------------------------


def snapshotted(core: SessionCore) -> Snapshot:
    inst = active(core)
    plan = core.snapshot(inst)
    key = plan.allocation_key
    assert plan.before == (JournalAllocation(key, "snapshot", inst.allocation_key),)  # type: ignore[arg-type]
    answer = echo(
        core, allocation_key=inst.allocation_key, instance_id="i-1", snapshot_allocation_key=key, snapshot_id="snap-1"
    )
    return plan.accept(SnapshotResult(**answer)).value


def test_a_snapshot_moves_through_its_table(core: SessionCore) -> None:
    snap = snapshotted(core)
    assert snap.state == "present" and core.rows[snap.allocation_key] == "live"
    plan = core.delete_snapshot(snap)
    answer = echo(core, snapshot_allocation_key=snap.allocation_key, snapshot_id="snap-1", deleted=True)
    done = plan.accept(DeleteSnapshotResult(**answer))
    assert done.effects == (SettleRow(snap.allocation_key, "released"),)
    assert snap.deleted and core.rows[snap.allocation_key] == "released"
    with pytest.raises(SandboxStateConflict) as caught:  # a deleted snapshot cannot be resumed
        core.resume(snap, profile(), AMD64, IMAGE)
    assert caught.value.field == "snapshot_id"


# Compensation and the journal-row table ---------------------------------------------------------------


def test_compensation_settles_the_row_and_ends_the_instance(core: SessionCore) -> None:
    inst = active(core)
    plan = core.compensate(inst.allocation_key)
    done = plan.accept(CompensateResult(**echo(core, allocation_key=inst.allocation_key, reclaimed=1)))
    assert done.effects == (SettleRow(inst.allocation_key, "compensated"),)
    assert inst.state == "released"
    # A failed compensation reclaims nothing further: the row stays open for reconciliation.
    again = core.compensate(inst.allocation_key)
    assert again.on_fault(SandboxResultInvalid("x")) == () and again.on_abandon() == ()


def test_compensate_plan_needs_only_the_key_and_the_lease() -> None:
    env = envelope()
    plan = compensate_plan(env.target, LEASE, "ak-cold", "runner-x")
    done = plan.accept(CompensateResult(target=env.target, lease=LEASE, allocation_key="ak-cold", reclaimed=0))
    assert done.value.reclaimed == 0
    with pytest.raises(SandboxIdentityMismatch):
        plan.accept(CompensateResult(target=env.target, lease=LEASE, allocation_key="ak-warm", reclaimed=0))


def test_describe_refuses_an_envelope_that_does_not_decode() -> None:
    from checkfu.contract.errors import SandboxEnvelopeInvalid  # noqa: PLC0415

    plan = describe_plan("a source")
    with pytest.raises(SandboxEnvelopeInvalid) as caught:
        plan.accept(object())
    assert "a source" in caught.value.message
