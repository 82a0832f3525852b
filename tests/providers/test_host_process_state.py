"""The state directory's removal: fast for an empty directory, never through a mount (issue 18's B20 work)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from checkfu.providers.host_process.state import mount_points_below, remove_tree


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
