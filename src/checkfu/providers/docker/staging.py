"""Staged writes: the bytes ``writeFile`` accepted, on their way into the mount volumes.

``writeFile`` verifies the length and SHA-256 of the bytes; only bytes that match
reach a sandbox. Small files are appended to a per-instance tar spool under the
state directory (named after the instance, so a cold provider finds it). While
writes go on, a background uploader puts sealed segments of the spool into the
stager, one request at a time and in order; ``activate`` seals and uploads the
rest before the sandbox starts. A large file is uploaded on its own, straight
from the caller's buffer, after everything written before it; its SHA-256 is
computed beside the upload and checked before the last slice goes, and its path
is marked on disk until the upload ended well, so a file left partly written
keeps ``activate`` from starting the sandbox. Later writes of a path replace
earlier ones, in order.

Measured on the 2-core bench host (B6, docker 20.10): the engine extracts about
1 MiB of 4 KiB files in 350-450 ms and spends about 60 ms per request of its own
(a mount of the stager and a fresh extraction process); two requests at once into
one stager were slower than one after the other. Hence one uploader per spool,
taking whatever gathered while it was busy (at least ``SEGMENT_BYTES``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import tarfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
DIRECT_BYTES = 4 << 20
"""A file at least this large skips the spool and is uploaded on its own."""
SEGMENT_BYTES = 1 << 20
"""The least a spool segment holds before it is sealed for the background uploader. With fixed segments,
B6's 1000 x 4 KiB (landed, started; p50 of 5, one loaded run) took 4.1 s with 256 KiB segments, 2.5 s with
1 MiB, 1.9 s with 4 MiB and 1.8 s with one request at activate; an uploader that takes what gathered while it
was busy starts early and still makes few requests."""
READ_BYTES = 1 << 20
"""Bytes read from a spool file at a time while it is uploaded."""
SLICE_BYTES = 8 << 20
"""Bytes of a large file handed to the socket at a time."""
PARTIAL = ".partial-"
"""Between a spool's name and a path's hash: the mark of a path whose upload began and has not ended well."""
INLINE_BYTES = 64 << 10
"""A file smaller than this is checked and appended to the spool on the caller's thread (no thread hand-off),
when that needs neither a flush nor a wait for the spool's lock: a local append, never an engine call."""
DIR_MODE = 0o2755
"""A directory's mode in the archive (inside the sandbox), not on this host: set-group-id, as the roots of the
writable areas are, so what any process makes in a writable mount's directory belongs to the sandbox user's group
(``spec.ProcessGroups``)."""


def make_private_dirs(path: Path) -> None:
    """Make directory ``path`` and each parent it lacks, each ``0700``: what the provider's state directory holds
    (a spool of files bound for a sandbox, perhaps copied from a mount source only its user may read; a clone's
    captured areas) is its user's alone. A directory that exists keeps its mode.

    Raises:
        OSError: it cannot be made (a parent is not a directory, or cannot be written).
    """
    try:
        os.mkdir(path, 0o700)
    except FileNotFoundError:
        if path.parent == path:
            raise
        make_private_dirs(path.parent)
        make_private_dirs(path)
    except FileExistsError:
        if not path.is_dir():
            raise


def open_private(path: Path, how: int) -> BinaryIO:
    """``path`` open for writing, unbuffered (``how``: ``os.O_APPEND`` or ``os.O_TRUNC``), made ``0600`` when new,
    never through a symbolic link.

    Raises:
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | how, 0o600)
    return os.fdopen(fd, "ab" if how & os.O_APPEND else "wb", buffering=0)


def _ustar(name: str, *, size: int, mode: int, uid: int, gid: int, kind: bytes, link: str) -> bytes | None:
    """The plain ustar header of an entry whose name and link are ASCII and fit their fields (the common case),
    byte for byte what ``tarfile`` writes for it; ``None`` when it does not fit (``tarfile`` then writes PAX)."""
    if len(name) > 100 or len(link) > 100 or not (name.isascii() and link.isascii()) or size >= 8**11:
        return None
    if max(mode, uid, gid) >= 8**7:
        return None
    head = b"".join(
        (
            name.encode("ascii").ljust(100, b"\0"),
            b"%07o\0%07o\0%07o\0%011o\0%011o\0" % (mode, uid, gid, size, 0),
            b"        ",
            kind,
            link.encode("ascii").ljust(100, b"\0"),
            b"ustar\x0000",
            b"\0" * 247,
        )
    )
    checksum = b"%06o\0 " % sum(head)
    return head[:148] + checksum + head[156:]


def _header(name: str, *, size: int, mode: int, uid: int, gid: int, directory: bool, link: str | None = None) -> bytes:
    kind = tarfile.DIRTYPE if directory else tarfile.SYMTYPE if link is not None else tarfile.REGTYPE
    entry_size = 0 if directory or link is not None else size
    plain = name + "/" if directory else name
    fast = _ustar(plain, size=entry_size, mode=mode, uid=uid, gid=gid, kind=kind, link=link or "")
    if fast is not None:
        return fast
    info = tarfile.TarInfo(name)
    info.size = entry_size
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.type = kind
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


class FileArchive:
    """A complete archive of one file (and its parent directories) as an upload body, straight from ``data``.

    It has a length, so the request states it and each slice of ``data`` goes to the socket as it is, never
    copied. ``before_tail`` is called before the last slice is handed over (the digest check, while the bytes
    were hashed beside the upload); when it raises, the upload stops short, the engine's extraction fails, and
    the error is kept in ``failure``. A symlink is archived as a link: ``data`` is its target.
    """

    def __init__(
        self,
        path: str,
        mount_target: str,
        data: bytes,
        *,
        mode: int,
        uid: int,
        gid: int,
        symlink: bool = False,
        before_tail: Callable[[], None] | None = None,
        slice_bytes: int = SLICE_BYTES,
    ) -> None:
        dirs, name = entry_names(path, mount_target)
        heads = [_header(d, size=0, mode=DIR_MODE, uid=uid, gid=gid, directory=True) for d in dirs]
        if symlink:
            heads.append(_header(name, size=0, mode=0o777, uid=uid, gid=gid, directory=False, link=data.decode()))
            data = b""
        else:
            heads.append(_header(name, size=len(data), mode=mode, uid=uid, gid=gid, directory=False))
        self._head = b"".join(heads)
        self._data = memoryview(data)
        self._tail = _padding(len(data)) + END_OF_ARCHIVE
        self._before_tail = before_tail
        self._slice = slice_bytes
        self.failure: BaseException | None = None

    def __len__(self) -> int:
        return len(self._head) + len(self._data) + len(self._tail)

    def __iter__(self) -> Iterator[bytes | memoryview]:
        yield self._head
        size = len(self._data)
        last = max(0, size - self._slice)
        for start in range(0, last, self._slice):
            yield self._data[start : min(start + self._slice, last)]
        if self._before_tail is not None:
            try:
                self._before_tail()
            except BaseException as exc:
                self.failure = exc
                raise
        if last < size:
            yield self._data[last:]
        yield self._tail


class Spool:
    """The tar spool of one instance: archive entries without the end-of-archive marker, which the upload adds.

    Entries are appended to the open segment (``<instance>~<tag>.tar``). ``seal`` closes it under the next
    sequence number (``<instance>~<tag>.tar.<n>``) and queues it; ``drain`` uploads the sealed segments one
    at a time, in the order they were sealed, so a later write of a path replaces an earlier one as it did
    in one archive. A segment is removed only once its upload succeeded: a crash leaves the files named after
    the instance, where a cold provider finds them (to upload at ``activate``, or to discard on reclaim).
    An upload that failed is kept in ``failure`` and raised again by every later ``drain``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        """Held while entries are appended or the open segment sealed."""
        self._send = threading.Lock()  # one upload at a time, in sealing order
        self._queue = threading.Lock()  # guards _sealed and _scheduled
        self._out: BinaryIO | None = None  # the open segment, unbuffered
        self._size = -1  # bytes in the open segment; -1 until read from the file (a cold spool)
        self._dirs: set[str] = set()  # directories the open segment already holds an entry for
        self._sealed: deque[Path] = deque(sorted(self._found(), key=_sequence))
        self._next = _sequence(self._sealed[-1]) + 1 if self._sealed else 1
        self._scheduled = False
        self.failure: BaseException | None = None
        self.partial: dict[str, Path] = {}
        """The paths whose direct upload began and did not end well, each with its mark on disk."""
        for mark in self._marks():
            with contextlib.suppress(OSError, UnicodeDecodeError):
                self.partial[mark.read_text("utf-8")] = mark

    def _found(self) -> list[Path]:
        if not self.path.parent.exists():
            return []
        return [p for p in self.path.parent.glob(glob.escape(self.path.name) + ".*") if p.suffix[1:].isdigit()]

    def _marks(self) -> list[Path]:
        if not self.path.parent.exists():
            return []
        return list(self.path.parent.glob(glob.escape(self.path.name) + PARTIAL + "*"))

    def mark(self, path: str) -> None:
        """Note on disk, before its upload begins, that ``path`` may be left partly written in the volume (until
        ``unmark``): ``activate`` refuses an instance with such a path, a cold provider too."""
        mark = self.path.with_name(f"{self.path.name}{PARTIAL}{hashlib.sha256(path.encode()).hexdigest()[:32]}")
        make_private_dirs(self.path.parent)
        with open_private(mark, os.O_TRUNC) as out:
            out.write(path.encode("utf-8"))
        self.partial[path] = mark

    def unmark(self, path: str) -> None:
        mark = self.partial.pop(path, None)
        if mark is not None:
            mark.unlink(missing_ok=True)

    def size(self) -> int:
        """Bytes in the open segment."""
        if self._size < 0:
            try:
                self._size = self.path.stat().st_size
            except FileNotFoundError:
                self._size = 0
        return self._size

    def _write(self, *parts: bytes) -> None:
        """Append ``parts`` in one system call (so a finished ``writeFile`` left whole entries in the file)."""
        if self._out is None:
            make_private_dirs(self.path.parent)
            self._out = open_private(self.path, os.O_APPEND)
        fd = self._out.fileno()
        total = sum(len(p) for p in parts)
        written = os.writev(fd, parts)
        if written < total:  # a short write: the rest, from where it stopped
            rest = b"".join(parts)[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]
        self._size = self.size() + total

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
        """Append one file or symlink (and the parent directories the open segment lacks). Call with ``lock`` held.

        A symlink's ``data`` is its target (UTF-8); it is archived as a link, never as the file it names.
        """
        if self._out is not None and os.fstat(self._out.fileno()).st_nlink == 0:
            self._close()  # removed under us (a cold provider reclaimed it): start again, named as before
            self._size, self._dirs = -1, set()
        dirs, name = entry_names(path, mount_target, from_root=from_root)
        new = [d for d in dirs if d not in self._dirs]
        parts = [_header(d, size=0, mode=DIR_MODE, uid=uid, gid=gid, directory=True) for d in new]
        self._dirs.update(dirs)
        if name in self._dirs:  # a file replaces a directory: what was below it is gone, its entries are due again
            self._dirs = {d for d in self._dirs if d != name and not d.startswith(name + "/")}
        if symlink:
            link = data.decode("utf-8")
            parts.append(_header(name, size=0, mode=0o777, uid=uid, gid=gid, directory=False, link=link))
            self._write(*parts)
            return
        parts.append(_header(name, size=len(data), mode=mode, uid=uid, gid=gid, directory=False))
        self._write(*parts, data, _padding(len(data)))

    def close(self) -> None:
        """Close the open segment's file (it stays); the next append opens it again."""
        self._close()

    def _close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def uploading(self) -> bool:
        """Whether an upload of this spool is scheduled or under way (a sealed segment waits for it)."""
        with self._queue:
            return self._scheduled

    def seal(self) -> bool:
        """Close the open segment and queue it for upload; whether there was anything in it. Call with ``lock``
        held. Returns true when a drain should be scheduled (none is yet)."""
        self._close()
        if self.size() == 0:
            return False
        with self._queue:
            sealed = self.path.with_name(f"{self.path.name}.{self._next}")
            self._next += 1
            self.path.rename(sealed)
            self._sealed.append(sealed)
            self._size, self._dirs = 0, set()
            schedule = not self._scheduled
            self._scheduled = True
        return schedule

    def drain(self, upload: Callable[[Path], None]) -> None:
        """Upload every sealed segment, oldest first, each removed once its upload succeeded.

        Raises:
            BaseException: the upload's failure (kept in ``failure``; raised again by every later drain).
        """
        with self._send:
            while True:
                with self._queue:
                    if self.failure is not None:
                        self._scheduled = False
                        raise self.failure
                    if not self._sealed:
                        self._scheduled = False
                        return
                    segment = self._sealed[0]
                try:
                    upload(segment)
                except BaseException as exc:
                    with self._queue:
                        self.failure = exc
                        self._scheduled = False
                    raise
                segment.unlink(missing_ok=True)
                with self._queue:
                    self._sealed.popleft()

    def discard(self) -> bool:
        """Remove the open segment and every sealed one; whether there was any."""
        self._close()
        with self._queue:
            found = [p for p in (self.path, *self._sealed, *self._found(), *self._marks()) if p.exists()]
            self.partial.clear()
            for p in found:
                p.unlink(missing_ok=True)
            self._sealed.clear()
            self._size, self._dirs = 0, set()
        return bool(found)


def _sequence(path: Path) -> int:
    return int(path.suffix[1:])


class SpooledArchive:
    """A spool file as an upload body: its entries, then the end-of-archive marker. It has a length, so the
    request states it (no chunked encoding) and each block goes to the socket as read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._size = path.stat().st_size

    def __len__(self) -> int:
        return self._size + len(END_OF_ARCHIVE)

    def __iter__(self) -> Iterator[bytes]:
        with self.path.open("rb") as f:
            left = self._size
            while left > 0:
                block = f.read(min(READ_BYTES, left))
                if not block:
                    raise OSError(f"{self.path.name} ended {left} bytes early")
                left -= len(block)
                yield block
        yield END_OF_ARCHIVE


class Spools:
    """Every spool of one provider in ``root``, named ``<instance>~<runner tag>.tar``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._spools: dict[str, Spool] = {}  # by file name

    def get(self, instance: str, runner_tag: str) -> Spool:
        name = f"{instance}~{runner_tag}.tar"
        with self._lock:
            spool = self._spools.get(name)
            if spool is None:
                spool = Spool(self.root / name)
                self._spools[name] = spool
            return spool

    def close(self) -> None:
        """Close every spool's open file (the files stay, for a provider built later to find)."""
        with self._lock:
            spools = list(self._spools.values())
        for spool in spools:
            with spool.lock:
                spool.close()

    def discard(self, instance: str, runner_tag: str | None) -> int:
        """Remove the spools of ``instance`` (of ``runner_tag`` only, when given); how many files were there."""
        pattern = f"{instance}~{runner_tag}.tar" if runner_tag is not None else f"{instance}~*.tar"
        removed = 0
        paths: set[Path] = set()
        if self.root.exists():
            paths |= set(self.root.glob(pattern))
            paths |= {p.with_suffix("") for p in self.root.glob(pattern + ".*")}  # sealed segments, marks
        if runner_tag is not None:
            paths.add(self.root / pattern)
        for path in paths:
            spool = self.get(*path.name.removesuffix(".tar").split("~", 1))
            with spool.lock:
                if spool.discard():
                    removed += 1
            with self._lock:
                self._spools.pop(path.name, None)
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
