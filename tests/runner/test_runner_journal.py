"""The journal: one schema on SQLite and PostgreSQL; allocations written before the provider is asked.

Every test taking ``journal`` or ``journal_url`` runs twice: against an SQLite file
and against a database in a throwaway PostgreSQL cluster.
"""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from checkfu.contract.errors import SandboxIdentityMismatch
from checkfu.contract.members import CloneRequest, ProvisionRequest, ResumeRequest, SnapshotRequest
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.vocabulary import Platform
from checkfu.core.driver import RunSession
from checkfu.core.journal import Journal, JournalError, metadata, sqlite_url
from checkfu.core.mounts import DirectorySource, MountSpec, resolve_mount
from checkfu.testing import MemoryProvider, Misbehaving, clone_returns_source, memory_envelope, memory_profile

pytestmark = pytest.mark.anyio

TARGET = memory_envelope().target
OTHER = ExecutionTarget(provider="other", provider_revision="r", materialization_revision="m", placement="local")


def platform() -> Platform:
    return Platform(os="linux", architecture="amd64")


def test_sqlite_is_a_file_by_default(tmp_path: Path) -> None:
    path = tmp_path / "state" / "journal.sqlite"
    path.parent.mkdir()
    j = Journal(sqlite_url(path))
    try:
        j.start_run("run-1", runner_tag="t", target=TARGET, now=1.0)
    finally:
        j.close()
    assert path.is_file()
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")} >= {
            "runs",
            "leases",
            "allocations",
            "events",
        }
    reopened = Journal(sqlite_url(path))
    try:
        row = reopened.run("run-1")
        assert row is not None and row.target == TARGET
    finally:
        reopened.close()


def test_a_sqlite_file_the_journal_makes_is_its_users_alone_and_so_are_its_side_files(tmp_path: Path) -> None:
    # It holds every Run's argv and output (``checkfu logs``); SQLite gives -wal and -shm the file's mode.
    made = tmp_path / "made.sqlite"
    j = Journal(sqlite_url(made))
    try:
        j.start_run("run-1", runner_tag="t", target=TARGET, now=1.0)
        side = sorted(tmp_path.glob("made.sqlite-*"))
        assert [p.name for p in side] == ["made.sqlite-shm", "made.sqlite-wal"]  # while it is open
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in [made, *side]} == dict.fromkeys(
            ["made.sqlite", "made.sqlite-shm", "made.sqlite-wal"], 0o600
        )
    finally:
        j.close()
    kept = tmp_path / "kept.sqlite"  # a file that exists is the user's: its mode is theirs to choose
    kept.touch(mode=0o640)
    kept.chmod(0o640)
    Journal(sqlite_url(kept)).close()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def test_same_schema_on_both_engines(journal: Journal) -> None:
    inspector = sa.inspect(journal.engine)
    assert set(inspector.get_table_names()) == {*metadata.tables, "alembic_version"}  # the schema's revision
    for name, table in metadata.tables.items():
        columns = {c["name"] for c in inspector.get_columns(name)}
        assert columns == {c.name for c in table.columns}, name
        pk = inspector.get_pk_constraint(name)["constrained_columns"]
        assert pk == [c.name for c in table.primary_key.columns], name
    dialect = journal.engine.dialect.name
    assert dialect == ("sqlite" if journal.url.startswith("sqlite") else "postgresql")


def test_runs_round_trip(journal: Journal) -> None:
    journal.start_run(
        "run-a1", runner_tag="tag", target=TARGET, now=10.0, profile_digest="sha256:" + "0" * 64, command=["cat", "x"]
    )
    journal.start_run("run-a2", runner_tag="tag", target=OTHER, now=11.0)
    journal.start_run("run-b1_%", runner_tag="tag", target=OTHER, now=12.0)
    journal.finish_run("run-a1", status="succeeded", now=20.0, exit_code=0, summary={"phases": {"x": 1.5}})
    row = journal.run("run-a1")
    assert row is not None
    assert (row.status, row.exit_code, row.finished_at, row.command) == ("succeeded", 0, 20.0, ["cat", "x"])
    assert row.summary == {"phases": {"x": 1.5}}
    assert row.profile_digest == "sha256:" + "0" * 64
    assert row.target == TARGET
    assert journal.run("run-missing") is None
    assert [r.run_id for r in journal.list_runs()] == ["run-b1_%", "run-a2", "run-a1"]
    assert sorted(r.run_id for r in journal.find_runs("run-a")) == ["run-a1", "run-a2"]
    # The prefix is matched literally: '%' and '_' are not wildcards.
    assert [r.run_id for r in journal.find_runs("run-b1_%")] == ["run-b1_%"]
    assert journal.find_runs("run-_") == []


def test_allocations_round_trip(journal: Journal) -> None:
    common: dict[str, Any] = {"run_id": "run-1", "target": TARGET, "runner_tag": "tag", "lease_id": "lease-1"}
    journal.journal_allocation("ak-1", kind="instance", now=1.0, **common)
    journal.journal_allocation("ak-2", kind="snapshot", now=2.0, parent_key="ak-1", **common)
    journal.journal_allocation("ak-3", kind="instance", now=3.0, **{**common, "runner_tag": "other"})
    first = journal.allocation("ak-1")
    assert first is not None
    assert (first.state, first.object_id, first.kind, first.target) == ("pending", None, "instance", TARGET)
    journal.set_allocation("ak-1", "live", now=4.0, object_id="mem-1")
    journal.set_allocation("ak-2", "live", now=5.0, object_id="snap-1")
    journal.set_allocation("ak-2", "released", now=6.0)
    got = journal.allocation("ak-1")
    assert got is not None and (got.state, got.object_id) == ("live", "mem-1")
    snap = journal.allocation("ak-2")
    assert snap is not None and (snap.state, snap.object_id, snap.parent_key) == ("released", "snap-1", "ak-1")
    assert [r.allocation_key for r in journal.open_allocations(runner_tag="tag")] == ["ak-1"]
    assert [r.allocation_key for r in journal.open_allocations()] == ["ak-1", "ak-3"]
    assert [r.allocation_key for r in journal.allocations_for_run("run-1")] == ["ak-1", "ak-2", "ak-3"]
    assert journal.allocation("ak-none") is None
    with pytest.raises(JournalError, match=r"^journal_allocation: .*(UNIQUE|unique)"):  # typed, never raw SQLAlchemy
        journal.journal_allocation("ak-1", kind="instance", now=7.0, **common)


def test_events_round_trip(journal: Journal) -> None:
    journal.record_event("run-1", "exec", started_at=1.0, duration_ms=2.5, outcome="ok", allocation_key="ak-1")
    journal.record_event(
        "run-1", "release", started_at=2.0, duration_ms=0.5, outcome="error", error_code="SandboxNotFound", detail="x"
    )
    journal.record_event("run-2", "exec", started_at=3.0, duration_ms=1.0, outcome="ok")
    got = journal.events_for_run("run-1")
    assert [(e.member, e.outcome, e.error_code, e.allocation_key) for e in got] == [
        ("exec", "ok", None, "ak-1"),
        ("release", "error", "SandboxNotFound", None),
    ]
    assert got[0].duration_ms == 2.5 and got[1].detail == "x"


# Through the driver, on both engines --------------------------------------------------------


class JournalFirst:
    """A provider wrapper that, before every allocating call, reads the journal for the request's key."""

    def __init__(self, inner: MemoryProvider, journal_url: str) -> None:
        self.inner = inner
        self.probe = Journal(journal_url)  # its own connection, as another process would see it
        self.seen: dict[str, str | None] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _look(self, key: str) -> None:
        row = self.probe.allocation(key)
        self.seen[key] = None if row is None else row.state

    async def provision(self, request: ProvisionRequest) -> Any:
        self._look(request.allocation_key)
        return await self.inner.provision(request)

    async def clone(self, request: CloneRequest) -> Any:
        self._look(request.allocation_key)
        return await self.inner.clone(request)

    async def resume(self, request: ResumeRequest) -> Any:
        self._look(request.allocation_key)
        return await self.inner.resume(request)

    async def snapshot(self, request: SnapshotRequest) -> Any:
        self._look(request.snapshot_allocation_key)
        return await self.inner.snapshot(request)


async def _drive_everything(session: RunSession, workspace: Path) -> None:
    profile, plat = memory_profile(), platform()
    mount = resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))
    image = (await session.materialize(profile, plat)).image
    inst = await session.provision(profile, plat, image, [mount])
    await session.stage(inst, [mount])
    await session.activate(inst)
    await session.exec(inst, ["cat", "/workspace/README"], timeout=5)
    snap = await session.snapshot(inst)
    resumed = await session.resume(snap, profile, plat, image)
    clone = await session.clone(inst, profile, plat, image)
    await session.delete_snapshot(snap)
    for i in (clone, resumed, inst):
        await session.release(i)


async def test_every_allocation_is_journaled_pending_before_the_provider_is_asked(
    make_rig: Any, journal_url: str, workspace: Path
) -> None:
    probe: list[JournalFirst] = []

    def wrap(memory: MemoryProvider) -> Any:
        probe.append(JournalFirst(memory, journal_url))
        return probe[0]

    rig = make_rig(wrap=wrap, url=journal_url)
    try:
        session = rig.start()
        await _drive_everything(session, workspace)
        seen = probe[0].seen
        rows = {r.allocation_key: r for r in rig.journal.allocations_for_run(session.run_id)}
        assert len(seen) == 4  # the instance, its snapshot, the resumed instance and the clone
        assert set(seen) == set(rows)
        assert all(state == "pending" for state in seen.values()), seen
        # Settled only once checked: live with the provider's id, then released.
        assert sorted(r.kind for r in rows.values()) == ["clone", "instance", "resume", "snapshot"]
        assert all(r.state == "released" and r.object_id for r in rows.values())
        assert rig.memory.live_objects() == ()
    finally:
        probe[0].probe.close()


async def test_every_member_call_is_an_event(make_rig: Any, journal_url: str, workspace: Path) -> None:
    rig = make_rig(url=journal_url)
    session = rig.start()
    await _drive_everything(session, workspace)
    events = rig.journal.events_for_run(session.run_id)
    assert events[0].member == "select"
    members = [e.member for e in events[1:]]
    assert members == rig.memory.calls
    assert events[0].outcome == "warning"  # the memory tier enforces nothing, and says so
    assert all(e.outcome == "ok" and e.error_code is None and e.duration_ms >= 0 for e in events[1:])
    by_member = {e.member: e for e in events}
    assert by_member["exec"].allocation_key is not None
    assert by_member["materialize"].allocation_key is None


async def test_a_misbehaving_result_is_never_settled_live(make_rig: Any, journal_url: str) -> None:
    rig = make_rig(wrap=Misbehaving, url=journal_url)
    transitions: list[tuple[str, str]] = []
    real = rig.journal.set_allocation

    def spy(key: str, state: Any, **kw: Any) -> None:
        transitions.append((key, state))
        real(key, state, **kw)

    rig.journal.set_allocation = spy  # type: ignore[method-assign]
    session = rig.start()
    profile, plat = memory_profile(), platform()
    image = (await session.materialize(profile, plat)).image
    inst = await session.provision(profile, plat, image)
    await session.activate(inst)
    rig.provider.set("clone", clone_returns_source)  # the clone answers with its source's id
    with pytest.raises(SandboxIdentityMismatch):
        await session.clone(inst, profile, plat, image)
    rows = rig.journal.allocations_for_run(session.run_id)
    clone_row = next(r for r in rows if r.kind == "clone")
    assert clone_row.state == "compensated"
    assert [s for k, s in transitions if k == clone_row.allocation_key] == ["compensated"]
    assert clone_row.allocation_key not in rig.held_keys()
    await session.release_all()
    assert rig.memory.live_objects() == ()


def test_housekeeping_says_what_each_opening_pass_would_find(tmp_path: Path) -> None:
    """``Journal.housekeeping``'s one read agrees with each pass's own query (``SandboxBook.due``,
    ``expired_snapshots``, ``owned_running_runs``), for this runner's tag only, as rows come and go."""
    from checkfu.core.journal import allocations, leases, runs, sandboxes  # noqa: PLC0415
    from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

    journal = Journal(sqlite_url(tmp_path / "j.sqlite"))
    now, tag = 1000.0, "mine"

    def agrees() -> tuple[bool, bool, bool]:
        said = journal.housekeeping(runner_tag=tag, now=now)
        found = (
            bool(SandboxBook(journal).due(tag, now)),
            bool(journal.expired_snapshots(now=now, runner_tag=tag)),
            bool(journal.owned_running_runs(runner_tag=tag)),
        )
        assert (said.sandboxes, said.snapshots, said.orphans) == found
        return found

    def insert(table: sa.Table, **values: Any) -> None:
        with journal.tx() as c:
            c.execute(table.insert().values(**values))

    def update(table: sa.Table, where: Any, **values: Any) -> None:
        with journal.tx() as c:
            c.execute(table.update().where(where).values(**values))

    try:
        assert agrees() == (False, False, False)
        for who in ("theirs", tag):  # another runner's rows first: they are never this runner's to act on
            insert(runs, run_id=f"r-{who}", runner_tag=who, status="running", created_at=now, owner="h/1/2")
            insert(
                allocations,
                allocation_key=f"s-{who}",
                run_id=f"r-{who}",
                kind="snapshot",
                target=OTHER.model_dump_json(),
                runner_tag=who,
                lease_id="l",
                state="live",
                created_at=now,
                updated_at=now,
                expires_at=now + 60,
            )
            insert(leases, lease_id=f"l-{who}", run_id=f"r-{who}", owner="h/1/2", epoch=1, expires_at=now + 60)
            insert(
                sandboxes,
                sandbox_id=f"b-{who}",
                run_id=f"r-{who}",
                runner_tag=who,
                target=OTHER.model_dump_json(),
                allocation_key=f"k-{who}",
                lease_id=f"l-{who}",
                profile=memory_profile().model_dump_json(),
                mounts='{"plans": [], "roots": []}',
                state="live",
                created_at=now,
                expires_at=now + 60,
            )
            assert agrees() == (False, False, who == tag)  # a Run with an owner is looked at by the reaper
        update(allocations, allocations.c.allocation_key == f"s-{tag}", expires_at=now)
        assert agrees() == (False, True, True)
        update(leases, leases.c.lease_id == f"l-{tag}", expires_at=now - 1)
        assert agrees() == (True, True, True)
        update(leases, leases.c.lease_id == f"l-{tag}", expires_at=now + 60)
        update(sandboxes, sandboxes.c.sandbox_id == f"b-{tag}", owner="h/1/2")
        update(allocations, allocations.c.allocation_key == f"s-{tag}", state="deleted")
        update(runs, runs.c.run_id == f"r-{tag}", status="succeeded")
        assert agrees() == (True, False, False)
        update(sandboxes, sandboxes.c.sandbox_id == f"b-{tag}", state="released")
        assert agrees() == (False, False, False)
    finally:
        journal.close()


def test_sqlite_journals_of_a_process_share_what_they_compiled(tmp_path: Path) -> None:
    """Every SQLite file's journal in a process uses one dialect and one compiled-statement cache, so a statement
    one journal compiled is found compiled by the next (SQLAlchemy keys its cache by the dialect object); an
    in-memory journal keeps its own."""
    from checkfu.core import journal as J  # noqa: PLC0415

    first, second, memory = (Journal(sqlite_url(tmp_path / f"{n}.sqlite")) for n in ("a", "b", "c"))
    in_memory = Journal("sqlite://")
    hits: list[Any] = []

    def seen(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        if statement.startswith("INSERT INTO runs"):
            hits.append(context.cache_hit)

    try:
        (shared, _cache) = J._SHARED_SQLITE[0]
        assert first.engine.dialect is second.engine.dialect is memory.engine.dialect is shared
        assert in_memory.engine.dialect is not shared
        sa.event.listen(second.engine, "before_cursor_execute", seen)
        first.start_run("r-1", runner_tag="t", target=OTHER, now=1.0)
        second.start_run("r-2", runner_tag="t", target=OTHER, now=1.0)
        assert hits == [shared.CACHE_HIT], "the second journal's insert was compiled by the first"
        assert second.run("r-2") is not None and first.run("r-2") is None, "each still writes its own file"
    finally:
        for journal in (first, second, memory, in_memory):
            journal.close()
