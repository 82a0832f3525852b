"""Snapshots that expire: the runner's part.

A snapshot asked with a lifetime (``SnapshotRequest.keep_seconds``) comes back with the
provider's ``expires_at``; the runner checks it (never past, never later than asked) and
journals it on the snapshot's row. Whoever holds the snapshot's bytes deletes it once that
passes:

- runner custody (``snapshot_custody: runner``): the runner, through ``deleteSnapshot``,
  here. The Docker tier keeps its snapshots on the runner host's engine, so this is its
  case; it also deletes expired snapshots itself, so either gets there first and the other
  finds nothing (``deleteSnapshot`` is idempotent).
- provider custody: the provider, on its own; the runner only settles its row (``released``)
  and records why. A provider that kept the bytes anyway is found by reconciliation's
  enumeration, which compensates a key the journal has settled.

``sweep_expired_snapshots`` is the one entry point. It starts with one indexed read of the
journal and returns at once when nothing has expired, so every journal-opening command can
call it. A snapshot whose provider cannot be reached now stays ``live`` and is tried again
at the next sweep.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from checkfu.contract.checks import check_echo, check_equal
from checkfu.contract.codec import build, revalidate
from checkfu.contract.errors import SandboxError, SandboxNotFound
from checkfu.contract.lifecycle import row_transition
from checkfu.contract.members import DeleteSnapshotRequest, DeleteSnapshotResult
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.core.clock import Clock
from checkfu.core.door import CallRecord, ProviderFault
from checkfu.core.journal import AllocationRow, Journal
from checkfu.core.leases import LeaseStore
from checkfu.core.registry import Registry, target_key
from checkfu.core.session import Accepted, Limits, Plan


@dataclass
class ExpiryReport:
    deleted: list[str] = field(default_factory=list)
    """Runner custody: snapshot keys deleted through ``deleteSnapshot`` (or found gone already), rows settled."""
    settled: list[str] = field(default_factory=list)
    """Provider custody: snapshot keys the provider deletes itself; only their rows were settled."""
    failed: dict[str, str] = field(default_factory=dict)
    """``deleteSnapshot`` was asked and failed: still ``live``, tried again at the next sweep."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Not attempted (no adapter for it is loaded): still ``live``."""

    @property
    def nothing_to_do(self) -> bool:
        return not (self.deleted or self.settled or self.failed or self.skipped)


def delete_snapshot_plan(
    target: ExecutionTarget, lease: Lease, key: str, snapshot_id: str, limits: Limits | None = None
) -> Plan[DeleteSnapshotResult]:
    """``deleteSnapshot`` of a journaled snapshot, checked like any other answer: it echoes the target, the
    lease, the snapshot's key and id."""
    req = build(DeleteSnapshotRequest, target=target, lease=lease, snapshot_allocation_key=key, snapshot_id=snapshot_id)

    def accept(raw: object) -> Accepted[DeleteSnapshotResult]:
        res = revalidate(DeleteSnapshotResult, raw)
        check_echo(res, target=target, lease=lease)
        check_equal("snapshot_allocation_key", res.snapshot_allocation_key, key)
        check_equal("snapshot_id", res.snapshot_id, snapshot_id)
        return Accepted(res)

    deadline = (limits or Limits()).deadline("deleteSnapshot")
    return Plan(member="deleteSnapshot", request=req, deadline=deadline, accept=accept, allocation_key=key)


async def sweep_expired_snapshots(
    journal: Journal,
    registry: Registry | Callable[[list[AllocationRow]], Awaitable[Registry]],
    clock: Clock,
    *,
    runner_tag: str,
) -> ExpiryReport:
    """Delete (runner custody) or settle (provider custody) every snapshot of ``runner_tag`` whose journaled
    ``expires_at`` has passed.

    ``registry`` is the adapters to use, or a coroutine function that loads them for the expired rows it is
    given: it is called only when something has expired, so a sweep that finds nothing costs one indexed read.
    Every ``deleteSnapshot`` is recorded as an event of the Run that took the snapshot.
    """
    report = ExpiryReport()
    rows = await journal.call(journal.expired_snapshots, now=clock.now(), runner_tag=runner_tag)
    if not rows:
        return report
    if not isinstance(registry, Registry):
        registry = await registry(rows)
    adapters = {(target_key(a.target), a.site): a for a in registry.adapters}
    leases = LeaseStore(journal, clock)
    lease: Lease | None = None
    try:
        for row in rows:
            adapter = adapters.get((target_key(row.target), row.site or ""))
            if adapter is None:
                why = registry.unavailable.get(row.site or "")
                report.skipped[row.allocation_key] = (
                    f"{row.target} at {row.site}: {why}"
                    if why
                    else f"no adapter for {row.target} is loaded: it expires once one is"
                )
                continue
            if adapter.envelope.snapshot_custody == "provider":
                await journal.call(
                    journal.set_allocation, row.allocation_key, row_transition(row.state, "release"), now=clock.now()
                )
                await journal.record_call_async(
                    CallRecord(
                        row.run_id,
                        "deleteSnapshot",
                        row.allocation_key,
                        clock.now(),
                        0.0,
                        "ok",
                        None,
                        "expired: in the provider's custody, the provider deletes it; the runner settled its row",
                    )
                )
                report.settled.append(row.allocation_key)
                continue
            if lease is None:
                lease = await journal.call(leases.acquire, f"expire-{runner_tag}", ttl=300)
            try:
                await _delete(adapter.door.call, row, lease, journal)
            except SandboxNotFound:
                pass  # gone already (the provider's own sweep, or a deleteSnapshot elsewhere): nothing is held
            except SandboxError as exc:
                report.failed[row.allocation_key] = f"{exc.code}: {exc.message}"
                continue
            await journal.call(
                journal.set_allocation, row.allocation_key, row_transition(row.state, "release"), now=clock.now()
            )
            report.deleted.append(row.allocation_key)
    finally:
        if lease is not None:
            await journal.call(leases.end, lease)
    return report


async def _delete(
    call: Callable[..., Awaitable[Accepted[DeleteSnapshotResult]]], row: AllocationRow, lease: Lease, journal: Journal
) -> None:
    """Raises SandboxError: the provider failed, or answered out of contract."""
    if row.object_id is None:
        raise SandboxNotFound(f"{row.allocation_key}: no snapshot id was journaled", field="snapshot_id")
    try:
        await call(
            delete_snapshot_plan(row.target, lease, row.allocation_key, row.object_id),
            run_id=row.run_id,
            recorder=journal,
        )
    except ProviderFault as fault:
        if getattr(fault.error, "reported_code", None) == SandboxNotFound.code:
            raise SandboxNotFound(fault.error.message, field="snapshot_id") from None
        raise fault.error from None
