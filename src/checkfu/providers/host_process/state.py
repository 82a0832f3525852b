"""The state directory: where instances and snapshots live on the runner host, and their labels.

Layout, all below one ``state_dir``::

    instances/<allocation_key>/label.json     the instance's label, written first, removed last
    instances/<allocation_key>/work/          its working directory (cwd and HOME of its processes)
    instances/<allocation_key>/groups         the process groups its spawns lead, appended one per line
    instances/<allocation_key>/active         empty, made when it was activated
    instances/<allocation_key>/clone.tar      transient, while a clone copies its source
    snapshots/<allocation_key>.json           a snapshot's label, written before its bytes
    snapshots/<allocation_key>.tar            the snapshot: a tarball of a working directory

Every label carries the contract's owner labels (``checkfu.contract.labels``); an
object exists only while its label does, so compensation and enumeration need
nothing but the state directory. A label is written atomically (write, then rename),
so a reader sees all of one or none; an instance's is written once, and what changes
later (activation, the groups) lives in files of their own beside it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
from functools import cached_property
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from checkfu.contract.labels import LABEL_ALLOCATION_KEY, LABEL_RUNNER_TAG

LabelState = Literal["provisioning", "active"]


class _Label(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    labels: dict[str, str]
    revision: str

    @property
    def allocation_key(self) -> str:
        return self.labels.get(LABEL_ALLOCATION_KEY, "")

    @property
    def runner_tag(self) -> str:
        return self.labels.get(LABEL_RUNNER_TAG, "")


class InstanceLabel(_Label):
    """What survives a restart of the provider about one instance."""

    kind: Literal["instance"] = "instance"
    instance_id: str
    state: LabelState
    cgroups: dict[str, str] = Field(default_factory=dict)
    """Controller to directory, when the instance has cgroups."""
    groups: list[tuple[int, int]] = Field(default_factory=list)
    """``(process group id, start time of its leader)`` of the spawns made before the label was last written,
    when it has no cgroups; every spawn is in the instance's groups file (``Layout.instance_groups``) too."""


class SnapshotLabel(_Label):
    """What survives a restart about one snapshot."""

    kind: Literal["snapshot"] = "snapshot"
    snapshot_id: str
    source_allocation_key: str
    source_instance_id: str


L = TypeVar("L", bound=_Label)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/checkfu/host-process``, else ``~/.local/state/checkfu/host-process``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "checkfu" / "host-process"


class Layout:
    """Paths below one state directory. Keys are contract identifiers: no ``/``, never ``.`` or ``..``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.instances = root / "instances"
        self.snapshots = root / "snapshots"

    def create(self) -> None:
        for directory in (self.root, self.instances, self.snapshots):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    @cached_property
    def state_hash(self) -> str:
        """Twelve hex digits naming this state directory in shared namespaces (cgroup names)."""
        return hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]

    def instance_dir(self, key: str) -> Path:
        return self.instances / key

    def instance_label(self, key: str) -> Path:
        return self.instances / key / "label.json"

    def workdir(self, key: str) -> Path:
        return self.instances / key / "work"

    def instance_active(self, key: str) -> Path:
        """Present once the instance was activated (``mark_active``): its label keeps the state it was made in."""
        return self.instances / key / "active"

    def instance_groups(self, key: str) -> Path:
        """The process groups the instance's spawns lead, one ``PGID START`` line each (``append_group``)."""
        return self.instances / key / "groups"

    def clone_tar(self, key: str) -> Path:
        return self.instances / key / "clone.tar"

    def snapshot_label(self, key: str) -> Path:
        return self.snapshots / f"{key}.json"

    def snapshot_tar(self, key: str) -> Path:
        return self.snapshots / f"{key}.tar"

    def snapshot_partial(self, key: str) -> Path:
        return self.snapshots / f"{key}.tar.partial"


def write_label(path: Path, label: _Label) -> None:
    """Replace the label at ``path`` atomically.

    Raises:
        OSError: the directory is missing or not writable.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(label.model_dump_json())
    os.replace(tmp, path)


def mark_active(path: Path) -> None:
    """Record an instance's activation: a new empty file beside its label. Replacing the label (as ``write_label``
    does) renames over an existing file, which ext4 answers by writing the new one out first: 0.4 ms of each
    activation, of a first command's 3 ms on this tier; making a file costs 0.02 ms. Reading it back:
    ``InstanceLabel.state`` says ``provisioning``, and this file says it was activated since.

    Raises:
        OSError: the instance's directory is missing or not writable.
    """
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))


def append_group(path: Path, group: tuple[int, int]) -> None:
    """Record one spawn's process group (its id and its leader's start time) after those recorded already: one
    ``write`` to a file opened for appending, so a crash leaves at most a torn last line, which ``read_groups``
    skips. A label's atomic replacement here cost every ``exec`` a rename over an existing file (0.4 ms on ext4,
    which starts writing the new file out first); an append costs 0.02 ms.

    Raises:
        OSError: the instance's directory is missing or not writable.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{group[0]} {group[1]}\n".encode("ascii"))
    finally:
        os.close(fd)


def write_groups(path: Path, groups: list[tuple[int, int]]) -> None:
    """Replace the record of process groups with ``groups``, atomically (after pruning the ended ones).

    Raises:
        OSError: the instance's directory is missing or not writable.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(f"{pgid} {start}\n" for pgid, start in groups), encoding="ascii")
    os.replace(tmp, path)


def read_groups(path: Path) -> list[tuple[int, int]]:
    """The process groups recorded at ``path``, in order, each once; a line that is not two integers (a torn
    last write) is skipped. None recorded when there is no such file."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    found: list[tuple[int, int]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and all(f.isdigit() for f in fields):
            group = (int(fields[0]), int(fields[1]))
            if group not in found:
                found.append(group)
    return found


def read_instance_label(path: Path) -> InstanceLabel | None:
    """The instance label at ``path``; ``None`` when there is none or it does not decode."""
    return _read(path, InstanceLabel)


def read_snapshot_label(path: Path) -> SnapshotLabel | None:
    """The snapshot label at ``path``; ``None`` when there is none or it does not decode."""
    return _read(path, SnapshotLabel)


def _read(path: Path, model: type[L]) -> L | None:
    try:
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValueError, ValidationError):
        return None


def mount_points_below(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace (``/proc/self/mountinfo``)."""
    root = str(path.resolve())
    found: list[str] = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return found
    needle = _mountinfo_escape(root)  # escaping is per character, so a point below ``root`` contains it
    for line in text.splitlines():
        if needle not in line:
            continue
        fields = line.split()
        if len(fields) > 4:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == root or point.startswith(root + "/"):
                found.append(point)
    return found


def _mountinfo_escape(path: str) -> str:
    """``path`` as ``/proc/self/mountinfo`` spells it (the kernel escapes these four as octal)."""
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it, refusing to touch anything mounted inside it.

    A host process may bind-mount part of the host into its working directory;
    deleting through that mount would delete the host's files, so a mount point
    inside ``path`` stops the removal instead.

    Raises:
        OSError: ``EBUSY`` for a mount point inside ``path``, or a file that cannot be removed.
    """
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(found.st_mode):
        os.unlink(path)  # nothing lies inside a file (one that is a mount point is refused: EBUSY)
        return
    try:
        os.rmdir(path)  # an empty directory (a working directory after most Runs) holds no files and no mounts
        return
    except OSError:
        pass  # not empty, or a mount point itself (EBUSY): the checks below decide
    mounts = mount_points_below(path)
    if mounts:
        raise OSError(errno.EBUSY, "a mount point lies inside the directory", mounts[0])

    def writable_parent(_func: object, failed: str, _exc: object) -> None:
        os.chmod(os.path.dirname(failed), 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            shutil.rmtree(failed)
        else:
            os.unlink(failed)

    shutil.rmtree(path, onerror=writable_parent)
