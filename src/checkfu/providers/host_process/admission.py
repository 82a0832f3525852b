"""What the host-process tier refuses, and why: checked before anything of an instance exists.

The runner's own capability check refuses these too, before any provider call;
the provider checks again so that a request that reaches it anyway starts
nothing. Each unmet need is named by its field, the network mode first.
"""

from __future__ import annotations

from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxCapabilityUnavailable, Unmet
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import HOST_IMAGE, SandboxProfile
from checkfu.contract.vocabulary import Platform
from checkfu.providers.host_process.envelope import PROVIDER


def image_unmet(env: SandboxProviderCapabilities, profile: SandboxProfile, platform: Platform) -> list[Unmet]:
    """What of the image a profile asks for the tier cannot give: tier, base image, packages, platform."""
    unmet: list[Unmet] = []
    if profile.tier not in env.tiers:
        unmet.append(Unmet("profile.tier", f"{profile.tier!r} is not offered; only 'container'"))
    if profile.base_image not in env.fixed_base_images:
        unmet.append(Unmet("profile.base_image", "the host-process tier runs on the host itself: only 'host'"))
    if profile.package_managers:
        unmet.append(Unmet("profile.packages", "no package materialization: " + ", ".join(profile.package_managers)))
    if platform not in env.platforms:
        unmet.append(Unmet("platform", f"the host is {env.platforms[0].os}/{env.platforms[0].architecture}"))
    return unmet


def refuse_unmet(
    env: SandboxProviderCapabilities,
    profile: SandboxProfile,
    platform: Platform,
    mounts: tuple[MountPlan, ...],
    root_image: str,
) -> None:
    """Refuse, before anything starts, a request whose needs ``env`` does not meet.

    Raises:
    SandboxCapabilityUnavailable: listing every unmet need, the network mode first.
    """
    unmet: list[Unmet] = []
    mode = profile.network_policy.mode
    if mode not in env.network_modes:
        unmet.append(
            Unmet(
                "profile.network_policy.mode",
                f"{mode!r} is not offered: the host-process tier runs on the host's own network "
                "and offers 'unrestricted' only",
            )
        )
    unmet.extend(image_unmet(env, profile, platform))
    if profile.retention_mode not in env.retention_modes:
        unmet.append(
            Unmet(
                "profile.retention_mode",
                f"{profile.retention_mode!r} is not offered: a shared host disk cannot attest zero data retention",
            )
        )
    for problem in profile.resource_limits.within(env.minimum_resources, env.maximum_resources):
        dim, reason = problem.split(": ", 1)
        unmet.append(Unmet(f"profile.resource_limits.{dim}", reason))
    if mounts:
        unmet.append(Unmet("mounts", f"{len(mounts)} asked, the host-process tier takes none (max_mounts 0)"))
    if root_image != HOST_IMAGE:
        unmet.append(Unmet("root_image", f"{root_image!r} is not offered; only 'host'"))
    if unmet:
        raise SandboxCapabilityUnavailable(unmet, provider=PROVIDER)
