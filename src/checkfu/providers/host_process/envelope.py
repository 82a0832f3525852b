"""The host-process tier's envelope: weak, and exactly as weak as it is.

The harness runs as a bare process of the runner host: the host's network, the
host's filesystem, the runner's user. So the envelope offers ``unrestricted``
networking only, no mounts, no package materialization (the one fixed base image
``host``, the host's own userland), ``durable`` retention only (a shared host
disk cannot attest zero data retention) and snapshots of the working directory
in runner custody, which is what makes ``durable`` legal (contract.md section 2).

It is decided once, at construction, from what the host allows:

- with usable cgroup v1 hierarchies (freezer, pids, memory, cpu), every process
  is born in its instance's cgroups: ``resource_limits`` is ``runner_enforced``
  (cpu quota, memory limit with swap included, pids limit) and
  ``reaps_process_tree`` is true (the freezer tree holds even a ``setsid``
  escapee);
- without, the instance's trees are process groups: ``resource_limits`` is
  ``not_enforced`` and ``reaps_process_tree`` is false, because a process that
  calls ``setsid`` leaves its group and would survive ``release``.

Every other axis is ``not_enforced``; ``WHY_NOT_ENFORCED`` says why, axis by axis.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Literal

from checkfu.contract.codec import build
from checkfu.contract.enforcement import Axis, EnforcementStatement
from checkfu.contract.envelope import LifecycleAssurances, SandboxProviderCapabilities
from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.contract.profile import HOST_IMAGE
from checkfu.contract.vocabulary import Platform, Resources

PROVIDER = "host-process"
PROVIDER_REVISION = "checkfu-host-process 1"
MATERIALIZATION_REVISION = "host 1"
PLACEMENT: Literal["local"] = "local"

MINIMUM = Resources(cpu_millis=10, memory_mib=16, disk_mib=1, pids=8)
"""10 thousandths of a core is the kernel's smallest CPU quota at a 100 ms period."""
MAX_PIDS = 32768

WHY_NOT_ENFORCED: dict[Axis, str] = {
    "sandbox_isolation": "the harness is a bare process of the runner host, in the host's namespaces",
    "root_read_only": "the process sees the host's filesystem, writable wherever the runner's user may write",
    "non_root": "the process runs as the runner's own user",
    "no_new_privileges": "no_new_privs is not set; setuid programs of the host keep their power",
    "capabilities_dropped": "the process keeps every capability of the runner's user",
    "mounts_sealed": "the tier accepts no mounts, so there is nothing it seals",
    "disk_limit": "nothing bounds what the process writes to the host's disk",
    "network_policy": "the process uses the host's own network, unrestricted",
    "resource_limits": "the host lets the provider create no cgroups, so cpu, memory and pids are unbounded",
}


def host_platform() -> Platform:
    """The runner host's ``{os, architecture}``.

    Raises:
        SandboxAdapterUnavailable: the host is not Linux on amd64 or arm64.
    """
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if platform.system() != "Linux" or arch is None:
        raise SandboxAdapterUnavailable(
            f"platforms: the host-process tier runs on Linux amd64 or arm64, not {platform.system()} {machine}",
            field="platforms",
        )
    return Platform(os="linux", architecture="amd64" if arch == "amd64" else "arm64")


def host_maximum(state_dir: Path) -> Resources:
    """The most one instance may ask for: the host's cores and memory, the state disk's size."""
    cores = len(os.sched_getaffinity(0)) or 1
    memory_mib = MINIMUM.memory_mib
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_mib = int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    disk = os.statvfs(state_dir)
    return Resources(
        cpu_millis=max(cores * 1000, MINIMUM.cpu_millis),
        memory_mib=max(memory_mib, MINIMUM.memory_mib),
        disk_mib=max(disk.f_blocks * disk.f_frsize >> 20, MINIMUM.disk_mib),
        pids=MAX_PIDS,
    )


def enforcement(*, cgroups: bool) -> EnforcementStatement:
    """Every axis ``not_enforced``, except ``resource_limits`` when cgroups hold cpu, memory and pids."""
    statement = EnforcementStatement.uniform("not_enforced")
    if cgroups:
        statement = statement.model_copy(update={"resource_limits": "runner_enforced"})
    return statement


def envelope(*, cgroups: bool, maximum: Resources, host: Platform) -> SandboxProviderCapabilities:
    """The envelope this provider advertises on this host."""
    return build(
        SandboxProviderCapabilities,
        provider=PROVIDER,
        provider_revision=PROVIDER_REVISION,
        materialization_revision=MATERIALIZATION_REVISION,
        placement=PLACEMENT,
        tiers=["container"],
        platforms=[host],
        image_mode="fixed",
        fixed_base_images=[HOST_IMAGE],
        package_managers=[],
        network_modes=["unrestricted"],
        retention_modes=["durable"],
        snapshots=True,
        snapshot_custody="runner",
        enforcement=enforcement(cgroups=cgroups),
        egress_certification="unsupported",
        list_dir=False,
        minimum_resources=MINIMUM,
        maximum_resources=maximum,
        max_mounts=0,
        operations=["openProcess", "listAllocations"],
        terminal=True,
        lifecycle_assurances=LifecycleAssurances(
            release_destroys=False,
            release_idempotent=True,
            reaps_process_tree=cgroups,
            cold_compensation=True,
            enumerates_allocations=True,
        ),
    )
