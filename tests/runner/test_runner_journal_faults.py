"""A journal that is locked or failing: its faults are typed, retried within a deadline, and never stop
a Run's release. With the SQLite journal held ``BEGIN EXCLUSIVE`` by another connection during the
command, the CLI used to exit 70 (``OperationalError: database is locked``), leaving the sandbox and the
Run ``running``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.job import QuietObserver, run_job
from checkfu.core.journal import ABANDONED, Journal, JournalError, JournalUnavailable, sqlite_url
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, memory_profile

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
PROFILE = memory_profile()


class Lock:
    """``BEGIN EXCLUSIVE`` on the journal's file from a connection of its own, as another process would."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        self.held = False

    def take(self) -> None:
        self.conn.execute("BEGIN EXCLUSIVE")
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.conn.execute("COMMIT")
            self.held = False

    def close(self) -> None:
        self.give_back()
        self.conn.close()


@contextmanager
def rig(tmp_path: Path, deadline: float) -> Iterator[tuple[MemoryProvider, Journal, Runner, Lock, ManualClock]]:
    path = tmp_path / "journal.sqlite"
    journal = Journal(sqlite_url(path), deadline=deadline)
    memory = MemoryProvider()
    registry = Registry()
    registry.add(Adapter(envelope=memory.envelope, provider=memory, source="test"))
    clock = ManualClock()
    runner = Runner(registry, journal, runner_tag="rt", clock=clock)
    lock = Lock(path)
    try:
        yield memory, journal, runner, lock, clock
    finally:
        lock.close()
        journal.close()


class LocksBefore(QuietObserver):
    """Takes the journal's lock as ``phase`` begins (``release``: as the process phase ends, right before
    release); gives it back after ``hold`` seconds (never if ``None``)."""

    def __init__(self, lock: Lock, phase: str, hold: float | None) -> None:
        super().__init__()
        self.lock, self.at, self.hold = lock, phase, hold

    async def before(self, name: str) -> None:
        if name == self.at:
            self._take()

    def phase(self, name: str, seconds: float) -> None:
        super().phase(name, seconds)
        if name == "process" and self.at == "release":
            self._take()

    def _take(self) -> None:
        self.lock.take()
        if self.hold is not None:
            threading.Timer(self.hold, self.lock.give_back).start()


@pytest.mark.parametrize("phase", ["provision", "activate", "process", "release"])
async def test_a_lock_shorter_than_the_deadline_is_waited_out(tmp_path: Path, phase: str) -> None:
    with rig(tmp_path, deadline=20.0) as (memory, journal, runner, lock, _):
        observer = LocksBefore(lock, phase, hold=0.5)
        result = await run_job(runner, memory.target, PROFILE, ["echo", "hi"], observer=observer)
        assert result.exit_code == 0 and bytes(observer.out) == b"hi\n"
        assert (result.left, result.unjournaled) == ({}, {})
        assert memory.live_objects() == ()
        run = journal.run(result.run_id)
        assert run is not None and run.status == "succeeded"
        assert {r.state for r in journal.allocations_for_run(result.run_id)} == {"released"}


@pytest.mark.parametrize("phase", ["activate", "process"])
async def test_a_lock_past_the_deadline_is_typed_and_never_stops_release(tmp_path: Path, phase: str) -> None:
    with rig(tmp_path, deadline=0.3) as (memory, journal, runner, lock, clock):
        observer = LocksBefore(lock, phase, hold=None)
        with pytest.raises(JournalUnavailable) as caught:
            await run_job(runner, memory.target, PROFILE, ["echo", "hi"], observer=observer)
        assert "database is locked" in str(caught.value) and "lease renew" in str(caught.value)
        assert memory.live_objects() == ()  # released all the same
        assert memory.calls.count("release") == 1
        assert memory.calls.count("exec") + memory.calls.count("openProcess") == 0  # no call without its lease

        lock.give_back()  # the journal answers again: the rows and the Run it could not write are settled
        (run,) = journal.list_runs()
        assert run.status == "running"
        clock.advance(100_000)
        registry = runner.registry
        report = await reconcile(journal, registry, clock, runner_tag="rt")
        assert report.settled_runs == [run.run_id] and report.left == {}
        settled = journal.run(run.run_id)
        assert settled is not None and settled.status == ABANDONED
        assert {r.state for r in journal.allocations_for_run(run.run_id)} <= {"released", "compensated"}
        again = await reconcile(journal, registry, clock, runner_tag="rt")
        assert again.nothing_to_do


async def test_a_lock_during_release_leaves_only_records_to_settle(tmp_path: Path) -> None:
    with rig(tmp_path, deadline=0.3) as (memory, journal, runner, lock, clock):
        observer = LocksBefore(lock, "release", hold=None)
        result = await run_job(runner, memory.target, PROFILE, ["echo", "hi"], observer=observer)
        assert result.exit_code == 0 and result.left == {}
        assert memory.live_objects() == ()
        assert set(result.unjournaled) >= {"run", "lease"}, result.unjournaled
        lock.give_back()
        clock.advance(100_000)
        report = await reconcile(journal, runner.registry, clock, runner_tag="rt")
        assert report.settled_runs == [result.run_id] and report.left == {}


def test_a_journal_fault_that_no_retry_can_mend_is_typed_at_once(tmp_path: Path) -> None:
    journal = Journal(sqlite_url(tmp_path / "j.sqlite"), deadline=30.0)
    try:
        target = MemoryProvider().target
        journal.start_run("run-1", runner_tag="rt", target=target, now=1.0)
        with pytest.raises(JournalError) as caught:
            journal.start_run("run-1", runner_tag="rt", target=target, now=1.0)
        assert type(caught.value) is JournalError and caught.value.operation == "start_run"
        assert "UNIQUE" in caught.value.reason
    finally:
        journal.close()


def test_a_failed_operation_makes_the_next_ones_quick_until_one_succeeds(tmp_path: Path) -> None:
    import time  # noqa: PLC0415

    path = tmp_path / "j.sqlite"
    journal = Journal(sqlite_url(path), deadline=1.5)
    lock = Lock(path)
    try:
        target = MemoryProvider().target
        lock.take()
        t0 = time.monotonic()
        with pytest.raises(JournalUnavailable):
            journal.start_run("run-1", runner_tag="rt", target=target, now=1.0)
        assert 1.4 < time.monotonic() - t0 < 5
        assert journal.failing
        t0 = time.monotonic()
        with pytest.raises(JournalUnavailable):
            journal.start_run("run-2", runner_tag="rt", target=target, now=1.0)
        assert time.monotonic() - t0 < 1.5 + 0.5  # the short deadline of a journal already failing
        lock.give_back()
        journal.start_run("run-3", runner_tag="rt", target=target, now=1.0)
        assert not journal.failing
    finally:
        lock.close()
        journal.close()


def test_every_journal_operation_is_retried_and_typed() -> None:
    """Each method that opens a transaction goes through ``journaled``: none can leak a raw database error."""
    from checkfu.core.leases import LeaseStore  # noqa: PLC0415

    exempt = {"tx", "close", "record_call"}  # record_call never raises; tx is the transaction itself
    for cls in (Journal, LeaseStore):
        for name, member in vars(cls).items():
            if name.startswith("_") or name in exempt or not callable(member):
                continue
            uses_db = "tx()" in __import__("inspect").getsource(member) or hasattr(member, "__wrapped__")
            if uses_db:
                assert hasattr(member, "__wrapped__"), f"{cls.__name__}.{name} is not @journaled"


# A commit whose acknowledgement is lost ----------------------------------------------------------


def _lose_the_next_commit_ack(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the journal's next commit land in the database and then fail as a dropped connection does: the
    PostgreSQL backend is terminated from another connection right after it committed (SQLite: the commit is
    followed by an I/O error). Returns a list that records each commit it broke."""
    dialect = journal.engine.dialect
    real = dialect.do_commit
    broke: list[str] = []

    def do_commit(dbapi_conn: Any) -> None:
        real(dbapi_conn)
        if broke:
            return
        broke.append("commit")
        if dialect.name == "postgresql":
            import psycopg  # noqa: PLC0415

            pid = getattr(dbapi_conn, "driver_connection", dbapi_conn).info.backend_pid
            with psycopg.connect(journal.url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(%s)", (pid,))
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    return broke


def _count(journal: Journal, table: sa.Table, *where: Any) -> int:
    with journal.tx() as c:
        return int(c.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


WRITES = ["event", "run", "allocation", "output", "lease"]


@pytest.mark.parametrize("write", WRITES)
def test_a_write_retried_after_its_commit_was_acknowledged_to_nobody_is_kept_once(
    journal_url: str, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt commits, then the connection drops before the client hears so: ``journaled`` retries, and
    the retry finds its own row (by primary key, or the write key chosen before the first attempt) instead of
    writing a second one, or failing on the key the first attempt took."""
    from checkfu.core.journal import allocations, events, leases, run_output, runs  # noqa: PLC0415
    from checkfu.core.leases import LeaseStore  # noqa: PLC0415

    journal = Journal(journal_url)
    try:
        target = MemoryProvider().target
        journal.start_run("run-0", runner_tag="rt", target=target, now=1.0)
        broke = _lose_the_next_commit_ack(journal, monkeypatch)
        if write == "event":
            journal.record_event("run-0", "exec", started_at=2.0, duration_ms=1.0, outcome="ok")
            assert _count(journal, events, events.c.run_id == "run-0") == 1
        elif write == "run":
            journal.start_run("run-1", runner_tag="rt", target=target, now=2.0)
            assert _count(journal, runs, runs.c.run_id == "run-1") == 1
        elif write == "allocation":
            journal.journal_allocation(
                "ak-1", run_id="run-0", kind="instance", target=target, runner_tag="rt", lease_id="l", now=2.0
            )
            assert _count(journal, allocations, allocations.c.allocation_key == "ak-1") == 1
        elif write == "output":
            journal.append_output("run-0", [("out", b"a"), ("err", b"b")], now=2.0)
            assert [r.data for r in journal.output_since("run-0")] == [b"a", b"b"]
            assert _count(journal, run_output, run_output.c.run_id == "run-0") == 2
        else:
            lease = LeaseStore(journal, ManualClock()).acquire("run-0")
            assert _count(journal, leases, leases.c.run_id == "run-0") == 1
            assert LeaseStore(journal, ManualClock()).record(lease.lease_id).epoch == 1
        assert broke == ["commit"]  # the commit's acknowledgement was lost once, and the write was retried
    finally:
        journal.close()


# Waiting out a locked journal never stalls the event loop -----------------------------------------


async def test_a_member_call_waiting_out_a_locked_journal_lets_other_tasks_run(tmp_path: Path) -> None:
    """While a member call's journal writes wait for a lock (retried with backoff), a task beside it keeps ticking:
    the waiting happens off the event loop. Before, the retries slept on the loop and the ticks stopped for as long
    as the lock was held."""
    with rig(tmp_path, deadline=20.0) as (memory, _journal, runner, lock, _):
        attempt = runner.start(memory.target, PROFILE, platform=AMD64)
        session = attempt.session
        image = (await session.materialize(PROFILE, AMD64)).image
        inst = await session.provision(PROFILE, AMD64, image)
        await session.activate(inst)
        gaps: list[float] = []
        stop = asyncio.Event()

        async def tick() -> None:
            loop = asyncio.get_running_loop()
            last = loop.time()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = loop.time()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        lock.take()
        threading.Timer(0.8, lock.give_back).start()
        t0 = time.monotonic()
        result = await session.exec(inst, ["echo", "hi"])
        waited = time.monotonic() - t0
        stop.set()
        await ticker
        assert result.exit_code == 0
        assert waited >= 0.7  # the call did wait the lock out
        assert max(gaps) < 0.25, f"the event loop stalled for {max(gaps):.3f} s while the journal was locked"
        await session.release_all()
        runner.finish(attempt, status="succeeded")
