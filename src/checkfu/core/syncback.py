"""``--mount SRC:TARGET:rw,sync``: a writable mount's changes copied back into ``SRC`` when the Run ends.

After the command exits and before the sandbox is released, the runner lists ``TARGET`` in the sandbox
(``listDir``) and reads its files back (``readFiles``): the runner moves the bytes itself, the provider never
touches a host path. Each file is written into ``SRC`` only at a path inside it, and never through a link:
a sandbox path that is not a plain relative name, a host path whose directory (or the file itself) is a
symlink, and a symlink made in the sandbox are refused by name (``SandboxPathRejected``, field ``--mount``) and
left as they are; the rest is still applied. What changed is counted: ``added`` (a file ``SRC`` did not have),
``changed`` (different bytes or executable bit), ``removed`` (a staged file no longer in the sandbox).

Deletions do not propagate: a file the Run removed is counted under ``removed`` and named, but stays in ``SRC``
(a copy back never deletes the user's files). An empty directory made in the sandbox is not copied back, nor is
a path the mount's exclusions (``--exclude``, ``.checkfuignore``) match: it was never staged, and SRC's own copy
(a ``.venv``) is not the sandbox's to overwrite; it is counted as ``excluded``.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from checkfu.contract.errors import SandboxPathRejected, SandboxStateConflict
from checkfu.contract.mounts import MountPlan
from checkfu.core.driver import Instance, RunSession
from checkfu.core.mounts import exclusion, sha256_of

READ_BATCH = 64
REFUSED_FIELD = "--mount"


@dataclass
class SyncReport:
    target: str
    source: str
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    def doc(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "source": self.source,
            "added": len(self.added),
            "changed": len(self.changed),
            "removed": len(self.removed),
            "excluded": len(self.excluded),
            "conflicts": len(self.conflicts),
            "deletions_propagated": False,
            "paths": {
                "added": self.added,
                "changed": self.changed,
                "removed": self.removed,
                "conflicts": self.conflicts,
            },
            "refused": self.refused,
        }

    def conflict(self, path: str) -> None:
        """``path`` changed in SRC while the Run went on (or was made there): SRC's copy is kept, the sandbox's
        is not copied back."""
        self.conflicts.append(path)
        exc = SandboxStateConflict(
            f"mount {self.source}:{self.target}: {path} changed both in the sandbox and in SRC while the Run went on "
            "(or SRC has its own, the Run was given none); SRC's kept, the sandbox's not copied back",
            field=REFUSED_FIELD,
        )
        self.refused.append({"path": path, "code": exc.code, "field": REFUSED_FIELD, "message": exc.message})

    def refuse(self, path: str, why: str) -> None:
        exc = SandboxPathRejected(
            f"mount {self.source}:{self.target}: {path} {why}; not copied back", field=REFUSED_FIELD
        )
        self.refused.append({"path": path, "code": exc.code, "field": REFUSED_FIELD, "message": exc.message})


def _relative(target: str, path: str) -> str | None:
    """``path`` (absolute, in the sandbox) as a plain relative name below ``target``, or ``None``."""
    norm = posixpath.normpath(path)
    if norm != path.rstrip("/") or not norm.startswith(target.rstrip("/") + "/"):
        return None
    rel = norm[len(target.rstrip("/")) + 1 :]
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        return None
    return rel


def _host_problem(root: Path, rel: str) -> str | None:
    """Why ``root/rel`` cannot be written without following a link (or leaving ``root``), else ``None``."""
    here = root
    for part in PurePosixPath(rel).parts[:-1]:
        here = here / part
        try:
            st = here.lstat()
        except FileNotFoundError:
            return None  # made below: nothing further exists to be a link
        if stat.S_ISLNK(st.st_mode):
            return f"lies below {here.relative_to(root).as_posix()}, a symlink in SRC (never followed)"
        if not stat.S_ISDIR(st.st_mode):
            return f"lies below {here.relative_to(root).as_posix()}, which is not a directory in SRC"
    try:
        st = (root / rel).lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink in SRC (never followed, never replaced)"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file in SRC"
    return None


class _Conflict(Exception):
    """``SRC``'s file is not the one the Run was given: it changed on the host while the Run went on."""


def _write(root: Path, rel: str, data: bytes, executable: bool, staged: tuple[str, bool] | None) -> bool | None:
    """Write one file (no link followed); whether it was new, or ``None`` when nothing was written.

    ``staged`` is the digest and executable bit of the file the Run was given at ``rel`` (``None``: it was given
    none). Only what the sandbox changed is copied back, and only over what the Run was given: a file the sandbox
    left as staged is not written (whatever ``SRC`` did with it meanwhile, a deletion included), and a file in
    ``SRC`` that is no longer the staged one (edited, ``chmod``-ed or deleted on the host during the Run, or made
    there when the Run was given none) is never overwritten or brought back.

    Raises:
        _Conflict: the sandbox changed a file that ``SRC`` changed too.
    """
    full = root / rel
    mode = 0o755 if executable else 0o644
    untouched = staged is not None and staged == (sha256_of(data), executable)
    try:
        st = full.lstat()
        with open(full, "rb") as f:  # lstat said: a regular file, not a link
            here = f.read()
        if untouched or (here == data and bool(st.st_mode & 0o111) == executable):
            return None
        if staged is None or staged != (sha256_of(here), bool(st.st_mode & 0o111)):
            raise _Conflict
        new = False
    except FileNotFoundError:
        if untouched:
            return None  # deleted in SRC meanwhile, and the sandbox did not change it: the deletion stands
        if staged is not None:
            raise _Conflict from None  # deleted in SRC, changed in the sandbox
        new = True
    for parent in reversed(PurePosixPath(rel).parents[:-1]):
        (root / parent).mkdir(mode=0o755, exist_ok=True)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), mode)
    return new


async def sync_back(
    session: RunSession, inst: Instance, plan: MountPlan, src: Path, excludes: tuple[str, ...] = ()
) -> SyncReport:
    """Copy ``plan.target`` in the sandbox back into ``src``, as the module says; what ``excludes`` and
    ``src``'s ``.checkfuignore`` leave out of the mount is left out of the copy back too (counted as ``excluded``)."""
    report = SyncReport(target=plan.target, source=str(src))
    skip = exclusion(src, excludes, f"{src}:{plan.target}")
    listing = await session.list_dir(inst, plan.target, recursive=True)
    if listing.kind != "dir":
        report.refuse(plan.target, f"is a {listing.kind} in the sandbox, not a directory")
        return report
    if listing.truncated:
        report.refuse(plan.target, f"was listed only to its bound of {len(listing.entries)} entries")
    wanted: dict[str, tuple[str, bool]] = {}
    seen: set[str] = set()
    for e in listing.entries:
        rel = _relative(plan.target, e.path)
        if rel is None:
            report.refuse(e.path, "is not a plain path below the mount target")
            continue
        if e.kind == "dir":
            continue
        seen.add(rel)
        if skip is not None and skip.match_file(rel):
            report.excluded.append(rel)
            continue
        if e.kind == "symlink":
            report.refuse(rel, "is a symlink made in the sandbox (links are never copied back)")
        elif e.kind != "file":
            report.refuse(rel, f"is a {e.kind}, not a regular file")
        else:
            wanted[e.path] = (rel, bool(e.mode & 0o111))
    limit = session.limits.max_read_bytes
    sizes = {e.path: e.size for e in listing.entries}
    paths = []
    for path, (rel, _) in wanted.items():
        if sizes[path] > limit:
            report.refuse(rel, f"is over the read bound of {limit} bytes")
        else:
            paths.append(path)
    given = {f.path: (f.digest, bool(f.mode & 0o111)) for f in plan.files if not f.symlink}
    batches: list[list[str]] = [[]]
    held = 0
    for path in paths:
        if len(batches[-1]) >= READ_BATCH or (batches[-1] and held + sizes[path] > limit):
            batches.append([])
            held = 0
        batches[-1].append(path)
        held += sizes[path]
    for batch in batches:
        if not batch:
            continue
        got = await session.read_files(inst, batch)
        for path in got.missing:
            report.refuse(wanted[path][0], "vanished before it was read")
        for f in got.files:
            rel, executable = wanted[f.path]
            why = _host_problem(src, rel)
            if why is not None:
                report.refuse(rel, why)
                continue
            try:
                new = _write(src, rel, f.data, executable, given.get(rel))
            except _Conflict:
                report.conflict(rel)
                continue
            except OSError as exc:
                report.refuse(rel, f"cannot be written in SRC ({exc.strerror or exc})")
                continue
            if new is True:
                report.added.append(rel)
            elif new is False:
                report.changed.append(rel)
    report.removed = sorted(f.path for f in plan.files if f.path not in seen)
    return report
