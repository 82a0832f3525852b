"""Whether an envelope can serve a profile and an attempt: the check selection runs
before any provider work. Pure; every unmet requirement is listed, not just the first.
"""

from __future__ import annotations

from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxCapabilityUnavailable, Unmet
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import Platform


def unmet_requirements(
    envelope: SandboxProviderCapabilities,
    profile: SandboxProfile,
    *,
    platform: Platform,
    mount_count: int,
) -> list[Unmet]:
    """Every way ``envelope`` falls short of ``profile`` and the attempt, each naming its field."""
    unmet: list[Unmet] = []
    if profile.tier not in envelope.tiers:
        unmet.append(Unmet("profile.tier", f"tier {profile.tier!r} is not among {list(envelope.tiers)}"))
    if platform not in envelope.platforms:
        unmet.append(Unmet("platform", f"{platform.os}/{platform.architecture} is not an advertised platform"))
    if envelope.image_mode == "fixed" and profile.base_image not in envelope.fixed_base_images:
        unmet.append(
            Unmet("profile.base_image", f"only the fixed base images {list(envelope.fixed_base_images)} are served")
        )
    for manager in profile.package_managers:
        if envelope.image_mode == "fixed":
            unmet.append(Unmet(f"profile.packages.{manager}", "fixed images materialize no packages"))
        elif manager not in envelope.package_managers:
            unmet.append(Unmet(f"profile.packages.{manager}", f"package manager {manager!r} is not materialized"))
    mode = profile.network_policy.mode
    if mode not in envelope.network_modes:
        unmet.append(
            Unmet("profile.network_policy.mode", f"network mode {mode!r} is not among {list(envelope.network_modes)}")
        )
    retention = profile.retention_mode
    if retention not in envelope.retention_modes:
        unmet.append(
            Unmet("profile.retention_mode", f"retention {retention!r} is not among {list(envelope.retention_modes)}")
        )
    if retention == "durable" and not envelope.snapshots:
        unmet.append(Unmet("profile.retention_mode", "a durable Session needs snapshots, which are not served"))
    for problem in profile.resource_limits.within(envelope.minimum_resources, envelope.maximum_resources):
        dim = problem.split(":", 1)[0]
        unmet.append(Unmet(f"profile.resource_limits.{dim}", problem.split(": ", 1)[1]))
    if mount_count > envelope.effective_max_mounts:
        unmet.append(Unmet("mounts", f"{mount_count} mounts asked, at most {envelope.effective_max_mounts} served"))
    return unmet


def require_capabilities(
    envelope: SandboxProviderCapabilities,
    profile: SandboxProfile,
    *,
    platform: Platform,
    mount_count: int,
) -> None:
    """Raises SandboxCapabilityUnavailable listing every unmet requirement, if any."""
    unmet = unmet_requirements(envelope, profile, platform=platform, mount_count=mount_count)
    if unmet:
        raise SandboxCapabilityUnavailable(unmet, provider=envelope.provider)
