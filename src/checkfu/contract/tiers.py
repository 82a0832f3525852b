"""What an envelope amounts to: the seed's tiers, and what it cannot serve.

The seed names three tiers for a provider: day one (ephemeral, network ``none``,
mounts staged by the runner), durable (adds snapshots, clone, resume and
enumeration) and Docker parity (adds physically-contained file reads,
``allowlist`` egress and, for a third party, provider snapshot custody). An
envelope short of day one is ``below_day_one``: it may be allowed, but never quietly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from checkfu.contract.enforcement import Axis
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.vocabulary import NETWORK_MODES, PACKAGE_MANAGERS, RETENTION_MODES

TierName = Literal["below_day_one", "day_one", "durable", "docker_parity"]
TIER_LABELS: dict[TierName, str] = {
    "below_day_one": "below the day-one tier",
    "day_one": "day one",
    "durable": "durable",
    "docker_parity": "Docker parity",
}


@dataclass(frozen=True)
class Assessment:
    tier: TierName
    short_of_next: tuple[str, ...]
    """What the envelope lacks to reach the next tier (empty at Docker parity)."""
    not_counting: tuple[Axis, ...]
    """Axes whose authority does not count as enforcement."""
    cannot_serve: tuple[str, ...] = field(default=())
    """Every capability the envelope does not declare, in words."""

    @property
    def label(self) -> str:
        return TIER_LABELS[self.tier]


def _day_one_gaps(env: SandboxProviderCapabilities) -> list[str]:
    gaps = []
    if "ephemeral_zdr" not in env.retention_modes:
        gaps.append("retention 'ephemeral_zdr'")
    if "none" not in env.network_modes:
        gaps.append("network mode 'none'")
    if env.max_mounts < 1:
        gaps.append("at least one mount (max_mounts >= 1)")
    return gaps


def _durable_gaps(env: SandboxProviderCapabilities) -> list[str]:
    gaps = []
    if not env.snapshots:
        gaps.append("snapshots, clone and resume")
    if "durable" not in env.retention_modes:
        gaps.append("retention 'durable'")
    if not env.list_dir:
        gaps.append("enumeration (list_dir)")
    return gaps


def _parity_gaps(env: SandboxProviderCapabilities, *, in_tree: bool) -> list[str]:
    gaps = []
    if "readFiles" not in env.operations:
        gaps.append("physically-contained file reads (readFiles)")
    if "allowlist" not in env.network_modes:
        gaps.append("'allowlist' egress")
    elif env.egress_certification == "unsupported":
        gaps.append("a certified 'allowlist' (egress_certification above 'unsupported')")
    if not in_tree and env.snapshot_custody != "provider":
        gaps.append("provider snapshot custody")
    return gaps


def assess(env: SandboxProviderCapabilities, *, in_tree: bool = False) -> Assessment:
    """The tier ``env`` reaches, what it lacks for the next, and what it cannot serve.

    Docker parity is measured against the in-tree Docker tier, which keeps its snapshots in the
    runner's custody; a third party reaches it only with provider snapshot custody as well, as the
    seed's tier table says.
    """
    tier: TierName = "below_day_one"
    short = _day_one_gaps(env)
    if not short:
        tier, short = "day_one", _durable_gaps(env)
        if not short:
            tier, short = "durable", _parity_gaps(env, in_tree=in_tree)
            if not short:
                tier = "docker_parity"
    return Assessment(
        tier=tier,
        short_of_next=tuple(short),
        not_counting=tuple(env.enforcement.not_counting()),
        cannot_serve=tuple(cannot_serve(env)),
    )


def cannot_serve(env: SandboxProviderCapabilities) -> list[str]:
    """Each thing a profile or a Run might ask for that ``env`` does not declare."""
    out: list[str] = []
    missing_net = [m for m in NETWORK_MODES if m not in env.network_modes]
    if missing_net:
        out.append("network modes " + ", ".join(missing_net))
    missing_ret = [m for m in RETENTION_MODES if m not in env.retention_modes]
    if missing_ret:
        out.append("retention " + ", ".join(missing_ret))
    if env.image_mode == "fixed":
        out.append("images built from a profile (fixed base images only: " + ", ".join(env.fixed_base_images) + ")")
    missing_pm = [m for m in PACKAGE_MANAGERS if m not in env.package_managers]
    if missing_pm:
        out.append("package managers " + ", ".join(missing_pm))
    if env.max_mounts == 0:
        out.append("mounts")
    if not env.snapshots:
        out.append("snapshot, clone and resume")
    if not env.list_dir:
        out.append("listDir")
    for op, what in (
        ("openProcess", "openProcess (one-shot harnesses only)"),
        ("readFiles", "readFiles (no writeback or capture)"),
        ("listAllocations", "listAllocations"),
    ):
        if op not in env.operations:
            out.append(what)
    if env.egress_certification == "unsupported":
        out.append("certified egress")
    if not env.user_namespace:
        out.append("a user namespace per sandbox (uid 0 inside would be uid 0 on the host)")
    not_made = [name for name, value in env.lifecycle_assurances if not value]
    if not_made:
        out.append("lifecycle assurances " + ", ".join(not_made))
    return out
