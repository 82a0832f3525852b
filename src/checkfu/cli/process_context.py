"""The process context a command inherits from the process it runs in: what the kernel gives a process, read from
``/proc``, and compared.

A start-up server's child runs a command with the server's context, not its caller's. So the server runs a command
only for a caller whose context is the same as its own, and refuses any other: that caller then runs the command in
its own process (``checkfu.cli.startup``). A caller confined by ``setpriv``, ``unshare``, ``ulimit``, ``nice`` and
the like keeps its confinement either way.

The server reads the caller's context itself (``read``), from ``/proc/<pid>`` of the process at the other end of
its socket (``SO_PEERCRED``): nothing the caller says is taken for it. What is read, per process:

- ``status``: user and group ids (all four), supplementary groups, the five capability sets, ``no_new_privs``,
  seccomp's mode and filter count, whether it is traced (a tracer may be its confinement), the processors and
  memory nodes it may use, and transparent huge pages.
- ``ns/*``: every namespace (an absent one is a value too); ``root``: its root directory (a ``chroot``).
- ``limits``: every resource limit, soft and hard.
- ``stat``: its nice value, scheduling policy and real-time priority; and ``ioprio_get``: its I/O priority.
- ``cgroup``, ``attr/current`` (its LSM label; none is a value too), ``oom_score_adj``, ``loginuid`` and
  ``sessionid`` (the audit trail's), and ``personality`` where the server may read it.

A reader of ``/proc/<pid>`` could read another process if the caller's ended and its process id was reused: the
directory is opened once and read through, the caller is checked to be alive after it was opened (its pidfd,
``SO_PEERPIDFD``, Linux 6.5) and to have started before its connection was accepted, and to be neither gone nor a
zombie once everything is read. A caller that cannot be read so is refused.

Whether the caller may look at the server at all, which a Landlock domain or an LSM forbids and ``/proc`` does not
show, the caller proves rather than says: it passes the server's proof file, a ``memfd`` no path names, opened again
through ``/proc/<server>/fd/N`` (``startup.proof``), which takes ptrace's read access; ``proves_access`` checks the
descriptor, and ``sees_server`` is its answer, never the caller's word. (Not ``/proc/<server>/environ``: the kernel
lets a process with ``CAP_PERFMON`` open that without ptrace's check, so root in a Landlock domain could.)

What the kernel shows only to the process itself (its securebits and memory-deny-write-execute) the client reports
(``startup.own_context``) and is compared too: an honest client's word, where the rest is the server's own read,
which a caller cannot lie about.

Seccomp filters: ``/proc`` shows a process's mode and the number of its filters, not what they are, so two stacks of
the same number may differ. A process under any filter is never taken to have the same context as another
(``differences``): a caller under a seccomp filter is always refused, and a server under one serves no command.

Not compared: what differs between any two processes (ids, memory, counters, the session and process group the
client's own process keeps), the signal mask and dispositions (the child sets its own, as ``checkfu`` does), the
autogroup (a server in a session of its own always has its own), keyrings and timer slack. The umask, working
directory, environment and streams are the client's own, passed with each request.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import platform
import signal
import socket
import time

from checkfu.cli import startup

NAMESPACES = (
    "cgroup",
    "ipc",
    "mnt",
    "net",
    "pid",
    "pid_for_children",
    "time",
    "time_for_children",
    "user",
    "uts",
)
STATUS = (
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
    "Cpus_allowed_list",
    "Mems_allowed_list",
    "THP_enabled",
)
"""The lines of ``/proc/<pid>/status`` compared (``TracerPid`` is compared as whether there is one)."""
FILES = ("limits", "cgroup", "oom_score_adj", "loginuid", "sessionid")
"""Files of ``/proc/<pid>`` compared whole. A kernel without one (no audit: no ``loginuid``) has it for no process."""
NO_LABEL = {2, 22, 95}
"""``attr/current`` errors that mean the process has no label (no such file, ``EINVAL``, ``EOPNOTSUPP``)."""
REPORTED = ("securebits", "mdwe", "personality")
"""What the client says of itself (``startup.own_context``), compared as ``own.NAME``."""
CLK_TCK = os.sysconf("SC_CLK_TCK")
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", None)
if SO_PEERPIDFD is None and not platform.machine().startswith(("alpha", "mips", "parisc", "sparc")):
    SO_PEERPIDFD = 77  # the generic number (Python 3.11 has no name for it)
IOPRIO_GET = {"x86_64": 252, "i386": 290, "i686": 290, "aarch64": 31, "riscv64": 31, "loongarch64": 31}.get(
    platform.machine()
)
"""``ioprio_get``'s system call number here; elsewhere the I/O priority is not read (for any process alike)."""


class Unreadable(Exception):
    """A process whose context cannot be read (gone, a zombie, or not this reader's to read); ``reason`` says
    which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read(pid: int, pidfd: int | None = None, started_by: float | None = None) -> dict[str, str]:
    """The context of process ``pid``, by name (``differences`` compares two).

    ``pidfd``: a pidfd of the process meant (the socket's peer): it must still be alive once its ``/proc``
    directory is open, so that the directory is its. ``started_by``: the boot-time clock
    (``CLOCK_BOOTTIME``) when its connection was accepted: a process started later is another one that took its id.

    Raises:
        Unreadable: the process is gone or a zombie, is not the one meant, or some part of it cannot be read.
    """
    try:
        fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unreadable(f"the process is gone ({exc.strerror})") from None
    try:
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except ProcessLookupError:
                raise Unreadable("the process is gone") from None
        state, start, scheduling = _stat(fd)
        if started_by is not None and start > started_by * CLK_TCK + 1:
            raise Unreadable("the process started after it connected: another took its id")
        context = _status(fd)
        context["scheduling"] = scheduling
        for name in NAMESPACES:
            try:
                context[f"ns.{name}"] = os.readlink(f"ns/{name}", dir_fd=fd)
            except FileNotFoundError:
                context[f"ns.{name}"] = "absent"
        root = os.stat("root", dir_fd=fd)
        context["root"] = f"{root.st_dev}:{root.st_ino}"
        for name in FILES:
            with contextlib.suppress(FileNotFoundError):
                context[name] = _read(fd, name)
        try:
            context["lsm"] = _read(fd, "attr/current")
        except OSError as exc:
            if exc.errno not in NO_LABEL:
                raise
            context["lsm"] = "none"
        with contextlib.suppress(PermissionError):  # ptrace's access (Yama may refuse it): the client says it
            context["personality"] = str(int(_read(fd, "personality"), 16))
        context["ioprio"] = _ioprio(pid)
        state, again, _ = _stat(fd)
        if again != start or state in "ZXx":
            raise Unreadable("the process ended while it was read")
        return context
    except OSError as exc:
        raise Unreadable(f"cannot read its /proc ({exc.strerror})") from None
    except (ValueError, IndexError):
        raise Unreadable("its /proc is not as this reader knows it") from None
    finally:
        os.close(fd)


def read_peer(conn: socket.socket, accepted: float) -> dict[str, str]:
    """The context of the process that connected ``conn`` (``SO_PEERCRED``), accepted at ``accepted``
    (``CLOCK_BOOTTIME``).

    Raises:
        Unreadable: as ``read``; or its process id is not one this process can see (another pid namespace's).
    """
    pid, _, _ = startup.UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, startup.UCRED.size))
    if pid <= 0:
        raise Unreadable("its process is not in this process's pid namespace")
    pidfd = None
    if SO_PEERPIDFD is not None:
        with contextlib.suppress(OSError):  # a kernel before 6.5: the start time alone tells a reused id
            pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    try:
        return read(pid, pidfd, accepted)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def with_report(context: dict[str, str], own: object, sees_server: bool) -> dict[str, str]:
    """``context`` with what its process said of itself (``startup.own_context``: not a dict, or a name missing, is
    a value that differs), and ``sees_server``: whether it proved it may look at the server (``proves_access``; the
    server's own context and its spare's have ``True``). Its personality is the process's word only when the reader
    may not read it."""
    said = own if isinstance(own, dict) else {}
    merged = dict(context)
    merged["sees_server"] = str(sees_server)
    for name in REPORTED:
        merged[f"own.{name}"] = repr(said.get(name, "unsaid"))
    if "personality" not in merged and isinstance(said.get("personality"), int):
        merged["personality"] = str(said["personality"])
    return merged


def proves_access(fd: int | None, own: int | None) -> bool:
    """Whether ``fd``, passed by a caller with its request (``startup.proof``), is this process's proof file
    ``own`` (a ``memfd`` it made, named ``startup.PROOF_NAME``) opened for reading: what only a process that may look
    at this one can open, through ``/proc/<pid>/fd/N`` (ptrace's read access, which a Landlock domain or an LSM
    denies to a process confined apart from this one). The same file (device and inode), and neither an
    ``O_PATH`` descriptor nor one for writing."""
    if fd is None or own is None:
        return False
    try:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_ACCMODE | os.O_PATH) != os.O_RDONLY:
            return False
        theirs, ours = os.fstat(fd), os.fstat(own)
        return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
    except OSError:
        return False


def filtered(context: dict[str, str]) -> bool:
    """Whether the process of ``context`` is under a seccomp filter (or in seccomp's strict mode)."""
    return context.get("Seccomp", "0") != "0" or context.get("Seccomp_filters", "0") != "0"


def differences(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The names whose values differ between two contexts, one side's missing name included; none: the same.

    Either side under a seccomp filter differs in ``Seccomp_filters`` whatever the other's: ``/proc`` shows how
    many filters a process has, not what they are, so two of the same number are not known to be the same."""
    names = {name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name)}
    if filtered(ours) or filtered(theirs):
        names.add("Seccomp_filters")
    return sorted(names)


def own_pid_is_procs() -> bool:
    """Whether ``/proc`` is this process's pid namespace's (``/proc/self`` is this process's id): else
    ``/proc/<pid>`` of a caller would be some other process."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _read(fd: int, name: str) -> str:
    f = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
    try:
        return os.read(f, 1 << 16).decode("utf-8", "surrogateescape")
    finally:
        os.close(f)


def _stat(fd: int) -> tuple[str, int, str]:
    """State, start time (clock ticks since boot) and scheduling (nice, policy, real-time priority)."""
    fields = _read(fd, "stat").rsplit(")", 1)[1].split()  # after the name, which may hold anything
    # fields[0] is the stat file's field 3: field N is fields[N - 3]
    return fields[0], int(fields[19]), f"nice={fields[16]} policy={fields[38]} rt={fields[37]}"


def _status(fd: int) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in _read(fd, "status").splitlines():
        name, _, value = line.partition(":")
        if name in STATUS:
            found[name] = " ".join(value.split())
        elif name == "TracerPid":
            found["traced"] = str(value.strip() != "0")
    return found


_libc: ctypes.CDLL | None = None


def _ioprio(pid: int) -> str:
    global _libc  # noqa: PLW0603 - loaded once, at the first read
    if IOPRIO_GET is None:
        return "not read here"
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    value = _libc.syscall(IOPRIO_GET, 1, pid)  # IOPRIO_WHO_PROCESS
    if value < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return str(value)
