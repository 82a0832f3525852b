"""Queued Runs: claimed once, taken over with the epoch bumped, settled once, every write fenced.

Every test runs on an SQLite file and on a database in the throwaway PostgreSQL cluster.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from checkfu.contract.errors import SandboxLeaseFenced
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal, events, leases, runs
from checkfu.core.queue import Claim, RunQueue, RunRequest
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Registry
from checkfu.testing import memory_envelope, memory_profile

TTL = 30.0


def request(*command: str) -> RunRequest:
    return RunRequest(provider="memory", command=command or ("true",), profile=memory_profile().model_dump(mode="json"))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def queue(journal: Journal, clock: ManualClock) -> RunQueue:
    return RunQueue(journal, clock)


def submit(queue: RunQueue, n: int = 1) -> list[str]:
    return [
        queue.submit(request("echo", str(i)), runner_tag="t", profile_digest=memory_profile().digest, run_id=f"run-{i}")
        for i in range(n)
    ]


def claim(queue: RunQueue, who: str = "a") -> Claim | None:
    return queue.claim(owner=f"host-{who}.invalid/1/1", runner_id=f"runner-{who}", runner_tag="t", ttl=TTL)


def settle_events(journal: Journal, run_id: str) -> list[str]:
    return [e.detail or "" for e in journal.events_for_run(run_id) if e.member == "settle"]


def test_a_queued_run_is_claimed_once_and_settled_once(queue: RunQueue, journal: Journal) -> None:
    (run_id,) = submit(queue)
    row = journal.run(run_id)
    assert row is not None and (row.status, row.target, row.attempt) == ("queued", None, 0)
    got = claim(queue)
    assert got is not None
    assert (got.run_id, got.attempt, got.lease.lease_epoch, got.takeover) == (run_id, 1, 1, False)
    assert got.request == request("echo", "0")
    assert claim(queue, "b") is None  # nothing else queued, and the lease is live
    queue.settle(got, status="succeeded", exit_code=0, summary={"x": 1})
    row = journal.run(run_id)
    assert row is not None and (row.status, row.exit_code, row.summary) == ("succeeded", 0, {"x": 1})
    assert settle_events(journal, run_id) == ["succeeded: attempt 1"]
    with pytest.raises(SandboxLeaseFenced):  # settling again: the lease ended with the first settlement
        queue.settle(got, status="failed", exit_code=None, summary=None)
    assert settle_events(journal, run_id) == ["succeeded: attempt 1"]


def test_runs_are_claimed_oldest_first(queue: RunQueue, clock: ManualClock) -> None:
    ids = []
    for i in range(3):
        ids.append(queue.submit(request(), runner_tag="t", profile_digest="sha256:" + "0" * 64, run_id=f"run-z{9 - i}"))
        clock.advance(1)
    got = [claim(queue) for _ in ids]
    assert [c.run_id for c in got if c is not None] == ids  # by submission time, not by id


def test_claimers_at_once_never_claim_the_same_run(journal_url: str) -> None:
    """Eight threads, each with its own connection pool, claim 120 Runs: each Run exactly once."""
    setup = Journal(journal_url)
    submit(RunQueue(setup, ManualClock()), 120)
    setup.close()
    claimed: list[str] = []
    guard = threading.Lock()
    errors: list[BaseException] = []

    def claimer(who: int) -> None:
        journal = Journal(journal_url)
        q = RunQueue(journal, ManualClock())
        try:
            while True:
                got = claim(q, f"w{who}")
                if got is None:
                    return
                with guard:
                    claimed.append(got.run_id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            journal.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    counts = Counter(claimed)
    assert len(counts) == 120 and set(counts.values()) == {1}


def test_an_expired_lease_is_taken_over_with_the_epoch_bumped_and_the_old_holder_fenced(
    queue: RunQueue, journal: Journal, clock: ManualClock
) -> None:
    (run_id,) = submit(queue)
    first = claim(queue, "a")
    assert first is not None
    clock.advance(TTL - 1)
    assert claim(queue, "b") is None  # not expired yet
    clock.advance(2)
    second = claim(queue, "b")
    assert second is not None
    assert (second.run_id, second.attempt, second.takeover) == (run_id, 2, True)
    assert second.lease == first.lease.model_copy(update={"lease_epoch": 2})
    row = journal.run(run_id)
    assert row is not None and (row.status, row.attempt, row.runner_id) == ("running", 2, "runner-b")
    for fenced_write in (
        lambda: queue.append_output(first, [("out", b"late")]),
        lambda: queue.place(first, target_json="{}", site=None, profile_digest="sha256:" + "0" * 64),
        lambda: queue.settle(first, status="succeeded", exit_code=0, summary=None),
        lambda: queue.give_back(first, "stopping"),
        lambda: queue.postpone(first, 5, "x"),
    ):
        with pytest.raises(SandboxLeaseFenced):
            fenced_write()
    assert queue.output_since(run_id, 0) == []
    queue.append_output(second, [("out", b"mine")])
    assert [(c.attempt, c.data) for c in queue.output_since(run_id, 0)] == [(2, b"mine")]
    queue.settle(second, status="succeeded", exit_code=0, summary=None)
    assert settle_events(journal, run_id) == ["succeeded: attempt 2"]


def test_a_heartbeat_keeps_a_lease_and_says_which_were_taken_over(
    queue: RunQueue, journal: Journal, clock: ManualClock
) -> None:
    submit(queue, 2)
    mine = [claim(queue, "a"), claim(queue, "a")]
    assert all(mine)
    clock.advance(TTL - 1)
    assert queue.heartbeat(runner_id="runner-a", owner="host-a.invalid/1/1", ttl=TTL) == {
        c.lease.lease_id for c in mine if c
    }
    clock.advance(TTL - 1)
    assert claim(queue, "b") is None  # renewed: nobody takes them
    clock.advance(2)  # ... until a heartbeat is missed
    taken = claim(queue, "b")
    assert taken is not None
    held = queue.heartbeat(runner_id="runner-a", owner="host-a.invalid/1/1", ttl=TTL)
    assert taken.lease.lease_id not in held and len(held) == 1


def test_a_lease_renewed_just_before_the_takeover_is_kept(
    queue: RunQueue, journal: Journal, clock: ManualClock
) -> None:
    """The takeover's compare-and-set checks expiry again at the update: a renewal in between wins."""
    submit(queue)
    first = claim(queue, "a")
    assert first is not None
    clock.advance(TTL + 1)
    with journal.tx() as c:  # the holder renews between the claimer's read and its update
        c.execute(leases.update().values(expires_at=clock.now() + TTL))
    assert claim(queue, "b") is None


def test_a_run_given_back_is_claimed_again_as_a_later_attempt(queue: RunQueue, journal: Journal) -> None:
    (run_id,) = submit(queue)
    first = claim(queue, "a")
    assert first is not None
    queue.give_back(first, "SIGTERM")
    row = journal.run(run_id)
    assert row is not None and (row.status, row.runner_id) == ("queued", None)
    second = claim(queue, "b")
    assert second is not None
    assert (second.attempt, second.takeover) == (2, True)
    assert second.lease.lease_id != first.lease.lease_id
    with pytest.raises(SandboxLeaseFenced):
        queue.settle(first, status="succeeded", exit_code=0, summary=None)
    assert [e.member for e in journal.events_for_run(run_id)] == ["requeue"]


def test_a_postponed_run_lapses_and_is_taken_over_later(queue: RunQueue, clock: ManualClock) -> None:
    submit(queue)
    first = claim(queue, "a")
    assert first is not None
    queue.postpone(first, 5, "site b is down")
    assert queue.heartbeat(runner_id="runner-a", owner="host-a.invalid/1/1", ttl=TTL) == set()  # not renewed
    assert claim(queue, "b") is None
    clock.advance(6)
    again = claim(queue, "b")
    assert again is not None and (again.attempt, again.lease.lease_epoch) == (2, 2)


def test_a_queued_run_can_be_cancelled_until_claimed(queue: RunQueue, journal: Journal) -> None:
    first, second = submit(queue, 2)
    assert queue.cancel(first) is True
    got = claim(queue)
    assert got is not None and got.run_id == second
    assert queue.cancel(second) is False
    assert settle_events(journal, first) == ["cancelled: cancelled before any runner claimed it"]


def test_a_run_started_in_place_is_never_claimed(queue: RunQueue, journal: Journal, clock: ManualClock) -> None:
    """``checkfu run`` journals its Run ``running`` with no request: no runner of the fleet ever takes it."""
    journal.start_run("run-in-place", runner_tag="t", target=memory_envelope().target, now=clock.now())
    with journal.tx() as c:
        c.execute(
            leases.insert().values(
                lease_id="lease-in-place", run_id="run-in-place", owner="x/1/1", epoch=1, expires_at=0.0, ended=True
            )
        )
        c.execute(runs.update().values(lease_id="lease-in-place"))
    assert claim(queue) is None


def _count(journal: Journal, table: Any) -> int:
    with journal.tx() as c:
        return int(c.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_nothing_is_written_by_a_claim_that_finds_nothing(queue: RunQueue, journal: Journal) -> None:
    assert claim(queue) is None
    assert _count(journal, leases) == 0 and _count(journal, events) == 0


def test_reconciliation_never_settles_a_queued_run_as_abandoned(
    queue: RunQueue, journal: Journal, clock: ManualClock
) -> None:
    """A queued Run whose runner died belongs to the fleet: another runner takes it over and runs it again.
    Reconciliation (which settles a ``checkfu run`` Run of a dead runner as ``abandoned``) leaves it alone."""
    (run_id,) = submit(queue)
    first = claim(queue, "a")
    assert first is not None
    clock.advance(TTL + 1)  # runner a is gone: its lease expired
    report = asyncio.run(reconcile(journal, Registry(), clock, runner_tag="t"))
    assert report.settled_runs == []
    row = journal.run(run_id)
    assert row is not None and row.status == "running"
    second = claim(queue, "b")
    assert second is not None and (second.run_id, second.attempt, second.takeover) == (run_id, 2, True)
