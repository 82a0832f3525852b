"""``readFiles`` and ``listDir``: reads of a sandbox's file system through the engine's archive API.

Why the archive API and not an exec of ``cat`` inside the sandbox: both stay
inside the sandbox's file system view (the engine resolves paths inside the
container root and never follows the final component; see ``archive.py``),
but the archive API needs no tool in the image, cannot be tampered with by a
sandbox process (an exec runs as the sandbox user and can be traced by it), and
reports exact modes. ``readFiles`` returns regular files only: a path that is
missing, a directory, a symlink or a device is listed in ``missing``; a link is
never followed, so no link can lead a read out of the sandbox. ``listDir`` says
in-band what is at its path (``missing``, ``file``, ``symlink``, ``other``) and
lists entries only of a directory.
"""

from __future__ import annotations

import hashlib
import posixpath
import tarfile
from typing import Any

from checkfu.contract.errors import SandboxBoundExceeded, SandboxProviderFailed
from checkfu.contract.members import DirEntry, EntryKind, FileContent, PathKind
from checkfu.providers.docker.archive import PathStat, open_path


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


TREE_READ_AT = 8
"""From this many paths below one directory on, ``readFiles`` streams that directory's archive once and keeps
the files asked for, instead of one archive request per path (each costs the engine a mount of the container)."""


def read_files(api: Any, container: str, paths: tuple[str, ...], max_bytes: int) -> tuple[list[FileContent], list[str]]:
    """The regular files among ``paths`` with their bytes, and the paths that are not regular files.

    Raises:
        SandboxBoundExceeded: the files together hold more than ``max_bytes``.
    """
    found: dict[str, FileContent] = {}
    budget = max_bytes
    rest = paths
    if len(paths) >= TREE_READ_AT:
        common = posixpath.commonpath(paths)
        if common != "/" and common not in paths:
            budget = _read_tree(api, container, common, set(paths), found, budget, max_bytes)
            rest = tuple(p for p in paths if p not in found)  # a path the tree did not hold is asked for alone
    files, missing, _ = _read_each(api, container, rest, budget, max_bytes)
    found.update((f.path, f) for f in files)
    return [found[p] for p in paths if p in found], missing


def _read_tree(
    api: Any, container: str, root: str, wanted: set[str], found: dict[str, FileContent], budget: int, max_bytes: int
) -> int:
    """Stream the archive of directory ``root`` once, keeping the regular files in ``wanted``; the budget left.

    Links are archived as links, never followed, so a wanted path below a link is not found here.
    """
    opened = open_path(api, container, root)
    if opened is None:
        return budget
    stat, response = opened
    try:
        if not stat.is_dir or stat.is_symlink:
            return budget
        parent = posixpath.dirname(root)
        with tarfile.open(fileobj=response.raw, mode="r|") as archive:
            for member in archive:
                path = posixpath.join(parent, member.name.rstrip("/"))
                if path not in wanted or not member.isreg():
                    continue
                if member.size > budget:
                    raise SandboxBoundExceeded(
                        f"max_bytes: {path!r} holds {member.size} bytes, {budget} of {max_bytes} are left",
                        field="max_bytes",
                    )
                reader = archive.extractfile(member)
                if reader is None:
                    continue
                data = reader.read()
                if len(data) != member.size:
                    raise SandboxProviderFailed(f"readFiles: {path!r} ended after {len(data)} of {member.size} bytes")
                budget -= len(data)
                found[path] = FileContent(path=path, mode=member.mode & 0o7777, digest=_digest(data), data=data)
    finally:
        response.close()
    return budget


def _read_each(
    api: Any, container: str, paths: tuple[str, ...], budget: int, max_bytes: int
) -> tuple[list[FileContent], list[str], int]:
    files: list[FileContent] = []
    missing: list[str] = []
    for path in paths:
        opened = open_path(api, container, path)
        if opened is None:
            missing.append(path)
            continue
        stat, response = opened
        try:
            if not stat.is_regular:
                missing.append(path)
                continue
            if stat.size > budget:
                raise SandboxBoundExceeded(
                    f"max_bytes: {path!r} holds {stat.size} bytes, {budget} of {max_bytes} are left", field="max_bytes"
                )
            content = _one_file(response.raw, path, budget)
            if content is None:
                missing.append(path)
                continue
            budget -= len(content.data)
            files.append(content)
        finally:
            response.close()
    return files, missing, budget


def _one_file(stream: Any, path: str, budget: int) -> FileContent | None:
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        member = archive.next()
        if member is None or not member.isreg():
            return None
        if member.size > budget:
            raise SandboxBoundExceeded(f"max_bytes: {path!r} grew past the bound while it was read", field="max_bytes")
        reader = archive.extractfile(member)
        if reader is None:
            return None
        data = reader.read()
        if len(data) != member.size:
            raise SandboxProviderFailed(f"readFiles: {path!r} ended after {len(data)} of {member.size} bytes")
        return FileContent(path=path, mode=member.mode & 0o7777, digest=_digest(data), data=data)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(member: tarfile.TarInfo) -> EntryKind:
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.isreg() or member.islnk():
        return "file"
    return "other"


def _path_kind(stat: PathStat) -> PathKind:
    if stat.is_symlink:
        return "symlink"
    if stat.is_dir:
        return "dir"
    if stat.is_regular:
        return "file"
    return "other"


def list_dir(
    api: Any, container: str, path: str, *, recursive: bool, max_entries: int
) -> tuple[PathKind, list[DirEntry], bool]:
    """What is at ``path`` itself (a final symlink is not followed) and, for a directory, the entries below it
    (one level, or all with ``recursive``), at most ``max_entries``.

    Returns the kind, the entries and whether the listing was cut short.
    """
    opened = open_path(api, container, path)
    if opened is None:
        return "missing", [], False
    stat, response = opened
    kind = _path_kind(stat)
    entries: list[DirEntry] = []
    truncated = False
    try:
        if kind != "dir":
            return kind, [], False
        base = path.rstrip("/")
        with tarfile.open(fileobj=response.raw, mode="r|") as archive:
            for member in archive:
                _, sep, rel = member.name.rstrip("/").partition("/")
                if not sep or not rel:
                    continue
                if not recursive and "/" in rel:
                    continue
                if len(entries) == max_entries:
                    truncated = True
                    break
                entry_kind = _kind(member)
                if not _utf8(rel):
                    # A name that is not UTF-8 has no exact place in a result: it is listed by a readable
                    # spelling of its bytes as ``other``, so a reader skips it by name and never asks for it.
                    rel, entry_kind = (
                        rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"),
                        "other",
                    )
                entries.append(
                    DirEntry(
                        path=f"{base}/{rel}",
                        kind=entry_kind,
                        size=member.size if entry_kind == "file" else 0,
                        mode=member.mode & 0o7777,
                    )
                )
    finally:
        response.close()
    return kind, entries, truncated
