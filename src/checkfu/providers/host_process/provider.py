"""``HostProcessProvider``: the harness as a bare process of the runner host, loud about it.

An instance is a working directory, ``<state_dir>/instances/<allocation_key>/work``,
and the processes started in it. Each process runs directly from its argv in its
own session, with the working directory as cwd and ``HOME`` and a minimal
environment. Where the host allows (see ``envelope``), the instance also has
cgroups that bound its cpu, memory and pids and hold every process it starts.

Obligations this provider keeps, beyond ``Provider``'s:

- it refuses, before anything starts, any profile or request its envelope does
  not serve (``SandboxCapabilityUnavailable`` listing each unmet need; a ``none``
  or ``allowlist`` network first of all);
- every object it creates (label, working directory, cgroups, snapshot) exists
  only while its label, carrying ``checkfu.allocation_key`` and
  ``checkfu.runner_tag``, does; so ``compensate`` and ``listAllocations`` work
  from the state directory alone, in a provider that remembers nothing;
- ``release`` ends every process (SIGTERM, ``kill_grace``, then SIGKILL), then
  removes the cgroups, the working directory and the label; the snapshots stay
  (retention is ``durable``). It does not claim ``release_destroys``: a host
  process can write anywhere the runner's user can, and that survives;
- results echo the request (``checkfu.contract.echo``): the target, which is
  this adapter's own once checked, the lease, and the allocation key and
  instance id acted on.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxError,
    SandboxIdentityMismatch,
    SandboxNotFound,
    SandboxOperationUnsupported,
    SandboxPathRejected,
    SandboxProviderFailed,
    SandboxStateConflict,
)
from checkfu.contract.labels import owner_labels
from checkfu.contract.lifecycle import transition
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
    InstanceCall,
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
    echo,
)
from checkfu.contract.model import format_timestamp
from checkfu.contract.profile import HOST_IMAGE
from checkfu.contract.provider import ProcessStream
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.vocabulary import Resources
from checkfu.providers.host_process import cgroups as cg
from checkfu.providers.host_process import spawning, state, tarballs
from checkfu.providers.host_process.admission import refuse_unmet
from checkfu.providers.host_process.envelope import (
    MATERIALIZATION_REVISION,
    PROVIDER_REVISION,
    envelope,
    host_maximum,
    host_platform,
)
from checkfu.providers.host_process.failures import seam, translate
from checkfu.providers.host_process.instance import Instance
from checkfu.providers.host_process.spawner import Spawner
from checkfu.providers.host_process.state import InstanceLabel, Layout, SnapshotLabel
from checkfu.providers.host_process.store import Store
from checkfu.providers.host_process.streams import FailedStart, HostProcessStream, capture

CgroupMode = Literal["auto", "off", "require"]
CGROUP_MODES: tuple[CgroupMode, ...] = ("auto", "off", "require")
MAX_TOMBSTONES = 10_000
"""Released instances remembered (for idempotent ``release`` and ``inspect``) before the oldest are forgotten."""
GROUPS_PRUNE_AT = 64


class HostProcessProvider:
    """The host-process tier. Construct it, then drive it through the ``Provider`` members.

    Args:
        state_dir: where instances and snapshots live; default ``$XDG_STATE_HOME/checkfu/host-process``.
        cgroups: ``auto`` uses cgroups when the host allows and says so in the envelope;
            ``off`` never uses them; ``require`` refuses to construct without them.
        kill_grace: seconds between SIGTERM and SIGKILL at ``release`` and ``compensate``.
        drain_grace: seconds a process's pipes get to end after it exits (see ``streams``).

    Raises:
        SandboxAdapterUnavailable: a bad option, an unusable state directory, a host
            that is not Linux amd64/arm64, or ``cgroups="require"`` on a host without them.
    """

    def __init__(
        self,
        *,
        state_dir: Path | str | None = None,
        cgroups: CgroupMode = "auto",
        kill_grace: float = 0.5,
        drain_grace: float = 0.1,
    ) -> None:
        if cgroups not in CGROUP_MODES:
            raise SandboxAdapterUnavailable(f"cgroups: {cgroups!r} is not one of {', '.join(CGROUP_MODES)}")
        if kill_grace < 0 or drain_grace < 0:
            raise SandboxAdapterUnavailable("kill_grace and drain_grace must not be negative", field="kill_grace")
        self._layout = Layout(Path(state_dir) if state_dir is not None else state.default_state_dir())
        try:
            self._layout.create()
        except OSError as exc:
            raise SandboxAdapterUnavailable(
                f"state_dir: cannot create {self._layout.root}: {exc.strerror}", field="state_dir"
            ) from None
        self._host: cg.CgroupHost | None = None
        self.cgroup_reason: str | None = "cgroups are off by configuration"
        """Why this provider does not use cgroups (so enforces no resource limits), or ``None`` when it does."""
        if cgroups != "off":
            probed = cg.probe(self._layout.root)
            if isinstance(probed, cg.CgroupHost):
                self._host, self.cgroup_reason = probed, None
            elif cgroups == "require":
                raise SandboxAdapterUnavailable(f"cgroups: required, but {probed}", field="cgroups")
            else:
                self.cgroup_reason = probed
        self._envelope = envelope(
            cgroups=self._host is not None,
            maximum=host_maximum(self._layout.root),
            host=host_platform(),
        )
        self._target = self._envelope.target
        self._kill_grace = kill_grace
        self._drain_grace = drain_grace
        self._store = Store(self._layout, self._host)
        self._spawner = Spawner()
        self._instances: dict[str, Instance] = {}
        self._by_key: dict[str, str] = {}
        self._tombstones: collections.deque[str] = collections.deque()
        """Released instances' ids, oldest release first: the ones past ``MAX_TOMBSTONES`` are forgotten."""
        self._deleted_snapshots: dict[str, str] = {}

    @property
    def state_dir(self) -> Path:
        return self._layout.root

    # describe, materialize ----------------------------------------------------------------

    async def describe(self) -> DescribeResult:
        """The envelope, decided at construction."""
        return DescribeResult(envelope=self._envelope)

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult:
        """The image of a ``host`` profile is the host itself: nothing is built.

        Raises:
            SandboxIdentityMismatch: the request names another adapter.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile (another image, packages, a
                confined network, ...) or the platform; every unmet need is listed.
        """
        self._check_target(request.target)
        refuse_unmet(self._envelope, request.profile, request.platform)
        return MaterializeResult(
            **echo(
                request,
                profile_digest=request.profile_digest,
                image=HOST_IMAGE,
                materialization_revision=MATERIALIZATION_REVISION,
                built=False,
            )
        )

    # provision, writeFile, activate, inspect ------------------------------------------------

    async def provision(self, request: ProvisionRequest) -> InstanceResult:
        """Allocate a working directory (and cgroups bounding the profile's limits); nothing runs yet.

        Raises:
            SandboxIdentityMismatch: the request names another adapter.
            SandboxCapabilityUnavailable: before anything is created, for every need the envelope does not meet.
            SandboxStateConflict: the allocation key already holds an instance.
            SandboxProviderFailed: the host refused a directory, a label or a cgroup.
        """
        self._check_target(request.target)
        refuse_unmet(self._envelope, request.profile, request.platform, request.mounts, request.root_image)
        instance = await self._allocate(request.allocation_key, request.runner_tag, request.profile.resource_limits)
        return InstanceResult(**echo(request, instance_id=instance.instance_id, state=instance.state))

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult:
        """Refused: with no mounts there is no path a file may be staged at.

        Raises:
            SandboxNotFound: no such instance.
            SandboxStateConflict: the instance is not provisioning.
            SandboxPathRejected: always otherwise; every path is outside the (empty) set of mount targets.
        """
        self._check_target(request.target)
        instance = self._instance(request)
        transition(instance.state, "writeFile")
        raise SandboxPathRejected(
            f"path: {request.path!r} is outside every mount target: the host-process tier takes no mounts",
            field="path",
        )

    async def activate(self, request: ActivateRequest) -> InstanceResult:
        """Mark the instance active (nothing is staged, so nothing needs sealing).

        Raises:
            SandboxNotFound: no such instance.
            SandboxStateConflict: the instance is not provisioning.
        """
        self._check_target(request.target)
        instance = self._instance(request)
        async with instance.lock:
            transition(instance.state, "activate")
            with seam("activate"):
                state.mark_active(self._layout.instance_active(instance.key))
            instance.state = "active"
        return InstanceResult(**echo(request, state=instance.state))

    async def inspect(self, request: InspectRequest) -> InstanceResult:
        """The instance's state: from memory, or from its label after a restart.

        Raises:
            SandboxNotFound: no such instance (never held, or compensated after a restart).
        """
        self._check_target(request.target)
        return InstanceResult(**echo(request, state=self._instance(request).state))

    # exec, openProcess ----------------------------------------------------------------------

    async def exec(self, request: ExecRequest) -> ExecResult:
        """Run argv to completion (no shell unless argv names one), bounded by time and output.

        A program that cannot be started exits 127 (not found) or 126 (cannot
        execute), with the reason on stderr, as a shell would report it. A
        process killed by signal ``n`` exits ``128 + n``.

        Raises:
            SandboxNotFound: no such instance.
            SandboxStateConflict: the instance is not active, or is being released.
            SandboxPathRejected: ``cwd`` is not a directory on the host.
            SandboxProviderFailed: the host refused to start a process for another reason.
        """
        instance, tree = await self._start(request, "exec", stdin=bool(request.stdin))
        if isinstance(tree, NotStarted):
            return ExecResult(
                **echo(
                    request,
                    exit_code=tree.status,
                    timed_out=False,
                    stdout=b"",
                    stderr=tree.message[: request.max_output_bytes],
                    stdout_truncated=False,
                    stderr_truncated=len(tree.message) > request.max_output_bytes,
                )
            )
        try:
            with seam("exec"):
                got = await capture(
                    tree,
                    stdin=request.stdin,
                    timeout=request.timeout_ms / 1000,
                    max_output=request.max_output_bytes,
                    drain_grace=self._drain_grace,
                    ending=partial(self._end_tree, instance),
                    linger=instance.linger,
                )
        finally:
            if tree.spawn_dir is not None:
                cg.remove_spawn_dir(tree.spawn_dir)
        return ExecResult(
            **echo(
                request,
                exit_code=spawning.exit_status(got.returncode),
                timed_out=got.timed_out,
                stdout=got.stdout,
                stderr=got.stderr,
                stdout_truncated=got.stdout_truncated,
                stderr_truncated=got.stderr_truncated,
            )
        )

    async def open_process(self, request: OpenProcessRequest) -> ProcessStream:
        """Start argv with streamed stdin, stdout and stderr.

        A program that cannot be started gives a stream with its reason on
        stderr and exit 127 or 126, as ``exec`` does.

        Raises:
            SandboxNotFound: no such instance.
            SandboxStateConflict: the instance is not active, or is being released.
            SandboxPathRejected: ``cwd`` is not a directory on the host.
            SandboxProviderFailed: the host refused to start a process for another reason.
        """
        instance, tree = await self._start(request, "openProcess", stdin=True)
        if isinstance(tree, NotStarted):
            started = ProcessStarted(**echo(request, process_id=f"p-none-{uuid.uuid4().hex[:12]}"))
            return FailedStart(started, tree.message, tree.status)
        started = ProcessStarted(**echo(request, process_id=f"p-{tree.pid}", pid=tree.pid))
        finished = partial(cg.remove_spawn_dir, tree.spawn_dir) if tree.spawn_dir else None
        try:
            with seam("openProcess"):
                return await HostProcessStream.open(
                    started,
                    tree,
                    ending=partial(self._end_tree, instance),
                    drain_grace=self._drain_grace,
                    linger=instance.linger,
                    finished=finished,
                )
        except BaseException:
            await asyncio.shield(asyncio.to_thread(spawning.abandon, tree))
            raise

    # release, compensate, listAllocations ---------------------------------------------------

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        """End every process of the instance, then remove its cgroups, working directory and label.

        Snapshots stay. A second release of the same instance returns the same result.

        Raises:
            SandboxNotFound: no such instance.
            SandboxProviderFailed: a process survived SIGKILL, or a file could not be removed
                (the instance stays held; release may be retried).
        """
        self._check_target(request.target)
        instance = self._instance(request)
        async with instance.lock:
            if instance.state != "released":
                transition(instance.state, "release")
                instance.closing = True
                with seam("release"):
                    if instance.cgroups is not None or not self._destroyed_at_once(instance):
                        await asyncio.to_thread(
                            self._store.destroy,
                            instance.key,
                            [instance.cgroups],
                            list(instance.groups),
                            self._kill_grace,
                        )
                self._released(instance)
        return ReleaseResult(**echo(request, state="released", destroyed=True))

    def _destroyed_at_once(self, instance: Instance) -> bool:
        """Whether ``Store.destroy_at_once`` took the whole instance; one it left partly removed (a removal
        failed) is ``destroy``'s to finish, as is anything it would not take."""
        try:
            return self._store.destroy_at_once(instance.key, instance.groups)
        except OSError:
            return False

    async def compensate(self, request: CompensateRequest) -> CompensateResult:
        """Reclaim whatever carries ``allocation_key`` and ``runner_tag``, trusting no earlier answer.

        Works from the labels in the state directory alone, so a provider that
        remembers nothing (a restart, a crash) reclaims as well as the one that
        allocated: an instance (its processes, cgroups, working directory) and a
        snapshot. Objects labelled with another runner tag are left alone.
        Idempotent: a second call reclaims nothing and says ``0``.

        Raises:
            SandboxIdentityMismatch: the request names another adapter.
            SandboxProviderFailed: a process survived SIGKILL or a file could not be removed.
        """
        self._check_target(request.target)
        key, tag = request.allocation_key, request.runner_tag
        reclaimed = 0
        held = self._instances.get(self._by_key.get(key, ""))
        async with held.lock if held is not None else asyncio.Lock():
            label = state.read_instance_label(self._layout.instance_label(key))
            ours = label is None or label.runner_tag == tag
            if held is not None and held.runner_tag != tag:
                ours = False
            if ours:
                if held is not None:
                    held.closing = True
                recorded = [held.cgroups] if held is not None else []
                groups = list(held.groups) if held is not None else []
                if label is not None:
                    recorded.append(cg.verified(label.cgroups, self._cgroup_name(key)))
                groups.extend(g for g in self._recorded_groups(key, label) if g not in groups)
                if self._host is not None:
                    recorded.append(self._host.plan(self._cgroup_name(key)))
                with seam("compensate"):
                    if await asyncio.to_thread(self._store.destroy, key, recorded, groups, self._kill_grace):
                        reclaimed += 1
                if held is not None and held.state != "released":
                    self._released(held)
        with seam("compensate"):
            if await asyncio.to_thread(self._store.destroy_snapshot, key, tag):
                reclaimed += 1
        return CompensateResult(**echo(request, reclaimed=reclaimed))

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult:
        """Every instance and snapshot labelled with ``runner_tag``, from the state directory."""
        self._check_target(request.target)
        with seam("listAllocations"):
            entries = await asyncio.to_thread(self._store.scan, request.runner_tag)
        return ListAllocationsResult(**echo(request, runner_tag=request.runner_tag, allocations=entries))

    # snapshot, deleteSnapshot, resume, clone -------------------------------------------------

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        """Store the working directory as a tarball in the state directory (runner custody).

        With cgroups the instance's processes are frozen while it is written, so
        the snapshot is one instant; without, files being written may be caught
        half-way.

        Raises:
            SandboxNotFound: no such instance.
            SandboxStateConflict: the instance is not active, or the snapshot key is taken.
            SandboxProviderFailed: the tarball could not be written (nothing of it is left).
        """
        self._check_target(request.target)
        instance = self._instance(request)
        key = request.snapshot_allocation_key
        # Runner custody: the runner deletes it once this passes (checkfu.core.expiry); stated from before the
        # write, so never later than asked.
        expires_at = None if request.keep_seconds is None else format_timestamp(time.time() + request.keep_seconds)
        async with instance.lock:
            transition(instance.state, "snapshot")
            snapshot_id = f"hs-{uuid.uuid4().hex}"
            label = SnapshotLabel(
                labels=owner_labels(key, instance.runner_tag),
                revision=PROVIDER_REVISION,
                snapshot_id=snapshot_id,
                source_allocation_key=instance.key,
                source_instance_id=instance.instance_id,
            )
            with seam("snapshot"):
                await asyncio.to_thread(self._store.write_snapshot, instance, label)
        return SnapshotResult(
            **echo(request, snapshot_allocation_key=key, snapshot_id=snapshot_id, expires_at=expires_at)
        )

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult:
        """Remove a snapshot's bytes and label; deleting it again says ``deleted: false``.

        Raises:
            SandboxNotFound: no snapshot with that key and id (never taken, or another one).
        """
        self._check_target(request.target)
        key = request.snapshot_allocation_key
        label = state.read_snapshot_label(self._layout.snapshot_label(key))
        deleted = False
        if label is not None and label.snapshot_id == request.snapshot_id:
            with seam("deleteSnapshot"):
                await asyncio.to_thread(self._store.remove_snapshot_files, key)
            self._deleted_snapshots[key] = request.snapshot_id
            deleted = True
        elif self._deleted_snapshots.get(key) != request.snapshot_id:
            raise SandboxNotFound(
                f"snapshot_id: no snapshot {request.snapshot_id!r} under allocation key {key!r}", field="snapshot_id"
            )
        return DeleteSnapshotResult(
            **echo(request, snapshot_allocation_key=key, snapshot_id=request.snapshot_id, deleted=deleted)
        )

    async def resume(self, request: ResumeRequest) -> ResumeResult:
        """A new instance (new id, ``provisioning``) whose working directory is the snapshot's.

        Raises:
            SandboxCapabilityUnavailable: before anything is created, for every unmet need.
            SandboxNotFound: no such snapshot: never taken, deleted, or labelled for another runner.
            SandboxStateConflict: the allocation key already holds an instance.
            SandboxProviderFailed: the snapshot could not be restored (nothing of the new instance is left).
        """
        self._check_target(request.target)
        refuse_unmet(self._envelope, request.profile, request.platform, request.mounts, request.root_image)
        skey = request.snapshot_allocation_key
        label = state.read_snapshot_label(self._layout.snapshot_label(skey))
        tarball = self._layout.snapshot_tar(skey)
        if (
            label is None
            or label.snapshot_id != request.snapshot_id
            or label.runner_tag != request.runner_tag
            or not tarball.is_file()
        ):
            raise SandboxNotFound(
                f"snapshot_id: no snapshot {request.snapshot_id!r} of runner {request.runner_tag!r} under "
                f"allocation key {skey!r}",
                field="snapshot_id",
            )
        instance = await self._allocate(request.allocation_key, request.runner_tag, request.profile.resource_limits)
        await self._fill(instance, "resume", partial(tarballs.extract, tarball, instance.workdir))
        return ResumeResult(
            **echo(request, instance_id=instance.instance_id, state=instance.state, snapshot_id=request.snapshot_id)
        )

    async def clone(self, request: CloneRequest) -> CloneResult:
        """A new, independent instance whose working directory is a copy of a live one's.

        Raises:
            SandboxCapabilityUnavailable: before anything is created, for every unmet need.
            SandboxNotFound: no such source instance.
            SandboxStateConflict: the source is not active, or the allocation key is taken.
            SandboxProviderFailed: the copy failed (nothing of the new instance is left).
        """
        self._check_target(request.target)
        refuse_unmet(self._envelope, request.profile, request.platform, request.mounts, request.root_image)
        source = self._lookup(request.source_allocation_key, request.source_instance_id, "source_instance_id")
        async with source.lock:
            transition(source.state, "clone")
            instance = await self._allocate(request.allocation_key, request.runner_tag, request.profile.resource_limits)
            await self._fill(instance, "clone", partial(self._store.copy_workdir, source, instance))
        return CloneResult(
            **echo(
                request, instance_id=instance.instance_id, state=instance.state, source_instance_id=source.instance_id
            )
        )

    # undeclared members ------------------------------------------------------------------------

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult:
        """Not served: the host tier has no mounts to read back.

        Raises:
            SandboxOperationUnsupported: always.
        """
        raise _unsupported("readFiles")

    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        """Not served (``list_dir: false``): there is no mounted tree to enumerate.

        Raises:
            SandboxOperationUnsupported: always.
        """
        raise _unsupported("listDir")

    # internals ---------------------------------------------------------------------------------

    def _check_target(self, target: ExecutionTarget) -> None:
        """Raises SandboxIdentityMismatch: ``target`` is another adapter's (as every provider answers it)."""
        if target != self._target:
            raise SandboxIdentityMismatch(
                f"target: request is for {target}, this provider is {self._target}", field="target"
            )

    def _cgroup_name(self, key: str) -> str:
        return cg.instance_name(self._layout.state_hash, key)

    def _instance(self, call: InstanceCall) -> Instance:
        return self._lookup(call.allocation_key, call.instance_id, "instance_id")

    def _lookup(self, key: str, instance_id: str, field_name: str) -> Instance:
        """The instance ``instance_id`` under ``key``: held in memory, or adopted from its label.

        Raises:
            SandboxNotFound: neither holds it.
        """
        held = self._instances.get(instance_id)
        if held is not None and held.key == key:
            return held
        if held is None:
            label = state.read_instance_label(self._layout.instance_label(key))
            if label is not None and label.instance_id == instance_id and label.allocation_key == key:
                return self._adopt(label)
        raise SandboxNotFound(
            f"{field_name}: no instance {instance_id!r} under allocation key {key!r}", field=field_name
        )

    def _adopt(self, label: InstanceLabel) -> Instance:
        recorded = cg.verified(label.cgroups, self._cgroup_name(label.allocation_key))
        instance = Instance(
            key=label.allocation_key,
            instance_id=label.instance_id,
            runner_tag=label.runner_tag,
            state="active" if self._layout.instance_active(label.allocation_key).exists() else label.state,
            workdir=self._layout.workdir(label.allocation_key),
            cgroups=recorded if recorded.dirs else None,
            groups=self._recorded_groups(label.allocation_key, label),
        )
        self._instances[instance.instance_id] = instance
        self._by_key[instance.key] = instance.instance_id
        return instance

    def _recorded_groups(self, key: str, label: InstanceLabel | None) -> list[tuple[int, int]]:
        """The process groups the instance's label (one written by earlier code) and its groups file record, each
        once; the file is read even without a label. Each is a group's id and its leader's start time, so ending
        them ends only the processes the instance spawned."""
        recorded = state.read_groups(self._layout.instance_groups(key))
        return [*(g for g in (label.groups if label is not None else []) if g not in recorded), *recorded]

    def _released(self, instance: Instance) -> None:
        instance.close_pipes()
        first = instance.state != "released"
        instance.state = "released"
        instance.groups.clear()
        if self._by_key.get(instance.key) == instance.instance_id:
            del self._by_key[instance.key]
        if not first:
            return
        # A tombstone answers a late call on a released instance; the oldest are forgotten, each in one step
        # (a scan of every instance here cost each release 0.4 ms once ten thousand were held).
        self._tombstones.append(instance.instance_id)
        while len(self._tombstones) > MAX_TOMBSTONES:
            forgotten = self._tombstones.popleft()
            held = self._instances.get(forgotten)
            if held is not None and held.state == "released":
                del self._instances[forgotten]

    async def _allocate(self, key: str, runner_tag: str, limits: Resources) -> Instance:
        if key in self._by_key:
            raise SandboxStateConflict(
                f"allocation_key: {key!r} already holds instance {self._by_key[key]!r}", field="allocation_key"
            )
        instance = Instance(
            key=key,
            instance_id=f"hp-{uuid.uuid4().hex}",
            runner_tag=runner_tag,
            state="provisioning",
            workdir=self._layout.workdir(key),
            cgroups=self._host.plan(self._cgroup_name(key)) if self._host is not None else None,
        )
        self._by_key[key] = instance.instance_id
        try:
            with seam("provision"):
                if instance.cgroups is None:  # a label and two directories: sooner here than a worker thread's trip
                    self._store.create(instance, limits)
                else:
                    await asyncio.to_thread(self._store.create, instance, limits)
        except BaseException:
            del self._by_key[key]
            raise
        self._instances[instance.instance_id] = instance
        return instance

    async def _fill(self, instance: Instance, doing: str, fill: partial[None]) -> None:
        """Run ``fill`` (restore or copy into the new working directory); on failure reclaim the new instance."""
        try:
            with seam(doing):
                await asyncio.to_thread(fill)
        except BaseException:
            instance.closing = True
            try:
                await asyncio.to_thread(self._store.destroy, instance.key, [instance.cgroups], [], 0.0)
            finally:
                self._released(instance)
            raise

    async def _start(
        self, request: ExecRequest | OpenProcessRequest, member: Literal["exec", "openProcess"], *, stdin: bool
    ) -> tuple[Instance, spawning.Tree | NotStarted]:
        """The instance ``request`` names, and the process tree started in it or why it could not start.

        Raises:
            SandboxIdentityMismatch: the request names another adapter.
            SandboxNotFound: no such instance.
            SandboxStateConflict: ``member`` is not allowed in the instance's state, or it is being released.
            SandboxPathRejected: ``cwd`` is not a directory on the host.
            SandboxProviderFailed: the host refused to start a process for another reason.
        """
        self._check_target(request.target)
        instance = self._instance(request)
        transition(instance.state, member)
        cwd = self._cwd(instance, request.cwd)
        env = spawning.process_env(instance.workdir, request.env)
        tty = request.tty if isinstance(request, OpenProcessRequest) else None
        size = (tty.rows, tty.cols) if tty is not None else None
        try:
            return instance, await self._spawn(instance, request.argv, env, cwd, stdin=stdin, tty=size)
        except SandboxError:
            raise
        except Exception as exc:
            status = spawning.start_failure(exc) if isinstance(exc, OSError) else None
            if status is None:
                raise translate(exc, member) from exc
            assert isinstance(exc, OSError)
            return instance, NotStarted(status, _start_message(request.argv[0], exc))

    async def _spawn(
        self,
        instance: Instance,
        argv: tuple[str, ...],
        env: dict[str, str],
        cwd: str,
        *,
        stdin: bool,
        tty: tuple[int, int] | None = None,
    ) -> spawning.Tree:
        """Start one process tree in the instance.

        Raises:
            SandboxStateConflict: the instance is being released.
            OSError: the process could not be started.
        """
        if instance.closing:
            raise SandboxStateConflict("state: the instance is being released", field="state")
        held = instance.cgroups
        if self._host is not None and held is not None and set(held.dirs) == set(cg.CONTROLLERS):
            try:
                return await spawning.spawn_in_cgroups(
                    self._spawner, held, self._host.bases, lambda: instance.closing, argv, env, cwd, stdin, tty
                )
            except spawning.InstanceClosing:
                raise SandboxStateConflict("state: the instance is being released", field="state") from None
        tree = spawning.spawn_direct(argv, env, cwd, stdin, tty)
        instance.groups.append((tree.pid, tree.start))
        try:
            with seam("exec"):
                record = self._layout.instance_groups(instance.key)
                if len(instance.groups) > GROUPS_PRUNE_AT:
                    instance.groups[:] = await asyncio.to_thread(spawning.live_groups, instance.groups)
                    state.write_groups(record, instance.groups)
                else:
                    state.append_group(record, (tree.pid, tree.start))
        except SandboxError:
            await asyncio.to_thread(spawning.abandon, tree)
            raise
        return tree

    async def _end_tree(self, instance: Instance, tree: spawning.Tree) -> None:
        """End one process tree at once (a timeout or ``kill``).

        Raises:
            SandboxProviderFailed: a process of it survived SIGKILL.
        """
        with seam("kill"):
            gone = await asyncio.to_thread(spawning.end_tree_blocking, instance.cgroups, tree, grace=0.0)
        if not gone:
            raise SandboxProviderFailed(f"kill: processes of {tree.pid} survive SIGKILL")

    def _cwd(self, instance: Instance, cwd: str | None) -> str:
        if cwd is None:
            return str(instance.workdir)
        if not os.path.isdir(cwd):
            raise SandboxPathRejected(f"cwd: {cwd!r} is not a directory on the runner host", field="cwd")
        return cwd


@dataclass(frozen=True)
class NotStarted:
    """A program that could not be started: the exit status a shell would give, and the reason."""

    status: int
    message: bytes


def _start_message(program: str, exc: OSError) -> bytes:
    reason = exc.strerror or type(exc).__name__
    return f"checkfu host-process: cannot start {program!r}: {reason}\n".encode()


def _unsupported(member: str) -> SandboxError:
    return SandboxOperationUnsupported(f"{member}: not declared by the host-process envelope", field=member)
