"""Working directories to tarballs and back: the bytes of snapshots and clones.

A tarball holds one working directory as the workload left it: files, directories,
symlinks (never followed), hard links, FIFOs and device nodes, with their modes,
owners and times. Sockets are skipped (they cannot be stored). Extraction runs
tarfile's ``tar`` filter as a guard, refusing any member that would land outside
the destination, and otherwise restores each member exactly as it was stored.

Both functions block on disk I/O: call them from a worker thread.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


def write(workdir: Path, partial: Path, final: Path) -> None:
    """Store ``workdir`` in ``final``, written first to ``partial`` and renamed when complete.

    Raises:
        OSError: a file could not be read or the tarball not written.
        tarfile.TarError: a member could not be stored.
    """
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(workdir, arcname=".", recursive=True)
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    os.replace(partial, final)


def _guarded(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    tarfile.tar_filter(member, dest)  # raises FilterError for a member outside ``dest``
    return member


def extract(tarball: Path, workdir: Path) -> None:
    """Restore the working directory stored in ``tarball`` into ``workdir`` (which must exist).

    Raises:
        OSError: the tarball could not be read or a member not written.
        tarfile.TarError: the tarball is damaged, or a member would land outside ``workdir``.
    """
    with tarfile.open(tarball, "r") as tar:
        tar.extractall(workdir, filter=_guarded)
