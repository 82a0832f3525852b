"""An independent posture oracle: what a sandbox process really is, read from the host's ``/proc``.

It trusts nothing a provider reports. Given a host pid (found through the engine or the
process table, never through the provider), it reads what the kernel says of that process:

- ``/proc/PID/status``: ``Uid``, ``Gid``, ``Groups``, every capability set, ``NoNewPrivs``, ``Seccomp``;
- ``/proc/PID/ns/*``: each namespace link, compared with the host's (``/proc/1/ns``, or this test
  process's own where pid 1's cannot be read);
- ``/proc/PID/mountinfo``: every mount with its per-mount and superblock options;
- ``/proc/PID/net/dev`` and ``net/route``: the interfaces and routes of its network namespace;
- ``/proc/PID/fd``: every open descriptor, with the identity (device, inode) of what it refers to;
- ``/proc/PID/cgroup`` and the cgroup files below the host's own cgroup mounts: the memory (and
  memory+swap) limit, the pids limit and the CPU quota, on cgroup v1 or v2.

``judge`` turns one posture into a finding per enforcement axis (does the control hold?), from the
profile the sandbox was asked for and the mount targets it was given; ``unchanged`` says whether an
axis of a process is exactly that of a reference process (the runner), which is how a tier that claims
nothing on an axis is checked: it really adds nothing there. The issue names gVisor's posture tests of its
own sandboxes as the model (read the sandbox's state from the host instead of asking the runtime); this code is
our own.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from checkfu.contract.enforcement import AXES, Axis
from checkfu.contract.profile import SandboxProfile

NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")
ISOLATING = ("mnt", "pid", "net", "ipc", "uts")
"""The namespaces ``sandbox_isolation`` needs of its own; ``user`` only where the envelope says so."""
CAP_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
PSEUDO_FS = frozenset({"proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2", "securityfs", "debugfs"})
"""Kernel interfaces, not storage: a rw mount of one of these is not a place a process writes files to."""
SECCOMP_FILTER = 2
UNLIMITED = -1

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


# the readings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    mount_point: str
    options: frozenset[str]
    """Per-mount options (``ro``/``rw``, ``nosuid``, ...)."""
    fstype: str
    source: str
    super_options: dict[str, str]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    @property
    def size_kib(self) -> int | None:
        """A tmpfs's ``size=`` in KiB, or ``None`` when it has none (or is not a tmpfs)."""
        size = self.super_options.get("size")
        if self.fstype != "tmpfs" or size is None:
            return None
        return _kib(size)


def _kib(text: str) -> int:
    units = {"k": 1, "m": 1024, "g": 1024 * 1024}
    if text and text[-1].lower() in units:
        return int(text[:-1]) * units[text[-1].lower()]
    return int(text) // 1024


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    out: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        supers: dict[str, str] = {}
        for opt in (tail[2] if len(tail) > 2 else "").split(","):
            name, _, value = opt.partition("=")
            supers[name] = value
        out.append(
            Mount(
                mount_point=_unescape(fields[4]),
                options=frozenset(fields[5].split(",")),
                fstype=tail[0],
                source=_unescape(tail[1]) if len(tail) > 1 else "",
                super_options=supers,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Descriptor:
    fd: int
    target: str
    """What ``readlink`` shows: a path, ``pipe:[N]``, ``socket:[N]``, ``anon_inode:...``."""
    identity: tuple[int, int] | None
    """(device, inode) of the open file, ``None`` if it could not be stat'ed."""
    mode: int


@dataclass(frozen=True)
class Limits:
    """Cgroup limits as the kernel holds them; ``UNLIMITED`` where there is none, ``None`` where unreadable."""

    memory_bytes: int | None
    memory_swap_bytes: int | None
    """Memory plus swap (v1 ``memsw``), or memory plus ``memory.swap.max`` (v2); ``None`` if not accounted."""
    pids: int | None
    cpu_quota_us: int | None
    cpu_period_us: int | None
    where: dict[str, str]
    """Controller to the cgroup directory each limit was read from."""

    @property
    def cpu_millis(self) -> int | None:
        if self.cpu_quota_us is None or self.cpu_period_us is None or self.cpu_quota_us == UNLIMITED:
            return None
        return self.cpu_quota_us * 1000 // self.cpu_period_us


@dataclass(frozen=True)
class Posture:
    pid: int
    comm: str
    uids: tuple[int, ...]
    gids: tuple[int, ...]
    groups: tuple[int, ...]
    caps: dict[str, int]
    no_new_privs: int
    seccomp: int
    namespaces: dict[str, str]
    mounts: tuple[Mount, ...]
    interfaces: tuple[str, ...]
    routes: tuple[str, ...]
    """IPv4 routes and IPv6 routes not on ``lo``, one line each."""
    descriptors: tuple[Descriptor, ...]
    cgroups: dict[str, str]
    limits: Limits

    @property
    def root(self) -> Mount:
        """The mount a process sees at ``/`` (the last one there: mounts stack)."""
        return [m for m in self.mounts if m.mount_point == "/"][-1]

    def mount_at(self, path: str) -> Mount | None:
        found = [m for m in self.mounts if m.mount_point == path]
        return found[-1] if found else None


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        out[name] = value.strip()
    return out


def namespaces_of(pid: int | str) -> dict[str, str]:
    out: dict[str, str] = {}
    for ns in NAMESPACES:
        try:
            out[ns] = os.readlink(f"/proc/{pid}/ns/{ns}")
        except FileNotFoundError:
            continue
    return out


def host_namespaces() -> dict[str, str]:
    """The host's namespaces: pid 1's, or (where the host keeps pid 1's links from us) this process's own,
    which the tests run in."""
    try:
        found = namespaces_of(1)
    except PermissionError:
        found = {}
    return found or namespaces_of("self")


def _interfaces(pid: int) -> tuple[str, ...]:
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return tuple(sorted(line.split(":", 1)[0].strip() for line in lines if ":" in line))


def _routes(pid: int) -> tuple[str, ...]:
    v4 = Path(f"/proc/{pid}/net/route").read_text().splitlines()[1:]
    try:
        v6 = Path(f"/proc/{pid}/net/ipv6_route").read_text().splitlines()
    except FileNotFoundError:
        v6 = []
    return tuple(v4 + [line for line in v6 if line.split()[-1:] != ["lo"]])


def _descriptors(pid: int) -> tuple[Descriptor, ...]:
    out: list[Descriptor] = []
    base = Path(f"/proc/{pid}/fd")
    for name in os.listdir(base):
        try:
            target = os.readlink(base / name)
        except FileNotFoundError:
            continue
        try:
            st = os.stat(base / name)
            identity: tuple[int, int] | None = (st.st_dev, st.st_ino)
            mode = st.st_mode
        except OSError:
            identity, mode = None, 0
        out.append(Descriptor(fd=int(name), target=target, identity=identity, mode=mode))
    return tuple(sorted(out, key=lambda d: d.fd))


# cgroups, read through the host's own mounts --------------------------------------------------


def _cgroup_membership(pid: int) -> dict[str, str]:
    """Controller (or ``""`` for the v2 unified hierarchy) to the cgroup path ``pid`` is in."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c.removeprefix("name=")] = path
    return out


def _host_cgroup_mounts() -> dict[str, tuple[Path, str]]:
    """Controller (``""`` for cgroup2) to (mount point, the cgroup its root shows), from this process's mounts."""
    out: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not tail:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup2":
            out.setdefault("", (point, root))
        elif tail[0] == "cgroup":
            for opt in tail[2].split(",") if len(tail) > 2 else []:
                out.setdefault(opt.removeprefix("name="), (point, root))
    return out


def _directory(mounts: Mapping[str, tuple[Path, str]], controller: str, path: str) -> Path | None:
    if controller not in mounts:
        return None
    point, root = mounts[controller]
    root = root.rstrip("/")
    if path != root and not path.startswith(root + "/") and root:
        return None
    return point / path[len(root) :].lstrip("/")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    value = int(text)
    return UNLIMITED if value >= (1 << 62) or value < 0 else value  # v1 writes "no limit" as a huge page-rounded number


def _limits(membership: Mapping[str, str]) -> Limits:
    mounts = _host_cgroup_mounts()
    where: dict[str, str] = {}

    def v1(controller: str) -> Path | None:
        d = _directory(mounts, controller, membership.get(controller, ""))
        if d is not None and controller in membership and d.is_dir():
            where[controller] = str(d)
            return d
        return None

    unified = _directory(mounts, "", membership.get("", "")) if "" in membership else None
    memory = pids = cpu_quota = cpu_period = swap = None
    mem_dir = v1("memory")
    if mem_dir is not None:
        memory = _read_int(mem_dir / "memory.limit_in_bytes")
        swap = _read_int(mem_dir / "memory.memsw.limit_in_bytes")
    elif unified is not None and (unified / "memory.max").exists():
        where["memory"] = str(unified)
        memory = _read_int(unified / "memory.max")
        extra = _read_int(unified / "memory.swap.max")
        if extra is not None and memory is not None:
            swap = UNLIMITED if UNLIMITED in (extra, memory) else memory + extra
    pids_dir = v1("pids")
    if pids_dir is not None:
        pids = _read_int(pids_dir / "pids.max")
    elif unified is not None and (unified / "pids.max").exists():
        where["pids"] = str(unified)
        pids = _read_int(unified / "pids.max")
    cpu_dir = v1("cpu")
    if cpu_dir is not None:
        cpu_quota = _read_int(cpu_dir / "cpu.cfs_quota_us")
        cpu_period = _read_int(cpu_dir / "cpu.cfs_period_us")
    elif unified is not None and (unified / "cpu.max").exists():
        where["cpu"] = str(unified)
        quota, period = (unified / "cpu.max").read_text().split()[:2]
        cpu_quota = UNLIMITED if quota == "max" else int(quota)
        cpu_period = int(period)
    return Limits(
        memory_bytes=memory,
        memory_swap_bytes=swap,
        pids=pids,
        cpu_quota_us=cpu_quota,
        cpu_period_us=cpu_period,
        where=where,
    )


def read(pid: int) -> Posture:
    """Everything the oracle knows of ``pid``, read from the host.

    Raises:
        ProcessLookupError: the process ended while it was read.
    """
    try:
        status = _status(pid)
        membership = _cgroup_membership(pid)
        return Posture(
            pid=pid,
            comm=Path(f"/proc/{pid}/comm").read_text().strip(),
            uids=tuple(int(x) for x in status["Uid"].split()),
            gids=tuple(int(x) for x in status["Gid"].split()),
            groups=tuple(int(x) for x in status.get("Groups", "").split()),
            caps={name: int(status[name], 16) for name in CAP_SETS},
            no_new_privs=int(status["NoNewPrivs"]),
            seccomp=int(status["Seccomp"]),
            namespaces=namespaces_of(pid),
            mounts=parse_mountinfo(Path(f"/proc/{pid}/mountinfo").read_text()),
            interfaces=_interfaces(pid),
            routes=_routes(pid),
            descriptors=_descriptors(pid),
            cgroups=membership,
            limits=_limits(membership),
        )
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessLookupError(pid) from None


def pids_in_namespace_of(pid: int) -> list[int]:
    """Every process of the host in the pid namespace ``pid`` is in (a container's init and all it runs,
    ``docker exec`` processes included)."""
    ns = os.readlink(f"/proc/{pid}/ns/pid")
    out: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") == ns:
                out.append(int(name))
        except OSError:
            continue
    return sorted(out)


def read_all(pids: Iterable[int]) -> list[Posture]:
    """The postures of those of ``pids`` still running."""
    out: list[Posture] = []
    for pid in pids:
        try:
            out.append(read(pid))
        except ProcessLookupError:
            continue
    return out


def runner_identities() -> set[tuple[int, int]]:
    """(device, inode) of every regular file, directory and socket this (the runner's) process holds open."""
    found: set[tuple[int, int]] = set()
    for d in _descriptors(os.getpid()):
        if d.identity is not None and (stat.S_ISREG(d.mode) or stat.S_ISDIR(d.mode) or stat.S_ISSOCK(d.mode)):
            found.add(d.identity)
    return found


# the judgement ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    holds: bool
    evidence: str


@dataclass(frozen=True)
class Asked:
    """What the sandbox was asked for: its profile and the targets of its mount plans."""

    profile: SandboxProfile
    mount_targets: tuple[str, ...] = ()
    user_namespace: bool = False
    """Whether the envelope claims a user namespace of the sandbox's own (root inside is not host root)."""


def _writable_by(posture: Posture, mount: Mount) -> bool:
    """Whether the sandbox's user could write at the top of ``mount``, a directory or a file (read through its
    root)."""
    try:
        st = os.stat(f"/proc/{posture.pid}/root{mount.mount_point}")
    except OSError:
        return False
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return False  # a device (a masked /proc file is /dev/null) stores nothing
    uid, gid = posture.uids[1], posture.gids[1]
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid == gid or st.st_gid in posture.groups:
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def writable_places(posture: Posture) -> list[Mount]:
    """Mounts (not kernel interfaces) mounted read-write whose top the sandbox's user may write to."""
    return [
        m
        for m in posture.mounts
        if not m.read_only and m.fstype not in PSEUDO_FS and _writable_by(posture, m) and m.mount_point != "/"
    ] + ([posture.root] if not posture.root.read_only else [])


def judge(posture: Posture, asked: Asked, host: Mapping[str, str]) -> dict[Axis, Finding]:
    """For each axis, whether its control holds for this process, with the evidence read."""
    ns = posture.namespaces
    limits = asked.profile.resource_limits
    shared = [n for n in ISOLATING if ns.get(n) == host.get(n)]
    user_own = ns.get("user") != host.get("user")
    isolation = not shared and posture.seccomp == SECCOMP_FILTER and user_own == asked.user_namespace
    own_mnt = ns.get("mnt") != host.get("mnt")
    places = writable_places(posture)
    sized = [m.size_kib for m in places]
    disk_total = sum(s for s in sized if s is not None)
    plan_mounts = {t: posture.mount_at(t) for t in asked.mount_targets}
    interfaces = set(posture.interfaces)
    lim = posture.limits
    memory = limits.memory_mib << 20
    resource = (
        lim.memory_bytes == memory
        and lim.memory_swap_bytes in (memory, None)
        and lim.pids == limits.pids
        and lim.cpu_millis == limits.cpu_millis
    )
    return {
        "sandbox_isolation": Finding(
            isolation,
            f"namespaces shared with the host: {shared or 'none'}; user namespace own: {user_own}; "
            f"Seccomp {posture.seccomp}",
        ),
        "root_read_only": Finding(posture.root.read_only, f"/ is {'ro' if posture.root.read_only else 'rw'}"),
        "non_root": Finding(
            0 not in posture.uids and 0 not in posture.gids and 0 not in posture.groups,
            f"Uid {posture.uids} Gid {posture.gids} Groups {posture.groups}",
        ),
        "no_new_privileges": Finding(posture.no_new_privs == 1, f"NoNewPrivs {posture.no_new_privs}"),
        "capabilities_dropped": Finding(
            all(posture.caps[c] == 0 for c in CAP_SETS), " ".join(f"{c} {posture.caps[c]:016x}" for c in CAP_SETS)
        ),
        "mounts_sealed": Finding(
            own_mnt and all(m is not None and m.read_only for m in plan_mounts.values()),
            f"own mount namespace: {own_mnt}; "
            + ", ".join(
                f"{t} {'missing' if m is None else ('ro' if m.read_only else 'rw')}" for t, m in plan_mounts.items()
            ),
        ),
        "disk_limit": Finding(
            own_mnt and posture.root.read_only and None not in sized and disk_total <= limits.disk_mib * 1024,
            f"writable places {[(m.mount_point, m.fstype, m.size_kib) for m in places]}; "
            f"{disk_total} KiB of {limits.disk_mib * 1024} asked",
        ),
        "network_policy": Finding(
            ns.get("net") != host.get("net") and interfaces <= {"lo"} and not posture.routes,
            f"interfaces {sorted(interfaces)}; routes {len(posture.routes)}; "
            f"own network namespace: {ns.get('net') != host.get('net')}",
        ),
        "resource_limits": Finding(
            resource,
            f"memory {lim.memory_bytes} (+swap {lim.memory_swap_bytes}) of {memory}; pids {lim.pids} of "
            f"{limits.pids}; cpu {lim.cpu_millis} of {limits.cpu_millis} millis; read from {lim.where}",
        ),
    }


def unchanged(posture: Posture, reference: Posture, axis: Axis) -> bool:
    """Whether ``posture`` is exactly ``reference`` on ``axis``: the tier added nothing there."""
    if axis == "sandbox_isolation":
        return posture.namespaces == reference.namespaces and posture.seccomp == reference.seccomp
    if axis == "root_read_only":
        return posture.namespaces.get("mnt") == reference.namespaces.get("mnt") and (
            posture.root.read_only == reference.root.read_only
        )
    if axis == "non_root":
        return (posture.uids, posture.gids) == (reference.uids, reference.gids)
    if axis == "no_new_privileges":
        return posture.no_new_privs == reference.no_new_privs
    if axis == "capabilities_dropped":
        return posture.caps == reference.caps
    if axis in ("mounts_sealed", "disk_limit"):
        # One mount namespace is one mount table: the same namespace is the same table by construction. Comparing
        # two readings of it, taken moments apart, would race with whatever else mounts on the host meanwhile (an
        # engine starting a container); a table that differs in the same namespace is only ever that race.
        return posture.namespaces.get("mnt") == reference.namespaces.get("mnt") and posture.root == reference.root
    if axis == "network_policy":
        # likewise one network namespace is one set of interfaces, while an engine adds and removes its own
        return posture.namespaces.get("net") == reference.namespaces.get("net")
    return posture.limits == reference.limits and posture.cgroups == reference.cgroups


def leaked(posture: Posture, runner: set[tuple[int, int]], *, inherited_pipes: bool = False) -> list[Descriptor]:
    """Descriptors of ``posture`` that carry something of the runner in: any beyond 0-2, and any file,
    directory or socket the runner itself holds open. ``inherited_pipes``: 0-2 may be pipes whose other end
    the runner holds (the host-process tier's streams), which are not files of the runner's."""
    out: list[Descriptor] = []
    for d in posture.descriptors:
        if d.fd > 2:
            out.append(d)
            continue
        is_file = stat.S_ISREG(d.mode) or stat.S_ISDIR(d.mode) or stat.S_ISSOCK(d.mode)
        a_stream = stat.S_ISFIFO(d.mode) or stat.S_ISCHR(d.mode) or stat.S_ISSOCK(d.mode)
        if (is_file and d.identity in runner) or not (inherited_pipes or a_stream):
            out.append(d)
    return out


@dataclass
class Report:
    """Per process, per axis, what was found; and the descriptors that leaked."""

    findings: dict[int, dict[Axis, Finding]] = field(default_factory=dict)
    leaks: dict[int, list[Descriptor]] = field(default_factory=dict)
    fields_checked: int = 0

    def failures(self, expected: Mapping[Axis, bool]) -> list[str]:
        out: list[str] = []
        for pid, per_axis in self.findings.items():
            for axis in AXES:
                f = per_axis[axis]
                if f.holds != expected[axis]:
                    out.append(f"pid {pid} {axis}: expected {'held' if expected[axis] else 'not held'}, {f.evidence}")
        for pid, descriptors in self.leaks.items():
            out.extend(f"pid {pid} fd {d.fd} -> {d.target} leaked in" for d in descriptors)
        return out


def examine(
    postures: Sequence[Posture], asked: Asked, *, inherited_pipes: bool = False, host: Mapping[str, str] | None = None
) -> Report:
    """Judge every posture on every axis and look for leaked descriptors."""
    host = host if host is not None else host_namespaces()
    runner = runner_identities()
    report = Report()
    for p in postures:
        report.findings[p.pid] = judge(p, asked, host)
        report.leaks[p.pid] = leaked(p, runner, inherited_pipes=inherited_pipes)
        report.fields_checked += FIELDS_PER_PROCESS
    return report


FIELDS_PER_PROCESS = len(
    (
        "Uid", "Gid", "Groups", *CAP_SETS, "NoNewPrivs", "Seccomp", *NAMESPACES, "mountinfo",
        "net/dev", "net/route", "fd", "memory", "memsw", "pids", "cpu",
    )
)  # fmt: skip
"""What the oracle reads of each process (``Report.fields_checked`` counts them)."""
