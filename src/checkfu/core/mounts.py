"""Mount resolution: the runner reads every mount byte itself and verifies its digest.

A mount source is a local directory or a Git repository at a ref. Resolution
happens at each Run start, before anything is provisioned: every file is listed,
the whole mount is held to its bound from the listed sizes before a byte is
read, and then each file is hashed while it streams (``sha256:`` for a
directory, the Git blob id for Git content, recomputed from the bytes). No file
is kept in memory: staging reads each one again, one at a time, and verifies it
against the plan, so a file that changed in between is ``SandboxDigestMismatch``
and never reaches the sandbox. When a plan was declared in advance it is
compared too. The provider never fetches content and holds no credential.

What a directory mount holds: inside a Git work tree, what Git does not ignore
(tracked files and untracked ones not ignored, as ``git ls-files --cached
--others --exclude-standard`` lists them); anywhere else, or with ``stage_all``,
every regular file and symlink. A symlink is staged as a symlink, never
followed, when it resolves inside the mount (through the mount's other links
too); one that leads outside is refused by name. Executable files keep their
executable bit (``0755``; everything else ``0644``). A directory or file that
cannot be read (another user's, mode ``000``) is refused by name, never left
out: a mount holds all it says it holds or nothing (inside a Git work tree,
what Git ignores is not looked at, readable or not).

A directory source may also leave files out by name: a ``.checkfuignore`` file at its root and the
``--exclude GLOB`` patterns of its spec, both read with gitignore semantics (``pathspec``), apply inside a Git
work tree or outside one, with ``stage_all`` too. A directory they exclude is not walked (nor checked for
readability); ``.checkfuignore`` itself is staged unless it excludes itself. Nothing else is left out silently:
``top_level_sizes`` says how much each top-level entry staged, so a summary can show a ``.venv`` that was staged.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import stat
import subprocess
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pathspec

from checkfu.contract.codec import build
from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxDigestMismatch,
    SandboxPathRejected,
    SandboxProfileInvalid,
)
from checkfu.contract.mounts import MAX_FILES_PER_MOUNT, MountFile, MountPlan, link_problem
from checkfu.contract.paths import path_problem

DEFAULT_MAX_MOUNT_BYTES = 1 << 30
CHUNK = 1 << 20
"""Bytes hashed at a time: the most of one file resolution holds in memory."""
MAX_LINK_HOPS = 40
"""Symlinks followed (inside the mount's own listing) while deciding where a link leads, as the kernel does."""

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DirectorySource:
    path: Path


@dataclass(frozen=True)
class GitSource:
    repo: Path
    ref: str


MountSource = DirectorySource | GitSource

MODES = ("ro", "rw", "rw,sync")


@dataclass(frozen=True)
class MountSpec:
    source: MountSource
    target: str
    writable: bool = False
    """``:rw``: copied in, owned by the sandbox user and writable; otherwise sealed read-only."""
    stage_all: bool = False
    """Stage what Git ignores too (a directory inside a Git work tree)."""
    excludes: tuple[str, ...] = ()
    """gitignore patterns (``--exclude GLOB``) left out of a directory source, with its ``.checkfuignore``."""

    sync: bool = False
    """``:rw,sync``: the target's files are copied back into a directory SRC when the Run ends
    (``checkfu.core.syncback``)."""

    def describe(self) -> str:
        src = self.source
        where = f"{src.repo}@{src.ref}" if isinstance(src, GitSource) else str(src.path)
        return f"{where}:{self.target}" + (":rw,sync" if self.sync else ":rw" if self.writable else "")


def parse_mount(spec: str, *, stage_all: bool = False, excludes: tuple[str, ...] = ()) -> MountSpec:
    """``SRC:TARGET[:ro|:rw|:rw,sync]`` where SRC is a directory or ``REPO@REF`` (a Git repository at a ref).

    Raises:
        SandboxProfileInvalid: the spec has no target or no source, or ``sync`` names a Git source.
    """
    body, writable, sync = spec, False, False
    head, sep, mode = spec.rpartition(":")
    if sep and mode in MODES and ":" in head:
        body, writable, sync = head, mode.startswith("rw"), mode == "rw,sync"
    src, sep, target = body.rpartition(":")
    if not sep or not src or not target:
        raise SandboxProfileInvalid(
            f"mount {spec!r}: expected SRC:TARGET or SRC:TARGET:rw (SRC a directory or REPO@REF)", field="mounts"
        )
    if "@" in src:
        repo, _, ref = src.rpartition("@")
        if repo and ref:
            if sync:
                raise SandboxProfileInvalid(
                    f"mount {spec!r}: rw,sync copies back into a directory; {src} is a Git ref", field="mounts"
                )
            return MountSpec(GitSource(Path(repo), ref), target, writable, stage_all, excludes)
    return MountSpec(DirectorySource(Path(src)), target, writable, stage_all, excludes, sync)


IGNORE_FILE = ".checkfuignore"


def exclusion(root: Path, excludes: tuple[str, ...], where: str) -> pathspec.GitIgnoreSpec | None:
    """The gitignore-style patterns that leave files of directory source ``root`` out: its ``.checkfuignore``
    (when there is one) and ``excludes``; ``None`` when there are none.

    Raises:
        SandboxProfileInvalid: ``.checkfuignore`` cannot be read, or a pattern is not a gitignore pattern.
    """
    lines = list(excludes)
    ignore = root / IGNORE_FILE
    if ignore.is_file():
        try:
            lines = ignore.read_text(encoding="utf-8", errors="surrogateescape").splitlines() + lines
        except OSError as exc:
            raise SandboxProfileInvalid(
                f"mount {where}: cannot read {IGNORE_FILE}: {exc.strerror or exc}", field="mounts"
            ) from None
    if not any(line.strip() and not line.lstrip().startswith("#") for line in lines):
        return None
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, TypeError) as exc:
        raise SandboxProfileInvalid(f"mount {where}: exclude pattern: {exc}", field="mounts") from None


def top_level_sizes(plan: MountPlan) -> dict[str, int]:
    """Bytes staged under each top-level entry of a mount (a directory as ``name/``), largest first."""
    sizes: dict[str, int] = {}
    for f in plan.files:
        head, sep, _ = f.path.partition("/")
        key = head + "/" if sep else head
        sizes[key] = sizes.get(key, 0) + f.size
    return dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])))


def git_blob_id(data: bytes, *, algorithm: str = "sha1") -> str:
    h = hashlib.new(algorithm)
    h.update(b"blob %d\x00" % len(data))
    h.update(data)
    return h.hexdigest()


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# where a symlink leads -------------------------------------------------------------------------


def link_escape(path: str, links: dict[str, str]) -> str | None:
    """Why the symlink at mount path ``path`` leads outside the mount, or ``None`` when it stays inside.

    ``links`` maps every symlink of the mount to its target. The link is resolved as the kernel
    would, following the mount's own links on the way (at most ``MAX_LINK_HOPS``), without
    touching any file system: a target that is absolute, climbs above the mount root, or goes
    through a link that does, leads outside.
    """
    lexical = link_problem(path, links[path])
    if lexical is not None:
        return lexical
    hops = 0
    parts: list[str] = []  # the resolved directories, from the mount root
    pending = [p for p in posixpath.dirname(path).split("/") if p] + links[path].split("/")
    pending.reverse()
    while pending:
        segment = pending.pop()
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                return f"points outside the mount ({links[path][:200]!r})"
            parts.pop()
            continue
        here = "/".join([*parts, segment])
        target = links.get(here)
        if target is None:
            parts.append(segment)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return f"goes through more than {MAX_LINK_HOPS} links ({links[path][:200]!r})"
        if target.startswith("/"):
            return f"points outside the mount through {here!r} ({target[:200]!r})"
        pending.extend(reversed(target.split("/")))
    return None


# plans and how their bytes are read again ------------------------------------------------------


@dataclass(frozen=True)
class ResolvedMount:
    """A verified plan, and how to read its bytes again for staging (one file at a time)."""

    plan: MountPlan
    source: MountSource
    git_format: str = "sha1"
    blobs: tuple[str, ...] = field(default=())
    """For a Git mount, each file's blob id, in plan order."""
    sync: bool = False
    """``:rw,sync``: copied back into the source directory when the Run ends."""
    excludes: tuple[str, ...] = ()
    """The spec's ``--exclude`` patterns: what they (and ``.checkfuignore``) leave out is never copied back."""

    @property
    def writable(self) -> bool:
        return self.plan.writable

    def files(self) -> Generator[tuple[MountFile, bytes], None, None]:
        """Each file of the plan with its bytes (a symlink's: its target), read again and verified.

        Raises:
            SandboxDigestMismatch: a file changed since it was resolved.
            SandboxProfileInvalid: a file can no longer be read.
        """
        if isinstance(self.source, GitSource):
            yield from self._git_files(self.source)
        else:
            yield from self._directory_files(self.source)

    def _directory_files(self, src: DirectorySource) -> Iterator[tuple[MountFile, bytes]]:
        for f in self.plan.files:
            full = src.path / f.path
            try:
                data = os.readlink(full).encode("utf-8", "surrogateescape") if f.symlink else _read_nofollow(full)
            except OSError as exc:
                raise SandboxProfileInvalid(
                    f"mount {self.plan.target}: {f.path}: cannot read it again to stage it: {exc.strerror or exc}",
                    field="mounts",
                ) from None
            if len(data) != f.size or sha256_of(data) != f.digest:
                raise SandboxDigestMismatch(
                    f"mount {self.plan.target}: {f.path} changed after it was hashed ({f.size} bytes, {f.digest})",
                    field="mounts",
                )
            yield f, data

    def _git_files(self, src: GitSource) -> Iterator[tuple[MountFile, bytes]]:
        if not self.plan.files:
            return
        with _CatFile(src.repo) as cat:
            for f, oid in zip(self.plan.files, self.blobs, strict=True):
                size = cat.ask(oid, f.path, self.plan.target)
                data = cat.read_all(size)
                if git_blob_id(data, algorithm=self.git_format) != oid or size != f.size:
                    raise SandboxDigestMismatch(
                        f"mount {self.plan.target}: {f.path}: blob {oid} reads back otherwise", field="mounts"
                    )
                yield f, data


def _read_nofollow(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return f.read()


class _Budget:
    def __init__(self, limit: int, where: str) -> None:
        self.left = limit
        self.limit = limit
        self.where = where

    def take(self, n: int, what: str = "") -> None:
        self.left -= n
        if self.left < 0:
            named = f" ({what} alone holds {n} bytes)" if what and n > self.limit else ""
            raise SandboxBoundExceeded(
                f"mount {self.where}: more than {_human(self.limit)} ({self.limit} bytes){named}; nothing was read",
                field="mounts",
            )


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


NAME_MAX = 255
"""The longest name (one path component) a Linux file system holds, in bytes."""


def _check_rel(rel: str, where: str) -> None:
    problem = path_problem(rel, relative=True)
    if problem is None:
        long = next((part for part in rel.split("/") if len(part.encode("utf-8")) > NAME_MAX), None)
        if long is not None:
            problem = f"has a name of {len(long.encode())} bytes; no file system holds more than {NAME_MAX}"
    if problem is not None:
        raise SandboxPathRejected(f"mount {where}: {rel[:300]!r} {problem}", field="mounts")


class _Hashing:
    """Progress over the bytes hashed, across one mount."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self.progress = progress

    def add(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


# directories -----------------------------------------------------------------------------------


def _git_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": "/nonexistent",
        "GIT_TERMINAL_PROMPT": "0",
    }


def _ignoring_git(root: Path) -> list[str] | None:
    """The paths below ``root`` that Git does not ignore, when ``root`` is inside a Git work tree; else ``None``."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            check=False,
            env=_git_env(),
        )
    except FileNotFoundError:
        return None  # no git on the runner host: nothing can be read as ignored
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        return None
    listing = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
    return [p.decode("utf-8", "surrogateescape") for p in listing.split(b"\x00") if p]


def _unreadable(rel: str, where: str, exc: OSError) -> SandboxPathRejected:
    """The refusal of a path below a mount's source that cannot be read: never left out of the mount unsaid."""
    return SandboxPathRejected(
        f"mount {where}: {rel[:300]} cannot be read ({exc.strerror or exc}); it is refused rather than left out "
        "(make it readable, or move it out of the mount)",
        field="mounts",
    )


def _refuser(root: Path, where: str) -> Callable[[OSError], None]:
    """An ``onerror`` for ``os.walk`` below ``root`` that refuses the directory it could not list, by name
    (``os.walk`` without one skips it, and all below it, in silence); ``root`` itself is the source, which the
    profile named."""

    def refuse(exc: OSError) -> None:
        failed = Path(exc.filename) if exc.filename is not None else root
        if failed == root:
            raise SandboxProfileInvalid(f"mount {where}: cannot read: {exc.strerror or exc}", field="mounts")
        raise _unreadable(failed.relative_to(root).as_posix(), where, exc)

    return refuse


def _walk(root: Path, where: str, skip: pathspec.GitIgnoreSpec | None = None) -> list[str]:
    """Every file and symlink below ``root``, as paths relative to it; a directory ``skip`` matches is not entered.

    Raises:
        SandboxPathRejected: a directory below it cannot be listed.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_refuser(root, where), followlinks=False):
        dirnames.sort()
        here = Path(dirpath)
        if skip is not None:
            dirnames[:] = [
                d
                for d in dirnames
                if (here / d).is_symlink() or not skip.match_file((here / d).relative_to(root).as_posix() + "/")
            ]
        for name in dirnames:  # a symlink to a directory is listed here; os.walk does not enter it
            if (here / name).is_symlink():
                found.append((here / name).relative_to(root).as_posix())
        found.extend((here / name).relative_to(root).as_posix() for name in sorted(filenames))
    return found


def _refuse_unreadable_directories(
    root: Path, where: str, listed: list[str], skip: pathspec.GitIgnoreSpec | None = None
) -> None:
    """Refuse a directory below ``root`` (a Git work tree) that Git would have looked in and could not.

    ``git ls-files`` warns of a directory it cannot open and lists the rest as if it were empty, so its
    listing cannot tell. The directories are walked here, leaving out what Git does not look in: ``.git``,
    what it ignores (``--ignored --directory`` names a wholly ignored directory once), and each directory it
    listed as one entry (a nested repository, a submodule).

    Raises:
        SandboxPathRejected: such a directory cannot be listed.
    """
    ignored = _git(root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory", "--", ".")
    whole = {p.decode("utf-8", "surrogateescape").rstrip("/") for p in ignored.split(b"\x00") if p.endswith(b"/")}
    whole.update(p.rstrip("/") for p in listed)  # only a directory among them matters here
    for dirpath, dirnames, _ in os.walk(root, onerror=_refuser(root, where), followlinks=False):
        here = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = [
            d
            for d in dirnames
            if d != ".git"
            and (d if here == "." else f"{here}/{d}") not in whole
            and (skip is None or not skip.match_file((d if here == "." else f"{here}/{d}") + "/"))
        ]


def _read_directory(
    src: DirectorySource,
    where: str,
    budget: _Budget,
    stage_all: bool,
    progress: Progress | None,
    excludes: tuple[str, ...] = (),
) -> list[MountFile]:
    root = src.path
    if not root.is_dir():
        raise SandboxProfileInvalid(f"mount {where}: {root} is not a directory", field="mounts")
    skip = exclusion(root, excludes, where)
    listed = None if stage_all else _ignoring_git(root)
    if listed is None:
        paths = _walk(root, where, skip)
    else:
        _refuse_unreadable_directories(root, where, listed, skip)
        paths = sorted(set(listed))
    if skip is not None:
        paths = [p for p in paths if not skip.match_file(p)]
    if len(paths) > MAX_FILES_PER_MOUNT:
        raise SandboxBoundExceeded(
            f"mount {where}: {len(paths)} files, more than {MAX_FILES_PER_MOUNT} in one mount", field="mounts"
        )
    regular: list[tuple[str, int, int]] = []
    links: dict[str, str] = {}
    for rel in paths:
        full = root / rel
        try:
            st = full.lstat()
            link = os.readlink(full) if stat.S_ISLNK(st.st_mode) else None
        except FileNotFoundError:
            continue  # tracked by Git but deleted from the work tree: not there to stage
        except OSError as exc:
            raise _unreadable(rel, where, exc) from None
        if link is not None:
            _check_rel(rel, where)
            links[rel] = link
        elif stat.S_ISREG(st.st_mode):
            _check_rel(rel, where)
            budget.take(st.st_size, rel)
            regular.append((rel, st.st_size, 0o755 if st.st_mode & 0o111 else 0o644))
        # anything else (a directory Git lists as a submodule, a FIFO, a socket, a device) holds no file to stage
    for rel in sorted(links):
        why = link_escape(rel, links)
        if why is not None:
            raise SandboxPathRejected(
                f"mount {where}: {rel} is a symlink that {why}; it is not staged, and never followed",
                field="mounts",
            )
    hashing = _Hashing(sum(size for _, size, _ in regular), progress)
    files: list[MountFile] = []
    for rel, _, mode in regular:
        try:
            digest, size = _hash_file(root / rel, hashing)
        except OSError as exc:
            raise _unreadable(rel, where, exc) from None
        files.append(build(MountFile, path=rel, mode=mode, size=size, digest=digest))
    for rel, target in links.items():
        data = target.encode("utf-8", "surrogateescape")
        files.append(build(MountFile, path=rel, mode=0o777, size=len(data), digest=sha256_of(data), symlink=True))
    files.sort(key=lambda f: f.path)
    return files


def _hash_file(path: Path, hashing: _Hashing) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
            hashing.add(len(chunk))
    return "sha256:" + h.hexdigest(), size


# Git ---------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=False, env=_git_env()
        )
    except FileNotFoundError:
        raise SandboxProfileInvalid("git is not installed on the runner host", field="mounts") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SandboxProfileInvalid(f"git {args[0]} in {repo}: {message[-1] if message else 'failed'}", field="mounts")
    return done.stdout


class _CatFile:
    """One ``git cat-file --batch`` process, asked one blob at a time, whose bytes are read as they stream."""

    def __init__(self, repo: Path) -> None:
        try:
            self.proc = subprocess.Popen(
                ["git", "-C", str(repo), "cat-file", "--batch"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_git_env(),
            )
        except FileNotFoundError:
            raise SandboxProfileInvalid("git is not installed on the runner host", field="mounts") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout

    def __enter__(self) -> _CatFile:
        return self

    def __exit__(self, *exc: object) -> None:
        for pipe in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def ask(self, oid: str, path: str, where: str) -> int:
        """Ask for blob ``oid``; its size, from git's header, before any byte of it is read.

        Raises:
            SandboxProfileInvalid: git cannot read it.
        """
        self.stdin.write(oid.encode() + b"\n")
        self.stdin.flush()
        header = self.stdout.readline(4096).decode("utf-8", "replace").split()
        if len(header) != 3 or not header[2].isdigit() or header[0] != oid or header[1] != "blob":
            # git answers "<oid> missing" (exit status 0) for an object it cannot read
            raise SandboxProfileInvalid(f"mount {where}: {path}: git cannot read blob {oid}", field="mounts")
        return int(header[2])

    def stream(self, size: int) -> Iterator[bytes]:
        """The ``size`` bytes of the blob asked for, in chunks, then its terminating newline is consumed."""
        left = size
        while left:
            chunk = self.stdout.read(min(CHUNK, left))
            if not chunk:
                raise SandboxProfileInvalid("git cat-file ended in the middle of a blob", field="mounts")
            left -= len(chunk)
            yield chunk
        self.stdout.read(1)

    def read_all(self, size: int) -> bytes:
        return b"".join(self.stream(size))


def _read_git(
    src: GitSource, where: str, budget: _Budget, progress: Progress | None
) -> tuple[list[MountFile], list[str], str]:
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
    listing = _git(src.repo, "ls-tree", "-r", "-z", "-l", "--full-tree", commit)  # -l: each blob's size
    entries: list[tuple[int, str, str, int, bool]] = []
    for record in listing.split(b"\x00"):
        if not record:
            continue
        meta, _, path_b = record.partition(b"\t")
        mode_s, kind, oid, size_s = meta.decode().split()
        path = path_b.decode("utf-8", "surrogateescape")
        if kind == "commit":
            raise SandboxPathRejected(
                f"mount {where}: {path} is a submodule; submodules are not staged", field="mounts"
            )
        _check_rel(path, where)
        size = int(size_s) if size_s.isdigit() else 0
        link = mode_s == "120000"
        if not link:
            budget.take(size, path)  # from the object's size, before any byte of it is read
        entries.append((0o755 if mode_s == "100755" else 0o777 if link else 0o644, path, oid, size, link))
    if len(entries) > MAX_FILES_PER_MOUNT:
        raise SandboxBoundExceeded(
            f"mount {where}: {len(entries)} files, more than {MAX_FILES_PER_MOUNT} in one mount", field="mounts"
        )
    files: list[MountFile] = []
    oids: list[str] = []
    if not entries:
        return files, oids, fmt
    hashing = _Hashing(sum(e[3] for e in entries), progress)
    links: dict[str, str] = {}
    algorithm = "sha256" if fmt == "sha256" else "sha1"
    with _CatFile(src.repo) as cat:
        for mode, path, oid, listed, link in entries:
            size = cat.ask(oid, path, where)
            if size != listed:
                raise SandboxDigestMismatch(f"mount {where}: {path}: blob {oid} is {size} bytes, listed {listed}")
            h = hashlib.new(algorithm)
            h.update(b"blob %d\x00" % size)
            kept = bytearray() if link else None
            for chunk in cat.stream(size):
                h.update(chunk)
                hashing.add(len(chunk))
                if kept is not None:
                    kept += chunk[: 8192 - len(kept)]
            actual = h.hexdigest()
            if actual != oid:
                raise SandboxDigestMismatch(f"mount {where}: {path}: blob {oid} reads back as {actual}", field="mounts")
            if kept is not None:
                links[path] = bytes(kept).decode("utf-8", "surrogateescape")
            files.append(build(MountFile, path=path, mode=mode, size=size, digest=f"git:{oid}", symlink=link))
            oids.append(oid)
    for path in sorted(links):
        why = link_escape(path, links)
        if why is not None:
            raise SandboxPathRejected(
                f"mount {where}: {path} is a symlink that {why}; it is not staged, and never followed",
                field="mounts",
            )
    return files, oids, fmt


def resolve_mount(
    spec: MountSpec,
    *,
    expected: MountPlan | None = None,
    max_bytes: int = DEFAULT_MAX_MOUNT_BYTES,
    progress: Progress | None = None,
) -> ResolvedMount:
    """List, bound and hash every file of ``spec`` (streaming; no file is kept); compare with ``expected``.

    ``progress(done, total)`` follows the bytes hashed.

    Raises:
        SandboxProfileInvalid: the source is missing or unreadable, or the target is not a sandbox path.
        SandboxPathRejected: a file path cannot be staged (a symlink leading outside, a submodule, a bad name, a
            directory or file below a directory source that cannot be read).
        SandboxDigestMismatch: content does not match its Git blob id or the declared plan.
        SandboxBoundExceeded: the mount is larger than ``max_bytes`` (known from the sizes, before reading).
    """
    where = spec.describe()
    budget = _Budget(max_bytes, where)
    blobs: list[str] = []
    fmt = "sha1"
    try:
        if isinstance(spec.source, GitSource):
            files, blobs, fmt = _read_git(spec.source, where, budget, progress)
        else:
            files = _read_directory(spec.source, where, budget, spec.stage_all, progress, spec.excludes)
    except OSError as exc:
        raise SandboxProfileInvalid(f"mount {where}: cannot read: {exc.strerror or exc}", field="mounts") from None
    plan = build(MountPlan, target=spec.target, files=files, **({"writable": True} if spec.writable else {}))
    if expected is not None:
        _compare(plan, expected, where)
    return ResolvedMount(
        plan=plan, source=spec.source, git_format=fmt, blobs=tuple(blobs), sync=spec.sync, excludes=spec.excludes
    )


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
