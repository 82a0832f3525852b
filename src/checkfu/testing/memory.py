"""The ``memory`` provider: an in-process reference implementation of all seventeen members.

Placement ``test``. No engine, no network, no disk: an instance is a virtual file
system (``checkfu.testing.vfs``) and ``exec`` runs a few built-in commands (``cat``,
``echo``, ``env``, ``ls``, ``sha256sum``, ``true``, ``false``, ``sleep``, ``write
PATH TEXT`` to create files, and ``nc``, which always finds the network
unreachable, because there is none), so the lifecycle can be exercised without any engine.
It is the contract in code, for provider authors to read:

- every result echoes the request's target and lease, and the allocation key and
  instance id it acts on;
- a call for another target is ``SandboxIdentityMismatch``; an unknown instance or
  snapshot (or one under another allocation key) is ``SandboxNotFound``; a call in
  the wrong state is ``SandboxStateConflict``, straight from the lifecycle table;
  a member the envelope does not declare is ``SandboxOperationUnsupported``;
- every object carries the owner labels of ``checkfu.contract.labels`` in a
  store that survives ``forget()`` (a simulated restart that drops every
  id-to-object handle); ``compensate`` and ``listAllocations``
  read those labels and nothing else;
- a snapshot asked with ``keep_seconds`` states its ``expires_at``; with provider custody
  (``snapshot_custody: provider``) the provider deletes it itself once that passes (at its
  next call, or ``sweep_expired()``), with runner custody it leaves that to the runner.

Tests may inspect ``calls`` (every member asked for, refused ones included, in
order), ``live_objects()`` (what the labelled store still holds) and
``held_bytes()`` (file bytes still held anywhere, so ``release_destroys`` is observable).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from checkfu.contract.checks import sha256_digest
from checkfu.contract.codec import decode_value
from checkfu.contract.enforcement import EnforcementStatement
from checkfu.contract.envelope import LifecycleAssurances, Member, SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxDigestMismatch,
    SandboxIdentityMismatch,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxPathRejected,
)
from checkfu.contract.labels import LABEL_ALLOCATION_KEY, LABEL_RUNNER_TAG, owner_labels
from checkfu.contract.lifecycle import SnapshotState, State, snapshot_transition, transition
from checkfu.contract.members import (
    ActivateRequest,
    AllocationEntry,
    Call,
    CloneRequest,
    CloneResult,
    CompensateRequest,
    CompensateResult,
    DeleteSnapshotRequest,
    DeleteSnapshotResult,
    DescribeResult,
    DirEntry,
    ExecRequest,
    ExecResult,
    FileContent,
    InspectRequest,
    InstanceCall,
    InstanceResult,
    ListAllocationsRequest,
    ListAllocationsResult,
    ListDirRequest,
    ListDirResult,
    MaterializeRequest,
    MaterializeResult,
    OpenProcessRequest,
    PathKind,
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
    echo,
)
from checkfu.contract.model import format_timestamp
from checkfu.contract.mounts import MountPlan
from checkfu.contract.paths import is_within
from checkfu.contract.process import Stream
from checkfu.contract.profile import NetworkPolicy, SandboxProfile
from checkfu.contract.requirements import require_capabilities
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.vocabulary import OPTIONAL_OPERATIONS, PACKAGE_MANAGERS, Platform, Resources, RetentionMode
from checkfu.testing.commands import (
    KILLED_EXIT,
    Capture,
    Clock,
    Context,
    Emitter,
    MemoryProcess,
    StdinReader,
    SystemClock,
    run,
)
from checkfu.testing.vfs import Vfs, fs_reason

BASE_IMAGE = "memory@sha256:" + hashlib.sha256(b"checkfu memory base image").hexdigest()
AMD64 = Platform(os="linux", architecture="amd64")
ARM64 = Platform(os="linux", architecture="arm64")
TEST_LEASE = Lease(lease_id="lease-test", lease_epoch=1)


def memory_envelope() -> SandboxProviderCapabilities:
    """What the memory provider serves, and no more: ``tests/testing/test_memory.py`` proves each claim.

    It has no network at all, so ``none`` is its only network mode. It confines
    nothing, so every enforcement axis is ``not_enforced``.
    """
    return SandboxProviderCapabilities(
        provider="memory",
        provider_revision="memory 1",
        materialization_revision="memory-images 1",
        placement="test",
        tiers=("container",),
        platforms=(AMD64, ARM64),
        image_mode="profile",
        fixed_base_images=(),
        package_managers=PACKAGE_MANAGERS,
        network_modes=("none",),
        retention_modes=("durable", "ephemeral_zdr"),
        snapshots=True,
        enforcement=EnforcementStatement.uniform("not_enforced"),
        list_dir=True,
        minimum_resources=Resources(cpu_millis=1, memory_mib=1, disk_mib=1, pids=1),
        maximum_resources=Resources(cpu_millis=1 << 20, memory_mib=1 << 20, disk_mib=1 << 20, pids=1 << 20),
        max_mounts=64,
        operations=OPTIONAL_OPERATIONS,
        lifecycle_assurances=LifecycleAssurances(
            release_destroys=True,
            release_idempotent=True,
            reaps_process_tree=True,
            cold_compensation=True,
            enumerates_allocations=True,
        ),
    )


def memory_profile(retention_mode: RetentionMode = "ephemeral_zdr") -> SandboxProfile:
    """A small profile that both the memory envelope and the seed's day-one envelope serve."""
    return SandboxProfile(
        tier="container",
        base_image=BASE_IMAGE,
        network_policy=NetworkPolicy(mode="none"),
        resource_limits=Resources(cpu_millis=500, memory_mib=256, disk_mib=256, pids=64),
        retention_mode=retention_mode,
    )


@dataclass(frozen=True)
class Held:
    """One object the labelled store still holds."""

    kind: Literal["instance", "snapshot"]
    object_id: str
    allocation_key: str
    runner_tag: str


# The labelled store ---------------------------------------------------------------------------


@dataclass(eq=False)
class _Object:
    id: str
    labels: dict[str, str]
    vfs: Vfs

    @property
    def allocation_key(self) -> str:
        return self.labels[LABEL_ALLOCATION_KEY]

    @property
    def runner_tag(self) -> str:
        return self.labels[LABEL_RUNNER_TAG]


@dataclass(eq=False)
class _Instance(_Object):
    retention: RetentionMode
    mounts: tuple[str, ...]
    state: State
    sealed: bool = False
    processes: set[asyncio.Task[tuple[int, bool]]] = field(default_factory=set)


@dataclass(eq=False)
class _Snapshot(_Object):
    source_id: str
    retention: RetentionMode
    state: SnapshotState
    expires_at: float | None = None


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


# The provider ---------------------------------------------------------------------------------

Allocating = ProvisionRequest | CloneRequest | ResumeRequest


class MemoryProvider:
    """The ``memory`` provider. Serves exactly the members its envelope declares.

    Args:
        envelope: what to advertise; ``memory_envelope()`` by default. Any valid
            envelope may be given (for example the seed's day-one tier): its target
            becomes the provider's own, and undeclared members are refused.
        clock: what ``sleep`` and ``timeout_ms`` read; the monotonic clock by default.
    """

    def __init__(
        self,
        envelope: SandboxProviderCapabilities | None = None,
        *,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.envelope = envelope if envelope is not None else memory_envelope()
        self.target: ExecutionTarget = self.envelope.target
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.wall = wall
        """The wall clock snapshot expiries are stated and judged by."""
        self.calls: list[str] = []
        self._store: dict[str, _Instance | _Snapshot] = {}  # the labelled objects: what a restart keeps
        self._labelled: dict[tuple[str, str], set[str]] = {}  # (allocation key, runner tag) -> ids in the store
        self._snapshots_of: dict[str, set[str]] = {}  # instance id -> ids of its snapshots in the store
        self._images: dict[str, str] = {}  # profile digest -> image; images survive a restart too
        self._instances: dict[str, _Instance] = {}  # handles, released ones included: what a restart loses
        self._snapshots: dict[str, _Snapshot] = {}

    # Test inspection -------------------------------------------------------------------------

    def live_objects(self) -> tuple[Held, ...]:
        """Every instance and snapshot the labelled store still holds, by kind and id."""
        held = [
            Held("instance" if isinstance(o, _Instance) else "snapshot", o.id, o.allocation_key, o.runner_tag)
            for o in self._store.values()
        ]
        return tuple(sorted(held, key=lambda h: (h.kind, h.object_id)))

    def held_bytes(self) -> int:
        """File bytes still held for any instance or snapshot, released and forgotten ones included."""
        objects = {id(o): o for o in (*self._store.values(), *self._instances.values(), *self._snapshots.values())}
        return sum(len(node.data) for o in objects.values() for node in o.vfs.files.values())

    def forget(self) -> None:
        """Simulate a restart: drop every id-to-object handle; labelled objects, their processes and images stay."""
        self._instances.clear()
        self._snapshots.clear()

    # Shared steps ----------------------------------------------------------------------------

    def _enter(self, member: Member, request: Call | None) -> None:
        """Record the call; refuse an undeclared member or another target. With provider custody, first delete
        every snapshot whose expiry has passed (the provider holds them, so it keeps their expiry)."""
        self.calls.append(member)
        if self.envelope.snapshot_custody == "provider":
            self._expire()
        if not self.envelope.declares(member):
            raise SandboxOperationUnsupported(f"{member} is not declared by {self.target}")
        if request is not None and request.target != self.target:
            raise SandboxIdentityMismatch(
                f"target: {request.target} is not this provider's {self.target}", field="target"
            )

    def _instance(self, member: Member, request: InstanceCall) -> _Instance:
        self._enter(member, request)
        return self._lookup(member, request.instance_id, request.allocation_key)

    def _lookup(self, member: Member, instance_id: str, allocation_key: str, prefix: str = "") -> _Instance:
        """The instance, moved through the lifecycle table by ``member``.

        Raises:
            SandboxNotFound: no instance ``instance_id`` under ``allocation_key``.
            SandboxStateConflict: ``member`` is not allowed in the instance's state.
        """
        inst = self._instances.get(instance_id)
        if inst is None or inst.allocation_key != allocation_key:
            raise SandboxNotFound(
                f"{prefix}instance_id: no instance {instance_id!r} under allocation key {allocation_key!r}",
                field=f"{prefix}instance_id",
            )
        inst.state = transition(inst.state, member)
        return inst

    def _snapshot_handle(self, snapshot_id: str, allocation_key: str) -> _Snapshot:
        snap = self._snapshots.get(snapshot_id)
        if snap is None or snap.allocation_key != allocation_key or snap.state == "deleted":
            raise SandboxNotFound(
                f"snapshot_id: no snapshot {snapshot_id!r} under allocation key {allocation_key!r}",
                field="snapshot_id",
            )
        return snap

    def _expire(self) -> list[str]:
        """Drop every stored snapshot whose expiry has passed; their ids."""
        now = self.wall()
        doomed = [
            o
            for o in self._store.values()
            if isinstance(o, _Snapshot) and o.expires_at is not None and o.expires_at <= now
        ]
        for snap in doomed:
            self._drop(snap)
            snap.vfs = Vfs()
            snap.state = "deleted"
        return sorted(s.id for s in doomed)

    def sweep_expired(self) -> list[str]:
        """Delete every snapshot whose expiry has passed, whatever the custody; the ids deleted. (With provider
        custody this happens at every call anyway.)"""
        return self._expire()

    def _admit(self, profile: SandboxProfile, platform: Platform, mounts: Sequence[MountPlan] = ()) -> None:
        """Raises SandboxCapabilityUnavailable: listing everything the envelope cannot serve."""
        require_capabilities(self.envelope, profile, platform=platform, mount_count=len(mounts))

    def _allocate(self, member: Literal["provision", "clone", "resume"], request: Allocating, vfs: Vfs) -> _Instance:
        """A new labelled instance in ``provisioning``, holding ``vfs`` with each mount target emptied.

        A taken allocation key is not refused: ``Misbehaving`` allocates a second real instance under one
        key this way, and compensating the key reclaims both.

        Raises:
            SandboxCapabilityUnavailable: the envelope cannot serve the profile, platform or mounts.
            SandboxNotFound: the root image was not materialized here.
            SandboxPathRejected: a mount target cannot be emptied (it lies below a file).
        """
        self._admit(request.profile, request.platform, request.mounts)
        if request.root_image not in self._images.values():
            raise SandboxNotFound(f"root_image: {request.root_image} was not materialized here", field="root_image")
        for i, root in enumerate(request.mount_roots):
            try:
                vfs.clear(root)
            except OSError as exc:
                where = f"mounts.{i}.target"
                raise SandboxPathRejected(f"{where}: {root!r}: {fs_reason(exc)}", field=where) from None
        inst = _Instance(
            id=_new_id("mem"),
            labels=owner_labels(request.allocation_key, request.runner_tag),
            vfs=vfs,
            retention=request.profile.retention_mode,
            mounts=request.mount_roots,
            state=transition("absent", member),
        )
        self._keep(inst)
        self._instances[inst.id] = inst
        return inst

    def _keep(self, obj: _Instance | _Snapshot) -> None:
        """Put ``obj`` in the labelled store, indexed by its labels (and by its source, for a snapshot)."""
        self._store[obj.id] = obj
        self._labelled.setdefault((obj.allocation_key, obj.runner_tag), set()).add(obj.id)
        if isinstance(obj, _Snapshot):
            self._snapshots_of.setdefault(obj.source_id, set()).add(obj.id)

    def _drop(self, obj: _Instance | _Snapshot) -> bool:
        """Take ``obj`` out of the labelled store; false when it was not there."""
        if self._store.pop(obj.id, None) is None:
            return False
        label = (obj.allocation_key, obj.runner_tag)
        self._labelled[label].discard(obj.id)
        if not self._labelled[label]:
            del self._labelled[label]
        if isinstance(obj, _Snapshot):
            siblings = self._snapshots_of[obj.source_id]
            siblings.discard(obj.id)
            if not siblings:
                del self._snapshots_of[obj.source_id]
        return True

    async def _destroy(self, obj: _Instance | _Snapshot) -> None:
        """End ``obj``'s processes, drop its bytes and its labels; for ``ephemeral_zdr``, its snapshots too."""
        if not self._drop(obj):
            return
        obj.vfs = Vfs()
        if isinstance(obj, _Snapshot):
            obj.state = "deleted"
            return
        obj.state = "released"
        if obj.processes:
            for task in obj.processes:
                task.cancel()
            await asyncio.wait(set(obj.processes))
        if obj.retention == "ephemeral_zdr":
            for snap_id in sorted(self._snapshots_of.get(obj.id, ())):
                await self._destroy(self._store[snap_id])

    def _context(
        self,
        inst: _Instance,
        request: ExecRequest | OpenProcessRequest,
        read_stdin: StdinReader,
        emit: Emitter,
        deadline: float | None = None,
    ) -> Context:
        sealed = inst.mounts if inst.sealed else ()
        cwd = request.cwd or "/"
        return Context(inst.vfs, cwd, request.env, sealed, self.clock, deadline, read_stdin, emit)

    @staticmethod
    def _spawn(inst: _Instance, ctx: Context, argv: Sequence[str]) -> asyncio.Task[tuple[int, bool]]:
        task = asyncio.create_task(run(ctx, argv))
        inst.processes.add(task)
        task.add_done_callback(inst.processes.discard)
        return task

    # The nine required members ---------------------------------------------------------------

    async def describe(self) -> DescribeResult:
        self._enter("describe", None)
        return DescribeResult(envelope=self.envelope)

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult:
        """Idempotent per profile digest: ``built`` is true only the first time."""
        self._enter("materialize", request)
        self._admit(request.profile, request.platform)
        built = request.profile_digest not in self._images
        if built:
            if self.envelope.image_mode == "fixed":
                image = request.profile.base_image
            else:
                seed = f"{request.profile_digest} {self.target.materialization_revision}".encode()
                image = "sha256:" + hashlib.sha256(seed).hexdigest()
            self._images[request.profile_digest] = image
        return MaterializeResult(
            **echo(request),
            profile_digest=request.profile_digest,
            image=self._images[request.profile_digest],
            materialization_revision=self.target.materialization_revision,
            built=built,
        )

    async def provision(self, request: ProvisionRequest) -> InstanceResult:
        self._enter("provision", request)
        inst = self._allocate("provision", request, Vfs())
        return InstanceResult(**echo(request, instance_id=inst.id, state=inst.state))

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult:
        """Stage ``data`` under one of the instance's mount targets.

        Raises:
            SandboxPathRejected: the path is under no mount target, or clashes with a directory or file.
            SandboxDigestMismatch: ``data`` does not have the stated size or digest.
        """
        inst = self._instance("writeFile", request)
        if request.symlink:
            raise SandboxOperationUnsupported("symlink: the memory provider stages no symlinks", field="symlink")
        if not any(is_within(request.path, root) for root in inst.mounts):
            roots = ", ".join(inst.mounts) or "none"
            raise SandboxPathRejected(f"path: {request.path!r} is under no mount target ({roots})", field="path")
        if len(data) != request.size:
            raise SandboxDigestMismatch(
                f"size: {len(data)} bytes arrived, the request states {request.size}", field="size"
            )
        digest = sha256_digest(data)
        if digest != request.digest:
            raise SandboxDigestMismatch(
                f"digest: the bytes are {digest}, the request states {request.digest}", field="digest"
            )
        try:
            inst.vfs.write(request.path, data, request.mode)
        except OSError as exc:
            raise SandboxPathRejected(f"path: {request.path!r}: {fs_reason(exc)}", field="path") from None
        return WriteFileResult(**echo(request, path=request.path, size=len(data), digest=digest))

    async def activate(self, request: ActivateRequest) -> InstanceResult:
        """Seal every mount target: from now on no command may write below one."""
        inst = self._instance("activate", request)
        inst.sealed = True
        return InstanceResult(**echo(request, state=inst.state))

    async def exec(self, request: ExecRequest) -> ExecResult:
        """Run a built-in command to its exit, its timeout (exit 124) or a release (exit 137)."""
        inst = self._instance("exec", request)
        out, err = Capture(request.max_output_bytes), Capture(request.max_output_bytes)
        stdin = [request.stdin] if request.stdin else []

        async def read_stdin() -> bytes | None:
            return stdin.pop() if stdin else None

        async def emit(stream: Stream, data: bytes) -> None:
            (out if stream == "out" else err).add(data)

        deadline = self.clock.now() + request.timeout_ms / 1000
        task = self._spawn(inst, self._context(inst, request, read_stdin, emit, deadline), request.argv)
        try:
            await asyncio.wait({task})
        finally:
            task.cancel()  # a no-op once done; ends the command if this call itself was cancelled
        exit_code, timed_out = (KILLED_EXIT, False) if task.cancelled() else task.result()
        return ExecResult(
            **echo(request),
            exit_code=exit_code,
            timed_out=timed_out,
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )

    async def inspect(self, request: InspectRequest) -> InstanceResult:
        inst = self._instance("inspect", request)
        return InstanceResult(**echo(request, state=inst.state))

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        """End every process, drop every byte; a second release returns the same identity."""
        inst = self._instance("release", request)
        await self._destroy(inst)
        return ReleaseResult(**echo(request, state="released", destroyed=True))

    async def compensate(self, request: CompensateRequest) -> CompensateResult:
        """Reclaim every object labelled with the key and runner tag, by label alone; idempotent."""
        self._enter("compensate", request)
        ids = self._labelled.get((request.allocation_key, request.runner_tag), set())
        doomed = [self._store[i] for i in sorted(ids)]
        for obj in doomed:
            await self._destroy(obj)
        return CompensateResult(**echo(request, reclaimed=len(doomed)))

    # The eight optional members --------------------------------------------------------------

    async def open_process(self, request: OpenProcessRequest) -> MemoryProcess:
        inst = self._instance("openProcess", request)
        if request.tty is not None:
            raise SandboxOperationUnsupported("tty: the memory provider gives no process a terminal", field="tty")
        started = ProcessStarted(**echo(request, process_id=_new_id("proc")))
        return MemoryProcess(
            started, lambda read, emit: self._spawn(inst, self._context(inst, request, read, emit), request.argv)
        )

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult:
        """Raises SandboxBoundExceeded: the files together are larger than ``max_bytes``."""
        inst = self._instance("readFiles", request)
        files, missing, total = [], [], 0
        for path in request.paths:
            node = inst.vfs.read(path)
            if node is None:
                missing.append(path)
                continue
            total += len(node.data)
            if total > request.max_bytes:
                raise SandboxBoundExceeded(f"max_bytes: the files exceed {request.max_bytes} bytes", field="max_bytes")
            files.append(FileContent(path=path, mode=node.mode, digest=sha256_digest(node.data), data=node.data))
        return ReadFilesResult(**echo(request, files=files, missing=missing))

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult:
        self._enter("listAllocations", request)
        allocations = [
            AllocationEntry(allocation_key=h.allocation_key, kind=h.kind, object_id=h.object_id)
            for h in self.live_objects()
            if h.runner_tag == request.runner_tag
        ]
        return ListAllocationsResult(**echo(request, runner_tag=request.runner_tag, allocations=allocations))

    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        """A file or nothing at ``path`` is answered in-band (kind ``file`` or ``missing``), not raised."""
        inst = self._instance("listDir", request)
        if not inst.vfs.is_dir(request.path):
            kind: PathKind = "file" if inst.vfs.read(request.path) is not None else "missing"
            return ListDirResult(**echo(request, path=request.path, kind=kind, entries=(), truncated=False))
        found = inst.vfs.entries(request.path, recursive=request.recursive)
        entries = [DirEntry(path=e.path, kind=e.kind, size=e.size, mode=e.mode) for e in found[: request.max_entries]]
        return ListDirResult(
            **echo(request, path=request.path, kind="dir", entries=entries, truncated=len(found) > request.max_entries)
        )

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        """Copy the instance's whole file system into a snapshot labelled with the snapshot allocation key."""
        inst = self._instance("snapshot", request)
        expires_at = None if request.keep_seconds is None else int(self.wall() + request.keep_seconds)
        snap = _Snapshot(
            id=_new_id("snap"),
            labels=owner_labels(request.snapshot_allocation_key, inst.runner_tag),
            vfs=inst.vfs.copy(),
            source_id=inst.id,
            retention=inst.retention,
            state=snapshot_transition("absent", "snapshot"),
            expires_at=expires_at,
        )
        self._keep(snap)
        self._snapshots[snap.id] = snap
        return SnapshotResult(
            **echo(
                request,
                snapshot_allocation_key=request.snapshot_allocation_key,
                snapshot_id=snap.id,
                expires_at=None if expires_at is None else format_timestamp(expires_at),
            )
        )

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult:
        """Idempotent: deleting a deleted snapshot answers ``deleted: true`` again."""
        self._enter("deleteSnapshot", request)
        snap = self._snapshots.get(request.snapshot_id)
        if snap is None or snap.allocation_key != request.snapshot_allocation_key:
            raise SandboxNotFound(
                f"snapshot_id: no snapshot {request.snapshot_id!r} under that key", field="snapshot_id"
            )
        snap.state = snapshot_transition(snap.state, "deleteSnapshot")
        await self._destroy(snap)
        return DeleteSnapshotResult(
            **echo(request, snapshot_allocation_key=request.snapshot_allocation_key, snapshot_id=snap.id, deleted=True)
        )

    async def clone(self, request: CloneRequest) -> CloneResult:
        """A new instance holding a copy of the live source's files; neither sees the other's writes."""
        self._enter("clone", request)
        source = self._lookup("clone", request.source_instance_id, request.source_allocation_key, prefix="source_")
        inst = self._allocate("clone", request, source.vfs.copy())
        return CloneResult(**echo(request, instance_id=inst.id, state=inst.state, source_instance_id=source.id))

    async def resume(self, request: ResumeRequest) -> ResumeResult:
        """A new instance from a snapshot. Raises SandboxNotFound: the snapshot is unknown, foreign or deleted."""
        self._enter("resume", request)
        snap = self._snapshot_handle(request.snapshot_id, request.snapshot_allocation_key)
        snap.state = snapshot_transition(snap.state, "resume")
        inst = self._allocate("resume", request, snap.vfs.copy())
        return ResumeResult(**echo(request, instance_id=inst.id, state=inst.state, snapshot_id=snap.id))


def day_one_envelope() -> SandboxProviderCapabilities:
    """The memory provider as the seed's day-one tier: ``ephemeral_zdr`` only, no snapshots, no ``listDir``,
    network ``none``, no optional member, a fixed image; nothing else declared. Conformance skips four of nine."""
    return memory_envelope().model_copy(
        update={
            "provider": "memory-day-one",
            "image_mode": "fixed",
            "fixed_base_images": (BASE_IMAGE,),
            "package_managers": (),
            "retention_modes": ("ephemeral_zdr",),
            "snapshots": False,
            "list_dir": False,
            "operations": (),
            "lifecycle_assurances": LifecycleAssurances(release_destroys=True),
        }
    )


def create(envelope: Mapping[str, Any] | None = None) -> MemoryProvider:
    """Entry-point factory (group ``checkfu.providers``); ``envelope`` is JSON-like, as an adapters file gives it.

    Raises:
        SandboxEnvelopeInvalid: ``envelope`` does not decode.
    """
    return MemoryProvider(None if envelope is None else decode_value(SandboxProviderCapabilities, envelope))


@dataclass(frozen=True)
class Requests:
    """Well-formed requests for one target under one lease: for tests that drive a provider by hand.

    Build the members it has no method for with ``on``: ``ActivateRequest(**r.on(instance))``.
    """

    target: ExecutionTarget
    lease: Lease = TEST_LEASE
    runner_tag: str = "runner-test"
    profile: SandboxProfile = field(default_factory=memory_profile)
    platform: Platform = AMD64

    def call(self) -> dict[str, Any]:
        return {"target": self.target, "lease": self.lease}

    def on(self, instance: InstanceResult) -> dict[str, Any]:
        """The fields of an ``InstanceCall`` acting on ``instance``."""
        return {**self.call(), "allocation_key": instance.allocation_key, "instance_id": instance.instance_id}

    def materialize(self) -> MaterializeRequest:
        return MaterializeRequest(
            **self.call(), profile=self.profile, profile_digest=self.profile.digest, platform=self.platform
        )

    def _allocating(self, allocation_key: str, image: str, mounts: Sequence[MountPlan]) -> dict[str, Any]:
        return {
            **self.call(),
            "profile": self.profile,
            "profile_digest": self.profile.digest,
            "platform": self.platform,
            "allocation_key": allocation_key,
            "runner_tag": self.runner_tag,
            "mounts": tuple(mounts),
            "root_image": image,
        }

    def provision(self, allocation_key: str, image: str, mounts: Sequence[MountPlan] = ()) -> ProvisionRequest:
        return ProvisionRequest(**self._allocating(allocation_key, image, mounts))

    def clone(
        self, source: InstanceResult, allocation_key: str, image: str, mounts: Sequence[MountPlan] = ()
    ) -> CloneRequest:
        return CloneRequest(
            **self._allocating(allocation_key, image, mounts),
            source_allocation_key=source.allocation_key,
            source_instance_id=source.instance_id,
        )

    def resume(
        self, snapshot: SnapshotResult, allocation_key: str, image: str, mounts: Sequence[MountPlan] = ()
    ) -> ResumeRequest:
        return ResumeRequest(
            **self._allocating(allocation_key, image, mounts),
            snapshot_allocation_key=snapshot.snapshot_allocation_key,
            snapshot_id=snapshot.snapshot_id,
        )

    def exec(
        self,
        instance: InstanceResult,
        *argv: str,
        stdin: bytes = b"",
        timeout_ms: int = 10_000,
        max_output_bytes: int = 1 << 20,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecRequest:
        return ExecRequest(
            **self.on(instance),
            argv=argv,
            stdin=stdin,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            cwd=cwd,
            env=dict(env or {}),
        )
