"""Escape attempts from inside a Docker-tier sandbox, each with its positive control.

Each probe runs twice: in the sandbox, where it must be blocked, and in a plain container of the same image
(``docker_kit.control``: the sandbox's hardening flags as ``docker run`` spells them, labelled with this
session's runner tag and removed after) with only the setting under test removed, where the same probe must
succeed. A probe that needs more than one setting gone says which, and shows that each alone blocks it. So a
blocked probe means the setting blocked it, not that the probe could never work.

Traffic goes only to a destination in a network namespace this module makes (``destinations.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from docker_kit import Box, Kit, control

from checkfu.conformance.destinations import Destination, destination

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

RAW_SOCKET = "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('raw socket open')"


@pytest.fixture(scope="module")
def dkit(kit: Kit, debian_id: str) -> Kit:
    """The session's kit on ``checkfu/debian:12`` (python3, util-linux), over the same transport."""
    return Kit(kit.provider, kit.client, kit.runner_tag, debian_id, docker=kit.docker)


@pytest.fixture(scope="module")
def box(dkit: Kit) -> Iterator[Box]:
    b = asyncio.run(dkit.up("escapes", profile=dkit.profile(memory_mib=128, disk_mib=32)))
    yield b
    asyncio.run(b.release())


async def test_seccomp_blocks_a_user_namespace_and_unconfined_lets_it(box: Box, dkit: Kit) -> None:
    """``unshare -Ur`` (a user namespace: the way into most kernel attack surface) is refused by the seccomp
    filter; the same user with ``seccomp=unconfined`` becomes root in a namespace of its own."""
    blocked = await box.sh("unshare -Ur id -u")
    assert blocked.exit_code != 0 and b"Operation not permitted" in blocked.stderr
    code, out = control(dkit, ["unshare", "-Ur", "id", "-u"], security_opt=["no-new-privileges", "seccomp=unconfined"])
    assert (code, out) == (0, b"0\n")


async def test_the_pid_namespace_hides_the_runner_and_the_hosts_shows_it(box: Box, dkit: Kit) -> None:
    probe = f"test -r /proc/{os.getpid()}/cmdline && tr '\\0' ' ' < /proc/{os.getpid()}/cmdline"
    blocked = await box.sh(probe)
    assert blocked.exit_code != 0 and b"pytest" not in blocked.stdout
    code, out = control(dkit, ["sh", "-c", probe], pid_mode="host")
    assert code == 0 and b"pytest" in out


async def test_the_uts_namespace_keeps_the_hosts_name_out(box: Box, dkit: Kit) -> None:
    host = os.uname().nodename.encode()
    assert (await box.exec("hostname")).stdout.strip() != host
    code, out = control(dkit, ["hostname"], uts_mode="host")
    assert (code, out.strip()) == (0, host)


async def test_non_root_cannot_read_the_shadow_file_and_root_can(box: Box, dkit: Kit) -> None:
    """Root without a single capability still owns ``/etc/shadow``: only the user keeps it out."""
    blocked = await box.exec("cat", "/etc/shadow")
    assert blocked.exit_code != 0 and b"Permission denied" in blocked.stderr
    code, out = control(dkit, ["cat", "/etc/shadow"], without=("user",))
    assert code == 0 and out.startswith(b"root:")


async def test_dropped_capabilities_keep_even_root_from_a_raw_socket(box: Box, dkit: Kit) -> None:
    """A raw packet socket needs CAP_NET_RAW, so root as well as the sandbox's user: dropping every capability
    blocks it for root by itself, and root with the engine's default capabilities opens one."""
    blocked = await box.exec("python3", "-c", RAW_SOCKET)
    assert blocked.exit_code != 0 and b"PermissionError" in blocked.stderr
    root_without_caps = control(dkit, ["python3", "-c", RAW_SOCKET], without=("user",))
    assert root_without_caps[0] != 0 and b"PermissionError" in root_without_caps[1]
    code, out = control(dkit, ["python3", "-c", RAW_SOCKET], without=("user", "cap_drop"))
    assert (code, out) == (0, b"raw socket open\n")


async def test_the_read_only_root_refuses_a_world_writable_directory(box: Box, dkit: Kit) -> None:
    """``/var/tmp`` is mode 1777 in the image: only the read-only root keeps the sandbox's user from it."""
    blocked = await box.sh("echo x > /var/tmp/probe && cat /var/tmp/probe")
    assert blocked.exit_code != 0 and b"Read-only file system" in blocked.stderr
    code, out = control(dkit, ["sh", "-c", "echo x > /var/tmp/probe && cat /var/tmp/probe"], without=("read_only",))
    assert (code, out) == (0, b"x\n")


@pytest.fixture(scope="module")
def dest() -> Iterator[Destination]:
    if os.geteuid() != 0:
        pytest.skip("the destination lives in a network namespace of its own: run as root")
    with destination() as d:
        d.control()
        yield d


async def test_no_network_reaches_a_destination_and_the_hosts_does(box: Box, dkit: Kit, dest: Destination) -> None:
    """The destination counts every connection it accepts: none from the sandbox, one from the control."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
        "    print('connected', s.recv(64))\n"
        "except OSError as e:\n"
        "    print('failed', e); sys.exit(1)\n"
    )
    before = dest.count()
    blocked = await box.exec("python3", "-c", probe, dest.host, str(dest.port))
    assert blocked.exit_code == 1 and b"unreachable" in blocked.stdout.lower()
    assert dest.count() == before
    code, out = control(dkit, ["python3", "-c", probe, dest.host, str(dest.port)], network_mode="host")
    assert code == 0 and b"checkfu-destination" in out
    assert dest.count() == before + 1
