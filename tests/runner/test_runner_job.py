"""``run_job``, the job behind ``checkfu run``, end to end on the memory provider."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from checkfu.contract import examples as ex
from checkfu.contract.codec import decode_value
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxProviderFailed
from checkfu.core.job import PHASES, QuietObserver, run_job
from checkfu.core.journal import leases
from checkfu.core.mounts import parse_mount
from checkfu.testing import Misbehaving, crash, memory_profile

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["in-process", "wire"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every lifecycle test runs against the provider in-process and behind the wire."""
    return str(request.param)


async def test_a_job_end_to_end(rig: Any, workspace: Path, git_repo: Any, tmp_path: Path) -> None:
    observer = QuietObserver()
    result = await run_job(
        rig.runner,
        rig.memory.target,
        memory_profile(),
        ["cat", "/workspace/README"],
        mounts=[parse_mount(f"{workspace}:/workspace"), parse_mount(f"{git_repo.path}@v1:/code")],
        captures=["/code/docs", "/workspace/src"],
        capture_dir=tmp_path / "captured",
        observer=observer,
    )
    readme = (workspace / "README").read_bytes()
    assert result.exit_code == 0
    assert bytes(observer.out) == readme and bytes(observer.err) == b""
    assert list(result.phases) == list(PHASES) == list(observer.phases)
    assert all(seconds >= 0 for seconds in result.phases.values())
    captured = {Path(p).relative_to(tmp_path / "captured").as_posix(): Path(p).read_bytes() for p in result.captured}
    assert captured == {
        "code/docs/guide.md": git_repo.files["docs/guide.md"],
        "workspace/src/run.sh": (workspace / "src" / "run.sh").read_bytes(),
    }
    assert result.adapter == str(rig.memory.target)
    assert len(result.not_enforced) == 9 and observer.warnings  # the memory tier enforces nothing and says so

    run = rig.journal.run(result.run_id)
    assert run is not None
    assert (run.status, run.exit_code, run.command) == ("succeeded", 0, ["cat", "/workspace/README"])
    assert run.summary is not None and sorted(run.summary["captured"]) == sorted(result.captured)
    assert [r.state for r in rig.journal.allocations_for_run(result.run_id)] == ["released"]
    assert rig.memory.live_objects() == ()
    members = [e.member for e in rig.journal.events_for_run(result.run_id)]
    assert members[:3] == ["select", "materialize", "provision"]
    assert "openProcess" in members and members[-1] == "release"
    with rig.journal.tx() as c:  # the Run's lease is given up with it
        (lease,) = c.execute(sa.select(leases).where(leases.c.run_id == result.run_id)).mappings().all()
    assert lease["ended"]


async def test_capturing_a_single_file(rig: Any, workspace: Path, tmp_path: Path) -> None:
    # A provider answers listDir on a file with a typed refusal (memory: SandboxNotFound; docker:
    # SandboxPathRejected); capturing one file must still work, and a missing path captures nothing.
    result = await run_job(
        rig.runner,
        rig.memory.target,
        memory_profile(),
        ["true"],
        mounts=[parse_mount(f"{workspace}:/workspace")],
        captures=["/workspace/README", "/workspace/absent"],
        capture_dir=tmp_path / "captured",
    )
    assert result.exit_code == 0
    assert [Path(p).read_bytes() for p in result.captured] == [(workspace / "README").read_bytes()]
    assert rig.memory.live_objects() == ()


async def test_a_failing_command(rig: Any) -> None:
    result = await run_job(rig.runner, rig.memory.target, memory_profile(), ["cat", "/nope"])
    assert result.exit_code == 1
    run = rig.journal.run(result.run_id)
    assert run is not None and (run.status, run.exit_code) == ("command_failed", 1)
    assert rig.memory.live_objects() == ()


async def test_the_day_one_tier_runs_one_shot_through_exec(make_rig: Any, workspace: Path) -> None:
    rig = make_rig(envelope=decode_value(SandboxProviderCapabilities, ex.day_one_envelope()))
    observer = QuietObserver()
    result = await run_job(
        rig.runner,
        rig.memory.target,
        memory_profile(),
        ["cat", "/workspace/README"],
        mounts=[parse_mount(f"{workspace}:/workspace")],
        observer=observer,
    )
    assert result.exit_code == 0 and bytes(observer.out) == (workspace / "README").read_bytes()
    assert "exec" in rig.memory.calls and "openProcess" not in rig.memory.calls
    assert "capture" not in result.phases
    # No readFiles: asking for a capture is refused at selection, before any provider work.
    before = list(rig.memory.calls)
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        await run_job(rig.runner, rig.memory.target, memory_profile(), ["true"], captures=["/workspace/README"])
    assert caught.value.field == "capture" and "readFiles" in caught.value.message
    assert rig.memory.calls == before
    assert rig.memory.live_objects() == ()
    assert [r.status for r in rig.journal.list_runs()] == ["succeeded"]


async def test_a_cancelled_job_leaves_nothing_behind(rig: Any, workspace: Path) -> None:
    phases: list[str] = []

    class Watching(QuietObserver):
        def phase(self, name: str, seconds: float) -> None:
            super().phase(name, seconds)
            phases.append(name)

    task = asyncio.create_task(
        run_job(
            rig.runner,
            rig.memory.target,
            memory_profile(),
            ["sleep", "30"],
            mounts=[parse_mount(f"{workspace}:/workspace")],
            observer=Watching(),
        )
    )
    for _ in range(500):  # until the process runs
        await asyncio.sleep(0.01)
        if "activate" in phases and rig.memory.calls[-1:] == ["openProcess"]:
            break
    assert "activate" in phases
    assert len(rig.memory.live_objects()) == 1
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.memory.live_objects() == ()
    (run,) = rig.journal.list_runs()
    assert run.status == "interrupted"
    states = [r.state for r in rig.journal.allocations_for_run(run.run_id)]
    assert states and set(states) <= {"released", "compensated"}
    assert "release" in phases


async def test_a_provider_fault_mid_job_is_compensated(make_rig: Any) -> None:
    rig = make_rig(wrap=lambda m: Misbehaving(m, {"activate": crash}))
    with pytest.raises(SandboxProviderFailed):
        await run_job(rig.runner, rig.memory.target, memory_profile(), ["true"])
    assert rig.memory.live_objects() == ()
    (run,) = rig.journal.list_runs()
    # it ran: the provider was at work when it failed (issue 29), so not a refusal; the summary keeps the code
    assert run.status == "failed"
    assert run.summary is not None and run.summary["error"]["code"] == "SandboxProviderFailed"
    assert [r.state for r in rig.journal.allocations_for_run(run.run_id)] == ["compensated"]
