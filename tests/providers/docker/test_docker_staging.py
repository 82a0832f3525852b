"""Docker staging: the spool is uploaded in segments while writes go on, in order, and a failed upload is said.

The segment size is made small here so that a handful of writes seals several segments (the benchmark's size
is ``staging.SEGMENT_BYTES``).
"""

from __future__ import annotations

import asyncio
import os
import stat
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from docker_kit import LEASE, Kit, leftovers, sha

from checkfu.contract.errors import SandboxDigestMismatch, SandboxProviderFailed
from checkfu.contract.members import (
    ActivateRequest,
    CompensateRequest,
    ExecRequest,
    ReleaseRequest,
    WriteFileRequest,
)
from checkfu.contract.mounts import MountFile, MountPlan
from checkfu.providers.docker import labels as L
from checkfu.providers.docker import provider as provider_module
from checkfu.providers.docker import writes
from checkfu.providers.docker.staging import PARTIAL, Spools, _header

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

SEGMENT = 16 << 10


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writes, "SEGMENT_BYTES", SEGMENT)


def _plan(target: str, files: dict[str, bytes]) -> MountPlan:
    return MountPlan(
        target=target, files=tuple(MountFile(path=p, size=len(d), digest=sha(d)) for p, d in files.items())
    )


async def _write(kit: Kit, call: dict[str, Any], path: str, data: bytes, **kw: Any) -> None:
    await kit.provider.write_file(WriteFileRequest(**call, path=path, size=len(data), digest=sha(data), **kw), data)


def _segments(kit: Kit, instance: str) -> list[Path]:
    root = Path(kit.docker.state_dir) / "staging"
    return sorted(root.glob(f"{instance}~*.tar.*")) if root.exists() else []


async def _uploaded(kit: Kit, instance: str) -> None:
    """Wait until no sealed segment of ``instance`` is left on disk (the background uploader took them all)."""
    deadline = time.monotonic() + 30
    while _segments(kit, instance):
        assert time.monotonic() < deadline, _segments(kit, instance)
        await asyncio.sleep(0.05)


def test_plain_headers_are_what_tarfile_writes() -> None:
    cases: list[dict[str, Any]] = [
        {"name": "workspace/src/a.txt", "size": 4096, "mode": 0o644, "directory": False},
        {"name": "workspace/src", "size": 0, "mode": 0o755, "directory": True},
        {"name": "w/link", "size": 0, "mode": 0o777, "directory": False, "link": "../x"},
        {"name": "n" * 100, "size": 1, "mode": 0o600, "directory": False},
        {"name": "n" * 101, "size": 1, "mode": 0o600, "directory": False},  # too long for ustar: PAX
        {"name": "w/caf\u00e9", "size": 3, "mode": 0o644, "directory": False},  # not ASCII: PAX
    ]
    for case in cases:
        info = tarfile.TarInfo(case["name"])
        info.size = case["size"] if not case["directory"] and "link" not in case else 0
        info.mode, info.uid, info.gid, info.mtime = case["mode"], 1000, 1000, 0
        info.type = tarfile.DIRTYPE if case["directory"] else tarfile.SYMTYPE if "link" in case else tarfile.REGTYPE
        info.linkname = case.get("link", "")
        want = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
        assert _header(uid=1000, gid=1000, **case) == want, case["name"]


def test_what_waits_to_be_staged_is_the_users_alone(tmp_path: Path) -> None:
    # A spool holds files bound for a sandbox, perhaps copied from a mount source only this user may read.
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    root = home / "checkfu-docker" / "staging"
    spool = Spools(root).get("inst", "tag")
    with spool.lock:
        spool.append("secret.txt", "/data", b"only mine\n", mode=0o600, uid=1000, gid=1000)
        spool.mark("/data/big.bin")
        spool.close()
    made = {p.relative_to(home).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in home.rglob("*")}
    assert made == {
        "checkfu-docker": 0o700,
        "checkfu-docker/staging": 0o700,
        "checkfu-docker/staging/inst~tag.tar": 0o600,
        **{p.relative_to(home).as_posix(): 0o600 for p in root.glob(f"inst~tag.tar{PARTIAL}*")},
    }
    assert len(made) == 4  # the mark is there too
    assert stat.S_IMODE(home.stat().st_mode) == 0o755  # not the provider's: kept as it was


async def test_segments_go_up_while_writes_continue_and_later_writes_still_win(kit: Kit, small_segments: None) -> None:
    filler = {f"fill/f{i}.bin": os.urandom(4096) for i in range(12)}  # three segments' worth
    files = {"a/p.txt": b"first", "a/q/r.txt": b"below q", **filler}
    key, inst = await kit.provision("segments", mounts=(_plan("/workspace", files),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        await _write(kit, call, "/workspace/a/p.txt", b"first")
        await _write(kit, call, "/workspace/a/q/r.txt", b"below q")
        for path, data in filler.items():
            await _write(kit, call, f"/workspace/{path}", data)
        await _uploaded(kit, inst.instance_id)
        # the earlier writes are already in the mount volume, before activate: read them through the stager
        stager = L.stager_name(inst.instance_id)
        stream, _ = kit.client.api.get_archive(stager, "/workspace/a/p.txt")
        assert b"first" in b"".join(stream)
        # later writes replace what went up in an earlier segment: a file by a file, a directory by a file
        await _write(kit, call, "/workspace/a/p.txt", b"second")
        await _write(kit, call, "/workspace/a/q", b"q is a file now")
        await kit.provider.activate(ActivateRequest(**call))
        ran = await kit.provider.exec(
            ExecRequest(
                **call,
                argv=("sh", "-c", "cat /workspace/a/p.txt; echo; cat /workspace/a/q; echo; ls /workspace/fill | wc -l"),
                timeout_ms=10_000,
                max_output_bytes=999,
            )
        )
        assert ran.stdout.split(b"\n")[:3] == [b"second", b"q is a file now", b"12"]
        assert not _segments(kit, inst.instance_id)
    finally:
        await kit.provider.release(ReleaseRequest(**call))


async def test_a_failed_background_upload_is_said_by_write_file_and_activate_and_leaves_nothing(
    kit: Kit, small_segments: None
) -> None:
    filler = {f"fill/f{i}.bin": os.urandom(4096) for i in range(8)}
    key, inst = await kit.provision("lost-stager", mounts=(_plan("/workspace", filler),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    # the stager goes missing behind the provider's back: the next segment's upload fails in the background
    kit.client.api.remove_container(L.stager_name(inst.instance_id), force=True)
    for path, data in filler.items():
        try:
            await _write(kit, call, f"/workspace/{path}", data)
        except SandboxProviderFailed as exc:  # once the background upload has failed, writeFile says so
            assert exc.code == "SandboxProviderFailed"
            assert "uploading staged files" in exc.message and "release it" in exc.message
            break
    else:
        await asyncio.sleep(0.5)
    with pytest.raises(SandboxProviderFailed, match="uploading staged files") as raised:
        await _write(kit, call, "/workspace/late.txt", b"late")
    assert raised.value.code == "SandboxProviderFailed"
    with pytest.raises(SandboxProviderFailed, match="activate: uploading staged files"):
        await kit.provider.activate(ActivateRequest(**call))
    compensated = await kit.provider.compensate(
        CompensateRequest(target=kit.target, lease=LEASE, allocation_key=key, runner_tag=kit.runner_tag)
    )
    assert compensated.reclaimed >= 1
    assert not [x for x in leftovers(kit.client, kit.runner_tag) if x[2] == key]
    root = Path(kit.docker.state_dir) / "staging"
    assert not list(root.glob(f"{inst.instance_id}~*"))


async def test_a_cold_provider_uploads_sealed_segments_in_order(kit: Kit, small_segments: None) -> None:
    files = {f"f{i}.bin": os.urandom(4096) for i in range(6)}
    key, inst = await kit.provision("cold-segments", mounts=(_plan("/workspace", files),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        # segments sealed by a provider that then went away before uploading them, found by name
        hot = kit.docker
        spool = hot.spools.get(inst.instance_id, kit.runner_tag)
        with spool.lock:
            for i in range(3):
                spool.append("/workspace/same.txt", "/workspace", b"v%d" % i, mode=0o644, uid=1000, gid=1000)
                spool.seal()
        assert len(_segments(kit, inst.instance_id)) == 3
        hot.spools.close()
        cold = provider_module.DockerProvider(state_dir=hot.state_dir, cache_tag=kit.runner_tag, workers=4)
        try:
            await cold.activate(ActivateRequest(**call))
            ran = await cold.exec(
                ExecRequest(**call, argv=("cat", "/workspace/same.txt"), timeout_ms=10_000, max_output_bytes=99)
            )
            assert ran.stdout == b"v2"
        finally:
            cold.close()
        assert not _segments(kit, inst.instance_id)
    finally:
        await kit.provider.release(ReleaseRequest(**call))


@pytest.fixture
def small_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writes, "DIRECT_BYTES", 128 << 10)
    monkeypatch.setattr(writes, "SLICE_BYTES", 64 << 10)


async def _cat(kit: Kit, call: dict[str, Any], script: str) -> bytes:
    ran = await kit.provider.exec(
        ExecRequest(**call, argv=("sh", "-c", script), timeout_ms=10_000, max_output_bytes=4 << 20)
    )
    return ran.stdout


async def test_large_files_keep_their_place_among_spooled_writes(kit: Kit, small_direct: None) -> None:
    big, big2 = os.urandom(256 << 10), os.urandom(300 << 10)
    files = {"one": big, "two": big2}
    key, inst = await kit.provision("direct-order", mounts=(_plan("/workspace", files),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        await _write(kit, call, "/workspace/one", b"small first")  # spooled
        await _write(kit, call, "/workspace/one", big)  # uploaded on its own, after the spool: it wins
        await _write(kit, call, "/workspace/two", big2)
        await _write(kit, call, "/workspace/two", b"small last")  # spooled after the large one: it wins
        await kit.provider.activate(ActivateRequest(**call))
        assert (await _cat(kit, call, "sha256sum /workspace/one")).split()[0].decode() == sha(big)[7:]
        assert await _cat(kit, call, "cat /workspace/two") == b"small last"
    finally:
        await kit.provider.release(ReleaseRequest(**call))


async def test_a_large_file_with_the_wrong_digest_is_stopped_and_keeps_activate_from_starting(
    kit: Kit, small_direct: None
) -> None:
    good = os.urandom(256 << 10)
    bad = bytearray(good)
    bad[-1] ^= 1  # the last byte differs: found only once the hash beside the upload is done
    key, inst = await kit.provision("direct-bad", mounts=(_plan("/workspace", {"big": good}),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        with pytest.raises(SandboxDigestMismatch) as raised:
            await kit.provider.write_file(
                WriteFileRequest(**call, path="/workspace/big", size=len(good), digest=sha(good)), bytes(bad)
            )
        assert raised.value.field == "digest"
        with pytest.raises(SandboxProviderFailed, match="'/workspace/big' may be partly written"):
            await kit.provider.activate(ActivateRequest(**call))
        assert kit.client.api.inspect_container(inst.instance_id)["State"]["Status"] == "created"  # not started
        cold = provider_module.DockerProvider(state_dir=kit.docker.state_dir, cache_tag=kit.runner_tag, workers=4)
        try:  # the mark is on disk: a provider built later refuses too
            with pytest.raises(SandboxProviderFailed, match="may be partly written"):
                await cold.activate(ActivateRequest(**call))
        finally:
            cold.close()
        await _write(kit, call, "/workspace/big", good)  # written again, whole: the mark goes
        await kit.provider.activate(ActivateRequest(**call))
        assert (await _cat(kit, call, "sha256sum /workspace/big")).split()[0].decode() == sha(good)[7:]
    finally:
        await kit.provider.release(ReleaseRequest(**call))
    assert not list((Path(kit.docker.state_dir) / "staging").glob(f"{inst.instance_id}~*"))


async def test_the_sandbox_starts_while_the_last_files_go_up_and_an_upload_that_fails_stops_it_again(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``activate`` starts the sandbox while it uploads what the spool still holds (nothing of the sandbox user's
    runs before it returns); when that upload fails, the sandbox is stopped again, and released whole."""
    files = {"a.txt": b"first\n", "b.txt": b"second\n"}
    key, inst = await kit.provision("start-beside", mounts=(_plan("/workspace", files),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    seen: list[str] = []
    upload = writes.StagedWrites._upload_segment

    def watched(self: writes.StagedWrites, stager: str, segment: Path) -> None:
        seen.append(segment.name)
        upload(self, stager, segment)

    monkeypatch.setattr(writes.StagedWrites, "_upload_segment", watched)
    try:
        await _write(kit, call, "/workspace/a.txt", files["a.txt"])
        await _write(kit, call, "/workspace/b.txt", files["b.txt"])
        await kit.provider.activate(ActivateRequest(**call))
        assert seen, "activate uploaded nothing: the files were not left in the spool"
        out = await kit.provider.exec(
            ExecRequest(
                **call, argv=["cat", "/workspace/a.txt", "/workspace/b.txt"], timeout_ms=10_000, max_output_bytes=1024
            )
        )
        assert out.stdout == b"first\nsecond\n"
        assert not kit.client.containers.list(all=True, filters={"name": L.stager_name(inst.instance_id)})
    finally:
        await kit.provider.release(ReleaseRequest(**call))

    key, inst = await kit.provision("start-beside-fails", mounts=(_plan("/workspace", files),))
    call = {"target": kit.target, "lease": LEASE, "allocation_key": key, "instance_id": inst.instance_id}
    try:
        await _write(kit, call, "/workspace/a.txt", files["a.txt"])  # spooled: it goes up at activate
        kit.client.api.remove_container(L.stager_name(inst.instance_id), force=True)  # behind the provider's back
        with pytest.raises(SandboxProviderFailed, match="activate: uploading staged files"):
            await kit.provider.activate(ActivateRequest(**call))
        state = kit.client.api.inspect_container(inst.instance_id)["State"]
        assert not state["Running"], state
    finally:
        await kit.provider.release(ReleaseRequest(**call))
    assert not [x for x in leftovers(kit.client, kit.runner_tag) if x[2] == key]
