"""The ``Provider`` protocol: what the runner drives, in-process or over the wire.

A provider materializes, holds and reclaims sandboxes. Obligations common to
every member:

- it must echo the target tuple and lease of the request, and the allocation
  key and instance id it acts on;
- it must label everything it creates with the request's allocation key and
  runner tag, so ``compensate`` can reclaim by label alone;
- it must raise only members of ``checkfu.contract.errors``; a member it does
  not declare answers ``SandboxOperationUnsupported``;
- a cancelled call may already have allocated: the runner journals first and
  compensates by allocation key, so the provider need not roll back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

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
    def started(self) -> ProcessStarted: ...

    async def send_stdin(self, data: bytes) -> None:
        """Write to the process's stdin; waits while the process is not reading."""

    async def close_stdin(self) -> None:
        """End stdin; further ``send_stdin`` calls must raise ``SandboxStateConflict``."""

    def events(self) -> AsyncIterator[ProcessEvent]:
        """Output chunks, one end per stream, then the exit. Pulling is the backpressure."""

    async def kill(self) -> None:
        """End the process and everything it started; idempotent."""


@runtime_checkable
class Provider(Protocol):
    """The seventeen members. Optional ones are called only where the envelope declares them."""

    async def describe(self) -> DescribeResult: ...

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult: ...

    async def provision(self, request: ProvisionRequest) -> InstanceResult: ...

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult: ...

    async def activate(self, request: ActivateRequest) -> InstanceResult: ...

    async def exec(self, request: ExecRequest) -> ExecResult: ...

    async def inspect(self, request: InspectRequest) -> InstanceResult: ...

    async def release(self, request: ReleaseRequest) -> ReleaseResult: ...

    async def compensate(self, request: CompensateRequest) -> CompensateResult: ...

    async def open_process(self, request: OpenProcessRequest) -> ProcessStream: ...

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult: ...

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult: ...

    async def list_dir(self, request: ListDirRequest) -> ListDirResult: ...

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult: ...

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult: ...

    async def clone(self, request: CloneRequest) -> CloneResult: ...

    async def resume(self, request: ResumeRequest) -> ResumeResult: ...
