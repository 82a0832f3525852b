"""Orphan reconciliation: settle every open allocation nobody is coming back for.

An open allocation (journaled ``pending`` or ``live``) is reclaimable when its
lease ended or expired or its owner process is gone. Reconciliation takes the
lease over (bumping its epoch, so a straggling owner is fenced), compensates by
allocation key, and settles the row. For providers that enumerate allocations,
anything carrying this runner's tag that the journal does not hold as live under
a current lease is compensated too. A settled snapshot is kept: it is the Session's
checkpoint and outlives the Run; ``deleteSnapshot`` is what ends it. A second pass
finds nothing to do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from checkfu.contract.checks import check_echo
from checkfu.contract.codec import build, revalidate
from checkfu.contract.envelope import Member
from checkfu.contract.errors import SandboxError, SandboxLeaseFenced, SandboxProviderTimeout
from checkfu.contract.members import (
    CompensateRequest,
    CompensateResult,
    ListAllocationsRequest,
    ListAllocationsResult,
)
from checkfu.contract.target import Lease
from checkfu.runner.clock import Clock
from checkfu.runner.deadlines import DEFAULT_DEADLINES
from checkfu.runner.journal import Journal
from checkfu.runner.leases import LeaseStore
from checkfu.runner.registry import Adapter, Registry, target_key

T = TypeVar("T")


@dataclass
class ReconcileReport:
    compensated: list[str] = field(default_factory=list)
    enumerated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def nothing_to_do(self) -> bool:
        return not (self.compensated or self.enumerated or self.failed)


async def _bounded(member: Member, call: Awaitable[T]) -> T:
    """``call`` under the member's deadline; a hung provider cannot hang reconciliation."""
    deadline = DEFAULT_DEADLINES[member]
    try:
        return await asyncio.wait_for(call, timeout=deadline)
    except TimeoutError:
        raise SandboxProviderTimeout(f"{member}: no answer within {deadline:g} s", field=member) from None


async def _compensate(adapter: Adapter, lease: Lease, key: str, runner_tag: str) -> None:
    req = build(CompensateRequest, target=adapter.target, lease=lease, allocation_key=key, runner_tag=runner_tag)
    res = revalidate(CompensateResult, await _bounded("compensate", adapter.provider.compensate(req)))
    check_echo(res, target=adapter.target, lease=lease, allocation_key=key)


async def reconcile(journal: Journal, registry: Registry, clock: Clock, *, runner_tag: str) -> ReconcileReport:
    """Compensate every reclaimable open allocation of ``runner_tag``, then every enumerated stray."""
    leases = LeaseStore(journal, clock)
    report = ReconcileReport()
    taken: dict[str, Lease] = {}
    live_keys: set[str] = set()
    adapters = {target_key(a.target): a for a in registry.adapters}
    for row in journal.open_allocations(runner_tag=runner_tag):
        if row.kind == "snapshot" and row.state == "live":
            live_keys.add(row.allocation_key)  # a settled snapshot belongs to the Session, not the Run
            continue
        if row.lease_id not in taken and not leases.reclaimable(row.lease_id):  # taken: reclaimed by this pass
            live_keys.add(row.allocation_key)
            continue
        adapter = adapters.get(target_key(row.target))
        if adapter is None:
            report.skipped[row.allocation_key] = f"no adapter for {row.target} is loaded"
            continue
        try:
            lease = taken.get(row.lease_id) or leases.takeover(row.lease_id, only_if_reclaimable=True)
            taken[row.lease_id] = lease
            await _compensate(adapter, lease, row.allocation_key, runner_tag)
        except SandboxLeaseFenced as exc:
            report.skipped[row.allocation_key] = exc.message
            continue
        except SandboxError as exc:
            report.failed[row.allocation_key] = f"{exc.code}: {exc.message}"
            continue
        except Exception as exc:
            report.failed[row.allocation_key] = f"SandboxProviderFailed: {type(exc).__name__}: {exc}"
            continue
        journal.set_allocation(row.allocation_key, "compensated", now=clock.now())
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
    for adapter in registry.adapters:
        env = adapter.envelope
        if not (env.lifecycle_assurances.enumerates_allocations and env.declares("listAllocations")):
            continue
        lease = leases.acquire(f"reconcile-{runner_tag}", ttl=300)
        try:
            req = build(ListAllocationsRequest, target=adapter.target, lease=lease, runner_tag=runner_tag)
            listing = revalidate(
                ListAllocationsResult, await _bounded("listAllocations", adapter.provider.list_allocations(req))
            )
            check_echo(listing, target=adapter.target, lease=lease)
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
                    await _compensate(adapter, lease, key, runner_tag)
                except SandboxError as exc:
                    report.failed[key] = f"{exc.code}: {exc.message}"
                    continue
                except Exception as exc:
                    report.failed[key] = f"SandboxProviderFailed: {type(exc).__name__}: {exc}"
                    continue
                if row is not None and row.state in ("pending", "live"):
                    journal.set_allocation(key, "compensated", now=leases.clock.now())
                report.enumerated.append(key)
        except SandboxError as exc:
            report.failed[f"listAllocations {adapter.target}"] = f"{exc.code}: {exc.message}"
        except Exception as exc:
            report.failed[f"listAllocations {adapter.target}"] = f"SandboxProviderFailed: {type(exc).__name__}: {exc}"
        finally:
            leases.end(lease)
