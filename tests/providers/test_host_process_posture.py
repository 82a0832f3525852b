"""The posture oracle (``tests/posture.py``) on the host-process tier: its envelope claims almost nothing, and the
oracle confirms that it is exactly so. On every axis the envelope calls ``not_enforced`` a harness process is the
runner's own posture (same namespaces, user, capabilities, no_new_privs, mounts and network: the tier adds
nothing); ``resource_limits``, claimed only with cgroups, holds to the profile's figures in the kernel's own cgroup
files; and no descriptor of the runner but the process's own streams is open in it.

The process is found in the host's process table by a command line no other process has, never through the
provider.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from test_host_process import Kit, kit, pg_kit

import posture
from checkfu.contract.enforcement import AXES, counts_as_enforcement
from checkfu.contract.members import OpenProcessRequest

__all__ = ["kit", "pg_kit"]

pytestmark = pytest.mark.anyio

LIMITS = {"cpu_millis": 300, "memory_mib": 96, "disk_mib": 64, "pids": 48}


async def find(marker: str) -> list[posture.Posture]:
    """The processes whose command line holds ``marker``, once they run it (not while they are still forking)."""
    for _ in range(200):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if marker.encode() in argv:
                    found.append(int(name))
        postures = posture.read_all(found)
        if postures and all(p.comm == "sleep" for p in postures):
            return postures
        await asyncio.sleep(0.05)
    raise AssertionError(f"no process runs {marker}")


async def posture_of_a_sandbox_process(kit: Kit, key: str) -> list[posture.Posture]:
    call = await kit.active(key, profile=kit.profile(resource_limits=LIMITS))
    marker = f"37.{os.getpid()}{len(key)}"
    proc = await kit.provider.open_process(OpenProcessRequest(**call, argv=["sleep", marker]))
    try:
        return await find(marker)
    finally:
        await proc.kill()
        _ = [e async for e in proc.events()]
        await kit.release(call)


async def check(kit: Kit, key: str) -> None:
    envelope = (await kit.provider.describe()).envelope
    found = await posture_of_a_sandbox_process(kit, key)
    runner = posture.read(os.getpid())
    asked = posture.Asked(kit.profile(resource_limits=LIMITS))
    report = posture.examine(found, asked, inherited_pipes=True)
    for p in found:
        for axis in AXES:
            if counts_as_enforcement(envelope.enforcement.authority(axis)):
                assert report.findings[p.pid][axis].holds, report.findings[p.pid][axis].evidence
            else:
                assert posture.unchanged(p, runner, axis), f"{axis}: the tier claims nothing, yet it differs"
        assert report.leaks[p.pid] == [], report.leaks[p.pid]
        assert [d.fd for d in p.descriptors] == [0, 1, 2]


async def test_every_unclaimed_axis_is_the_runners_own_and_the_limits_hold_with_cgroups(kit: Kit) -> None:
    envelope = (await kit.provider.describe()).envelope
    if kit.provider.cgroup_reason is None:
        assert envelope.enforcement.runner_enforced() == ["resource_limits"]
    await check(kit, "ak-posture")


async def test_without_cgroups_nothing_is_claimed_and_nothing_differs(pg_kit: Kit) -> None:
    envelope = (await pg_kit.provider.describe()).envelope
    assert envelope.enforcement.not_counting() == list(AXES)
    await check(pg_kit, "ak-posture-pg")
