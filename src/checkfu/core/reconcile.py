"""Orphan reconciliation: settle every open allocation nobody is coming back for, then the Runs they belonged to.

An open allocation (journaled ``pending`` or ``live``) is reclaimable when its
lease ended or expired or its owner process is gone. Reconciliation takes the
lease over (bumping its epoch, so a straggling owner is fenced), compensates by
allocation key, and settles the row. A settled snapshot is kept: it is the Session's
checkpoint and outlives the Run; ``deleteSnapshot`` is what ends it.

For providers that enumerate allocations, what the provider holds under this runner's
tag is swept too, but only what this journal can account for: a key this journal
recorded and has settled (the provider kept what it was told to give up), or whose
open row is reclaimable. A key the journal never recorded belongs to someone else (a
runner on another journal that shares the tag) and is reported as ``unaccounted``,
never taken.

A Run still recorded ``running`` whose lease is reclaimable and whose allocations are
all settled is settled as ``abandoned``, unless it is a queued Run: those belong to the
fleet, whose runners take them over and run them again. A second pass finds nothing to do.

Orphans: a Run started in place records its owner process (``runs.owner``). Once that
process is gone (``leases.owner_gone``) the Run is an orphan; ``reap_orphans`` reclaims
what it holds, by allocation key through the same takeover and compensation, and settles
it as ``orphaned`` (so does a full reconciliation). Finding orphans is one indexed query
(``orphans``), cheap enough for every command that opens the journal to do it first.

Safe with several runners on one journal: only a lease that ended, expired or whose owner
is gone is taken over, with a compare-and-set on its epoch, so a live runner's allocations
are never touched. With several sites (a Docker engine each), each allocation is
compensated at the site it was journaled at, each site is enumerated on its own, and a
site that cannot be reached is reported as a failure: never taken for empty.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from checkfu.contract.errors import SandboxError, SandboxLeaseFenced
from checkfu.contract.lifecycle import row_transition
from checkfu.contract.target import Lease
from checkfu.core.clock import Clock
from checkfu.core.door import ProviderFault
from checkfu.core.journal import AllocationRow, Journal, OwnedRun, RunRow
from checkfu.core.leases import LeaseStore, owner_gone
from checkfu.core.registry import Adapter, Registry, target_key
from checkfu.core.session import compensate_plan, list_allocations_plan

START_GRACE = 60.0
"""A Run recorded without a lease yet is left alone this long: its runner takes the lease right after."""


@dataclass
class ReconcileReport:
    compensated: list[str] = field(default_factory=list)
    """Open rows of this journal, compensated by key and settled."""
    enumerated: list[str] = field(default_factory=list)
    """Keys the provider still held that this journal accounts for, compensated."""
    failed: dict[str, str] = field(default_factory=dict)
    """Compensation was asked for and failed: still held, still open."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Not attempted (no adapter for it is loaded, or its provider is unavailable): still open."""
    unaccounted: list[str] = field(default_factory=list)
    """Held under this runner's tag, but never recorded in this journal: another journal's, left alone."""
    settled_runs: list[str] = field(default_factory=list)
    """Runs whose runner stopped, now settled as ``abandoned``."""
    unsettled_runs: list[str] = field(default_factory=list)
    """Runs whose runner stopped but that still hold something this pass could not settle."""
    other_tags: dict[str, int] = field(default_factory=dict)
    """Open allocations of this journal recorded under another runner tag whose lease is gone, by tag: this
    pass (this runner's tag) left them; a reconciliation as that runner takes them."""

    @property
    def nothing_to_do(self) -> bool:
        return not (self.compensated or self.enumerated or self.failed or self.skipped or self.settled_runs)

    @property
    def left(self) -> dict[str, str]:
        """Everything this pass could not settle, with why: what a person must still finish."""
        return {**self.failed, **self.skipped}


async def _compensate(
    adapter: Adapter, journal: Journal, lease: Lease, key: str, runner_tag: str, run_id: str | None
) -> None:
    """Compensate ``key`` through the adapter's door, recorded as an event of ``run_id``.

    Raises:
        SandboxError: the provider was at fault, or the call was refused.
    """
    try:
        await adapter.door.call(
            compensate_plan(adapter.target, lease, key, runner_tag), run_id=run_id, recorder=journal
        )
    except ProviderFault as fault:
        raise fault.error from None


async def _settle(journal: Journal, row: AllocationRow, clock: Clock) -> None:
    await journal.call(
        journal.set_allocation, row.allocation_key, row_transition(row.state, "compensate"), now=clock.now()
    )


async def _take_over(journal: Journal, leases: LeaseStore, lease_id: str) -> Lease:
    """Raises SandboxLeaseFenced: its holder renewed meanwhile, or another reconciler took it first."""
    lease: Lease = await journal.call(leases.takeover, lease_id, only_if_reclaimable=True)
    return lease


async def reconcile(journal: Journal, registry: Registry, clock: Clock, *, runner_tag: str) -> ReconcileReport:
    """Compensate every reclaimable open allocation of ``runner_tag``, then every stray this journal accounts
    for, then settle every abandoned Run.

    Every provider call is recorded in the journal: a compensation as an event of the Run
    whose allocation it reclaims, an enumeration as an event of no Run.
    """
    leases = LeaseStore(journal, clock)
    report = ReconcileReport()
    taken: dict[str, Lease] = {}
    live_keys: set[str] = set()
    adapters = {(target_key(a.target), a.site): a for a in registry.adapters}
    for row in await journal.call(journal.open_allocations, runner_tag=runner_tag):
        if row.kind == "snapshot" and row.state == "live":
            live_keys.add(row.allocation_key)  # a settled snapshot belongs to the Session, not the Run
            continue
        # taken: reclaimed by this pass
        if row.lease_id not in taken and not await journal.call(leases.reclaimable, row.lease_id):
            live_keys.add(row.allocation_key)
            continue
        adapter = adapters.get((target_key(row.target), row.site or ""))
        if adapter is None:
            down = registry.down_sites.get(row.site or "")
            if down is not None:
                report.failed[row.allocation_key] = (
                    f"site {row.site} cannot be reached ({down}): left for a reconciliation once it is back"
                )
            else:
                report.skipped[row.allocation_key] = _unreachable(registry, row)
            continue
        try:
            lease = taken.get(row.lease_id) or await _take_over(journal, leases, row.lease_id)
        except SandboxLeaseFenced:
            live_keys.add(row.allocation_key)  # its owner renewed meanwhile: a live Run's, not ours to take
            continue
        taken[row.lease_id] = lease
        try:  # a fence here is the provider's answer (another lease echoed), not the owner: a failure
            await _compensate(adapter, journal, lease, row.allocation_key, runner_tag, row.run_id)
        except SandboxError as exc:
            report.failed[row.allocation_key] = f"{exc.code}: {exc.message}"
            continue
        await _settle(journal, row, clock)
        report.compensated.append(row.allocation_key)
    for lease in taken.values():
        await journal.call(leases.end, lease)
    await _sweep_enumerated(journal, registry, leases, runner_tag, live_keys, report)
    # each a run of short reads and writes with no provider call among them: made in one go (off the event loop
    # when the journal is offloaded)
    await journal.work(_settle_runs, journal, leases, clock, runner_tag, report)
    await journal.work(_note_other_tags, journal, leases, runner_tag, report)
    return report


def _note_other_tags(journal: Journal, leases: LeaseStore, runner_tag: str, report: ReconcileReport) -> None:
    """Count what this journal holds under another tag whose runner is gone, so that it is never passed over in
    silence; a fleet's queued Run (``attempt`` > 0) is left out: another runner of the fleet takes it over."""
    for row in journal.open_allocations():
        if row.runner_tag == runner_tag or (row.kind == "snapshot" and row.state == "live"):
            continue
        if not leases.reclaimable(row.lease_id):
            continue
        run = journal.run(row.run_id) if row.run_id else None
        if run is not None and run.attempt > 0:
            continue
        report.other_tags[row.runner_tag] = report.other_tags.get(row.runner_tag, 0) + 1


def _unreachable(registry: Registry, row: AllocationRow) -> str:
    """Why ``row``'s provider cannot be asked, in words a person can act on."""
    if row.site and row.site in registry.unavailable:  # a provider service, by its endpoint
        return f"its provider service at {row.site} is unavailable: {registry.unavailable[row.site]}"
    reasons = [why for source, why in registry.unavailable.items() if source.split()[-1] == row.target.provider]
    if reasons:
        return f"its provider {row.target.provider} is unavailable: {'; '.join(reasons)}"
    where = f" at site {row.site}" if row.site else ""
    return f"no adapter for {row.target}{where} is loaded"


def _settle_runs(journal: Journal, leases: LeaseStore, clock: Clock, runner_tag: str, report: ReconcileReport) -> None:
    """Settle as ``abandoned`` each ``running`` Run whose runner is gone and which holds nothing unsettled."""
    for run in journal.unsettled_runs(runner_tag=runner_tag):
        lease_ids = journal.lease_ids_for_run(run.run_id)
        if not lease_ids and run.created_at > clock.now() - START_GRACE:
            continue  # journaled an instant ago: its runner is taking its lease right now
        if not all(leases.reclaimable(lease_id) for lease_id in lease_ids):
            continue  # its runner is alive (or may be, on another host): not abandoned
        rows = journal.allocations_for_run(run.run_id)
        held = [r for r in rows if r.state in ("pending", "live") and not (r.kind == "snapshot" and r.state == "live")]
        if held:
            report.unsettled_runs.append(run.run_id)
            continue
        if run.owner is not None and owner_gone(run.owner, run.owner_boot):
            summary = orphan_summary(run.owner, rows, reaper="checkfu runner reconcile")
            if journal.settle_orphaned_run(run.run_id, now=clock.now(), summary=summary):
                report.settled_runs.append(run.run_id)
            continue
        summary = {
            "settled_by": "reconciliation",
            "reason": "its runner stopped before finishing (killed, crashed or cut off); everything it held is settled",
            "allocations": {r.allocation_key: r.state for r in rows},
        }
        if journal.settle_abandoned_run(run.run_id, now=clock.now(), summary=summary):
            report.settled_runs.append(run.run_id)


async def _sweep_enumerated(
    journal: Journal,
    registry: Registry,
    leases: LeaseStore,
    runner_tag: str,
    live_keys: set[str],
    report: ReconcileReport,
) -> None:
    for site, why in registry.down_sites.items():
        report.failed[f"listAllocations at {site}"] = f"site {site} cannot be reached, so it was not enumerated: {why}"
    for adapter in registry.adapters:
        env = adapter.envelope
        if not (env.lifecycle_assurances.enumerates_allocations and env.declares("listAllocations")):
            continue
        lease = await journal.call(leases.acquire, f"reconcile-{runner_tag}", ttl=300)
        try:
            try:
                listing = (
                    await adapter.door.call(list_allocations_plan(adapter.target, lease, runner_tag), recorder=journal)
                ).value
            except ProviderFault as fault:
                raise fault.error from None
            strays = sorted({a.allocation_key for a in listing.allocations} - live_keys)
            for key in strays:
                row = await journal.call(journal.allocation, key)
                if row is None:
                    # Never recorded here: journaled before any provider is asked, so it is another journal's.
                    report.unaccounted.append(key)
                    continue
                # Journaled after this pass read the journal (a Run started meanwhile), or a settled
                # snapshot: only an open row whose lease is reclaimable may be taken from its holder.
                if row.state in ("pending", "live") and (
                    (row.kind == "snapshot" and row.state == "live")
                    or not await journal.call(leases.reclaimable, row.lease_id)
                ):
                    continue
                try:
                    await _compensate(adapter, journal, lease, key, runner_tag, row.run_id)
                except SandboxError as exc:
                    report.failed[key] = f"{exc.code}: {exc.message}"
                    continue
                await _settle(journal, row, leases.clock)
                report.enumerated.append(key)
        except SandboxError as exc:
            where = f" at {adapter.site}" if adapter.site else ""
            report.failed[f"listAllocations {adapter.target}{where}"] = f"{exc.code}: {exc.message}"
        finally:
            await journal.call(leases.end, lease)


# orphans ------------------------------------------------------------------------------------------


def orphans(journal: Journal, *, runner_tag: str | None = None) -> list[OwnedRun]:
    """The Runs (of ``runner_tag`` when given) still recorded ``running`` whose owner process is surely gone (on
    this host: another boot, or no such process now). One query by the ``status`` index, then a look at ``/proc``
    per Run still running. Another tag's Runs are that runner's to reap, as reconcile leaves them (``other_tags``):
    a shared journal seen from another pid namespace under the same host name would misjudge its owners."""
    return [r for r in journal.owned_running_runs(runner_tag=runner_tag) if owner_gone(r.owner, r.owner_boot)]


def run_status(row: RunRow) -> str:
    """A Run's status as it stands: ``orphaned`` for one still recorded ``running`` whose owner process is gone
    (not reaped yet: its provider could not be reached), so a dead owner's Run is never shown ``running``."""
    if row.status == "running" and row.owner is not None and owner_gone(row.owner, row.owner_boot):
        return "orphaned"
    return row.status


def describe_owner(owner: str) -> str:
    """``host/pid/start`` as a person reads it: ``pid 123 on host``."""
    host, _, _start = owner.rpartition("/")
    host, _, pid = host.rpartition("/")
    return f"pid {pid} on {host}" if host else owner


def orphan_summary(owner: str, rows: Sequence[AllocationRow], *, reaper: str) -> dict[str, Any]:
    """The summary of a Run reaped as an orphan: whose it was, who reaped it, what its allocations ended as."""
    return {
        "settled_by": "orphan reaper",
        "reaped_as_orphan": True,
        "owner": owner,
        "reaped_by": f"{reaper} (pid {os.getpid()} on {socket.gethostname()})",
        "reason": f"its owner process ({describe_owner(owner)}) is gone: reaped as an orphan, everything it held "
        "is released",
        "allocations": {r.allocation_key: r.state for r in rows},
    }


@dataclass
class ReapReport:
    reaped: list[str] = field(default_factory=list)
    """Orphaned Runs now settled as ``orphaned``."""
    released: list[str] = field(default_factory=list)
    """Their allocations, compensated by key and settled."""
    left: dict[str, str] = field(default_factory=dict)
    """Allocations still held, by key, with why (their Runs stay orphaned until a later pass)."""
    pending: list[str] = field(default_factory=list)
    """Orphaned Runs not settled because something of theirs is still held."""


async def reap_orphans(
    journal: Journal, registry: Registry, clock: Clock, runs: Sequence[OwnedRun], *, reaper: str
) -> ReapReport:
    """Reclaim everything each orphaned Run of ``runs`` holds and settle it as ``orphaned``.

    Each open allocation is taken over (only while its lease's owner is gone or it lapsed: a compare-and-set,
    so of reapers racing exactly one compensates), compensated by key through its adapter's door, and settled.
    A Run that still holds something (its provider cannot be reached) stays as it is, orphaned, for the next
    pass; a settled snapshot is the Session's and is kept.
    """
    leases = LeaseStore(journal, clock)
    report = ReapReport()
    adapters = {(target_key(a.target), a.site): a for a in registry.adapters}
    for run in runs:
        taken: dict[str, Lease] = {}
        held = False
        for row in await journal.call(journal.open_allocations, run_id=run.run_id):
            if row.kind == "snapshot" and row.state == "live":
                continue
            adapter = adapters.get((target_key(row.target), row.site or ""))
            if adapter is None:
                report.left[row.allocation_key] = _unreachable(registry, row)
                held = True
                continue
            try:
                lease = taken.get(row.lease_id) or await _take_over(journal, leases, row.lease_id)
            except SandboxLeaseFenced:
                held = True  # another reaper took it first: it settles the Run
                continue
            taken[row.lease_id] = lease
            try:  # a fence here is the provider's answer (another lease echoed): a failure, reported
                await _compensate(adapter, journal, lease, row.allocation_key, row.runner_tag, run.run_id)
            except SandboxError as exc:
                report.left[row.allocation_key] = f"{exc.code}: {exc.message}"
                held = True
                continue
            await _settle(journal, row, clock)
            report.released.append(row.allocation_key)
        for lease in taken.values():
            await journal.call(leases.end, lease)
        if held:
            report.pending.append(run.run_id)
            continue
        rows = await journal.call(journal.allocations_for_run, run.run_id)
        summary = orphan_summary(run.owner, rows, reaper=reaper)
        if await journal.call(journal.settle_orphaned_run, run.run_id, now=clock.now(), summary=summary):
            report.reaped.append(run.run_id)
    return report
