"""The host-process provider reclaims: process trees at release, allocations by label after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_host_process import OTHER_TAG, TAG, Kit, kit, leftover_cgroups, make_kit, needs_cgroups, pg_kit, pids_of

from checkfu.contract.labels import owner_labels
from checkfu.contract.members import InspectRequest
from checkfu.contract.vocabulary import Resources
from checkfu.providers.host_process import HostProcessProvider, procfs, spawning
from checkfu.providers.host_process import cgroups as cg
from checkfu.providers.host_process.provider import PROVIDER_REVISION
from checkfu.providers.host_process.spawner import Spawner, SpawnerRetired, stranded
from checkfu.providers.host_process.state import InstanceLabel, Layout, read_groups, write_label

__all__ = ["kit", "pg_kit"]  # the fixtures, shared

ESCAPES = (
    # a plain background child, in the exec's process group
    "sleep 60 & echo $!; "
    # a child that leaves the group and the session
    "setsid sleep 60 & echo $!; "
    # a daemon: double fork, new session, orphaned to init
    "setsid sh -c 'sleep 60 & echo $!' ; "
    # a grandchild whose parent exits at once, staying in the group
    "sh -c 'sleep 60 & echo $!'"
)


def kill_strays(pids: list[tuple[int, int]]) -> None:
    """End processes a test started that the provider was not expected to end (pid and start time checked)."""
    for pid, start in pids:
        if procfs.is_alive(pid, start):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.anyio
async def test_release_reaps_every_descendant_even_setsid_escapees(kit: Kit) -> None:
    needs_cgroups(kit)
    assert (await kit.provider.describe()).envelope.lifecycle_assurances.reaps_process_tree
    call = await kit.active("ak-reap")
    started = pids_of(await kit.sh(call, ESCAPES))
    assert len(started) == 4
    assert all(procfs.is_alive(pid, start) for pid, start in started)
    escaped = procfs.stat(started[1][0])
    assert escaped is not None and escaped.session == started[1][0]  # really left the session
    try:
        await kit.release(call)
        survivors = [(pid, start) for pid, start in started if procfs.is_alive(pid, start)]
        assert survivors == []
    finally:
        kill_strays(started)


@pytest.mark.anyio
async def test_without_cgroups_release_ends_the_group_but_a_setsid_escapee_survives(pg_kit: Kit) -> None:
    """Why the fallback declares ``reaps_process_tree: false``."""
    assert (await pg_kit.provider.describe()).envelope.lifecycle_assurances.reaps_process_tree is False
    call = await pg_kit.active("ak-pg")
    started = pids_of(await pg_kit.sh(call, ESCAPES))
    in_group, left_group, daemon, orphan = started
    try:
        await pg_kit.release(call)
        assert not procfs.is_alive(*in_group)
        assert not procfs.is_alive(*orphan)
        assert procfs.is_alive(*left_group)
        assert procfs.is_alive(*daemon)
    finally:
        kill_strays(started)


@pytest.mark.anyio
async def test_an_exec_timeout_ends_its_setsid_escapees_too(kit: Kit) -> None:
    needs_cgroups(kit)
    call = await kit.active("ak-to")
    result = await kit.sh(call, "setsid sleep 60 & echo $!; sleep 60", timeout_ms=300)
    assert result.timed_out
    (pid,) = [int(p) for p in result.stdout.split()]
    found = procfs.stat(pid)
    assert found is None or not found.running


@pytest.mark.anyio
async def test_a_second_exec_keeps_the_first_ones_daemon(kit: Kit) -> None:
    """Ending one exec's tree (a timeout) leaves other trees of the instance alone."""
    call = await kit.active("ak-two")
    ((pid, start),) = pids_of(await kit.sh(call, "setsid sleep 60 & echo $!"))
    assert (await kit.sh(call, "sleep 60", timeout_ms=200)).timed_out
    assert procfs.is_alive(pid, start)
    await kit.release(call)
    if kit.provider.cgroup_reason is None:
        assert not procfs.is_alive(pid, start)
    kill_strays([(pid, start)])


# compensate ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_restarted_provider_compensates_from_the_key_alone(kit: Kit) -> None:
    call = await kit.active("ak-crash")
    started = pids_of(await kit.sh(call, "sleep 60 & echo $!; setsid sleep 60 & echo $!"))
    layout = Layout(kit.provider.state_dir)
    fresh = HostProcessProvider(state_dir=kit.provider.state_dir, kill_grace=0.2)
    try:
        assert await kit.compensate("ak-crash", provider=fresh) == 1
        assert not layout.instance_dir("ak-crash").exists()
        assert leftover_cgroups(layout.state_hash) == []
        assert not procfs.is_alive(*started[0])
        if kit.provider.cgroup_reason is None:
            assert not procfs.is_alive(*started[1])
        assert await kit.compensate("ak-crash", provider=fresh) == 0
        assert await make_kit(fresh).allocations() == []
    finally:
        kill_strays(started)


@pytest.mark.anyio
async def test_without_cgroups_a_restarted_provider_ends_the_groups_each_exec_recorded(pg_kit: Kit) -> None:
    """Each exec appends its process group to the instance's groups file: a provider started afresh ends them all
    from that record (by release of the instance it adopts, or by compensate from the key alone)."""
    layout = Layout(pg_kit.provider.state_dir)
    adopted = await pg_kit.active("ak-adopt")
    keyed = await pg_kit.active("ak-keyed")
    started = {key: [] for key in ("ak-adopt", "ak-keyed")}
    for call in (adopted, keyed):
        for _ in range(3):
            started[call["allocation_key"]] += pids_of(await pg_kit.sh(call, "sleep 60 & echo $!"))
    record = layout.instance_groups("ak-keyed")
    assert len(read_groups(record)) == 3
    with record.open("a") as torn:
        torn.write("12")  # a write cut short by a crash: skipped when read back
    assert len(read_groups(record)) == 3
    fresh = HostProcessProvider(state_dir=pg_kit.provider.state_dir, cgroups="off", kill_grace=0.2)
    try:
        await make_kit(fresh).release(adopted)
        assert not any(procfs.is_alive(*p) for p in started["ak-adopt"])
        assert await pg_kit.compensate("ak-keyed", provider=fresh) == 1
        assert not any(procfs.is_alive(*p) for p in started["ak-keyed"])
        assert not layout.instance_dir("ak-keyed").exists()
    finally:
        kill_strays([p for pids in started.values() for p in pids])


@pytest.mark.anyio
async def test_compensate_reclaims_a_half_provisioned_allocation(kit: Kit) -> None:
    call = await kit.provisioned("ak-half")
    assert await kit.compensate("ak-half") == 1
    assert await kit.allocations() == []
    assert (await kit.provider.inspect(InspectRequest(**call))).state == "released"
    assert await kit.compensate("ak-half") == 0


@pytest.mark.anyio
async def test_compensate_reclaims_a_label_whose_directory_was_never_filled(kit: Kit) -> None:
    """A crash right after the label was written: no working directory, no cgroups."""
    layout = Layout(kit.provider.state_dir)
    layout.instance_dir("ak-label").mkdir()
    write_label(
        layout.instance_label("ak-label"),
        InstanceLabel(
            labels=owner_labels("ak-label", TAG),
            revision=PROVIDER_REVISION,
            instance_id="hp-lost",
            state="provisioning",
        ),
    )
    assert await kit.allocations() == [("ak-label", "instance", "hp-lost")]
    assert await kit.compensate("ak-label") == 1
    assert not layout.instance_dir("ak-label").exists()


@pytest.mark.anyio
async def test_compensate_reclaims_an_unlabelled_leftover(kit: Kit) -> None:
    """A crash before the label landed leaves a directory nothing names."""
    layout = Layout(kit.provider.state_dir)
    (layout.instance_dir("ak-bare") / "work").mkdir(parents=True)
    assert await kit.compensate("ak-bare") == 1
    assert not layout.instance_dir("ak-bare").exists()


@pytest.mark.anyio
async def test_compensate_leaves_another_runners_allocation_alone(kit: Kit) -> None:
    call = await kit.active("ak-mine")
    assert await kit.compensate("ak-mine", OTHER_TAG) == 0
    assert (await kit.run(call, "true")).exit_code == 0
    fresh = HostProcessProvider(state_dir=kit.provider.state_dir)
    assert await kit.compensate("ak-mine", OTHER_TAG, provider=fresh) == 0
    assert (await kit.run(call, "true")).exit_code == 0
    assert await kit.allocations(OTHER_TAG) == []
    assert [k for k, _, _ in await kit.allocations()] == ["ak-mine"]


@pytest.mark.anyio
async def test_list_allocations_lists_everything_held_for_a_tag(kit: Kit) -> None:
    a = await kit.active("ak-1")
    b = await kit.provisioned("ak-2", runner_tag=OTHER_TAG)
    assert await kit.allocations() == [("ak-1", "instance", a["instance_id"])]
    assert await kit.allocations(OTHER_TAG) == [("ak-2", "instance", b["instance_id"])]
    await kit.release(a)
    assert await kit.allocations() == []


# pid recycling --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_compensation_never_signals_a_recycled_pid(pg_kit: Kit, tmp_path: Path) -> None:
    """A label naming a process group whose leader start time differs is someone else's."""
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = procfs.start_time(stranger.pid)
        assert start is not None
        layout = Layout(pg_kit.provider.state_dir)
        layout.instance_dir("ak-recycled").mkdir()
        write_label(
            layout.instance_label("ak-recycled"),
            InstanceLabel(
                labels=owner_labels("ak-recycled", TAG),
                revision=PROVIDER_REVISION,
                instance_id="hp-old",
                state="active",
                groups=[(stranger.pid, start - 1)],
            ),
        )
        assert await pg_kit.compensate("ak-recycled") == 1
        assert stranger.poll() is None
        assert procfs.is_alive(stranger.pid, start)
        # The same record with the true start time would have ended it: the start time is what saved it.
        assert spawning.group_members(stranger.pid, start) == [stranger.pid]
        assert spawning.group_members(stranger.pid, start - 1) == []
    finally:
        stranger.kill()
        stranger.wait()


def test_a_tampered_label_cannot_point_at_someone_elses_cgroup() -> None:
    hierarchies = cg.hierarchies_on_host()
    if "pids" not in hierarchies:
        pytest.skip("no pids hierarchy on this host")
    mount = hierarchies["pids"].mount
    name = cg.instance_name("0123456789ab", "ak-1")
    recorded = {
        "pids": str(mount / "docker"),
        "freezer": "/etc",
        "memory": str(mount / ".." / "memory" / name),
        "cpu": str(mount),
    }
    assert cg.verified(recorded, name).dirs == {}
    assert cg.verified({"pids": str(mount / name)}, name).dirs == {"pids": mount / name}


def test_proc_stat_parses_names_with_spaces_and_parentheses() -> None:
    parsed = procfs.parse_stat("123 (a (b) c) S 1 123 123 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4567 0 0")
    assert (parsed.pid, parsed.state, parsed.ppid, parsed.pgrp, parsed.session, parsed.start) == (
        123,
        "S",
        1,
        123,
        123,
        4567,
    )
    own = procfs.stat(os.getpid())
    assert own is not None and own.running


@pytest.mark.anyio
async def test_a_cancelled_exec_ends_its_tree(kit: Kit, tmp_path: Path) -> None:
    call = await kit.active("ak-cancel")
    pidfile = tmp_path / "pid"
    running = asyncio.ensure_future(
        kit.sh(call, f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 30")
    )
    for _ in range(500):
        if pidfile.exists():
            break
        await asyncio.sleep(0.01)
    pid = int(pidfile.read_text())
    start = procfs.start_time(pid)
    assert start is not None and procfs.is_alive(pid, start)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not procfs.is_alive(pid, start)


@pytest.mark.anyio
async def test_release_during_an_exec_ends_it(kit: Kit) -> None:
    call = await kit.active("ak-mid")
    running = asyncio.ensure_future(kit.sh(call, "sleep 30"))
    await asyncio.sleep(0.1)
    await kit.release(call)
    result = await asyncio.wait_for(running, 10)
    assert result.exit_code in (137, 143)


def test_a_spawner_thread_left_inside_an_instance_cgroup_retires(tmp_path: Path) -> None:
    host = cg.probe(tmp_path)
    if not isinstance(host, cg.CgroupHost):
        pytest.skip(f"this host gives the provider no cgroups: {host}")
    trap = host.plan(cg.instance_name("feedfacecafe", "ak-trap"))
    host.create(trap, Resources(cpu_millis=1000, memory_mib=64, disk_mib=1, pids=8))
    runner = Spawner()
    try:

        def wander() -> int:  # a job that enters an instance's cgroup and does not come back
            (trap.dirs["pids"] / "tasks").write_text(str(threading.get_native_id()))
            return threading.get_native_id()

        assert runner.submit(stranded).result(5) is False
        first = runner.submit(wander).result(5)
        racing = runner.submit(stranded)  # queued while the thread may still be inside the trap
        with contextlib.suppress(SpawnerRetired):  # refused, or ...
            assert racing.result(5) is False  # ... run on a clean thread: never run stranded
        while True:
            try:
                second = runner.submit(threading.get_native_id).result(5)
                break
            except SpawnerRetired:
                continue
        assert first != second
        assert runner.submit(stranded).result(5) is False
        for _ in range(200):
            if not cg.members(trap.dirs["pids"]):
                break
            time.sleep(0.01)
        assert cg.members(trap.dirs["pids"]) == set()
    finally:
        cg.remove(trap)
