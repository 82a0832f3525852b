"""``SandboxProviderCapabilities``: the one value selection knows about a provider.

Every field, cross-field rule and downward default of the seed's table, plus the
three optional fields of contract.md section 2 (``operations``,
``lifecycle_assurances`` and ``user_namespace``). Silence is never read as a
capability claim: each optional field decodes to its weakest legal value, with
one exception the seed itself makes: beside ``ephemeral_zdr`` retention an absent
``release_destroys`` is true, because that retention means release always
destroys (rule 7).

The cross-field rules live twice from one place: the ``model_validator`` below
enforces them and ``ENVELOPE_RULES`` states every one of them JSON Schema can
express as ``if``/``then`` clauses of the published schema. Rule 4 (minimum at
most maximum, per dimension) compares two values and is beyond JSON Schema.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from checkfu.contract.enforcement import EnforcementStatement
from checkfu.contract.errors import SandboxEnvelopeInvalid, SandboxError
from checkfu.contract.model import (
    NONEMPTY,
    UNIQUE,
    UNIQUE_ITEMS,
    Bool,
    Model,
    NonNegInt,
    rule_error,
    schema_rules,
    without_default,
)
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


RELEASE_DESTROYS_DEFAULT = (
    "when omitted, true if the envelope's retention_modes include 'ephemeral_zdr' "
    "(that retention means release always destroys) and false otherwise"
)


class LifecycleAssurances(Model):
    """Five promises about reclamation; each defaults to ``false``, except ``release_destroys`` (rule 7)."""

    release_destroys: Bool = Field(
        default=False,
        description="after release, nothing of the instance survives; " + RELEASE_DESTROYS_DEFAULT,
        json_schema_extra=without_default,
    )
    release_idempotent: Bool = Field(
        default=False, description="a second release of the same instance succeeds and returns the same identity"
    )
    reaps_process_tree: Bool = Field(default=False, description="release ends every process the instance started")
    cold_compensation: Bool = Field(
        default=False,
        description="compensate(allocation_key) reclaims an allocation even when the provider lost every record of it",
    )
    enumerates_allocations: Bool = Field(
        default=False,
        description="listAllocations lists everything held for a runner tag (needs listAllocations in operations)",
    )


def _has(field: str, item: str) -> dict[str, Any]:
    """JSON Schema: the array ``field`` is present and holds ``item``."""
    return {"required": [field], "properties": {field: {"type": "array", "contains": {"const": item}}}}


def _is(field: str, *values: Any) -> dict[str, Any]:
    """JSON Schema: ``field`` is present and one of ``values``."""
    return {"required": [field], "properties": {field: {"enum": list(values)}}}


def _where(field: str, schema: dict[str, Any], *, required: bool = False) -> dict[str, Any]:
    """JSON Schema: ``field``, where present (or, with ``required``, present and), matches ``schema``."""
    return {**({"required": [field]} if required else {}), "properties": {field: schema}}


_ALL_FALSE = dict.fromkeys(LifecycleAssurances.model_fields, False)

ENVELOPE_RULES: list[dict[str, Any]] = [
    {
        "$comment": "rule 1: image_mode fixed <=> fixed_base_images non-empty; field: fixed_base_images",
        "if": _is("image_mode", "fixed"),
        "then": _where("fixed_base_images", {"type": "array", "minItems": 1}),
        "else": _where("fixed_base_images", {"type": "array", "maxItems": 0}),
    },
    {
        "$comment": "rule 2: durable in retention_modes => snapshots true; field: retention_modes",
        "if": _has("retention_modes", "durable"),
        "then": _where("snapshots", {"const": True}),
    },
    {
        "$comment": "rule 3: snapshot_custody provider => snapshots true; field: snapshot_custody",
        "if": _is("snapshot_custody", "provider"),
        "then": _where("snapshots", {"const": True}),
    },
    {
        "$comment": "rule 6: an egress grade other than unsupported => allowlist in network_modes (not conversely); "
        "field: egress_certification",
        "if": _is("egress_certification", "advisory_filter", "security_boundary"),
        "then": _where("network_modes", {"type": "array", "contains": {"const": "allowlist"}}),
    },
    {
        "$comment": "rule 7: beside ephemeral_zdr, release_destroys may be omitted (it is then true) but not false; "
        "field: lifecycle_assurances.release_destroys",
        "if": _has("retention_modes", "ephemeral_zdr"),
        "then": _where(
            "lifecycle_assurances",
            {
                "type": "object",
                "default": {"release_destroys": True},
                "properties": {"release_destroys": {"const": True, "default": True}},
            },
        ),
        "else": _where(
            "lifecycle_assurances",
            {"type": "object", "default": _ALL_FALSE, "properties": {"release_destroys": {"default": False}}},
        ),
    },
    {
        "$comment": "rule 8: enumerates_allocations true => listAllocations in operations; "
        "field: lifecycle_assurances.enumerates_allocations",
        "if": _where(
            "lifecycle_assurances",
            {
                "type": "object",
                "required": ["enumerates_allocations"],
                "properties": {"enumerates_allocations": {"const": True}},
            },
            required=True,
        ),
        "then": _where("operations", {"type": "array", "contains": {"const": "listAllocations"}}, required=True),
    },
]
"""Every cross-field rule of contract.md section 2 that JSON Schema can express, as the schema states it.

Rule 4 compares two numbers and is beyond JSON Schema; rules 5 and 9 are plain
field constraints; a decoder's ``model_validator`` below enforces all of them.
"""


class SandboxProviderCapabilities(Model):
    """The capability envelope a provider advertises. Decoded strictly; rules fire at decode."""

    model_config = ConfigDict(json_schema_extra=schema_rules(*ENVELOPE_RULES))

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
    snapshot_custody: SnapshotCustody = Field(
        default="runner",
        description="who holds snapshot bytes: runner (they die with the runner host) or provider (needs snapshots)",
    )
    enforcement: EnforcementStatement
    egress_certification: EgressGrade = Field(
        default="unsupported",
        description="the egress grade; a grade other than unsupported needs allowlist in network_modes, "
        "and allowlist without one is an uncertified allowlist",
    )
    list_dir: Bool = Field(default=False, description="whether listDir is served")
    minimum_resources: Resources
    maximum_resources: Resources
    max_mounts: NonNegInt
    operations: Annotated[tuple[OptionalOperation, ...], UNIQUE, UNIQUE_ITEMS] = Field(
        default=(), description="optional members served, besides those governed by list_dir and snapshots"
    )
    lifecycle_assurances: LifecycleAssurances = Field(
        default=LifecycleAssurances(),
        description="five promises about reclamation, each false when omitted except release_destroys: "
        + RELEASE_DESTROYS_DEFAULT,
        json_schema_extra=without_default,
    )
    user_namespace: Bool = Field(
        default=False,
        description="each sandbox runs in a user namespace of its own, so root inside is not root on the host",
    )
    terminal: Bool = Field(
        default=False,
        description="openProcess can give the process a pseudo-terminal (a request's tty) and follow resize",
    )
    writable_mounts: Bool = Field(
        default=False,
        description="a mount plan may be writable: copied in, owned by the sandbox user, not sealed, its bytes "
        "counted in disk_mib",
    )
    mount_symlinks: Bool = Field(
        default=False,
        description="a mount file may be a symlink (writeFile with symlink true) whose target stays inside the mount",
    )

    @model_validator(mode="before")
    @classmethod
    def _zdr_release_destroys_unless_said(cls, data: Any) -> Any:
        """Rule 7's default: beside ``ephemeral_zdr``, an absent ``release_destroys`` is true.

        Absent means the whole ``lifecycle_assurances`` omitted or the key missing from
        it (or, in Python, a ``LifecycleAssurances`` built without it). An explicit value
        is left as written, so an explicit ``false`` reaches the rule below and is refused.
        Everything else defaults downward as before.
        """
        if not isinstance(data, dict):
            return data
        modes = data.get("retention_modes")
        if not isinstance(modes, list | tuple) or "ephemeral_zdr" not in modes:
            return data
        if "lifecycle_assurances" not in data:
            return {**data, "lifecycle_assurances": {"release_destroys": True}}
        given = data["lifecycle_assurances"]
        if isinstance(given, dict) and "release_destroys" not in given:
            return {**data, "lifecycle_assurances": {**given, "release_destroys": True}}
        if isinstance(given, LifecycleAssurances) and "release_destroys" not in given.model_fields_set:
            return {**data, "lifecycle_assurances": given.model_copy(update={"release_destroys": True})}
        return data

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
        if self.egress_certification != "unsupported" and "allowlist" not in self.network_modes:
            raise refuse(
                "egress_certification",
                f"{self.egress_certification!r} certifies a destination selector, "
                "but network_modes does not include 'allowlist'",
            )
        # The converse does not hold: 'allowlist' without a grade is an uncertified allowlist.
        if "ephemeral_zdr" in self.retention_modes and not self.lifecycle_assurances.release_destroys:
            # Only an explicit false gets here: an absent release_destroys was made true above.
            raise refuse(
                "lifecycle_assurances.release_destroys",
                "false contradicts 'ephemeral_zdr' retention, under which release always destroys",
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
