"""A warm pool: sandboxes of a profile provisioned ahead of demand, adopted once by a Run, never shared.

A pooled sandbox is a Run of its own (the *pool Run*) that stops after ``provision``: selection and
the capability check, the allocation journaled ``pending`` under its own allocation key before the
provider is asked, the provider's objects labelled with that key and the runner tag, every call
fenced by the pool Run's lease. It is never staged nor activated, so nothing can run in it yet (the Docker
tier's filler holds it: started and at once frozen, so that activating it thaws rather than starts it).

Once provisioned it is *ready*: its lease is handed to no process (owner ``pool:<run>``) until
``ttl`` seconds from now. Until then nothing reclaims it; afterwards ``checkfu runner reconcile``
does, as any expired lease. A filler killed before that point leaves a lease whose owner process
is gone: reconciliation reclaims it by allocation key like any other.

A Run adopts a ready sandbox whose adapter, site, profile digest and sealed mount targets are its
own (``adopt``). Adoption is one compare-and-set in one transaction (``RunSession.adopt``, through
``Journal.adopt_allocation``): the pool lease is ended at the epoch that was read (and only while it is
current), and the allocation row moves to the adopting Run and its lease. Two adopters of one sandbox:
one wins, the other finds nothing changed and tries the next (or provisions). The adopting Run then
stages its own mounts into the sealed mount volumes and activates, exactly as after its own
``provision``; it releases the sandbox at its end.
A pooled sandbox is used by one Run only, so nothing one Run wrote ever reaches another.

Only sealed mounts are pooled: a writable mount (``:rw``) is a writable area sized by its files at
create, so a Run with one provisions as always.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from checkfu.contract.errors import SandboxError
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.vocabulary import Platform
from checkfu.core.driver import Instance, RunSession
from checkfu.core.journal import Journal, allocations, leases, runs
from checkfu.core.leases import LeaseStore
from checkfu.core.registry import Adapter, Registry, target_key
from checkfu.core.runner import Needs, Runner

__all__ = [
    "DEFAULT_POOL_TTL",
    "OWNER_PREFIX",
    "Drained",
    "Pooled",
    "adopt",
    "drain",
    "fill",
    "fill_one",
    "pool_shape",
    "ready",
]

OWNER_PREFIX = "pool:"
DEFAULT_POOL_TTL = 3600.0
"""How long a ready sandbox waits for a Run before reconciliation may reclaim it (``--ttl``)."""


def pool_shape(plans: Sequence[MountPlan]) -> list[str] | None:
    """The sealed mount targets a pooled sandbox must have been made with; ``None``: not poolable (``:rw``)."""
    if any(p.writable for p in plans):
        return None
    return [p.target for p in plans]


@dataclass(frozen=True)
class Pooled:
    """One ready pooled sandbox, as the journal holds it."""

    allocation_key: str
    instance_id: str
    run_id: str
    lease_id: str
    lease_epoch: int
    owner: str
    expires_at: float
    created_at: float
    profile_digest: str
    target: ExecutionTarget
    site: str | None
    mounts: tuple[str, ...]
    engine: str | None = None
    """The engine the filler reached (``DOCKER_HOST``), as it recorded it: a Run adopts only on its own."""

    def as_json(self) -> dict[str, Any]:
        return {
            "allocation_key": self.allocation_key,
            "instance_id": self.instance_id,
            "run_id": self.run_id,
            "profile_digest": self.profile_digest,
            "target": str(self.target),
            "site": self.site,
            "mounts": list(self.mounts),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
        }


def ready(journal: Journal, runner_tag: str, *, now: float | None = None) -> list[Pooled]:
    """Every ready pooled sandbox of ``runner_tag`` (its lease current and held by no process), oldest first."""
    now = time.time() if now is None else now
    q = (
        sa.select(
            allocations.c.allocation_key,
            allocations.c.object_id,
            allocations.c.run_id,
            allocations.c.lease_id,
            allocations.c.created_at,
            allocations.c.target,
            allocations.c.site,
            leases.c.epoch,
            leases.c.owner,
            leases.c.expires_at,
            runs.c.profile_digest,
            runs.c.story,
        )
        .select_from(
            allocations.join(leases, leases.c.lease_id == allocations.c.lease_id).join(
                runs, runs.c.run_id == allocations.c.run_id
            )
        )
        .where(
            allocations.c.runner_tag == runner_tag,
            allocations.c.state == "live",
            allocations.c.kind == "instance",
            leases.c.owner.like(OWNER_PREFIX + "%"),
            leases.c.ended.is_(False),
            leases.c.expires_at > now,
            runs.c.status == "running",
        )
        .order_by(allocations.c.created_at)
    )
    with journal.tx() as c:
        rows = c.execute(q).mappings().all()
    out = []
    for r in rows:
        story = json.loads(r["story"] or "{}")
        pool = story.get("pool") or {}
        out.append(
            Pooled(
                allocation_key=r["allocation_key"],
                instance_id=r["object_id"] or "",
                run_id=r["run_id"],
                lease_id=r["lease_id"],
                lease_epoch=int(r["epoch"]),
                owner=r["owner"],
                expires_at=float(r["expires_at"]),
                created_at=float(r["created_at"]),
                profile_digest=r["profile_digest"] or "",
                target=ExecutionTarget.model_validate_json(r["target"]),
                site=r["site"],
                mounts=tuple(pool.get("mounts") or ()),
                engine=pool.get("engine"),
            )
        )
    return out


def _matches(entry: Pooled, session: RunSession, profile: SandboxProfile, shape: list[str], engine: str | None) -> bool:
    return (
        entry.engine == engine
        and entry.profile_digest == profile.digest
        and target_key(entry.target) == target_key(session.target)
        and (entry.site or None) == (session.site or None)
        and list(entry.mounts) == shape
        and bool(entry.instance_id)
    )


def adopt(
    session: RunSession, profile: SandboxProfile, plans: Sequence[MountPlan], *, engine: str | None = None
) -> Instance | None:
    """Adopt a ready pooled sandbox for the Run of ``session``; ``None`` when none fits (provision as always).

    ``engine`` names the engine this process reaches (as ``fill`` was told it): only a sandbox filled there fits.

    The instance comes back ``provisioning`` (never activated): the Run stages its mounts, then activates it.
    """
    shape = pool_shape(plans)
    if shape is None:
        return None
    journal = session.journal
    for entry in ready(journal, session.core.runner_tag, now=session.clock.now()):
        if not _matches(entry, session, profile, shape, engine):
            continue
        inst = Instance(
            allocation_key=entry.allocation_key,
            instance_id=entry.instance_id,
            state="provisioning",
            mount_roots=tuple(shape),
            kind="instance",
            retention=profile.retention_mode,
        )
        if not session.adopt(
            entry.allocation_key,
            from_run=entry.run_id,
            from_lease=Lease(lease_id=entry.lease_id, lease_epoch=entry.lease_epoch),
            from_owner=entry.owner,
            instance=inst,
        ):
            continue  # another Run adopted it (or it expired) meanwhile
        now = session.clock.now()
        journal.finish_run(entry.run_id, status="adopted", now=now, summary={"adopted_by": session.run_id})
        journal.record_event(
            session.run_id,
            "adopt",
            started_at=now,
            duration_ms=0.0,
            outcome="ok",
            detail=f"pooled sandbox {entry.instance_id} of pool Run {entry.run_id}",
        )
        return inst
    return None


async def fill_one(
    runner: Runner,
    target: ExecutionTarget,
    profile: SandboxProfile,
    platform: Platform,
    mounts: Sequence[str],
    *,
    ttl: float,
    engine: str | None = None,
) -> Pooled | None:
    """Provision one pooled sandbox (journaled, labelled, fenced), and make it ready for ``ttl`` seconds.

    Raises:
        SandboxError: a refusal or a provider fault; what was allocated has been compensated.
    """
    plans = [MountPlan(target=t, files=()) for t in mounts]
    attempt = runner.start(
        target,
        profile,
        platform=platform,
        mount_count=len(plans),
        needs=Needs(),
        noted={"pool": {"mounts": list(mounts), "ttl": ttl, "engine": engine}},
    )
    session = attempt.session
    status = "failed"
    try:
        image = (await session.materialize(profile, platform)).image
        inst = await session.provision(profile, platform, image, plans)
        now = runner.clock.now()
        runner.leases.hand_over(
            session.lease, owner=f"{OWNER_PREFIX}{session.run_id}", until=now + ttl, what=f"pool Run {session.run_id}"
        )
        status = "ready"
        for entry in ready(runner.journal, runner.runner_tag, now=now):
            if entry.allocation_key == inst.allocation_key:
                return entry
        return None
    except SandboxError as exc:
        status = "failed" if session.core.rows else f"refused:{exc.code}"  # as a Run's (``core.job``)
        raise
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    finally:
        if status != "ready":
            task = asyncio.ensure_future(session.release_all(confirm=True))
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    continue
            runner.finish(attempt, status=status)


async def fill(
    runner: Runner,
    target: ExecutionTarget,
    profile: SandboxProfile,
    platform: Platform,
    mounts: Sequence[str],
    *,
    n: int,
    ttl: float = DEFAULT_POOL_TTL,
    site: str | None = None,
    engine: str | None = None,
) -> list[Pooled]:
    """Top the pool of this shape up to ``n`` ready sandboxes; returns the ones made now."""
    have = [
        e
        for e in ready(runner.journal, runner.runner_tag, now=runner.clock.now())
        if e.profile_digest == profile.digest
        and list(e.mounts) == list(mounts)
        and (e.site or None) == site
        and e.engine == engine
    ]
    made: list[Pooled] = []
    for _ in range(max(0, n - len(have))):
        entry = await fill_one(runner, target, profile, platform, mounts, ttl=ttl, engine=engine)
        if entry is not None:
            made.append(entry)
    return made


@dataclass(frozen=True)
class Drained:
    allocation_key: str
    run_id: str
    error: str | None = None


def _adapter(registry: Registry, entry: Pooled) -> Adapter | None:
    want = target_key(entry.target)
    for a in registry.adapters:
        if target_key(a.target) == want and a.site == (entry.site or ""):
            return a
    return None


async def drain(journal: Journal, registry: Registry, runner_tag: str, runner: Runner) -> list[Drained]:
    """Release every ready pooled sandbox of ``runner_tag``: each is claimed (the same compare-and-set as an
    adoption, so never one a Run just adopted), compensated by its allocation key and its pool Run settled."""
    out: list[Drained] = []
    store = LeaseStore(journal, runner.clock, ttl=300)
    for entry in ready(journal, runner_tag, now=runner.clock.now()):
        adapter = _adapter(registry, entry)
        if adapter is None:
            out.append(
                Drained(
                    entry.allocation_key,
                    entry.run_id,
                    f"provider {entry.target.provider} is not available here "
                    f"(drain with --provider {entry.target.provider})",
                )
            )
            continue
        lease = store.acquire(entry.run_id)
        session = RunSession(
            provider=adapter.provider,
            envelope=adapter.envelope,
            journal=journal,
            leases=store,
            lease=lease,
            run_id=entry.run_id,
            runner_tag=runner_tag,
            clock=runner.clock,
            limits=runner.limits,
            door=adapter.door,
            site=adapter.site or None,
        )
        if not session.adopt(
            entry.allocation_key,
            from_run=entry.run_id,
            from_lease=Lease(lease_id=entry.lease_id, lease_epoch=entry.lease_epoch),
            from_owner=entry.owner,
        ):
            store.end(lease)
            continue  # adopted meanwhile: the Run releases it
        error: str | None = None
        try:
            await session.compensate(entry.allocation_key)
        except SandboxError as exc:
            error = f"{exc.code}: {exc.message}"
        if error is None:
            journal.finish_run(entry.run_id, status="drained", now=runner.clock.now())
        store.end(lease)
        out.append(Drained(entry.allocation_key, entry.run_id, error))
    return out
