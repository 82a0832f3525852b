"""``SandboxProviderCapabilities``: the one value selection knows about a provider.

Every field, cross-field rule and downward default of the seed's table, plus the
two optional fields of contract.md section 2 (``operations`` and
``lifecycle_assurances``). Silence is never read as a capability claim: each
optional field decodes to its weakest legal value.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from checkfu.contract.enforcement import EnforcementStatement
from checkfu.contract.errors import SandboxEnvelopeInvalid, SandboxError
from checkfu.contract.model import NONEMPTY, UNIQUE, UNIQUE_ITEMS, Bool, Model, NonNegInt, rule_error
from checkfu.contract.profile import ImageRef
from checkfu.contract.target import ExecutionTarget, ProviderName, Revision
from checkfu.contract.vocabulary import (
    EgressGrade,
    ImageMode,
    NetworkMode,
    OptionalOperation,
    PackageManager,
    Placement,
    Platform,
    Resources,
    RetentionMode,
    SnapshotCustody,
    Tier,
)

MOUNT_CEILING = 64
"""No provision request may carry more mounts than this, whatever ``max_mounts`` says."""

Member = Literal[
    "describe",
    "materialize",
    "provision",
    "writeFile",
    "activate",
    "exec",
    "inspect",
    "release",
    "compensate",
    "openProcess",
    "readFiles",
    "listAllocations",
    "listDir",
    "snapshot",
    "deleteSnapshot",
    "clone",
    "resume",
]
REQUIRED_MEMBERS: tuple[Member, ...] = (
    "describe",
    "materialize",
    "provision",
    "writeFile",
    "activate",
    "exec",
    "inspect",
    "release",
    "compensate",
)
OPTIONAL_MEMBERS: tuple[Member, ...] = (
    "openProcess",
    "readFiles",
    "listAllocations",
    "listDir",
    "snapshot",
    "deleteSnapshot",
    "clone",
    "resume",
)
MEMBERS: tuple[Member, ...] = REQUIRED_MEMBERS + OPTIONAL_MEMBERS
SNAPSHOT_MEMBERS: tuple[Member, ...] = ("snapshot", "deleteSnapshot", "clone", "resume")


class LifecycleAssurances(Model):
    """Five promises about reclamation; each defaults to ``false``."""

    release_destroys: Bool = False
    release_idempotent: Bool = False
    reaps_process_tree: Bool = False
    cold_compensation: Bool = False
    enumerates_allocations: Bool = False


class SandboxProviderCapabilities(Model):
    """The capability envelope a provider advertises. Decoded strictly; rules fire at decode."""

    decode_error: ClassVar[type[SandboxError]] = SandboxEnvelopeInvalid

    provider: ProviderName
    provider_revision: Revision
    materialization_revision: Revision
    placement: Placement
    tiers: Annotated[tuple[Tier, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS]
    platforms: Annotated[tuple[Platform, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS]
    image_mode: ImageMode
    fixed_base_images: Annotated[tuple[ImageRef, ...], UNIQUE, UNIQUE_ITEMS]
    package_managers: Annotated[tuple[PackageManager, ...], UNIQUE, UNIQUE_ITEMS]
    network_modes: Annotated[tuple[NetworkMode, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS]
    retention_modes: Annotated[tuple[RetentionMode, ...], NONEMPTY, UNIQUE, UNIQUE_ITEMS]
    snapshots: Bool
    snapshot_custody: SnapshotCustody = "runner"
    enforcement: EnforcementStatement
    egress_certification: EgressGrade = "unsupported"
    list_dir: Bool = False
    minimum_resources: Resources
    maximum_resources: Resources
    max_mounts: NonNegInt
    operations: Annotated[tuple[OptionalOperation, ...], UNIQUE, UNIQUE_ITEMS] = Field(
        default=(), description="optional members served, besides those governed by list_dir and snapshots"
    )
    lifecycle_assurances: LifecycleAssurances = LifecycleAssurances()
    user_namespace: Bool = Field(
        default=False,
        description="each sandbox runs in a user namespace of its own, so root inside is not root on the host",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> SandboxProviderCapabilities:
        def refuse(field: str, message: str) -> Exception:
            return rule_error(SandboxEnvelopeInvalid, field, message)

        if (self.image_mode == "fixed") != bool(self.fixed_base_images):
            if self.image_mode == "fixed":
                raise refuse("fixed_base_images", "must be non-empty when image_mode is 'fixed'")
            raise refuse("fixed_base_images", "must be empty unless image_mode is 'fixed'")
        if "durable" in self.retention_modes and not self.snapshots:
            raise refuse("retention_modes", "'durable' requires snapshots: true (a durable Session needs a Checkpoint)")
        if self.snapshot_custody == "provider" and not self.snapshots:
            raise refuse("snapshot_custody", "'provider' requires snapshots: true")
        lows = self.minimum_resources.within(self.minimum_resources, self.maximum_resources)
        if lows:
            dim = lows[0].split(":", 1)[0]
            raise refuse(f"minimum_resources.{dim}", f"exceeds maximum_resources.{dim}")
        certifies = self.egress_certification != "unsupported"
        if certifies != ("allowlist" in self.network_modes):
            if certifies:
                raise refuse(
                    "egress_certification",
                    f"{self.egress_certification!r} certifies a destination selector, "
                    "but network_modes does not include 'allowlist'",
                )
            raise refuse("egress_certification", "'allowlist' in network_modes needs a grade other than 'unsupported'")
        if "ephemeral_zdr" in self.retention_modes and not self.lifecycle_assurances.release_destroys:
            raise refuse(
                "lifecycle_assurances.release_destroys",
                "'ephemeral_zdr' retention requires release_destroys: true",
            )
        if self.lifecycle_assurances.enumerates_allocations and "listAllocations" not in self.operations:
            raise refuse(
                "lifecycle_assurances.enumerates_allocations",
                "requires 'listAllocations' in operations",
            )
        return self

    @property
    def target(self) -> ExecutionTarget:
        """The exact tuple this envelope is selected by."""
        return ExecutionTarget(
            provider=self.provider,
            provider_revision=self.provider_revision,
            materialization_revision=self.materialization_revision,
            placement=self.placement,
        )

    @property
    def effective_max_mounts(self) -> int:
        return min(self.max_mounts, MOUNT_CEILING)

    def declares(self, member: Member) -> bool:
        """Whether the provider serves ``member``; each optional member has one source of truth."""
        if member in REQUIRED_MEMBERS:
            return True
        if member == "listDir":
            return self.list_dir
        if member in SNAPSHOT_MEMBERS:
            return self.snapshots
        return member in self.operations

    def declared_members(self) -> tuple[Member, ...]:
        return tuple(m for m in MEMBERS if self.declares(m))
