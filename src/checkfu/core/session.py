"""The session core: one Run attempt's state and rules, with no I/O.

It stands to the provider door as h11's ``Connection`` stands to its socket. The
core owns the state of everything the attempt holds, moved only through the three
tables of ``checkfu.contract.lifecycle``: each instance's, each snapshot's and each
journal row's. For every member call it builds a ``Plan``: the request, the
deadline, what must be journaled before the call, and how to judge the answer.

- ``Plan.accept`` judges an answer: it decodes strictly, cross-checks every echo,
  the lease, the state and the bounds, moves the tables, and returns the value
  with the ``Effect``\\ s the shell must apply (settle this journal row).
- ``Plan.on_fault`` says what to reclaim when the provider was at fault: it raised
  (whatever the code), timed out, or answered out of contract.
- ``Plan.on_abandon`` says what to reclaim when the call was abandoned for a
  reason of the runner's own (its lease was fenced, it was cancelled).

The core never calls a provider, opens a database or touches asyncio, and reads
no clock but the one it is handed (``now``, to judge a snapshot's stated expiry).
The shell (``checkfu.core.driver.RunSession``) does all of that, and
``checkfu.core.door`` is the one place any provider is called.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from checkfu.contract.checks import (
    check_bound,
    check_echo,
    check_equal,
    check_expiry,
    check_new_identity,
    check_read_files,
    check_returned_paths,
    check_state,
    check_write,
    sha256_digest,
)
from checkfu.contract.codec import build, revalidate
from checkfu.contract.deadlines import DEFAULT_DEADLINES
from checkfu.contract.envelope import Member, SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxEnvelopeInvalid,
    SandboxError,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxProviderFailed,
    SandboxResultInvalid,
)
from checkfu.contract.lifecycle import (
    RowEvent,
    RowKind,
    RowState,
    SnapshotState,
    State,
    row_transition,
    snapshot_transition,
    transition,
)
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
from checkfu.contract.model import Model, format_timestamp, parse_timestamp
from checkfu.contract.mounts import MountPlan
from checkfu.contract.paths import admit_path
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import REFUSALS, ProcessStream
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.vocabulary import Platform, RetentionMode

V = TypeVar("V")
R = TypeVar("R", bound=Model)


@dataclass(frozen=True)
class Limits:
    """The runner's bounds on what a provider may hand back, and how long each member may take."""

    max_output_bytes: int = 8 << 20
    max_read_bytes: int = 64 << 20
    max_list_entries: int = 10_000
    deadlines: Mapping[Member, float] = field(default_factory=lambda: dict(DEFAULT_DEADLINES))

    def deadline(self, member: Member) -> float:
        return float(self.deadlines.get(member, DEFAULT_DEADLINES[member]))


def new_key(prefix: str = "ak") -> str:
    """A fresh runner-chosen allocation key."""
    return f"{prefix}-{uuid.uuid4().hex}"


# what the shell must do ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalAllocation:
    """Write a ``pending`` row for ``key`` before the provider is asked for it."""

    key: str
    kind: RowKind
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class SettleRow:
    """Move the journal row of ``key`` to ``state`` (recording ``object_id`` when given)."""

    key: str
    state: RowState
    object_id: str | None = None
    expires_at: float | None = None
    """For a snapshot: when it expires (seconds since the epoch), as the provider stated it."""


@dataclass(frozen=True, slots=True)
class Compensate:
    """Reclaim ``key`` by cold compensation: nothing the provider said about it is trusted any more."""

    key: str


Effect = JournalAllocation | SettleRow | Compensate


@dataclass(frozen=True, slots=True)
class Accepted(Generic[V]):
    """An answer that passed every check: its value, and what the shell must apply next."""

    value: V
    effects: tuple[Effect, ...] = ()


def refused_request(member: Member, error: SandboxError) -> bool:
    """Whether ``error`` is the provider refusing the request itself by a code the contract lists for ``member``
    (``checkfu.contract.provider.REFUSALS``): the instance it was asked of is not in question."""
    return isinstance(error, SandboxProviderFailed) and error.reported_code in REFUSALS.get(member, frozenset())


def _nothing(_: SandboxError | None = None) -> tuple[Effect, ...]:
    return ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan(Generic[V]):
    """One member call, fully decided before it is made.

    ``request`` is ``None`` for ``describe``; ``data`` travels beside a ``writeFile``
    request. ``allocation_key`` is what the call is recorded under.
    """

    member: Member
    request: Model | None
    deadline: float
    accept: Callable[[object], Accepted[V]]
    data: bytes | None = None
    allocation_key: str | None = None
    before: tuple[Effect, ...] = ()
    on_fault: Callable[[SandboxError], tuple[Effect, ...]] = _nothing
    on_abandon: Callable[[], tuple[Effect, ...]] = _nothing


# the records the core keeps ------------------------------------------------------------------


class Instance:
    """The runner's own record of an instance: the only source of truth for cross-checks.

    Its state moves only through ``TRANSITIONS``, by the core that holds it.
    """

    __slots__ = ("_state", "allocation_key", "instance_id", "kind", "mount_roots", "retention")

    def __init__(
        self,
        *,
        allocation_key: str,
        instance_id: str,
        state: State,
        mount_roots: tuple[str, ...],
        kind: RowKind,
        retention: RetentionMode = "durable",
    ) -> None:
        self.allocation_key = allocation_key
        self.instance_id = instance_id
        self.mount_roots = mount_roots
        self.kind = kind
        self.retention = retention
        self._state = state

    @property
    def state(self) -> State:
        return self._state

    def __repr__(self) -> str:
        return f"Instance({self.instance_id!r}, {self._state}, key={self.allocation_key!r})"


class Snapshot:
    """The runner's own record of a snapshot; its state moves only through ``SNAPSHOT_TRANSITIONS``."""

    __slots__ = ("_state", "allocation_key", "expires_at", "snapshot_id", "source")

    def __init__(
        self,
        *,
        allocation_key: str,
        snapshot_id: str,
        source: Instance,
        state: SnapshotState = "present",
        expires_at: float | None = None,
    ) -> None:
        self.allocation_key = allocation_key
        self.snapshot_id = snapshot_id
        self.source = source
        self.expires_at = expires_at
        """When the provider said the snapshot expires (seconds since the epoch); ``None``: kept until deleted."""
        self._state = state

    @property
    def state(self) -> SnapshotState:
        return self._state

    @property
    def deleted(self) -> bool:
        return self._state == "deleted"

    def __repr__(self) -> str:
        return f"Snapshot({self.snapshot_id!r}, {self._state}, key={self.allocation_key!r})"


@dataclass(frozen=True, slots=True)
class OpenedProcess:
    """An open process whose ``started`` event passed every check."""

    stream: ProcessStream
    started: ProcessStarted


# plans that need no session ------------------------------------------------------------------


def describe_plan(source: str, limits: Limits | None = None) -> Plan[SandboxProviderCapabilities]:
    """Ask a provider for its envelope; an envelope that does not decode is ``SandboxEnvelopeInvalid``."""

    def accept(raw: object) -> Accepted[SandboxProviderCapabilities]:
        try:
            return Accepted(revalidate(DescribeResult, raw).envelope)
        except SandboxError as exc:
            raise SandboxEnvelopeInvalid(f"{source}: {exc.message}", field=exc.field) from None

    return Plan(member="describe", request=None, deadline=(limits or Limits()).deadline("describe"), accept=accept)


def compensate_plan(
    target: ExecutionTarget, lease: Lease, key: str, runner_tag: str, limits: Limits | None = None
) -> Plan[CompensateResult]:
    """Cold compensation of ``key``: its answer need only echo the target, the lease and the key."""
    req = build(CompensateRequest, target=target, lease=lease, allocation_key=key, runner_tag=runner_tag)

    def accept(raw: object) -> Accepted[CompensateResult]:
        res = revalidate(CompensateResult, raw)
        check_echo(res, target=target, lease=lease, allocation_key=key)
        return Accepted(res)

    deadline = (limits or Limits()).deadline("compensate")
    return Plan(member="compensate", request=req, deadline=deadline, accept=accept, allocation_key=key)


def list_allocations_plan(
    target: ExecutionTarget, lease: Lease, runner_tag: str, limits: Limits | None = None
) -> Plan[ListAllocationsResult]:
    """What the provider holds for ``runner_tag``, echoing the target, the lease and the tag."""
    req = build(ListAllocationsRequest, target=target, lease=lease, runner_tag=runner_tag)

    def accept(raw: object) -> Accepted[ListAllocationsResult]:
        res = revalidate(ListAllocationsResult, raw)
        check_echo(res, target=target, lease=lease)
        check_equal("runner_tag", res.runner_tag, runner_tag)
        return Accepted(res)

    deadline = (limits or Limits()).deadline("listAllocations")
    return Plan(member="listAllocations", request=req, deadline=deadline, accept=accept)


# the core ------------------------------------------------------------------------------------


class SessionCore:
    """One Run attempt on one adapter: its records, its rules and its plans. No I/O.

    Every plan builder refuses, before any provider work, a member the envelope does not
    declare (``SandboxOperationUnsupported``) and a member the lifecycle table does not
    allow in the current state (``SandboxStateConflict``); a refusal changes nothing.
    """

    def __init__(
        self,
        *,
        envelope: SandboxProviderCapabilities,
        lease: Lease,
        runner_tag: str,
        limits: Limits | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        self.envelope = envelope
        self.now = now
        """The shell's wall clock, handed in; read only to judge a snapshot's stated expiry (a core handed none
        cannot ask for a lifetime, and takes a stated expiry unjudged)."""
        self.target: ExecutionTarget = envelope.target
        self.lease = lease
        self.runner_tag = runner_tag
        self.limits = limits or Limits()
        self.instances: dict[str, Instance] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.rows: dict[str, RowState] = {}
        """The state of every journal row this attempt wrote, by allocation key."""
        self.undestroyed: dict[str, str] = {}
        """Instances whose ``release`` answered ``destroyed: false`` where the envelope promises destruction, by
        allocation key, with the refusal: by the provider's own word something of them survived release."""

    # refusals ---------------------------------------------------------------------------------

    def require_declared(self, member: Member) -> None:
        """Raises SandboxOperationUnsupported: the runner never calls a member the envelope does not declare."""
        if not self.envelope.declares(member):
            raise SandboxOperationUnsupported(
                f"{member} is not declared by {self.target}; the runner does not call it", field=member
            )

    def _may(self, inst: Instance, member: Member) -> None:
        self.require_declared(member)
        transition(inst.state, member)

    # moving the tables ------------------------------------------------------------------------

    def _move(self, inst: Instance, member: Member) -> None:
        inst._state = transition(inst.state, member)

    def _row(
        self, key: str, event: RowEvent, object_id: str | None = None, expires_at: float | None = None
    ) -> SettleRow:
        after = row_transition(self.rows.get(key, "pending"), event)
        self.rows[key] = after
        return SettleRow(key, after, object_id, expires_at)

    def _reclaim(self, inst: Instance, member: Member | None = None) -> Callable[[SandboxError], tuple[Effect, ...]]:
        """On a provider fault about ``inst``: nothing it says of ``inst`` is trusted; compensate it by key. A refusal
        the contract lists for ``member`` as the request's own (``REFUSALS``) leaves ``inst`` as it is."""

        def on_fault(error: SandboxError) -> tuple[Effect, ...]:
            if member is not None and refused_request(member, error):
                return ()
            self._move(inst, "compensate")
            return (Compensate(inst.allocation_key),)

        return on_fault

    def take(self, key: str, *, instance: Instance | None = None, snapshot: Snapshot | None = None) -> None:
        """Hold ``key``, journaled ``live`` before this attempt (a pooled sandbox adopted, a live sandbox attached, a
        snapshot to delete), with the runner's record of its instance or snapshot when there is one: its row is
        ``live``, and the attempt's plans cross-check against that record from now on."""
        if instance is not None and instance.allocation_key != key:
            raise ValueError(f"instance {instance.instance_id!r} is not allocation {key!r}")
        if snapshot is not None and snapshot.allocation_key != key:
            raise ValueError(f"snapshot {snapshot.snapshot_id!r} is not allocation {key!r}")
        if instance is not None:
            self.instances[key] = instance
        if snapshot is not None:
            self.snapshots[key] = snapshot
        self.rows[key] = "live"

    def let_go(self, key: str) -> None:
        """Stop holding ``key`` without releasing it (a long-lived sandbox detached from): the attempt's wind-up
        releases nothing of it, and its row stays as the journal has it."""
        self.instances.pop(key, None)
        self.snapshots.pop(key, None)
        self.rows.pop(key, None)

    def held_ids(self) -> set[str]:
        return {i.instance_id for i in self.instances.values()} | {s.snapshot_id for s in self.snapshots.values()}

    # fields every request carries -------------------------------------------------------------

    def _call(self) -> dict[str, Any]:
        return {"target": self.target, "lease": self.lease}

    def _on(self, inst: Instance) -> dict[str, Any]:
        return {**self._call(), "allocation_key": inst.allocation_key, "instance_id": inst.instance_id}

    def _echoes(self, res: Any, inst: Instance) -> None:
        check_echo(
            res, target=self.target, lease=self.lease, allocation_key=inst.allocation_key, instance_id=inst.instance_id
        )

    def _instance_plan(
        self,
        inst: Instance,
        member: Member,
        request: Model,
        result_type: type[R],
        check: Callable[[R], None],
        *,
        data: bytes | None = None,
        extra_seconds: float = 0.0,
        move: bool = False,
        row: RowEvent | None = None,
    ) -> Plan[R]:
        """A call on ``inst``: a provider fault reclaims it. On success ``move`` applies the member's
        transition to the instance, and ``row`` moves its journal row."""

        def accept(raw: object) -> Accepted[R]:
            res = revalidate(result_type, raw)
            self._echoes(res, inst)
            check(res)
            if move:
                self._move(inst, member)
            return Accepted(res, (self._row(inst.allocation_key, row),) if row is not None else ())

        return Plan(
            member=member,
            request=request,
            data=data,
            deadline=self.limits.deadline(member) + extra_seconds,
            accept=accept,
            allocation_key=inst.allocation_key,
            on_fault=self._reclaim(inst, member),
        )

    # materialize ------------------------------------------------------------------------------

    def materialize(self, profile: SandboxProfile, platform: Platform) -> Plan[MaterializeResult]:
        self.require_declared("materialize")
        req = build(
            MaterializeRequest, **self._call(), profile=profile, profile_digest=profile.digest, platform=platform
        )

        def accept(raw: object) -> Accepted[MaterializeResult]:
            res = revalidate(MaterializeResult, raw)
            check_echo(res, target=self.target, lease=self.lease)
            check_equal("profile_digest", res.profile_digest, profile.digest)
            check_equal("materialization_revision", res.materialization_revision, self.target.materialization_revision)
            return Accepted(res)

        return Plan(member="materialize", request=req, deadline=self.limits.deadline("materialize"), accept=accept)

    # allocation: provision, clone, resume -----------------------------------------------------

    def _allocating(
        self, key: str, profile: SandboxProfile, platform: Platform, root_image: str, mounts: Sequence[MountPlan]
    ) -> dict[str, Any]:
        return {
            **self._call(),
            "allocation_key": key,
            "runner_tag": self.runner_tag,
            "profile": profile,
            "profile_digest": profile.digest,
            "platform": platform,
            "root_image": root_image,
            "mounts": list(mounts),
        }

    def _allocate(
        self,
        member: Member,
        key: str,
        kind: RowKind,
        request: ProvisionRequest | CloneRequest | ResumeRequest,
        result_type: type[InstanceResult],
        extra: Callable[[Any], None] | None = None,
        parent: str | None = None,
    ) -> Plan[Instance]:
        """Journal ``key`` first; settle it only once the answer passes every check, else compensate it."""
        held = self.held_ids()
        self.rows[key] = "pending"

        def accept(raw: object) -> Accepted[Instance]:
            res = revalidate(result_type, raw)
            check_echo(res, target=self.target, lease=self.lease, allocation_key=key)
            check_new_identity("instance_id", res.instance_id, held)
            check_state(res.state, "provisioning", member=member)
            if extra is not None:
                extra(res)
            inst = Instance(
                allocation_key=key,
                instance_id=res.instance_id,
                state=transition("absent", member),
                mount_roots=request.mount_roots,
                kind=kind,
                retention=request.profile.retention_mode,
            )
            self.instances[key] = inst
            return Accepted(inst, (self._row(key, "settle", res.instance_id),))

        def reclaim(_: SandboxError | None = None) -> tuple[Effect, ...]:
            return (Compensate(key),)

        return Plan(
            member=member,
            request=request,
            deadline=self.limits.deadline(member),
            accept=accept,
            allocation_key=key,
            before=(JournalAllocation(key, kind, parent),),
            on_fault=reclaim,
            on_abandon=reclaim,
        )

    def provision(
        self, profile: SandboxProfile, platform: Platform, root_image: str, mounts: Sequence[MountPlan] = ()
    ) -> Plan[Instance]:
        self.require_declared("provision")
        key = new_key()
        req = build(ProvisionRequest, **self._allocating(key, profile, platform, root_image, mounts))
        return self._allocate("provision", key, "instance", req, InstanceResult)

    def clone(
        self,
        source: Instance,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[MountPlan] = (),
    ) -> Plan[Instance]:
        self._may(source, "clone")
        key = new_key()
        req = build(
            CloneRequest,
            **self._allocating(key, profile, platform, root_image, mounts),
            source_allocation_key=source.allocation_key,
            source_instance_id=source.instance_id,
        )

        def extra(res: CloneResult) -> None:
            check_equal("source_instance_id", res.source_instance_id, source.instance_id)

        return self._allocate("clone", key, "clone", req, CloneResult, extra, parent=source.allocation_key)

    def resume(
        self,
        snapshot: Snapshot,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[MountPlan] = (),
    ) -> Plan[Instance]:
        self.require_declared("resume")
        snapshot_transition(snapshot.state, "resume")
        if snapshot.expires_at is not None and self.now is not None and self.now() >= snapshot.expires_at:
            raise SandboxNotFound(
                f"snapshot_id: snapshot {snapshot.snapshot_id!r} expired at {format_timestamp(snapshot.expires_at)}",
                field="snapshot_id",
            )
        key = new_key()
        req = build(
            ResumeRequest,
            **self._allocating(key, profile, platform, root_image, mounts),
            snapshot_allocation_key=snapshot.allocation_key,
            snapshot_id=snapshot.snapshot_id,
        )

        def extra(res: ResumeResult) -> None:
            check_equal("snapshot_id", res.snapshot_id, snapshot.snapshot_id)

        return self._allocate("resume", key, "resume", req, ResumeResult, extra, parent=snapshot.allocation_key)

    # provisioning -----------------------------------------------------------------------------

    def write_file(
        self,
        inst: Instance,
        path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        symlink: bool = False,
        digest: str | None = None,
    ) -> Plan[WriteFileResult]:
        """``digest``: the bytes' ``sha256:`` digest when the caller has just computed it from ``data`` itself
        (staging verified it against the mount plan), so the bytes are not hashed twice; computed here otherwise."""
        self._may(inst, "writeFile")
        admit_path(path, roots=inst.mount_roots, field="path")
        extra: dict[str, Any] = {"symlink": True} if symlink else {}
        req = build(
            WriteFileRequest,
            **self._on(inst),
            path=path,
            mode=mode,
            size=len(data),
            digest=digest if digest is not None else sha256_digest(data),
            **extra,
        )
        return self._instance_plan(
            inst, "writeFile", req, WriteFileResult, lambda res: check_write(res, req), data=data, move=True
        )

    def activate(self, inst: Instance) -> Plan[InstanceResult]:
        self._may(inst, "activate")
        req = build(ActivateRequest, **self._on(inst))
        return self._instance_plan(
            inst,
            "activate",
            req,
            InstanceResult,
            lambda res: check_state(res.state, "active", member="activate"),
            move=True,
        )

    # active -----------------------------------------------------------------------------------

    def exec(
        self,
        inst: Instance,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes = b"",
        timeout: float = 60.0,
        max_output_bytes: int | None = None,
    ) -> Plan[ExecResult]:
        self._may(inst, "exec")
        limit = min(max_output_bytes or self.limits.max_output_bytes, self.limits.max_output_bytes)
        req = build(
            ExecRequest,
            **self._on(inst),
            argv=list(argv),
            env=dict(env or {}),
            cwd=cwd,
            stdin=stdin,
            timeout_ms=max(1, int(timeout * 1000)),
            max_output_bytes=limit,
        )

        def check(res: ExecResult) -> None:
            check_bound("stdout", len(res.stdout), limit)
            check_bound("stderr", len(res.stderr), limit)

        return self._instance_plan(inst, "exec", req, ExecResult, check, extra_seconds=timeout)

    def open_process(
        self,
        inst: Instance,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        tty: tuple[int, int] | None = None,
    ) -> Plan[OpenedProcess]:
        self._may(inst, "openProcess")
        extra: dict[str, Any] = {"tty": {"rows": tty[0], "cols": tty[1]}} if tty is not None else {}
        req = build(OpenProcessRequest, **self._on(inst), argv=list(argv), env=dict(env or {}), cwd=cwd, **extra)

        def accept(raw: object) -> Accepted[OpenedProcess]:
            stream: Any = raw
            started = revalidate(ProcessStarted, stream.started)
            self._echoes(started, inst)
            return Accepted(OpenedProcess(stream, started))

        return Plan(
            member="openProcess",
            request=req,
            deadline=self.limits.deadline("openProcess"),
            accept=accept,
            allocation_key=inst.allocation_key,
            on_fault=self._reclaim(inst, "openProcess"),
        )

    def read_files(
        self, inst: Instance, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> Plan[ReadFilesResult]:
        self._may(inst, "readFiles")
        limit = min(max_bytes or self.limits.max_read_bytes, self.limits.max_read_bytes)
        for i, p in enumerate(paths):
            admit_path(p, field=f"paths.{i}")
        req = build(ReadFilesRequest, **self._on(inst), paths=list(paths), max_bytes=limit)
        return self._instance_plan(
            inst, "readFiles", req, ReadFilesResult, lambda res: check_read_files(res, req.paths, limit)
        )

    def list_dir(
        self, inst: Instance, path: str, *, recursive: bool = False, max_entries: int | None = None
    ) -> Plan[ListDirResult]:
        self._may(inst, "listDir")
        limit = min(max_entries or self.limits.max_list_entries, self.limits.max_list_entries)
        admit_path(path, field="path")
        req = build(ListDirRequest, **self._on(inst), path=path, recursive=recursive, max_entries=limit)

        def check(res: ListDirResult) -> None:
            check_equal("path", res.path, path)
            if len(res.entries) > limit:
                raise SandboxBoundExceeded(f"entries: {len(res.entries)} is over the limit of {limit}", field="entries")
            check_returned_paths("entries", (e.path for e in res.entries), [path])

        return self._instance_plan(inst, "listDir", req, ListDirResult, check)

    def inspect(self, inst: Instance) -> Plan[InstanceResult]:
        """The instance as the provider holds it: the runner's own record, or ``released`` (lost, never moved back)."""
        self._may(inst, "inspect")
        req = build(InspectRequest, **self._on(inst))

        def check(res: InstanceResult) -> None:
            if res.state != "released":
                check_state(res.state, inst.state, member="inspect")

        return self._instance_plan(inst, "inspect", req, InstanceResult, check)

    # snapshots --------------------------------------------------------------------------------

    def snapshot(self, inst: Instance, *, keep_seconds: int | None = None) -> Plan[Snapshot]:
        """Snapshot ``inst``, kept ``keep_seconds`` at most when given.

        The core's ``now`` is read when the answer arrives: an answer whose ``expires_at`` has passed,
        or is later than asked (or null although a lifetime was asked), is refused and reclaimed.
        """
        self._may(inst, "snapshot")
        if keep_seconds is not None and self.now is None:
            raise ValueError("keep_seconds: a session core handed no clock cannot judge a snapshot's expiry")
        key = new_key()
        extra: dict[str, Any] = {"keep_seconds": keep_seconds} if keep_seconds is not None else {}
        req = build(SnapshotRequest, **self._on(inst), snapshot_allocation_key=key, **extra)
        held = self.held_ids()
        self.rows[key] = "pending"

        def accept(raw: object) -> Accepted[Snapshot]:
            res = revalidate(SnapshotResult, raw)
            self._echoes(res, inst)
            check_equal("snapshot_allocation_key", res.snapshot_allocation_key, key)
            check_new_identity("snapshot_id", res.snapshot_id, held)
            if self.now is not None:
                expires_at = check_expiry(res.expires_at, now=self.now(), keep_seconds=keep_seconds)
            else:
                expires_at = None if res.expires_at is None else parse_timestamp(res.expires_at)
            snap = Snapshot(
                allocation_key=key,
                snapshot_id=res.snapshot_id,
                source=inst,
                state=snapshot_transition("absent", "snapshot"),
                expires_at=expires_at,
            )
            self.snapshots[key] = snap
            return Accepted(snap, (self._row(key, "settle", res.snapshot_id, expires_at),))

        def reclaim(_: SandboxError | None = None) -> tuple[Effect, ...]:
            return (Compensate(key),)

        return Plan(
            member="snapshot",
            request=req,
            deadline=self.limits.deadline("snapshot"),
            accept=accept,
            allocation_key=key,
            before=(JournalAllocation(key, "snapshot", inst.allocation_key),),
            on_fault=reclaim,
            on_abandon=reclaim,
        )

    def delete_snapshot(self, snap: Snapshot) -> Plan[DeleteSnapshotResult]:
        self.require_declared("deleteSnapshot")
        snapshot_transition(snap.state, "deleteSnapshot")
        req = build(
            DeleteSnapshotRequest,
            **self._call(),
            snapshot_allocation_key=snap.allocation_key,
            snapshot_id=snap.snapshot_id,
        )

        def accept(raw: object) -> Accepted[DeleteSnapshotResult]:
            res = revalidate(DeleteSnapshotResult, raw)
            check_echo(res, target=self.target, lease=self.lease)
            check_equal("snapshot_allocation_key", res.snapshot_allocation_key, snap.allocation_key)
            check_equal("snapshot_id", res.snapshot_id, snap.snapshot_id)
            snap._state = snapshot_transition(snap.state, "deleteSnapshot")
            return Accepted(res, (self._row(snap.allocation_key, "release"),))

        def reclaim(_: SandboxError) -> tuple[Effect, ...]:
            snap._state = snapshot_transition(snap.state, "compensate")
            return (Compensate(snap.allocation_key),)

        return Plan(
            member="deleteSnapshot",
            request=req,
            deadline=self.limits.deadline("deleteSnapshot"),
            accept=accept,
            allocation_key=snap.allocation_key,
            on_fault=reclaim,
        )

    # release and compensation -----------------------------------------------------------------

    def release(self, inst: Instance) -> Plan[ReleaseResult]:
        self._may(inst, "release")
        req = build(ReleaseRequest, **self._on(inst))
        promised = self.envelope.lifecycle_assurances.release_destroys or inst.retention == "ephemeral_zdr"

        def check(res: ReleaseResult) -> None:
            if promised and not res.destroyed:
                why = "release_destroys" if self.envelope.lifecycle_assurances.release_destroys else "ephemeral_zdr"
                refused = SandboxResultInvalid(
                    f"destroyed: release answered false, but the envelope promises {why}: nothing may survive",
                    field="destroyed",
                )
                self.undestroyed[inst.allocation_key] = f"{refused.code}: {refused.message}"
                raise refused

        return self._instance_plan(inst, "release", req, ReleaseResult, check, move=True, row="release")

    def compensate(self, key: str) -> Plan[CompensateResult]:
        """Cold compensation of ``key``; on success its row settles and its instance or snapshot is gone.

        A failed compensation reclaims nothing further: the row stays open for reconciliation.
        """
        plan = compensate_plan(self.target, self.lease, key, self.runner_tag, self.limits)

        def accept(raw: object) -> Accepted[CompensateResult]:
            done = plan.accept(raw)
            inst = self.instances.get(key)
            if inst is not None:
                self._move(inst, "compensate")
            snap = self.snapshots.get(key)
            if snap is not None:
                snap._state = snapshot_transition(snap.state, "compensate")
            return Accepted(done.value, (self._row(key, "compensate"),))

        return Plan(
            member="compensate", request=plan.request, deadline=plan.deadline, accept=accept, allocation_key=key
        )

    def list_allocations(self) -> Plan[ListAllocationsResult]:
        self.require_declared("listAllocations")
        return list_allocations_plan(self.target, self.lease, self.runner_tag, self.limits)

    def unreleased(self) -> list[Instance]:
        """Instances still to release on the way out."""
        return [i for i in self.instances.values() if i.state != "released"]
