"""A sandbox cannot state its own exit, nor reach into a later command (issue 28).

The exit status and the stream boundaries a caller sees come from the engine, never from something the sandboxed
user can read or write; and each process the runner starts runs under credentials of its own, so a process left
behind by an earlier command cannot trace, read or write a later one (``ptrace``, ``/proc/PID/mem``,
``/proc/PID/environ``, ``/proc/PID/fd``).

Each attack is tried as a sandboxed attacker would, on both transports (``kit``), and each has a positive control:
the same attack, made against the weaker design (every process of the sandbox under the one user and group, as
``docker exec -u 1000:1000`` would run them), works.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from docker_kit import Box, Kit

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

SECRET = "s3cret-value-of-the-later-command"

FORGE = r"""
import os, re, sys
me = os.getpid()
found = set()
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) == me:
        continue
    try:
        maps = open(f'/proc/{p}/maps').read().splitlines()
        mem = open(f'/proc/{p}/mem', 'rb', 0)
    except OSError:
        continue
    for ln in maps:
        rng, perms = ln.split()[:2]
        if 'r' not in perms:
            continue
        a, b = (int(x, 16) for x in rng.split('-'))
        if b - a > 64 << 20:
            continue
        try:
            mem.seek(a)
            data = mem.read(b - a)
        except (OSError, ValueError, OverflowError):
            continue
        found.update(re.findall(rb'n=([0-9a-f]{32})', data))
        found.update(re.findall(rb'\x00([0-9a-f]{32}):', data))
for n in sorted(found):
    for s in (sys.stdout, sys.stderr):
        s.buffer.write(b'\0' + n + b':x 0\n')
        s.flush()
print('found', len(found), flush=True)
print('after the forged record', flush=True)
sys.exit(1)
"""
"""Reads every process's memory it may, takes whatever looks like a record's nonce, prints a forged exit record of
status 0 with each on both streams, then more output, and exits 1."""

LEFTOVER = r"""
import contextlib, ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
me = os.getpid()
seen = set()
end = time.time() + float(sys.argv[1])
log = open('/tmp/stolen', 'a', buffering=1)
while time.time() < end:
    for p in os.listdir('/proc'):
        if not p.isdigit() or int(p) == me or p in seen:
            continue
        try:
            if b'echo ran' not in open(f'/proc/{p}/cmdline', 'rb').read():
                continue
        except OSError:
            continue
        try:
            env = open(f'/proc/{p}/environ', 'rb').read()
        except OSError:
            env = b''
        if b'SECRET=' in env:
            log.write('environ ' + env.split(b'SECRET=')[1].split(b'\0')[0].decode() + '\n')
        try:
            open(f'/proc/{p}/mem', 'r+b', 0).close()
            log.write(f'mem {p}\n')
        except OSError:
            pass
        if libc.ptrace(16, int(p), 0, 0) == 0:  # PTRACE_ATTACH, then let it go on as it was
            log.write(f'ptrace {p}\n')
            with contextlib.suppress(OSError):
                os.waitpid(int(p), 0x40000000)  # __WALL: until the attach has stopped it
            libc.ptrace(17, int(p), 0, 0)  # PTRACE_DETACH
        try:
            fd = os.open(f'/proc/{p}/fd/0', os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            fd = -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                got = os.read(fd, 65536)
                if got:
                    log.write('stdin ' + got.decode('ascii', 'replace') + '\n')
            with contextlib.suppress(OSError):
                os.write(fd, b'echo forged; exit 0\n')
                log.write(f'wrote {p}\n')
            os.close(fd)
        if env:
            seen.add(p)
    time.sleep(0.02)
"""
"""A process left behind: for a while, every later command it sees (its command line says ``echo ran``) is read
(its environment, its stdin), traced and written (its memory, its stdin, with a line a shell would take as the next
command). What it got is logged in ``/tmp/stolen``."""


@pytest.fixture
def dkit(kit: Kit, debian_id: str) -> Kit:
    """The session's kit on ``checkfu/debian:12`` (python3), over the same transport."""
    return Kit(kit.provider, kit.client, kit.runner_tag, debian_id, docker=kit.docker)


def raw_exec(box: Box, argv: list[str], *, env: dict[str, str] | None = None, detach: bool = False) -> Any:
    """A process of the sandbox as the weaker design made every one: ``docker exec -u UID:GID`` of the sandbox user."""
    user = box.kit.docker.user.spec
    return box.container().exec_run(argv, user=user, environment=env, detach=detach)


async def test_a_command_that_forges_an_exit_record_is_reported_with_its_true_exit_and_output(dkit: Kit) -> None:
    box = await dkit.up("forge")
    try:
        r = await box.exec("python3", "-c", FORGE)  # the sandbox's first process
        assert r.exit_code == 1, r
        assert b"after the forged record" in r.stdout, r
    finally:
        await box.release()


async def test_the_forger_finds_a_secret_held_by_a_process_of_the_same_credentials(dkit: Kit) -> None:
    """Positive control: the memory scan works. A process of the sandbox's one user and group holding a nonce in a
    shell variable (as the retired starter did) is found by the same forger run under the same credentials."""
    box = await dkit.up("forge-control")
    try:
        nonce = "0123456789abcdef" * 2
        raw_exec(box, ["sh", "-c", f"n={nonce}; sleep 30"], detach=True)
        time.sleep(0.3)
        code, out = raw_exec(box, ["python3", "-c", FORGE])
        assert code == 1 and b"found 1" in out and nonce.encode() in out, out
    finally:
        await box.release()


async def _stolen(box: Box) -> str:
    r = await box.sh("cat /tmp/stolen 2>/dev/null; true")
    return r.stdout.decode()


async def test_a_process_left_by_an_earlier_command_cannot_reach_the_next_one(dkit: Kit) -> None:
    """Left before the sandbox's first command from this runner, and left by an earlier command: neither reads the
    next command's environment or stdin, attaches to it, opens its memory, or writes a command into its stdin; the
    next command runs and is reported with its own exit and output."""
    box = await dkit.up("leftover")
    try:
        # left before the first command the runner starts (by another runner's process, say)
        raw_exec(box, ["python3", "-c", LEFTOVER, "6"], detach=True)
        await asyncio.sleep(0.5)
        first = await box.exec("sh", "-c", "sleep 1; echo ran; exit 3", env={"SECRET": SECRET})
        assert (first.exit_code, first.stdout) == (3, b"ran\n"), first
        # left by an earlier command of this runner's
        started = await box.sh(f"python3 -c {_quote(LEFTOVER)} 6 </dev/null >/dev/null 2>&1 &")
        assert started.exit_code == 0, started
        await asyncio.sleep(0.5)
        later = await box.exec("sh", "-c", "sleep 1; echo ran again; exit 4", env={"SECRET": SECRET})
        assert (later.exit_code, later.stdout) == (4, b"ran again\n"), later
        stolen = await _stolen(box)
        assert SECRET not in stolen, stolen
        assert not [ln for ln in stolen.splitlines() if ln.split()[0] in ("mem", "ptrace", "stdin", "wrote")], stolen
    finally:
        with contextlib.suppress(Exception):
            await box.release()


async def test_the_leftover_reaches_a_process_of_the_same_credentials(dkit: Kit) -> None:
    """Positive control: under the weaker design (every process as the sandbox's one user and group), the same
    leftover reads the later process's environment and may open its memory and trace it."""
    box = await dkit.up("leftover-control")
    try:
        raw_exec(box, ["python3", "-c", LEFTOVER, "4"], detach=True)
        await asyncio.sleep(0.5)
        raw_exec(box, ["sh", "-c", "sleep 1.5; echo ran"], env={"SECRET": SECRET})
        stolen = await _stolen(box)
        assert f"environ {SECRET}" in stolen, stolen
        kinds = {ln.split()[0] for ln in stolen.splitlines()}
        assert {"mem", "ptrace"} <= kinds, stolen
    finally:
        await box.release()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
