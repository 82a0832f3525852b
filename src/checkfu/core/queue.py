"""Queued Runs in the journal's database: submitted by anyone, claimed by a fleet of runners.

A submitted Run is a ``runs`` row with status ``queued`` and its ``request`` (``RunRequest``).
A runner claims one in a single transaction:

- a ``running`` submitted Run whose lease ended or expired first (a takeover): the lease's
  epoch is bumped with a compare-and-set that still requires it ended or expired, so a
  holder that renewed meanwhile keeps it, and the old holder is fenced from then on;
- otherwise the oldest ``queued`` Run: it becomes ``running`` under a new lease, epoch 1.

On PostgreSQL the candidate row is read ``FOR UPDATE SKIP LOCKED``: runners claiming at once
each get a different Run and none waits for another. SQLite has one writer at a time and no
row locks; there the claim's conditional update (``WHERE status = 'queued'``) decides, and a
runner that lost the race simply claims again.

Everything a runner writes about a claimed Run (its output, its settlement, giving it back)
is fenced: it happens in a transaction that first touches the lease at the epoch the runner
holds, and writes nothing when that epoch is no longer current. So a Run reaches exactly one
terminal state, recorded by the holder of its last attempt, with one ``settle`` event.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import Field

from checkfu.contract.errors import SandboxLeaseFenced, SandboxNotFound
from checkfu.contract.model import Model
from checkfu.contract.target import Lease
from checkfu.core.clock import Clock
from checkfu.core.journal import Journal, events, fenced, hold_lease, lease_params, leases, run_output, runners, runs

QUEUED = "queued"
RUNNING = "running"
TERMINAL_PREFIXES = (
    "succeeded",
    "command_failed",
    "interrupted",
    "refused:",
    "failed",
    "cancelled",
    "abandoned",
    "orphaned",
)

REQUEST_VERSION = 1


def is_terminal(status: str) -> bool:
    return status.startswith(TERMINAL_PREFIXES)


class RunRequest(Model):
    """What a submitted Run asks for: everything ``checkfu run`` would be told, checked when it was submitted.

    Mount sources are absolute paths that the runner reads itself (so they must be reachable from the
    runner's host: the same machine or a shared file system); a Git mount's ref is pinned to a commit.
    """

    version: int = REQUEST_VERSION
    provider: str = Field(min_length=1, max_length=2048)
    """An installed provider's name, or a provider service's URL."""
    command: tuple[str, ...] = Field(min_length=1)
    profile: dict[str, Any]
    """The decoded, pinned ``SandboxProfile`` as JSON (re-decoded strictly by the runner)."""
    mounts: tuple[str, ...] = ()
    captures: tuple[str, ...] = ()
    capture_dir: str | None = None
    stage_all: bool = False
    """``--no-ignore``: a directory mount stages what Git ignores too."""
    workdir: str | None = None
    """``-w``: the process's working directory in the sandbox (absolute)."""
    timeout: float = Field(default=3600.0, gt=0)
    allowed: tuple[str, ...] = ()
    """The ``--allow`` destinations the profile's network was made an allowlist of (for the summary)."""


@dataclass(frozen=True)
class Claim:
    """One attempt at a Run, held by this runner under ``lease``."""

    run_id: str
    lease: Lease
    attempt: int
    request: RunRequest
    takeover: bool
    """Another runner held the Run before (its lease expired or ended): its allocations come first."""


@dataclass(frozen=True)
class OutputChunk:
    id: int
    attempt: int
    stream: str
    data: bytes


@dataclass(frozen=True)
class RunnerRow:
    runner_id: str
    owner: str
    host: str
    pid: int
    runner_tag: str
    concurrency: int
    lease_ttl: float
    state: str
    started_at: float
    heartbeat_at: float
    stopped_at: float | None


@dataclass(frozen=True)
class HeldLease:
    lease_id: str
    run_id: str
    owner: str
    epoch: int
    expires_at: float


TAKEOVER_SCAN = 0.5
"""Seconds between one runner's looks for Runs to take over."""

_NEXT_QUEUED = (
    sa.select(runs.c.run_id)
    .where(runs.c.status == QUEUED)
    .order_by(runs.c.created_at)
    .limit(1)
    .with_for_update(skip_locked=True)
    .scalar_subquery()
)
_CLAIM_QUEUED = (
    runs.update()
    .where(runs.c.run_id == _NEXT_QUEUED, runs.c.status == QUEUED)
    .values(
        status=RUNNING,
        attempt=runs.c.attempt + 1,
        lease_id=sa.bindparam("lease_id"),
        runner_id=sa.bindparam("runner_id"),
        runner_tag=sa.bindparam("runner_tag"),
        claimed_at=sa.bindparam("now"),
    )
    .returning(runs.c.run_id, runs.c.attempt, runs.c.request)
)
"""One statement: the oldest queued Run, row-locked skipping any another runner holds (PostgreSQL), made this
runner's. Built once."""

_END = fenced(ended=True)


def new_runner_id() -> str:
    return f"runner-{socket.gethostname()[:40]}-{uuid.uuid4().hex[:8]}"


class RunQueue:
    """Submitting, claiming and settling Runs; every method is one short transaction."""

    def __init__(self, journal: Journal, clock: Clock) -> None:
        self.journal = journal
        self.clock = clock
        self._next_scan = float("-inf")

    # submitting ---------------------------------------------------------------------------------

    def submit(self, request: RunRequest, *, runner_tag: str, profile_digest: str, run_id: str) -> str:
        """Queue ``request`` as Run ``run_id``; returns the id."""
        with self.journal.tx() as c:
            c.execute(
                runs.insert().values(
                    run_id=run_id,
                    runner_tag=runner_tag,
                    target=None,
                    profile_digest=profile_digest,
                    command=json.dumps(list(request.command)),
                    status=QUEUED,
                    created_at=self.clock.now(),
                    request=request.model_dump_json(),
                    attempt=0,
                )
            )
        return run_id

    def cancel(self, run_id: str) -> bool:
        """Settle a Run that no runner has claimed yet as ``cancelled``; ``False`` when one already has."""
        now = self.clock.now()
        with self.journal.tx() as c:
            done = c.execute(
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.status == QUEUED)
                .values(status="cancelled", finished_at=now)
            ).rowcount
            if done == 1:
                c.execute(_settle_event(run_id, now, "cancelled", "cancelled before any runner claimed it"))
        return done == 1

    # claiming -----------------------------------------------------------------------------------

    def claim(self, *, owner: str, runner_id: str, runner_tag: str, ttl: float) -> Claim | None:
        """The next Run for this runner, under a lease it now holds; ``None`` when there is none.

        Runs to take over are looked for at most every ``TAKEOVER_SCAN`` seconds (they are rare, and the
        look scans the running Runs), queued ones at every call.
        """
        now = self.clock.now()
        if now >= self._next_scan:
            self._next_scan = now + TAKEOVER_SCAN
            for _ in range(8):  # another runner may win the compare-and-set; look again
                try:
                    found = self._take_over(owner=owner, runner_id=runner_id, runner_tag=runner_tag, ttl=ttl)
                except _LostRace:
                    continue
                if found is not None:
                    self._next_scan = now  # there may be more
                    return found
                break
        for _ in range(8):
            try:
                return self._claim_queued(owner=owner, runner_id=runner_id, runner_tag=runner_tag, ttl=ttl)
            except _LostRace:
                continue
        return None

    def _take_over(self, *, owner: str, runner_id: str, runner_tag: str, ttl: float) -> Claim | None:
        now = self.clock.now()
        with self.journal.tx() as c:
            stale = c.execute(
                sa.select(runs.c.run_id, runs.c.lease_id, runs.c.attempt, runs.c.request, leases.c.epoch)
                .join(leases, leases.c.lease_id == runs.c.lease_id)
                .where(
                    runs.c.status == RUNNING,
                    runs.c.request.is_not(None),
                    sa.or_(leases.c.ended.is_(True), leases.c.expires_at < now),
                )
                .order_by(runs.c.created_at)
                .limit(1)
                .with_for_update(of=runs, skip_locked=True)
            ).first()
            if stale is None:
                return None
            moved = c.execute(
                leases.update()
                .where(
                    leases.c.lease_id == stale.lease_id,
                    leases.c.epoch == stale.epoch,
                    sa.or_(leases.c.ended.is_(True), leases.c.expires_at < now),
                )
                .values(epoch=stale.epoch + 1, owner=owner, expires_at=now + ttl, ended=False)
            ).rowcount
            if moved != 1:
                raise _LostRace
            c.execute(
                runs.update()
                .where(runs.c.run_id == stale.run_id)
                .values(attempt=stale.attempt + 1, runner_id=runner_id, runner_tag=runner_tag, claimed_at=now)
            )
        return Claim(
            run_id=stale.run_id,
            lease=Lease(lease_id=stale.lease_id, lease_epoch=stale.epoch + 1),
            attempt=stale.attempt + 1,
            request=_request(stale.request),
            takeover=True,
        )

    def _claim_queued(self, *, owner: str, runner_id: str, runner_tag: str, ttl: float) -> Claim | None:
        now = self.clock.now()
        lease_id = f"lease-{uuid.uuid4().hex}"
        with self.journal.tx() as c:
            got = c.execute(
                _CLAIM_QUEUED,
                {"lease_id": lease_id, "runner_id": runner_id, "runner_tag": runner_tag, "now": now},
            ).first()
            if got is None:
                if self._queued_exists(c):
                    raise _LostRace  # SQLite: another runner took the one this statement chose
                return None
            c.execute(
                leases.insert().values(
                    lease_id=lease_id, run_id=got.run_id, owner=owner, epoch=1, expires_at=now + ttl, ended=False
                )
            )
        return Claim(
            run_id=got.run_id,
            lease=Lease(lease_id=lease_id, lease_epoch=1),
            attempt=got.attempt,
            request=_request(got.request),
            takeover=got.attempt > 1,
        )

    @staticmethod
    def _queued_exists(c: sa.Connection) -> bool:
        return c.execute(sa.select(runs.c.run_id).where(runs.c.status == QUEUED).limit(1)).first() is not None

    # holding ------------------------------------------------------------------------------------

    def heartbeat(self, *, runner_id: str, owner: str, ttl: float) -> set[str]:
        """Renew every lease ``owner`` holds and the runner's own heartbeat; returns the lease ids still held
        (a lease of this runner missing from it was taken over: its attempt is fenced)."""
        now = self.clock.now()
        with self.journal.tx() as c:
            held = c.execute(
                leases.update()
                .where(leases.c.owner == owner, leases.c.ended.is_(False))
                .values(expires_at=now + ttl)
                .returning(leases.c.lease_id)
            ).all()
            c.execute(runners.update().where(runners.c.runner_id == runner_id).values(heartbeat_at=now))
        return {r.lease_id for r in held}

    def place(
        self,
        claim: Claim,
        *,
        target_json: str,
        site: str | None,
        profile_digest: str,
        story: dict[str, Any] | None = None,
        selected: dict[str, str] | None = None,
    ) -> None:
        """Record the adapter (and site) the attempt selected, with its ``select`` event (``selected``: its
        ``outcome`` and ``detail``).

        Raises:
            SandboxLeaseFenced: the attempt was taken over.
        """
        now = self.clock.now()
        with self.journal.tx() as c:
            hold_lease(c, claim.lease)
            if selected is not None:
                c.execute(_run_event(claim.run_id, "select", now, selected["detail"], outcome=selected["outcome"]))
            c.execute(
                runs.update()
                .where(runs.c.run_id == claim.run_id)
                .values(
                    target=target_json,
                    site=site,
                    profile_digest=profile_digest,
                    story=json.dumps(story) if story is not None else None,
                )
            )

    def append_output(self, claim: Claim, chunks: Sequence[tuple[str, bytes]]) -> None:
        """Keep output of the attempt, in order.

        Raises:
            SandboxLeaseFenced: the attempt was taken over; nothing was kept.
        """
        if not chunks:
            return
        with self.journal.tx() as c:
            hold_lease(c, claim.lease)
            _keep_output(c, claim, chunks, self.clock.now())

    def settle(
        self,
        claim: Claim,
        *,
        status: str,
        exit_code: int | None,
        summary: dict[str, Any] | None,
        output: Sequence[tuple[str, bytes]] = (),
        calls: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Record the Run's one terminal state and end the lease, in one transaction, with the attempt's ``output``
        and provider ``calls`` (``events`` rows) not written yet.

        Raises:
            SandboxLeaseFenced: the attempt was taken over; the Run is left to its holder (nothing was written).
        """
        now = self.clock.now()
        with self.journal.tx() as c:
            _end(c, claim.lease)
            _keep_output(c, claim, output, now)
            if calls:
                c.execute(events.insert(), list(calls))
            c.execute(
                runs.update()
                .where(runs.c.run_id == claim.run_id, runs.c.status == RUNNING)
                .values(
                    status=status,
                    exit_code=exit_code,
                    finished_at=now,
                    summary=json.dumps(summary) if summary is not None else None,
                )
            )
            c.execute(_settle_event(claim.run_id, now, status, f"attempt {claim.attempt}"))

    def give_back(
        self,
        claim: Claim,
        reason: str,
        *,
        output: Sequence[tuple[str, bytes]] = (),
        calls: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Put the Run back in the queue for any runner (this one is stopping) and end the lease, with the attempt's
        ``output`` and ``calls`` not written yet, in one transaction.

        Raises:
            SandboxLeaseFenced: the attempt was taken over already (nothing was written).
        """
        now = self.clock.now()
        with self.journal.tx() as c:
            _end(c, claim.lease)
            _keep_output(c, claim, output, now)
            if calls:
                c.execute(events.insert(), list(calls))
            c.execute(
                runs.update()
                .where(runs.c.run_id == claim.run_id, runs.c.status == RUNNING)
                .values(status=QUEUED, runner_id=None)
            )
            c.execute(_run_event(claim.run_id, "requeue", now, f"attempt {claim.attempt}: {reason}"))

    def postpone(self, claim: Claim, seconds: float, reason: str) -> None:
        """Let the lease lapse in ``seconds`` with no owner, so the Run is taken over (by any runner) then;
        for an attempt that cannot start yet (its predecessor's allocations are not reclaimed).

        Raises:
            SandboxLeaseFenced: the attempt was taken over already.
        """
        now = self.clock.now()
        with self.journal.tx() as c:
            hold_lease(c, claim.lease)
            c.execute(
                leases.update()
                .where(leases.c.lease_id == claim.lease.lease_id)
                .values(owner="(postponed)", expires_at=now + seconds)
            )
            c.execute(_run_event(claim.run_id, "postpone", now, f"attempt {claim.attempt}: {reason}", outcome="error"))

    # reading ------------------------------------------------------------------------------------

    def output_since(self, run_id: str, after: int, limit: int = 1000) -> list[OutputChunk]:
        with self.journal.tx() as c:
            rows = c.execute(
                sa.select(run_output.c.id, run_output.c.attempt, run_output.c.stream, run_output.c.data)
                .where(run_output.c.run_id == run_id, run_output.c.id > after)
                .order_by(run_output.c.id)
                .limit(limit)
            ).all()
        return [OutputChunk(id=r.id, attempt=r.attempt, stream=r.stream, data=bytes(r.data)) for r in rows]

    def request(self, run_id: str) -> RunRequest | None:
        with self.journal.tx() as c:
            raw = c.execute(sa.select(runs.c.request).where(runs.c.run_id == run_id)).scalar_one_or_none()
        return _request(raw) if raw else None

    def counts(self) -> dict[str, int]:
        """Runs by status."""
        with self.journal.tx() as c:
            rows = c.execute(sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status)).all()
        return {r[0]: int(r[1]) for r in rows}

    # runners ------------------------------------------------------------------------------------

    def register_runner(
        self, *, runner_id: str, owner: str, pid: int, runner_tag: str, concurrency: int, lease_ttl: float
    ) -> None:
        now = self.clock.now()
        with self.journal.tx() as c:
            c.execute(
                runners.insert().values(
                    runner_id=runner_id,
                    owner=owner,
                    host=socket.gethostname(),
                    pid=pid,
                    runner_tag=runner_tag,
                    concurrency=concurrency,
                    lease_ttl=lease_ttl,
                    state="serving",
                    started_at=now,
                    heartbeat_at=now,
                )
            )

    def runner_state(self, runner_id: str, state: str) -> None:
        now = self.clock.now()
        values: dict[str, Any] = {"state": state, "heartbeat_at": now}
        if state == "stopped":
            values["stopped_at"] = now
        with self.journal.tx() as c:
            c.execute(runners.update().where(runners.c.runner_id == runner_id).values(**values))

    def runners(self) -> list[RunnerRow]:
        with self.journal.tx() as c:
            rows = c.execute(sa.select(runners).order_by(runners.c.started_at)).mappings().all()
        return [RunnerRow(**{k: r[k] for k in RunnerRow.__dataclass_fields__}) for r in rows]

    def leases_of(self, owners: Iterable[str]) -> list[HeldLease]:
        """The leases these owners hold (not ended), soonest to expire first."""
        wanted = list(owners)
        if not wanted:
            return []
        with self.journal.tx() as c:
            rows = c.execute(
                sa.select(leases.c.lease_id, leases.c.run_id, leases.c.owner, leases.c.epoch, leases.c.expires_at)
                .where(leases.c.owner.in_(wanted), leases.c.ended.is_(False))
                .order_by(leases.c.expires_at)
            ).all()
        return [HeldLease(r.lease_id, r.run_id, r.owner, r.epoch, r.expires_at) for r in rows]


class _LostRace(Exception):
    """Another runner claimed the same Run first (SQLite); the transaction is rolled back."""


def _request(raw: str) -> RunRequest:
    try:
        return RunRequest.model_validate_json(raw)
    except ValueError as exc:
        raise SandboxNotFound(f"the queued Run's request does not decode: {exc}", field="request") from None


def _end(c: sa.Connection, lease: Lease) -> None:
    if c.execute(_END, lease_params(lease)).rowcount != 1:
        raise _fenced(lease)


def _keep_output(c: sa.Connection, claim: Claim, chunks: Sequence[tuple[str, bytes]], now: float) -> None:
    if chunks:
        c.execute(
            run_output.insert(),
            [
                {"run_id": claim.run_id, "attempt": claim.attempt, "stream": stream, "data": data, "at": now}
                for stream, data in chunks
            ],
        )


def _fenced(lease: Lease) -> SandboxLeaseFenced:
    return SandboxLeaseFenced(
        f"lease {lease.lease_id} at epoch {lease.lease_epoch} is no longer current: another runner took the Run "
        "over; nothing was written",
        field="lease.lease_epoch",
    )


def _settle_event(run_id: str, now: float, status: str, detail: str) -> Any:
    return _run_event(run_id, "settle", now, f"{status}: {detail}")


def _run_event(run_id: str, member: str, now: float, detail: str, *, outcome: str = "ok") -> Any:
    """The insert of one event of the queue's own (no provider call) in a Run's history."""
    return events.insert().values(
        run_id=run_id,
        member=member,
        allocation_key=None,
        started_at=now,
        duration_ms=0.0,
        outcome=outcome,
        error_code=None,
        detail=detail[:1000],
    )
