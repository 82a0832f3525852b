"""The shell of a Run attempt: the session core's plans, carried out.

``RunSession`` is thin. For every member it asks the core (``checkfu.core.session``)
for a plan, which refuses an undeclared member or an illegal state before anything
happens; then it

1. journals what the plan says must be journaled first (every allocation is written
   ``pending`` before the provider is asked for it);
2. has the provider door make the call, fenced by the lease (renewed for the call's
   deadline) and recorded as an event of the Run;
3. applies what the core answered: settle a row on success; on a provider fault, or
   an allocation abandoned for any reason, compensate by allocation key, never by an
   id the provider returned.

Compensation during another failure never masks the first error, and finishes even
when the caller is cancelled meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from checkfu.contract.envelope import Member, SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxCapabilityUnavailable,
    SandboxError,
    SandboxLeaseFenced,
    SandboxOperationUnsupported,
    SandboxProviderFailed,
    SandboxStateConflict,
    Unmet,
)
from checkfu.contract.frames import OutputOrder
from checkfu.contract.members import (
    CompensateResult,
    DeleteSnapshotResult,
    ExecResult,
    InstanceResult,
    ListAllocationsResult,
    ListDirResult,
    MaterializeResult,
    ProcessStarted,
    ReadFilesResult,
    ReleaseResult,
    WriteFileResult,
)
from checkfu.contract.mounts import MountPlan
from checkfu.contract.ports import PUBLISH_PORT, PortPublisher, PortSpec, PublishedPort
from checkfu.contract.process import ProcessEvent, ProcessExit
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import ProcessStream, Provider
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import Clock
from checkfu.core.door import CallRecord, ProviderDoor, ProviderFault, Recorder, kill_process, provider_fault
from checkfu.core.journal import AllocationRow, Journal, JournalError, event_row, new_write_key
from checkfu.core.leases import LeaseStore
from checkfu.core.mounts import ResolvedMount
from checkfu.core.session import (
    Compensate,
    Effect,
    Instance,
    JournalAllocation,
    Limits,
    Plan,
    SessionCore,
    SettleRow,
    Snapshot,
    new_key,
)

__all__ = ["CheckedProcess", "Instance", "Limits", "RunSession", "Snapshot", "new_key"]

V = TypeVar("V")


class _Pending:
    """A ``batched`` session's recorder: each call kept as its ``events`` row for the session's next write."""

    def __init__(self, session: RunSession) -> None:
        self.session = session

    def record_call(self, call: CallRecord) -> None:
        self.session.pending.append(event_row(call, new_write_key()))

    async def record_call_async(self, call: CallRecord) -> None:
        self.record_call(call)


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
        door: ProviderDoor | None = None,
        site: str | None = None,
    ) -> None:
        self.core = SessionCore(envelope=envelope, lease=lease, runner_tag=runner_tag, limits=limits, now=clock.now)
        self.site = site
        """The adapter placement every allocation of this attempt lands on (a Docker engine), journaled with it."""
        self.door = door or ProviderDoor(provider, source=str(envelope.target), clock=clock)
        self.journal = journal
        self.leases = leases
        self.run_id = run_id
        self.clock = clock
        self.left: dict[str, str] = {}
        """After ``release_all``: what is still held in the provider, by allocation key, with why."""
        self.undestroyed: dict[str, str] = {}
        """After ``release_all``: instances whose release answered ``destroyed: false`` against the envelope's
        promise, compensated by key since, by allocation key, with why. Nothing proves what the provider kept is
        gone: a Run with any is a failure around its command, as one that left something is."""
        self.unjournaled: dict[str, str] = {}
        """What the journal could not record while winding up (its row stays open for reconciliation), by key."""
        self.adopted: str | None = None
        """The allocation key of the pooled sandbox this attempt adopted (``adopt``), if any."""
        self.detached: set[str] = set()
        """Allocation keys this session let go of (``detach``): its wind-up leaves them as they are."""
        self.abandoned = False
        """A call was abandoned while the provider worked on it (the caller was cancelled, by a signal or a
        deadline): its wind-up asks the provider what it still holds (``release_all(confirm=True)``)."""
        self.batched = False
        """A runner of the fleet's attempt: each call is recorded with the session's next write (``take_calls`` hands
        over the rest), and a call that journals an allocation is fenced in the same transaction as the row."""
        self.pending: list[dict[str, Any]] = []
        """``batched``: the calls recorded and not written yet, as ``events`` rows (each with its write key)."""
        self._batch = _Pending(self)
        self._winding_up = False
        """Set while ``release_all`` releases: each ``batched`` write reads the Run's open rows as it leaves them."""
        self._rows_after: list[AllocationRow] | None = None
        """The Run's open rows as the session's last write left them (``None``: not read, or written since)."""
        self.confirmed: bool | None = None
        """After ``release_all(confirm=True)``: whether the provider's own list (``listAllocations``) showed nothing of
        this Run beyond ``left``; ``None`` when it was not asked, ``False`` when it could not be (``unconfirmed``)."""
        self.unconfirmed = ""
        """Why the provider could not be asked what it still holds (it does not serve ``listAllocations``, or it
        failed), when ``confirmed`` is ``False``."""

    @property
    def envelope(self) -> SandboxProviderCapabilities:
        return self.core.envelope

    @property
    def target(self) -> ExecutionTarget:
        return self.core.target

    @property
    def lease(self) -> Lease:
        return self.core.lease

    @lease.setter
    def lease(self, lease: Lease) -> None:
        """Carry on under ``lease`` (this runner took its own lease over): later calls are fenced by it."""
        self.core.lease = lease

    @property
    def limits(self) -> Limits:
        return self.core.limits

    @property
    def instances(self) -> dict[str, Instance]:
        return self.core.instances

    @property
    def snapshots(self) -> dict[str, Snapshot]:
        return self.core.snapshots

    # taking over what another attempt journaled ---------------------------------------------

    def adopt(
        self,
        key: str,
        *,
        from_run: str,
        from_lease: Lease,
        from_owner: str,
        instance: Instance | None = None,
    ) -> bool:
        """Take the ``live`` allocation ``key`` over from ``from_run``, whose lease ``from_lease`` no process holds
        (``from_owner``: a pooled sandbox waiting for a Run): the row moves to this attempt's Run and lease and the
        old lease is ended, in one compare-and-set (``Journal.adopt_allocation``); then this attempt holds it, with
        ``instance`` as the runner's record of it. Returns ``False`` when another adopter won (nothing changed).

        Raises:
            SandboxLeaseFenced: this attempt's own lease was taken over; nothing was written.
        """
        won = self.journal.adopt_allocation(
            key,
            from_run=from_run,
            from_lease=from_lease,
            from_owner=from_owner,
            to_run=self.run_id,
            to_lease=self.lease,
            now=self.clock.now(),
        )
        if won:
            self.core.take(key, instance=instance)
            self.adopted = key
        return won

    def attach(self, *, instance: Instance | None = None, snapshot: Snapshot | None = None) -> None:
        """Hold an instance or snapshot this session's Run journaled ``live`` in an earlier process (a long-lived
        sandbox, a snapshot of one), under the Run's lease as it is now (``lease``: every holder of a long-lived
        sandbox shares its lease; a reclaim takes it over and fences them all). Writes nothing."""
        held = instance if instance is not None else snapshot
        if held is None:
            raise ValueError("attach: give the instance or the snapshot to hold")
        self.detached.discard(held.allocation_key)
        self.core.take(held.allocation_key, instance=instance, snapshot=snapshot)

    def detach(self, inst: Instance) -> None:
        """Let go of ``inst`` without releasing it: this session's wind-up (``release_all``) leaves it and its journal
        row as they are, for whoever attaches next."""
        self.core.let_go(inst.allocation_key)
        self.detached.add(inst.allocation_key)

    # carrying out a plan ----------------------------------------------------------------------

    def _plan(self, member: Member, make: Callable[[], Plan[V]]) -> Plan[V]:
        """The core's plan; an undeclared member's refusal is recorded as an event of the Run."""
        try:
            return make()
        except SandboxOperationUnsupported as exc:
            self.door.refused(member, exc, run_id=self.run_id, recorder=self.recorder)
            raise

    @property
    def recorder(self) -> Recorder:
        """Where the door records each call: the journal at once, or (``batched``) the session's next write."""
        return self._batch if self.batched else self.journal

    def take_calls(self) -> list[dict[str, Any]]:
        """The calls recorded (``batched``) and not written yet, as ``events`` rows; the caller writes them."""
        calls, self.pending = self.pending, []
        return calls

    async def _run(self, plan: Plan[V], *, winding_up: bool = False) -> V:
        """Carry out ``plan``. ``winding_up`` (a release or compensation on the way out): a journal that
        cannot be written does not stop the call; what it could not record is kept in ``unjournaled``.

        ``batched``: a plan that journals an allocation first renews the lease for the call in the same transaction
        (so the row is committed, and the lease checked current, before the provider is asked, as ever)."""
        writes = any(isinstance(e, JournalAllocation | SettleRow) for e in plan.before)
        renew = plan.deadline if self.batched and not winding_up and writes else None  # else the door's fence renews
        try:
            await self._apply_now(plan.before, renew_for=renew)
        except SandboxLeaseFenced as exc:  # taken over before even journaling: nothing to ask, nothing to undo
            self.door.refused(plan.member, exc, run_id=self.run_id, recorder=self.recorder, key=plan.allocation_key)
            raise
        try:
            accepted = await self.door.call(
                plan,
                run_id=self.run_id,
                recorder=self.recorder,
                fence=None if renew is not None else lambda: self._fence(plan.deadline, winding_up=winding_up),
            )
        except ProviderFault as fault:
            await self._apply(plan.on_fault(fault.error))
            raise fault.error from None
        except BaseException:
            self.abandoned = True
            await self._apply(plan.on_abandon())
            raise
        await self._apply_now(accepted.effects, winding_up=winding_up)
        return accepted.value

    def _renewal(self, deadline: float) -> float:
        """When the fence of a call with ``deadline`` renews the lease until."""
        return self.clock.now() + self.leases.span(max(self.leases.ttl, deadline + 60))

    async def _fence(self, deadline: float, *, winding_up: bool = False) -> None:
        """Renew the lease for the whole call; a runner whose lease was taken over stops here.

        Winding up, a journal that cannot be written does not stop the call: releasing or compensating this
        Run's own allocation by its key is safe without the lease (both are idempotent, and a reconciler that
        took the lease over would do the same), and leaving it would leak the sandbox. A lease taken over
        still stops it.
        """
        try:
            if self.batched:
                await self._write(renew_until=self._renewal(deadline))
            else:
                await self.journal.call(self.leases.renew, self.lease, ttl=max(self.leases.ttl, deadline + 60))
        except JournalError as exc:
            if not winding_up:
                raise
            self.unjournaled.setdefault("lease", f"not renewed: {exc}")

    async def _write(
        self,
        *,
        renew_until: float | None = None,
        allocation: dict[str, Any] | None = None,
        settle: dict[str, Any] | None = None,
    ) -> None:
        """``batched``: one fenced transaction with the calls recorded since the last one (``Journal.fenced_write``).

        Raises:
            SandboxLeaseFenced: the lease was taken over or ended: nothing of this step was written; the calls
                recorded were, unfenced (what happened is history, whoever holds the Run now).
            JournalError: the journal could not be written; the calls stay for the next write.
        """
        calls = list(self.pending)
        self._rows_after = None  # whatever was read before this write is stale once it is made (or fails)
        try:
            rows = await self.journal.call(
                self.journal.fenced_write,
                self.lease,
                renew_until=renew_until,
                allocation=allocation,
                settle=settle,
                calls=calls,
                open_rows_of=self.run_id if self._winding_up else None,
            )
        except SandboxLeaseFenced as exc:
            with contextlib.suppress(JournalError):
                await self.journal.call(self.journal.record_events, calls)
                del self.pending[: len(calls)]
            if renew_until is not None:
                raise self.leases.fenced(self.lease) from None  # as a renewal says it: taken over, or ended
            raise exc from None
        del self.pending[: len(calls)]
        self._rows_after = rows

    async def _apply_now(
        self, effects: Sequence[Effect], *, winding_up: bool = False, renew_for: float | None = None
    ) -> None:
        """Journal what the core says, fenced by the lease: a runner whose attempt was taken over writes nothing.
        Each write waits out a locked journal off the event loop (``Journal.call``). ``renew_for`` (``batched``):
        the first write also renews the lease for a call with that deadline."""
        for effect in effects:
            if self.batched and isinstance(effect, JournalAllocation | SettleRow):
                until = self._renewal(renew_for) if renew_for is not None else None
                renew_for = None
                try:
                    await self._write(
                        renew_until=until,
                        allocation=self._pending_row(effect) if isinstance(effect, JournalAllocation) else None,
                        settle=self._settled_row(effect) if isinstance(effect, SettleRow) else None,
                    )
                except JournalError as exc:
                    if not (winding_up and isinstance(effect, SettleRow)):
                        raise
                    self.unjournaled[effect.key] = f"not recorded as {effect.state}: {exc}"
                continue
            if isinstance(effect, SettleRow) and winding_up:
                try:
                    await self.journal.call(
                        self.journal.set_allocation,
                        effect.key,
                        effect.state,
                        now=self.clock.now(),
                        object_id=effect.object_id,
                        expires_at=effect.expires_at,
                        fence=self.lease,
                    )
                except JournalError as exc:
                    self.unjournaled[effect.key] = f"not recorded as {effect.state}: {exc}"
                continue
            if isinstance(effect, JournalAllocation):
                await self.journal.call(
                    self.journal.journal_allocation,
                    effect.key,
                    run_id=self.run_id,
                    kind=effect.kind,
                    target=self.target,
                    runner_tag=self.core.runner_tag,
                    lease_id=self.lease.lease_id,
                    now=self.clock.now(),
                    parent_key=effect.parent,
                    site=self.site,
                    fence=self.lease,
                )
            elif isinstance(effect, SettleRow):
                await self.journal.call(
                    self.journal.set_allocation,
                    effect.key,
                    effect.state,
                    now=self.clock.now(),
                    object_id=effect.object_id,
                    expires_at=effect.expires_at,
                    fence=self.lease,
                )

    def _pending_row(self, effect: JournalAllocation) -> dict[str, Any]:
        now = self.clock.now()
        return {
            "allocation_key": effect.key,
            "run_id": self.run_id,
            "kind": effect.kind,
            "target": self.target.model_dump_json(),
            "runner_tag": self.core.runner_tag,
            "lease_id": self.lease.lease_id,
            "state": "pending",
            "object_id": None,
            "parent_key": effect.parent,
            "created_at": now,
            "updated_at": now,
            "site": self.site,
        }

    def _settled_row(self, effect: SettleRow) -> dict[str, Any]:
        return {
            "key": effect.key,
            "state": effect.state,
            "now": self.clock.now(),
            "object_id": effect.object_id,
            "expires_at": effect.expires_at,
        }

    async def _apply(self, effects: Sequence[Effect]) -> None:
        """Apply effects during another failure: compensations are quiet and finish through cancellation."""
        await self._apply_now(effects)
        for effect in effects:
            if isinstance(effect, Compensate):
                await self._compensate_quietly(effect.key)

    async def _compensate_quietly(self, allocation_key: str) -> SandboxError | None:
        """Compensate during another failure: a failure here is journaled and returned, never masks the first.

        The journal being unavailable does not stop it (``winding_up``)."""
        task = asyncio.ensure_future(self._run(self.core.compensate(allocation_key), winding_up=True))
        try:
            await asyncio.shield(task)
        except SandboxError as exc:
            return exc
        except asyncio.CancelledError:
            # Finish reclaiming what was journaled, then honour the cancellation.
            with contextlib.suppress(SandboxError):
                await task
            raise
        return None

    # materialize and allocation ---------------------------------------------------------------

    async def materialize(self, profile: SandboxProfile, platform: Platform) -> MaterializeResult:
        return await self._run(self._plan("materialize", lambda: self.core.materialize(profile, platform)))

    async def provision(
        self,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[ResolvedMount | MountPlan] = (),
    ) -> Instance:
        """Journal an allocation, then ask for it; compensate it if anything fails. ``mounts``: resolved, or only
        their plans (a pooled sandbox's empty sealed mounts, staged by the Run that adopts it).

        Raises:
            SandboxError: whatever check failed; the allocation has been compensated.
        """
        plans = [m if isinstance(m, MountPlan) else m.plan for m in mounts]
        return await self._run(
            self._plan("provision", lambda: self.core.provision(profile, platform, root_image, plans))
        )

    async def clone(
        self,
        source: Instance,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[ResolvedMount] = (),
    ) -> Instance:
        plans = [m.plan for m in mounts]
        return await self._run(
            self._plan("clone", lambda: self.core.clone(source, profile, platform, root_image, plans))
        )

    async def resume(
        self,
        snapshot: Snapshot,
        profile: SandboxProfile,
        platform: Platform,
        root_image: str,
        mounts: Sequence[ResolvedMount] = (),
    ) -> Instance:
        plans = [m.plan for m in mounts]
        return await self._run(
            self._plan("resume", lambda: self.core.resume(snapshot, profile, platform, root_image, plans))
        )

    # provisioning -----------------------------------------------------------------------------

    async def write_file(
        self,
        inst: Instance,
        path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        symlink: bool = False,
        digest: str | None = None,
    ) -> WriteFileResult:
        return await self._run(
            self._plan(
                "writeFile",
                lambda: self.core.write_file(inst, path, data, mode=mode, symlink=symlink, digest=digest),
            )
        )

    async def stage(
        self, inst: Instance, mounts: Sequence[ResolvedMount], progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Push every mount file with ``writeFile``, one file in memory at a time; returns the bytes staged.

        Each file is read again (in a worker thread) and verified against its plan first.

        Raises:
            SandboxDigestMismatch: a file changed after it was resolved; nothing more is staged.
        """
        total = sum(m.plan.total_bytes for m in mounts)
        done = 0
        for mount in mounts:
            files = mount.files()
            try:
                while (item := await _in_thread(next, files, None)) is not None:
                    f, data = item
                    # a directory file's sha256 digest was just checked against these bytes: not hashed again
                    digest = f.digest if f.digest.startswith("sha256:") else None
                    await self.write_file(
                        inst, mount.plan.absolute(f), data, mode=f.mode, symlink=f.symlink, digest=digest
                    )
                    done += len(data)
                    if progress is not None:
                        progress(done, total)
            finally:
                await _in_thread(files.close)
        return done

    async def activate(self, inst: Instance) -> InstanceResult:
        return await self._run(self._plan("activate", lambda: self.core.activate(inst)))

    # active -----------------------------------------------------------------------------------

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
        return await self._run(
            self._plan(
                "exec",
                lambda: self.core.exec(
                    inst, argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes
                ),
            )
        )

    async def publish_port(self, inst: Instance, spec: PortSpec) -> PublishedPort:
        """Publish ``spec`` for the active ``inst`` through a provider that can (``PortPublisher``: the Docker
        tier); the provider removes what it opened when the instance is released or compensated.

        Raises:
            SandboxStateConflict: ``inst`` is not active.
            SandboxCapabilityUnavailable: (field ``-p``) the provider cannot publish ports.
            SandboxProviderFailed: (field ``-p``) the provider could not open it.
        """
        if inst.state != "active":
            raise SandboxStateConflict(f"-p: the sandbox is {inst.state}, not active", field="-p")
        provider = self.door.provider
        if not isinstance(provider, PortPublisher):
            raise SandboxCapabilityUnavailable(
                [Unmet("-p", "this provider cannot publish a port (only the Docker tier can, on its own host)")],
                provider=self.target.provider,
            )
        started, t0 = self.clock.now(), time.perf_counter()
        error: SandboxError | None = None
        try:
            async with asyncio.timeout(60):
                published = await provider.publish_port(
                    allocation_key=inst.allocation_key,
                    instance_id=inst.instance_id,
                    runner_tag=self.core.runner_tag,
                    spec=spec,
                )
        except TimeoutError:
            error = SandboxProviderFailed("-p: the port was not published within 60 s", field="-p")
        except SandboxError as exc:
            error = exc
        # journaled as any provider call is (`checkfu ps` and `runs show` name what is published); a journal that
        # cannot take the record does not turn a port that was opened into a failure, as a call record never does
        with contextlib.suppress(JournalError):
            await self.journal.call(
                self.journal.record_event,
                self.run_id,
                PUBLISH_PORT,
                allocation_key=inst.allocation_key,
                started_at=started,
                duration_ms=(time.perf_counter() - t0) * 1000,
                outcome="ok" if error is None else "error",
                error_code=None if error is None else error.code,
                detail=json.dumps(
                    published.to_json() if error is None else {"port": spec.port, "error": error.message}
                ),
            )
        if error is not None:
            raise error
        return published

    async def open_process(
        self,
        inst: Instance,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        tty: tuple[int, int] | None = None,
    ) -> CheckedProcess:
        opened = await self._run(
            self._plan("openProcess", lambda: self.core.open_process(inst, argv, env=env, cwd=cwd, tty=tty))
        )

        async def reclaim(error: SandboxError) -> None:
            # The stream's fault is part of the Run's story, as a failed call would be.
            self.door.refused("openProcess", error, run_id=self.run_id, recorder=self.recorder, key=inst.allocation_key)
            if inst.state not in ("released", "absent"):
                await self._apply(self.core._reclaim(inst)(error))

        return CheckedProcess(opened.stream, opened.started, self.limits.max_output_bytes, on_fault=reclaim)

    async def read_files(
        self, inst: Instance, paths: Sequence[str], *, max_bytes: int | None = None
    ) -> ReadFilesResult:
        return await self._run(self._plan("readFiles", lambda: self.core.read_files(inst, paths, max_bytes=max_bytes)))

    async def list_dir(
        self, inst: Instance, path: str, *, recursive: bool = False, max_entries: int | None = None
    ) -> ListDirResult:
        return await self._run(
            self._plan("listDir", lambda: self.core.list_dir(inst, path, recursive=recursive, max_entries=max_entries))
        )

    async def inspect(self, inst: Instance) -> InstanceResult:
        """The instance as the provider now holds it.

        Raises:
            SandboxStateConflict: the provider reports a state the instance cannot be in: anything
                but the runner's own record, or ``released`` (an instance may be lost, never moved back).
        """
        return await self._run(self._plan("inspect", lambda: self.core.inspect(inst)))

    # snapshots --------------------------------------------------------------------------------

    async def snapshot(
        self,
        inst: Instance,
        *,
        keep_seconds: int | None = None,
        first: Callable[[str], Awaitable[None]] | None = None,
    ) -> Snapshot:
        """Snapshot ``inst``; with ``keep_seconds``, the provider deletes it once that passes (its
        ``expires_at`` is journaled, and ``checkfu.core.expiry`` deletes it for runner custody). ``first`` is
        called with the snapshot's allocation key before anything is journaled or asked (a long-lived sandbox
        records its snapshot there, so that one cut short is found)."""
        plan = self._plan("snapshot", lambda: self.core.snapshot(inst, keep_seconds=keep_seconds))
        if first is not None and plan.allocation_key is not None:
            await first(plan.allocation_key)
        return await self._run(plan)

    async def delete_snapshot(self, snap: Snapshot) -> DeleteSnapshotResult:
        return await self._run(self._plan("deleteSnapshot", lambda: self.core.delete_snapshot(snap)))

    # release and compensation -----------------------------------------------------------------

    async def release(self, inst: Instance) -> ReleaseResult:
        """Release ``inst``. A result that fails a check compensates it by allocation key."""
        return await self._run(self._plan("release", lambda: self.core.release(inst)))

    async def compensate(self, allocation_key: str) -> CompensateResult:
        """Cold compensation by allocation key; settles the journal entry when it succeeds."""
        return await self._run(self.core.compensate(allocation_key))

    async def list_allocations(self) -> ListAllocationsResult:
        return await self._run(self._plan("listAllocations", self.core.list_allocations))

    async def release_all(self, *, confirm: bool = False) -> dict[str, str]:
        """Release every live instance and compensate whatever cannot be released; used on the way out.

        A journal that cannot be written does not stop it. Returns (and keeps in ``left``) what is still
        held in the provider, by allocation key, with the error that kept it: empty when nothing is.
        With ``confirm`` (or once a call was ``abandoned``), the provider is then asked what it still lists of this
        Run (``confirmed``): anything is compensated once more, and what is listed after that is ``left`` too, so
        that "nothing is left" is said only when the provider's own list says so.
        """
        left: dict[str, str] = {}
        self._winding_up, self._rows_after = True, None  # ``batched``: each write reads the open rows once written
        try:
            for inst in self.core.unreleased():
                try:
                    await self._run(self.core.release(inst), winding_up=True)
                    continue
                except (SandboxError, asyncio.CancelledError):
                    pass
                failed = await self._compensate_quietly(inst.allocation_key)
                if failed is not None:
                    left[inst.allocation_key] = f"{failed.code}: {failed.message}"
        finally:
            self._winding_up = False
        try:
            # the rows as the last write left them, when it was the session's last (else read now)
            rows = self._rows_after
            if rows is None:
                rows = await self.journal.call(self.journal.open_allocations, run_id=self.run_id)
        except JournalError as exc:
            self.unjournaled.setdefault("rows", f"the Run's open rows could not be read: {exc}")
            rows = []
        for row in rows:
            key = row.allocation_key
            if (row.kind == "snapshot" and row.state == "live") or key in left or key in self.detached:
                continue  # durable snapshots outlive the Run by design
            if self.core.rows.get(key) in ("released", "compensated"):
                continue  # reclaimed in the provider; only the journal could not say so
            failed = await self._compensate_quietly(key)
            if failed is not None:
                left[key] = f"{failed.code}: {failed.message}"
        if confirm or self.abandoned:
            await self._confirm(left)
        self.left = left
        self.undestroyed = {
            key: f"{why}; compensated by its key since, on the provider's word alone"
            for key, why in self.core.undestroyed.items()
            if key not in left
        }
        return left

    async def confirm(self) -> dict[str, str]:
        """After ``release_all`` without ``confirm``: ask the provider what it still lists of this Run now (a signal
        came while it was released). Returns ``left``, updated."""
        left = dict(self.left)
        await self._confirm(left)
        self.left = left
        self.undestroyed = {key: why for key, why in self.undestroyed.items() if key not in left}
        return left

    async def _confirm(self, left: dict[str, str]) -> None:
        """Ask the provider what it still lists of this Run's allocations (``listAllocations`` under the runner tag,
        by allocation key; a durable snapshot and what was detached outlive the Run by design): each is compensated
        once more, and what is listed even after that is added to ``left``. Sets ``confirmed``."""
        mine = {
            key
            for key, row in self.core.rows.items()
            if key not in self.detached and not (key in self.core.snapshots and row == "live")
        }
        if not mine:
            self.confirmed = True  # nothing was ever asked for
            return
        if not self.envelope.declares("listAllocations"):
            self.confirmed, self.unconfirmed = False, f"{self.target} does not serve listAllocations"
            return
        held: list[str] = []
        for again in (False, True):
            try:
                listed = await self._run(self._plan("listAllocations", self.core.list_allocations), winding_up=True)
            except SandboxError as exc:
                self.confirmed, self.unconfirmed = False, f"listAllocations failed: {exc.code}: {exc.message}"
                return
            held = sorted(({entry.allocation_key for entry in listed.allocations} & mine) - set(left))
            if not held or again:
                break
            for key in held:
                failed = await self._compensate_quietly(key)
                if failed is not None:
                    left[key] = f"{failed.code}: {failed.message}"
        for key in held:
            left.setdefault(key, "still listed by the provider after its release and compensation")
        self.confirmed = True


class CheckedProcess:
    """An open process whose events are bounded and well-ordered, or a typed error.

    Anything the stream raises is the provider's fault, translated by the door's one table; so is an
    event that breaks the order or the bounds. Either way ``on_fault`` runs once, before the error is
    raised: the session compensates the instance by its key, as after any other fault of an instance call.
    """

    def __init__(
        self,
        stream: ProcessStream,
        started: ProcessStarted,
        max_chunk: int,
        *,
        on_fault: Callable[[SandboxError], Awaitable[None]] | None = None,
    ) -> None:
        self.stream = stream
        self.started = started
        self.max_chunk = max_chunk
        self._on_fault = on_fault

    async def _faulted(self, error: SandboxError) -> SandboxError:
        on_fault, self._on_fault = self._on_fault, None
        if on_fault is not None:
            await kill_process(self.stream)
            await on_fault(error)
        return error

    async def send_stdin(self, data: bytes) -> None:
        try:
            with _translated():
                await self.stream.send_stdin(data)
        except SandboxError as exc:
            raise await self._faulted(exc) from None

    async def close_stdin(self) -> None:
        try:
            with _translated():
                await self.stream.close_stdin()
        except SandboxError as exc:
            raise await self._faulted(exc) from None

    async def resize(self, rows: int, cols: int) -> None:
        with _translated():
            await self.stream.resize(rows, cols)

    async def kill(self) -> None:
        await kill_process(self.stream)

    async def events(self) -> AsyncIterator[ProcessEvent]:
        check = OutputOrder(self.max_chunk)
        try:
            with _translated():
                stream = aiter(self.stream.events())
            while True:
                with _translated():
                    try:
                        event = await anext(stream)
                    except StopAsyncIteration:
                        break
                check.feed(event)
                yield event
                if isinstance(event, ProcessExit):
                    return
            check.end()
        except SandboxError as exc:
            raise await self._faulted(exc) from None


async def _in_thread(fn: Callable[..., V], /, *args: object) -> V:
    """``fn(*args)`` in a worker thread, awaited to its end even when the caller is cancelled meanwhile (the
    cancellation is raised after): a thread cannot be stopped, and a mount's reader still reading in one cannot be
    closed (``generator already executing``, when a signal came during staging)."""
    pending = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled = False
    while not pending.done():
        try:
            await asyncio.shield(pending)
        except asyncio.CancelledError:
            if pending.cancelled():
                raise
            cancelled = True
        except Exception:  # it ended; its exception is read below
            continue
    if cancelled:
        if not pending.cancelled():
            pending.exception()
        raise asyncio.CancelledError
    return pending.result()


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Whatever a process stream raises is the provider's fault, translated by the door's one table."""
    try:
        yield
    except Exception as exc:
        raise provider_fault("openProcess", exc) from None
