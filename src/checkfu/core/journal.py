"""The runner's journal: allocations, leases, runs and member-call events.

SQLAlchemy Core over an embedded SQLite file by default, PostgreSQL by URL; one
schema for both. The journal is written *before* a provider is asked for an
allocation, so a crash at any point leaves a row that reconciliation can settle
with ``compensate(allocation_key)``.

Allocation rows move through ``checkfu.contract.lifecycle.ROW_TRANSITIONS``::

    pending      journaled; the provider may or may not have allocated
    live         the provider's result passed every check
    released     released through the provider
    compensated  reclaimed by compensate(allocation_key)

``pending`` and ``live`` are *open*: reconciliation reclaims an open allocation
whose lease has expired or whose owner is gone.

Events record every provider call, with its duration and outcome. A call that
belongs to no Run (``describe``, reconciliation's enumeration) is recorded with
the empty string as its run id.

The schema is versioned: the tables below are revision ``checkfu.core.migrate.HEAD``,
and opening a journal upgrades it in place (``checkfu.core.migrate``). A change here
comes with a new revision in ``migrations/versions``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from checkfu.contract.codec import decode
from checkfu.contract.errors import ERROR_CLASSES, SandboxLeaseFenced
from checkfu.contract.lifecycle import OPEN_ROW_STATES, RowKind, RowState
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.core import owner_only
from checkfu.core.migrate import upgrade

if TYPE_CHECKING:
    from checkfu.core.door import CallRecord

AllocationState = RowState
AllocationKind = RowKind
OPEN_STATES = OPEN_ROW_STATES
NO_RUN = ""
"""The run id of an event that belongs to no Run."""
ABANDONED = "abandoned"
"""The status reconciliation gives a Run whose runner stopped (killed, crashed) once all it held is settled."""
ORPHANED = "orphaned"
"""The status of a Run started in place whose owner process is gone, once all it held is reclaimed: it was reaped
as an orphan (its summary says by whom and what was released)."""

metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("runner_tag", sa.String(128), nullable=False),
    sa.Column("target", sa.Text, nullable=True),
    sa.Column("profile_digest", sa.String(80), nullable=True),
    sa.Column("command", sa.Text, nullable=True),
    sa.Column("status", sa.String(64), nullable=False),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("summary", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("request", sa.Text, nullable=True),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_id", sa.String(128), nullable=True),
    sa.Column("runner_id", sa.String(128), nullable=True),
    sa.Column("site", sa.String(256), nullable=True),
    sa.Column("claimed_at", sa.Float, nullable=True),
    sa.Column("owner", sa.String(256), nullable=True),
    sa.Column("owner_boot", sa.String(64), nullable=True),
    sa.Column("story", sa.Text, nullable=True),
    sa.Index("ix_runs_status_created_at", "status", "created_at"),
)
"""Every Run. A Run started in place (``checkfu run``) is written ``running``; a submitted one
(``checkfu submit``) is written ``queued`` with its ``request`` and no ``target`` yet, and a runner of
the fleet claims it and selects the adapter (``checkfu.core.queue``).

A Run started in place records its ``owner`` (``host/pid/start``, as a lease owner is written) and the
kernel's ``owner_boot`` id: once that process is gone the Run is ``orphaned``, and the next command that
opens the journal reaps it (``checkfu.core.reconcile.reap_orphans``). ``story`` is what the Run's page
tells besides its events (adapter, grade, axes, staged files), as JSON."""

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("lease_id", sa.String(128), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("owner", sa.String(256), nullable=False, index=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("ended", sa.Boolean, nullable=False, default=False),
)

allocations = sa.Table(
    "allocations",
    metadata,
    sa.Column("allocation_key", sa.String(128), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("runner_tag", sa.String(128), nullable=False, index=True),
    sa.Column("lease_id", sa.String(128), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("object_id", sa.String(256), nullable=True),
    sa.Column("parent_key", sa.String(128), nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("site", sa.String(256), nullable=True),
    sa.Column("lease_epoch", sa.BigInteger, nullable=True),
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Index("ix_allocations_expiry", "kind", "state", "expires_at"),
)
"""``expires_at``: for a snapshot, when it expires as its provider stated (seconds since the epoch; NULL:
kept until deleted); ``checkfu.core.expiry`` deletes (runner custody) or settles (provider custody) it then."""

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("member", sa.String(32), nullable=False),
    sa.Column("allocation_key", sa.String(128), nullable=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("duration_ms", sa.Float, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("error_code", sa.String(64), nullable=True),
    sa.Column("detail", sa.Text, nullable=True),
    sa.Column("write_key", sa.String(40), nullable=True),
)
"""``write_key``: chosen once per write before its first attempt, so a retry whose first attempt did commit (its
acknowledgement was lost with the connection) finds its own row, by its Run and this key, instead of writing a
second (``insert_once``). Not indexed: only a retry looks for it, through ``run_id``'s index."""

enrollments = sa.Table(
    "enrollments",
    metadata,
    sa.Column("target", sa.Text, primary_key=True),
    sa.Column("endpoint", sa.String(256), primary_key=True, server_default=""),
    sa.Column("provider", sa.String(256), nullable=False, index=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("envelope_digest", sa.String(80), nullable=False),
    sa.Column("envelope", sa.Text, nullable=False),
    sa.Column("ceiling", sa.Text, nullable=False),
    sa.Column("evidence", sa.Text, nullable=True),
    sa.Column("credential_path", sa.Text, nullable=True),
    sa.Column("credential_fingerprint", sa.String(80), nullable=True),
    sa.Column("enrolled_at", sa.Float, nullable=False),
)
"""Who may be selected, within which ceiling, on what evidence. ``kind`` is ``in_tree`` (this package's own
providers, recorded when a runner starts) or ``evidence`` (a third party enrolled with signed conformance
evidence). The credential itself is never stored here: only the file it was issued to and its fingerprint.
Keyed by target and ``endpoint``: the provider service's URL (``checkfu.core.registry.endpoint``), ``''`` for a
provider loaded in the runner's own process, so a served provider and its in-process twin are enrolled apart."""

runners = sa.Table(
    "runners",
    metadata,
    sa.Column("runner_id", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("host", sa.String(256), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("runner_tag", sa.String(128), nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    sa.Column("lease_ttl", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("stopped_at", sa.Float, nullable=True),
)
"""One row per ``checkfu runner serve`` process: ``serving``, ``stopping`` or ``stopped``, with its heartbeat.
``owner`` is the lease owner it writes (``checkfu.core.leases.current_owner``)."""

run_output = sa.Table(
    "run_output",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("stream", sa.String(8), nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("write_key", sa.String(48), nullable=True),
    sa.Index("ix_run_output_run_id", "run_id", "id"),
)
"""A submitted Run's output as its runner streamed it (``out`` or ``err``), by attempt, for ``checkfu runs wait``."""

sandboxes = sa.Table(
    "sandboxes",
    metadata,
    sa.Column("sandbox_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("runner_tag", sa.String(128), nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("site", sa.String(256), nullable=True),
    sa.Column("allocation_key", sa.String(128), nullable=False),
    sa.Column("instance_id", sa.String(256), nullable=True),
    sa.Column("lease_id", sa.String(128), nullable=False),
    sa.Column("owner", sa.String(256), nullable=True),
    sa.Column("profile", sa.Text, nullable=False),
    sa.Column("mounts", sa.Text, nullable=False),
    sa.Column("origin", sa.String(128), nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=True),
    sa.Index("ix_sandboxes_state", "state", "runner_tag"),
)
"""Long-lived sandboxes (``checkfu.core.sandboxes``): ``provisioning``, ``live``, then ``released`` (by
its holder) or ``reclaimed`` (its time-to-live passed, or its owner process is gone). ``expires_at`` is its
time-to-live deadline, the same as its lease's; ``owner`` is the process that holds it, NULL when detached."""

sandbox_snapshots = sa.Table(
    "sandbox_snapshots",
    metadata,
    sa.Column("snapshot_ref", sa.String(64), primary_key=True),
    sa.Column("sandbox_id", sa.String(64), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("runner_tag", sa.String(128), nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("site", sa.String(256), nullable=True),
    sa.Column("allocation_key", sa.String(128), nullable=False),
    sa.Column("snapshot_id", sa.String(256), nullable=False),
    sa.Column("profile", sa.Text, nullable=False),
    sa.Column("mounts", sa.Text, nullable=False),
    sa.Column("keep_seconds", sa.Float, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("deleted_at", sa.Float, nullable=True),
    sa.Column("owner", sa.String(256), nullable=True),
)
"""Snapshots taken of long-lived sandboxes: ``pending`` (journaled before the provider is asked, with ``owner``, the
process taking it), then ``present`` or ``failed``, then ``deleted``, with what a resume needs. ``expires_at`` is the
provider's word on when it expires (NULL: kept until deleted); ``keep_seconds`` the lifetime asked for."""


# Statements built once: executing a prebuilt statement with parameters skips the per-call
# construction and cache-key work of ``.values(...)``, the larger part of a small write's cost.
_UPDATE_ALLOCATION = (
    allocations.update()
    .where(allocations.c.allocation_key == sa.bindparam("key"))
    .values(state=sa.bindparam("state"), updated_at=sa.bindparam("now"))
)
_UPDATE_ALLOCATION_OBJECT = _UPDATE_ALLOCATION.values(object_id=sa.bindparam("object_id"))
_SET_EXPIRY = (
    allocations.update()
    .where(allocations.c.allocation_key == sa.bindparam("key"))
    .values(expires_at=sa.bindparam("expires_at"))
)
_INSERT_EVENT = events.insert()
LEASE_CURRENT = (
    leases.c.lease_id == sa.bindparam("held_id"),
    leases.c.epoch == sa.bindparam("held_epoch"),
    leases.c.ended.is_(False),
)
"""The one lease fence: the lease ``held_id`` is still at epoch ``held_epoch`` and not ended. Every statement that
writes (or reads) under a lease is built from it (``fenced``), with the lease as ``lease_params``."""


def fenced(**values: Any) -> sa.Update:
    """An update of the lease row that applies only while the lease is current (``LEASE_CURRENT``)."""
    return leases.update().where(*LEASE_CURRENT).values(**values)


def lease_params(lease: Lease, **more: Any) -> dict[str, Any]:
    """The parameters of a statement built on ``LEASE_CURRENT``, for ``lease``."""
    return {"held_id": lease.lease_id, "held_epoch": lease.lease_epoch, **more}


_HOLD_LEASE = fenced(epoch=leases.c.epoch)
"""Touch a lease only if it is still current: the row lock it takes (PostgreSQL) or the write lock
(SQLite) holds it current until the transaction that wrote under it commits."""
_ADOPT_LEASE = fenced(epoch=leases.c.epoch + 1, ended=True).where(
    leases.c.owner == sa.bindparam("from_owner"), leases.c.expires_at > sa.bindparam("now")
)
"""End a lease no process holds (a pooled sandbox's), bumping its epoch so a straggler is fenced."""
_ADOPT_ALLOCATION = (
    allocations.update()
    .where(
        allocations.c.allocation_key == sa.bindparam("key"),
        allocations.c.run_id == sa.bindparam("from_run"),
        allocations.c.lease_id == sa.bindparam("held_id"),
        allocations.c.state == "live",
    )
    .values(
        run_id=sa.bindparam("to_run"),
        lease_id=sa.bindparam("to_lease"),
        lease_epoch=sa.bindparam("to_epoch"),
        updated_at=sa.bindparam("now"),
    )
)


_RENEW_HELD = fenced(expires_at=sa.bindparam("until"))
"""Renew a lease only if it is still current: the fence of a provider call, with the write that precedes it."""


def hold_lease(c: Connection, lease: Lease) -> None:
    """Within ``c``'s transaction: make sure ``lease`` is current and keep it so until commit.

    Raises:
        SandboxLeaseFenced: the lease was taken over (another epoch) or ended.
    """
    if c.execute(_HOLD_LEASE, lease_params(lease)).rowcount != 1:
        raise _not_current(lease)


def _not_current(lease: Lease) -> SandboxLeaseFenced:
    return SandboxLeaseFenced(
        f"lease {lease.lease_id} at epoch {lease.lease_epoch} is no longer current: another attempt took the Run "
        "over, or it ended; nothing was written under it",
        field="lease.lease_epoch",
    )


class _Lost(Exception):
    """A compare-and-set found the row changed: the transaction is rolled back."""


@dataclass(frozen=True)
class AllocationRow:
    allocation_key: str
    run_id: str
    kind: AllocationKind
    target: ExecutionTarget
    runner_tag: str
    lease_id: str
    state: AllocationState
    object_id: str | None
    parent_key: str | None
    created_at: float
    site: str | None = None
    """Where the allocation lives among an adapter's placements (a Docker engine's name), when it has several."""
    lease_epoch: int | None = None
    """The epoch of the attempt that journaled it (``None`` for rows written before the fleet)."""
    expires_at: float | None = None
    """For a snapshot: when it expires (seconds since the epoch); ``None``: kept until deleted."""


@dataclass(frozen=True)
class EnrollmentRow:
    target: ExecutionTarget
    endpoint: str
    source: str
    kind: str
    envelope_digest: str
    envelope: str
    ceiling: str
    evidence: dict[str, Any] | None
    credential_path: str | None
    credential_fingerprint: str | None
    enrolled_at: float


@dataclass(frozen=True)
class EventRow:
    run_id: str
    member: str
    allocation_key: str | None
    started_at: float
    duration_ms: float
    outcome: str
    error_code: str | None
    detail: str | None


@dataclass(frozen=True)
class RunRow:
    run_id: str
    runner_tag: str
    target: ExecutionTarget | None
    """``None`` while a submitted Run waits for a runner to select its adapter."""
    profile_digest: str | None
    command: list[str] | None
    status: str
    exit_code: int | None
    summary: dict[str, Any] | None
    created_at: float
    finished_at: float | None
    attempt: int = 0
    """Attempts a runner of the fleet claimed (0 for a Run started in place)."""
    runner_id: str | None = None
    site: str | None = None
    """The adapter placement it landed on (a Docker engine's name, when there are several)."""
    owner: str | None = None
    """The process that started it in place (``host/pid/start``); ``None`` for a Run of the fleet."""
    owner_boot: str | None = None
    """The kernel's boot id when its owner started it."""
    story: dict[str, Any] | None = None
    """Adapter, grade, axes and staged files, as recorded when it started (``checkfu runs show --html``)."""


@dataclass(frozen=True)
class Housekeeping:
    """What a command's opening pass may have to do (``Journal.housekeeping``)."""

    sandboxes: bool
    """Long-lived sandboxes that may be due for reclaiming, or snapshots of them still being taken (``pending``: their
    process may have died mid-way)."""
    snapshots: bool
    """Snapshots past their expiry."""
    orphans: bool
    """Runs still recorded running that have an owner process (whose liveness the reaper checks)."""


@dataclass(frozen=True)
class OwnedRun:
    """A Run still recorded ``running`` with an owner process: a candidate orphan."""

    run_id: str
    runner_tag: str
    target: str | None
    owner: str
    owner_boot: str | None


@dataclass(frozen=True)
class OutputRow:
    id: int
    attempt: int
    stream: str
    data: bytes
    at: float


class JournalError(Exception):
    """The journal failed an operation: a typed fault of the runner's own store, never a provider's.

    ``operation`` names what was being recorded or read; the message says why and for how long it was tried.
    """

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"{operation}: {reason}")
        self.operation = operation
        self.reason = reason


class JournalUnavailable(JournalError):
    """The journal stayed locked or unreachable for the whole of its deadline (``database is locked``, a
    server that does not answer). Retried until then; a Run's release goes on without it."""


DEFAULT_JOURNAL_DEADLINE = 30.0
"""How long one journal operation is retried while the journal is locked or unreachable."""
FAILING_DEADLINE = 1.0
"""Once an operation has run out of its deadline, later ones try this long until one succeeds again,
so a Run winding up against a dead journal is not held up for the whole deadline at every step."""
_BACKOFF = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
BUSY_WAIT_MS = 1000
"""SQLite's own wait for a lock, per attempt (its busy timeout); off for an attempt on the event loop."""

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _transient(exc: sa_exc.SQLAlchemyError) -> bool:
    """Whether retrying may help: a lock, a busy database, a dropped or refused connection, a full pool."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError)


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class _WriteKeys:
    """Fresh write keys, cheaply: a random prefix per process (drawn again in a forked child) and a counter."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.prefix = uuid.uuid4().hex[:20]
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


_RETRYING: contextvars.ContextVar[bool] = contextvars.ContextVar("journal_retrying", default=False)
"""Set while a journaled method runs again after a transient failure (which may have committed)."""
_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("journal_inline", default=False)
"""Set while ``Journal.call`` makes an operation's first attempt on the event loop: a transient failure is not
waited out there (no backoff sleep; SQLite's busy wait off) but handed to a worker thread (``_RetryElsewhere``)."""
_RESUMED: contextvars.ContextVar[bool] = contextvars.ContextVar("journal_resumed", default=False)
"""Set in the worker thread that carries on an operation whose first attempt failed on the event loop: its next
attempt is a retry (that first attempt may have committed)."""


class _RetryElsewhere(Exception):
    """An operation's first attempt on the event loop failed transiently; ``resume`` carries it on, as a retry."""

    def __init__(self, resume: Callable[[], Any]) -> None:
        super().__init__("retry in a worker thread")
        self.resume = resume


new_write_key = _WriteKeys()
"""A key no other write of any process has: ``events.write_key``, ``run_output.write_key``."""
os.register_at_fork(after_in_child=new_write_key.reset)


def journaled(operation: str, *, keyed: bool = False) -> Callable[[F], F]:
    """Make a method one retried journal operation (its object is a ``Journal`` or has ``.journal``).

    The method must be one transaction, so a failed attempt changed nothing and running it again is safe.
    A lock or a dropped connection is retried with backoff within the journal's deadline, then raised as
    ``JournalUnavailable``; any other database error is raised as ``JournalError`` at once.

    A dropped connection is ambiguous about a commit: the first attempt may have committed and lost only its
    acknowledgement. So a retried insert must find its own row rather than write a second: every insert of a
    journaled method goes through ``Journal.insert_once``, keyed by the row's primary key or, for a table whose
    rows have none of their own (events, output), a ``write_key``; with ``keyed``, the method takes a keyword
    ``write_key``, chosen here once (``new_write_key``) before the first attempt when the caller gives none.
    """

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def retried(self: Any, *args: Any, **kwargs: Any) -> Any:
            if keyed and kwargs.get("write_key") is None:
                kwargs["write_key"] = new_write_key()
            journal: Journal = getattr(self, "journal", self)
            deadline = FAILING_DEADLINE if journal.failing else journal.deadline
            resumed = _RESUMED.get()
            if resumed:
                _RESUMED.set(False)  # the operations it makes in turn start afresh
            t0 = time.monotonic()
            for attempt in itertools.count():
                token = _RETRYING.set(attempt > 0 or resumed)
                try:
                    result = method(self, *args, **kwargs)
                except _RetryElsewhere:  # an operation it made failed on the event loop: all of this one goes
                    raise _RetryElsewhere(functools.partial(retried, self, *args, **kwargs)) from None
                except sa_exc.SQLAlchemyError as exc:
                    if not _transient(exc):
                        raise JournalError(operation, _reason(exc)) from None
                    if _INLINE.get():  # on the event loop: waited out in a worker thread, never here
                        raise _RetryElsewhere(functools.partial(retried, self, *args, **kwargs)) from None
                    waited = time.monotonic() - t0
                    if waited >= deadline:
                        journal.failing = True
                        raise JournalUnavailable(
                            operation, f"{_reason(exc)} (tried {attempt + 1} times over {waited:.1f} s)"
                        ) from None
                    time.sleep(min(_BACKOFF[min(attempt, len(_BACKOFF) - 1)], max(0.0, deadline - waited)))
                    continue
                finally:
                    _RETRYING.reset(token)
                journal.failing = False
                return result
            raise AssertionError("unreachable")

        retried.journaled = True  # type: ignore[attr-defined]
        return retried  # type: ignore[return-value]

    return wrap


def _resumed(resume: Callable[[], T]) -> T:
    """In a worker thread: carry on an operation whose first attempt failed on the event loop, as a retry."""
    _RESUMED.set(True)
    return resume()


def sqlite_url(path: Path) -> str:
    return f"sqlite+pysqlite:///{path}"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and foreign-thread use.

    A SQLite file that does not exist yet is made here, empty and ``0600``, before SQLite opens it: it holds
    every Run's argv and output, and SQLite gives its side files (``-wal``, ``-shm``, ``-journal``) the
    database file's mode. A file that exists keeps its mode.
    """
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite+pysqlite://", "sqlite+pysqlite:///:memory:"):
            return sa.create_engine(
                "sqlite+pysqlite://", connect_args={"check_same_thread": False}, poolclass=StaticPool
            )
        # A short busy wait per attempt: ``journaled`` retries within the journal's own deadline.
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_WAIT_MS / 1000})
        if _sqlite_file(engine) and not engine.url.query.get("uri"):  # a file: URI is SQLite's to open
            with contextlib.suppress(OSError):  # it exists (kept as it is), or SQLite says why it cannot be made
                owner_only.create_file(Path(str(engine.url.database)), b"")

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def sandboxes_maybe_due(runner_tag: str, now: float) -> list[Any]:
    """Which long-lived sandboxes of ``runner_tag`` may be reclaimable at ``now``, over ``sandboxes`` joined with
    their ``leases``: deadline passed, owned by a process (whose liveness the caller checks), or a lease ended or
    run out (``SandboxBook.due`` and ``Journal.housekeeping`` ask it)."""
    return [
        sandboxes.c.state.in_(["provisioning", "live"]),
        sandboxes.c.runner_tag == runner_tag,
        sa.or_(
            sandboxes.c.expires_at < now,
            leases.c.expires_at < now,
            leases.c.ended.is_(True),
            sandboxes.c.owner.is_not(None),
        ),
    ]


def snapshots_pending(runner_tag: str) -> list[Any]:
    """Snapshots of ``runner_tag``'s long-lived sandboxes still being taken (``pending``): their process may have
    died mid-way, which the caller checks by ``owner`` (``SandboxBook.pending_snapshots``, ``Journal.housekeeping``)."""
    return [sandbox_snapshots.c.state == "pending", sandbox_snapshots.c.runner_tag == runner_tag]


def _snapshots_expired(now: float, runner_tag: str | None) -> list[Any]:
    """Settled (``live``) snapshots, of ``runner_tag`` when given, whose ``expires_at`` is at or before ``now``
    (``Journal.expired_snapshots`` and ``Journal.housekeeping`` ask it)."""
    tagged = [] if runner_tag is None else [allocations.c.runner_tag == runner_tag]
    return [allocations.c.kind == "snapshot", allocations.c.state == "live", allocations.c.expires_at <= now, *tagged]


def _runs_owned_running(runner_tag: str | None) -> list[Any]:
    """Runs still ``running`` that have an owner process, of ``runner_tag`` when given
    (``Journal.owned_running_runs`` and ``Journal.housekeeping`` ask it)."""
    tagged = [] if runner_tag is None else [runs.c.runner_tag == runner_tag]
    return [runs.c.status == "running", runs.c.owner.is_not(None), *tagged]


_SHARED_SQLITE: list[tuple[Any, Any]] = []
"""The process's SQLite dialect and its compiled-statement cache, once a SQLite file's journal has opened."""


def _sqlite_file(engine: Engine) -> bool:
    """Whether ``engine`` reaches a SQLite database in a file (not in memory, not another database)."""
    return engine.url.get_backend_name() == "sqlite" and engine.url.database not in (None, "", ":memory:")


def _share_compiled(engine: Engine) -> None:
    """Give ``engine`` (once connected) the process's one SQLite dialect and compiled-statement cache.

    SQLAlchemy compiles each statement once per engine: it keys the compiled form by the dialect object, and
    every engine makes its own. A command opens one journal, so every statement a Run writes was compiled anew in
    every command: about 15 ms of a warm ``checkfu run``. Every SQLite file is reached through the same library
    in a process, so every SQLite file's engine can use the first one's dialect (initialized when it connected)
    and cache; the start-up server fills them before it forks (``rehearse``). An in-memory database and every
    other database keep their own."""
    if not _sqlite_file(engine):
        return
    if not _SHARED_SQLITE:
        if getattr(engine.dialect, "server_version_info", None) is not None:  # initialized: it has connected
            _SHARED_SQLITE.append((engine.dialect, engine._compiled_cache))
        return
    dialect, cache = _SHARED_SQLITE[0]
    if type(dialect) is type(engine.dialect) and dialect.dbapi is engine.dialect.dbapi:
        engine.dialect = dialect
        engine._compiled_cache = cache


_INSERTS: dict[str, sa.Insert] = {}
"""Each table's insert, built once."""


def _insert(table: sa.Table) -> sa.Insert:
    found = _INSERTS.get(table.name)
    if found is None:
        found = _INSERTS[table.name] = table.insert()
    return found


class Journal:
    """Durable runner state. Every method is one short transaction."""

    def __init__(self, url: str, *, deadline: float = DEFAULT_JOURNAL_DEADLINE) -> None:
        self.url = url
        self.deadline = deadline
        """How long each operation is retried while the journal is locked or unreachable."""
        self.failing = False
        """Set when an operation ran out of its deadline, until one succeeds again."""
        self.unrecorded = 0
        """Provider calls whose event could not be recorded (the journal was unavailable): they still happened."""
        self.engine = make_engine(url)
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        """Set by ``offload``: where ``call`` makes every operation."""
        self._sqlite_file = _sqlite_file(self.engine)
        """What ``tx(durable=True)`` syncs to disk itself."""
        try:
            self._upgrade()
        except BaseException:
            self.engine.dispose()
            raise
        _share_compiled(self.engine)

    def _upgrade(self) -> None:
        """Bring the schema to the current revision; a lock held by another migrator is waited out (retried
        with backoff) within the journal's deadline, then its error is raised as it came."""
        t0 = time.monotonic()
        for attempt in itertools.count():
            try:
                upgrade(self.engine)
                return
            except sa_exc.SQLAlchemyError as exc:
                waited = time.monotonic() - t0
                if not _transient(exc) or waited >= self.deadline:
                    raise
                time.sleep(min(_BACKOFF[min(attempt, len(_BACKOFF) - 1)], max(0.0, self.deadline - waited)))

    @contextmanager
    def tx(self, *, durable: bool = False) -> Iterator[Connection]:
        """One transaction. ``durable``: committed only once it is on disk, for a record a provider is asked to
        act on next (an allocation's, before it is asked for), which a loss of power must not take back.

        A SQLite file's journal writes ahead to its log (WAL) with ``synchronous=NORMAL``: each commit is written
        to the log, which the kernel syncs to disk later (a process that dies loses nothing; a machine that loses
        power may lose the last commits). A durable transaction is committed with ``synchronous=FULL``, which syncs
        the log first (measured here: 0.4 ms, against 0.03 ms). Every other database this journal supports
        commits durably already.

        An attempt on the event loop (``Journal.call``) does not wait for a SQLite lock (busy timeout 0): it fails at
        once, and the operation waits in a worker thread instead."""
        if not self._sqlite_file:
            with self.engine.begin() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            fairy = conn.connection
            sqlite, dbapi = fairy.driver_connection, self.engine.dialect.dbapi
            assert sqlite is not None and dbapi is not None
            wait = 0 if _INLINE.get() else BUSY_WAIT_MS
            pragmas = [
                *([f"PRAGMA busy_timeout={wait}"] if fairy.info.get("busy_timeout", BUSY_WAIT_MS) != wait else []),
                *(["PRAGMA synchronous=FULL"] if durable else []),
            ]
            try:
                for pragma in pragmas:  # outside any transaction: the driver begins one at a write
                    sqlite.execute(pragma)
            except dbapi.Error as exc:  # raised as SQLAlchemy raises the driver's errors, for ``journaled`` to judge
                raise sa_exc.DBAPIError.instance(pragmas[0], None, exc, dbapi.Error) from None
            fairy.info["busy_timeout"] = wait  # set only when it changes: on the loop, every attempt is one
            try:
                with conn.begin():
                    yield conn
            finally:
                if durable:
                    with contextlib.suppress(Exception):  # a connection that broke is not pooled again
                        sqlite.execute("PRAGMA synchronous=NORMAL")

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self.engine.dispose()

    def offload(self, workers: int) -> None:
        """From now on, make every operation that async code hands to ``call`` (and ``work``) in a pool of ``workers``
        threads, never on the event loop: for a long-lived process that serves many Runs at once (``checkfu runner
        serve``), where a transaction's round trip to PostgreSQL, or a wait for SQLite's lock, would otherwise hold
        up every other Run, the heartbeat included. A one-shot command keeps the inline first attempt (a thread hop
        costs more than its few short writes). An in-memory database has one connection: one worker."""
        if self._worker is None:
            one = isinstance(self.engine.pool, StaticPool)
            self._worker = concurrent.futures.ThreadPoolExecutor(
                max_workers=1 if one else max(1, workers), thread_name_prefix="checkfu-journal"
            )

    async def work(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Synchronous work that makes journal operations among other things (a Run's selection and first
        records): in the journal's workers once it is ``offload``-ed, else here, as it always was."""
        if self._worker is None:
            return fn(*args, **kwargs)
        return await self._in_worker(functools.partial(fn, *args, **kwargs))

    async def _in_worker(self, fn: Callable[[], T]) -> T:
        """``fn`` in a worker thread, in a copy of the caller's context. A cancellation that comes meanwhile waits
        for it to end before it is raised, as it would for an operation made inline: a write the caller was
        cancelled during is never still under way while its cleanup writes the same rows."""
        assert self._worker is not None
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._worker, contextvars.copy_context().run, fn)
        cancelled: asyncio.CancelledError | None = None
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError as exc:
                if not future.done() or not future.cancelled():
                    cancelled = exc  # the caller's, not the work's: waited out, then raised
            except BaseException:
                pass  # the work's own failure: raised below, from the future
        if cancelled is not None:
            if not future.cancelled():
                future.exception()  # retrieved: the cancellation is what the caller sees
            raise cancelled
        return future.result()

    async def call(self, operation: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Make a journal operation from async code without ever stalling the event loop on it.

        Its first attempt runs inline: one short transaction, the path every member call takes (a thread hop each
        would cost more than the write). If that attempt fails transiently (a lock, a dropped connection), it is
        not waited out on the loop (SQLite's busy wait is off for it, and no backoff sleeps there): the operation
        is carried on in a worker thread, as a retry (its first attempt may have committed: ``insert_once``),
        with backoff within the journal's deadline, while other tasks run.

        ``operation`` is best a ``journaled`` method: it is resumed from its own arguments (the write key chosen
        for its first attempt kept). Anything else is run again whole in the thread.

        Raises:
            JournalError: as ``operation`` does (``JournalUnavailable`` once the deadline passed).
        """
        if self._worker is not None:
            return await self._in_worker(functools.partial(operation, *args, **kwargs))
        token = _INLINE.set(True)
        try:
            return operation(*args, **kwargs)
        except _RetryElsewhere as again:
            resume = (
                again.resume
                if getattr(operation, "journaled", False)
                else functools.partial(operation, *args, **kwargs)
            )
        finally:
            _INLINE.reset(token)
        return await asyncio.to_thread(_resumed, resume)

    async def record_call_async(self, call: CallRecord) -> None:
        """``record_call`` from async code, through ``call``: never raises, never stalls the event loop."""
        try:
            await self.call(self.record_event, **_event_of(call))
        except JournalError:
            self.unrecorded += 1

    def insert_once(
        self,
        c: Connection,
        table: sa.Table,
        rows: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        key: str,
        scope: str | None = None,
    ) -> None:
        """Insert ``rows`` into ``table`` within ``c``'s transaction, exactly once by their ``key`` column: the
        primary key, or a ``write_key`` chosen before the first attempt (found within ``scope``, an indexed column
        all the rows share, such as ``run_id``).

        A first attempt is a plain insert: nothing is looked for (the fast path). A retry (``journaled``, after a
        transient failure, which may have committed and lost only its acknowledgement) first looks: rows already
        there under the key are this very write's, committed by that earlier attempt, and nothing is written again
        (one transaction wrote them all, or none).

        Raises:
            sqlalchemy.exc.IntegrityError: the key is held already, on a first attempt, or on a retry by a row with
                other values (not this write's); the journaled method raises it as ``JournalError``, never retried.
        """
        many = [rows] if isinstance(rows, Mapping) else list(rows)
        if not many:
            return
        if _RETRYING.get():
            first = many[0]
            where = [table.c[key].in_([r[key] for r in many])]
            if scope is not None:
                where.append(table.c[scope] == first[scope])
            found = c.execute(sa.select(table).where(*where)).mappings().all()
            if found:
                mine = {r[key]: r for r in many}
                if len(found) != len(many) or any(
                    any(row[k] != v for k, v in mine.get(row[key], {}).items()) for row in found
                ):
                    held = ValueError(f"UNIQUE constraint: {table.name}.{key} {first[key]!r} is held by another row")
                    raise sa_exc.IntegrityError(f"INSERT INTO {table.name}", None, held)  # ``journaled`` types it
                return
        c.execute(_insert(table), many[0] if len(many) == 1 else many)

    # runs ---------------------------------------------------------------------------------

    @journaled("start_run")
    def start_run(
        self,
        run_id: str,
        *,
        runner_tag: str,
        target: ExecutionTarget,
        now: float,
        profile_digest: str | None = None,
        command: Sequence[str] | None = None,
        owner: str | None = None,
        owner_boot: str | None = None,
        story: dict[str, Any] | None = None,
    ) -> None:
        row = {
            "run_id": run_id,
            "runner_tag": runner_tag,
            "target": target.model_dump_json(),
            "profile_digest": profile_digest,
            "command": json.dumps(list(command)) if command is not None else None,
            "status": "running",
            "created_at": now,
            "owner": owner,
            "owner_boot": owner_boot,
            "story": json.dumps(story) if story is not None else None,
        }
        with self.tx() as c:
            self.insert_once(c, runs, row, key="run_id")

    @journaled("finish_run")
    def finish_run(
        self,
        run_id: str,
        *,
        status: str,
        now: float,
        exit_code: int | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        with self.tx() as c:
            c.execute(
                runs.update()
                .where(runs.c.run_id == run_id)
                .values(
                    status=status,
                    exit_code=exit_code,
                    finished_at=now,
                    summary=json.dumps(summary) if summary is not None else None,
                )
            )

    @journaled("run")
    def run(self, run_id: str) -> RunRow | None:
        with self.tx() as c:
            row = c.execute(runs.select().where(runs.c.run_id == run_id)).mappings().first()
        return _run_row(row) if row else None

    @journaled("find_runs")
    def find_runs(self, prefix: str) -> list[RunRow]:
        with self.tx() as c:
            rows = c.execute(runs.select().where(runs.c.run_id.startswith(prefix, autoescape=True))).mappings().all()
        return [_run_row(r) for r in rows]

    @journaled("unsettled_runs")
    def unsettled_runs(self, *, runner_tag: str) -> list[RunRow]:
        """This runner tag's Runs still recorded ``running``, oldest first (reconciliation settles the abandoned);
        never a queued Run (``checkfu submit``), which a runner of the fleet takes over instead."""
        q = runs.select().where(
            runs.c.status == "running",
            runs.c.runner_tag == runner_tag,
            runs.c.request.is_(None),  # a queued Run's: the fleet takes it over and runs it again
        )
        with self.tx() as c:
            rows = c.execute(q.order_by(runs.c.created_at)).mappings().all()
        return [_run_row(r) for r in rows]

    @journaled("settle_abandoned_run")
    def settle_abandoned_run(self, run_id: str, *, now: float, summary: dict[str, Any]) -> bool:
        """Record a Run whose runner is gone as ``abandoned``, unless it finished meanwhile; returns whether it did."""
        with self.tx() as c:
            done = c.execute(
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.status == "running")
                .values(status=ABANDONED, finished_at=now, summary=json.dumps(summary))
            ).rowcount
        return bool(done == 1)

    @journaled("housekeeping")
    def housekeeping(self, *, runner_tag: str, now: float) -> Housekeeping:
        """Whether ``runner_tag`` has anything a command's opening pass would act on, in one read: long-lived
        sandboxes that may be due (``SandboxBook.due``'s condition), expired snapshots (``expired_snapshots``'),
        Runs with an owner process still recorded running (``owned_running_runs``'). Each is built by the same
        function as that query's, so a pass skipped on a ``False`` would have found nothing."""
        maybe_due = (
            sa.select(sa.literal(1))
            .select_from(sandboxes.join(leases, leases.c.lease_id == sandboxes.c.lease_id))
            .where(*sandboxes_maybe_due(runner_tag, now))
        )
        expired = sa.select(sa.literal(1)).where(*_snapshots_expired(now, runner_tag))
        owned = sa.select(sa.literal(1)).where(*_runs_owned_running(runner_tag))
        taking = sa.select(sa.literal(1)).where(*snapshots_pending(runner_tag))
        q = sa.select(maybe_due.exists(), expired.exists(), owned.exists(), taking.exists())
        with self.tx() as c:
            row = c.execute(q).one()
        return Housekeeping(sandboxes=bool(row[0] or row[3]), snapshots=bool(row[1]), orphans=bool(row[2]))

    @journaled("owned_running_runs")
    def owned_running_runs(self, *, runner_tag: str | None = None) -> list[OwnedRun]:
        """Every Run still ``running`` that has an owner process (of ``runner_tag`` when given): one query, by the
        ``status`` index, reading five columns (what every journal-opening command pays to find orphans when there
        are none)."""
        q = sa.select(runs.c.run_id, runs.c.runner_tag, runs.c.target, runs.c.owner, runs.c.owner_boot).where(
            *_runs_owned_running(runner_tag)
        )
        with self.tx() as c:
            rows = c.execute(q).all()
        return [OwnedRun(r.run_id, r.runner_tag, r.target, r.owner, r.owner_boot) for r in rows]

    @journaled("settle_orphaned_run")
    def settle_orphaned_run(self, run_id: str, *, now: float, summary: dict[str, Any]) -> bool:
        """Record a Run whose owner process is gone as ``orphaned`` (reaped), unless it finished meanwhile;
        returns whether it did, so of several reapers at once exactly one settles it."""
        with self.tx() as c:
            done = c.execute(
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.status == "running")
                .values(status=ORPHANED, finished_at=now, summary=json.dumps(summary))
            ).rowcount
            if done == 1:
                c.execute(
                    _INSERT_EVENT,
                    {
                        "run_id": run_id,
                        "member": "reap",
                        "allocation_key": None,
                        "started_at": now,
                        "duration_ms": 0.0,
                        "outcome": "ok",
                        "error_code": None,
                        "detail": str(summary.get("reason", ""))[:2000],
                    },
                )
        return bool(done == 1)

    # output -------------------------------------------------------------------------------

    @journaled("append_output", keyed=True)
    def append_output(
        self,
        run_id: str,
        chunks: Sequence[tuple[str, bytes]],
        *,
        now: float,
        attempt: int = 0,
        write_key: str | None = None,
    ) -> None:
        """Keep ``chunks`` (``out``/``err``, bytes) of a Run started in place, in order, in one transaction."""
        if not chunks:
            return
        rows = [
            {"run_id": run_id, "attempt": attempt, "stream": stream, "data": data, "at": now}
            | {"write_key": f"{write_key}.{n}"}
            for n, (stream, data) in enumerate(chunks)
        ]
        with self.tx() as c:
            self.insert_once(c, run_output, rows, key="write_key", scope="run_id")

    @journaled("output_since")
    def output_since(self, run_id: str, after: int = 0, limit: int = 1000) -> list[OutputRow]:
        """A Run's kept output after row ``after``, oldest first, at most ``limit`` rows."""
        with self.tx() as c:
            rows = c.execute(
                sa.select(run_output)
                .where(run_output.c.run_id == run_id, run_output.c.id > after)
                .order_by(run_output.c.id)
                .limit(limit)
            ).all()
        return [OutputRow(r.id, r.attempt, r.stream, bytes(r.data), r.at) for r in rows]

    @journaled("lease_ids_for_run")
    def lease_ids_for_run(self, run_id: str) -> list[str]:
        with self.tx() as c:
            return list(c.execute(sa.select(leases.c.lease_id).where(leases.c.run_id == run_id)).scalars())

    @journaled("list_runs")
    def list_runs(self, limit: int = 50) -> list[RunRow]:
        with self.tx() as c:
            rows = c.execute(runs.select().order_by(runs.c.created_at.desc()).limit(limit)).mappings().all()
        return [_run_row(r) for r in rows]

    # allocations --------------------------------------------------------------------------

    @journaled("journal_allocation")
    def journal_allocation(
        self,
        key: str,
        *,
        run_id: str,
        kind: AllocationKind,
        target: ExecutionTarget,
        runner_tag: str,
        lease_id: str,
        now: float,
        parent_key: str | None = None,
        site: str | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Record an allocation as ``pending`` before the provider is asked for it.

        With ``fence``, only while that lease is current (its epoch, not ended), checked in the same
        transaction: a runner whose attempt was taken over journals nothing.

        The record is on disk when this returns (``tx(durable=True)``): a provider may hold what it allocates
        past a loss of power (a created container does), and compensation finds it only by this record's key.

        Raises:
            SandboxLeaseFenced: ``fence`` was taken over or ended; nothing was written.
        """
        with self.tx(durable=True) as c:
            if fence is not None:
                hold_lease(c, fence)
            self.insert_once(
                c,
                allocations,
                {
                    "allocation_key": key,
                    "run_id": run_id,
                    "kind": kind,
                    "target": target.model_dump_json(),
                    "runner_tag": runner_tag,
                    "lease_id": lease_id,
                    "state": "pending",
                    "object_id": None,
                    "parent_key": parent_key,
                    "created_at": now,
                    "updated_at": now,
                    "site": site,
                    "lease_epoch": fence.lease_epoch if fence is not None else None,
                },
                key="allocation_key",
            )

    @journaled("fenced write")
    def fenced_write(
        self,
        fence: Lease,
        *,
        renew_until: float | None = None,
        allocation: Mapping[str, Any] | None = None,
        settle: Mapping[str, Any] | None = None,
        calls: Sequence[Mapping[str, Any]] = (),
        open_rows_of: str | None = None,
    ) -> list[AllocationRow] | None:
        """What one step of an attempt writes, in one transaction that first holds ``fence`` (its epoch, not ended):
        the lease renewed until ``renew_until`` (the fence of the provider call that follows), a ``pending``
        ``allocation`` row (``journal_allocation``'s values, written before the provider is asked for it, and on disk
        when this returns), a row moved (``settle``: ``set_allocation``'s ``key``, ``state``, ``now``, ``object_id``,
        ``expires_at``), and the ``calls`` recorded since the last write (``record_event``'s rows, each with its
        ``write_key``), in that order. A runner whose attempt was taken over writes none of it. With ``open_rows_of``
        (a Run's id), returns that Run's open rows as they are once written (``open_allocations``), else ``None``.

        Raises:
            SandboxLeaseFenced: ``fence`` was taken over or ended; nothing was written.
        """
        with self.tx(durable=allocation is not None) as c:
            if renew_until is None:
                hold_lease(c, fence)
            elif c.execute(_RENEW_HELD, lease_params(fence, until=renew_until)).rowcount != 1:
                raise _not_current(fence)
            if allocation is not None:
                row = {**allocation, "lease_epoch": fence.lease_epoch}
                self.insert_once(c, allocations, row, key="allocation_key")
            if settle is not None:
                params: dict[str, Any] = {"key": settle["key"], "state": settle["state"], "now": settle["now"]}
                if settle.get("object_id") is not None:
                    params["object_id"] = settle["object_id"]
                c.execute(_UPDATE_ALLOCATION if "object_id" not in params else _UPDATE_ALLOCATION_OBJECT, params)
                if settle.get("expires_at") is not None:
                    c.execute(_SET_EXPIRY, {"key": settle["key"], "expires_at": settle["expires_at"]})
            if calls:
                self.insert_once(c, events, list(calls), key="write_key", scope="run_id")
            if open_rows_of is None:
                return None
            q = allocations.select().where(allocations.c.state.in_(OPEN_STATES), allocations.c.run_id == open_rows_of)
            rows = c.execute(q.order_by(allocations.c.created_at)).mappings().all()
        return [_allocation_row(r) for r in rows]

    @journaled("record_events")
    def record_events(self, calls: Sequence[Mapping[str, Any]]) -> None:
        """Record ``calls`` (``record_event``'s rows of one Run, each with its ``write_key``) in one transaction."""
        if not calls:
            return
        with self.tx() as c:
            self.insert_once(c, events, list(calls), key="write_key", scope="run_id")

    @journaled("set_allocation")
    def set_allocation(
        self,
        key: str,
        state: AllocationState,
        *,
        now: float,
        object_id: str | None = None,
        expires_at: float | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Move the row of ``key`` to ``state`` (recording a snapshot's ``expires_at`` when given); with
        ``fence``, only while that lease is current.

        Raises:
            SandboxLeaseFenced: ``fence`` was taken over or ended; nothing was written.
        """
        params: dict[str, Any] = {"key": key, "state": state, "now": now}
        if object_id is not None:
            params["object_id"] = object_id
        with self.tx() as c:
            if fence is not None:
                hold_lease(c, fence)
            c.execute(_UPDATE_ALLOCATION if object_id is None else _UPDATE_ALLOCATION_OBJECT, params)
            if expires_at is not None:
                c.execute(_SET_EXPIRY, {"key": key, "expires_at": expires_at})

    @journaled("adopt_allocation")
    def adopt_allocation(
        self,
        key: str,
        *,
        from_run: str,
        from_lease: Lease,
        from_owner: str,
        to_run: str,
        to_lease: Lease,
        now: float,
    ) -> bool:
        """Move the ``live`` allocation ``key`` from ``from_run`` (under ``from_lease``, held by ``from_owner``, no
        process: a pooled sandbox waiting for a Run) to ``to_run`` under ``to_lease``: one compare-and-set, all or
        nothing, in one transaction.

        ``to_lease`` must be current; ``from_lease`` is ended at the epoch read, bumped (a straggler under it is
        fenced), and only while it is current, still held by ``from_owner`` and not expired at ``now``; the row moves
        only if it is still ``from_run``'s and live. Returns whether this caller won; a loser changed nothing.

        Raises:
            SandboxLeaseFenced: ``to_lease`` was taken over or ended; nothing was written.
        """
        try:
            with self.tx() as c:
                hold_lease(c, to_lease)
                if c.execute(_ADOPT_LEASE, lease_params(from_lease, from_owner=from_owner, now=now)).rowcount != 1:
                    raise _Lost
                moved = c.execute(
                    _ADOPT_ALLOCATION,
                    lease_params(
                        from_lease,
                        key=key,
                        from_run=from_run,
                        to_run=to_run,
                        to_lease=to_lease.lease_id,
                        to_epoch=to_lease.lease_epoch,
                        now=now,
                    ),
                ).rowcount
                if moved != 1:
                    raise _Lost
        except _Lost:
            return False
        return True

    @journaled("expired_snapshots")
    def expired_snapshots(self, *, now: float, runner_tag: str | None = None) -> list[AllocationRow]:
        """Settled (``live``) snapshots whose ``expires_at`` is at or before ``now``, oldest expiry first."""
        q = allocations.select().where(*_snapshots_expired(now, runner_tag))
        with self.tx() as c:
            rows = c.execute(q.order_by(allocations.c.expires_at)).mappings().all()
        return [_allocation_row(r) for r in rows]

    @journaled("snapshots")
    def snapshots(self, *, runner_tag: str | None = None) -> list[AllocationRow]:
        """Every snapshot row still ``pending`` or ``live``, oldest first."""
        q = allocations.select().where(allocations.c.kind == "snapshot", allocations.c.state.in_(OPEN_STATES))
        if runner_tag is not None:
            q = q.where(allocations.c.runner_tag == runner_tag)
        with self.tx() as c:
            rows = c.execute(q.order_by(allocations.c.created_at)).mappings().all()
        return [_allocation_row(r) for r in rows]

    @journaled("allocation")
    def allocation(self, key: str) -> AllocationRow | None:
        with self.tx() as c:
            row = c.execute(allocations.select().where(allocations.c.allocation_key == key)).mappings().first()
        return _allocation_row(row) if row else None

    @journaled("open_allocations")
    def open_allocations(self, *, runner_tag: str | None = None, run_id: str | None = None) -> list[AllocationRow]:
        q = allocations.select().where(allocations.c.state.in_(OPEN_STATES))
        if runner_tag is not None:
            q = q.where(allocations.c.runner_tag == runner_tag)
        if run_id is not None:
            q = q.where(allocations.c.run_id == run_id)
        with self.tx() as c:
            rows = c.execute(q.order_by(allocations.c.created_at)).mappings().all()
        return [_allocation_row(r) for r in rows]

    @journaled("allocations_for_run")
    def allocations_for_run(self, run_id: str) -> list[AllocationRow]:
        with self.tx() as c:
            rows = (
                c.execute(allocations.select().where(allocations.c.run_id == run_id).order_by(allocations.c.created_at))
                .mappings()
                .all()
            )
        return [_allocation_row(r) for r in rows]

    # events -------------------------------------------------------------------------------

    @journaled("record_event", keyed=True)
    def record_event(
        self,
        run_id: str,
        member: str,
        *,
        started_at: float,
        duration_ms: float,
        outcome: str,
        allocation_key: str | None = None,
        error_code: str | None = None,
        detail: str | None = None,
        write_key: str | None = None,
    ) -> None:
        with self.tx() as c:
            self.insert_once(
                c,
                events,
                {
                    "run_id": run_id,
                    "member": member,
                    "allocation_key": allocation_key,
                    "started_at": started_at,
                    "duration_ms": duration_ms,
                    "outcome": outcome,
                    "error_code": error_code,
                    "detail": detail,
                    "write_key": write_key,
                },
                key="write_key",
                scope="run_id",
            )

    def record_call(self, call: CallRecord) -> None:
        """Record one provider call (the door's ``Recorder``). Never raises: a call that cannot be recorded
        (the journal is unavailable) still happened, and is counted in ``unrecorded``."""
        try:
            self.record_event(**_event_of(call))
        except JournalError:
            self.unrecorded += 1

    # enrollments --------------------------------------------------------------------------------

    @journaled("record_enrollment")
    def record_enrollment(
        self,
        target: ExecutionTarget,
        *,
        source: str,
        kind: str,
        envelope_digest: str,
        envelope: str,
        ceiling: str,
        now: float,
        evidence: dict[str, Any] | None = None,
        credential_path: str | None = None,
        credential_fingerprint: str | None = None,
        endpoint: str = "",
    ) -> None:
        """Record (or replace) the enrollment of ``target`` at ``endpoint`` (``''``: loaded in-process)."""
        key = target_text(target)
        values = {
            "target": key,
            "endpoint": endpoint,
            "provider": target.provider,
            "source": source,
            "kind": kind,
            "envelope_digest": envelope_digest,
            "envelope": envelope,
            "ceiling": ceiling,
            "evidence": json.dumps(evidence) if evidence is not None else None,
            "credential_path": credential_path,
            "credential_fingerprint": credential_fingerprint,
            "enrolled_at": now,
        }
        for attempt in range(3):
            try:
                with self.tx() as c:
                    c.execute(
                        enrollments.delete().where(enrollments.c.target == key, enrollments.c.endpoint == endpoint)
                    )
                    c.execute(enrollments.insert().values(**values))
                return
            except sa_exc.IntegrityError:
                # Another runner recorded the same enrollment between this one's delete and its insert (PostgreSQL's
                # read committed sees no row to delete while the other's insert is uncommitted): made again, its
                # delete now sees that row and replaces it, the last to record winning as a replace does.
                if attempt == 2:
                    raise

    @journaled("enrollment")
    def enrollment(self, target: ExecutionTarget, endpoint: str = "") -> EnrollmentRow | None:
        """The enrollment of ``target`` at ``endpoint`` (``''``: the provider loaded in-process), if any."""
        q = enrollments.select().where(enrollments.c.target == target_text(target), enrollments.c.endpoint == endpoint)
        with self.tx() as c:
            row = c.execute(q).mappings().first()
        return _enrollment_row(row) if row else None

    @journaled("enrollment_at")
    def enrollment_at(self, endpoint: str) -> EnrollmentRow | None:
        """The most recent enrollment of the provider service at ``endpoint``, whatever it advertised."""
        q = enrollments.select().where(enrollments.c.endpoint == endpoint).order_by(enrollments.c.enrolled_at.desc())
        with self.tx() as c:
            row = c.execute(q).mappings().first()
        return _enrollment_row(row) if row else None

    @journaled("enrollments")
    def enrollments(self) -> list[EnrollmentRow]:
        with self.tx() as c:
            rows = c.execute(enrollments.select().order_by(enrollments.c.provider)).mappings().all()
        return [_enrollment_row(r) for r in rows]

    @journaled("provider_faults")
    def provider_faults(self, target: ExecutionTarget, limit: int = 20) -> list[EventRow]:
        """The most recent provider calls of Runs on ``target`` that ended in the provider's fault, newest first.

        A call the runner refused for the caller's sake (a request error: an undeclared member) or because the world
        moved under the caller (a state error: a sandbox whose own time-to-live passed, a lease taken over) is in the
        Run's history but is no fault of the provider's: only the provider and transport branches of the vocabulary
        count (a code it does not know is a provider's, as ``error_for_code`` reads it)."""
        q = (
            sa.select(events)
            .join(runs, runs.c.run_id == events.c.run_id)
            .where(
                runs.c.target == target.model_dump_json(),
                events.c.outcome == "error",
                sa.or_(events.c.error_code.is_(None), events.c.error_code.not_in(NOT_THE_PROVIDERS)),
            )
            .order_by(events.c.id.desc())
            .limit(limit)
        )
        with self.tx() as c:
            rows = c.execute(q).mappings().all()
        return [EventRow(**{k: r[k] for k in EventRow.__dataclass_fields__}) for r in rows]

    @journaled("events_for_run")
    def events_for_run(self, run_id: str) -> list[EventRow]:
        with self.tx() as c:
            rows = c.execute(events.select().where(events.c.run_id == run_id).order_by(events.c.id)).mappings().all()
        return [EventRow(**{k: r[k] for k in EventRow.__dataclass_fields__}) for r in rows]


NOT_THE_PROVIDERS = tuple(sorted(code for code, cls in ERROR_CLASSES.items() if cls.fault in ("request", "state")))
"""Error codes that are no provider's fault: the caller's request, or the world moving under the caller."""


def event_row(call: CallRecord, write_key: str) -> dict[str, Any]:
    """The ``events`` row of one provider call, under ``write_key`` (``fenced_write``'s and ``record_events``'s)."""
    return {**_event_of(call), "write_key": write_key}


def _event_of(call: CallRecord) -> dict[str, Any]:
    """``record_event``'s arguments for one provider call."""
    return {
        "run_id": NO_RUN if call.run_id is None else call.run_id,
        "member": call.member,
        "started_at": call.started_at,
        "duration_ms": call.duration_ms,
        "outcome": call.outcome,
        "allocation_key": call.allocation_key,
        "error_code": call.error_code,
        "detail": call.detail,
    }


def target_text(target: ExecutionTarget) -> str:
    """The one spelling of a target in the journal: its canonical JSON."""
    return json.dumps(target.model_dump(), sort_keys=True, separators=(",", ":"))


def _enrollment_row(r: Any) -> EnrollmentRow:
    return EnrollmentRow(
        target=_target(r["target"]),
        endpoint=r["endpoint"],
        source=r["source"],
        kind=r["kind"],
        envelope_digest=r["envelope_digest"],
        envelope=r["envelope"],
        ceiling=r["ceiling"],
        evidence=json.loads(r["evidence"]) if r["evidence"] else None,
        credential_path=r["credential_path"],
        credential_fingerprint=r["credential_fingerprint"],
        enrolled_at=r["enrolled_at"],
    )


def _target(raw: str) -> ExecutionTarget:
    return decode(ExecutionTarget, raw)


def _allocation_row(r: Any) -> AllocationRow:
    return AllocationRow(
        allocation_key=r["allocation_key"],
        run_id=r["run_id"],
        kind=r["kind"],
        target=_target(r["target"]),
        runner_tag=r["runner_tag"],
        lease_id=r["lease_id"],
        state=r["state"],
        object_id=r["object_id"],
        parent_key=r["parent_key"],
        created_at=r["created_at"],
        site=r["site"],
        lease_epoch=r["lease_epoch"],
        expires_at=r["expires_at"],
    )


def _run_row(r: Any) -> RunRow:
    return RunRow(
        run_id=r["run_id"],
        runner_tag=r["runner_tag"],
        target=_target(r["target"]) if r["target"] else None,
        profile_digest=r["profile_digest"],
        command=json.loads(r["command"]) if r["command"] else None,
        status=r["status"],
        exit_code=r["exit_code"],
        summary=json.loads(r["summary"]) if r["summary"] else None,
        created_at=r["created_at"],
        finished_at=r["finished_at"],
        attempt=r["attempt"],
        runner_id=r["runner_id"],
        site=r["site"],
        owner=r["owner"],
        owner_boot=r["owner_boot"],
        story=json.loads(r["story"]) if r["story"] else None,
    )
