"""The required members on the real engine: envelope, provision, writeFile, activate, exec, inspect, release,
compensate; every echo, every refusal, every wrong-state call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from docker_kit import LEASE, Kit, sha

from checkfu.contract.checks import check_echo
from checkfu.contract.codec import decode, encode
from checkfu.contract.enforcement import AXES
from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxCapabilityUnavailable,
    SandboxDigestMismatch,
    SandboxIdentityMismatch,
    SandboxNotFound,
    SandboxPathRejected,
    SandboxProviderFailed,
    SandboxStateConflict,
)
from checkfu.contract.members import (
    ActivateRequest,
    CompensateRequest,
    DescribeResult,
    ExecRequest,
    InspectRequest,
    ReleaseRequest,
    WriteFileRequest,
)
from checkfu.contract.mounts import MountFile, MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.tiers import assess
from checkfu.providers.docker import DockerProvider, create
from checkfu.providers.docker import labels as L

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


async def test_envelope_decodes_and_claims_every_axis(provider: DockerProvider) -> None:
    described = await provider.describe()
    env = decode(DescribeResult, encode(described)).envelope
    assert [env.enforcement.authority(a) for a in AXES] == ["runner_enforced"] * 9
    assert env.placement == "local" and env.tiers == ("container",) and env.image_mode == "profile"
    assert set(env.package_managers) >= {"apt", "pip"} and env.network_modes == ("none", "allowlist")
    assert env.egress_certification == "advisory_filter"  # never more: security_boundary is the owned matrix's
    assert set(env.retention_modes) == {"durable", "ephemeral_zdr"}
    assert env.snapshots and env.snapshot_custody == "runner" and env.list_dir
    assert set(env.operations) == {"openProcess", "readFiles", "listAllocations"}
    assert all(value for _, value in env.lifecycle_assurances)
    assert env.platforms[0].architecture in ("amd64", "arm64")
    assert env.target == ExecutionTarget(
        provider="docker",
        provider_revision="checkfu-docker 1",
        materialization_revision="checkfu-docker-images 1",
        placement="local",
    )
    assert assess(env, in_tree=True).tier == "docker_parity"
    assert assess(env).short_of_next == ("provider snapshot custody",)  # what a third party would still lack


def test_factory_takes_string_options(tmp_path: Any) -> None:
    p = create(sandbox_user="1000:1000", state_dir=str(tmp_path), workers="4")
    try:
        assert p.state_dir == tmp_path and p.user.uid == 1000
    finally:
        p.close()
    refusals = {
        "colour": {"colour": "blue"},
        "sandbox_user": {"sandbox_user": "0:0"},
        "home": {"home": "relative"},
        "workers": {"workers": "many"},
        "egress_dns": {"egress_dns": "10.0.0.1,resolver.example"},
    }
    for field, options in refusals.items():
        with pytest.raises(SandboxAdapterUnavailable) as refused:
            create(**options)
        assert refused.value.field == field


async def test_round_trip_echoes_every_identity(kit: Kit) -> None:
    data = b"hello\n"
    plan = MountPlan(target="/workspace", files=(MountFile(path="README", size=len(data), digest=sha(data)),))
    key, provisioned = await kit.provision("round", mounts=(plan,))
    p = kit.provider
    check_echo(provisioned, target=kit.target, lease=LEASE, allocation_key=key)
    assert provisioned.state == "provisioning"
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": provisioned.instance_id}
    assert kit.client.containers.get(provisioned.instance_id).status == "created"
    staged = await p.write_file(
        WriteFileRequest(**call, path="/workspace/README", size=len(data), digest=sha(data)), data
    )
    check_echo(staged, target=kit.target, lease=LEASE, allocation_key=key, instance_id=provisioned.instance_id)
    assert (staged.path, staged.size, staged.digest) == ("/workspace/README", len(data), sha(data))
    active = await p.activate(ActivateRequest(**call))
    assert active.state == "active"
    assert (await p.inspect(InspectRequest(**call))).state == "active"
    ran = await p.exec(ExecRequest(**call, argv=("cat", "/workspace/README"), timeout_ms=10_000, max_output_bytes=100))
    check_echo(ran, target=kit.target, lease=LEASE, allocation_key=key, instance_id=provisioned.instance_id)
    assert (ran.exit_code, ran.stdout, ran.timed_out) == (0, data, False)
    released = await p.release(ReleaseRequest(**call))
    assert (released.state, released.destroyed, released.instance_id) == ("released", True, provisioned.instance_id)
    again = await p.release(ReleaseRequest(**call))
    assert again == released
    assert (await p.inspect(InspectRequest(**call))).state == "released"
    assert not kit.client.containers.list(all=True, filters={"label": f"{L.ALLOCATION_KEY}={key}"}, ignore_removed=True)


async def test_requests_for_another_target_are_refused(kit: Kit) -> None:
    other = kit.target.model_copy(update={"provider_revision": "checkfu-docker 0"})
    request = kit.provision_request(kit.key("foreign-target")).model_copy(update={"target": other})
    with pytest.raises(SandboxIdentityMismatch):
        await kit.provider.provision(request)
    with pytest.raises(SandboxIdentityMismatch):
        await kit.provider.compensate(
            CompensateRequest(target=other, lease=LEASE, allocation_key="x", runner_tag=kit.runner_tag)
        )


async def test_unserved_profiles_are_refused_at_provision(kit: Kit) -> None:
    base = kit.profile()
    unrestricted = SandboxProfile(**{**base.model_dump(), "network_policy": {"mode": "unrestricted"}})
    npm = SandboxProfile(**{**base.model_dump(), "packages": {"npm": ["left-pad@1.3.0"]}})
    tiny = kit.profile(disk_mib=1)
    cases = (
        (unrestricted, "profile.network_policy.mode"),
        (npm, "profile.packages.npm"),
        (tiny, "profile.resource_limits.disk_mib"),
    )
    keys = []
    for profile, field in cases:
        keys.append(kit.key("unserved"))
        with pytest.raises(SandboxCapabilityUnavailable) as caught:
            await kit.provider.provision(kit.provision_request(keys[-1], profile=profile))
        assert caught.value.field == field
    for key in keys:
        flt = {"label": f"{L.ALLOCATION_KEY}={key}"}
        assert not kit.client.containers.list(
            all=True, filters=flt, ignore_removed=True
        ) and not kit.client.volumes.list(filters=flt)


async def test_mounts_may_not_cover_a_writable_area(kit: Kit) -> None:
    for target in ("/tmp", "/home", "/proc/x"):
        plan = MountPlan(target=target, files=())
        with pytest.raises(SandboxPathRejected):
            await kit.provider.provision(kit.provision_request(kit.key("cover"), mounts=(plan,)))


async def test_write_file_checks_path_length_digest_and_state(kit: Kit) -> None:
    data = b"payload"
    plan = MountPlan(target="/workspace", files=(MountFile(path="a/b.txt", size=len(data), digest=sha(data)),))
    key, inst = await kit.provision("writes", mounts=(plan,))
    p = kit.provider
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        for path in ("/etc/passwd", "/workspace", "/workspacex/a"):
            with pytest.raises(SandboxPathRejected):
                await p.write_file(WriteFileRequest(**call, path=path, size=len(data), digest=sha(data)), data)
        with pytest.raises(SandboxDigestMismatch):
            await p.write_file(WriteFileRequest(**call, path="/workspace/a/b.txt", size=99, digest=sha(data)), data)
        with pytest.raises(SandboxDigestMismatch):
            await p.write_file(
                WriteFileRequest(**call, path="/workspace/a/b.txt", size=len(data), digest=sha(b"other")), data
            )
        with pytest.raises(SandboxStateConflict):
            await p.exec(ExecRequest(**call, argv=("true",), timeout_ms=1000, max_output_bytes=10))
        await p.write_file(WriteFileRequest(**call, path="/workspace/a/b.txt", size=len(data), digest=sha(data)), data)
        await p.activate(ActivateRequest(**call))
        with pytest.raises(SandboxStateConflict):
            await p.write_file(
                WriteFileRequest(**call, path="/workspace/a/b.txt", size=len(data), digest=sha(data)), data
            )
        with pytest.raises(SandboxStateConflict):
            await p.activate(ActivateRequest(**call))
        ran = await p.exec(
            ExecRequest(**call, argv=("cat", "/workspace/a/b.txt"), timeout_ms=10_000, max_output_bytes=99)
        )
        assert ran.stdout == data
        # the digest the sandbox sees is the digest the runner sent
        ran = await p.exec(
            ExecRequest(**call, argv=("sha256sum", "/workspace/a/b.txt"), timeout_ms=10_000, max_output_bytes=999)
        )
        assert ran.stdout.split()[0].decode() == sha(data).removeprefix("sha256:")
    finally:
        await p.release(ReleaseRequest(**call))
    with pytest.raises(SandboxStateConflict):
        await p.exec(ExecRequest(**call, argv=("true",), timeout_ms=1000, max_output_bytes=10))


async def test_foreign_and_unknown_instances_are_not_found(kit: Kit) -> None:
    box = await kit.up("owner")
    p = kit.provider
    try:
        other_key = kit.key("stranger")
        wrong_id = {**box.call, "allocation_key": other_key}
        with pytest.raises(SandboxNotFound):
            await p.inspect(InspectRequest(**wrong_id))
        with pytest.raises(SandboxNotFound):
            await p.exec(ExecRequest(**wrong_id, argv=("true",), timeout_ms=1000, max_output_bytes=10))
        with pytest.raises(SandboxNotFound):
            await p.release(ReleaseRequest(**wrong_id))
        unknown = {**box.call, "allocation_key": other_key, "instance_id": L.instance_name(other_key)}
        with pytest.raises(SandboxNotFound):
            await p.inspect(InspectRequest(**unknown))
        assert (await p.inspect(InspectRequest(**box.call))).state == "active"
    finally:
        await box.release()


async def test_exec_honours_stdin_env_cwd_timeout_and_output_caps(kit: Kit) -> None:
    box = await kit.up("exec")
    try:
        r = await box.exec("cat", stdin=b"from stdin\n")
        assert r.stdout == b"from stdin\n" and r.exit_code == 0
        r = await box.sh('echo "$GREETING"; pwd; echo oops >&2; exit 3', env={"GREETING": "hi"}, cwd="/tmp")
        assert (r.stdout, r.stderr, r.exit_code) == (b"hi\n/tmp\n", b"oops\n", 3)
        r = await box.sh("head -c 50000 /dev/zero; head -c 40000 /dev/zero >&2", cap=1000)
        assert (len(r.stdout), len(r.stderr), r.stdout_truncated, r.stderr_truncated) == (1000, 1000, True, True)
        r = await box.sh("head -c 1000 /dev/zero", cap=1000)
        assert (len(r.stdout), r.stdout_truncated) == (1000, False)
        loop = asyncio.get_running_loop()
        started = loop.time()
        r = await box.sh("echo before; sleep 30 & sleep 30; echo after", timeout_ms=600)
        assert r.timed_out and r.stdout == b"before\n" and loop.time() - started < 10
        left = await box.sh("ps -o args | grep -c '[s]leep 30' || true")
        assert left.stdout.strip() == b"0", "the timed-out process group was killed"
        r = await box.exec("/no/such/program")
        assert r.exit_code != 0 and not r.timed_out
    finally:
        await box.release()


async def test_release_reaps_every_process(kit: Kit) -> None:
    box = await kit.up("reap")
    try:
        await box.sh("setsid sleep 300 > /dev/null 2>&1 & sleep 301 > /dev/null 2>&1 & sleep 0.3")
        pids = [int(p[1]) for p in box.container().top()["Processes"] if "sleep 30" in p[-1]]
        assert len(pids) == 2
    finally:
        await box.release()
    for pid in pids:
        with pytest.raises(FileNotFoundError):
            open(f"/proc/{pid}/cmdline").read()  # noqa: SIM115


async def test_compensate_reclaims_by_label_even_cold(kit: Kit, tmp_path: Any) -> None:
    data = b"staged"
    plan = MountPlan(target="/workspace", files=(MountFile(path="f", size=len(data), digest=sha(data)),))
    key, inst = await kit.provision("half", mounts=(plan,))
    p = kit.provider
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    await p.write_file(WriteFileRequest(**call, path="/workspace/f", size=len(data), digest=sha(data)), data)
    flt = {"label": [f"{L.ALLOCATION_KEY}={key}", f"{L.RUNNER_TAG}={kit.runner_tag}"]}
    objects = len(kit.client.containers.list(all=True, filters=flt, ignore_removed=True)) + len(
        kit.client.volumes.list(filters=flt)
    )
    assert objects == 2 + 3 + 1  # sandbox and stager; three areas and one mount volume
    cold = DockerProvider(state_dir=kit.docker.state_dir, cache_tag=kit.runner_tag, workers=4)
    try:
        request = CompensateRequest(target=kit.target, lease=LEASE, allocation_key=key, runner_tag=kit.runner_tag)
        other_tag = request.model_copy(update={"runner_tag": kit.runner_tag + "x"})
        assert (await cold.compensate(other_tag)).reclaimed == 0
        first = await cold.compensate(request)
        assert first.reclaimed == objects + 1  # and the staging spool
        check_echo(first, target=kit.target, lease=LEASE, allocation_key=key)
        assert (await cold.compensate(request)).reclaimed == 0
    finally:
        cold.close()
    assert not kit.client.containers.list(all=True, filters=flt, ignore_removed=True) and not kit.client.volumes.list(
        filters=flt
    )


async def test_compensating_an_image_still_in_use_is_a_retryable_failure(kit: Kit) -> None:
    # A 409 from the engine while reclaiming means busy, not a state conflict of the caller's: compensate
    # lists no SandboxStateConflict. Here the allocation's image still runs a container of another allocation.
    key, user_key = kit.key("busy-image"), kit.key("image-user")
    api = kit.client.api
    holder = api.create_container(
        kit.image, ["true"], labels={L.ALLOCATION_KEY: user_key, L.RUNNER_TAG: kit.runner_tag}
    )
    image = api.commit(holder["Id"], conf={"Labels": {L.ALLOCATION_KEY: key, L.RUNNER_TAG: kit.runner_tag}})
    api.create_container(image["Id"], ["true"], labels={L.ALLOCATION_KEY: user_key, L.RUNNER_TAG: kit.runner_tag})

    def compensate(allocation_key: str) -> CompensateRequest:
        return CompensateRequest(
            target=kit.target, lease=LEASE, allocation_key=allocation_key, runner_tag=kit.runner_tag
        )

    with pytest.raises(SandboxProviderFailed) as busy:
        await kit.provider.compensate(compensate(key))
    assert busy.value.retryable
    assert (await kit.provider.compensate(compensate(user_key))).reclaimed == 2
    assert (await kit.provider.compensate(compensate(key))).reclaimed == 1


async def test_many_sandboxes_at_once(kit: Kit) -> None:
    boxes = await asyncio.gather(*(kit.up(f"many{i}") for i in range(6)))
    try:
        results = await asyncio.gather(*(b.sh("sleep 1; hostname") for b in boxes))
        assert all(r.stdout == b"sandbox\n" for r in results)
    finally:
        await asyncio.gather(*(b.release() for b in boxes))


async def test_a_missing_root_image_leaves_nothing(kit: Kit) -> None:
    missing = "sha256:" + "0" * 64
    for mounts in ((), (MountPlan(target="/workspace", files=()),)):
        key = kit.key("noimage")
        with pytest.raises(SandboxNotFound):
            await kit.provider.provision(kit.provision_request(key, mounts=mounts, root_image=missing))
        flt = {"label": f"{L.ALLOCATION_KEY}={key}"}
        assert not kit.client.containers.list(
            all=True, filters=flt, ignore_removed=True
        ) and not kit.client.volumes.list(filters=flt)
