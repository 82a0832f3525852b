"""Orphan reconciliation: settle every open allocation nobody is coming back for.

An open allocation (journaled ``pending`` or ``live``) is reclaimable when its
lease ended or expired or its owner process is gone. Reconciliation takes the
lease over (bumping its epoch, so a straggling owner is fenced), compensates by
allocation key, and settles the row. For providers that enumerate allocations,
anything carrying this runner's tag that the journal does not hold as live under
a current lease is compensated too. A settled snapshot is kept: it is the Session's
checkpoint and outlives the Run; ``deleteSnapshot`` is what ends it. A second pass
finds nothing to do.

Safe with several runners on one journal: only a lease that ended, expired or whose owner
is gone is taken over, with a compare-and-set on its epoch, so a live runner's allocations
are never touched. With several sites (a Docker engine each), each allocation is
compensated at the site it was journaled at, each site is enumerated on its own, and a
site that cannot be reached is reported as a failure: never taken for empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from checkfu.contract.errors import SandboxError, SandboxLeaseFenced
from checkfu.contract.lifecycle import row_transition
from checkfu.contract.target import Lease
from checkfu.runner.clock import Clock
from checkfu.runner.door import ProviderFault
from checkfu.runner.journal import AllocationRow, Journal
from checkfu.runner.leases import LeaseStore
from checkfu.runner.registry import Adapter, Registry, target_key
from checkfu.runner.session import compensate_plan, list_allocations_plan


@dataclass
class ReconcileReport:
    compensated: list[str] = field(default_factory=list)
    enumerated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def nothing_to_do(self) -> bool:
        return not (self.compensated or self.enumerated or self.failed)


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


def _settle(journal: Journal, row: AllocationRow | None, clock: Clock) -> None:
    if row is not None:
        journal.set_allocation(row.allocation_key, row_transition(row.state, "compensate"), now=clock.now())


async def reconcile(journal: Journal, registry: Registry, clock: Clock, *, runner_tag: str) -> ReconcileReport:
    """Compensate every reclaimable open allocation of ``runner_tag``, then every enumerated stray.

    Every provider call is recorded in the journal: a compensation as an event of the Run
    whose allocation it reclaims, an enumeration as an event of no Run.
    """
    leases = LeaseStore(journal, clock)
    report = ReconcileReport()
    taken: dict[str, Lease] = {}
    live_keys: set[str] = set()
    adapters = {(target_key(a.target), a.site): a for a in registry.adapters}
    for row in journal.open_allocations(runner_tag=runner_tag):
        if row.kind == "snapshot" and row.state == "live":
            live_keys.add(row.allocation_key)  # a settled snapshot belongs to the Session, not the Run
            continue
        if row.lease_id not in taken and not leases.reclaimable(row.lease_id):  # taken: reclaimed by this pass
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
                where = f" at site {row.site}" if row.site else ""
                report.skipped[row.allocation_key] = f"no adapter for {row.target}{where} is loaded"
            continue
        try:
            lease = taken.get(row.lease_id) or leases.takeover(row.lease_id, only_if_reclaimable=True)
            taken[row.lease_id] = lease
            await _compensate(adapter, journal, lease, row.allocation_key, runner_tag, row.run_id)
        except SandboxLeaseFenced as exc:
            report.skipped[row.allocation_key] = exc.message
            continue
        except SandboxError as exc:
            report.failed[row.allocation_key] = f"{exc.code}: {exc.message}"
            continue
        _settle(journal, row, clock)
        report.compensated.append(row.allocation_key)
    for lease in taken.values():
        leases.end(lease)
    await _sweep_enumerated(journal, registry, leases, runner_tag, live_keys, report)
    return report


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
        lease = leases.acquire(f"reconcile-{runner_tag}", ttl=300)
        try:
            try:
                listing = (
                    await adapter.door.call(list_allocations_plan(adapter.target, lease, runner_tag), recorder=journal)
                ).value
            except ProviderFault as fault:
                raise fault.error from None
            strays = sorted({a.allocation_key for a in listing.allocations} - live_keys)
            for key in strays:
                row = journal.allocation(key)
                # Journaled after this pass read the journal (a Run started meanwhile), or a settled
                # snapshot: only an open row whose lease is reclaimable may be taken from its holder.
                if (
                    row is not None
                    and row.state in ("pending", "live")
                    and ((row.kind == "snapshot" and row.state == "live") or not leases.reclaimable(row.lease_id))
                ):
                    continue
                try:
                    await _compensate(adapter, journal, lease, key, runner_tag, row.run_id if row else None)
                except SandboxError as exc:
                    report.failed[key] = f"{exc.code}: {exc.message}"
                    continue
                _settle(journal, row, leases.clock)
                report.enumerated.append(key)
        except SandboxError as exc:
            where = f" at {adapter.site}" if adapter.site else ""
            report.failed[f"listAllocations {adapter.target}{where}"] = f"{exc.code}: {exc.message}"
        finally:
            leases.end(lease)
