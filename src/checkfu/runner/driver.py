"""The checked lifecycle driver: one Run attempt on one selected adapter.

For every member call the driver, in order:

1. refuses a member the envelope does not declare (``SandboxOperationUnsupported``)
   and a member the lifecycle table does not allow in the instance's state
   (``SandboxStateConflict``), without calling the provider;
2. renews its lease, so a runner whose lease was taken over stops here
   (``SandboxLeaseFenced``);
3. calls the provider under a deadline (``SandboxProviderTimeout``), turning any
   exception outside the vocabulary into ``SandboxProviderFailed``;
4. decodes the result strictly (``SandboxResultInvalid``) and cross-checks every
   echo, path and bound against its own record;
5. records the call as an event in the journal.

Every allocation is journaled before the provider is asked for it and settled
only after its result passes every check. When a check fails, a call times out
or raises after an allocation was journaled, the driver compensates it by its
allocation key, never by an id the provider returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from checkfu.contract.checks import (
    check_bound,
    check_echo,
    check_equal,
    check_new_identity,
    check_read_files,
    check_returned_paths,
    check_state,
    check_write,
    sha256_digest,
)
from checkfu.contract.codec import build, revalidate
from checkfu.contract.envelope import Member, SandboxProviderCapabilities
from checkfu.contract.errors import (
    ERROR_CLASSES,
    SandboxBoundExceeded,
    SandboxError,
    SandboxOperationUnsupported,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxStateConflict,
    error_for_code,
)
from checkfu.contract.lifecycle import State, transition
from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    CloneResult,
    CompensateRequest,
    CompensateResult,
    DeleteSnapshotRequest,
    DeleteSnapshotResult,
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
    Result,
    ResumeRequest,
    ResumeResult,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    WriteFileResult,
)
from checkfu.contract.model import Model
from checkfu.contract.paths import admit_path
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import ProcessStream, Provider
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.vocabulary import Platform
from checkfu.runner.clock import Clock
from checkfu.runner.deadlines import DEFAULT_DEADLINES
from checkfu.runner.journal import AllocationKind, Journal
from checkfu.runner.leases import LeaseStore
from checkfu.runner.mounts import ResolvedMount

R = TypeVar("R", bound=Model)


@dataclass(frozen=True)
class Limits:
    """The runner's bounds on what a provider may hand back."""

    max_output_bytes: int = 8 << 20
    max_read_bytes: int = 64 << 20
    max_list_entries: int = 10_000
    deadlines: Mapping[Member, float] = field(default_factory=lambda: dict(DEFAULT_DEADLINES))

    def deadline(self, member: Member) -> float:
        return float(self.deadlines.get(member, DEFAULT_DEADLINES[member]))


@dataclass
class Instance:
    """The runner's own record of an instance; the only source of truth for cross-checks."""

    allocation_key: str
    instance_id: str
    state: State
    mount_roots: tuple[str, ...]
    kind: AllocationKind


@dataclass
class Snapshot:
    allocation_key: str
    snapshot_id: str
    source: Instance
    deleted: bool = False


def new_key(prefix: str = "ak") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class RunSession:
    """Drives one Run attempt against one adapter, checking everything it is told."""

    def __init__(
        self,
        *,
        provider: Provider,
        envelope: SandboxProviderCapabilities,
        journal: Journal,
        leases: LeaseStore,
        lease: Lease,
        run_id: str,
        runner_tag: str,
        clock: Clock,
        limits: Limits | None = None,
    ) -> None:
        self.provider = provider
        self.envelope = envelope
        self.target: ExecutionTarget = envelope.target
        self.journal = journal
        self.leases = leases
        self.lease = lease
        self.run_id = run_id
        self.runner_tag = runner_tag
        self.clock = clock
        self.limits = limits or Limits()
        self.instances: dict[str, Instance] = {}
        self.snapshots: dict[str, Snapshot] = {}

    # the one door to the provider ----------------------------------------------------------

    async def _invoke(
        self,
        member: Member,
        call: Callable[[], Awaitable[object]],
        result_type: type[R],
        *,
        allocation_key: str | None = None,
        extra_seconds: float = 0.0,
        check: Callable[[R], None] | None = None,
        on_fault: Callable[[], Awaitable[None]] | None = None,
    ) -> R:
        """Call ``member`` with fencing, a deadline, strict decoding and ``check``; record the event.

        ``on_fault`` runs when the provider is at fault: a timeout, an exception outside
        the vocabulary, a result that does not decode or fails ``check``. It does not run
        for the runner's own refusals (undeclared member, fenced lease) nor for an error
        the provider reported in the vocabulary.
        """
        started = self.clock.now()
        t0 = time.perf_counter()
        error: SandboxError | None = None
        fault = False
        cancelled = False
        try:
            if not self.envelope.declares(member):
                raise self._undeclared(member)
            deadline = self.limits.deadline(member) + extra_seconds
            self.leases.renew(self.lease, ttl=max(self.leases.ttl, deadline + 60))
            try:
                raw = await asyncio.wait_for(call(), timeout=deadline)
            except TimeoutError:
                fault = True
                raise SandboxProviderTimeout(f"{member}: no answer within {deadline:g} s", field=member) from None
            except SandboxError as exc:
                raise _own(exc) from None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the runner is being cancelled
                fault = True  # the provider raised CancelledError of its own: a fault, not an interruption
                raise SandboxProviderFailed(f"{member}: provider raised CancelledError") from None
            except Exception as exc:
                fault = True
                raise SandboxProviderFailed(f"{member}: provider raised {type(exc).__name__}: {exc}"[:500]) from None
            fault = True
            result = revalidate(result_type, raw)
            if check is not None:
                check(result)
            fault = False
            return result
        except SandboxError as exc:
            error = exc
            if fault and on_fault is not None:
                await on_fault()
            raise
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            self._event(member, allocation_key, started, (time.perf_counter() - t0) * 1000, error, cancelled)

    def _undeclared(self, member: Member) -> SandboxOperationUnsupported:
        return SandboxOperationUnsupported(
            f"{member} is not declared by {self.target}; the runner does not call it", field=member
        )

    def _refuse_undeclared(self, member: Member) -> None:
        """Refuse (and record) an undeclared allocating member before anything is journaled or compensated."""
        if not self.envelope.declares(member):
            error = self._undeclared(member)
            self._event(member, None, self.clock.now(), 0.0, error)
            raise error

    def _event(
        self,
        member: str,
        key: str | None,
        started: float,
        ms: float,
        error: SandboxError | None,
        cancelled: bool = False,
    ) -> None:
        self.journal.record_event(
            self.run_id,
            member,
            allocation_key=key,
            started_at=started,
            duration_ms=ms,
            outcome="cancelled" if cancelled else "ok" if error is None else "error",
            error_code=error.code if error else None,
            detail=error.message[:1000] if error else None,
        )

    def _step(self, inst: Instance, member: Member) -> State:
        """The instance's next state, or SandboxStateConflict before any provider work."""
        return transition(inst.state, member)

    def _held_ids(self) -> set[str]:
        return {i.instance_id for i in self.instances.values()} | {s.snapshot_id for s in self.snapshots.values()}

    def _journal(self, key: str, kind: AllocationKind, parent: str | None = None) -> None:
        self.journal.journal_allocation(
            key,
            run_id=self.run_id,
            kind=kind,
            target=self.target,
            runner_tag=self.runner_tag,
            lease_id=self.lease.lease_id,
            now=self.clock.now(),
            parent_key=parent,
        )

    def _settle(self, key: str, object_id: str) -> None:
        self.journal.set_allocation(key, "live", now=self.clock.now(), object_id=object_id)

    def _echoes(self, res: Result, inst: Instance) -> None:
        """Every echo of a result about ``inst`` equals the runner's own record."""
        check_echo(
            res, target=self.target, lease=self.lease, allocation_key=inst.allocation_key, instance_id=inst.instance_id
        )

    def _call_fields(self) -> dict[str, Any]:
        return {"target": self.target, "lease": self.lease}

    def _inst_fields(self, inst: Instance) -> dict[str, Any]:
        return {**self._call_fields(), "allocation_key": inst.allocation_key, "instance_id": inst.instance_id}

    # materialize --------------------------------------------------------------------------

    async def materialize(self, profile: SandboxProfile, platform: Platform) -> MaterializeResult:
        req = build(
            MaterializeRequest, **self._call_fields(), profile=profile, profile_digest=profile.digest, platform=platform
        )

        def check(res: MaterializeResult) -> None:
            check_echo(res, target=self.target, lease=self.lease)
            check_equal("profile_digest", res.profile_digest, profile.digest)
            check_equal("materialization_revision", res.materialization_revision, self.target.materialization_revision)

        return await self._invoke("materialize", lambda: self.provider.materialize(req), MaterializeResult, check=check)

    # allocation: provision, clone, resume --------------------------------------------------

    def _allocating_fields(
        self, key: str, profile: SandboxProfile, platform: Platform, root_image: str, mounts: Sequence[ResolvedMount]
    ) -> dict[str, Any]:
        return {
            **self._call_fields(),
            "allocation_key": key,
            "runner_tag": self.runner_tag,
            "profile": profile,
            "profile_digest": profile.digest,
            "platform": platform,
            "root_image": root_image,
            "mounts": [m.plan for m in mounts],
        }

    async def _allocate(
        self,
        member: Member,
        key: str,
        kind: AllocationKind,
        request_call: Callable[[], Awaitable[object]],
        result_type: type[R],
        extra_check: Callable[[R], None] | None,
        roots: tuple[str, ...],
        parent: str | None = None,
    ) -> Instance:
        self._refuse_undeclared(member)
        self._journal(key, kind, parent)
        held = self._held_ids()

        def check(res: R) -> None:
            assert isinstance(res, InstanceResult)
            check_echo(res, target=self.target, lease=self.lease, allocation_key=key)
            check_new_identity("instance_id", res.instance_id, held)
            check_state(res.state, "provisioning", member=member)
            if extra_check is not None:
                extra_check(res)

        try:
            res = await self._invoke(member, request_call, result_type, allocation_key=key, check=check)
        except BaseException:
            await self._compensate_quietly(key)
            raise
        assert isinstance(res, InstanceResult)
        inst = Instance(
            allocation_key=key, instance_id=res.instance_id, state="provisioning", mount_roots=roots, kind=kind
        )
        self.instances[key] = inst
        self._settle(key, res.instance_id)
        return inst

    async def provision(
        self, profile: SandboxProfile, platform: Platform, root_image: str, mounts: Sequence[ResolvedMount] = ()
    ) -> Instance:
        """Journal an allocation, then ask for it; compensate it if anything fails.

        Raises:
            SandboxError: whatever check failed; the allocation has been compensated.
        """
        key = new_key()
        req = build(ProvisionRequest, **self._allocating_fields(key, profile, platform, root_image, mounts))
        return await self._allocate(
            "provision", key, "instance", lambda: self.provider.provision(req), InstanceResult, None, req.mount_roots
        )

    async def clone(
        self,
        source: Instance,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[ResolvedMount] = (),
    ) -> Instance:
        self._step(source, "clone")
        key = new_key()
        req = build(
            CloneRequest,
            **self._allocating_fields(key, profile, platform, root_image, mounts),
            source_allocation_key=source.allocation_key,
            source_instance_id=source.instance_id,
        )

        def extra(res: CloneResult) -> None:
            check_equal("source_instance_id", res.source_instance_id, source.instance_id)

        return await self._allocate(
            "clone",
            key,
            "clone",
            lambda: self.provider.clone(req),
            CloneResult,
            extra,
            req.mount_roots,
            parent=source.allocation_key,
        )

    async def resume(
        self,
        snapshot: Snapshot,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[ResolvedMount] = (),
    ) -> Instance:
        if snapshot.deleted:
            raise SandboxStateConflict("resume: the snapshot was deleted", field="snapshot_id")
        key = new_key()
        req = build(
            ResumeRequest,
            **self._allocating_fields(key, profile, platform, root_image, mounts),
            snapshot_allocation_key=snapshot.allocation_key,
            snapshot_id=snapshot.snapshot_id,
        )

        def extra(res: ResumeResult) -> None:
            check_equal("snapshot_id", res.snapshot_id, snapshot.snapshot_id)

        return await self._allocate(
            "resume",
            key,
            "resume",
            lambda: self.provider.resume(req),
            ResumeResult,
            extra,
            req.mount_roots,
            parent=snapshot.allocation_key,
        )

    # provisioning -------------------------------------------------------------------------

    async def write_file(self, inst: Instance, path: str, data: bytes, *, mode: int = 0o644) -> WriteFileResult:
        after = self._step(inst, "writeFile")
        admit_path(path, roots=inst.mount_roots, field="path")
        req = build(
            WriteFileRequest,
            **self._inst_fields(inst),
            path=path,
            mode=mode,
            size=len(data),
            digest=sha256_digest(data),
        )

        def check(res: WriteFileResult) -> None:
            self._echoes(res, inst)
            check_write(res, req)

        res = await self._guarded(
            inst, "writeFile", lambda: self.provider.write_file(req, data), WriteFileResult, check
        )
        inst.state = after
        return res

    async def stage(
        self, inst: Instance, mounts: Sequence[ResolvedMount], progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Push every mount file with ``writeFile``; returns the bytes staged."""
        total = sum(m.plan.total_bytes for m in mounts)
        done = 0
        for mount in mounts:
            for f, data in mount.files():
                await self.write_file(inst, mount.plan.absolute(f), data, mode=f.mode)
                done += len(data)
                if progress is not None:
                    progress(done, total)
        return done

    async def activate(self, inst: Instance) -> InstanceResult:
        after = self._step(inst, "activate")
        req = build(ActivateRequest, **self._inst_fields(inst))
        res = await self._guarded(
            inst,
            "activate",
            lambda: self.provider.activate(req),
            InstanceResult,
            self._instance_check(inst, "active", "activate"),
        )
        inst.state = after
        return res

    def _instance_check(self, inst: Instance, state: str, member: str) -> Callable[[InstanceResult], None]:
        def check(res: InstanceResult) -> None:
            self._echoes(res, inst)
            check_state(res.state, state, member=member)

        return check

    async def _guarded(
        self,
        inst: Instance,
        member: Member,
        call: Callable[[], Awaitable[object]],
        result_type: type[R],
        check: Callable[[R], None],
        extra_seconds: float = 0.0,
    ) -> R:
        """Invoke a member on ``inst``; when the provider is at fault, reclaim the instance.

        Nothing a provider says about an instance can be trusted once it answered out of
        contract, so the instance is compensated by its allocation key and marked released.
        """

        async def reclaim() -> None:
            await self._compensate_quietly(inst.allocation_key)
            inst.state = "released"

        return await self._invoke(
            member,
            call,
            result_type,
            allocation_key=inst.allocation_key,
            check=check,
            extra_seconds=extra_seconds,
            on_fault=reclaim,
        )

    # active -------------------------------------------------------------------------------

    async def exec(
        self,
        inst: Instance,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes = b"",
        timeout: float = 60.0,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        self._step(inst, "exec")
        limit = min(max_output_bytes or self.limits.max_output_bytes, self.limits.max_output_bytes)
        req = build(
            ExecRequest,
            **self._inst_fields(inst),
            argv=list(argv),
            env=dict(env or {}),
            cwd=cwd,
            stdin=stdin,
            timeout_ms=max(1, int(timeout * 1000)),
            max_output_bytes=limit,
        )

        def check(res: ExecResult) -> None:
            self._echoes(res, inst)
            check_bound("stdout", len(res.stdout), limit)
            check_bound("stderr", len(res.stderr), limit)

        return await self._guarded(
            inst, "exec", lambda: self.provider.exec(req), ExecResult, check, extra_seconds=timeout
        )

    async def open_process(
        self, inst: Instance, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> CheckedProcess:
        self._step(inst, "openProcess")
        req = build(OpenProcessRequest, **self._inst_fields(inst), argv=list(argv), env=dict(env or {}), cwd=cwd)
        holder: list[ProcessStream] = []

        async def call() -> ProcessStarted:
            stream = await self.provider.open_process(req)
            holder.append(stream)
            return stream.started

        def check(res: ProcessStarted) -> None:
            self._echoes(res, inst)

        try:
            started = await self._guarded(inst, "openProcess", call, ProcessStarted, check)
        except SandboxError:
            for stream in holder:
                await _kill_quietly(stream)
            raise
        return CheckedProcess(holder[0], started, self.limits.max_output_bytes)

    async def read_files(
        self, inst: Instance, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> ReadFilesResult:
        self._step(inst, "readFiles")
        limit = min(max_bytes or self.limits.max_read_bytes, self.limits.max_read_bytes)
        for i, p in enumerate(paths):
            admit_path(p, field=f"paths.{i}")
        req = build(ReadFilesRequest, **self._inst_fields(inst), paths=list(paths), max_bytes=limit)

        def check(res: ReadFilesResult) -> None:
            self._echoes(res, inst)
            check_read_files(res, req.paths, limit)

        return await self._guarded(inst, "readFiles", lambda: self.provider.read_files(req), ReadFilesResult, check)

    async def list_dir(
        self, inst: Instance, path: str, *, recursive: bool = False, max_entries: int | None = None
    ) -> ListDirResult:
        self._step(inst, "listDir")
        limit = min(max_entries or self.limits.max_list_entries, self.limits.max_list_entries)
        admit_path(path, field="path")
        req = build(ListDirRequest, **self._inst_fields(inst), path=path, recursive=recursive, max_entries=limit)

        def check(res: ListDirResult) -> None:
            self._echoes(res, inst)
            check_equal("path", res.path, path)
            if len(res.entries) > limit:
                raise SandboxBoundExceeded(f"entries: {len(res.entries)} is over the limit of {limit}", field="entries")
            check_returned_paths("entries", (e.path for e in res.entries), [path])

        return await self._guarded(inst, "listDir", lambda: self.provider.list_dir(req), ListDirResult, check)

    async def inspect(self, inst: Instance) -> InstanceResult:
        """The instance as the provider now holds it.

        Raises:
            SandboxStateConflict: the provider reports a state the instance cannot be in: anything
                but the runner's own record, or ``released`` (an instance may be lost, never moved back).
        """
        self._step(inst, "inspect")
        req = build(InspectRequest, **self._inst_fields(inst))

        def check(res: InstanceResult) -> None:
            self._echoes(res, inst)
            if res.state != "released":
                check_state(res.state, inst.state, member="inspect")

        return await self._guarded(inst, "inspect", lambda: self.provider.inspect(req), InstanceResult, check)

    # snapshots ----------------------------------------------------------------------------

    async def snapshot(self, inst: Instance) -> Snapshot:
        self._step(inst, "snapshot")
        key = new_key()
        req = build(SnapshotRequest, **self._inst_fields(inst), snapshot_allocation_key=key)
        held = self._held_ids()

        def check(res: SnapshotResult) -> None:
            self._echoes(res, inst)
            check_equal("snapshot_allocation_key", res.snapshot_allocation_key, key)
            check_new_identity("snapshot_id", res.snapshot_id, held)

        self._refuse_undeclared("snapshot")
        self._journal(key, "snapshot", inst.allocation_key)
        try:
            res = await self._invoke(
                "snapshot", lambda: self.provider.snapshot(req), SnapshotResult, allocation_key=key, check=check
            )
        except BaseException:
            await self._compensate_quietly(key)
            raise
        snap = Snapshot(allocation_key=key, snapshot_id=res.snapshot_id, source=inst)
        self.snapshots[key] = snap
        self._settle(key, res.snapshot_id)
        return snap

    async def delete_snapshot(self, snap: Snapshot) -> DeleteSnapshotResult:
        req = build(
            DeleteSnapshotRequest,
            **self._call_fields(),
            snapshot_allocation_key=snap.allocation_key,
            snapshot_id=snap.snapshot_id,
        )

        def check(res: DeleteSnapshotResult) -> None:
            check_echo(res, target=self.target, lease=self.lease)
            check_equal("snapshot_allocation_key", res.snapshot_allocation_key, snap.allocation_key)
            check_equal("snapshot_id", res.snapshot_id, snap.snapshot_id)

        async def reclaim() -> None:
            await self._compensate_quietly(snap.allocation_key)
            snap.deleted = True

        res = await self._invoke(
            "deleteSnapshot",
            lambda: self.provider.delete_snapshot(req),
            DeleteSnapshotResult,
            allocation_key=snap.allocation_key,
            check=check,
            on_fault=reclaim,
        )
        snap.deleted = True
        self.journal.set_allocation(snap.allocation_key, "released", now=self.clock.now())
        return res

    # release and compensation -------------------------------------------------------------

    async def release(self, inst: Instance) -> ReleaseResult:
        """Release ``inst``. A result that fails a check compensates it by allocation key."""
        after = self._step(inst, "release")
        req = build(ReleaseRequest, **self._inst_fields(inst))

        def check(res: ReleaseResult) -> None:
            self._echoes(res, inst)

        res = await self._guarded(inst, "release", lambda: self.provider.release(req), ReleaseResult, check)
        inst.state = after
        self.journal.set_allocation(inst.allocation_key, "released", now=self.clock.now())
        return res

    async def compensate(self, allocation_key: str) -> CompensateResult:
        """Cold compensation by allocation key; settles the journal entry when it succeeds."""
        req = build(CompensateRequest, **self._call_fields(), allocation_key=allocation_key, runner_tag=self.runner_tag)

        def check(res: CompensateResult) -> None:
            check_echo(res, target=self.target, lease=self.lease, allocation_key=allocation_key)

        res = await self._invoke(
            "compensate",
            lambda: self.provider.compensate(req),
            CompensateResult,
            allocation_key=allocation_key,
            check=check,
        )
        self.journal.set_allocation(allocation_key, "compensated", now=self.clock.now())
        inst = self.instances.get(allocation_key)
        if inst is not None:
            inst.state = "released"
        return res

    async def _compensate_quietly(self, allocation_key: str) -> None:
        """Compensate during another failure: a failure here is journaled, never masks the first."""
        task = asyncio.ensure_future(self.compensate(allocation_key))
        try:
            await asyncio.shield(task)
        except SandboxError:
            pass
        except asyncio.CancelledError:
            # Finish reclaiming what was journaled, then honour the cancellation.
            with contextlib.suppress(SandboxError):
                await task
            raise

    async def list_allocations(self) -> ListAllocationsResult:
        req = build(ListAllocationsRequest, **self._call_fields(), runner_tag=self.runner_tag)

        def check(res: ListAllocationsResult) -> None:
            check_echo(res, target=self.target, lease=self.lease)
            check_equal("runner_tag", res.runner_tag, self.runner_tag)

        return await self._invoke(
            "listAllocations", lambda: self.provider.list_allocations(req), ListAllocationsResult, check=check
        )

    async def release_all(self) -> None:
        """Release every live instance and compensate whatever cannot be released; used on the way out."""
        for inst in list(self.instances.values()):
            if inst.state == "released":
                continue
            try:
                await self.release(inst)
            except (SandboxError, asyncio.CancelledError):
                await self._compensate_quietly(inst.allocation_key)
        for row in self.journal.open_allocations(run_id=self.run_id):
            if row.kind == "snapshot" and row.state == "live":
                continue  # durable snapshots outlive the Run by design
            await self._compensate_quietly(row.allocation_key)


class CheckedProcess:
    """An open process whose events are bounded and well-ordered, or a protocol violation."""

    def __init__(self, stream: ProcessStream, started: ProcessStarted, max_chunk: int) -> None:
        self.stream = stream
        self.started = started
        self.max_chunk = max_chunk

    async def send_stdin(self, data: bytes) -> None:
        with _translated("send_stdin"):
            await self.stream.send_stdin(data)

    async def close_stdin(self) -> None:
        with _translated("close_stdin"):
            await self.stream.close_stdin()

    async def kill(self) -> None:
        await _kill_quietly(self.stream)

    async def events(self) -> AsyncIterator[ProcessEvent]:
        ended: set[str] = set()
        with _translated("events"):
            async for event in self._events(ended):
                yield event
                if isinstance(event, ProcessExit):
                    return
        raise SandboxProtocolViolation("the process stream ended without an exit", field="exit")

    async def _events(self, ended: set[str]) -> AsyncIterator[ProcessEvent]:
        async for event in self.stream.events():
            if isinstance(event, ProcessOutput):
                if event.stream in ended:
                    raise SandboxProtocolViolation(f"{event.stream}: output after its end", field=event.stream)
                if len(event.data) > self.max_chunk:
                    raise SandboxBoundExceeded(f"{event.stream}: a chunk of {len(event.data)} bytes", field="data")
            elif isinstance(event, ProcessStreamEnd):
                ended.add(event.stream)
            yield event
            if isinstance(event, ProcessExit):
                return


KILL_SECONDS = 30.0


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """A process stream's foreign exception as ``SandboxProviderFailed`` (vocabulary errors pass through)."""
    try:
        yield
    except SandboxError as exc:
        raise _own(exc) from None
    except Exception as exc:
        raise SandboxProviderFailed(f"openProcess {what}: provider raised {type(exc).__name__}: {exc}"[:500]) from None


async def _kill_quietly(stream: ProcessStream) -> None:
    # The stream is being abandoned; release reaps it. A kill that never answers must not hold the Run.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(stream.kill(), timeout=KILL_SECONDS)


def _own(exc: SandboxError) -> SandboxError:
    """A provider's error as the vocabulary's own class (never a peer's subclass)."""
    if type(exc) in ERROR_CLASSES.values():
        return exc
    return error_for_code(exc.code, exc.message, field=exc.field, retryable=exc.retryable)
