"""Requests and results of the seventeen lifecycle members.

Every result echoes what it acts on: the execution target tuple and the lease,
and for instance-scoped members the allocation key and the instance id; ``echo``
builds those fields from the request a result answers. Paths
and ids a provider returns decode as plain bounded strings here; the runner
admits them with ``checkfu.contract.paths`` and cross-checks them with
``checkfu.contract.checks`` so each failure gets its own error code.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, Strict, model_validator

from checkfu.contract.envelope import MOUNT_CEILING, Member, SandboxProviderCapabilities
from checkfu.contract.errors import SandboxDigestMismatch, SandboxError, SandboxPathRejected, SandboxResultInvalid
from checkfu.contract.model import (
    NONEMPTY,
    UNIQUE,
    UNIQUE_ITEMS,
    Bool,
    Bytes,
    ExitCode,
    Identifier,
    Model,
    NonNegInt,
    PosInt,
    Sha256Digest,
    Str,
    Timestamp,
    rule_error,
    schema_rules,
)
from checkfu.contract.mounts import AbsolutePath, MountPlan, overlapping_targets
from checkfu.contract.profile import ImageRef, SandboxProfile
from checkfu.contract.target import AllocationKey, ExecutionTarget, Lease, Revision, RunnerTag
from checkfu.contract.vocabulary import Platform

InstanceState = Literal["provisioning", "active", "released"]
EnvName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
Arg = Annotated[str, Strict(), Field(max_length=131072)]
ResultPath = Annotated[str, Strict(), Field(max_length=65536)]
"""A path as a provider reports it; admitted by the runner, not by the decoder."""


class Call(Model):
    """Fields every request carries: the execution target and the lease."""

    target: ExecutionTarget
    lease: Lease


class InstanceCall(Call):
    """A request that acts on one instance."""

    allocation_key: AllocationKey
    instance_id: Identifier


class Result(Model):
    """Fields every result echoes."""

    decode_error: ClassVar[type[SandboxError]] = SandboxResultInvalid

    target: ExecutionTarget
    lease: Lease


class InstanceResult(Result):
    """An instance as the provider now holds it."""

    allocation_key: AllocationKey
    instance_id: Identifier
    state: InstanceState


# describe ---------------------------------------------------------------------------------


class DescribeRequest(Model):
    """``describe`` takes nothing."""


class DescribeResult(Model):
    decode_error: ClassVar[type[SandboxError]] = SandboxResultInvalid

    envelope: SandboxProviderCapabilities


# materialize ------------------------------------------------------------------------------


class _ProfileBound(Call):
    profile: SandboxProfile
    profile_digest: Sha256Digest
    platform: Platform

    @model_validator(mode="after")
    def _digest_matches(self) -> _ProfileBound:
        if self.profile_digest != self.profile.digest:
            raise rule_error(
                SandboxDigestMismatch,
                "profile_digest",
                f"{self.profile_digest} is not the profile's digest {self.profile.digest}",
            )
        return self


class MaterializeRequest(_ProfileBound):
    """Turn an admitted profile into an image. Idempotent per profile digest."""


class MaterializeResult(Result):
    profile_digest: Sha256Digest
    image: ImageRef
    materialization_revision: Revision
    built: Bool = Field(description="true when this call built the image, false when it was cached")


# provision, clone, resume -------------------------------------------------------------------


class _Allocating(_ProfileBound):
    allocation_key: AllocationKey
    runner_tag: RunnerTag
    mounts: Annotated[tuple[MountPlan, ...], Field(max_length=MOUNT_CEILING)] = Field(
        default=(), description="what the runner stages before activation; none when omitted"
    )
    root_image: ImageRef

    @model_validator(mode="after")
    def _mounts_apart(self) -> _Allocating:
        pair = overlapping_targets(self.mounts)
        if pair is not None:
            i, j = pair
            raise rule_error(
                SandboxPathRejected,
                f"mounts.{j}.target",
                f"{self.mounts[j].target!r} overlaps mounts.{i}.target {self.mounts[i].target!r}",
            )
        return self

    @property
    def mount_roots(self) -> tuple[str, ...]:
        return tuple(m.target for m in self.mounts)


class ProvisionRequest(_Allocating):
    """Allocate an instance; it comes back in ``provisioning``, not started."""


class CloneRequest(_Allocating):
    """Allocate a new, independent instance from the current state of a live one."""

    source_allocation_key: AllocationKey
    source_instance_id: Identifier


class ResumeRequest(_Allocating):
    """Allocate a new instance from a snapshot."""

    snapshot_allocation_key: AllocationKey
    snapshot_id: Identifier


class CloneResult(InstanceResult):
    source_instance_id: Identifier


class ResumeResult(InstanceResult):
    snapshot_id: Identifier


# writeFile --------------------------------------------------------------------------------


class WriteFileRequest(InstanceCall):
    """Stage bytes at ``path`` during ``provisioning``; the bytes travel beside the request."""

    path: AbsolutePath
    mode: Annotated[int, Strict(), Field(ge=0, le=0o777)] = Field(
        default=0o644, description="permission bits of the staged file (420 is octal 0644)"
    )
    size: NonNegInt
    digest: Sha256Digest
    symlink: Bool = Field(
        default=False,
        description="stage a symlink whose target is the bytes (a relative path inside the mount), not a file; "
        "only where the envelope declares mount_symlinks",
    )


class WriteFileResult(Result):
    allocation_key: AllocationKey
    instance_id: Identifier
    path: ResultPath
    size: NonNegInt
    digest: Sha256Digest


# activate, inspect, release -----------------------------------------------------------------


class ActivateRequest(InstanceCall):
    """Make staged paths real and sealed, and start the instance."""


class InspectRequest(InstanceCall):
    """Report the instance's current identity and state."""


class ReleaseRequest(InstanceCall):
    """Release the instance; destroy it where the retention mode or an assurance says so."""


class ReleaseResult(InstanceResult):
    state: Literal["released"]
    destroyed: Bool


# exec, openProcess ------------------------------------------------------------------------


class _ProcessSpec(InstanceCall):
    argv: Annotated[tuple[Arg, ...], NONEMPTY, Field(max_length=4096)]
    env: dict[EnvName, Arg] = Field(
        default_factory=dict,
        description="the process's whole environment, name to value; none when omitted",
        # a name outside EnvName is refused by the schema too; omitted, env is empty
        json_schema_extra={"additionalProperties": False, "default": {}},
    )
    cwd: AbsolutePath | None = Field(
        default=None, description="the working directory; null or omitted: the instance's default"
    )


class ExecRequest(_ProcessSpec):
    """Run one process to completion."""

    stdin: Bytes = Field(default=b"", description="all of the process's stdin, then end of file")
    timeout_ms: PosInt
    max_output_bytes: PosInt = Field(description="cap per stream; more is dropped and flagged")


class ExecResult(Result):
    allocation_key: AllocationKey
    instance_id: Identifier
    exit_code: ExitCode
    timed_out: Bool
    stdout: Bytes
    stderr: Bytes
    stdout_truncated: Bool
    stderr_truncated: Bool


class TerminalSize(Model):
    """A pseudo-terminal's window, in character cells."""

    rows: Annotated[int, Strict(), Field(ge=1, le=65535)]
    cols: Annotated[int, Strict(), Field(ge=1, le=65535)]


class OpenProcessRequest(_ProcessSpec):
    """Start one process with streamed stdin, stdout and stderr.

    With ``tty`` the process gets a pseudo-terminal of that size as its stdin, stdout and
    stderr (its controlling terminal): everything it writes arrives as ``out``, and ``err``
    ends at once. Only where the envelope declares ``terminal``.
    """

    tty: TerminalSize | None = Field(default=None, description="a pseudo-terminal of this size; null or omitted: pipes")


class ProcessStarted(Result):
    """The first event of an open process; echoes the instance it runs in."""

    allocation_key: AllocationKey
    instance_id: Identifier
    process_id: Identifier
    pid: PosInt | None = Field(
        default=None,
        description="the process's id inside the instance, where the provider knows it; null or omitted: not known",
    )


# readFiles, listDir -----------------------------------------------------------------------


class ReadFilesRequest(InstanceCall):
    paths: Annotated[tuple[AbsolutePath, ...], NONEMPTY, Field(max_length=1024), UNIQUE, UNIQUE_ITEMS]
    max_bytes: PosInt = Field(description="cap on the bytes of all files together")


class FileContent(Model):
    path: ResultPath
    mode: Annotated[int, Strict(), Field(ge=0, le=0o7777)]
    digest: Sha256Digest
    data: Bytes


class ReadFilesResult(Result):
    allocation_key: AllocationKey
    instance_id: Identifier
    files: tuple[FileContent, ...]
    missing: tuple[ResultPath, ...] = Field(default=(), description="asked-for paths with no file there")


class ListDirRequest(InstanceCall):
    path: AbsolutePath
    recursive: Bool = Field(default=False, description="list everything below, not only the entries of path")
    max_entries: PosInt


EntryKind = Literal["file", "dir", "symlink", "other"]
PathKind = Literal["dir", "file", "symlink", "other", "missing"]
"""What is at a listed path itself: an entry's kind, or ``missing`` when nothing is there."""


class DirEntry(Model):
    path: ResultPath
    kind: EntryKind
    size: NonNegInt
    mode: Annotated[int, Strict(), Field(ge=0, le=0o7777)]


class ListDirResult(Result):
    """What is at ``path`` and, only for a directory, what is below it.

    ``kind`` answers in-band: ``missing`` when nothing is at ``path``, and ``file``,
    ``symlink`` or ``other`` when it is not a directory; a final symlink is never
    followed. Only a ``dir`` has ``entries`` or can be ``truncated``.
    """

    model_config = ConfigDict(
        json_schema_extra=schema_rules(
            {
                "$comment": "only a dir has entries or can be truncated; field: entries, truncated",
                "if": {"required": ["kind"], "properties": {"kind": {"not": {"const": "dir"}}}},
                "then": {"properties": {"entries": {"type": "array", "maxItems": 0}, "truncated": {"const": False}}},
            }
        )
    )

    allocation_key: AllocationKey
    instance_id: Identifier
    path: ResultPath
    kind: PathKind
    entries: tuple[DirEntry, ...]
    truncated: Bool

    @model_validator(mode="after")
    def _entries_only_below_a_directory(self) -> ListDirResult:
        if self.kind != "dir" and self.entries:
            raise rule_error(SandboxResultInvalid, "entries", f"a {self.kind} path has no entries to list")
        if self.kind != "dir" and self.truncated:
            raise rule_error(SandboxResultInvalid, "truncated", f"a {self.kind} path has no listing to truncate")
        return self


# listAllocations, compensate ----------------------------------------------------------------

AllocationKind = Literal["instance", "snapshot", "image", "volume", "other"]


class ListAllocationsRequest(Call):
    runner_tag: RunnerTag


class AllocationEntry(Model):
    allocation_key: AllocationKey
    kind: AllocationKind
    object_id: Str


class ListAllocationsResult(Result):
    runner_tag: RunnerTag
    allocations: tuple[AllocationEntry, ...]


class CompensateRequest(Call):
    """Cold compensation: reclaim everything tagged with ``allocation_key``; idempotent."""

    allocation_key: AllocationKey
    runner_tag: RunnerTag


class CompensateResult(Result):
    allocation_key: AllocationKey
    reclaimed: NonNegInt = Field(description="objects removed by this call; 0 when nothing was left")


# snapshot family --------------------------------------------------------------------------


MAX_KEEP_SECONDS = 100 * 366 * 86400
"""The longest lifetime a snapshot may be asked for: a century, so every expiry is a four-digit year."""


class SnapshotRequest(InstanceCall):
    """Snapshot the instance under ``snapshot_allocation_key``, kept ``keep_seconds`` at most when asked."""

    snapshot_allocation_key: AllocationKey
    keep_seconds: Annotated[int, Strict(), Field(ge=1, le=MAX_KEEP_SECONDS)] | None = Field(
        default=None,
        description="the longest the snapshot may be kept, in seconds from now; the provider deletes it once "
        "that passes, or sooner; null or omitted: no lifetime asked (the provider's own policy, stated in "
        "expires_at)",
    )


class SnapshotResult(Result):
    allocation_key: AllocationKey
    instance_id: Identifier
    snapshot_allocation_key: AllocationKey
    snapshot_id: Identifier
    expires_at: Timestamp | None = Field(
        default=None,
        description="when the snapshot is deleted by whoever holds it (RFC 3339, UTC); null or omitted: kept "
        "until deleteSnapshot. Never in the past, and never later than keep_seconds from the request",
    )


class DeleteSnapshotRequest(Call):
    snapshot_allocation_key: AllocationKey
    snapshot_id: Identifier


class DeleteSnapshotResult(Result):
    snapshot_allocation_key: AllocationKey
    snapshot_id: Identifier
    deleted: Bool


# echoes -----------------------------------------------------------------------------------


def echo(request: Call, **fields: Any) -> dict[str, Any]:
    """The echo fields of a result answering ``request``, then ``fields`` (merged last, so they win).

    Always ``target`` and ``lease``; ``allocation_key`` and ``instance_id`` for a request
    on an instance; ``allocation_key`` for an allocating request (``provision``, ``clone``,
    ``resume``: pass the new ``instance_id`` in ``fields``) and for ``compensate``. What a
    result echoes beyond these (a snapshot's key and id, a runner tag) comes in ``fields``.
    Use it as ``InstanceResult(**echo(request, state="active"))``.
    """
    out: dict[str, Any] = {"target": request.target, "lease": request.lease}
    if isinstance(request, InstanceCall):
        out["allocation_key"] = request.allocation_key
        out["instance_id"] = request.instance_id
    elif isinstance(request, (_Allocating, CompensateRequest)):
        out["allocation_key"] = request.allocation_key
    out.update(fields)
    return out


MESSAGES: dict[Member, tuple[type[Model], type[Model]]] = {
    "describe": (DescribeRequest, DescribeResult),
    "materialize": (MaterializeRequest, MaterializeResult),
    "provision": (ProvisionRequest, InstanceResult),
    "writeFile": (WriteFileRequest, WriteFileResult),
    "activate": (ActivateRequest, InstanceResult),
    "exec": (ExecRequest, ExecResult),
    "inspect": (InspectRequest, InstanceResult),
    "release": (ReleaseRequest, ReleaseResult),
    "compensate": (CompensateRequest, CompensateResult),
    "openProcess": (OpenProcessRequest, ProcessStarted),
    "readFiles": (ReadFilesRequest, ReadFilesResult),
    "listAllocations": (ListAllocationsRequest, ListAllocationsResult),
    "listDir": (ListDirRequest, ListDirResult),
    "snapshot": (SnapshotRequest, SnapshotResult),
    "deleteSnapshot": (DeleteSnapshotRequest, DeleteSnapshotResult),
    "clone": (CloneRequest, CloneResult),
    "resume": (ResumeRequest, ResumeResult),
}
"""Each member's request and result type, by wire name."""

METHOD_NAMES: dict[Member, str] = {
    "describe": "describe",
    "materialize": "materialize",
    "provision": "provision",
    "writeFile": "write_file",
    "activate": "activate",
    "exec": "exec",
    "inspect": "inspect",
    "release": "release",
    "compensate": "compensate",
    "openProcess": "open_process",
    "readFiles": "read_files",
    "listAllocations": "list_allocations",
    "listDir": "list_dir",
    "snapshot": "snapshot",
    "deleteSnapshot": "delete_snapshot",
    "clone": "clone",
    "resume": "resume",
}
"""The Python method of ``Provider`` that serves each member."""
