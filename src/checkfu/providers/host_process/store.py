"""The state directory's blocking operations: creating, destroying, snapshotting, listing.

Every method here touches the disk, cgroup files or ``/proc`` and may block:
call them from a worker thread, never on the event loop, except where one says it
is bounded (a few calls, no waiting). Order is what makes a
crash at any point reclaimable by label: a label is written before anything it
names exists, and removed after everything it names is gone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Literal

from checkfu.contract.errors import SandboxStateConflict
from checkfu.contract.members import AllocationEntry
from checkfu.contract.vocabulary import Resources
from checkfu.providers.host_process import cgroups as cg
from checkfu.providers.host_process import spawning, state, tarballs
from checkfu.providers.host_process.instance import Instance
from checkfu.providers.host_process.state import Layout, SnapshotLabel


def entry(key: str, kind: Literal["instance", "snapshot"], object_id: str) -> AllocationEntry:
    """One line of ``listAllocations``."""
    return AllocationEntry(allocation_key=key, kind=kind, object_id=object_id)


class Store:
    """One state directory, and the cgroup host new instances get their cgroups from (if any)."""

    def __init__(self, layout: Layout, host: cg.CgroupHost | None) -> None:
        self.layout = layout
        self.host = host

    def create(self, instance: Instance, limits: Resources) -> None:
        """Label, then make, the instance's directory, working directory and cgroups (bounded by ``limits``).

        On failure everything made is removed again before the error propagates.

        Raises:
            SandboxStateConflict: the state directory already holds a label for this key.
            OSError: a directory, label or cgroup could not be made.
        """
        label_path = self.layout.instance_label(instance.key)
        if label_path.exists():
            raise SandboxStateConflict(
                f"allocation_key: {instance.key!r} already holds an instance in {self.layout.root}",
                field="allocation_key",
            )
        directory = self.layout.instance_dir(instance.key)
        state.remove_tree(directory)  # unlabelled leftovers of a provision that crashed before its label
        directory.mkdir(mode=0o700)
        state.write_label(label_path, instance.label())
        try:
            instance.workdir.mkdir(mode=0o700)
            if self.host is not None and instance.cgroups is not None:
                self.host.create(instance.cgroups, limits)
        except BaseException:
            self.destroy(instance.key, [instance.cgroups], [], 0.0)
            raise

    def destroy(
        self,
        key: str,
        recorded: Iterable[cg.InstanceCgroups | None],
        groups: list[tuple[int, int]],
        grace: float,
    ) -> bool:
        """End every process, then remove cgroups, the instance directory and (last) its label.

        Blocking: a worker thread only. Returns whether anything existed.

        Raises:
            OSError: a process survived SIGKILL, a cgroup stayed busy, or a file could not be removed.
        """
        existed = False
        for found in recorded:
            if found is None or not found.dirs:
                continue
            if any(d.is_dir() for d in found.dirs.values()):
                existed = True
                if not cg.end_instance(found, grace=grace):
                    raise OSError(f"processes of {key} survive SIGKILL")
                cg.remove(found)
        if groups and not spawning.end_groups(groups, grace=grace):
            raise OSError(f"processes of {key} survive SIGKILL")
        directory = self.layout.instance_dir(key)
        if directory.is_dir():
            existed = True
            label = self.layout.instance_label(key)
            for child in directory.iterdir():
                if child != label:
                    state.remove_tree(child)
            label.unlink(missing_ok=True)
            directory.rmdir()
        return existed

    def destroy_at_once(self, key: str, groups: Iterable[tuple[int, int]]) -> bool:
        """``destroy`` for an instance with no cgroups, no process left in its recorded groups and an empty
        working directory: done here, on the caller's thread, and ``True``. It is a few calls (a signal-0 probe per
        group, then removals), where a worker thread's round trip costs 0.35 ms here, a tenth of a first command
        on this tier. ``False``, with nothing removed, for anything else (a process to end, files to remove, an
        entry it does not know): ``destroy`` does that, on a worker thread.

        Raises:
            OSError: a removal failed after the working directory's (the instance is partly gone, its label last;
                a release tried again, or ``destroy``, finishes it).
        """
        for pgid, _start in groups:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            return False  # something holds that group id: ``destroy`` tells whether it is ours and ends it
        directory = self.layout.instance_dir(key)
        files = {
            self.layout.instance_label(key).name,
            self.layout.instance_groups(key).name,
            self.layout.instance_active(key).name,
        }
        work = self.layout.workdir(key).name
        try:
            with os.scandir(directory) as entries:
                for entry in entries:  # each of the kind this provider makes (a process of the instance may not)
                    if entry.name == work:
                        made = entry.is_dir(follow_symlinks=False)
                    else:
                        made = entry.name in files and entry.is_file(follow_symlinks=False)
                    if not made:
                        return False
            os.rmdir(self.layout.workdir(key))  # not empty, or a mount point: left to ``destroy``
        except FileNotFoundError:
            pass
        except OSError:
            return False
        for path in (self.layout.instance_groups(key), self.layout.instance_active(key)):
            path.unlink(missing_ok=True)
        self.layout.instance_label(key).unlink(missing_ok=True)  # last: it names everything above
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(directory)
        return True

    def write_snapshot(self, instance: Instance, label: SnapshotLabel) -> None:
        """Label, then write, a tarball of the instance's working directory, held still while it is read.

        On failure the label and any partial bytes are removed before the error propagates.

        Raises:
            SandboxStateConflict: the snapshot key already holds a snapshot.
            OSError, tarfile.TarError: the tarball could not be written.
        """
        key = label.allocation_key
        label_path = self.layout.snapshot_label(key)
        if label_path.exists() or self.layout.snapshot_tar(key).exists():
            raise SandboxStateConflict(
                f"snapshot_allocation_key: {key!r} already holds a snapshot", field="snapshot_allocation_key"
            )
        state.write_label(label_path, label)
        try:
            with self.held_still(instance):
                tarballs.write(instance.workdir, self.layout.snapshot_partial(key), self.layout.snapshot_tar(key))
        except BaseException:
            self.remove_snapshot_files(key)
            raise

    def held_still(self, instance: Instance) -> AbstractContextManager[None]:
        """Freeze the instance's processes for the block when it has a freezer cgroup; else do nothing."""
        held = instance.cgroups
        if held is not None and "freezer" in held.dirs and held.freezer.is_dir():
            return cg.frozen(held)
        return nullcontext()

    def copy_workdir(self, source: Instance, target: Instance) -> None:
        """Copy the source's working directory into the target's, through a tarball inside the target's directory.

        Raises:
            OSError, tarfile.TarError: the copy failed (the caller reclaims the target).
        """
        tarball = self.layout.clone_tar(target.key)
        with self.held_still(source):
            tarballs.write(source.workdir, tarball.with_suffix(".partial"), tarball)
        tarballs.extract(tarball, target.workdir)
        tarball.unlink()

    def remove_snapshot_files(self, key: str) -> int:
        """Remove a snapshot's tarball, partial bytes and (last) label; how many files there were."""
        removed = 0
        for path in (
            self.layout.snapshot_tar(key),
            self.layout.snapshot_partial(key),
            self.layout.snapshot_label(key),
        ):
            if path.exists():
                path.unlink()
                removed += 1
        return removed

    def destroy_snapshot(self, key: str, tag: str) -> bool:
        """Remove the snapshot under ``key`` unless its label names another runner; whether anything was there."""
        label = state.read_snapshot_label(self.layout.snapshot_label(key))
        if label is not None and label.runner_tag != tag:
            return False
        return self.remove_snapshot_files(key) > 0

    def scan(self, tag: str) -> list[AllocationEntry]:
        """Every instance and snapshot whose label names ``tag``; a label that does not decode is skipped."""
        entries: list[AllocationEntry] = []
        for directory in sorted(self.layout.instances.iterdir()):
            label = state.read_instance_label(directory / "label.json")
            if label is not None and label.runner_tag == tag and label.allocation_key == directory.name:
                entries.append(entry(label.allocation_key, "instance", label.instance_id))
        for path in sorted(self.layout.snapshots.glob("*.json")):
            snap = state.read_snapshot_label(path)
            if snap is not None and snap.runner_tag == tag and path.name == f"{snap.allocation_key}.json":
                entries.append(entry(snap.allocation_key, "snapshot", snap.snapshot_id))
        return entries
