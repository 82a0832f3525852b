"""The ``Provider`` protocol: what the runner drives, in-process or over the wire.

A provider materializes, holds and reclaims sandboxes. Each member below states
its own obligations: what its result echoes, whether it is idempotent and under
what key, what a cancelled call may already have done, and under ``Raises:`` the
vocabulary errors it may raise, one per condition. ``MAY_RAISE`` holds the same
lists as data. Obligations common to every member:

- it must echo the target tuple and lease of the request, and the allocation
  key and instance id it acts on (``checkfu.contract.members.echo`` builds them);
- it must label everything it creates with the request's allocation key and
  runner tag (``checkfu.contract.labels``), so ``compensate`` can reclaim by
  label alone;
- it must raise only the members of ``checkfu.contract.errors`` its member lists;
  an ordinary answer (nothing at a listed path, a file missing from a read) is
  part of the result, not an error. The runner takes any error as the provider's
  failure to do the call, and compensates what it may have allocated;
- a member it does not declare answers ``SandboxOperationUnsupported``;
- a cancelled call may already have allocated: the runner journals first and
  compensates by allocation key, so the provider need not roll back.

A provider reached over the wire may also fail in transport
(``SandboxProtocolViolation``, ``SandboxUnauthenticated``); those are the wire's,
not the provider's, and are not listed here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol, runtime_checkable

from checkfu.contract.envelope import Member
from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    CloneResult,
    CompensateRequest,
    CompensateResult,
    DeleteSnapshotRequest,
    DeleteSnapshotResult,
    DescribeResult,
    ExecRequest,
    ExecResult,
    InspectRequest,
    InstanceResult,
    ListAllocationsRequest,
    ListAllocationsResult,
    ListDirRequest,
    ListDirResult,
    MaterializeRequest,
    MaterializeResult,
    OpenProcessRequest,
    ProcessStarted,
    ProvisionRequest,
    ReadFilesRequest,
    ReadFilesResult,
    ReleaseRequest,
    ReleaseResult,
    ResumeRequest,
    ResumeResult,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    WriteFileResult,
)
from checkfu.contract.process import ProcessEvent


class ProcessStream(Protocol):
    """An open process. Events end with exactly one ``ProcessExit``."""

    @property
    def started(self) -> ProcessStarted:
        """The first answer of ``openProcess``: it echoes the instance the process runs in, with the process id."""

    async def send_stdin(self, data: bytes) -> None:
        """Write ``data`` to the process's stdin; waits while the process is not reading.

        Idempotent: no; each call writes ``data`` again.
        Cancelled: part of ``data`` may have been written.

        Raises:
            SandboxStateConflict: stdin was closed (by ``close_stdin``, or by the process), or there is no process.
            SandboxProviderFailed: the provider could not write.
        """

    async def close_stdin(self) -> None:
        """End stdin; later ``send_stdin`` calls must raise ``SandboxStateConflict``.

        Idempotent: yes.
        Cancelled: stdin may be closed.

        Raises:
            SandboxProviderFailed: the provider could not close it.
        """

    def events(self) -> AsyncIterator[ProcessEvent]:
        """Output chunks, one end per stream, then the exit. Pulling is the backpressure. Iterate once.

        Idempotent: no; the events are consumed.
        Cancelled: the events read so far are gone; the process runs on until ``kill``.

        Raises:
            SandboxStateConflict: the events are already being consumed.
            SandboxProviderFailed: the provider lost the process's output or exit status.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def resize(self, rows: int, cols: int) -> None:
        """Give the process's pseudo-terminal a new window size (the process gets ``SIGWINCH``).

        Idempotent: yes.
        Cancelled: the size may have changed.

        Raises:
            SandboxOperationUnsupported: the process was started without ``tty``.
            SandboxProviderFailed: the provider could not resize it.
        """

    async def kill(self) -> None:
        """End the process and everything it started.

        Idempotent: yes; killing an ended process does nothing.
        Cancelled: the process may be ended.

        Raises:
            SandboxProviderFailed: a process of the tree survived.
        """


@runtime_checkable
class Provider(Protocol):
    """The seventeen members. Optional ones are called only where the envelope declares them."""

    async def describe(self) -> DescribeResult:
        """The envelope: what this provider serves, and which authority enforces each axis.

        Echoes: nothing; it takes no request.
        Idempotent: yes; it changes nothing.
        Cancelled: has changed nothing.

        Raises:
            SandboxProviderFailed: the provider cannot say (its backend does not answer).
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult:
        """Turn an admitted profile into an image, built from what the profile pins and nothing else.

        Echoes: target, lease, profile_digest; and the materialization_revision used.
        Idempotent: per profile digest; a second call returns the same image with ``built`` false.
        Cancelled: may have built (part of) the image; a later call with the digest finds or finishes it.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile or platform; every unmet need listed.
            SandboxNotFound: the profile's base image is not where the provider takes images from.
            SandboxProviderFailed: the build failed, or the provider failed.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def provision(self, request: ProvisionRequest) -> InstanceResult:
        """Allocate an instance, labelled with the allocation key and runner tag; it comes back ``provisioning``.

        Echoes: target, lease, allocation_key; a new instance_id; state ``provisioning``.
        Idempotent: no; the runner never asks twice under one allocation key (it compensates instead of
            retrying), and a provider may refuse a taken key.
        Cancelled: may have created (part of) the instance, all of it labelled; ``compensate`` reclaims it.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile, platform or mounts.
            SandboxPathRejected: a mount target is a path the provider cannot mount on.
            SandboxNotFound: the root image is not one the provider holds.
            SandboxStateConflict: the allocation key already holds an instance.
            SandboxProviderFailed: the provider failed to allocate.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult:
        """Stage ``data`` at a path below one of the instance's mount targets, while it is ``provisioning``.

        Echoes: target, lease, allocation_key, instance_id; the path, size and digest staged.
        Idempotent: per instance and path; staging the same bytes again leaves the same file.
        Cancelled: may have staged the bytes, or part of them; the runner stages them again or releases.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key.
            SandboxStateConflict: the instance is not ``provisioning``.
            SandboxPathRejected: the path is below no mount target, or clashes with a staged file or directory.
            SandboxDigestMismatch: the bytes do not have the stated size or SHA-256.
            SandboxProviderFailed: the provider failed to stage them.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def activate(self, request: ActivateRequest) -> InstanceResult:
        """Make the staged paths real and sealed, and start the instance.

        Echoes: target, lease, allocation_key, instance_id; state ``active``.
        Idempotent: no; a second activate is a state conflict.
        Cancelled: may have started the instance; ``inspect`` tells, ``release`` or ``compensate`` reclaims it.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key (or what it restores from is gone).
            SandboxStateConflict: the instance is not ``provisioning``.
            SandboxProviderFailed: the instance could not be started sealed.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def exec(self, request: ExecRequest) -> ExecResult:
        """Run one process to its exit or its timeout; output past ``max_output_bytes`` is dropped and flagged.

        A program that cannot be started is an exit status (127 or 126), not an error.

        Echoes: target, lease, allocation_key, instance_id.
        Idempotent: no; each call runs the process again.
        Cancelled: the process may have run, in part or to its end; the provider ends it.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key.
            SandboxStateConflict: the instance is not ``active``.
            SandboxPathRejected: ``cwd`` cannot be a working directory.
            SandboxProviderFailed: the provider failed to run the process.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def inspect(self, request: InspectRequest) -> InstanceResult:
        """The instance's current identity and state.

        Echoes: target, lease, allocation_key, instance_id; and the state the provider holds it in.
        Idempotent: yes; it changes nothing.
        Cancelled: has changed nothing.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key (or one released and forgotten).
            SandboxProviderFailed: the provider cannot say.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        """Release the instance; destroy it where the retention mode or ``release_destroys`` says so.

        Echoes: target, lease, allocation_key, instance_id; state ``released``, and whether it was destroyed.
        Idempotent: per instance where ``release_idempotent`` is declared; a second release returns the same
            identity.
        Cancelled: may have ended processes and removed part of the instance; release again, or compensate.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key (or, without
                ``release_idempotent``, one released already).
            SandboxProviderFailed: something of the instance could not be ended or removed.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def compensate(self, request: CompensateRequest) -> CompensateResult:
        """Reclaim everything labelled with the allocation key and runner tag, trusting no earlier answer.

        Echoes: target, lease, allocation_key; ``reclaimed`` counts what this call removed.
        Idempotent: per allocation key and runner tag; a second call reclaims nothing and answers 0.
        Cancelled: may have reclaimed part; call it again.

        Raises:
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxProviderFailed: something labelled with the key could not be removed.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def open_process(self, request: OpenProcessRequest) -> ProcessStream:
        """Start one process with streamed stdin, stdout and stderr.

        A program that cannot be started is a stream ending in exit 127 or 126, not an error.

        Echoes: the stream's ``started``: target, lease, allocation_key, instance_id; and a process_id.
        Idempotent: no; each call starts a process.
        Cancelled: may have started the process; releasing the instance ends it.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare ``openProcess``.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key.
            SandboxStateConflict: the instance is not ``active``.
            SandboxPathRejected: ``cwd`` cannot be a working directory.
            SandboxProviderFailed: the provider failed to start the process.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult:
        """The regular files at the paths asked for; a path with no regular file (never through a final
        symlink) is listed in ``missing``, not raised.

        Echoes: target, lease, allocation_key, instance_id; only paths asked for.
        Idempotent: yes; it changes nothing.
        Cancelled: has changed nothing.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare ``readFiles``.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key.
            SandboxStateConflict: the instance is not ``active``.
            SandboxBoundExceeded: the files together hold more than ``max_bytes``.
            SandboxProviderFailed: the provider failed to read them.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult:
        """Everything the provider holds labelled with the runner tag, by allocation key and kind.

        Echoes: target, lease, runner_tag.
        Idempotent: yes; it changes nothing.
        Cancelled: has changed nothing.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare ``listAllocations``.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxProviderFailed: the provider cannot enumerate.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        """What is at the path (``kind``; a final symlink is never followed) and, for a directory, what is
        below it. Nothing there, a file, a link: each is an answer, not an error.

        Echoes: target, lease, allocation_key, instance_id, path; entries only at or below the path.
        Idempotent: yes; it changes nothing.
        Cancelled: has changed nothing.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare ``listDir``.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key.
            SandboxStateConflict: the instance is not ``active``.
            SandboxProviderFailed: the provider failed to list.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        """Store the instance's state as a snapshot labelled with the snapshot allocation key and runner tag.

        Echoes: target, lease, allocation_key, instance_id, snapshot_allocation_key; a new snapshot_id.
        Idempotent: no; the runner compensates the snapshot allocation key instead of retrying.
        Cancelled: may have stored (part of) a snapshot, labelled; ``compensate`` of its key reclaims it.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare snapshots.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no instance of that id under that allocation key.
            SandboxStateConflict: the instance is not ``active``, or the snapshot key already holds a snapshot.
            SandboxProviderFailed: the snapshot could not be taken.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult:
        """Remove a snapshot; afterwards it cannot be resumed.

        Echoes: target, lease, snapshot_allocation_key, snapshot_id; ``deleted`` says whether this call removed it.
        Idempotent: per snapshot; deleting a deleted snapshot succeeds again.
        Cancelled: may have removed it; delete again.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare snapshots.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxNotFound: no snapshot of that id under that snapshot allocation key.
            SandboxProviderFailed: the snapshot could not be removed.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def clone(self, request: CloneRequest) -> CloneResult:
        """Allocate a new, independent instance from the current state of a live one; it comes back
        ``provisioning``, labelled like ``provision``'s.

        Echoes: target, lease, allocation_key; a new instance_id (never one already held); state
            ``provisioning``; the source_instance_id.
        Idempotent: no; as ``provision``.
        Cancelled: as ``provision``; the source is left as it was.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare snapshots.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile, platform or mounts.
            SandboxPathRejected: a mount target is a path the provider cannot mount on.
            SandboxNotFound: no source instance of that id under that key, or the root image is not held.
            SandboxStateConflict: the source is not ``active``, or the allocation key already holds an instance.
            SandboxProviderFailed: the provider failed to copy or allocate.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """

    async def resume(self, request: ResumeRequest) -> ResumeResult:
        """Allocate a new instance from a snapshot; it comes back ``provisioning``, labelled like
        ``provision``'s.

        Echoes: target, lease, allocation_key; a new instance_id (never one already held); state
            ``provisioning``; the snapshot_id.
        Idempotent: no; as ``provision``.
        Cancelled: as ``provision``; the snapshot is left as it was.

        Raises:
            SandboxOperationUnsupported: the envelope does not declare snapshots.
            SandboxIdentityMismatch: the request is for another execution target.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile, platform or mounts.
            SandboxPathRejected: a mount target is a path the provider cannot mount on.
            SandboxNotFound: no snapshot of that id under that key (never taken, deleted, another runner's),
                or the root image is not held.
            SandboxStateConflict: the allocation key already holds an instance.
            SandboxProviderFailed: the snapshot could not be restored.
            SandboxProviderTimeout: the provider's backend did not answer in time.
        """


_BACKEND = frozenset({"SandboxProviderFailed", "SandboxProviderTimeout"})
_CALL = _BACKEND | {"SandboxIdentityMismatch"}
_INSTANCE = _CALL | {"SandboxNotFound", "SandboxStateConflict"}
_ALLOCATING = _INSTANCE | {"SandboxCapabilityUnavailable", "SandboxPathRejected"}
_OPTIONAL = frozenset({"SandboxOperationUnsupported"})

MAY_RAISE: Mapping[Member, frozenset[str]] = {
    "describe": _BACKEND,
    "materialize": _CALL | {"SandboxCapabilityUnavailable", "SandboxNotFound"},
    "provision": _ALLOCATING,
    "writeFile": _INSTANCE | {"SandboxPathRejected", "SandboxDigestMismatch"},
    "activate": _INSTANCE,
    "exec": _INSTANCE | {"SandboxPathRejected"},
    "inspect": _CALL | {"SandboxNotFound"},
    "release": _CALL | {"SandboxNotFound"},
    "compensate": _CALL,
    "openProcess": _OPTIONAL | _INSTANCE | {"SandboxPathRejected"},
    "readFiles": _OPTIONAL | _INSTANCE | {"SandboxBoundExceeded"},
    "listAllocations": _OPTIONAL | _CALL,
    "listDir": _OPTIONAL | _INSTANCE,
    "snapshot": _OPTIONAL | _INSTANCE,
    "deleteSnapshot": _OPTIONAL | _CALL | {"SandboxNotFound"},
    "clone": _OPTIONAL | _ALLOCATING,
    "resume": _OPTIONAL | _ALLOCATING,
}
"""The vocabulary codes each member may raise, by wire name: the ``Raises:`` of its docstring above.

An error whose code is not listed for its member is out of contract."""

REFUSALS: Mapping[Member, frozenset[str]] = {
    "exec": frozenset({"SandboxPathRejected"}),
    "openProcess": frozenset({"SandboxPathRejected"}),
    "readFiles": frozenset({"SandboxBoundExceeded"}),
}
"""Of ``MAY_RAISE``, the codes by which a member refuses the request itself (a working directory that cannot be one,
files larger than the bound asked), saying nothing against the instance. The runner reports such a refusal as any
other error, but keeps the instance: the sandbox stays usable. Any other error about an instance makes the runner
reclaim it."""
