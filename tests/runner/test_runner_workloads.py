"""What a Run of a real workload needs from the runner, on the memory provider (issues 10 and 16).

- ``--capture`` of a directory with more files than one ``readFiles`` request may ask for is read in
  batches, the command's status kept; a listing cut short by its bound says so (issue 16, defect 5).
- A Git blob over the mount's bound is refused from the object's size, before git is asked for any
  byte of it (issue 16, defect 2).
- Every input is checked before any provider call (issue 16, defect 12; issue 10): the working
  directory, capture paths, the command, environment names; a refusal leaves the provider untouched.
- Env values are never recorded; only the names and the working directory are.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.errors import SandboxBoundExceeded, SandboxPathRejected, SandboxProfileInvalid
from checkfu.contract.members import ReadFilesRequest, ReadFilesResult
from checkfu.core import mounts as mounts_module
from checkfu.core.driver import Limits
from checkfu.core.job import READ_BATCH, QuietObserver, run_job
from checkfu.core.mounts import GitSource, MountSpec, parse_mount, resolve_mount
from checkfu.testing import memory_profile

# captures in batches -------------------------------------------------------------------------------


def _many_files(where: Path, n: int) -> Path:
    root = where / "many"
    for i in range(n):
        sub = root / f"d{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:05d}.txt").write_bytes(b"%d\n" % i)
    return root


@pytest.mark.anyio
async def test_a_capture_of_more_files_than_one_read_holds_is_read_in_batches(rig: Any, tmp_path: Path) -> None:
    n = READ_BATCH + 300
    src = _many_files(tmp_path, n)
    asked: list[int] = []
    real = rig.memory.read_files

    async def read_files(request: ReadFilesRequest) -> ReadFilesResult:
        asked.append(len(request.paths))
        return await real(request)

    rig.memory.read_files = read_files
    into = tmp_path / "into"
    observer = QuietObserver()
    result = await run_job(
        rig.runner,
        rig.memory.target,
        memory_profile(),
        ["false"],  # the command fails: its status must survive the capture
        mounts=[parse_mount(f"{src}:/many")],
        captures=["/many"],
        capture_dir=into,
        observer=observer,
    )
    assert result.exit_code == 1
    assert len(result.captured) == n
    assert sum(asked) == n and max(asked) <= READ_BATCH and len(asked) == 2
    assert (into / "many" / "d3" / "f00003.txt").read_bytes() == b"3\n"
    assert observer.warnings == [] or all("not captured" not in w for w in observer.warnings)
    assert rig.memory.live_objects() == ()


@pytest.mark.anyio
async def test_a_listing_cut_short_by_its_bound_says_so(make_rig: Any, tmp_path: Path) -> None:
    rig = make_rig(limits=Limits(max_list_entries=500))
    src = _many_files(tmp_path, 600)
    observer = QuietObserver()
    result = await run_job(
        rig.runner,
        rig.memory.target,
        memory_profile(),
        ["true"],
        mounts=[parse_mount(f"{src}:/many")],
        captures=["/many"],
        capture_dir=tmp_path / "into",
        observer=observer,
    )
    assert result.exit_code == 0
    assert 0 < len(result.captured) < 600
    [said] = [w for w in observer.warnings if "/many" in w]
    assert "bound of 500 entries" in said and "not captured" in said


# a Git blob over the bound --------------------------------------------------------------------------


def test_an_over_bound_git_blob_is_refused_from_its_size_before_a_byte_is_read(
    tmp_path: Path, git_helper: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git_helper(repo, "init", "-q", "-b", "main")
    (repo / "small.txt").write_bytes(b"small\n")
    with (repo / "zeros.bin").open("wb") as f:
        f.truncate(8 << 20)  # 8 MiB of zeros: a tiny object in the repository, a large blob
    git_helper(repo, "add", "-A")
    git_helper(repo, "commit", "-q", "-m", "x")
    started: list[list[str]] = []
    real_popen, real_run = subprocess.Popen, subprocess.run

    def popen(args: Any, *a: Any, **k: Any) -> Any:
        started.append(list(args))
        return real_popen(args, *a, **k)

    def run(args: Any, *a: Any, **k: Any) -> Any:
        started.append(list(args))
        return real_run(args, *a, **k)

    monkeypatch.setattr(mounts_module.subprocess, "Popen", popen)
    monkeypatch.setattr(mounts_module.subprocess, "run", run)
    with pytest.raises(SandboxBoundExceeded) as caught:
        resolve_mount(MountSpec(GitSource(repo, "main"), "/code"), max_bytes=1 << 20)
    assert "zeros.bin" in caught.value.message and "nothing was read" in caught.value.message
    assert not [a for a in started if "cat-file" in a]  # git was never asked for a blob's bytes
    # Within the bound, the blobs stream through and verify.
    started.clear()
    resolved = resolve_mount(MountSpec(GitSource(repo, "main"), "/code"), max_bytes=16 << 20)
    assert [f.size for f in resolved.plan.files] == [6, 8 << 20]
    assert [a for a in started if "cat-file" in a]


# admission: every input before any provider call ---------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "code", "phrase"),
    [
        ({"cwd": "/proc/self/fd/7"}, SandboxPathRejected, "inside /proc"),
        ({"cwd": "relative/dir"}, SandboxPathRejected, "must be absolute"),
        ({"captures": ["out/report.xml"]}, SandboxPathRejected, "must be absolute"),
        ({"captures": ["/home/" + "x" * 300]}, SandboxPathRejected, "a name of 300 bytes"),
        ({"env": {"1BAD": "x"}}, SandboxProfileInvalid, "not an environment name"),
        ({"argv": ["echo"] * 4097}, SandboxBoundExceeded, "4097 arguments"),
        ({"argv": ["echo", "caf\udce9"]}, SandboxProfileInvalid, "not valid UTF-8"),
        ({"mounts": [MountSpec(GitSource(Path("/nonexistent"), "main"), "w")]}, SandboxPathRejected, "absolute"),
    ],
    ids=[
        "proc-workdir",
        "relative-workdir",
        "relative-capture",
        "long-name",
        "env-name",
        "argv-count",
        "argv-utf8",
        "relative-target",
    ],
)
async def test_every_input_is_checked_before_any_provider_call(
    rig: Any, kwargs: dict[str, Any], code: type[Exception], phrase: str
) -> None:
    argv = kwargs.pop("argv", ["true"])
    with pytest.raises(code) as caught:
        await run_job(rig.runner, rig.memory.target, memory_profile(), argv, **kwargs)
    assert phrase in str(caught.value)
    assert rig.memory.calls == []  # not even materialize
    assert rig.journal.list_runs(10) == []  # no Run was started


@pytest.mark.anyio
async def test_a_refusal_reports_every_problem(rig: Any) -> None:
    with pytest.raises(SandboxProfileInvalid) as caught:  # the first problem's kind, every problem in the message
        await run_job(
            rig.runner,
            rig.memory.target,
            memory_profile(),
            ["true"],
            cwd="/proc/1",
            captures=["rel"],
            env={"BAD NAME": "v"},
        )
    message = str(caught.value)
    assert message.startswith("3 problems")
    for phrase in ("/proc", "'rel'", "'BAD NAME'", "SandboxPathRejected: workdir", "SandboxPathRejected: capture.0"):
        assert phrase in message
    assert rig.memory.calls == []


@pytest.mark.anyio
async def test_env_values_never_reach_the_journal(rig: Any, tmp_path: Path) -> None:
    secret = "s3cr3t-value-0123456789"
    result = await run_job(
        rig.runner,
        rig.memory.target,
        memory_profile(),
        ["env"],
        env={"TOKEN": secret},
        cwd="/",
        observer=QuietObserver(),
    )
    run = rig.journal.run(result.run_id)
    assert run is not None and run.summary["env"] == ["TOKEN"] and run.summary["workdir"] == "/"
    everything = repr(run) + repr(rig.journal.events_for_run(result.run_id))
    assert secret not in everything
    for path in tmp_path.glob("journal-*.sqlite*"):
        assert secret.encode() not in path.read_bytes()
