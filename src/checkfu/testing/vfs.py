"""The memory provider's file system: files by absolute path, and the directories that hold them.

A ``Vfs`` is plain data: no I/O, no clock. It refuses what a POSIX file system
refuses, with the ``OSError`` subclass a real one would raise, so the provider
translates its failures by type at the seam exactly as a real provider does.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Literal

from checkfu.contract.paths import is_within

DIR_MODE = 0o755


@dataclass(frozen=True)
class Node:
    """One file: its bytes and permission bits."""

    data: bytes
    mode: int


@dataclass(frozen=True)
class Entry:
    """One listed path: a file with its size and mode, or a directory."""

    path: str
    kind: Literal["file", "dir"]
    size: int
    mode: int


def resolve(path: str, cwd: str = "/") -> str:
    """``path`` made absolute against ``cwd`` and normalized (``..`` stops at the root)."""
    out = posixpath.normpath(posixpath.join(cwd, path))
    return "/" + out.lstrip("/")


def parent(path: str) -> str:
    return posixpath.dirname(path) or "/"


class Vfs:
    """Files by absolute path; every ancestor of a file is a directory, and so is every ``mkdir``."""

    def __init__(self) -> None:
        self.files: dict[str, Node] = {}
        self.dirs: set[str] = {"/"}

    def copy(self) -> Vfs:
        """An independent copy: writes to either never reach the other."""
        other = Vfs()
        other.files = dict(self.files)  # nodes are frozen, so sharing them is safe
        other.dirs = set(self.dirs)
        return other

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def read(self, path: str) -> Node | None:
        return self.files.get(path)

    def mkdir(self, path: str) -> None:
        """Create ``path`` and its ancestors.

        Raises:
            NotADirectoryError: ``path`` or one of its ancestors is a file.
        """
        chain = []
        while path not in self.dirs:
            if path in self.files:
                raise NotADirectoryError(path)
            chain.append(path)
            path = parent(path)
        self.dirs.update(chain)

    def write(self, path: str, data: bytes, mode: int) -> None:
        """Create or replace the file at ``path``, creating its directories.

        Raises:
            IsADirectoryError: ``path`` is a directory.
            NotADirectoryError: an ancestor of ``path`` is a file.
        """
        if path in self.dirs:
            raise IsADirectoryError(path)
        self.mkdir(parent(path))
        self.files[path] = Node(data, mode)

    def clear(self, root: str) -> None:
        """Remove everything below ``root``, leaving ``root`` an empty directory."""
        self.files = {p: n for p, n in self.files.items() if not is_within(p, root)}
        self.dirs = {d for d in self.dirs if d == root or not is_within(d, root)}
        self.mkdir(root)

    def entries(self, path: str, *, recursive: bool = False) -> list[Entry]:
        """What is below directory ``path`` (its children, or every descendant), sorted by path."""

        def wanted(p: str) -> bool:
            return p != path and is_within(p, path) and (recursive or parent(p) == path)

        out = [Entry(p, "dir", 0, DIR_MODE) for p in self.dirs if wanted(p)]
        out += [Entry(p, "file", len(n.data), n.mode) for p, n in self.files.items() if wanted(p)]
        return sorted(out, key=lambda e: e.path)


FS_ERRORS: dict[type[OSError], str] = {
    IsADirectoryError: "Is a directory",
    NotADirectoryError: "Not a directory",
}
"""How the file system's refusals read, by type (never by message)."""


def fs_reason(exc: OSError) -> str:
    return FS_ERRORS.get(type(exc), "cannot be written")
