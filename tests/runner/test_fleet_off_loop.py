"""A serving runner makes its journal work off the event loop (issue 33).

``checkfu runner serve`` serves several Runs at once on one event loop, beside the heartbeat that keeps their
leases. A journal transaction made on the loop holds all of them up for as long as it waits: on PostgreSQL, a
row or table lock held by another runner (or an operator's ``psql``) is waited out with no timeout of ours. So a
serving runner offloads its journal (``Journal.offload``): every operation async code hands to ``Journal.call`` or
``Journal.work`` runs in a pool of worker threads. A one-shot ``checkfu run`` keeps its inline first attempt.

Each attack below has its positive control: the weaker design (the journal on the loop; a plain
``asyncio.to_thread``) shown failing the same check.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from checkfu.core.fleet import FleetConfig, FleetRunner
from checkfu.core.journal import Journal
from checkfu.core.queue import RunRequest
from checkfu.core.registry import Adapter, Registry
from checkfu.fleet import submit_request
from checkfu.testing import MemoryProvider, memory_profile

pytestmark = pytest.mark.anyio

TAG = "fleet-off-loop"


async def test_an_offloaded_journal_makes_its_operations_in_its_workers(journal: Journal) -> None:
    seen: list[str] = []

    def where() -> str:
        seen.append(threading.current_thread().name)
        return "read" if journal.run("no-such-run") is None else "row"  # a real read, on the journal's engine

    assert await journal.call(where) == "read"
    assert seen[-1] == threading.current_thread().name  # not offloaded: the first attempt is inline
    journal.offload(3)
    assert await journal.call(where) == "read"
    assert await journal.work(where) == "read"
    assert all(name.startswith("checkfu-journal") for name in seen[1:]), seen


async def test_a_cancelled_caller_is_answered_only_once_its_write_is_over(journal: Journal) -> None:
    """A write under way when its caller is cancelled finishes before the cancellation is raised, as a write made
    inline would: the caller's cleanup (which writes the same rows) never races it."""
    journal.offload(2)
    began, done = threading.Event(), threading.Event()

    request = RunRequest(provider="memory", command=("true",), profile=memory_profile().model_dump(mode="json"))
    written: list[str] = []

    def slow_write() -> None:
        began.set()
        time.sleep(0.3)
        written.append(submit_request(journal, request, runner_tag=TAG))  # a Run queued: one transaction
        done.set()

    async def cancelled_during(make: Callable[[], Awaitable[Any]]) -> bool:
        """Whether the write was over when the cancelled caller saw its cancellation."""
        began.clear()
        done.clear()
        task = asyncio.ensure_future(make())
        while not began.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        over = done.is_set()
        await asyncio.to_thread(done.wait, 5)
        return over

    assert await cancelled_during(lambda: journal.call(slow_write))
    assert await cancelled_during(lambda: journal.work(slow_write))
    # the positive control: a plain hop to a thread answers the cancellation while the write is still under way
    assert not await cancelled_during(lambda: asyncio.to_thread(slow_write))
    assert len(written) == 3 and all(journal.run(run_id) is not None for run_id in written)


async def _loop_stall_while_runs_is_locked(url: str, *, offloaded: bool) -> tuple[float, str]:
    """Serve one queued Run while another connection holds ``runs`` locked for 1.5 s; the longest the event loop
    went without a turn meanwhile, and the Run's status."""
    journal = Journal(url)
    try:
        if not offloaded:  # the weaker design: every journal operation made on the loop
            journal.offload = lambda workers: None  # type: ignore[method-assign]
        provider = MemoryProvider()
        registry = Registry()
        registry.add(Adapter(envelope=provider.envelope, provider=provider, source="memory"))

        async def load(spec: str) -> Registry:
            return registry

        request = RunRequest(
            provider="memory", command=("echo", "hi"), profile=memory_profile().model_dump(mode="json")
        )
        run_id = submit_request(journal, request, runner_tag=TAG)
        config = FleetConfig(concurrency=2, lease_ttl=30.0, heartbeat=3600.0, poll=0.02, reconcile_every=3600.0)
        settled = asyncio.Event()
        fleet = FleetRunner(
            journal,
            load,
            runner_tag=TAG,
            config=config,
            emit=lambda e: settled.set() if e.get("event") == "settled" else None,
        )
        locked, release = threading.Event(), threading.Event()

        def hold_lock() -> None:
            dsn = url.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(dsn) as c:
                c.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(10)
                time.sleep(1.5)
            # the transaction ends with the connection: the lock is let go

        holder = threading.Thread(target=hold_lock, daemon=True)
        holder.start()
        await asyncio.to_thread(locked.wait, 10)
        worst = 0.0

        async def ticker() -> None:
            nonlocal worst
            last = time.monotonic()
            while not settled.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                worst = max(worst, now - last)
                last = now
            fleet.stop()

        serving = asyncio.ensure_future(fleet.serve())
        release.set()
        await asyncio.wait_for(asyncio.gather(serving, ticker()), timeout=30)
        await asyncio.to_thread(holder.join, 10)
        run = journal.run(run_id)
        return worst, run.status if run is not None else "missing"
    finally:
        journal.close()


async def test_a_lock_held_on_the_journal_never_holds_up_the_serving_loop(request: pytest.FixtureRequest) -> None:
    cluster = request.getfixturevalue("pg_cluster")
    worst, status = await _loop_stall_while_runs_is_locked(cluster.url(cluster.create_database()), offloaded=True)
    assert status == "succeeded"
    assert worst < 0.5, f"the event loop went {worst:.2f} s without a turn while the journal waited on a lock"
    # the positive control: with the journal on the loop, the claim's wait for the lock stops everything
    worst, status = await _loop_stall_while_runs_is_locked(cluster.url(cluster.create_database()), offloaded=False)
    assert status == "succeeded"
    assert worst >= 1.0, worst


def test_two_runners_recording_one_enrollment_at_once_both_succeed(request: pytest.FixtureRequest) -> None:
    """Two runners of a fleet that start on one PostgreSQL record their in-tree enrollments at once. Under read
    committed, the second's delete sees nothing while the first's insert is uncommitted, and its insert then
    breaks the unique key: a runner failed its first Run over it (seen once its journal was offloaded, when two
    Runs of one runner began together). The second now records again and replaces the first's row."""
    cluster = request.getfixturevalue("pg_cluster")
    url = cluster.url(cluster.create_database())
    journal = Journal(url)
    envelope = MemoryProvider().envelope
    first_inserted, second_inserting = threading.Event(), threading.Event()
    roles = threading.local()

    @sa.event.listens_for(journal.engine, "before_cursor_execute")
    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if getattr(roles, "name", "") == "second" and statement.startswith("INSERT INTO enrollments"):
            second_inserting.set()

    @sa.event.listens_for(journal.engine, "after_cursor_execute")
    def after(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if getattr(roles, "name", "") == "first" and statement.startswith("INSERT INTO enrollments"):
            first_inserted.set()
            second_inserting.wait(5)  # the second has deleted (nothing) and waits on this insert's key
            time.sleep(0.2)  # ... in its own insert, which fails once this commits

    failures: dict[str, BaseException] = {}

    def record(name: str, source: str) -> None:
        roles.name = name
        if name == "second":
            first_inserted.wait(5)
        try:
            journal.record_enrollment(
                envelope.target,
                source=source,
                kind="in_tree",
                envelope_digest="sha256:" + "0" * 64,
                envelope=envelope.model_dump_json(),
                ceiling="{}",
                now=0.0,
            )
        except BaseException as exc:  # reported below
            failures[name] = exc

    try:
        threads = [threading.Thread(target=record, args=(n, n)) for n in ("first", "second")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert second_inserting.is_set(), "the race was not staged"
        assert failures == {}, failures
        row = journal.enrollment(envelope.target)
        assert row is not None and row.source == "second"  # the last to record replaced the first's row
    finally:
        journal.close()
