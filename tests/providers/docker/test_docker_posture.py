"""The posture oracle (``tests/posture.py``) on the Docker tier: every process of a sandbox, read from the host's
``/proc``, holds every axis the envelope claims, exactly as the profile asked, and nothing of the runner is open
in it.

The processes are found through the engine (the container's init pid) and the process table (everything in its
pid namespace: the init, the sandbox's command and two ``docker exec`` processes kept open through
``openProcess``), never through the provider. The oracle is itself checked: on a plain container without the
hardening it finds every axis not held, so a pass cannot come from an oracle that never fails.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from docker_kit import Box, Kit

import posture
from checkfu.contract.enforcement import AXES, counts_as_enforcement
from checkfu.contract.members import OpenProcessRequest
from checkfu.contract.process import ProcessExit
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.spec import split_disk

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MIB = 1 << 20


@dataclass
class Posed:
    box: Box
    profile: SandboxProfile
    postures: list[posture.Posture]


@pytest.fixture
async def posed(kit: Kit) -> AsyncIterator[Posed]:
    """A sandbox with a mount, tight limits, and two processes kept open in it while the oracle reads."""
    profile = kit.profile(cpu_millis=250, memory_mib=64, pids=32, disk_mib=16)
    box = await kit.up("posture", profile=profile, files={"/workspace/README": b"hello\n"})
    try:
        procs = [
            await kit.provider.open_process(OpenProcessRequest(**box.call, argv=("sh", "-c", "read x; echo $x")))
            for _ in range(2)
        ]
        init = int(kit.client.api.inspect_container(box.instance_id)["State"]["Pid"])
        found: list[posture.Posture] = []
        for _ in range(200):  # the exec'd shell appears a moment after openProcess answers, first as runc's init
            found = posture.read_all(posture.pids_in_namespace_of(init))
            if sorted(p.comm for p in found) == PROCESSES:
                break
            await asyncio.sleep(0.05)
        yield Posed(box, profile, found)
        for proc in procs:
            await proc.send_stdin(b"bye\n")
            await proc.close_stdin()
            assert [e async for e in proc.events()][-1] == ProcessExit(exit_code=0)
    finally:
        await box.release()


PROCESSES = ["docker-init", "sh", "sh", "sleep"]
"""The engine's init, the two processes and the sandbox's command."""


async def test_every_process_holds_every_axis_the_envelope_claims(posed: Posed, kit: Kit) -> None:
    envelope = (await kit.provider.describe()).envelope
    assert sorted(p.comm for p in posed.postures) == PROCESSES, posed.postures
    asked = posture.Asked(posed.profile, mount_targets=("/workspace",), user_namespace=envelope.user_namespace)
    report = posture.examine(posed.postures, asked)
    expected = {axis: counts_as_enforcement(envelope.enforcement.authority(axis)) for axis in AXES}
    assert all(expected.values()), "the Docker tier claims all nine axes"
    assert report.failures(expected) == []
    assert report.fields_checked >= len(posed.postures) * 20


async def test_each_process_runs_under_a_group_of_its_own(posed: Posed, kit: Kit) -> None:
    """Seen from the host: the two processes and the sandbox's command run as the sandbox user, each under a primary
    group of its own, the user's group among their groups; so none may trace another (``ptrace_may_access``)."""
    user = kit.docker.user
    ours = [p for p in posed.postures if p.comm in ("sh", "sleep")]
    assert all(set(p.uids) == {user.uid} and user.gid in p.groups for p in ours), ours
    primary = [p.gids for p in ours]
    assert all(len(set(g)) == 1 for g in primary) and len({g[0] for g in primary}) == 3, primary


async def test_exactly_what_the_profile_asked(posed: Posed, kit: Kit) -> None:
    """Beyond each axis holding: the limits are the profile's to the unit, the writable places are exactly the
    areas of ``disk_mib``, the mount is where the plan put it, and the cgroup is the container's own."""
    areas = {a.path: a.size_kib for a in split_disk(16, kit.docker.user)}
    host = posture.host_namespaces()
    container = kit.client.api.inspect_container(posed.box.instance_id)["Id"]
    for p in posed.postures:
        assert p.limits.memory_bytes == p.limits.memory_swap_bytes == 64 * MIB, p.limits
        assert (p.limits.pids, p.limits.cpu_quota_us, p.limits.cpu_period_us) == (32, 25_000, 100_000), p.limits
        assert all(container in where for where in p.limits.where.values()), p.limits.where
        writable = {m.mount_point: m.size_kib for m in posture.writable_places(p)}
        assert writable == areas, writable
        for point in areas:
            mount = p.mount_at(point)
            assert mount is not None and {"nosuid", "nodev"} <= mount.options | set(mount.super_options), mount
        workspace = p.mount_at("/workspace")
        assert workspace is not None and workspace.read_only and workspace.fstype != "tmpfs"
        assert p.interfaces == ("lo",) and p.routes == ()
        assert min(p.uids) > 0 and p.uids == (kit.docker.user.uid,) * 4
        assert min(p.gids) > 0 and len(set(p.gids)) == 1 and kit.docker.user.gid in (p.gids[0], *p.groups)
        assert p.seccomp == posture.SECCOMP_FILTER and p.no_new_privs == 1
        assert p.namespaces["user"] == host["user"], "the envelope claims no user namespace on this engine"
        assert [d.fd for d in p.descriptors] == [0, 1, 2], p.descriptors


# the oracle can fail -------------------------------------------------------------------------------------


@pytest.fixture
def bare(kit: Kit, client: Any, tmp_path: Any) -> Iterator[list[posture.Posture]]:
    """A plain container of the same image without any hardening: root, default capabilities, writable root,
    the host's network and UTS namespaces, no limits, a writable volume at ``/workspace``, and a runner file
    passed in as a descriptor."""
    (tmp_path / "README").write_text("hello\n")
    c = client.containers.run(
        kit.image,
        ["sh", "-c", "exec 3</workspace/README; sleep 60"],
        detach=True,
        network_mode="host",
        uts_mode="host",
        volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}},
        labels={L.RUNNER_TAG: kit.runner_tag, L.ALLOCATION_KEY: f"{kit.runner_tag}-bare"},
    )
    try:
        init = int(client.api.inspect_container(c.id)["State"]["Pid"])
        for _ in range(100):
            found = posture.read_all(posture.pids_in_namespace_of(init))
            if any(d.fd == 3 for p in found for d in p.descriptors):
                break
            asyncio.run(asyncio.sleep(0.05))
        yield found
    finally:
        c.remove(force=True, v=True)


def test_on_a_container_without_the_hardening_the_oracle_finds_every_axis_not_held(
    bare: list[posture.Posture], kit: Kit
) -> None:
    asked = posture.Asked(kit.profile(), mount_targets=("/workspace",))
    report = posture.examine(bare, asked)
    assert bare and all(not f.holds for per_axis in report.findings.values() for f in per_axis.values()), (
        report.findings
    )
    assert any(d.fd == 3 for leaks in report.leaks.values() for d in leaks), "a descriptor beyond 0-2 is a leak"


def test_a_runner_file_open_in_a_process_is_found(tmp_path: Any) -> None:
    """The descriptor check compares identities with the runner's own open files: a file the runner holds,
    open in another process, is a leak even on fd 0."""
    path = tmp_path / "journal.sqlite"
    path.write_bytes(b"x")
    with open(path, "rb") as held:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
            stdin=held,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Once it has started: while the interpreter starts, the loader holds the libraries it maps open
            # (libm.so.6 on fd 3, say), and one the runner holds open too would be found beside the file.
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
            found = posture.leaked(posture.read(child.pid), posture.runner_identities(), inherited_pipes=True)
            assert [(d.fd, d.target) for d in found] == [(0, str(path))]
        finally:
            child.kill()
            child.communicate()
