"""The host-process provider: envelope and loudness, refusals, and the required members.

``Kit`` and the ``provider`` fixture are shared with the other ``test_host_process_*``
files. Every test runs in its own state directory, and its teardown compensates
whatever the test left and checks that no cgroup of that state directory remains.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.codec import decode, encode
from checkfu.contract.enforcement import AXES
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxCapabilityUnavailable,
    SandboxIdentityMismatch,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxPathRejected,
    SandboxProviderFailed,
    SandboxStateConflict,
)
from checkfu.contract.members import (
    ActivateRequest,
    CompensateRequest,
    ExecRequest,
    ExecResult,
    InspectRequest,
    InstanceResult,
    ListAllocationsRequest,
    ListDirRequest,
    MaterializeRequest,
    ProvisionRequest,
    ReadFilesRequest,
    ReleaseRequest,
    WriteFileRequest,
)
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import Provider
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.tiers import assess
from checkfu.contract.vocabulary import Platform
from checkfu.providers import host_process
from checkfu.providers.host_process import HostProcessProvider, create, procfs
from checkfu.providers.host_process import cgroups as cg
from checkfu.providers.host_process import provider as provider_module
from checkfu.providers.host_process.state import Layout

REPO = Path(__file__).resolve().parents[2]
LEASE = Lease(lease_id="lease-hp", lease_epoch=4)
TAG = "runner-hp"
OTHER_TAG = "runner-other"
PYTHON = sys.executable


class Kit:
    """Builds requests for one provider and drives the common steps."""

    def __init__(self, provider: HostProcessProvider, target: ExecutionTarget, host: Platform) -> None:
        self.provider = provider
        self.target = target
        self.host = host

    @staticmethod
    def profile(**overrides: Any) -> SandboxProfile:
        fields: dict[str, Any] = {
            "tier": "container",
            "base_image": "host",
            "network_policy": {"mode": "unrestricted"},
            "resource_limits": {"cpu_millis": 1000, "memory_mib": 512, "disk_mib": 256, "pids": 256},
            "retention_mode": "durable",
        }
        fields.update(overrides)
        return SandboxProfile(**fields)

    def allocating(self, key: str, *, profile: SandboxProfile | None = None, **overrides: Any) -> dict[str, Any]:
        prof = profile or self.profile()
        fields: dict[str, Any] = {
            "target": self.target,
            "lease": LEASE,
            "profile": prof,
            "profile_digest": prof.digest,
            "platform": self.host,
            "allocation_key": key,
            "runner_tag": TAG,
            "root_image": "host",
        }
        fields.update(overrides)
        return fields

    def provision_request(self, key: str, **overrides: Any) -> ProvisionRequest:
        return ProvisionRequest(**self.allocating(key, **overrides))

    def call(self, instance: InstanceResult) -> dict[str, Any]:
        return {
            "target": self.target,
            "lease": LEASE,
            "allocation_key": instance.allocation_key,
            "instance_id": instance.instance_id,
        }

    async def provisioned(self, key: str, **overrides: Any) -> dict[str, Any]:
        return self.call(await self.provider.provision(self.provision_request(key, **overrides)))

    async def active(self, key: str, **overrides: Any) -> dict[str, Any]:
        call = await self.provisioned(key, **overrides)
        result = await self.provider.activate(ActivateRequest(**call))
        assert result.state == "active"
        return call

    async def run(self, call: dict[str, Any], *argv: str, **fields: Any) -> ExecResult:
        fields.setdefault("timeout_ms", 20_000)
        fields.setdefault("max_output_bytes", 1 << 20)
        return await self.provider.exec(ExecRequest(**call, argv=list(argv), **fields))

    async def sh(self, call: dict[str, Any], script: str, **fields: Any) -> ExecResult:
        return await self.run(call, "sh", "-c", script, **fields)

    async def release(self, call: dict[str, Any]) -> None:
        await self.provider.release(ReleaseRequest(**call))

    async def compensate(self, key: str, tag: str = TAG, provider: HostProcessProvider | None = None) -> int:
        result = await (provider or self.provider).compensate(
            CompensateRequest(target=self.target, lease=LEASE, allocation_key=key, runner_tag=tag)
        )
        return result.reclaimed

    async def allocations(self, tag: str = TAG) -> list[tuple[str, str, str]]:
        result = await self.provider.list_allocations(
            ListAllocationsRequest(target=self.target, lease=LEASE, runner_tag=tag)
        )
        return [(a.allocation_key, a.kind, a.object_id) for a in result.allocations]


def pids_of(output: ExecResult | bytes) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every pid a script printed, one per line, read while they run."""
    text = output if isinstance(output, bytes) else output.stdout
    out: list[tuple[int, int]] = []
    for line in text.decode().split():
        start = procfs.start_time(int(line))
        assert start is not None, f"process {line} was gone before the test looked"
        out.append((int(line), start))
    return out


def leftover_cgroups(state_hash: str) -> list[str]:
    """Cgroup directories of this state directory still present in any v1 hierarchy."""
    prefix = f"{cg.NAME_PREFIX}{state_hash}-"
    found: list[str] = []
    for hierarchy in cg.hierarchies_on_host().values():
        for top, dirs, _ in os.walk(hierarchy.mount):
            if top.count("/") - str(hierarchy.mount).count("/") > 4:
                dirs[:] = []
                continue
            found.extend(os.path.join(top, d) for d in dirs if d.startswith(prefix))
    return found


async def tidy(kit: Kit) -> None:
    for tag in (TAG, OTHER_TAG):
        for key, _, _ in await kit.allocations(tag):
            await kit.compensate(key, tag)
    assert leftover_cgroups(Layout(kit.provider.state_dir).state_hash) == []


def make_kit(provider: HostProcessProvider) -> Kit:
    envelope = provider._envelope
    return Kit(provider, envelope.target, envelope.platforms[0])


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Kit]:
    made = make_kit(HostProcessProvider(state_dir=tmp_path / "state", kill_grace=0.2, drain_grace=0.05))
    yield made
    await tidy(made)


@pytest.fixture
async def pg_kit(tmp_path: Path) -> AsyncIterator[Kit]:
    """A provider told not to use cgroups: the process-group fallback."""
    made = make_kit(
        HostProcessProvider(state_dir=tmp_path / "pg-state", cgroups="off", kill_grace=0.2, drain_grace=0.05)
    )
    yield made
    await tidy(made)


def needs_cgroups(kit: Kit) -> None:
    if kit.provider.cgroup_reason is not None:
        pytest.skip(f"this host gives the provider no cgroups: {kit.provider.cgroup_reason}")


# The envelope: honest, and loud -------------------------------------------------------------------


@pytest.mark.anyio
async def test_envelope_is_exactly_as_weak_as_the_tier(kit: Kit) -> None:
    env = (await kit.provider.describe()).envelope
    assert decode(SandboxProviderCapabilities, encode(env)) == env
    assert (env.provider, env.provider_revision, env.materialization_revision, env.placement) == (
        "host-process",
        "checkfu-host-process 1",
        "host 1",
        "local",
    )
    assert env.tiers == ("container",)
    assert (env.image_mode, env.fixed_base_images, env.package_managers) == ("fixed", ("host",), ())
    assert env.network_modes == ("unrestricted",)
    assert env.retention_modes == ("durable",)
    assert (env.snapshots, env.snapshot_custody, env.list_dir, env.max_mounts) == (True, "runner", False, 0)
    assert env.egress_certification == "unsupported"
    assert set(env.operations) == {"openProcess", "listAllocations"}
    assert set(env.declared_members()) == {
        "describe",
        "materialize",
        "provision",
        "writeFile",
        "activate",
        "exec",
        "inspect",
        "release",
        "compensate",
        "openProcess",
        "listAllocations",
        "snapshot",
        "deleteSnapshot",
        "clone",
        "resume",
    }
    cgroups = kit.provider.cgroup_reason is None
    for axis in AXES:
        expected = "runner_enforced" if axis == "resource_limits" and cgroups else "not_enforced"
        assert env.enforcement.authority(axis) == expected, axis
    assert env.lifecycle_assurances.model_dump() == {
        "release_destroys": False,
        "release_idempotent": True,
        "reaps_process_tree": cgroups,
        "cold_compensation": True,
        "enumerates_allocations": True,
    }
    assert env.platforms[0].architecture == {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]


@pytest.mark.anyio
async def test_without_cgroups_the_envelope_claims_no_limits_and_no_reaping(pg_kit: Kit) -> None:
    env = (await pg_kit.provider.describe()).envelope
    assert pg_kit.provider.cgroup_reason == "cgroups are off by configuration"
    assert env.enforcement.not_counting() == list(AXES)
    assert env.lifecycle_assurances.reaps_process_tree is False


def test_an_unusable_cgroup_host_degrades_the_envelope_or_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cg, "probe", lambda _state: "no cgroup v1 hierarchy for freezer")
    degraded = HostProcessProvider(state_dir=tmp_path / "s")
    assert degraded.cgroup_reason == "no cgroup v1 hierarchy for freezer"
    assert degraded._envelope.enforcement.resource_limits == "not_enforced"
    assert degraded._envelope.lifecycle_assurances.reaps_process_tree is False
    with pytest.raises(SandboxAdapterUnavailable) as refused:
        HostProcessProvider(state_dir=tmp_path / "s", cgroups="require")
    assert refused.value.field == "cgroups"
    assert "freezer" in refused.value.message


def test_the_cgroup_probe_reads_hierarchies_and_own_paths() -> None:
    mountinfo = (
        "30 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "31 25 0:28 /sub /mnt/cg\\040cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
        "32 25 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "33 25 0:30 / /proc rw - proc proc rw\n"
    )
    found = cg.parse_hierarchies(mountinfo)
    assert set(found) == {"pids", "cpu"}
    assert found["cpu"].mount == Path("/mnt/cg cpu")
    assert found["cpu"].directory("/sub/a/b") == Path("/mnt/cg cpu/a/b")
    assert found["cpu"].directory("/elsewhere") is None
    assert cg.parse_own("8:pids:/x\n2:cpu,cpuacct:/sub/y\n0::/\n") == {
        "pids": "/x",
        "cpu": "/sub/y",
        "cpuacct": "/sub/y",
    }
    assert cg.parse_hierarchies("33 25 0:30 / /proc rw - proc proc rw\n") == {}


@pytest.mark.anyio
async def test_the_tier_is_graded_below_day_one(kit: Kit, tmp_path: Path) -> None:
    env = (await kit.provider.describe()).envelope
    graded = assess(env)
    assert graded.tier == "below_day_one"
    assert set(graded.not_counting) >= set(AXES) - {"resource_limits"}
    path = tmp_path / "envelope.json"
    path.write_bytes(encode(env))
    shown = subprocess.run(
        [str(REPO / ".venv" / "bin" / "checkfu"), "envelope", "check", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "below the day-one tier" in shown.stdout
    for axis in graded.not_counting:
        assert axis in shown.stdout


def test_every_axis_not_enforced_has_its_reason() -> None:
    assert set(host_process.WHY_NOT_ENFORCED) == set(AXES)


def test_it_is_a_provider() -> None:
    assert issubclass(HostProcessProvider, Provider)


# create() ---------------------------------------------------------------------------------------


def test_create_reads_string_options(tmp_path: Path) -> None:
    made = create(state_dir=str(tmp_path / "c"), cgroups="off", kill_grace_ms="50", drain_grace_ms="0")
    assert made.state_dir == tmp_path / "c"
    assert made.cgroup_reason == "cgroups are off by configuration"
    assert (made._kill_grace, made._drain_grace) == (0.05, 0.0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"cgroups": "sometimes"}, "cgroups"),
        ({"kill_grace_ms": "soon"}, "kill_grace_ms"),
        ({"drain_grace_ms": "-1"}, "drain_grace_ms"),
    ],
)
def test_create_refuses_bad_options(tmp_path: Path, options: dict[str, str], field: str) -> None:
    with pytest.raises(SandboxAdapterUnavailable) as refused:
        create(state_dir=str(tmp_path / "c"), **options)
    assert refused.value.field == field


def test_an_unusable_state_dir_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SandboxAdapterUnavailable) as refused:
        HostProcessProvider(state_dir=blocker / "state")
    assert refused.value.field == "state_dir"


def test_the_default_state_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert create(cgroups="off").state_dir == tmp_path / "xdg" / "checkfu" / "host-process"


# Refusals before anything starts ----------------------------------------------------------------


def nothing_created(kit: Kit) -> None:
    layout = Layout(kit.provider.state_dir)
    assert list(layout.instances.iterdir()) == []
    assert leftover_cgroups(layout.state_hash) == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    "policy",
    [{"mode": "none"}, {"mode": "allowlist", "allowlist": ["example.com:443"]}],
    ids=["none", "allowlist"],
)
async def test_a_confined_network_is_refused_naming_the_mode(kit: Kit, policy: dict[str, Any]) -> None:
    request = kit.provision_request("ak-net", profile=kit.profile(network_policy=policy))
    with pytest.raises(SandboxCapabilityUnavailable) as refused:
        await kit.provider.provision(request)
    assert refused.value.field == "profile.network_policy.mode"
    assert [u.field for u in refused.value.unmet] == ["profile.network_policy.mode"]
    assert repr(policy["mode"]) in refused.value.message
    nothing_created(kit)


@pytest.mark.anyio
async def test_every_unmet_need_is_listed_at_once(kit: Kit) -> None:
    env = kit.provider._envelope
    other_arch = "arm64" if kit.host.architecture == "amd64" else "amd64"
    prof = kit.profile(
        base_image="debian@sha256:" + "a" * 64,
        packages={"pip": ["requests==2.31.0"]},
        network_policy={"mode": "none"},
        retention_mode="ephemeral_zdr",
        resource_limits={
            "cpu_millis": env.maximum_resources.cpu_millis + 1,
            "memory_mib": 512,
            "disk_mib": 256,
            "pids": 1,
        },
    )
    mount = MountPlan(target="/workspace", files=[])
    request = kit.provision_request(
        "ak-all",
        profile=prof,
        platform=Platform(os="linux", architecture=other_arch),
        mounts=[mount],
        root_image="sha256:" + "b" * 64,
    )
    with pytest.raises(SandboxCapabilityUnavailable) as refused:
        await kit.provider.provision(request)
    assert [u.field for u in refused.value.unmet] == [
        "profile.network_policy.mode",
        "platform",
        "profile.base_image",
        "profile.packages.pip",
        "profile.retention_mode",
        "profile.resource_limits.cpu_millis",
        "profile.resource_limits.pids",
        "mounts",
        "root_image",
    ]
    nothing_created(kit)


@pytest.mark.anyio
async def test_a_request_for_another_adapter_is_refused(kit: Kit) -> None:
    # The same code the Docker and memory providers answer with: the request is not for this adapter.
    other = kit.target.model_copy(update={"provider_revision": "checkfu-host-process 2"})
    with pytest.raises(SandboxIdentityMismatch) as refused:
        await kit.provider.provision(kit.provision_request("ak-t", target=other))
    assert refused.value.field == "target"
    nothing_created(kit)


# materialize, provision, writeFile, activate, inspect ---------------------------------------------


@pytest.mark.anyio
async def test_materialize_builds_nothing(kit: Kit) -> None:
    prof = kit.profile()
    base = {"target": kit.target, "lease": LEASE, "platform": kit.host}
    done = await kit.provider.materialize(MaterializeRequest(**base, profile=prof, profile_digest=prof.digest))
    assert (done.image, done.materialization_revision, done.built) == ("host", "host 1", False)
    assert (done.profile_digest, done.lease, done.target) == (prof.digest, LEASE, kit.target)
    odd = kit.profile(base_image="sha256:" + "c" * 64)
    with pytest.raises(SandboxCapabilityUnavailable) as refused:
        await kit.provider.materialize(MaterializeRequest(**base, profile=odd, profile_digest=odd.digest))
    assert refused.value.field == "profile.base_image"


@pytest.mark.anyio
async def test_provision_makes_a_labelled_working_directory(kit: Kit) -> None:
    result = await kit.provider.provision(kit.provision_request("ak-p"))
    assert (result.allocation_key, result.state, result.lease, result.target) == (
        "ak-p",
        "provisioning",
        LEASE,
        kit.target,
    )
    layout = Layout(kit.provider.state_dir)
    assert layout.workdir("ak-p").is_dir()
    label = json.loads(layout.instance_label("ak-p").read_text())
    assert label["labels"] == {"checkfu.allocation_key": "ak-p", "checkfu.runner_tag": TAG}
    assert label["instance_id"] == result.instance_id
    assert await kit.allocations() == [("ak-p", "instance", result.instance_id)]
    with pytest.raises(SandboxStateConflict) as taken:
        await kit.provider.provision(kit.provision_request("ak-p"))
    assert taken.value.field == "allocation_key"


@pytest.mark.anyio
async def test_write_file_has_no_admissible_path(kit: Kit) -> None:
    call = await kit.provisioned("ak-w")
    request = WriteFileRequest(**call, path="/workspace/a", size=1, digest="sha256:" + "0" * 64)
    with pytest.raises(SandboxPathRejected) as refused:
        await kit.provider.write_file(request, b"a")
    assert refused.value.field == "path"
    await kit.provider.activate(ActivateRequest(**call))
    with pytest.raises(SandboxStateConflict):
        await kit.provider.write_file(request, b"a")


@pytest.mark.anyio
async def test_activate_and_inspect_follow_the_lifecycle(kit: Kit) -> None:
    call = await kit.provisioned("ak-a")
    assert (await kit.provider.inspect(InspectRequest(**call))).state == "provisioning"
    with pytest.raises(SandboxStateConflict):
        await kit.run(call, "true")
    await kit.provider.activate(ActivateRequest(**call))
    with pytest.raises(SandboxStateConflict):
        await kit.provider.activate(ActivateRequest(**call))
    assert (await kit.provider.inspect(InspectRequest(**call))).state == "active"
    await kit.release(call)
    assert (await kit.provider.inspect(InspectRequest(**call))).state == "released"


@pytest.mark.anyio
async def test_an_unknown_instance_is_not_found(kit: Kit) -> None:
    call = await kit.active("ak-u")
    for wrong in ({"instance_id": "hp-nope"}, {"allocation_key": "ak-other"}):
        with pytest.raises(SandboxNotFound):
            await kit.provider.inspect(InspectRequest(**{**call, **wrong}))
        with pytest.raises(SandboxNotFound):
            await kit.run({**call, **wrong}, "true")


@pytest.mark.anyio
async def test_the_oldest_released_instances_are_forgotten_past_the_limit(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A released instance answers ``released`` until ``MAX_TOMBSTONES`` later releases, then ``not found``; a
    second release of one adds no second tombstone."""
    monkeypatch.setattr(provider_module, "MAX_TOMBSTONES", 3)
    calls = [await kit.active(f"ak-t{i}") for i in range(5)]
    for call in calls:
        await kit.release(call)
    await kit.release(calls[-1])
    for call in calls[:2]:
        with pytest.raises(SandboxNotFound):
            await kit.provider.inspect(InspectRequest(**call))
    for call in calls[2:]:
        assert (await kit.provider.inspect(InspectRequest(**call))).state == "released"


@pytest.mark.anyio
async def test_a_restarted_provider_adopts_an_instance_from_its_label(kit: Kit) -> None:
    call = await kit.active("ak-cold")
    await kit.sh(call, "echo kept > f")
    fresh = make_kit(HostProcessProvider(state_dir=kit.provider.state_dir, kill_grace=0.2))
    assert (await fresh.provider.inspect(InspectRequest(**call))).state == "active"
    assert (await fresh.run(call, "cat", "f")).stdout == b"kept\n"
    await fresh.release(call)
    with pytest.raises(SandboxNotFound):
        await HostProcessProvider(state_dir=kit.provider.state_dir).inspect(InspectRequest(**call))


@pytest.mark.anyio
async def test_activation_is_recorded_beside_the_label_not_by_replacing_it(kit: Kit) -> None:
    """Activating makes a file of its own (``state.mark_active``) rather than renaming a new label over the old one,
    which ext4 makes wait for the new file's data; a provider started afresh reads each state back."""
    layout = Layout(kit.provider.state_dir)
    provisioned = await kit.provisioned("ak-mark")
    label = layout.instance_label("ak-mark")
    before = label.stat().st_ino
    fresh = make_kit(HostProcessProvider(state_dir=kit.provider.state_dir))
    assert (await fresh.provider.inspect(InspectRequest(**provisioned))).state == "provisioning"
    await kit.provider.activate(ActivateRequest(**provisioned))
    assert label.stat().st_ino == before
    assert layout.instance_active("ak-mark").is_file()
    again = make_kit(HostProcessProvider(state_dir=kit.provider.state_dir))
    assert (await again.provider.inspect(InspectRequest(**provisioned))).state == "active"
    await kit.release(provisioned)
    assert not layout.instance_dir("ak-mark").exists()


@pytest.mark.anyio
async def test_release_takes_what_its_processes_left_beside_their_working_directory(kit: Kit) -> None:
    """A process of the instance replaced the activation marker with a directory of its own: release still
    removes everything, on its worker thread."""
    call = await kit.active("ak-beside")
    assert (await kit.sh(call, "rm ../active && mkdir ../active && echo x > ../active/f")).exit_code == 0
    await kit.release(call)
    assert not Layout(kit.provider.state_dir).instance_dir("ak-beside").exists()


@pytest.mark.anyio
async def test_undeclared_members_are_unsupported(kit: Kit) -> None:
    call = await kit.active("ak-x")
    with pytest.raises(SandboxOperationUnsupported):
        await kit.provider.read_files(ReadFilesRequest(**call, paths=["/a"], max_bytes=10))
    with pytest.raises(SandboxOperationUnsupported):
        await kit.provider.list_dir(ListDirRequest(**call, path="/", max_entries=10))


# exec -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_exec_echoes_and_runs_in_the_working_directory(kit: Kit) -> None:
    call = await kit.active("ak-e")
    result = await kit.sh(call, "pwd; echo out; echo err >&2; exit 3")
    workdir = Layout(kit.provider.state_dir).workdir("ak-e")
    assert (result.exit_code, result.timed_out) == (3, False)
    assert result.stdout == f"{workdir}\nout\n".encode()
    assert result.stderr == b"err\n"
    assert (result.allocation_key, result.instance_id, result.lease, result.target) == (
        call["allocation_key"],
        call["instance_id"],
        LEASE,
        kit.target,
    )


@pytest.mark.anyio
async def test_exec_does_not_leak_the_runner_environment(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKFU_HP_SECRET", "hunter2")
    call = await kit.active("ak-env")
    result = await kit.run(call, "env", env={"ASKED": "yes"})
    seen = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert "CHECKFU_HP_SECRET" not in seen
    assert b"hunter2" not in result.stdout
    workdir = str(Layout(kit.provider.state_dir).workdir("ak-env"))
    assert seen == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": workdir,
        "LANG": "C.UTF-8",
        "ASKED": "yes",
    }


@pytest.mark.anyio
async def test_exec_runs_argv_without_a_shell(kit: Kit) -> None:
    call = await kit.active("ak-ns")
    assert (await kit.run(call, "echo", "$HOME", "a;b", "`x`")).stdout == b"$HOME a;b `x`\n"


@pytest.mark.anyio
async def test_exec_cwd(kit: Kit, tmp_path: Path) -> None:
    call = await kit.active("ak-cwd")
    assert (await kit.run(call, "pwd", cwd=str(tmp_path))).stdout == f"{tmp_path}\n".encode()
    with pytest.raises(SandboxPathRejected) as refused:
        await kit.run(call, "pwd", cwd=str(tmp_path / "missing"))
    assert refused.value.field == "cwd"


@pytest.mark.anyio
async def test_exec_feeds_stdin(kit: Kit) -> None:
    call = await kit.active("ak-in")
    payload = os.urandom(1 << 20)
    echoed = await kit.run(call, "cat", stdin=payload, max_output_bytes=2 << 20)
    assert echoed.stdout == payload
    assert (echoed.exit_code, echoed.stdout_truncated) == (0, False)
    ignored = await kit.run(call, "true", stdin=payload)
    assert ignored.exit_code == 0


@pytest.mark.anyio
async def test_exec_truncates_output_but_drains_it(kit: Kit) -> None:
    call = await kit.active("ak-big")
    result = await kit.sh(call, "head -c 300000 /dev/zero; head -c 10 /dev/zero >&2", max_output_bytes=1000)
    assert (len(result.stdout), result.stdout_truncated) == (1000, True)
    assert (len(result.stderr), result.stderr_truncated) == (10, False)
    assert result.exit_code == 0  # the writer finished: the rest was read and dropped, not refused


@pytest.mark.anyio
async def test_exec_timeout_ends_the_whole_tree(kit: Kit) -> None:
    call = await kit.active("ak-slow")
    result = await kit.sh(call, "sleep 30 & echo $!; sleep 30", timeout_ms=300)
    assert (result.timed_out, result.exit_code) == (True, 137)
    (child,) = [int(line) for line in result.stdout.split()]
    assert procfs.stat(child) is None or not procfs.stat(child).running  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_exec_reports_death_by_signal_as_a_shell_does(kit: Kit) -> None:
    call = await kit.active("ak-sig")
    assert (await kit.sh(call, "kill -TERM $$")).exit_code == 143


@pytest.mark.anyio
async def test_a_program_that_cannot_start_exits_as_a_shell_says(kit: Kit) -> None:
    call = await kit.active("ak-127")
    missing = await kit.run(call, "checkfu-no-such-program")
    assert missing.exit_code == 127
    assert b"cannot start 'checkfu-no-such-program'" in missing.stderr
    script = Layout(kit.provider.state_dir).workdir("ak-127") / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    assert (await kit.run(call, str(script))).exit_code == 126
    short = await kit.run(call, "checkfu-no-such-program", max_output_bytes=5)
    assert (len(short.stderr), short.stderr_truncated) == (5, True)


@pytest.mark.anyio
async def test_a_background_child_holding_the_pipes_does_not_hold_exec(kit: Kit) -> None:
    call = await kit.active("ak-bg")
    result = await kit.sh(call, "sleep 30 & echo $!")
    ((pid, start),) = pids_of(result)
    assert result.exit_code == 0
    assert procfs.is_alive(pid, start)  # detached, not killed by SIGPIPE or otherwise
    await kit.release(call)
    assert not procfs.is_alive(pid, start)


@pytest.mark.anyio
async def test_spawning_closes_every_inherited_descriptor(kit: Kit) -> None:
    call = await kit.active("ak-fd")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = soft - 1
    read_end, write_end = os.pipe()
    try:
        os.dup2(write_end, high)  # inheritable, at the top of the descriptor table
        result = await kit.run(call, "ls", "/proc/self/fd")
    finally:
        os.close(high)
        os.close(read_end)
        os.close(write_end)
    assert str(high) not in result.stdout.decode().split()
    assert set(result.stdout.decode().split()) <= {"0", "1", "2", "3"}  # 3: the directory ls reads


# release --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_release_removes_the_instance_and_is_idempotent(kit: Kit) -> None:
    call = await kit.active("ak-r")
    await kit.sh(call, "mkdir -p a/b && echo x > a/b/c && chmod 000 a/b")
    first = await kit.provider.release(ReleaseRequest(**call))
    second = await kit.provider.release(ReleaseRequest(**call))
    assert first == second
    assert (first.state, first.destroyed, first.instance_id) == ("released", True, call["instance_id"])
    layout = Layout(kit.provider.state_dir)
    assert not layout.instance_dir("ak-r").exists()
    assert leftover_cgroups(layout.state_hash) == []
    assert await kit.allocations() == []
    with pytest.raises(SandboxStateConflict):
        await kit.run(call, "true")


@pytest.mark.anyio
async def test_release_does_not_destroy_what_a_host_process_wrote_elsewhere(kit: Kit, tmp_path: Path) -> None:
    """Why ``release_destroys`` is false: the host's disk is the process's disk."""
    call = await kit.active("ak-out")
    outside = tmp_path / "written-by-the-workload"
    await kit.run(call, "touch", str(outside))
    await kit.release(call)
    assert outside.exists()


@pytest.mark.anyio
async def test_release_kills_a_process_that_ignores_sigterm(kit: Kit) -> None:
    call = await kit.active("ak-term")
    result = await kit.sh(call, "(trap '' TERM; exec sleep 30) >/dev/null & echo $!")
    ((pid, start),) = pids_of(result)
    await kit.release(call)
    assert not procfs.is_alive(pid, start)


@pytest.mark.anyio
async def test_release_refuses_to_delete_through_a_mount_inside_the_working_directory(kit: Kit, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("keep")
    call = await kit.active("ak-mnt")
    mounted = await kit.sh(call, f"mkdir m && mount --bind {precious} m && echo ok")
    if mounted.stdout != b"ok\n":
        pytest.skip(f"cannot bind-mount here: {mounted.stderr!r}")
    try:
        with pytest.raises(SandboxProviderFailed):
            await kit.release(call)
        assert (precious / "keep").read_text() == "keep"
    finally:
        subprocess.run(["umount", str(Layout(kit.provider.state_dir).workdir("ak-mnt") / "m")], check=True)
    await kit.release(call)
    assert (precious / "keep").read_text() == "keep"
