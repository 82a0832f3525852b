"""The state directory's removal: fast for an empty directory (and for an instance with nothing left in it, on the
caller's thread), never through a mount (issue 18's B20 work)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from checkfu.contract.vocabulary import Resources
from checkfu.providers.host_process.instance import Instance
from checkfu.providers.host_process.state import Layout, append_group, mark_active, mount_points_below, remove_tree
from checkfu.providers.host_process.store import Store


def test_an_empty_directory_and_a_tree_are_removed(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    remove_tree(empty)
    assert not empty.exists()
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    remove_tree(tree)
    assert not tree.exists()


def bind(source: Path, target: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr!r}")


@pytest.mark.parametrize("name", ["plain", "with space", "tab\there", "back\\slash"])
def test_a_mount_is_found_and_never_deleted_through_even_when_empty(tmp_path: Path, name: str) -> None:
    """An empty mount point is refused as a full one is: the empty-directory fast path stops at the mount
    (``EBUSY``), and the kernel's octal escapes in ``mountinfo`` are matched."""
    source = tmp_path / "source"
    source.mkdir()
    work = tmp_path / name
    (work / "m").mkdir(parents=True)
    bind(source, work / "m")
    try:
        assert mount_points_below(work) == [str((work / "m").resolve())]
        with pytest.raises(OSError) as inside:
            remove_tree(work)
        assert inside.value.errno == errno.EBUSY
        with pytest.raises(OSError) as itself:
            remove_tree(work / "m")
        assert itself.value.errno == errno.EBUSY
        assert (work / "m").is_dir() and source.is_dir()
    finally:
        subprocess.run(["umount", str(work / "m")], check=True)
    remove_tree(work)
    assert not work.exists() and source.is_dir()


def _made(tmp_path: Path, key: str) -> tuple[Store, Layout]:
    layout = Layout(tmp_path / "state")
    layout.create()
    store = Store(layout, None)
    instance = Instance(
        key=key,
        instance_id=f"hp-{key}",
        runner_tag="t",
        state="provisioning",
        workdir=layout.workdir(key),
        cgroups=None,
    )
    store.create(instance, Resources(cpu_millis=1000, memory_mib=64, disk_mib=64, pids=16))
    mark_active(layout.instance_active(key))
    return store, layout


def test_an_instance_with_nothing_left_in_it_is_destroyed_at_once(tmp_path: Path) -> None:
    """No process in its groups and an empty working directory: removed on the caller's thread, label last."""
    store, layout = _made(tmp_path, "ak-1")
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    append_group(layout.instance_groups("ak-1"), (gone.pid, 1))
    assert store.destroy_at_once("ak-1", [(gone.pid, 1)]) is True
    assert not layout.instance_dir("ak-1").exists()


def test_destroying_at_once_leaves_anything_else_whole_for_the_worker(tmp_path: Path) -> None:
    """A running group, a file in the working directory or an entry it does not know: ``False``, and the instance
    is as it was (its label names it still), for ``destroy`` on a worker thread."""
    store, layout = _made(tmp_path, "ak-2")
    running = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        before = sorted(os.listdir(layout.instance_dir("ak-2")))
        assert store.destroy_at_once("ak-2", [(running.pid, 1)]) is False
        assert sorted(os.listdir(layout.instance_dir("ak-2"))) == before
    finally:
        running.kill()
        running.wait()
    (layout.workdir("ak-2") / "f").write_text("x")
    assert store.destroy_at_once("ak-2", []) is False
    assert layout.instance_label("ak-2").is_file() and (layout.workdir("ak-2") / "f").is_file()
    (layout.workdir("ak-2") / "f").unlink()
    (layout.instance_dir("ak-2") / "clone.tar").write_bytes(b"")
    assert store.destroy_at_once("ak-2", []) is False
    assert layout.instance_label("ak-2").is_file() and layout.workdir("ak-2").is_dir()
    assert store.destroy("ak-2", [None], [], 0.0) is True
    assert not layout.instance_dir("ak-2").exists()


def test_a_name_of_the_wrong_kind_is_left_for_the_worker(tmp_path: Path) -> None:
    """A process of the instance can write beside its working directory: a directory where the provider makes a
    file (``active``, ``groups``) is ``destroy``'s to remove, and nothing is removed before that is known."""
    store, layout = _made(tmp_path, "ak-4")
    layout.instance_active("ak-4").unlink()
    layout.instance_active("ak-4").mkdir()
    (layout.instance_active("ak-4") / "inside").write_text("x")
    assert store.destroy_at_once("ak-4", []) is False
    assert layout.instance_label("ak-4").is_file() and layout.workdir("ak-4").is_dir()
    assert store.destroy("ak-4", [None], [], 0.0) is True
    assert not layout.instance_dir("ak-4").exists()


def test_a_working_directory_that_is_a_mount_point_is_left_for_the_worker(tmp_path: Path) -> None:
    store, layout = _made(tmp_path, "ak-3")
    source = tmp_path / "source"
    source.mkdir()
    bind(source, layout.workdir("ak-3"))
    try:
        assert store.destroy_at_once("ak-3", []) is False
        assert layout.instance_label("ak-3").is_file()
    finally:
        subprocess.run(["umount", str(layout.workdir("ak-3"))], check=True)
    assert store.destroy_at_once("ak-3", []) is True
    assert source.is_dir()
