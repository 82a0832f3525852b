"""Starting one process tree of an instance, and ending it.

A process is started directly from its argv: no shell, unless the caller's argv
names one. Each starts a new session (so it leads its own process group and no
terminal signal of the runner reaches it) with every descriptor but its three
pipes closed. CPython 3.11 spawns with ``vfork`` and closes descriptors with
``close_range`` (or by listing ``/proc/self/fd``), never with a loop over the
open-file limit, so spawning costs the same under any ``RLIMIT_NOFILE``. The
environment is built from nothing: ``PATH``, ``HOME`` (the working directory)
and ``LANG``, then the request's own variables. Nothing of the runner's
environment (its credentials least of all) reaches the process.

With cgroups, the provider's spawner thread enters the instance's cgroups, forks
and leaves, so the process is born inside them (see ``cgroups`` and ``spawner``). Without, the tree is its
process group, recorded by leader pid and start time, and ending it signals
only processes that ``/proc`` shows in that group and started no earlier than
its leader, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from checkfu.providers.host_process import cgroups, procfs
from checkfu.providers.host_process.spawner import Spawner

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

START_FAILURES: dict[type[OSError], int] = {
    FileNotFoundError: 127,
    NotADirectoryError: 127,
    PermissionError: 126,
    IsADirectoryError: 126,
    BlockingIOError: 126,
}
"""A program that cannot be started exits as a shell would say: 127 not found, 126 cannot execute."""
START_FAILURE_ERRNOS: dict[int, int] = {errno.ENOEXEC: 126, errno.E2BIG: 126, errno.ENOMEM: 126, errno.ELOOP: 127}


class InstanceClosing(Exception):
    """The instance began releasing before the process could start."""


class PlacementFailed(OSError):
    """The instance's cgroups refused the spawning thread: the provider's fault, never the program's.

    It carries no errno, so ``start_failure`` never reads it as a program that cannot start.
    """


@dataclass(frozen=True, slots=True)
class Tree:
    """One spawned process and everything it starts."""

    popen: subprocess.Popen[bytes]
    start: int
    """Start time of the leader (``/proc/<pid>/stat`` field 22)."""
    spawn_dir: Path | None
    """Its freezer cgroup, when the instance has cgroups."""
    pty: int | None = None
    """The master side of its pseudo-terminal, when it was started with one (the stream owns it)."""

    @property
    def pid(self) -> int:
        return self.popen.pid


def process_env(workdir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a process: a minimal base, then the request's variables."""
    env = {"PATH": BASE_PATH, "HOME": str(workdir), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def start_failure(exc: OSError) -> int | None:
    """The exit status a start failure amounts to, or ``None`` when it is the provider's fault."""
    for kind, status in START_FAILURES.items():
        if isinstance(exc, kind):
            return status
    return START_FAILURE_ERRNOS.get(exc.errno or 0)


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: ``128 + n`` for death by signal ``n``."""
    return 128 - returncode if returncode < 0 else returncode


PIPE_BYTES = 1 << 20
"""The output pipes' capacity: a read takes up to this much (Linux's default, 64 KiB, costs one event-loop
turn per 64 KiB of output)."""
F_SETPIPE_SZ = 1031


TERMINAL_LAUNCHER = """
import errno, fcntl, os, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
argv = sys.argv[1:]
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    missing = isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.errno == errno.ELOOP
    os.write(2, f"checkfu host-process: cannot start {argv[0]!r}: {exc.strerror}\\r\\n".encode())
    os._exit(127 if missing else 126)
"""
"""Run in the child before its program: the terminal becomes its controlling terminal (a new session has none,
and ``subprocess`` cannot make one), then the program replaces it; a program that cannot start exits 127 or 126
with the reason, as ``start_failure`` says for a process started without a terminal."""


def set_window(fd: int, rows: int, cols: int) -> None:
    """Give the terminal of ``fd`` a window of ``rows`` by ``cols`` (its foreground group gets ``SIGWINCH``)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _popen_terminal(
    argv: tuple[str, ...], env: dict[str, str], cwd: str, size: tuple[int, int]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv`` on a new pseudo-terminal of ``size``; the process and the terminal's master side."""
    master, slave = os.openpty()
    try:
        set_window(slave, *size)
        os.set_blocking(master, False)
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", TERMINAL_LAUNCHER, *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            bufsize=0,
            close_fds=True,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return popen, master


def _popen(argv: tuple[str, ...], env: dict[str, str], cwd: str, stdin: bool) -> subprocess.Popen[bytes]:
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        close_fds=True,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    for pipe in (popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: keep the default
                fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
    return popen


def spawn_direct(
    argv: tuple[str, ...], env: dict[str, str], cwd: str, stdin: bool, tty: tuple[int, int] | None = None
) -> Tree:
    """Start a process in its own session, outside any cgroup (the process-group fallback).

    Raises:
        OSError: it could not be started.
    """
    if tty is not None:
        popen, master = _popen_terminal(argv, env, cwd, tty)
        return Tree(popen, procfs.start_time(popen.pid) or 0, None, master)
    popen = _popen(argv, env, cwd, stdin)
    return Tree(popen, procfs.start_time(popen.pid) or 0, None)


async def spawn_in_cgroups(
    spawner: Spawner,
    instance: cgroups.InstanceCgroups,
    home: Mapping[str, Path],
    closing: Callable[[], bool],
    argv: tuple[str, ...],
    env: dict[str, str],
    cwd: str,
    stdin: bool,
    tty: tuple[int, int] | None = None,
) -> Tree:
    """Start a process born inside ``instance``'s cgroups, forked by the spawner thread.

    If the awaiting call is cancelled, a process that started anyway is killed
    and reaped; its pipes are closed.

    Raises:
        InstanceClosing: the instance began releasing first.
        PlacementFailed: the instance's cgroups could not be made or entered.
        OSError: the process could not be started.
    """

    def start() -> Tree:
        with instance.lock:
            if closing():
                raise InstanceClosing
            try:
                spawn_dir = cgroups.CgroupHost.new_spawn_dir(instance)
            except OSError as exc:
                raise PlacementFailed(f"cannot make a cgroup in {instance.freezer}: {exc.strerror}") from exc
            entered = False
            master: int | None = None
            try:
                with cgroups.placed(instance, spawn_dir, home):
                    entered = True
                    if tty is not None:
                        popen, master = _popen_terminal(argv, env, cwd, tty)
                    else:
                        popen = _popen(argv, env, cwd, stdin)
            except BaseException as exc:
                cgroups.remove_spawn_dir(spawn_dir)
                if not entered and isinstance(exc, OSError):
                    raise PlacementFailed(f"cannot enter the instance's cgroups: {exc.strerror}") from exc
                raise
        return Tree(popen, procfs.start_time(popen.pid) or 0, spawn_dir, master)

    return await spawner.run(start, abandon=abandon)


def abandon(tree: Tree) -> None:
    """Kill a tree nobody waits for, reap its leader and close its pipes (blocking; a worker thread)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(tree.pid, signal.SIGKILL)
    for pipe in (tree.popen.stdin, tree.popen.stdout, tree.popen.stderr):
        if pipe is not None:
            pipe.close()
    if tree.pty is not None:
        with contextlib.suppress(OSError):
            os.close(tree.pty)
    tree.popen.wait()


# The process-group fallback ------------------------------------------------------------------


def group_members(pgid: int, leader_start: int) -> list[int]:
    """The running processes of the group that ``pgid`` led from ``leader_start``; none if the id was recycled.

    A signal-0 probe answers "no process has this group id" without a scan; only
    when something might be there is ``/proc`` read and every member checked.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # someone's group exists under this id; the scan decides whether any of it is ours
    leader = procfs.stat(pgid)
    if leader is not None and leader.start != leader_start:
        return []  # another process now holds the number: the group we recorded is gone
    own = os.getpid()
    return [p.pid for p in procfs.scan() if p.pgrp == pgid and p.running and p.start >= leader_start and p.pid != own]


def live_groups(groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The recorded groups that still have a running member (blocking: scans ``/proc``)."""
    return [(pgid, start) for pgid, start in groups if group_members(pgid, start)]


def end_groups(groups: Iterable[tuple[int, int]], *, grace: float, deadline: float = 10.0) -> bool:
    """End every recorded group: SIGTERM, up to ``grace`` seconds, then SIGKILL. Whether none is left.

    Blocks (it scans ``/proc`` and waits): call it from a worker thread.
    """
    recorded = list(groups)

    def alive() -> list[int]:
        return [pid for pgid, start in recorded for pid in group_members(pgid, start)]

    pids = alive()
    if not pids:
        return True
    if grace > 0:
        _signal(pids, signal.SIGTERM)
        if _wait_gone(alive, grace):
            return True
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        _signal(alive(), signal.SIGKILL)
        if _wait_gone(alive, 0.5):
            return True
    return not alive()


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(alive: Callable[[], list[int]], seconds: float) -> bool:
    stop = time.monotonic() + seconds
    delay = 0.002
    while alive():
        if time.monotonic() >= stop:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def end_tree_blocking(instance: cgroups.InstanceCgroups | None, tree: Tree, *, grace: float) -> bool:
    """End one spawned tree: its freezer cgroup when it has one, else its process group. Worker thread only."""
    if instance is not None and tree.spawn_dir is not None:
        return cgroups.end_tree(instance, tree.spawn_dir, grace=grace)
    return end_groups([(tree.pid, tree.start)], grace=grace)
