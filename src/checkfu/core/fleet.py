"""A runner of the fleet: claims queued Runs from the shared journal and carries each one out.

``FleetRunner.serve()`` is ``checkfu runner serve``. Several of them, on any number of hosts,
share one database (PostgreSQL for a fleet) and nothing else:

- **claiming**: up to ``concurrency`` Runs at once, each claimed in one transaction
  (``RunQueue.claim``: ``FOR UPDATE SKIP LOCKED``), so no Run is claimed twice;
- **heartbeat**: every ``heartbeat`` seconds one statement renews every lease this runner
  holds, and its row in ``runners``. A lease of this runner that the heartbeat no longer
  finds was taken over: that attempt is stopped at once, and writes nothing more;
- **takeover**: a Run whose lease expired (its runner died, or stalled past the TTL) is
  claimed by another runner with the lease's epoch bumped, which fences the old holder at
  its next call or write. The abandoned attempt's allocations are compensated, under the
  new epoch, before the new attempt starts; when they cannot be yet (their site is down),
  the Run is postponed and taken over again later;
- **placement**: a target with several sites (Docker engines) goes to the site with the
  fewest open sandboxes in the journal that answers a ``describe``;
- **reconciliation**: every ``reconcile_every`` seconds, as ``checkfu runner reconcile``
  does, which only ever takes leases that ended, expired or whose owner is gone;
- **shutdown** (SIGTERM, SIGINT; ``stop()``): no more claims; each Run in flight is stopped,
  its sandbox released, and the Run given back to the queue with its lease ended, so
  another runner takes it at once.

Each attempt runs ``checkfu.core.job.run_job``, exactly as ``checkfu run`` does, under a
``LeaseStore`` in heartbeat mode; its output goes to ``run_output`` for ``checkfu runs wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from checkfu.contract.codec import decode_value
from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxError,
    SandboxLeaseFenced,
)
from checkfu.contract.lifecycle import OPEN_ROW_STATES, row_transition
from checkfu.contract.mounts import MountPlan
from checkfu.contract.ports import PublishedPort
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.core.clock import Clock, SystemClock
from checkfu.core.door import ProviderFault
from checkfu.core.driver import Limits
from checkfu.core.expiry import sweep_expired_snapshots
from checkfu.core.job import run_job
from checkfu.core.journal import Journal, JournalError, allocations
from checkfu.core.leases import LeaseStore, current_owner
from checkfu.core.mounts import parse_mount
from checkfu.core.output import OUTPUT_CAP as KEPT_OUTPUT_CAP
from checkfu.core.queue import Claim, RunQueue, new_runner_id
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Adapter, Registry, close_adapters
from checkfu.core.runner import Attempt, Needs, Runner
from checkfu.core.session import compensate_plan, describe_plan

OUTPUT_CAP = KEPT_OUTPUT_CAP
"""Bytes of output kept per attempt (as for a Run started in place); beyond it output is counted, not kept (the
summary says how much)."""

FLUSH_SECONDS = 0.1
"""How often an attempt's output goes to the journal while it runs."""

Loader = Callable[[str], Awaitable[Registry]]
"""Builds the adapters of one provider (an installed name, or a service URL): one per site when it has several."""

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class FleetConfig:
    concurrency: int = 4
    lease_ttl: float = 30.0
    heartbeat: float | None = None
    """Seconds between heartbeats; a third of the TTL when not given."""
    poll: float = 0.2
    """Seconds between claims while the queue is empty."""
    reconcile_every: float = 60.0
    retry_after: float = 5.0
    """Seconds before a Run whose earlier attempt could not be reclaimed yet is taken over again."""
    site_refresh: float = 15.0
    """Seconds before a provider with a site that was down is loaded again."""
    output_cap: int = OUTPUT_CAP

    @property
    def beat(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease_ttl / 3


class _Hold:
    """What one attempt or reconcile has reached so far: the registries it may still be using."""

    def __init__(self) -> None:
        self.pinned: dict[int, Registry] = {}


_HOLD: contextvars.ContextVar[_Hold | None] = contextvars.ContextVar("checkfu_fleet_hold", default=None)


class Adapters:
    """The providers this runner has loaded, by the name (or URL) a Run asks for; all of them in ``combined``.

    A name whose registry has a site down (or no adapter) is loaded again after ``refresh`` seconds. The registry
    it replaces is *retired*: its providers hold connections and threads (the Docker tier's client, a wire
    client's pool), so they are closed, but only once no attempt or reconcile that reached it (through ``get``,
    or through ``combined`` while it was part of it) is still open (``hold``). ``close`` closes everything at the
    end of serving.
    """

    def __init__(self, load: Loader, clock: Clock, refresh: float) -> None:
        self._load = load
        self._clock = clock
        self._refresh = refresh
        self._by_spec: dict[str, tuple[Registry, float]] = {}
        self._lock = asyncio.Lock()
        self._combined = Registry()
        self._pins: Counter[int] = Counter()
        """How many open holds reached each registry, by its ``id``."""
        self._retired: list[Registry] = []
        """Registries replaced and not yet closed."""

    def _pin(self, registries: Iterable[Registry]) -> None:
        hold = _HOLD.get()
        if hold is None:
            return
        for registry in registries:
            if id(registry) not in hold.pinned:
                hold.pinned[id(registry)] = registry
                self._pins[id(registry)] += 1

    @property
    def combined(self) -> Registry:
        """Every adapter loaded; whatever registry it comes from stays open while the caller's hold is."""
        self._pin(registry for registry, _ in self._by_spec.values())
        return self._combined

    async def get(self, spec: str) -> Registry:
        async with self._lock:
            held = self._by_spec.get(spec)
            if held is not None:
                registry, loaded_at = held
                stale = (registry.down_sites or not registry.adapters) and (
                    self._clock.now() - loaded_at > self._refresh
                )
                if not stale:
                    self._pin([registry])
                    return registry
            registry = await self._load(spec)
            self._by_spec[spec] = (registry, self._clock.now())
            self._rebuild()
            self._pin([registry])
            if held is not None:
                self._retired.append(held[0])
                await self._close_retired()
            return registry

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """While open, no registry reached in it (``get``, ``combined``) is closed, even if it is retired meanwhile."""
        hold = _Hold()
        token = _HOLD.set(hold)
        try:
            yield
        finally:
            _HOLD.reset(token)
            for key in hold.pinned:
                self._pins[key] -= 1
                if self._pins[key] <= 0:
                    del self._pins[key]
            await self._close_retired()

    async def _close_retired(self) -> None:
        while True:  # one at a time: a close cut short by a cancellation leaves the rest retired, not forgotten
            ready = next((i for i, registry in enumerate(self._retired) if id(registry) not in self._pins), None)
            if ready is None:
                return
            registry = self._retired.pop(ready)
            await close_adapters(registry.adapters)

    async def close(self) -> None:
        """Close every provider loaded, retired or not (serving has ended: no attempt is in flight)."""
        everything = [registry for registry, _ in self._by_spec.values()] + self._retired
        self._by_spec.clear()
        self._retired.clear()
        self._combined = Registry()
        await close_adapters(adapter for registry in everything for adapter in registry.adapters)

    def _rebuild(self) -> None:
        combined = Registry()
        seen: set[tuple[object, str]] = set()
        for registry, _ in self._by_spec.values():
            for adapter in registry.adapters:
                key = (adapter.target.model_dump_json(), adapter.site)
                if key not in seen:
                    seen.add(key)
                    combined.add(adapter)
            for site, why in registry.down_sites.items():
                if not any(a.site == site for a in combined.adapters):
                    combined.mark_unavailable(f"site {site}", why, site=site)
        self._combined = combined


@dataclass
class _Outcome:
    status: str
    exit_code: int | None
    summary: dict[str, object] | None


class _AttemptRunner(Runner):
    """``Runner`` for one claimed attempt: the claim's Run id and lease, the placed site, fenced writes."""

    def __init__(
        self,
        registry: Registry,
        journal: Journal,
        *,
        runner_tag: str,
        clock: Clock,
        limits: Limits | None,
        leases: LeaseStore,
        claim: Claim,
        queue: RunQueue,
        placed: Adapter,
        kept: _Output,
    ) -> None:
        super().__init__(registry, journal, runner_tag=runner_tag, clock=clock, limits=limits)
        self.leases = leases
        self.claim = claim
        self.queue = queue
        self.placed = placed
        self.kept = kept
        self.outcome: _Outcome | None = None

    def record_in_tree(self) -> None:
        """Done once, when the runner started serving."""

    def _adapter(self, target: ExecutionTarget) -> Adapter:
        return self.placed if self.placed.target == target else super()._adapter(target)

    def _begin(
        self,
        run_id: str,
        adapter: Adapter,
        profile: SandboxProfile,
        command: list[str] | None,
        now: float,
        *,
        owner: str | None = None,
        story: dict[str, Any] | None = None,
        selected: dict[str, str] | None = None,
    ) -> Lease:
        # ``owner`` is not recorded: the attempt's lease and the runner's heartbeat say who holds a Run of the fleet.
        self.queue.place(
            self.claim,
            target_json=adapter.target.model_dump_json(),
            site=adapter.site or None,
            profile_digest=profile.digest,
            story=story,
            selected=selected,
        )
        return self.claim.lease

    def start(
        self,
        target: ExecutionTarget,
        profile: SandboxProfile,
        *,
        platform: Any,
        mount_count: int = 0,
        command: list[str] | None = None,
        run_id: str | None = None,
        needs: Needs | None = None,
        owner: str | None = None,
        mounts: Sequence[tuple[MountPlan, str]] = (),
        noted: dict[str, Any] | None = None,
    ) -> Attempt:
        attempt = super().start(
            target,
            profile,
            platform=platform,
            mount_count=mount_count,
            command=command,
            run_id=self.claim.run_id,
            needs=needs,
            mounts=mounts,
            noted=noted,
        )
        attempt.session.batched = True  # each call recorded with the attempt's next fenced write
        return attempt

    def finish(
        self, attempt: Attempt, *, status: str, exit_code: int | None = None, summary: dict[str, object] | None = None
    ) -> None:
        """Kept for the settlement, which the serving loop makes fenced, in one transaction with the lease's end, the
        output not flushed yet and the calls not written yet (``kept``)."""
        self.outcome = _Outcome(status, exit_code, summary)
        self.kept.calls.extend(attempt.session.take_calls())


class _Output:
    """The attempt's output and warnings, kept in the journal (up to a cap) for ``checkfu runs wait``."""

    def __init__(self, queue: RunQueue, claim: Claim, cap: int) -> None:
        self.queue = queue
        self.claim = claim
        self.cap = cap
        self.kept = 0
        self.dropped = 0
        self.pending: list[tuple[str, bytes]] = []
        self.warnings: list[str] = []
        self.phases: dict[str, float] = {}
        self.calls: list[dict[str, Any]] = []
        """The attempt's provider calls not written yet (its session's, once it ended), as ``events`` rows."""

    async def before(self, name: str) -> None:
        pass

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = seconds

    def warning(self, text: str) -> None:
        self.warnings.append(text)
        self.pending.append(("warn", text.encode("utf-8", "replace")))

    def selected(self, attempt: Attempt) -> None:
        pass

    def published(self, port: PublishedPort) -> None:
        pass  # a served Run publishes no port (``ports`` is not a field of a queued request)

    def hash_progress(self, done: int, total: int) -> None:
        pass  # a served Run shows no progress bars

    def stage_progress(self, done: int, total: int) -> None:
        pass

    def output(self, stream: str, data: bytes) -> None:
        room = self.cap - self.kept
        if room <= 0:
            self.dropped += len(data)
            return
        if len(data) > room:
            self.dropped += len(data) - room
            data = data[:room]
        self.kept += len(data)
        self.pending.append((stream, data))

    async def flush(self, journal: Journal) -> None:
        """Raises SandboxLeaseFenced: the attempt was taken over (nothing was kept)."""
        if self.pending:  # taken here, on the loop, where ``output`` adds to it; written in the journal's worker
            chunks, self.pending = self.pending, []
            await journal.call(self.queue.append_output, self.claim, chunks)

    def take(self) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
        """The output and the calls not written yet, for the write that ends the attempt (which writes them)."""
        chunks, self.pending = self.pending, []
        calls, self.calls = self.calls, []
        return chunks, calls

    async def record_calls(self, journal: Journal) -> None:
        """Write the calls not written yet, unfenced (the attempt was taken over: what happened is still history)."""
        _, calls = self.take()
        with contextlib.suppress(JournalError):
            await journal.call(journal.record_events, calls)


@dataclass
class _Active:
    claim: Claim
    task: asyncio.Task[None]
    why: str | None = None
    """Why the task was cancelled: ``shutdown`` (give the Run back) or ``fenced`` (leave it alone)."""


@dataclass
class FleetStats:
    claimed: int = 0
    settled: int = 0
    fenced: int = 0
    given_back: int = 0
    takeovers: int = 0
    by_status: dict[str, int] = field(default_factory=dict)


class FleetRunner:
    """One ``checkfu runner serve`` process."""

    def __init__(
        self,
        journal: Journal,
        load: Loader,
        *,
        runner_tag: str,
        config: FleetConfig | None = None,
        clock: Clock | None = None,
        limits: Limits | None = None,
        emit: Emit | None = None,
    ) -> None:
        self.journal = journal
        self.config = config or FleetConfig()
        self.clock = clock or SystemClock()
        self.limits = limits
        self.runner_tag = runner_tag
        self.emit = emit or (lambda _event: None)
        self.queue = RunQueue(journal, self.clock)
        self.leases = LeaseStore(journal, self.clock, ttl=self.config.lease_ttl, heartbeat=True)
        self.adapters = Adapters(load, self.clock, self.config.site_refresh)
        self.owner = current_owner()
        self.runner_id = new_runner_id()
        self.stats = FleetStats()
        self._active: dict[str, _Active] = {}
        self._recorded: set[int] = set()
        self._recording = asyncio.Lock()
        self._placed: Counter[str] = Counter()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    # the serving loop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; Runs in flight are stopped, released and given back. Safe to call more than once."""
        if not self._stopping.is_set():
            self.emit({"event": "stopping", "runner_id": self.runner_id, "in_flight": sorted(self._active)})
        self._stopping.set()
        self._wake.set()

    async def serve(self) -> FleetStats:
        """Serve until ``stop()``; returns what was done.

        The journal's work is made in a pool of worker threads (``Journal.offload``), one per Run served at once plus
        the heartbeat and the reconciliation: a transaction waiting on PostgreSQL (or on SQLite's lock) holds up
        only its own Run, never the others or the heartbeat that keeps their leases."""
        self.journal.offload(self.config.concurrency + 2)
        db = self.journal.call
        await db(
            self.queue.register_runner,
            runner_id=self.runner_id,
            owner=self.owner,
            pid=os.getpid(),
            runner_tag=self.runner_tag,
            concurrency=self.config.concurrency,
            lease_ttl=self.config.lease_ttl,
        )
        self.emit({"event": "serving", "runner_id": self.runner_id, "owner": self.owner, "pid": os.getpid()})
        background = [
            asyncio.create_task(self._heartbeats(), name="checkfu-heartbeat"),
            asyncio.create_task(self._reconciles(), name="checkfu-reconcile"),
        ]
        workers = [
            asyncio.create_task(self._worker(i), name=f"checkfu-worker-{i}") for i in range(self.config.concurrency)
        ]
        try:
            await self._stopping.wait()
            await db(self.queue.runner_state, self.runner_id, "stopping")
            for active in list(self._active.values()):
                if active.why is None:
                    active.why = "shutdown"
                    active.task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.adapters.close()
            await db(self.queue.runner_state, self.runner_id, "stopped")
            self.emit({"event": "stopped", "runner_id": self.runner_id, **self.stats.__dict__})
        return self.stats

    async def _worker(self, index: int) -> None:
        idle = self.config.poll
        while not self._stopping.is_set():
            claim = await self.journal.call(
                self.queue.claim,
                owner=self.owner,
                runner_id=self.runner_id,
                runner_tag=self.runner_tag,
                ttl=self.config.lease_ttl,
            )
            if claim is None:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=idle * (0.5 + random.random()))
                continue
            self.stats.claimed += 1
            self.stats.takeovers += claim.takeover
            self.emit(
                {
                    "event": "claimed",
                    "run_id": claim.run_id,
                    "attempt": claim.attempt,
                    "lease_epoch": claim.lease.lease_epoch,
                    "takeover": claim.takeover,
                    "worker": index,
                }
            )
            task = asyncio.create_task(self._attempt(claim), name=f"checkfu-run-{claim.run_id}")
            active = _Active(claim, task)
            self._active[claim.run_id] = active
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # the worker itself is cancelled: see the attempt through first
                    active.why = active.why or "shutdown"
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                raise
            finally:
                self._active.pop(claim.run_id, None)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.beat)
            try:
                held = await self.journal.call(
                    self.queue.heartbeat, runner_id=self.runner_id, owner=self.owner, ttl=self.config.lease_ttl
                )
            except sa.exc.SQLAlchemyError as exc:
                self.emit({"event": "heartbeat_failed", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                continue
            for active in list(self._active.values()):
                if active.claim.lease.lease_id not in held and active.why is None and not active.task.done():
                    active.why = "fenced"
                    active.task.cancel()

    async def _reconciles(self) -> None:
        while True:
            await asyncio.sleep(self.config.reconcile_every * (0.5 + random.random()))
            async with self.adapters.hold():
                await self._reconcile_once()

    async def _reconcile_once(self) -> None:
        """One reconcile and one sweep of expired snapshots, each reported when it did anything."""
        try:
            report = await reconcile(self.journal, self.adapters.combined, self.clock, runner_tag=self.runner_tag)
        except (SandboxError, sa.exc.SQLAlchemyError) as exc:
            self.emit({"event": "reconcile_failed", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            return
        if not report.nothing_to_do or report.failed:
            self.emit(
                {
                    "event": "reconciled",
                    "compensated": report.compensated,
                    "strays": report.enumerated,
                    "failed": report.failed,
                }
            )
        try:  # a serving runner opens its journal once: expired snapshots are swept on this beat instead
            expired = await sweep_expired_snapshots(
                self.journal, self.adapters.combined, self.clock, runner_tag=self.runner_tag
            )
        except (SandboxError, sa.exc.SQLAlchemyError) as exc:
            self.emit({"event": "expiry_failed", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            return
        if not expired.nothing_to_do:
            self.emit(
                {
                    "event": "snapshots_expired",
                    "deleted": expired.deleted,
                    "settled": expired.settled,
                    "failed": expired.failed,
                    "skipped": expired.skipped,
                }
            )

    # one attempt ----------------------------------------------------------------------------------

    async def _attempt(self, claim: Claim) -> None:
        t0 = time.perf_counter()
        output = _Output(self.queue, claim, self.config.output_cap)
        outcome: _Outcome | None = None
        error: SandboxError | None = None
        flusher = asyncio.create_task(self._flush_while_running(output))
        try:
            outcome, error = await self._run(claim, output)
        except asyncio.CancelledError:
            active = self._active.get(claim.run_id)
            why = active.why if active is not None else "shutdown"
            if why == "fenced":
                await output.record_calls(self.journal)
                self._fenced(claim, "its lease was taken over (seen at the heartbeat)")
            else:
                await self._give_back(claim, output)
            return
        except SandboxLeaseFenced as exc:
            await output.record_calls(self.journal)
            self._fenced(claim, exc.message)
            return
        except _Postponed as exc:
            await self._postpone(claim, str(exc))
            return
        except SandboxError as exc:  # refused before run_job began: nothing was allocated
            error = exc
        except Exception as exc:  # a defect of ours, reported on the Run rather than losing it
            message = f"{type(exc).__name__}: {exc}"[:1000]
            outcome = _Outcome("failed", None, {"error": {"code": "internal", "message": message}})
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        status, exit_code, summary = self._settlement(claim, outcome, error, output, time.perf_counter() - t0)
        chunks, calls = output.take()
        try:  # the rest of the output and of the calls with the settlement: one fenced transaction
            await self.journal.call(
                self.queue.settle,
                claim,
                status=status,
                exit_code=exit_code,
                summary=summary,
                output=chunks,
                calls=calls,
            )
        except SandboxLeaseFenced as exc:
            with contextlib.suppress(JournalError):
                await self.journal.call(self.journal.record_events, calls)
            self._fenced(claim, exc.message)
            return
        self.stats.settled += 1
        self.stats.by_status[status] = self.stats.by_status.get(status, 0) + 1
        self.emit(
            {
                "event": "settled",
                "run_id": claim.run_id,
                "attempt": claim.attempt,
                "status": status,
                "exit_code": exit_code,
                "seconds": round(time.perf_counter() - t0, 4),
            }
        )

    async def _run(self, claim: Claim, output: _Output) -> tuple[_Outcome | None, SandboxError | None]:
        """Carry the attempt out: the outcome ``run_job`` recorded (``None`` when it stopped before selection),
        and the error it raised, if any (everything allocated was released or compensated first, as
        ``checkfu run`` does).

        Raises:
            SandboxError: refused before ``run_job`` began (no adapter, a profile that does not decode).
            SandboxLeaseFenced: the attempt was taken over.
            _Postponed: an earlier attempt's allocations cannot be reclaimed yet.
        """
        async with self.adapters.hold():  # what it loads or reaches through ``combined`` stays open until it ends
            return await self._run_held(claim, output)

    async def _run_held(self, claim: Claim, output: _Output) -> tuple[_Outcome | None, SandboxError | None]:
        request = claim.request
        registry = await self.adapters.get(request.provider)
        if id(registry) not in self._recorded:
            async with self._recording:  # one attempt records them; the others wait for it, not race it
                if id(registry) not in self._recorded:  # made, it records the in-tree ones
                    await self.journal.work(
                        Runner, registry, self.journal, runner_tag=self.runner_tag, clock=self.clock
                    )
                    self._recorded.add(id(registry))
        if claim.takeover:
            await self._reclaim_earlier(claim)
        decode_value(SandboxProfile, request.profile)  # refused before any placement when it does not decode
        placed = await self._place(registry, request.provider)  # counted in _placed from here
        try:
            return await self._run_placed(claim, output, registry, placed)
        finally:
            self._placed[placed.site] -= 1

    async def _run_placed(
        self, claim: Claim, output: _Output, registry: Registry, placed: Adapter
    ) -> tuple[_Outcome | None, SandboxError | None]:
        request = claim.request
        profile = decode_value(SandboxProfile, request.profile)
        specs = [parse_mount(m, stage_all=request.stage_all) for m in request.mounts]
        runner = _AttemptRunner(
            registry,
            self.journal,
            runner_tag=self.runner_tag,
            clock=self.clock,
            limits=self.limits,
            leases=self.leases,
            claim=claim,
            queue=self.queue,
            placed=placed,
            kept=output,
        )
        try:
            await run_job(
                runner,
                placed.target,
                profile,
                list(request.command),
                mounts=specs,
                captures=list(request.captures),
                capture_dir=Path(request.capture_dir) / claim.run_id if request.capture_dir else None,
                observer=output,
                cwd=request.workdir,
                timeout=request.timeout,
            )
        except SandboxError as exc:
            # A SandboxLeaseFenced here may be a provider's answer echoing another lease, not a takeover: the
            # Run is settled with it, and settling is itself fenced, so a real takeover is still told apart there.
            return runner.outcome, exc
        return runner.outcome, None

    async def _reclaim_earlier(self, claim: Claim) -> None:
        """Compensate every open allocation an earlier attempt of the Run left, under this attempt's lease.

        Raises:
            SandboxLeaseFenced: this attempt was taken over meanwhile.
            _Postponed: an allocation cannot be compensated now (its site is down, its provider failed).
        """
        for row in await self.journal.call(self.journal.open_allocations, run_id=claim.run_id):
            if row.kind == "snapshot" and row.state == "live":
                continue  # a settled snapshot outlives its Run by design
            adapter = self.adapters.combined.at(row.target, row.site)
            if adapter is None:
                where = f" at site {row.site}" if row.site else ""
                raise _Postponed(f"allocation {row.allocation_key}: no adapter for {row.target}{where} is reachable")
            plan = compensate_plan(adapter.target, claim.lease, row.allocation_key, row.runner_tag, self.limits)
            try:
                await adapter.door.call(
                    plan,
                    run_id=claim.run_id,
                    recorder=self.journal,
                    fence=lambda: self.leases.renew(claim.lease),
                )
            except ProviderFault as fault:
                raise _Postponed(
                    f"allocation {row.allocation_key}: {fault.error.code}: {fault.error.message}"
                ) from None
            await self.journal.call(
                self.journal.set_allocation,
                row.allocation_key,
                row_transition(row.state, "compensate"),
                now=self.clock.now(),
                fence=claim.lease,
            )
            self.emit({"event": "reclaimed", "run_id": claim.run_id, "allocation_key": row.allocation_key})

    async def _place(self, registry: Registry, provider: str) -> Adapter:
        """The adapter (site) this attempt runs on: the site with the fewest open sandboxes that answers
        a ``describe``. Counted in ``_placed`` (the caller gives it back when the attempt ends).

        Raises:
            SandboxAdapterUnavailable: the provider has no adapter here, or none of its sites answers.
        """
        found = [a for a in registry.adapters if a.envelope.provider == provider] or list(registry.adapters)
        if not found:
            why = "; ".join(f"{k}: {v}" for k, v in registry.unavailable.items()) or "not installed"
            raise SandboxAdapterUnavailable(
                f"no adapter for provider {provider!r} on this runner ({why})", field="provider"
            )
        ambiguous = registry.ambiguity(found[0].envelope.provider)
        if ambiguous is not None:  # several targets under the name, or one target twice at one site
            raise ambiguous
        sites = registry.sites(found[0].target)
        if len(sites) == 1:
            self._placed[sites[0].site] += 1
            return sites[0]
        refused: list[str] = [f"{s}: {why}" for s, why in registry.down_sites.items()]
        tried: set[str] = set()
        while len(tried) < len(sites):
            load = await self.journal.call(self._open_by_site, list(self._active))
            for site, n in self._placed.items():
                load[site] = load.get(site, 0) + n
            adapter = min(
                (a for a in sites if a.site not in tried), key=lambda a: (load.get(a.site, 0), random.random())
            )
            tried.add(adapter.site)
            self._placed[adapter.site] += 1  # reserved before asking, so attempts placed meanwhile see it
            try:
                await adapter.door.call(describe_plan(adapter.source, self.limits))
            except (ProviderFault, SandboxError) as exc:
                self._placed[adapter.site] -= 1
                err = exc.error if isinstance(exc, ProviderFault) else exc
                refused.append(f"{adapter.site}: {err.code}: {err.message}")
                self.emit({"event": "site_down", "site": adapter.site, "error": refused[-1]})
                continue
            return adapter
        raise SandboxAdapterUnavailable(
            f"no site of {found[0].target} answers: {'; '.join(refused)}", field="provider", retryable=True
        )

    def _open_by_site(self, mine: list[str]) -> dict[str, int]:
        """Open sandboxes (instance allocations) per site of the rest of the fleet, from the journal; this runner's
        own (the Runs ``mine``) are counted by ``_placed`` from the moment they are placed, before any is journaled."""
        with self.journal.tx() as c:
            rows = c.execute(
                sa.select(allocations.c.site, sa.func.count())
                .where(
                    allocations.c.state.in_(OPEN_ROW_STATES),
                    allocations.c.kind == "instance",
                    allocations.c.run_id.not_in(mine),
                )
                .group_by(allocations.c.site)
            ).all()
        return {str(r[0] or ""): int(r[1]) for r in rows}

    async def _flush_while_running(self, output: _Output) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await output.flush(self.journal)
            except SandboxLeaseFenced:
                active = self._active.get(output.claim.run_id)
                if active is not None and active.why is None:
                    active.why = "fenced"
                    active.task.cancel()
                return
            except sa.exc.SQLAlchemyError as exc:
                self.emit({"event": "output_failed", "run_id": output.claim.run_id, "error": str(exc)[:300]})

    def _settlement(
        self,
        claim: Claim,
        outcome: _Outcome | None,
        error: SandboxError | None,
        output: _Output,
        seconds: float,
    ) -> tuple[str, int | None, dict[str, Any]]:
        summary: dict[str, Any] = dict(outcome.summary or {}) if outcome is not None else {}
        summary.setdefault("phases", output.phases)
        summary.update(
            {
                "runner_id": self.runner_id,
                "attempt": claim.attempt,
                "lease_epoch": claim.lease.lease_epoch,
                "seconds": round(seconds, 4),
                "warnings": output.warnings,
                "allowed": list(claim.request.allowed),
            }
        )
        if output.dropped:
            summary["output_dropped_bytes"] = output.dropped
            summary["output_cap_bytes"] = output.cap
        if error is not None:
            summary["error"] = {"code": error.code, "message": error.message, "field": error.field}
            # the Run's own word when it has one: refused (nothing was made) or failed (the provider was at work)
            status = (
                outcome.status if outcome is not None and outcome.status.startswith(("refused:", "failed")) else None
            )
            return status or f"refused:{error.code}", None, summary
        assert outcome is not None
        return outcome.status, outcome.exit_code, summary

    def _fenced(self, claim: Claim, why: str) -> None:
        self.stats.fenced += 1
        self.emit({"event": "fenced", "run_id": claim.run_id, "attempt": claim.attempt, "why": why})

    async def _give_back(self, claim: Claim, output: _Output) -> None:
        chunks, calls = output.take()
        try:
            await self.journal.call(
                self.queue.give_back,
                claim,
                "its runner stopped (SIGTERM): released, and back in the queue",
                output=chunks,
                calls=calls,
            )
        except SandboxLeaseFenced as exc:
            with contextlib.suppress(JournalError):
                await self.journal.call(self.journal.record_events, calls)
            self._fenced(claim, exc.message)
            return
        self.stats.given_back += 1
        self.emit({"event": "given_back", "run_id": claim.run_id, "attempt": claim.attempt})

    async def _postpone(self, claim: Claim, why: str) -> None:
        try:
            await self.journal.call(self.queue.postpone, claim, self.config.retry_after, why)
        except SandboxLeaseFenced as exc:
            self._fenced(claim, exc.message)
            return
        self.emit({"event": "postponed", "run_id": claim.run_id, "attempt": claim.attempt, "why": why})


class _Postponed(Exception):
    """The attempt cannot start yet: an earlier attempt's allocation cannot be compensated now."""
