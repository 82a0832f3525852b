"""``readFiles`` and ``listDir``: confined to the sandbox, links never followed out of it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from docker_kit import LEASE, Box, Kit, sha

from checkfu.contract.checks import check_read_files
from checkfu.contract.errors import SandboxBoundExceeded, SandboxStateConflict
from checkfu.contract.members import ListDirRequest, ReadFilesRequest

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

SETUP = """
cd $HOME && mkdir -p d/e && printf one > d/one && printf two > d/e/two && chmod 600 d/one
ln -s /etc/passwd link-out && ln -s / root-link && ln -s d/one link-in && mkfifo pipe
head -c 5000 /dev/zero > big
"""


@pytest.fixture(scope="module")
def box(kit: Kit) -> Iterator[Box]:
    b = asyncio.run(kit.up("files", files={"/workspace/README": b"hello\n"}))
    asyncio.run(b.sh(SETUP))
    yield b
    asyncio.run(b.release())


async def read(box: Box, *paths: str, max_bytes: int = 1 << 20) -> tuple[dict[str, bytes], list[str]]:
    result = await box.kit.provider.read_files(ReadFilesRequest(**box.call, paths=paths, max_bytes=max_bytes))
    check_read_files(result, paths, max_bytes)
    return {f.path: f.data for f in result.files}, list(result.missing)


async def test_reads_regular_files_with_mode_and_digest(box: Box) -> None:
    home = box.kit.docker.user.home
    result = await box.kit.provider.read_files(
        ReadFilesRequest(**box.call, paths=(f"{home}/d/one", "/workspace/README", "/etc/hostname"), max_bytes=1000)
    )
    by_path = {f.path: f for f in result.files}
    assert by_path[f"{home}/d/one"].data == b"one" and by_path[f"{home}/d/one"].mode == 0o600
    assert by_path["/workspace/README"].digest == sha(b"hello\n")
    assert by_path["/etc/hostname"].data == b"sandbox\n", "the sandbox's own file, not the host's"


async def test_links_are_never_followed(box: Box) -> None:
    home = box.kit.docker.user.home
    odd = (f"{home}/link-out", f"{home}/link-in", f"{home}/pipe", f"{home}/d", f"{home}/nope", f"{home}/big/below")
    found, missing = await read(box, *odd)
    assert found == {} and missing == list(odd)
    # a link in the middle of a path resolves inside the sandbox's root, never the host's
    found, _ = await read(box, f"{home}/root-link/etc/passwd")
    assert b"sandbox:x:1000:1000" in found[f"{home}/root-link/etc/passwd"]
    with open("/etc/passwd", "rb") as f:
        assert found[f"{home}/root-link/etc/passwd"] != f.read()


async def test_max_bytes_is_a_bound(box: Box) -> None:
    home = box.kit.docker.user.home
    with pytest.raises(SandboxBoundExceeded):
        await read(box, f"{home}/big", max_bytes=4999)
    with pytest.raises(SandboxBoundExceeded):
        await read(box, f"{home}/d/one", f"{home}/big", max_bytes=5002)
    found, _ = await read(box, f"{home}/d/one", f"{home}/big", max_bytes=5003)
    assert len(found) == 2


async def test_list_dir(box: Box) -> None:
    home = box.kit.docker.user.home
    p = box.kit.provider
    flat = await p.list_dir(ListDirRequest(**box.call, path=f"{home}/d", max_entries=100))
    assert flat.kind == "dir"
    assert {(e.path, e.kind) for e in flat.entries} == {(f"{home}/d/one", "file"), (f"{home}/d/e", "dir")}
    assert not flat.truncated
    deep = await p.list_dir(ListDirRequest(**box.call, path=home, recursive=True, max_entries=100))
    kinds = {e.path: e for e in deep.entries}
    assert kinds[f"{home}/d/e/two"].kind == "file" and kinds[f"{home}/d/e/two"].size == 3
    assert kinds[f"{home}/link-out"].kind == "symlink" and kinds[f"{home}/pipe"].kind == "other"
    assert kinds[f"{home}/d/one"].mode == 0o600
    short = await p.list_dir(ListDirRequest(**box.call, path=home, recursive=True, max_entries=2))
    assert short.truncated and len(short.entries) == 2
    ws = await p.list_dir(ListDirRequest(**box.call, path="/workspace", max_entries=10))
    assert [e.path for e in ws.entries] == ["/workspace/README"]


async def test_list_dir_says_what_is_at_a_path_that_is_no_directory(box: Box) -> None:
    home = box.kit.docker.user.home
    answers = {
        f"{home}/root-link": "symlink",  # a link to the sandbox's /, listed as the link, never followed
        f"{home}/link-in": "symlink",
        f"{home}/big": "file",
        f"{home}/pipe": "other",
        f"{home}/none": "missing",
        f"{home}/big/below-a-file": "missing",
        f"{home}/link-in/below-a-linked-file": "missing",
    }
    for path, kind in answers.items():
        for recursive in (False, True):
            got = await box.kit.provider.list_dir(
                ListDirRequest(**box.call, path=path, recursive=recursive, max_entries=10)
            )
            assert (got.path, got.kind, got.entries, got.truncated) == (path, kind, (), False), path


async def test_reads_need_an_active_instance(kit: Kit) -> None:
    key, inst = await kit.provision("unread")
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        with pytest.raises(SandboxStateConflict):
            await kit.provider.read_files(ReadFilesRequest(**call, paths=("/etc/hostname",), max_bytes=10))
        with pytest.raises(SandboxStateConflict):
            await kit.provider.list_dir(ListDirRequest(**call, path="/", max_entries=10))
    finally:
        await Box(kit, key, inst.instance_id).release()
