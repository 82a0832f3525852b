"""Long-lived sandboxes: made once, used by many calls and processes, reclaimed when their time is up.

A sandbox is a Run that does not end with its first command. It is created through the same
checked, journaled, fenced machinery as ``checkfu run`` (``Runner.start``: selection and the
capability check before any provider work; every allocation journaled before it is asked for;
every call fenced by the Run's lease; mounts staged before the sandbox is activated, so nothing
the user runs can see a half-staged tree). Once it is active it is recorded in the journal's
``sandboxes`` table and outlives the process that made it:

- Its lease's deadline *is* its time-to-live (``expires_at``). Calls do not push it back (only
  ``extend`` does), and a call made after it passed is refused with ``SandboxLeaseFenced``.
- Its owner is the process that holds it (``checkfu.Sandbox``), or nobody (``detached``: ``checkfu
  sandbox create``). A sandbox whose owner process is gone, or whose time-to-live passed, is
  reclaimable: ``sweep`` takes its lease over (fencing any straggler), compensates the instance by
  its allocation key, settles the journal row and the Run, and records why.
- Any process attaches by sandbox id (``SandboxHost.attach``) and drives it under the same lease.

``sweep`` needs no daemon: every ``checkfu`` command that opens the journal runs it
(``checkfu.cli.state.open_journal``), and ``checkfu runner reconcile`` from a timer does the same
for a service (``docs/sandboxes.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from checkfu.contract.codec import decode_value
from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxError,
    SandboxLeaseFenced,
    SandboxNotFound,
    SandboxProfileInvalid,
    SandboxStateConflict,
)
from checkfu.contract.lifecycle import RowKind, row_transition
from checkfu.contract.members import MAX_KEEP_SECONDS, ExecResult, ListDirResult, ReadFilesResult
from checkfu.contract.mounts import MountPlan
from checkfu.contract.ports import PortSpec, PublishedPort
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import Clock, SystemClock
from checkfu.core.door import ProviderFault
from checkfu.core.driver import CheckedProcess, Instance, Limits, RunSession, Snapshot
from checkfu.core.journal import (
    OPEN_STATES,
    Journal,
    JournalError,
    allocations,
    journaled,
    leases,
    sandbox_snapshots,
    sandboxes,
    sandboxes_maybe_due,
    snapshots_pending,
)
from checkfu.core.leases import LeaseStore, current_owner, owner_alive
from checkfu.core.mounts import DirectorySource, GitSource, MountSpec, ResolvedMount, resolve_mount
from checkfu.core.registry import Adapter, Registry, target_key
from checkfu.core.runner import Needs, Runner
from checkfu.core.session import compensate_plan

__all__ = [
    "DEFAULT_TTL",
    "CutShort",
    "MAX_TTL",
    "LiveSandbox",
    "Reclaimed",
    "SandboxHost",
    "SandboxRecord",
    "SnapshotRecord",
    "cut_short",
    "due_for_sweep",
    "new_sandbox_id",
    "settle_cut_short",
    "sweep",
]

DEFAULT_TTL = 1800.0
"""A sandbox's time-to-live when none is asked for: 30 minutes."""
MAX_TTL = 7 * 86400.0
"""The longest time-to-live one call may ask for (a week); ``extend`` may ask again."""
CREATE_HOLD = 900.0
"""While a sandbox is being made its lease is held by the making process, renewed per call (a build may be slow)."""
SandboxState = Literal["provisioning", "live", "released", "reclaimed", "failed"]


Wanted = tuple[str, str | None]
"""A provider's name and a site (``None``: the one without a site; a URL: a provider service's endpoint)."""


IS_A_DIRECTORY = 21
"""``files.write``'s script's exit status for a path that is a directory (``EISDIR``)."""
WRITE_SCRIPT = (
    'umask 022; if [ -d "$1" ]; then echo "$1: is a directory" >&2; exit 21; fi; '
    'd=$(dirname -- "$1") && mkdir -p -- "$d" || exit; t="$d/.checkfu-write.$$"; '
    'cat > "$t" && chmod "$2" -- "$t" && mv -f -- "$t" "$1" && exit 0; s=$?; rm -f -- "$t"; exit "$s"'
)
"""Write stdin to ``$1`` with mode ``$2``: into a temporary name beside it, renamed over it once complete (a failed
write leaves nothing behind, and ``$1`` as it was)."""


def new_sandbox_id() -> str:
    return f"sb-{uuid.uuid4().hex[:20]}"


def new_snapshot_ref() -> str:
    return f"snap-{uuid.uuid4().hex[:20]}"


def detached_owner(sandbox_id: str) -> str:
    """The owner of a sandbox no process holds: no host/pid, so only its deadline ends it."""
    return f"detached:{sandbox_id}"


def check_ttl(ttl: float, *, field: str = "ttl") -> float:
    """Raises SandboxProfileInvalid: ``ttl`` is not a number of seconds in (0, MAX_TTL]."""
    if not (isinstance(ttl, int | float) and 0 < ttl <= MAX_TTL):
        raise SandboxProfileInvalid(
            f"{field}: {ttl!r} is not a time-to-live: give a number of seconds above 0 and at most {MAX_TTL:g} "
            "(a week)",
            field=field,
        )
    return float(ttl)


def check_keep(keep: float, *, field: str = "keep") -> int:
    """A snapshot's lifetime as the contract asks it: whole seconds, rounded up, at most ``MAX_KEEP_SECONDS``.

    Raises:
        SandboxProfileInvalid: ``keep`` is not a number of seconds in (0, MAX_KEEP_SECONDS].
    """
    if not (isinstance(keep, int | float) and 0 < keep <= MAX_KEEP_SECONDS):
        raise SandboxProfileInvalid(
            f"{field}: {keep!r} is not a lifetime: give a number of seconds above 0 and at most "
            f"{MAX_KEEP_SECONDS} (a century)",
            field=field,
        )
    return math.ceil(keep)


@dataclass(frozen=True)
class SandboxRecord:
    sandbox_id: str
    run_id: str
    runner_tag: str
    target: ExecutionTarget
    site: str | None
    allocation_key: str
    instance_id: str | None
    lease_id: str
    owner: str | None
    profile: SandboxProfile
    mounts: tuple[MountPlan, ...]
    mount_roots: tuple[str, ...]
    specs: tuple[MountSpec, ...]
    """Where each mount was read from: a clone or resume stages the same bytes again (the provider's snapshot
    holds the sandbox's own writable areas, never its mounts)."""
    kind: RowKind
    origin: str | None
    state: SandboxState
    reason: str | None
    created_at: float
    expires_at: float
    ended_at: float | None

    @property
    def provider(self) -> str:
        return self.target.provider

    def orphaned(self, now: float) -> str | None:
        """Why nobody is coming back for this live sandbox (``None``: it is held)."""
        if self.state not in ("live", "provisioning"):
            return None
        if self.expires_at < now:
            return "its time-to-live passed"
        if self.owner and owner_alive(self.owner) is False:
            return "its owner process is gone"
        return None


@dataclass(frozen=True)
class SnapshotRecord:
    snapshot_ref: str
    sandbox_id: str
    run_id: str
    runner_tag: str
    target: ExecutionTarget
    site: str | None
    allocation_key: str
    snapshot_id: str
    profile: SandboxProfile
    mounts: tuple[MountPlan, ...]
    mount_roots: tuple[str, ...]
    specs: tuple[MountSpec, ...]
    keep_seconds: float | None
    state: str
    """``pending`` (being taken: journaled before the provider is asked), ``present``, ``failed`` or ``deleted``."""
    created_at: float
    expires_at: float | None
    """When the provider said it expires; ``None``: kept until deleted."""
    owner: str | None = None
    """The process that took it (``host/pid/start``): a ``pending`` snapshot whose owner is gone was cut short."""


def _spec_doc(spec: MountSpec) -> dict[str, Any]:
    src = spec.source
    doc: dict[str, Any] = {"target": spec.target, "writable": spec.writable, "stage_all": spec.stage_all}
    if spec.excludes:
        doc["excludes"] = list(spec.excludes)
    if spec.sync:
        doc["sync"] = True
    if isinstance(src, GitSource):
        doc.update(kind="git", path=str(Path(src.repo).absolute()), ref=src.ref)
    else:
        doc.update(kind="dir", path=str(Path(src.path).absolute()))
    return doc


def _spec_of(doc: Mapping[str, Any]) -> MountSpec:
    source: GitSource | DirectorySource = (
        GitSource(Path(doc["path"]), doc["ref"]) if doc["kind"] == "git" else DirectorySource(Path(doc["path"]))
    )
    excludes = tuple(str(x) for x in doc.get("excludes", ()))
    return MountSpec(
        source, doc["target"], bool(doc["writable"]), bool(doc["stage_all"]), excludes, bool(doc.get("sync"))
    )


def _mounts_json(
    plans: Sequence[MountPlan], roots: Sequence[str], kind: RowKind, specs: Sequence[MountSpec] = ()
) -> str:
    return json.dumps(
        {
            "plans": [p.model_dump(mode="json") for p in plans],
            "roots": list(roots),
            "kind": kind,
            "specs": [_spec_doc(s) for s in specs],
        }
    )


def _mounts_of(raw: str) -> tuple[tuple[MountPlan, ...], tuple[str, ...], RowKind, tuple[MountSpec, ...]]:
    doc = json.loads(raw)
    plans = tuple(decode_value(MountPlan, p) for p in doc["plans"])
    specs = tuple(_spec_of(d) for d in doc.get("specs", ()))
    return plans, tuple(doc["roots"]), doc.get("kind", "instance"), specs


def _target(raw: str) -> ExecutionTarget:
    return ExecutionTarget.model_validate_json(raw)


def _sandbox(r: Any) -> SandboxRecord:
    plans, roots, kind, specs = _mounts_of(r["mounts"])
    return SandboxRecord(
        sandbox_id=r["sandbox_id"],
        run_id=r["run_id"],
        runner_tag=r["runner_tag"],
        target=_target(r["target"]),
        site=r["site"],
        allocation_key=r["allocation_key"],
        instance_id=r["instance_id"],
        lease_id=r["lease_id"],
        owner=r["owner"],
        profile=SandboxProfile.model_validate_json(r["profile"]),
        mounts=plans,
        mount_roots=roots,
        specs=specs,
        kind=kind,
        origin=r["origin"],
        state=r["state"],
        reason=r["reason"],
        created_at=r["created_at"],
        expires_at=r["expires_at"],
        ended_at=r["ended_at"],
    )


def _snapshot(r: Any) -> SnapshotRecord:
    plans, roots, _, specs = _mounts_of(r["mounts"])
    return SnapshotRecord(
        snapshot_ref=r["snapshot_ref"],
        sandbox_id=r["sandbox_id"],
        run_id=r["run_id"],
        runner_tag=r["runner_tag"],
        target=_target(r["target"]),
        site=r["site"],
        allocation_key=r["allocation_key"],
        snapshot_id=r["snapshot_id"],
        profile=SandboxProfile.model_validate_json(r["profile"]),
        mounts=plans,
        mount_roots=roots,
        specs=specs,
        keep_seconds=r["keep_seconds"],
        state=r["state"],
        created_at=r["created_at"],
        expires_at=r["expires_at"],
        owner=r.get("owner"),
    )


class SandboxBook:
    """The journal's ``sandboxes`` and ``sandbox_snapshots`` tables. Every method is one transaction."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    @journaled("sandbox insert")
    def insert(self, **values: Any) -> None:
        with self.journal.tx() as c:
            self.journal.insert_once(c, sandboxes, values, key="sandbox_id")

    @journaled("sandbox update")
    def update(self, sandbox_id: str, *, only_if: Sequence[str] | None = None, **values: Any) -> bool:
        q = sandboxes.update().where(sandboxes.c.sandbox_id == sandbox_id)
        if only_if is not None:
            q = q.where(sandboxes.c.state.in_(list(only_if)))
        with self.journal.tx() as c:
            return bool(c.execute(q.values(**values)).rowcount == 1)

    @journaled("sandbox read")
    def get(self, sandbox_id: str) -> SandboxRecord | None:
        with self.journal.tx() as c:
            row = c.execute(sandboxes.select().where(sandboxes.c.sandbox_id == sandbox_id)).mappings().first()
        return _sandbox(row) if row else None

    @journaled("sandbox find")
    def find(self, ref: str) -> list[SandboxRecord]:
        """The sandboxes whose id starts with ``ref`` (live or ended), or whose Run is ``ref``, oldest first."""
        q = sandboxes.select().where(
            sa.or_(sandboxes.c.sandbox_id.startswith(ref, autoescape=True), sandboxes.c.run_id == ref)
        )
        with self.journal.tx() as c:
            rows = c.execute(q.order_by(sandboxes.c.created_at)).mappings().all()
        return [_sandbox(r) for r in rows]

    @journaled("sandbox list")
    def live(self, runner_tag: str | None = None) -> list[SandboxRecord]:
        q = sandboxes.select().where(sandboxes.c.state.in_(["provisioning", "live"]))
        if runner_tag is not None:
            q = q.where(sandboxes.c.runner_tag == runner_tag)
        with self.journal.tx() as c:
            rows = c.execute(q.order_by(sandboxes.c.created_at)).mappings().all()
        return [_sandbox(r) for r in rows]

    @journaled("sandbox due")
    def due(self, runner_tag: str, now: float) -> list[SandboxRecord]:
        """Live sandboxes of ``runner_tag`` that may be reclaimable: deadline passed, owned by a process
        (whose liveness the caller checks), or whose lease was ended or taken over by someone else."""
        q = (
            sa.select(sandboxes)
            .join(leases, leases.c.lease_id == sandboxes.c.lease_id)
            .where(*sandboxes_maybe_due(runner_tag, now))
        )
        with self.journal.tx() as c:
            rows = c.execute(q).mappings().all()
        return [_sandbox(r) for r in rows]

    @journaled("snapshot insert")
    def insert_snapshot(self, **values: Any) -> None:
        with self.journal.tx() as c:
            self.journal.insert_once(c, sandbox_snapshots, values, key="snapshot_ref")

    @journaled("snapshot read")
    def snapshot(self, ref: str) -> SnapshotRecord | None:
        with self.journal.tx() as c:
            row = (
                c.execute(sandbox_snapshots.select().where(sandbox_snapshots.c.snapshot_ref == ref)).mappings().first()
            )
        return _snapshot(row) if row else None

    @journaled("snapshot list")
    def snapshots(self, runner_tag: str | None = None) -> list[SnapshotRecord]:
        # a snapshot whose allocation was settled meanwhile (deleted at its expiry by the sweep every journal
        # opening makes, or compensated) is not kept any more, whatever this table last said of it
        still_open = sa.select(allocations.c.allocation_key).where(allocations.c.state.in_(OPEN_STATES))
        q = sandbox_snapshots.select().where(
            sandbox_snapshots.c.state == "present", sandbox_snapshots.c.allocation_key.in_(still_open)
        )
        if runner_tag is not None:
            q = q.where(sandbox_snapshots.c.runner_tag == runner_tag)
        with self.journal.tx() as c:
            rows = c.execute(q.order_by(sandbox_snapshots.c.created_at)).mappings().all()
        return [_snapshot(r) for r in rows]

    @journaled("snapshot update")
    def update_snapshot(self, ref: str, *, only_if: Sequence[str] | None = None, **values: Any) -> bool:
        q = sandbox_snapshots.update().where(sandbox_snapshots.c.snapshot_ref == ref)
        if only_if is not None:
            q = q.where(sandbox_snapshots.c.state.in_(list(only_if)))
        with self.journal.tx() as c:
            return bool(c.execute(q.values(**values)).rowcount == 1)

    @journaled("snapshot pending")
    def pending_snapshots(self, runner_tag: str) -> list[SnapshotRecord]:
        """``runner_tag``'s snapshots still being taken (``pending``), oldest first."""
        q = sandbox_snapshots.select().where(*snapshots_pending(runner_tag))
        with self.journal.tx() as c:
            rows = c.execute(q.order_by(sandbox_snapshots.c.created_at)).mappings().all()
        return [_snapshot(r) for r in rows]

    @journaled("held by")
    def held_by(self, owner: str) -> list[str]:
        """The allocation keys still open (``pending`` or ``live``, a settled snapshot aside) that process ``owner``
        began: under a lease it took (a sandbox it was making), or a snapshot it was taking. What an interrupted
        command must own up to."""
        mine = sa.select(leases.c.lease_id).where(leases.c.owner == owner)
        taking = sa.select(sandbox_snapshots.c.allocation_key).where(
            sandbox_snapshots.c.owner == owner, sandbox_snapshots.c.state == "pending"
        )
        q = sa.select(allocations.c.allocation_key, allocations.c.kind, allocations.c.state).where(
            allocations.c.state.in_(OPEN_STATES),
            sa.or_(allocations.c.lease_id.in_(mine), allocations.c.allocation_key.in_(taking)),
        )
        with self.journal.tx() as c:
            rows = c.execute(q.order_by(allocations.c.created_at)).all()
        return [r.allocation_key for r in rows if not (r.kind == "snapshot" and r.state == "live")]

    @journaled("snapshot delete")
    def snapshot_deleted(self, ref: str, now: float) -> None:
        with self.journal.tx() as c:
            c.execute(
                sandbox_snapshots.update()
                .where(sandbox_snapshots.c.snapshot_ref == ref)
                .values(state="deleted", deleted_at=now)
            )


class SandboxLeases(LeaseStore):
    """The lease of a live sandbox: its deadline is the time-to-live, which no call moves.

    ``renew`` (run before every provider call) only checks that the lease is still current and that
    the time-to-live has not passed; ``extend`` is what moves the deadline.
    """

    def renew(self, lease: Lease, *, ttl: float | None = None) -> None:
        now = self.clock.now()
        until = self.deadline(lease)
        if until is None:
            raise self._fenced(lease)
        if until < now:
            raise SandboxLeaseFenced(
                f"the sandbox's time-to-live passed {now - until:.0f} s ago: it is reclaimed by the next "
                "checkfu command (extend a sandbox before its time is up)",
                field="ttl",
            )


@dataclass(frozen=True)
class Reclaimed:
    sandbox_id: str
    run_id: str
    reason: str
    """Why it was reclaimed: ``expired`` (time-to-live passed), ``orphaned`` (owner gone) or ``ended``."""
    error: str | None = None
    """Set when the compensation failed: the sandbox is still held and stays open for the next pass."""


class LiveSandbox:
    """One attached sandbox: its record, its session, its instance. Every call is checked, journaled and fenced."""

    def __init__(self, host: SandboxHost, record: SandboxRecord, session: RunSession, inst: Instance) -> None:
        self.host = host
        self.record = record
        self.session = session
        self.inst = inst

    @property
    def sandbox_id(self) -> str:
        return self.record.sandbox_id

    async def _lost(self, exc: SandboxError) -> SandboxError:
        """After a call failed with ``exc``: if the session reclaimed the instance (a provider fault about it, such
        as its container found gone), the sandbox is gone: its row and its Run are settled now, never left ``live``
        and ``running``, and the error returned says so. Otherwise ``exc`` as it is."""
        key = self.inst.allocation_key
        if self.inst.state not in ("released", "absent") and self.session.core.rows.get(key) != "compensated":
            return exc
        call = self.host.journal.call
        row = await call(self.host.journal.allocation, key)
        settled = row is None or row.state not in OPEN_STATES
        said = f"{exc.code}: {exc.message}"
        reason = f"lost: {said}"[:2000]
        now = self.host.clock.now()
        try:
            if settled:
                await call(
                    self.host.journal.finish_run,
                    self.record.run_id,
                    status="failed",
                    now=now,
                    summary={"sandbox": self.sandbox_id, "reason": f"the sandbox was lost ({said}); it is reclaimed"},
                )
            await call(LeaseStore(self.host.journal, self.host.clock).end, self.session.lease)
            await call(
                self.host.book.update, self.sandbox_id, only_if=["live"], state="failed", reason=reason, ended_at=now
            )
        except JournalError:
            pass  # the next command's house keeping, or reconciliation, settles it
        what = (
            "what was left of it is removed and its Run is settled as failed"
            if settled
            else "what is left of it could not be removed now: `checkfu runner reconcile` finishes it"
        )
        told = copy.copy(exc)
        told.message = f"sandbox {self.sandbox_id} is gone ({exc.message}); {what}"
        told.args = (told.message,)
        told.retryable = False
        return told

    def remaining(self) -> float:
        """Seconds until the sandbox's time-to-live ends, as this process last read it (a command given no
        timeout of its own runs at most this long)."""
        return self.record.expires_at - self.host.clock.now()

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes = b"",
        timeout: float = 60.0,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``argv`` to its end; each stream keeps its first ``max_output_bytes`` (at most the runner's bound),
        the rest dropped and flagged (``stdout_truncated``, ``stderr_truncated``).

        Raises:
            SandboxProfileInvalid: an argument, an environment name or value, or ``cwd`` the contract refuses (named
                by field, before the provider is asked anything).
        """
        _admit(argv, env, cwd)
        try:
            return await self.session.exec(
                self.inst, argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes
            )
        except SandboxError as exc:
            raise await self._lost(exc) from exc

    def streams(self) -> bool:
        """Whether the provider declares ``openProcess`` (a process with stdin and streamed output)."""
        return self.session.envelope.declares("openProcess")

    async def open_process(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        tty: tuple[int, int] | None = None,
    ) -> CheckedProcess:
        _admit(argv, env, cwd)
        try:
            return await self.session.open_process(self.inst, argv, env=env, cwd=cwd, tty=tty)
        except SandboxError as exc:
            raise await self._lost(exc) from exc

    async def read_files(self, paths: Sequence[str]) -> ReadFilesResult:
        try:
            return await self.session.read_files(self.inst, paths)
        except SandboxError as exc:
            raise await self._lost(exc) from exc

    async def publish_port(self, spec: PortSpec) -> PublishedPort:
        """Publish ``spec`` (``-p``) for this sandbox; it stays published until the sandbox is released (by
        ``rm``, its time-to-live, reconciliation or the owner's end: the provider removes it with the sandbox).

        Raises:
            SandboxCapabilityUnavailable: (field ``-p``) its provider cannot publish ports.
            SandboxProviderFailed: (field ``-p``) the provider could not open it.
        """
        return await self.session.publish_port(self.inst, spec)

    async def list_dir(self, path: str, *, recursive: bool = False) -> ListDirResult:
        try:
            return await self.session.list_dir(self.inst, path, recursive=recursive)
        except SandboxError as exc:
            raise await self._lost(exc) from exc

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644, timeout: float = 60.0) -> None:
        """Write ``data`` to ``path`` in the active sandbox (parents made), through ``exec`` with ``data`` as stdin.

        ``writeFile`` is a provisioning member (mounts are staged with it before activation); an active
        sandbox takes files the way its own programs do, so the image needs a POSIX ``sh``. The bytes go to a
        temporary name beside ``path``, renamed over it only once all of them are written: a write that fails
        (the sandbox out of space) leaves no partial file, and ``path`` as it was.

        Raises:
            SandboxPathRejected: ``path`` is not absolute and normal, or is a directory.
            SandboxBoundExceeded: the sandbox has no space left for the file (nothing was left of it).
            SandboxProviderFailed: the file could not be written (the shell's words say why).
        """
        from checkfu.contract.errors import (  # noqa: PLC0415
            SandboxBoundExceeded,
            SandboxPathRejected,
            SandboxProviderFailed,
        )
        from checkfu.contract.paths import admit_path  # noqa: PLC0415

        admit_path(path, field="path")
        res = await self.exec(["sh", "-c", WRITE_SCRIPT, "sh", path, f"{mode:o}"], stdin=data, timeout=timeout)
        if res.exit_code == 0:
            return
        why = res.stderr.decode("utf-8", "replace").strip()[:300] or f"exit {res.exit_code}"
        if res.exit_code == IS_A_DIRECTORY:
            raise SandboxPathRejected(f"path: {path} is a directory in sandbox {self.sandbox_id}", field="path")
        if any(said in why for said in ("No space left on device", "Disk quota exceeded")):
            raise SandboxBoundExceeded(
                f"path: {path} could not be written, the sandbox has no space left for {len(data)} bytes (its "
                f"disk_mib); nothing of it was left: {why}",
                field="path",
            )
        raise SandboxProviderFailed(f"path: {path} could not be written: {why}", field="path")

    async def snapshot(self, *, keep: float | None = None) -> SnapshotRecord:
        """Snapshot the sandbox; the snapshot outlives it (until it is deleted, or expires).

        ``keep`` is the lifetime asked for, recorded with it; the expiry shown is the provider's answer
        (``expires_at`` on the snapshot), none when the provider keeps it until deleted.
        """
        keep_seconds = check_keep(keep) if keep is not None else None
        ref = new_snapshot_ref()
        rec = self.record
        call = self.host.journal.call
        keys: list[str] = []

        async def journal_first(key: str) -> None:
            # Written before the provider is asked, naming this process: if it dies mid-way, the next command's
            # house keeping finds the snapshot ``pending`` with its owner gone and undoes what the provider did.
            keys.append(key)
            await call(
                self.host.book.insert_snapshot,
                snapshot_ref=ref,
                sandbox_id=rec.sandbox_id,
                run_id=rec.run_id,
                runner_tag=rec.runner_tag,
                target=rec.target.model_dump_json(),
                site=rec.site,
                allocation_key=key,
                snapshot_id="",
                profile=rec.profile.model_dump_json(),
                mounts=_mounts_json(rec.mounts, rec.mount_roots, "resume", rec.specs),
                keep_seconds=keep,
                state="pending",
                created_at=self.host.clock.now(),
                expires_at=None,
                owner=current_owner(),
            )

        try:
            snap = await self.session.snapshot(self.inst, keep_seconds=keep_seconds, first=journal_first)
        except BaseException:
            if keys and self.session.core.rows.get(keys[0]) in ("compensated", "released"):
                with contextlib.suppress(JournalError):
                    await call(self.host.book.update_snapshot, ref, only_if=["pending"], state="failed")
            raise  # otherwise left pending: the next command's house keeping settles it once this process is gone
        expires = snap.expires_at
        await call(
            self.host.book.update_snapshot,
            ref,
            snapshot_id=snap.snapshot_id,
            state="present",
            created_at=self.host.clock.now(),
            expires_at=float(expires) if isinstance(expires, int | float) else None,
        )
        got = await self.host.journal.call(self.host.book.snapshot, ref)
        assert got is not None
        return got

    async def extend(self, ttl: float) -> float:
        """Set the time-to-live to ``ttl`` seconds from now; returns the new deadline.

        Raises:
            SandboxLeaseFenced: the sandbox was reclaimed or released, or its time-to-live passed already.
        """
        check_ttl(ttl)
        # refuses a lease gone or past its deadline
        await self.host.journal.call(self.session.leases.renew, self.session.lease)
        until = self.host.clock.now() + ttl
        if not await self.host.journal.call(self.session.leases.extend, self.session.lease, until=until):
            raise SandboxLeaseFenced(f"sandbox {self.sandbox_id} was reclaimed meanwhile", field="sandbox_id")
        await self.host.journal.call(self.host.book.update, self.sandbox_id, expires_at=until)
        return until

    def detach(self) -> None:
        """Let go of the sandbox without releasing it: it stays live for whoever attaches next (or until its
        time-to-live passes), whatever this session winds up."""
        self.session.detach(self.inst)

    async def release(self, *, status: str = "released") -> None:
        """Release the sandbox (idempotent across processes: a sandbox already released or reclaimed is left as
        it is; one whose time-to-live passed is reclaimed now, as the next command would)."""
        rec = await self.host.journal.call(self.host.book.get, self.sandbox_id)
        if rec is None or rec.state not in ("live", "provisioning"):
            return
        try:
            await self.session.release(self.inst)
        except SandboxLeaseFenced:
            registry = self.host.registry

            async def same(_: set[Wanted]) -> Registry:
                return registry

            await sweep(self.host.journal, self.host.runner_tag, same, self.host.clock)
            after = await self.host.journal.call(self.host.book.get, self.sandbox_id)
            if after is None or after.state not in ("live", "provisioning"):
                return
            raise
        except SandboxError:
            left = await self.session.release_all()
            if left:
                raise
        await self.host.finish(self.record, self.session.lease, status=status, state="released", reason=status)


class SandboxHost:
    """Makes, attaches to and reclaims long-lived sandboxes on one registry and journal."""

    def __init__(
        self,
        registry: Registry,
        journal: Journal,
        *,
        runner_tag: str,
        clock: Clock | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.registry = registry
        self.journal = journal
        self.runner_tag = runner_tag
        self.clock = clock or SystemClock()
        self.limits = limits or Limits()
        self.book = SandboxBook(journal)

    def _runner(self) -> Runner:
        return Runner(self.registry, self.journal, runner_tag=self.runner_tag, clock=self.clock, limits=self.limits)

    def _adapter(self, target: ExecutionTarget, site: str | None) -> Adapter:
        for a in self.registry.adapters:
            if target_key(a.target) == target_key(target) and a.site == (site or ""):
                return a
        why = "; ".join(f"{k}: {v}" for k, v in self.registry.unavailable.items())
        where = f" at {site}" if site else ""
        raise SandboxAdapterUnavailable(
            f"the sandbox lives on {target}{where}, which is not available here" + (f" ({why})" if why else ""),
            field="provider",
        )

    def record(self, sandbox_id: str) -> SandboxRecord:
        """Raises SandboxNotFound: no sandbox of that id in this journal."""
        rec = self.book.get(sandbox_id)
        if rec is None:
            raise SandboxNotFound(
                f"sandbox_id: no sandbox {sandbox_id!r} in this journal (`checkfu ps` lists the live ones)",
                field="sandbox_id",
            )
        return rec

    async def create(
        self,
        target: ExecutionTarget,
        profile: SandboxProfile,
        platform: Platform,
        *,
        mounts: Sequence[ResolvedMount] = (),
        specs: Sequence[MountSpec] = (),
        ttl: float = DEFAULT_TTL,
        detached: bool = False,
        on_stage: Callable[[int, int], None] | None = None,
    ) -> LiveSandbox:
        """Select, check, journal, provision, stage and activate a sandbox that outlives this call.

        ``detached``: no process owns it, only its time-to-live ends it; else this process owns it,
        and it is reclaimed once this process is gone.

        Raises:
            SandboxError: a refusal or a provider fault; whatever was allocated was released or compensated.
        """
        check_ttl(ttl)
        resolved = list(mounts)
        needs = Needs(
            writable_mounts=any(r.plan.writable for r in resolved),
            mount_symlinks=any(r.plan.has_symlinks for r in resolved),
        )
        return await self._allocate(
            target,
            profile,
            platform,
            ttl=ttl,
            detached=detached,
            needs=needs,
            plans=[r.plan for r in resolved],
            specs=specs,
            origin=None,
            make=lambda s, image: self._provision(s, profile, platform, image, resolved, on_stage),
        )

    async def _provision(
        self,
        session: RunSession,
        profile: SandboxProfile,
        platform: Platform,
        image: str,
        resolved: Sequence[ResolvedMount],
        on_stage: Callable[[int, int], None] | None,
    ) -> Instance:
        inst = await session.provision(profile, platform, image, resolved)
        await session.stage(inst, resolved, progress=on_stage)
        return inst

    async def clone(self, source: LiveSandbox, *, ttl: float = DEFAULT_TTL, detached: bool = False) -> LiveSandbox:
        """A new sandbox holding the source's files as they are now (the source stays as it is)."""
        check_ttl(ttl)
        rec = source.record
        platform = _platform()
        resolved = await _again(rec.specs, rec.mounts)

        async def make(session: RunSession, image: str) -> Instance:
            inst = await session.clone(source.inst, rec.profile, platform, image, resolved)
            await session.stage(inst, resolved)
            return inst

        return await self._allocate(
            rec.target,
            rec.profile,
            platform,
            ttl=ttl,
            detached=detached,
            needs=_needs(rec.mounts),
            plans=list(rec.mounts),
            specs=rec.specs,
            origin=f"clone:{rec.sandbox_id}",
            make=make,
            kind="clone",
            site=rec.site,
        )

    async def resume(self, ref: str, *, ttl: float = DEFAULT_TTL, detached: bool = False) -> LiveSandbox:
        """A new sandbox holding the snapshot's files.

        Raises:
            SandboxNotFound: no such snapshot in this journal, or it was deleted.
        """
        check_ttl(ttl)
        snap = self.book.snapshot(ref)
        if snap is None or snap.state != "present":
            why = {
                None: " (`checkfu ps` lists them)",
                "pending": " yet (it is still being taken)",
                "failed": " (it was cut short: the command taking it died, and what it made was removed)",
            }.get(None if snap is None else snap.state, " (it was deleted)")
            raise SandboxNotFound(f"snapshot: no snapshot {ref!r} in this journal{why}", field="snapshot")
        row = self.book.journal.allocation(snap.allocation_key)
        expired = snap.expires_at is not None and snap.expires_at <= self.clock.now()
        if expired or row is None or row.state not in OPEN_STATES:
            raise SandboxNotFound(
                f"snapshot: {ref!r} "
                + ("expired" if expired else "was deleted")
                + " (a snapshot is kept until the lifetime asked with `--keep`, or until deleted)",
                field="snapshot",
            )
        platform = _platform()
        source = Instance(
            allocation_key=snap.allocation_key,
            instance_id=snap.snapshot_id,
            state="released",
            mount_roots=snap.mount_roots,
            kind="instance",
        )
        record = Snapshot(
            allocation_key=snap.allocation_key, snapshot_id=snap.snapshot_id, source=source, expires_at=snap.expires_at
        )
        resolved = await _again(snap.specs, snap.mounts)

        async def make(session: RunSession, image: str) -> Instance:
            inst = await session.resume(record, snap.profile, platform, image, resolved)
            await session.stage(inst, resolved)
            return inst

        return await self._allocate(
            snap.target,
            snap.profile,
            platform,
            ttl=ttl,
            detached=detached,
            needs=_needs(snap.mounts),
            plans=list(snap.mounts),
            specs=snap.specs,
            origin=f"resume:{ref}",
            make=make,
            kind="resume",
            site=snap.site,
        )

    async def delete_snapshot(self, ref: str) -> None:
        """Delete a snapshot through its provider; a snapshot already deleted is left as it is.

        Raises:
            SandboxNotFound: no such snapshot in this journal.
        """
        snap = self.book.snapshot(ref)
        if snap is None:
            raise SandboxNotFound(f"snapshot: no snapshot {ref!r} in this journal", field="snapshot")
        if snap.state == "pending":
            raise SandboxStateConflict(
                f"snapshot: {ref!r} is still being taken; delete it once `checkfu snapshot` has printed it",
                field="snapshot",
            )
        if snap.state != "present":
            return
        adapter = self._adapter(snap.target, snap.site)
        store = LeaseStore(self.journal, self.clock, ttl=300)
        lease = store.acquire(snap.run_id)
        session = self._session(adapter, snap.run_id, store, lease)
        source = Instance(
            allocation_key=snap.allocation_key,
            instance_id=snap.snapshot_id,
            state="released",
            mount_roots=(),
            kind="instance",
        )
        record = Snapshot(allocation_key=snap.allocation_key, snapshot_id=snap.snapshot_id, source=source)
        session.attach(snapshot=record)
        try:
            if session.envelope.declares("deleteSnapshot"):
                await session.delete_snapshot(record)
            else:
                await session.compensate(snap.allocation_key)
        finally:
            store.end(lease)
        self.book.snapshot_deleted(ref, self.clock.now())

    def _session(self, adapter: Adapter, run_id: str, store: LeaseStore, lease: Lease) -> RunSession:
        return RunSession(
            provider=adapter.provider,
            envelope=adapter.envelope,
            journal=self.journal,
            leases=store,
            lease=lease,
            run_id=run_id,
            runner_tag=self.runner_tag,
            clock=self.clock,
            limits=self.limits,
            door=adapter.door,
            site=adapter.site or None,
        )

    async def _allocate(
        self,
        target: ExecutionTarget,
        profile: SandboxProfile,
        platform: Platform,
        *,
        ttl: float,
        detached: bool,
        needs: Needs,
        plans: Sequence[MountPlan],
        specs: Sequence[MountSpec],
        origin: str | None,
        make: Callable[[RunSession, str], Awaitable[Instance]],
        kind: RowKind = "instance",
        site: str | None = None,
    ) -> LiveSandbox:
        runner = self._runner()
        runner.leases.ttl = CREATE_HOLD
        if site:
            runner.registry = _only_site(self.registry, site)
        attempt = runner.start(target, profile, platform=platform, mount_count=len(plans), needs=needs)
        session = attempt.session
        sandbox_id = new_sandbox_id()
        now = self.clock.now()
        call = self.journal.call
        await call(
            self.book.insert,
            sandbox_id=sandbox_id,
            run_id=session.run_id,
            runner_tag=self.runner_tag,
            target=attempt.adapter.target.model_dump_json(),
            site=attempt.adapter.site or None,
            allocation_key="",
            instance_id=None,
            lease_id=session.lease.lease_id,
            owner=current_owner(),  # the making process holds it until it is live
            profile=profile.model_dump_json(),
            mounts=_mounts_json(plans, [p.target for p in plans], kind, specs),
            origin=origin,
            state="provisioning",
            created_at=now,
            expires_at=now + CREATE_HOLD,
        )
        status = "failed"
        try:
            image = (await session.materialize(profile, platform)).image
            inst = await make(session, image)
            await call(self.book.update, sandbox_id, allocation_key=inst.allocation_key)
            await session.activate(inst)
            until = self.clock.now() + ttl
            owner = detached_owner(sandbox_id) if detached else current_owner()
            await call(runner.leases.hand_over, session.lease, owner=owner, until=until, what=f"sandbox {sandbox_id}")
            await call(
                self.book.update,
                sandbox_id,
                allocation_key=inst.allocation_key,
                instance_id=inst.instance_id,
                state="live",
                owner=None if detached else owner,
                expires_at=until,
            )
            status = "live"
        except SandboxError as exc:
            # A refusal is a Run that never got a sandbox: nothing was journaled for the provider to make. Once
            # something was, the provider was at work, and the making failed.
            status = "failed" if session.core.rows else f"refused:{exc.code}"
            raise
        except asyncio.CancelledError:
            status = "interrupted"  # a signal, or the caller gave up: what was made is released below
            raise
        finally:
            if status != "live":
                await _wind_up(session, confirm=True)
                try:
                    await call(self.journal.finish_run, session.run_id, status=status, now=self.clock.now())
                    await call(runner.leases.end, session.lease)
                    await call(self.book.update, sandbox_id, state="failed", reason=status, ended_at=self.clock.now())
                except JournalError:
                    pass  # reconciliation settles the Run; its allocations were released above
        session.leases = SandboxLeases(self.journal, self.clock)
        rec = self.record(sandbox_id)
        return LiveSandbox(self, rec, session, inst)

    def attach(self, sandbox_id: str) -> LiveSandbox:
        """Drive an existing live sandbox from this process, under its lease.

        Raises:
            SandboxNotFound: no such sandbox, or it is no longer live (released or reclaimed).
            SandboxAdapterUnavailable: its provider is not loaded here.
        """
        rec = self.record(sandbox_id)
        if rec.state != "live" or rec.instance_id is None:
            why = rec.reason or rec.state
            raise SandboxNotFound(f"sandbox_id: sandbox {sandbox_id} is {rec.state} ({why})", field="sandbox_id")
        adapter = self._adapter(rec.target, rec.site)
        store = SandboxLeases(self.journal, self.clock)
        held = store.record(rec.lease_id)
        lease = Lease(lease_id=rec.lease_id, lease_epoch=held.epoch)
        session = self._session(adapter, rec.run_id, store, lease)
        inst = Instance(
            allocation_key=rec.allocation_key,
            instance_id=rec.instance_id,
            state="active",
            mount_roots=rec.mount_roots,
            kind=rec.kind,
            retention=rec.profile.retention_mode,
        )
        session.attach(instance=inst)
        return LiveSandbox(self, rec, session, inst)

    async def finish(self, rec: SandboxRecord, lease: Lease, *, status: str, state: SandboxState, reason: str) -> None:
        now = self.clock.now()
        call = self.journal.call
        await call(self.journal.finish_run, rec.run_id, status=status, now=now, summary={"sandbox": rec.sandbox_id})
        await call(LeaseStore(self.journal, self.clock).end, lease)
        await call(
            self.book.update, rec.sandbox_id, only_if=["live", "provisioning"], state=state, reason=reason, ended_at=now
        )


def _admit(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> None:
    """Refuse, before any provider work, a command the contract cannot carry (every problem at once).

    Raises:
        SandboxProfileInvalid: a bad argument or environment entry (``argv.N``, ``env.NAME``).
        SandboxPathRejected: ``cwd`` is not an absolute, normal path.
        SandboxBoundExceeded: too many or too long arguments or values.
    """
    from checkfu.core.admission import (  # noqa: PLC0415
        argv_problems,
        env_problems,
        raise_problems,
        sandbox_path_problems,
    )

    where = [] if cwd is None else sandbox_path_problems(cwd, "cwd", what="the working directory")
    raise_problems(argv_problems(argv) + env_problems(dict(env or {})) + where)


async def _again(specs: Sequence[MountSpec], plans: Sequence[MountPlan]) -> list[ResolvedMount]:
    """The mounts read again from where they were read, verified to be the very bytes staged the first time.

    Raises:
        SandboxDigestMismatch: a source changed since (naming the mount); nothing was allocated.
    """
    if len(specs) != len(plans):
        raise SandboxNotFound("mounts: where the mounts were read from is not recorded", field="mounts")
    return [await asyncio.to_thread(resolve_mount, s, expected=p) for s, p in zip(specs, plans, strict=True)]


def _needs(plans: Sequence[MountPlan]) -> Needs:
    return Needs(writable_mounts=any(p.writable for p in plans), mount_symlinks=any(p.has_symlinks for p in plans))


def _platform() -> Platform:
    from checkfu.core.job import host_platform_value  # noqa: PLC0415 - job imports this module's peers

    return host_platform_value()


def _only_site(registry: Registry, site: str) -> Registry:
    """``registry`` narrowed to the adapters at ``site`` (a clone or resume lands where its source is)."""
    narrowed = Registry()
    for a in registry.adapters:
        if a.site == site:
            narrowed.add(a)
    return narrowed


async def _wind_up(session: RunSession, *, confirm: bool = False) -> None:
    task = asyncio.ensure_future(session.release_all(confirm=confirm))
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue
    task.result()


def due_for_sweep(journal: Journal, runner_tag: str, clock: Clock | None = None) -> list[SandboxRecord]:
    """The live sandboxes of ``runner_tag`` that a sweep would reclaim now: one query, no provider call."""
    clock = clock or SystemClock()
    now = clock.now()
    store = LeaseStore(journal, clock)
    out = []
    for rec in SandboxBook(journal).due(runner_tag, now):
        if rec.state == "provisioning":
            if store.reclaimable(rec.lease_id):
                out.append(rec)
        elif rec.orphaned(now) is not None or store.reclaimable(rec.lease_id):
            out.append(rec)
    return out


async def sweep(
    journal: Journal,
    runner_tag: str,
    registry_for: Callable[[set[Wanted]], Awaitable[Registry]],
    clock: Clock | None = None,
) -> list[Reclaimed]:
    """Reclaim every sandbox of ``runner_tag`` whose time-to-live passed or whose owner is gone.

    ``registry_for`` loads the adapters of the named providers at the named sites (a provider service's site is its
    endpoint: ``checkfu.control.endpoints.reach``); it is called only when something is due.
    Each due sandbox's lease is taken over (a compare-and-set: a holder that extended it meanwhile keeps
    it), its instance compensated by allocation key, its row and Run settled. A compensation that fails
    leaves it open, reported with the error, for the next pass.
    """
    clock = clock or SystemClock()
    due = due_for_sweep(journal, runner_tag, clock)
    if not due:
        return []
    registry = await registry_for({(r.provider, r.site or None) for r in due})
    book = SandboxBook(journal)
    store = LeaseStore(journal, clock)
    out: list[Reclaimed] = []
    for rec in due:
        now = clock.now()
        why = rec.orphaned(now)
        reason = "expired" if why == "its time-to-live passed" else "orphaned" if why else "ended"
        try:
            lease = await journal.call(store.takeover, rec.lease_id, only_if_reclaimable=True, ttl=300)
        except (SandboxLeaseFenced, SandboxNotFound):
            continue  # its holder extended it meanwhile: not ours to take
        try:
            for row in await journal.call(journal.open_allocations, run_id=rec.run_id):
                if row.kind == "snapshot" and row.state == "live":
                    continue  # a snapshot outlives its sandbox
                adapter = _find(registry, row.target, row.site)
                if adapter is None:  # it cannot be asked (never taken for gone): the next pass tries again
                    where = f" at {row.site}" if row.site else ""
                    why = registry.unavailable.get(row.site or "") or "not available here"
                    raise SandboxAdapterUnavailable(f"provider {row.target.provider}{where}: {why}", field="provider")
                try:
                    await adapter.door.call(
                        compensate_plan(adapter.target, lease, row.allocation_key, runner_tag),
                        run_id=rec.run_id,
                        recorder=journal,
                    )
                except ProviderFault as fault:
                    raise fault.error from None
                await journal.call(
                    journal.set_allocation, row.allocation_key, row_transition(row.state, "compensate"), now=clock.now()
                )
        except SandboxError as exc:
            await journal.call(store.end, lease)
            out.append(Reclaimed(rec.sandbox_id, rec.run_id, reason, f"{exc.code}: {exc.message}"))
            continue
        status = "expired" if reason == "expired" else "abandoned"
        said = {
            "expired": "its time-to-live passed",
            "orphaned": "its owner process is gone",
            "ended": "its lease ended",
        }[reason]
        await journal.call(
            journal.finish_run,
            rec.run_id,
            status=status,
            now=clock.now(),
            summary={"sandbox": rec.sandbox_id, "settled_by": "sandbox sweep", "reason": said},
        )
        await journal.call(store.end, lease)
        await journal.call(
            book.update,
            rec.sandbox_id,
            only_if=["live", "provisioning"],
            state="reclaimed",
            reason=reason,
            ended_at=clock.now(),
        )
        out.append(Reclaimed(rec.sandbox_id, rec.run_id, reason))
    return out


@dataclass(frozen=True)
class CutShort:
    """A snapshot whose command died while it was being taken, settled by ``settle_cut_short``."""

    snapshot_ref: str
    sandbox_id: str
    allocation_key: str
    error: str | None = None
    """Set when its compensation failed: it stays ``pending`` for the next pass."""


def cut_short(journal: Journal, runner_tag: str) -> list[SnapshotRecord]:
    """``runner_tag``'s snapshots still ``pending`` whose process is gone (on this host): cut short mid-way."""
    return [
        snap
        for snap in SandboxBook(journal).pending_snapshots(runner_tag)
        if snap.owner is None or owner_alive(snap.owner) is False
    ]


async def settle_cut_short(
    journal: Journal,
    runner_tag: str,
    registry_for: Callable[[set[Wanted]], Awaitable[Registry]],
    clock: Clock | None = None,
) -> list[CutShort]:
    """Undo every snapshot of ``runner_tag`` whose command died while it was being taken: its allocation is
    compensated by key (the provider removes what it made of it, and thaws a source its capture left paused), its
    row settled, the snapshot recorded ``failed``. Its sandbox is left as it is: it lives on. A compensation that
    fails leaves it ``pending``, reported with the error, for the next pass."""
    clock = clock or SystemClock()
    due = cut_short(journal, runner_tag)
    if not due:
        return []
    registry = await registry_for({(s.target.provider, s.site or None) for s in due})
    book = SandboxBook(journal)
    store = LeaseStore(journal, clock, ttl=300)
    out: list[CutShort] = []
    for snap in due:
        try:
            row = await journal.call(journal.allocation, snap.allocation_key) if snap.allocation_key else None
            if row is not None and row.state in OPEN_STATES:
                adapter = _find(registry, snap.target, snap.site)
                if adapter is None:
                    where = f" at {snap.site}" if snap.site else ""
                    why = registry.unavailable.get(snap.site or "") or "not available here"
                    raise SandboxAdapterUnavailable(f"provider {snap.target.provider}{where}: {why}", field="provider")
                # a lease of its own: the sandbox's is its holder's, and taking it over would fence them
                lease = await journal.call(store.acquire, snap.run_id)
                try:
                    await adapter.door.call(
                        compensate_plan(adapter.target, lease, snap.allocation_key, runner_tag),
                        run_id=snap.run_id,
                        recorder=journal,
                    )
                except ProviderFault as fault:
                    raise fault.error from None
                finally:
                    await journal.call(store.end, lease)
                await journal.call(
                    journal.set_allocation, row.allocation_key, row_transition(row.state, "compensate"), now=clock.now()
                )
        except SandboxError as exc:
            out.append(CutShort(snap.snapshot_ref, snap.sandbox_id, snap.allocation_key, f"{exc.code}: {exc.message}"))
            continue
        await journal.call(
            book.update_snapshot, snap.snapshot_ref, only_if=["pending"], state="failed", deleted_at=clock.now()
        )
        out.append(CutShort(snap.snapshot_ref, snap.sandbox_id, snap.allocation_key))
    return out


def _find(registry: Registry, target: ExecutionTarget, site: str | None) -> Adapter | None:
    for a in registry.adapters:
        if target_key(a.target) == target_key(target) and a.site == (site or ""):
            return a
    return None
