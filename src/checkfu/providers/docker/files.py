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
import tarfile
from typing import Any

from checkfu.contract.errors import SandboxBoundExceeded, SandboxProviderFailed
from checkfu.contract.members import DirEntry, EntryKind, FileContent, PathKind
from checkfu.providers.docker.archive import PathStat, open_path


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_files(api: Any, container: str, paths: tuple[str, ...], max_bytes: int) -> tuple[list[FileContent], list[str]]:
    """The regular files among ``paths`` with their bytes, and the paths that are not regular files.

    Raises:
        SandboxBoundExceeded: the files together hold more than ``max_bytes``.
    """
    files: list[FileContent] = []
    missing: list[str] = []
    budget = max_bytes
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
    return files, missing


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
