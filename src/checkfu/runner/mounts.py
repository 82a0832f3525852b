"""Mount resolution: the runner reads every mount byte itself and verifies its digest.

A mount source is a local directory or a Git repository at a ref. Resolution
happens at each Run start, before anything is provisioned: every file is read,
its digest computed (``sha256:`` for a directory, the Git blob id for Git
content, recomputed from the bytes), and, when a plan was declared in advance,
compared with it. Any difference is ``SandboxDigestMismatch`` and nothing is
provisioned. The provider never fetches content and holds no credential.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from checkfu.contract.codec import build
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxDigestMismatch,
    SandboxPathRejected,
    SandboxProfileInvalid,
)
from checkfu.contract.mounts import MountFile, MountPlan
from checkfu.contract.paths import path_problem

DEFAULT_MAX_MOUNT_BYTES = 1 << 30


@dataclass(frozen=True)
class DirectorySource:
    path: Path


@dataclass(frozen=True)
class GitSource:
    repo: Path
    ref: str


MountSource = DirectorySource | GitSource


@dataclass(frozen=True)
class MountSpec:
    source: MountSource
    target: str

    def describe(self) -> str:
        src = self.source
        where = f"{src.repo}@{src.ref}" if isinstance(src, GitSource) else str(src.path)
        return f"{where}:{self.target}"


@dataclass(frozen=True)
class ResolvedMount:
    """A verified plan and the bytes of each of its files, in plan order."""

    plan: MountPlan
    contents: tuple[bytes, ...]

    def files(self) -> Iterator[tuple[MountFile, bytes]]:
        return zip(self.plan.files, self.contents, strict=True)


def parse_mount(spec: str) -> MountSpec:
    """``SRC:TARGET`` where SRC is a directory or ``REPO@REF`` (a Git repository at a ref).

    Raises:
        SandboxProfileInvalid: the spec has no target or no source.
    """
    src, sep, target = spec.rpartition(":")
    if not sep or not src or not target:
        raise SandboxProfileInvalid(
            f"mount {spec!r}: expected SRC:TARGET (SRC a directory or REPO@REF)", field="mounts"
        )
    if "@" in src:
        repo, _, ref = src.rpartition("@")
        if repo and ref:
            return MountSpec(GitSource(Path(repo), ref), target)
    return MountSpec(DirectorySource(Path(src)), target)


def git_blob_id(data: bytes, *, algorithm: str = "sha1") -> str:
    h = hashlib.new(algorithm)
    h.update(b"blob %d\x00" % len(data))
    h.update(data)
    return h.hexdigest()


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Budget:
    def __init__(self, limit: int, where: str) -> None:
        self.left = limit
        self.limit = limit
        self.where = where

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise SandboxBoundExceeded(f"mount {self.where}: more than {self.limit} bytes", field="mounts")


def _read_directory(src: DirectorySource, where: str, budget: _Budget) -> tuple[list[MountFile], list[bytes]]:
    root = src.path
    if not root.is_dir():
        raise SandboxProfileInvalid(f"mount {where}: {root} is not a directory", field="mounts")
    files: list[MountFile] = []
    contents: list[bytes] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in dirnames:  # os.walk lists a symlink to a directory here, never among the files
            if (Path(dirpath) / name).is_symlink():
                rel = (Path(dirpath) / name).relative_to(root).as_posix()
                raise SandboxPathRejected(f"mount {where}: {rel} is a symlink; symlinks are not staged", field="mounts")
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise SandboxPathRejected(f"mount {where}: {rel} is a symlink; symlinks are not staged", field="mounts")
            if not stat.S_ISREG(st.st_mode):
                continue
            _check_rel(rel, where)
            budget.take(st.st_size)
            data = full.read_bytes()
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            files.append(build(MountFile, path=rel, mode=mode, size=len(data), digest=sha256_of(data)))
            contents.append(data)
    return files, contents


def _check_rel(rel: str, where: str) -> None:
    problem = path_problem(rel, relative=True)
    if problem is not None:
        raise SandboxPathRejected(f"mount {where}: {rel!r} {problem}", field="mounts")


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            input=stdin,
            capture_output=True,
            check=False,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_CONFIG_NOSYSTEM": "1",
                "HOME": "/nonexistent",
                "GIT_TERMINAL_PROMPT": "0",
            },
        )
    except FileNotFoundError:
        raise SandboxProfileInvalid("git is not installed on the runner host", field="mounts") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SandboxProfileInvalid(f"git {args[0]} in {repo}: {message[-1] if message else 'failed'}", field="mounts")
    return done.stdout


def _read_git(src: GitSource, where: str, budget: _Budget) -> tuple[list[MountFile], list[bytes]]:
    if not src.repo.exists():
        raise SandboxProfileInvalid(f"mount {where}: {src.repo} does not exist", field="mounts")
    _git(src.repo, "rev-parse", "--git-dir")  # not a repository: git says so, naming it
    try:
        commit = _git(src.repo, "rev-parse", "--verify", "--end-of-options", f"{src.ref}^{{commit}}").decode().strip()
    except SandboxProfileInvalid:
        raise SandboxProfileInvalid(
            f"mount {where}: {src.ref!r} names no commit in {src.repo} (a branch, tag or commit id is expected)",
            field="mounts",
        ) from None
    fmt = _git(src.repo, "rev-parse", "--show-object-format").decode().strip() or "sha1"
    listing = _git(src.repo, "ls-tree", "-r", "-z", "--full-tree", commit)
    entries: list[tuple[int, str, str]] = []
    for record in listing.split(b"\x00"):
        if not record:
            continue
        meta, _, path_b = record.partition(b"\t")
        mode_s, kind, oid = meta.decode().split()
        path = path_b.decode("utf-8", "surrogateescape")
        if kind == "commit":
            raise SandboxPathRejected(
                f"mount {where}: {path} is a submodule; submodules are not staged", field="mounts"
            )
        if mode_s == "120000":
            raise SandboxPathRejected(f"mount {where}: {path} is a symlink; symlinks are not staged", field="mounts")
        _check_rel(path, where)
        entries.append((0o755 if mode_s == "100755" else 0o644, path, oid))
    files: list[MountFile] = []
    contents: list[bytes] = []
    if not entries:
        return files, contents
    batch = _git(src.repo, "cat-file", "--batch", stdin=b"".join(oid.encode() + b"\n" for _, _, oid in entries))
    pos = 0
    for mode, path, oid in entries:
        header_end = batch.find(b"\n", pos)
        header = batch[pos:header_end].decode("utf-8", "replace").split() if header_end >= 0 else []
        if len(header) != 3 or not header[2].isdigit():
            # git answers "<oid> missing" (exit status 0) for an object it cannot read
            raise SandboxProfileInvalid(f"mount {where}: {path}: git cannot read blob {oid}", field="mounts")
        got_oid, kind, size_s = header
        size = int(size_s)
        budget.take(size)
        data = batch[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        actual = git_blob_id(data, algorithm="sha256" if fmt == "sha256" else "sha1")
        if kind != "blob" or got_oid != oid or actual != oid:
            raise SandboxDigestMismatch(f"mount {where}: {path}: blob {oid} reads back as {actual}", field="mounts")
        files.append(build(MountFile, path=path, mode=mode, size=size, digest=f"git:{oid}"))
        contents.append(data)
    return files, contents


def resolve_mount(
    spec: MountSpec, *, expected: MountPlan | None = None, max_bytes: int = DEFAULT_MAX_MOUNT_BYTES
) -> ResolvedMount:
    """Read and verify every file of ``spec``; compare with ``expected`` when a plan was declared.

    Raises:
        SandboxProfileInvalid: the source is missing or unreadable, or the target is not a sandbox path.
        SandboxPathRejected: a file path cannot be staged (symlink, submodule, bad name).
        SandboxDigestMismatch: content does not match its Git blob id or the declared plan.
        SandboxBoundExceeded: the mount is larger than ``max_bytes``.
    """
    where = spec.describe()
    budget = _Budget(max_bytes, where)
    try:
        if isinstance(spec.source, GitSource):
            files, contents = _read_git(spec.source, where, budget)
        else:
            files, contents = _read_directory(spec.source, where, budget)
    except OSError as exc:
        raise SandboxProfileInvalid(f"mount {where}: cannot read: {exc.strerror or exc}", field="mounts") from None
    plan = build(MountPlan, target=spec.target, files=files)
    if expected is not None:
        _compare(plan, expected, where)
    return ResolvedMount(plan=plan, contents=tuple(contents))


def _compare(plan: MountPlan, expected: MountPlan, where: str) -> None:
    got = {f.path: f for f in plan.files}
    for i, want in enumerate(expected.files):
        have = got.get(want.path)
        if have is None:
            raise SandboxDigestMismatch(f"mount {where}: {want.path} is declared but missing", field=f"files.{i}")
        if (have.digest, have.size) != (want.digest, want.size):
            raise SandboxDigestMismatch(
                f"mount {where}: {want.path} is {have.digest} ({have.size} bytes), declared {want.digest} "
                f"({want.size} bytes)",
                field=f"files.{i}.digest",
            )
    extra = set(got) - {f.path for f in expected.files}
    if extra:
        raise SandboxDigestMismatch(f"mount {where}: {sorted(extra)[0]} is not in the declared plan", field="files")
