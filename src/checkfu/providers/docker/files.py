"""``readFiles`` and ``listDir``: reads of a sandbox's file system through the engine's archive API.

Why the archive API and not an exec of ``cat`` inside the sandbox: both stay
inside the sandbox's file system view (the engine resolves paths inside the
container root and never follows the final component; see ``archive.py``),
but the archive API needs no tool in the image, cannot be tampered with by a
sandbox process (an exec runs as the sandbox user and can be traced by it), and
reports exact modes. ``readFiles`` returns regular files only: a path that is
missing, a directory, a symlink or a device is listed in ``missing``; a link is
never followed, so no link can lead a read out of the sandbox.
"""

from __future__ import annotations

import hashlib
import tarfile
from typing import Any

from checkfu.contract.errors import SandboxBoundExceeded, SandboxNotFound, SandboxPathRejected, SandboxProviderFailed
from checkfu.contract.members import DirEntry, EntryKind, FileContent
from checkfu.providers.docker.archive import open_path


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


def _kind(member: tarfile.TarInfo) -> EntryKind:
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.isreg() or member.islnk():
        return "file"
    return "other"


def list_dir(api: Any, container: str, path: str, *, recursive: bool, max_entries: int) -> tuple[list[DirEntry], bool]:
    """The entries below directory ``path`` (one level, or all with ``recursive``), at most ``max_entries``.

    Returns the entries and whether the listing was cut short.

    Raises:
        SandboxNotFound: ``path`` does not exist.
        SandboxPathRejected: ``path`` is a symlink (never followed) or not a directory.
    """
    opened = open_path(api, container, path)
    if opened is None:
        raise SandboxNotFound(f"path: {path!r} does not exist in the sandbox", field="path")
    stat, response = opened
    entries: list[DirEntry] = []
    truncated = False
    try:
        if stat.is_symlink:
            raise SandboxPathRejected(f"path: {path!r} is a symlink; listDir never follows links", field="path")
        if not stat.is_dir:
            raise SandboxPathRejected(f"path: {path!r} is not a directory", field="path")
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
                kind = _kind(member)
                entries.append(
                    DirEntry(
                        path=f"{base}/{rel}",
                        kind=kind,
                        size=member.size if kind == "file" else 0,
                        mode=member.mode & 0o7777,
                    )
                )
    finally:
        response.close()
    return entries, truncated
