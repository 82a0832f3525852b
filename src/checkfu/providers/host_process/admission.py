"""What the host-process tier refuses, and why: checked before anything of an instance exists.

What is unmet is the contract's own capability rule (``unmet_requirements``, the
rule ``require_capabilities`` raises on), as for every provider. This module adds
only what the host-process tier knows of itself: its root image can only be the
host, the reason it can confine no network and attest no zero retention, and that
the network mode is named first (the limit a confined profile meets first). The
runner checks the same rule before any provider call; the provider checks again
so that a request that reaches it anyway starts nothing.
"""

from __future__ import annotations

from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxCapabilityUnavailable, Unmet
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import HOST_IMAGE, SandboxProfile
from checkfu.contract.requirements import unmet_requirements
from checkfu.contract.vocabulary import Platform
from checkfu.providers.host_process.envelope import PROVIDER

NETWORK = "profile.network_policy.mode"

WHY: dict[str, str] = {
    NETWORK: "the host-process tier runs on the host's own network, unrestricted",
    "profile.retention_mode": "a shared host disk cannot attest zero data retention",
}
"""Why the tier falls short, by the field of an unmet need."""


def refuse_unmet(
    env: SandboxProviderCapabilities,
    profile: SandboxProfile,
    platform: Platform,
    mounts: tuple[MountPlan, ...] = (),
    root_image: str = HOST_IMAGE,
) -> None:
    """Refuse, before anything starts, a request whose needs ``env`` does not meet.

    Raises:
        SandboxCapabilityUnavailable: listing every unmet need, the network mode first.
    """
    unmet = [
        Unmet(u.field, f"{u.reason}: {WHY[u.field]}") if u.field in WHY else u
        for u in unmet_requirements(env, profile, platform=platform, mount_count=len(mounts))
    ]
    if root_image != HOST_IMAGE:
        unmet.append(Unmet("root_image", f"{root_image!r} is not offered; only {HOST_IMAGE!r}"))
    unmet.sort(key=lambda u: u.field != NETWORK)
    if unmet:
        raise SandboxCapabilityUnavailable(unmet, provider=PROVIDER)
