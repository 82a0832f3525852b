"""What the Docker provider advertises, and the check that it never quietly serves less.

Every claim here is one a test in ``tests/providers/docker`` proves against the
real engine: all nine enforcement axes are ``runner_enforced`` because this
in-tree code sets every container flag itself (see ``spec.py``).

Network: ``none``, and ``allowlist`` whenever the engine holds the egress image
(``egress.py``, ``docs/egress.md``). ``network_policy`` stays ``runner_enforced``
in both modes, because every control an allowlist rests on is set by this
package's own code and checked after start: the sandbox's ``NetworkMode: none``
(only ``lo``: no route, no resolver it can reach, whatever the engine's iptables
or DNS settings), the one door into it (opened by this code's door container,
which refuses a namespace holding anything but ``lo``), and the filter behind
the door (``egress_proxy.py``, this package's code, given the profile's list and
nothing else; a proxy that is not running, not hardened or allowing another
list stops the sandbox at ``activate``). Nothing in the engine's configuration
can widen what the sandbox reaches; a wrong one can only make a listed
destination unreachable.

The egress grade is ``advisory_filter`` and never more: the proxy decides by
name, address and port, and does not see inside the connections it allows, so a
listed destination that relays (an open proxy, a tunnel, a shared CDN address)
carries the sandbox further; names are trusted to the proxy's resolver (only
public addresses, or addresses listed themselves); and ``security_boundary``
comes only from an egress matrix the control plane runs itself (contract section 8), which
this runner does not have.
"""

from __future__ import annotations

import os
import platform as host_platform
from dataclasses import dataclass
from typing import Any

from checkfu.contract.enforcement import AXES, EnforcementStatement
from checkfu.contract.envelope import LifecycleAssurances, SandboxProviderCapabilities
from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxIdentityMismatch, Unmet
from checkfu.contract.members import Call
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import HOST_IMAGE, SandboxProfile
from checkfu.contract.requirements import unmet_requirements
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.vocabulary import PackageManager, Platform, Resources

PROVIDER = "docker"
PROVIDER_REVISION = "checkfu-docker 1"
MATERIALIZATION_REVISION = "checkfu-docker-images 1"
PACKAGE_MANAGERS: tuple[PackageManager, ...] = ("apt", "pip")

MINIMUM = Resources(cpu_millis=100, memory_mib=16, disk_mib=16, pids=16)
"""``disk_mib`` 16 leaves every writable area at least 1 MiB after the split (see ``spec.split_disk``)."""

ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class HostFacts:
    """What the envelope's platform and ceilings are computed from."""

    architecture: str
    cpus: int
    memory_mib: int


def host_facts() -> HostFacts:
    """This host's architecture, CPU count and memory.

    Raises:
        SandboxCapabilityUnavailable: the architecture is neither amd64 nor arm64.
    """
    machine = host_platform.machine().lower()
    arch = ARCHITECTURES.get(machine)
    if arch is None:
        raise SandboxCapabilityUnavailable([Unmet("platforms", f"host architecture {machine!r} is not amd64 or arm64")])
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    memory = max(MINIMUM.memory_mib, (pages * page) >> 20)
    return HostFacts(architecture=arch, cpus=os.cpu_count() or 1, memory_mib=memory)


def engine_facts(engine: Any) -> HostFacts:
    """The architecture, CPUs and memory of the host an engine runs on, as the engine reports them
    (for an engine on another host, whose ceilings are not this host's).

    Raises:
        SandboxCapabilityUnavailable: the engine's architecture is neither amd64 nor arm64.
    """
    info = engine.api.info()
    machine = str(info.get("Architecture", "")).lower()
    arch = ARCHITECTURES.get(machine)
    if arch is None:
        raise SandboxCapabilityUnavailable(
            [Unmet("platforms", f"engine architecture {machine!r} is not amd64 or arm64")]
        )
    cpus = int(info.get("NCPU") or 1)
    memory = max(MINIMUM.memory_mib, int(info.get("MemTotal") or 0) >> 20)
    return HostFacts(architecture=arch, cpus=cpus, memory_mib=memory)


def build_envelope(
    facts: HostFacts, *, user_namespace: bool = False, allowlist: bool = True
) -> SandboxProviderCapabilities:
    """The Docker provider's envelope on a host with ``facts``; ``user_namespace`` when the engine
    runs with userns-remap, so each sandbox's root is not the host's root; ``allowlist`` when the
    engine holds the image the egress proxy runs in.

    The writable areas are memory-backed (tmpfs), so ``maximum_resources.disk_mib``
    is bounded by the host's memory like ``memory_mib``.
    """
    arch = "arm64" if facts.architecture == "arm64" else "amd64"
    maximum = Resources(
        cpu_millis=max(MINIMUM.cpu_millis, facts.cpus * 1000),
        memory_mib=facts.memory_mib,
        disk_mib=max(MINIMUM.disk_mib, facts.memory_mib // 2),
        pids=32768,
    )
    return SandboxProviderCapabilities(
        provider=PROVIDER,
        provider_revision=PROVIDER_REVISION,
        materialization_revision=MATERIALIZATION_REVISION,
        placement="local",
        tiers=("container",),
        platforms=(Platform(os="linux", architecture=arch),),
        image_mode="profile",
        fixed_base_images=(),
        package_managers=PACKAGE_MANAGERS,
        network_modes=("none", "allowlist") if allowlist else ("none",),
        retention_modes=("durable", "ephemeral_zdr"),
        snapshots=True,
        snapshot_custody="runner",
        enforcement=EnforcementStatement(**{axis: "runner_enforced" for axis in AXES}),
        egress_certification="advisory_filter" if allowlist else "unsupported",
        list_dir=True,
        minimum_resources=MINIMUM,
        maximum_resources=maximum,
        max_mounts=64,
        operations=("openProcess", "readFiles", "listAllocations"),
        terminal=True,
        writable_mounts=True,
        mount_symlinks=True,
        lifecycle_assurances=LifecycleAssurances(
            release_destroys=True,
            release_idempotent=True,
            reaps_process_tree=True,
            cold_compensation=True,
            enumerates_allocations=True,
        ),
        user_namespace=user_namespace,
    )


def check_target(request: Call, target: ExecutionTarget) -> None:
    """Raises SandboxIdentityMismatch when ``request`` is addressed to another adapter."""
    if request.target != target:
        raise SandboxIdentityMismatch(
            f"target: request is for {request.target}, this provider is {target}", field="target"
        )


def unmet_needs(
    envelope: SandboxProviderCapabilities,
    profile: SandboxProfile,
    platform: Platform,
    mounts: tuple[MountPlan, ...] = (),
) -> list[Unmet]:
    """Every requirement of ``profile`` (and the attempt's platform and mounts) ``envelope`` does not meet:
    the contract's own rule, plus the one image this tier can never run."""
    unmet = unmet_requirements(envelope, profile, platform=platform, mount_count=len(mounts))
    if profile.base_image == HOST_IMAGE:
        unmet.append(Unmet("profile.base_image", "'host' is the host-process tier's image, not a container image"))
    return unmet


def require_served(
    envelope: SandboxProviderCapabilities,
    profile: SandboxProfile,
    platform: Platform,
    mounts: tuple[MountPlan, ...] = (),
) -> None:
    """Raises SandboxCapabilityUnavailable listing every unmet need, if there is any."""
    unmet = unmet_needs(envelope, profile, platform, mounts)
    if unmet:
        raise SandboxCapabilityUnavailable(unmet, provider=envelope.provider)
