"""``RunnerProviderCapability``: the server-owned ceiling a provider's envelope is intersected with.

A runner admits a provider only within its ceiling: the tiers, network modes,
retention modes, resource maxima and mount count it will run, and the two parts
that close the seed's blocking gaps:

- ``enforcement``: per axis, the strongest authority a provider may claim. For
  every third party it is ``provider_attested``: ``runner_enforced`` means this
  runner's own code set the control, which no third party can say.
- ``egress_certification``: the strongest egress grade. A third party is pinned to
  ``advisory_filter``: ``security_boundary`` is reachable only through an egress matrix
  the control plane runs itself (contract section 8), which this runner does not have,
  so no provider that is not in-tree is admitted with it, whatever evidence it brings.

``overreach(envelope, ceiling)`` names every field and axis where an envelope
claims more than a ceiling allows. Nothing is silently downgraded: a claim above
the ceiling is refused, by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from checkfu.contract.enforcement import AXES, Authority, EnforcementStatement, authority_rank
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.model import NONEMPTY, UNIQUE, UNIQUE_ITEMS, Model, NonNegInt
from checkfu.contract.vocabulary import (
    EGRESS_GRADES,
    NETWORK_MODES,
    RESOURCE_DIMENSIONS,
    RETENTION_MODES,
    TIERS,
    EgressGrade,
    NetworkMode,
    Resources,
    RetentionMode,
    Tier,
)

LARGE = Resources(cpu_millis=1 << 20, memory_mib=1 << 24, disk_mib=1 << 26, pids=1 << 22)


class RunnerProviderCapability(Model):
    """What a runner will admit of one provider, owned by the runner, not by the provider."""

    tiers: Annotated[tuple[Tier, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS] = TIERS
    network_modes: Annotated[tuple[NetworkMode, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS] = NETWORK_MODES
    retention_modes: Annotated[tuple[RetentionMode, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS] = RETENTION_MODES
    maximum_resources: Resources = LARGE
    max_mounts: NonNegInt = 64
    enforcement: EnforcementStatement = Field(
        default_factory=lambda: EnforcementStatement.uniform("provider_attested"),
        description="per axis, the strongest authority a provider may claim",
    )
    egress_certification: EgressGrade = Field(
        default="advisory_filter", description="the strongest egress grade a provider may claim"
    )


THIRD_PARTY: RunnerProviderCapability = RunnerProviderCapability()
"""Every third party: at most ``provider_attested`` on every axis, at most ``advisory_filter`` egress."""

IN_TREE: RunnerProviderCapability = RunnerProviderCapability(
    enforcement=EnforcementStatement.uniform("runner_enforced")
)
"""This package's own providers: ``runner_enforced`` is theirs to claim, because this runner's code set it.
Egress stays at ``advisory_filter``: ``security_boundary`` comes only from a matrix the control plane runs."""


@dataclass(frozen=True)
class Overreach:
    """One field or axis where an envelope claims more than the ceiling allows."""

    field: str
    claimed: str
    allowed: str

    def __str__(self) -> str:
        return f"{self.field}: claims {self.claimed}, the ceiling allows {self.allowed}"


def grade_rank(grade: EgressGrade) -> int:
    """0 for ``unsupported``, 2 for ``security_boundary``."""
    return EGRESS_GRADES.index(grade)


def overreach(envelope: SandboxProviderCapabilities, ceiling: RunnerProviderCapability) -> list[Overreach]:
    """Every claim of ``envelope`` above ``ceiling``, each naming its field or axis."""
    out: list[Overreach] = []
    for axis in AXES:
        claimed: Authority = envelope.enforcement.authority(axis)
        allowed = ceiling.enforcement.authority(axis)
        if authority_rank(claimed) < authority_rank(allowed):
            out.append(Overreach(f"enforcement.{axis}", claimed, f"at most {allowed}"))
    grade = envelope.egress_certification
    allowed_grade = ceiling.egress_certification
    if grade_rank(grade) > grade_rank(allowed_grade):
        why = (
            f"at most {allowed_grade} (security_boundary is reachable only through an egress matrix the control "
            "plane runs itself, which this runner does not have; no evidence stands in for it)"
            if grade == "security_boundary"
            else f"at most {allowed_grade}"
        )
        out.append(Overreach("egress_certification", grade, why))
    for name, claimed_set, allowed_set in (
        ("tiers", envelope.tiers, ceiling.tiers),
        ("network_modes", envelope.network_modes, ceiling.network_modes),
        ("retention_modes", envelope.retention_modes, ceiling.retention_modes),
    ):
        extra = [v for v in claimed_set if v not in allowed_set]
        if extra:
            out.append(Overreach(name, ", ".join(extra), f"only {', '.join(allowed_set)}"))
    for dim in RESOURCE_DIMENSIONS:
        claimed_max, allowed_max = getattr(envelope.maximum_resources, dim), getattr(ceiling.maximum_resources, dim)
        if claimed_max > allowed_max:
            out.append(Overreach(f"maximum_resources.{dim}", str(claimed_max), f"at most {allowed_max}"))
    if envelope.effective_max_mounts > ceiling.max_mounts:
        out.append(Overreach("max_mounts", str(envelope.max_mounts), f"at most {ceiling.max_mounts}"))
    return out
