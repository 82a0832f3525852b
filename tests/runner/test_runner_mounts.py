"""Admission: the profile is frozen once; mounts are read and digest-verified by the runner at each Run start.

Mount sources are real: a local directory, and a Git repository made with the git CLI.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from checkfu.contract.codec import build, decode, encode
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxDigestMismatch,
    SandboxPathRejected,
    SandboxProfileInvalid,
)
from checkfu.contract.members import ProvisionRequest
from checkfu.contract.mounts import MountFile, MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import Platform
from checkfu.core import job
from checkfu.core.job import QuietObserver, run_job
from checkfu.core.mounts import (
    DirectorySource,
    GitSource,
    MountSpec,
    git_blob_id,
    parse_mount,
    resolve_mount,
)
from checkfu.testing import memory_profile

AMD64 = Platform(os="linux", architecture="amd64")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# parse_mount ----------------------------------------------------------------------------------


def test_parse_mount() -> None:
    assert parse_mount("/src/dir:/workspace") == MountSpec(DirectorySource(Path("/src/dir")), "/workspace")
    assert parse_mount("/repos/x@v1.2:/code") == MountSpec(GitSource(Path("/repos/x"), "v1.2"), "/code")
    assert parse_mount("/a/b@main:/w").describe() == "/a/b@main:/w"
    # a trailing '@' names no ref: a directory
    assert parse_mount("/repos/x@:/w").source == DirectorySource(Path("/repos/x@"))
    for bad in ("nocolon", ":/w", "/src:"):
        with pytest.raises(SandboxProfileInvalid):
            parse_mount(bad)


# the profile: decoded, validated and frozen once ------------------------------------------------


def test_the_profile_is_frozen_and_its_digest_is_stable() -> None:
    profile = memory_profile()
    again = decode(SandboxProfile, encode(profile))
    assert again == profile and again.digest == profile.digest
    with pytest.raises(pydantic.ValidationError):
        profile.retention_mode = "durable"  # type: ignore[misc]
    assert profile.digest == decode(SandboxProfile, encode(profile)).digest


@pytest.mark.anyio
async def test_the_run_records_the_profile_digest_and_the_provider_receives_it(rig: Any, workspace: Path) -> None:
    profile = memory_profile()
    seen: list[ProvisionRequest] = []
    real = rig.memory.provision

    async def provision(request: ProvisionRequest) -> Any:
        seen.append(request)
        return await real(request)

    rig.memory.provision = provision
    result = await run_job(
        rig.runner, rig.memory.target, profile, ["true"], mounts=[parse_mount(f"{workspace}:/workspace")]
    )
    run = rig.journal.run(result.run_id)
    assert run is not None and run.profile_digest == profile.digest
    assert [r.profile_digest for r in seen] == [profile.digest]
    assert seen[0].profile == profile
    assert [m.target for m in seen[0].mounts] == ["/workspace"]


# directory mounts ------------------------------------------------------------------------------


def test_a_directory_is_read_and_digested_by_the_runner(workspace: Path) -> None:
    resolved = resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))
    files = dict(tree(workspace))
    assert [f.path for f in resolved.plan.files] == sorted(files)
    for f, data in resolved.files():
        assert data == files[f.path]
        assert (f.size, f.digest) == (len(data), sha256(data))
    modes = {f.path: f.mode for f in resolved.plan.files}
    assert modes == {"README": 0o644, "src/run.sh": 0o755}
    assert resolved.plan.absolute(resolved.plan.files[0]) == "/workspace/README"


def test_a_declared_plan_must_match(workspace: Path) -> None:
    spec = MountSpec(DirectorySource(workspace), "/workspace")
    plan = resolve_mount(spec).plan
    assert resolve_mount(spec, expected=plan).plan == plan

    wrong = plan.model_copy(update={"files": (plan.files[0].model_copy(update={"digest": sha256(b"other")}),)})
    with pytest.raises(SandboxDigestMismatch) as caught:
        resolve_mount(spec, expected=wrong.model_copy(update={"files": (*wrong.files, plan.files[1])}))
    assert caught.value.field == "files.0.digest"

    missing = plan.files[0].model_copy(update={"path": "NOT-THERE"})
    with pytest.raises(SandboxDigestMismatch) as caught:
        resolve_mount(spec, expected=plan.model_copy(update={"files": (*plan.files, missing)}))
    assert "missing" in caught.value.message

    with pytest.raises(SandboxDigestMismatch) as caught:  # a file on disk the plan does not declare
        resolve_mount(spec, expected=plan.model_copy(update={"files": plan.files[:1]}))
    assert "src/run.sh" in caught.value.message

    (workspace / "README").write_bytes(b"changed after the plan was declared\n")
    with pytest.raises(SandboxDigestMismatch):
        resolve_mount(spec, expected=plan)


def test_a_symlink_inside_the_mount_is_staged_as_a_link(workspace: Path) -> None:
    os.symlink("README", workspace / "link")
    os.symlink("src", workspace / "linked-dir")  # os.walk lists it among the directories: still a link
    resolved = resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))
    got = {f.path: (f, data) for f, data in resolved.files()}
    assert got["link"][0].symlink and got["link"][1] == b"README"
    assert got["linked-dir"][0].symlink and got["linked-dir"][1] == b"src"
    assert got["link"][0].digest == sha256(b"README") and got["link"][0].size == 6
    assert not any(p.startswith("linked-dir/") for p in got)  # never followed


ESCAPES: dict[str, tuple[dict[str, str], str]] = {
    # case: (helper links made first, the target of "bad-link")
    "absolute": ({}, "/etc/shadow"),
    "parent": ({}, "../outside"),
    "through-a-dir": ({}, "src/../../x"),
    "through-a-link": ({"hop": "."}, "hop/../x"),  # lexically inside; hop is the root, so hop/.. is its parent
    "a-loop": ({"loop": "loop"}, "loop/x"),
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_a_symlink_leading_outside_is_refused_by_name_never_followed(workspace: Path, case: str) -> None:
    helpers, target = ESCAPES[case]
    for name, link in helpers.items():
        os.symlink(link, workspace / name)
    os.symlink(target, workspace / "bad-link")
    with pytest.raises(SandboxPathRejected) as caught:
        resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))
    assert "symlink" in caught.value.message
    assert "bad-link" in caught.value.message or any(h in caught.value.message for h in helpers)


def test_link_escape_resolves_through_the_mounts_own_links() -> None:
    from checkfu.core.mounts import link_escape  # noqa: PLC0415

    assert link_escape("a", {"a": "b/c"}) is None
    assert link_escape("d/a", {"d/a": "../b"}) is None
    assert link_escape("a", {"a": "../b"}) is not None
    assert link_escape("l", {"s": ".", "l": "s/.."}) is not None  # lexically fine, really the parent
    assert link_escape("l", {"s": "d1/d2", "l": "s/../.."}) is not None  # lexically out: refused, conservatively
    assert link_escape("l", {"s": "/abs", "l": "s/x"}) is not None
    assert link_escape("l", {"l": "l/x"}) is not None  # a loop


def test_directory_problems(tmp_path: Path, workspace: Path) -> None:
    with pytest.raises(SandboxProfileInvalid):
        resolve_mount(MountSpec(DirectorySource(tmp_path / "absent"), "/workspace"))
    with pytest.raises(SandboxProfileInvalid):
        resolve_mount(MountSpec(DirectorySource(workspace / "README"), "/workspace"))
    with pytest.raises(SandboxPathRejected):
        resolve_mount(MountSpec(DirectorySource(workspace), "workspace"))  # not absolute
    with pytest.raises(SandboxPathRejected):
        resolve_mount(MountSpec(DirectorySource(workspace), "/"))  # a mount may not cover the root
    fifo = workspace / "fifo"
    os.mkfifo(fifo)  # not a regular file: never read (reading a FIFO would block)
    assert "fifo" not in {f.path for f in resolve_mount(MountSpec(DirectorySource(workspace), "/w")).plan.files}


NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
RESOLVE_AND_SAY = """
import json, sys
from checkfu.contract.errors import SandboxError
from checkfu.core.mounts import parse_mount, resolve_mount
try:
    plan = resolve_mount(parse_mount(sys.argv[1], stage_all=sys.argv[2] == "stage_all")).plan
except SandboxError as exc:
    print(json.dumps({"code": exc.code, "field": exc.field, "message": exc.message}))
else:
    print(json.dumps({"files": [f.path for f in plan.files]}))
"""


@pytest.fixture
def nobodys_tree() -> Iterator[Path]:
    """An empty directory for a tree that user ``nobody`` owns and can reach (``tmp_path`` lies below a
    directory only root may enter); removed with everything in it afterwards."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a resolution as another user needs root and setpriv (as root, every directory reads)")
    if subprocess.run([*NOBODY, sys.executable, "-c", "import checkfu"], capture_output=True, check=False).returncode:
        pytest.skip(f"user nobody cannot run {sys.executable} with checkfu installed")
    base = Path(tempfile.mkdtemp(prefix="checkfu-mount-"))
    try:
        base.chmod(0o755)
        (base / "src").mkdir()
        yield base / "src"
    finally:
        shutil.rmtree(base)


def resolve_as_nobody(root: Path, *, stage_all: bool = False) -> dict[str, Any]:
    """Resolve ``root`` as a mount (``stage_all``: what Git ignores too) in a process of user ``nobody``, once
    the tree is given to nobody; what it said: the files of the plan, or the error's code, field and message."""
    subprocess.run(["chown", "-R", "65534:65534", str(root)], check=True)
    done = subprocess.run(
        [*NOBODY, sys.executable, "-c", RESOLVE_AND_SAY, f"{root}:/w", "stage_all" if stage_all else "-"],
        capture_output=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"},
        cwd="/",
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    said: dict[str, Any] = json.loads(done.stdout)
    return said


def plain_git(root: Path, *args: str) -> None:
    """``git`` in ``root`` as the test's user, with nothing of its configuration."""
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"},
    )


@pytest.mark.parametrize(
    ("layout", "locked"),
    [
        ("plain", "locked"),  # a directory outside any Git work tree: os.walk used to skip it
        ("plain", "deep/secret.txt"),  # a file
        ("git", "locked"),  # untracked, in a work tree: git warned and left it out
        ("git-tracked", "locked"),  # its files are tracked
        ("git-stage-all", "locked"),  # --no-ignore walks the tree itself
    ],
)
def test_an_unreadable_path_inside_a_mount_is_refused_by_name_never_left_out(
    nobodys_tree: Path, layout: str, locked: str
) -> None:
    root = nobodys_tree
    for rel in ("a.txt", "deep/secret.txt", "locked/inner.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"data\n")
    if layout.startswith("git"):
        plain_git(root, "init", "-q")
        if layout == "git-tracked":
            plain_git(root, "add", "-A")
            plain_git(root, "commit", "-q", "-m", "one")
    stage_all = layout == "git-stage-all"
    said = resolve_as_nobody(root, stage_all=stage_all)
    staged = [p for p in said["files"] if not p.startswith(".git/")]  # stage_all stages .git too
    assert staged == ["a.txt", "deep/secret.txt", "locked/inner.txt"]  # while it reads: all of it
    (root / locked).chmod(0o000)
    said = resolve_as_nobody(root, stage_all=stage_all)
    assert said.get("code") == "SandboxPathRejected" and said.get("field") == "mounts", said
    assert f": {locked} cannot be read (Permission denied)" in said["message"], said


def test_an_unreadable_directory_git_ignores_is_not_looked_at(nobodys_tree: Path) -> None:
    root = nobodys_tree
    (root / "a.txt").write_bytes(b"data\n")
    (root / ".gitignore").write_text("build/\n")
    (root / "build" / "cache").mkdir(parents=True)
    (root / "build" / "cache" / "x.o").write_bytes(b"object\n")
    plain_git(root, "init", "-q")
    (root / "build").chmod(0o000)
    assert resolve_as_nobody(root) == {"files": [".gitignore", "a.txt"]}


def test_directory_bound(workspace: Path) -> None:
    spec = MountSpec(DirectorySource(workspace), "/workspace")
    total = sum(len(b) for b in tree(workspace).values())
    assert resolve_mount(spec, max_bytes=total).plan.total_bytes == total
    with pytest.raises(SandboxBoundExceeded):
        resolve_mount(spec, max_bytes=total - 1)


# Git mounts -----------------------------------------------------------------------------------


def test_git_blobs_are_read_at_a_ref_and_verified_by_blob_id(git_repo: Any) -> None:
    for ref in ("main", "v1", git_repo.commit, "HEAD"):
        resolved = resolve_mount(MountSpec(GitSource(git_repo.path, ref), "/code"))
        got = {f.path: (f, data) for f, data in resolved.files()}
        assert set(got) == set(git_repo.files)
        for name, data in git_repo.files.items():
            f, staged = got[name]
            assert staged == data
            assert f.digest == f"git:{git_repo.blob_id(name)}" == f"git:{git_blob_id(data)}"
            assert f.size == len(data)
        assert got["tool.py"][0].mode == 0o755 and got["docs/guide.md"][0].mode == 0o644


def test_a_ref_is_immutable_content(git_repo: Any) -> None:
    (git_repo.path / "tool.py").write_bytes(b"print('two')\n")
    git_repo.run("commit", "-qam", "two")
    at_v1 = {f.path: d for f, d in resolve_mount(MountSpec(GitSource(git_repo.path, "v1"), "/c")).files()}
    at_main = {f.path: d for f, d in resolve_mount(MountSpec(GitSource(git_repo.path, "main"), "/c")).files()}
    assert at_v1["tool.py"] == b"print('tool')\n"
    assert at_main["tool.py"] == b"print('two')\n"
    # The working tree is not read: only committed blobs.
    (git_repo.path / "tool.py").write_bytes(b"uncommitted\n")
    again = {f.path: d for f, d in resolve_mount(MountSpec(GitSource(git_repo.path, "main"), "/c")).files()}
    assert again["tool.py"] == b"print('two')\n"


def test_a_sha256_repository(tmp_path: Path, git_helper: Callable[..., str]) -> None:
    repo = tmp_path / "repo256"
    repo.mkdir()
    git_helper(repo, "init", "-q", "--object-format=sha256")
    (repo / "a").write_bytes(b"hello\n")
    git_helper(repo, "add", "-A")
    git_helper(repo, "commit", "-qm", "x")
    ((f, data),) = resolve_mount(MountSpec(GitSource(repo, "HEAD"), "/w")).files()
    oid = git_helper(repo, "rev-parse", "HEAD:a").strip()
    assert len(oid) == 64 and f.digest == f"git:{oid}" == f"git:{git_blob_id(data, algorithm='sha256')}"


def _loose(repo: Any, oid: str) -> Path:
    path = repo.path / ".git" / "objects" / oid[:2] / oid[2:]
    assert path.is_file(), "the fixture repository keeps loose objects"
    path.chmod(0o644)
    return path


def test_a_corrupted_blob_that_git_reads_back_wrong_is_a_digest_mismatch(git_repo: Any) -> None:
    oid = git_repo.blob_id("docs/guide.md")
    # A well-formed loose object with other bytes under the original id: git serves it without checking.
    _loose(git_repo, oid).write_bytes(zlib.compress(b"blob 9\x00# forged\n"))
    assert git_repo.run("cat-file", "-p", oid) == "# forged\n"
    with pytest.raises(SandboxDigestMismatch) as caught:
        resolve_mount(MountSpec(GitSource(git_repo.path, "v1"), "/code"))
    assert oid in caught.value.message and "docs/guide.md" in caught.value.message


def test_a_blob_git_cannot_read_is_profile_invalid(git_repo: Any) -> None:
    oid = git_repo.blob_id("tool.py")
    _loose(git_repo, oid).write_bytes(b"not a zlib stream")
    with pytest.raises(SandboxProfileInvalid):
        resolve_mount(MountSpec(GitSource(git_repo.path, "v1"), "/code"))


def test_a_declared_git_plan_must_match(git_repo: Any) -> None:
    spec = MountSpec(GitSource(git_repo.path, "v1"), "/code")
    plan = resolve_mount(spec).plan
    files = list(plan.files)
    files[0] = build(MountFile, path=files[0].path, mode=files[0].mode, size=files[0].size, digest="git:" + "0" * 40)
    with pytest.raises(SandboxDigestMismatch) as caught:
        resolve_mount(spec, expected=build(MountPlan, target="/code", files=files))
    assert caught.value.field == "files.0.digest"


def test_git_symlinks_are_staged_as_links_and_submodules_refused_by_path(git_repo: Any) -> None:
    os.symlink("tool.py", git_repo.path / "link")
    git_repo.run("add", "link")
    git_repo.run("commit", "-qm", "link")
    got = {f.path: (f, d) for f, d in resolve_mount(MountSpec(GitSource(git_repo.path, "main"), "/code")).files()}
    assert got["link"][0].symlink and got["link"][1] == b"tool.py"
    assert got["link"][0].digest == f"git:{git_blob_id(b'tool.py')}"

    os.symlink("../../etc/passwd", git_repo.path / "escape")
    git_repo.run("add", "escape")
    git_repo.run("commit", "-qm", "escape")
    with pytest.raises(SandboxPathRejected) as caught:
        resolve_mount(MountSpec(GitSource(git_repo.path, "main"), "/code"))
    assert "escape" in caught.value.message and "symlink" in caught.value.message

    git_repo.run("rm", "-q", "link", "escape")
    git_repo.run("update-index", "--add", "--cacheinfo", f"160000,{git_repo.commit},vendor/sub")
    git_repo.run("commit", "-qm", "submodule")
    with pytest.raises(SandboxPathRejected) as caught:
        resolve_mount(MountSpec(GitSource(git_repo.path, "main"), "/code"))
    assert "vendor/sub" in caught.value.message and "submodule" in caught.value.message
    # the ref before either is still fine
    assert resolve_mount(MountSpec(GitSource(git_repo.path, "v1"), "/code")).plan.files


def test_git_problems(git_repo: Any, tmp_path: Path) -> None:
    for ref in ("no-such-ref", "v1:tool.py", "--output=" + str(tmp_path / "pwned")):
        with pytest.raises(SandboxProfileInvalid):
            resolve_mount(MountSpec(GitSource(git_repo.path, ref), "/code"))
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(SandboxProfileInvalid):
        resolve_mount(MountSpec(GitSource(tmp_path / "absent", "main"), "/code"))
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SandboxProfileInvalid):
        resolve_mount(MountSpec(GitSource(plain, "main"), "/code"))


def test_git_bound(git_repo: Any) -> None:
    spec = MountSpec(GitSource(git_repo.path, "v1"), "/code")
    total = sum(len(b) for b in git_repo.files.values())
    assert resolve_mount(spec, max_bytes=total).plan.total_bytes == total
    with pytest.raises(SandboxBoundExceeded):
        resolve_mount(spec, max_bytes=total - 1)


def test_an_empty_commit_is_an_empty_mount(tmp_path: Path, git_helper: Callable[..., str]) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    git_helper(repo, "init", "-q", "-b", "main")
    git_helper(repo, "commit", "-q", "--allow-empty", "-m", "nothing")
    resolved = resolve_mount(MountSpec(GitSource(repo, "main"), "/e"))
    assert resolved.plan.files == () and list(resolved.files()) == []


# nothing is provisioned when a mount does not verify --------------------------------------------


@pytest.mark.anyio
async def test_a_digest_mismatch_provisions_nothing(rig: Any, git_repo: Any, workspace: Path) -> None:
    oid = git_repo.blob_id("data.bin")
    _loose(git_repo, oid).write_bytes(zlib.compress(b"blob 3\x00bad"))
    with pytest.raises(SandboxDigestMismatch):
        await run_job(
            rig.runner,
            rig.memory.target,
            memory_profile(),
            ["true"],
            mounts=[parse_mount(f"{workspace}:/workspace"), parse_mount(f"{git_repo.path}@v1:/code")],
        )
    assert rig.memory.calls == []
    assert rig.journal.list_runs() == []
    assert rig.memory.live_objects() == ()


@pytest.mark.anyio
async def test_an_oversized_mount_provisions_nothing(rig: Any, workspace: Path, monkeypatch: Any) -> None:
    # run_job has no knob for the mount bound; give its resolver a small one.
    monkeypatch.setattr(job, "resolve_mount", functools.partial(resolve_mount, max_bytes=4))
    with pytest.raises(SandboxBoundExceeded):
        await run_job(
            rig.runner, rig.memory.target, memory_profile(), ["true"], mounts=[parse_mount(f"{workspace}:/w")]
        )
    assert rig.memory.calls == [] and rig.journal.list_runs() == []


# fixed within the Run, re-resolved at each Run start ---------------------------------------------


@pytest.mark.anyio
async def test_mounts_are_fixed_within_a_run(rig: Any, workspace: Path, git_repo: Any) -> None:
    session = rig.start(mount_count=2)
    profile = memory_profile()
    resolved = [resolve_mount(MountSpec(GitSource(git_repo.path, "main"), "/code"))]
    # The branch moves after the Run started ...
    (git_repo.path / "tool.py").write_bytes(b"moved\n")
    git_repo.run("commit", "-qam", "moved")
    image = (await session.materialize(profile, AMD64)).image
    inst = await session.provision(profile, AMD64, image, resolved)
    await session.stage(inst, resolved)
    await session.activate(inst)
    # ... but the sandbox holds the blobs resolved at the start.
    out = await session.exec(inst, ["cat", "/code/tool.py"], timeout=5)
    assert out.stdout == b"print('tool')\n"
    await session.release_all()


@pytest.mark.anyio
async def test_a_directory_file_that_changes_after_resolution_is_never_staged(rig: Any, workspace: Path) -> None:
    # No file is kept in memory between resolution and staging: each is read again and held to its digest.
    session = rig.start(mount_count=1)
    profile = memory_profile()
    resolved = [resolve_mount(MountSpec(DirectorySource(workspace), "/workspace"))]
    (workspace / "README").write_bytes(b"moved\n")
    image = (await session.materialize(profile, AMD64)).image
    inst = await session.provision(profile, AMD64, image, resolved)
    with pytest.raises(SandboxDigestMismatch) as caught:
        await session.stage(inst, resolved)
    assert "README" in caught.value.message
    await session.release_all()
    assert rig.memory.live_objects() == ()


@pytest.mark.anyio
async def test_mounts_are_resolved_again_at_each_run_start(rig: Any, workspace: Path) -> None:
    mounts = [parse_mount(f"{workspace}:/workspace")]
    outputs = []
    for content in (b"first\n", b"second\n"):
        (workspace / "README").write_bytes(content)
        observer = QuietObserver()
        result = await run_job(
            rig.runner,
            rig.memory.target,
            memory_profile(),
            ["cat", "/workspace/README"],
            mounts=mounts,
            observer=observer,
        )
        assert result.exit_code == 0
        outputs.append(bytes(observer.out))
    assert outputs == [b"first\n", b"second\n"]
