"""The nine-axis enforcement statement: who realizes each isolation control."""

from __future__ import annotations

from typing import Literal

from checkfu.contract.model import Model

Authority = Literal["runner_enforced", "provider_attested", "guest_observed", "not_enforced"]
AUTHORITIES: tuple[Authority, ...] = ("runner_enforced", "provider_attested", "guest_observed", "not_enforced")
"""Strongest first."""

Axis = Literal[
    "sandbox_isolation",
    "root_read_only",
    "non_root",
    "no_new_privileges",
    "capabilities_dropped",
    "mounts_sealed",
    "disk_limit",
    "network_policy",
    "resource_limits",
]
AXES: tuple[Axis, ...] = (
    "sandbox_isolation",
    "root_read_only",
    "non_root",
    "no_new_privileges",
    "capabilities_dropped",
    "mounts_sealed",
    "disk_limit",
    "network_policy",
    "resource_limits",
)


def counts_as_enforcement(authority: Authority) -> bool:
    """``runner_enforced`` and ``provider_attested`` count; ``guest_observed`` and ``not_enforced`` do not."""
    return authority in ("runner_enforced", "provider_attested")


def authority_rank(authority: Authority) -> int:
    """0 for the strongest authority, 3 for ``not_enforced``."""
    return AUTHORITIES.index(authority)


class EnforcementStatement(Model):
    """All nine axes, each with the authority that realizes it. None may be omitted."""

    sandbox_isolation: Authority
    root_read_only: Authority
    non_root: Authority
    no_new_privileges: Authority
    capabilities_dropped: Authority
    mounts_sealed: Authority
    disk_limit: Authority
    network_policy: Authority
    resource_limits: Authority

    def authority(self, axis: Axis) -> Authority:
        value: Authority = getattr(self, axis)
        return value

    def items(self) -> list[tuple[Axis, Authority]]:
        return [(axis, self.authority(axis)) for axis in AXES]

    def not_counting(self) -> list[Axis]:
        """The axes whose authority does not count as enforcement."""
        return [axis for axis, auth in self.items() if not counts_as_enforcement(auth)]

    def runner_enforced(self) -> list[Axis]:
        return [axis for axis, auth in self.items() if auth == "runner_enforced"]

    @classmethod
    def uniform(cls, authority: Authority) -> EnforcementStatement:
        return cls(**{axis: authority for axis in AXES})
