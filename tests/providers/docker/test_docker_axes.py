"""Every enforcement axis, proved twice: from outside (what ``docker inspect`` reports) and from inside
(the effect a sandbox process meets).

Each probe from inside has its positive control (``docker_kit.control``): the same probe in a plain container
of the same image with only the setting under test removed gets through, so the sandbox's refusal is the
setting's doing. The escape attempts of ``test_docker_escapes.py`` and the oracle of ``test_docker_posture.py``
complete these.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import docker.types
import pytest
from docker_kit import Box, Kit, control

from checkfu.providers.docker import labels as L
from checkfu.providers.docker.spec import split_disk

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

README = b"hello\n"
MIB = 1 << 20


@pytest.fixture(scope="module")
def box(kit: Kit) -> Iterator[Box]:
    b = asyncio.run(kit.up("hardened", files={"/workspace/README": README}))
    yield b
    asyncio.run(b.release())


@pytest.fixture(scope="module")
def info(box: Box, client: Any) -> dict[str, Any]:
    return dict(client.api.inspect_container(box.instance_id))


# sandbox_isolation ------------------------------------------------------------------------


def test_isolation_outside(info: dict[str, Any], client: Any) -> None:
    host = info["HostConfig"]
    assert host["PidMode"] in ("", "private") and host["UTSMode"] == "" and host["IpcMode"] == "private"
    assert host["NetworkMode"] == "none" and host["Privileged"] is False
    assert not any("unconfined" in o for o in host.get("SecurityOpt") or [])
    assert host["Init"] is True
    assert any(o.startswith("name=seccomp") for o in client.info()["SecurityOptions"])


async def test_isolation_inside(box: Box, kit: Kit) -> None:
    namespaces = await kit.docker.namespaces()
    r = await box.sh(
        "for n in mnt pid net ipc uts user; do readlink /proc/self/ns/$n; done; grep Seccomp: /proc/self/status"
    )
    lines = r.stdout.decode().split("\n")
    inside = dict(zip(("mnt", "pid", "net", "ipc", "uts", "user"), lines[:6], strict=True))
    for ns, link in inside.items():
        own = link != os.readlink(f"/proc/self/ns/{ns}")
        assert own == (ns in namespaces), ns
    assert set(namespaces) >= {"mnt", "pid", "net", "ipc", "uts"}
    envelope = (await kit.provider.describe()).envelope
    assert envelope.user_namespace == ("user" in namespaces), "the envelope says whether root inside is host root"
    assert lines[6].split() == ["Seccomp:", "2"]
    ps = await box.sh("ps -o pid,args")
    assert b"docker-init" in ps.stdout and len(ps.stdout.splitlines()) < 8, "only the sandbox's own processes"
    assert (await box.exec("hostname")).stdout == b"sandbox\n"


# root_read_only ---------------------------------------------------------------------------


def test_root_read_only_outside(info: dict[str, Any]) -> None:
    assert info["HostConfig"]["ReadonlyRootfs"] is True


ROOT_WRITES = "touch /etc/x; touch /x; touch /usr/bin/x; touch /var/tmp/x && echo wrote; grep ' / ' /proc/mounts"


async def test_root_read_only_inside(box: Box, kit: Kit) -> None:
    r = await box.sh(ROOT_WRITES)
    assert r.stderr.count(b"Read-only file system") == 4 and b"wrote" not in r.stdout
    assert r.stdout.split()[3].split(b",")[0] == b"ro"
    # control: without the read-only root the world-writable /var/tmp of the image takes the file
    code, out = control(kit, ["sh", "-c", ROOT_WRITES], without=("read_only",))
    assert b"wrote" in out and b"Read-only file system" not in out, (code, out)


# non_root ---------------------------------------------------------------------------------


def test_non_root_outside(info: dict[str, Any]) -> None:
    assert info["Config"]["User"] == "1000:1000" and info["HostConfig"]["GroupAdd"] == ["1000"]


async def test_non_root_inside(box: Box) -> None:
    r = await box.sh("id -u; id -g; id -G; grep ^Uid: /proc/1/status")
    uid, gid, groups, pid1 = r.stdout.decode().splitlines()
    assert uid == "1000" and pid1.split()[1:] == ["1000"] * 4
    # each process under a group of its own (no process may trace another), the sandbox user's group added
    assert gid not in ("0", "1000") and "1000" in groups.split() and "0" not in groups.split(), (gid, groups)
    again = await box.sh("id -g")
    assert again.stdout.decode().strip() not in (gid, "1000")


# no_new_privileges ------------------------------------------------------------------------


def test_no_new_privileges_outside(info: dict[str, Any]) -> None:
    assert "no-new-privileges" in info["HostConfig"]["SecurityOpt"]


async def test_no_new_privileges_inside(box: Box, client: Any, kit: Kit) -> None:
    r = await box.sh("euid; grep NoNewPrivs /proc/self/status")
    assert b"euid=1000" in r.stdout and b"NoNewPrivs:\t1" in r.stdout
    # the probe can fail: the same setuid-root binary, without no-new-privileges, yields euid 0
    control = client.containers.run(
        kit.image,
        ["euid"],
        user="1000:1000",
        cap_drop=["ALL"],
        network_mode="none",
        remove=True,
        labels={L.RUNNER_TAG: kit.runner_tag, L.ALLOCATION_KEY: "control"},
    )
    assert b"euid=0" in control


# capabilities_dropped ---------------------------------------------------------------------


def test_capabilities_outside(info: dict[str, Any]) -> None:
    assert info["HostConfig"]["CapDrop"] == ["ALL"] and not info["HostConfig"]["CapAdd"]


async def test_capabilities_inside(box: Box, kit: Kit) -> None:
    r = await box.sh("grep ^Cap /proc/self/status; grep ^CapEff /proc/1/status")
    caps = dict(line.split(":\t") for line in r.stdout.decode().splitlines())
    assert {caps[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}
    # control: without CapDrop the engine's default set bounds the process (root in it holds it effective)
    _, out = control(kit, ["grep", "^CapBnd", "/proc/self/status"], without=("cap_drop",))
    assert int(out.split()[1], 16) != 0, out


# mounts_sealed ----------------------------------------------------------------------------


def test_mounts_sealed_outside(info: dict[str, Any], client: Any, box: Box) -> None:
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/workspace"]["RW"] is False and mounts["/workspace"]["Type"] == "volume"
    assert not client.containers.list(all=True, filters={"name": L.stager_name(box.instance_id)}, ignore_removed=True)


async def test_mounts_sealed_inside(box: Box, kit: Kit) -> None:
    r = await box.sh(
        "cat /workspace/README; echo x > /workspace/README; echo y > /workspace/new; rm /workspace/README;"
        " mount -o remount,rw /workspace; grep ' /workspace ' /proc/mounts"
    )
    assert r.stdout.startswith(README)
    assert r.stderr.count(b"Read-only file system") == 3
    assert b" ro," in r.stdout and (await box.exec("cat", "/workspace/README")).stdout == README
    # control: the sandbox's own mount volume, mounted read-write for the same user, takes a write to the
    # staged file (the same bytes again, so the sandbox's README stays as it was)
    volume = docker.types.Mount("/workspace", L.mount_volume(box.instance_id, 0), type="volume", read_only=False)
    code, out = control(kit, ["sh", "-c", "echo hello > /workspace/README && echo wrote"], mounts=[volume])
    assert (code, out) == (0, b"wrote\n")
    assert (await box.exec("cat", "/workspace/README")).stdout == README


# disk_limit -------------------------------------------------------------------------------


def test_disk_limit_outside(info: dict[str, Any], client: Any, kit: Kit) -> None:
    sizes = {}
    for m in info["Mounts"]:
        if m["RW"]:
            opts = client.api.inspect_volume(m["Name"])["Options"]
            assert opts["type"] == "tmpfs"
            size = next(o for o in opts["o"].split(",") if o.startswith("size="))
            sizes[m["Destination"]] = int(size.removeprefix("size=").removesuffix("k"))
    assert sizes == {a.path: a.size_kib for a in split_disk(16, kit.docker.user)}
    assert sum(sizes.values()) == 16 * 1024
    assert info["HostConfig"]["LogConfig"]["Type"] == "none"
    assert {u["Name"]: u["Hard"] for u in info["HostConfig"]["Ulimits"]}["msgqueue"] == 0


async def test_disk_limit_inside(box: Box, kit: Kit) -> None:
    probe = await box.sh(
        "for m in $(awk '$4 ~ /^rw/ {print $2}' /proc/mounts); do"
        ' if touch "$m/.probe" 2>/dev/null; then rm -f "$m/.probe"; echo "$m"; fi; done'
    )
    writable = set(probe.stdout.decode().split())
    areas = {a.path: a.size_kib for a in split_disk(16, kit.docker.user)}
    assert writable == set(areas), "every writable path is a size-limited area"
    for path, kib in areas.items():
        r = await box.sh(
            f"dd if=/dev/zero of={path}/fill bs=1024 count={kib + 256} 2>&1; echo rc=$?; du -k {path}/fill"
        )
        assert b"No space left on device" in r.stdout and b"rc=0" not in r.stdout, path
        assert int(r.stdout.split()[-2]) <= kib
        await box.sh(f"rm -f {path}/fill")
    # control: the same write into a memory-backed /tmp without a size succeeds
    kib = areas["/tmp"]
    code, out = control(
        kit,
        ["sh", "-c", f"dd if=/dev/zero of=/tmp/fill bs=1024 count={kib + 256} 2>&1; echo rc=$?"],
        tmpfs={"/tmp": "mode=1777"},
    )
    assert code == 0 and b"rc=0" in out, out


# network_policy ---------------------------------------------------------------------------


def test_network_outside(info: dict[str, Any]) -> None:
    assert info["HostConfig"]["NetworkMode"] == "none"
    assert list(info["NetworkSettings"]["Networks"]) == ["none"]


async def test_network_inside(box: Box, kit: Kit) -> None:
    r = await box.sh("ls /sys/class/net; tail -n +3 /proc/net/dev | cut -d: -f1")
    assert r.stdout.split() == [b"lo", b"lo"]
    # control: without NetworkMode none the same listing shows more than lo (the host's, here)
    _, out = control(kit, ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"], network_mode="host")
    assert set(out.split()) - {b"lo"}, out
    routes = await box.sh("tail -n +2 /proc/net/route; tail -n +1 /proc/net/ipv6_route 2>/dev/null | grep -v ' lo$'")
    assert routes.stdout == b"", "no route leads anywhere but loopback"


# resource_limits --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(kit: Kit) -> Iterator[Box]:
    b = asyncio.run(kit.up("limits", profile=kit.profile(cpu_millis=250, memory_mib=64, pids=32)))
    yield b
    asyncio.run(b.release())


def test_limits_outside(limited: Box, client: Any) -> None:
    host = client.api.inspect_container(limited.instance_id)["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == 64 * MIB
    assert host["NanoCpus"] == 250_000_000 and host["PidsLimit"] == 32


BOMB = "i=0; while [ $i -lt 100 ]; do sleep 2 & i=$((i+1)); done; wait"


async def test_fork_bomb_stops_at_the_pids_limit(limited: Box) -> None:
    r = await limited.sh(BOMB, timeout_ms=10_000)
    assert b"can't fork" in r.stderr and not r.timed_out
    await asyncio.sleep(2.5)
    after = await limited.sh("ps -o pid | wc -l")
    assert after.exit_code == 0 and int(after.stdout) < 10, "the sandbox recovers once the bomb's children end"


def test_the_same_bomb_without_a_pids_limit_forks_every_child(kit: Kit) -> None:
    code, out = control(kit, ["sh", "-c", f"{BOMB} 2>&1; echo done"])
    assert code == 0 and b"can't fork" not in out and out.endswith(b"done\n"), out


async def test_memory_hog_is_oom_killed(limited: Box, client: Any) -> None:
    since = int(time.time()) - 1
    r = await limited.sh("head -c 200000000 /dev/zero | tail > /dev/null", timeout_ms=30_000)
    assert r.exit_code == 137 and not r.timed_out
    events = client.events(
        since=since, until=int(time.time()) + 1, filters={"container": limited.instance_id, "event": "oom"}, decode=True
    )
    assert any(e.get("status") == "oom" or e.get("Action") == "oom" for e in events)
    ok = await limited.sh("head -c 30000000 /dev/zero | tail > /dev/null")
    assert ok.exit_code == 0, "30 MB fits in 64 MiB"


def test_the_same_hog_without_a_memory_limit_completes(kit: Kit) -> None:
    code, out = control(kit, ["sh", "-c", "head -c 200000000 /dev/zero | tail > /dev/null; echo rc=$?"])
    assert (code, out) == (0, b"rc=0\n")


SPIN = (
    "f=/sys/fs/cgroup/cpu/cpu.stat; [ -f $f ] || f=/sys/fs/cgroup/cpu.stat;"
    " end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done; grep nr_throttled $f"
)


async def test_cpu_is_throttled(limited: Box, kit: Kit) -> None:
    r = await limited.sh(SPIN, timeout_ms=10_000)
    assert int(r.stdout.split()[1]) > 0
    # control: the same spin without a CPU quota is never throttled
    code, out = control(kit, ["sh", "-c", SPIN])
    assert code == 0 and int(out.split()[1]) == 0, out
