"""Staged writes: the bytes ``writeFile`` accepted, on their way into the mount volumes.

``writeFile`` verifies the length and SHA-256 of the bytes first; only verified
bytes are staged. Small files are appended to a per-instance tar spool under the
state directory (named after the instance, so a cold provider finds it), and the
spool goes into the stager in one archive upload when it grows large, when a
large file arrives, or at ``activate``. A large file is uploaded on its own,
straight from memory. Later writes of a path replace earlier ones, in order.
"""

from __future__ import annotations

import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
DIRECT_BYTES = 4 << 20
"""A file at least this large skips the spool and is uploaded on its own."""
SPOOL_LIMIT = 32 << 20
"""A spool this large is flushed before it grows further."""
INLINE_BYTES = 64 << 10
"""A file smaller than this is checked and appended to the spool on the caller's thread (no thread hand-off),
when that needs neither a flush nor a wait for the spool's lock: a local append, never an engine call."""
DIR_MODE = 0o755


def _header(name: str, *, size: int, mode: int, uid: int, gid: int, directory: bool, link: str | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 0 if directory or link is not None else size
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.type = tarfile.DIRTYPE if directory else tarfile.SYMTYPE if link is not None else tarfile.REGTYPE
    if link is not None:
        info.linkname = link
    info.mtime = 0
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def entry_names(path: str, mount_target: str, *, from_root: bool = True) -> tuple[list[str], str]:
    """Archive names of the directories from ``mount_target`` down to ``path``, and of ``path``: relative to
    ``/``, or with ``from_root`` false to ``mount_target`` itself (an archive extracted at the target)."""
    rel = path[len(mount_target) + 1 :]
    parts = rel.split("/")
    if not from_root:
        return ["/".join(parts[:i]) for i in range(1, len(parts))], rel
    base = mount_target.lstrip("/")
    dirs = [f"{base}/{'/'.join(parts[:i])}" for i in range(1, len(parts))]
    return dirs, f"{base}/{rel}"


def file_archive(
    path: str, mount_target: str, data: bytes, *, mode: int, uid: int, gid: int, chunk: int = 1 << 20
) -> Iterator[bytes]:
    """A complete archive of one file and its parent directories, streamed from ``data`` without a copy of it."""
    dirs, name = entry_names(path, mount_target)
    for d in dirs:
        yield _header(d, size=0, mode=DIR_MODE, uid=uid, gid=gid, directory=True)
    yield _header(name, size=len(data), mode=mode, uid=uid, gid=gid, directory=False)
    view = memoryview(data)
    for start in range(0, len(data), chunk):
        yield bytes(view[start : start + chunk])
    yield _padding(len(data))
    yield END_OF_ARCHIVE


class Spool:
    """The tar spool of one instance: archive entries without the end-of-archive marker, which the upload adds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def append(
        self,
        path: str,
        mount_target: str,
        data: bytes,
        *,
        mode: int,
        uid: int,
        gid: int,
        symlink: bool = False,
        from_root: bool = True,
    ) -> None:
        """Append one file or symlink (and its parent directories) to the spool. Call with ``lock`` held.

        A symlink's ``data`` is its target (UTF-8); it is archived as a link, never as the file it names.
        """
        dirs, name = entry_names(path, mount_target, from_root=from_root)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as out:
            for d in dirs:
                out.write(_header(d, size=0, mode=DIR_MODE, uid=uid, gid=gid, directory=True))
            if symlink:
                link = data.decode("utf-8")
                out.write(_header(name, size=0, mode=0o777, uid=uid, gid=gid, directory=False, link=link))
                return
            out.write(_header(name, size=len(data), mode=mode, uid=uid, gid=gid, directory=False))
            out.write(data)
            out.write(_padding(len(data)))

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class Spools:
    """Every spool of one provider in ``root``, named ``<instance>~<runner tag>.tar``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._spools: dict[Path, Spool] = {}

    def get(self, instance: str, runner_tag: str) -> Spool:
        path = self.root / f"{instance}~{runner_tag}.tar"
        with self._lock:
            spool = self._spools.get(path)
            if spool is None:
                spool = Spool(path)
                self._spools[path] = spool
            return spool

    def discard(self, instance: str, runner_tag: str | None) -> int:
        """Remove the spools of ``instance`` (of ``runner_tag`` only, when given); how many files were there."""
        pattern = f"{instance}~{runner_tag}.tar" if runner_tag is not None else f"{instance}~*.tar"
        removed = 0
        paths = {p for p in self.root.glob(pattern)} if self.root.exists() else set()
        if runner_tag is not None:
            paths.add(self.root / pattern)
        for path in paths:
            spool = self.get(*path.name.removesuffix(".tar").split("~", 1))
            with spool.lock:
                if spool.path.exists():
                    removed += 1
                spool.discard()
            with self._lock:
                self._spools.pop(path, None)
        return removed


def writable_spool_name(instance: str, index: int) -> str:
    """The spool of an instance's writable mount ``index``: filled by ``writeFile``, extracted after start."""
    return f"{instance}-rw{index}"


def discard_writable(spools: Spools, instance: str, runner_tag: str | None) -> int:
    """Remove every writable-mount spool of ``instance`` (of ``runner_tag`` only, when given)."""
    if not spools.root.exists():
        return 0
    names = {p.name.split("~", 1)[0] for p in spools.root.glob(f"{instance}-rw*~{runner_tag or '*'}.tar")}
    return sum(spools.discard(name, runner_tag) for name in sorted(names))
