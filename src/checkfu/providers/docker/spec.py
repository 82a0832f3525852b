"""The container a profile becomes: every flag that realizes an enforcement axis.

One function per object (area volume, mount volume, stager, sandbox), so each
flag a test checks with ``docker inspect`` is set in exactly one place:

- ``sandbox_isolation``: own mount, PID, network, IPC and UTS namespaces, the
  engine's default seccomp profile (never ``unconfined``), not privileged; a user
  namespace only where the engine runs with ``userns-remap``;
- ``root_read_only``: ``ReadonlyRootfs``;
- ``non_root``: ``User`` is the sandbox user (1000:1000 by default); each process the runner starts runs as
  that user under a group of its own, with the user's group added (``GroupAdd``, ``ProcessGroups``), so no
  process can trace or read another;
- ``no_new_privileges``: ``SecurityOpt: no-new-privileges``;
- ``capabilities_dropped``: ``CapDrop: ALL``;
- ``mounts_sealed``: every mount plan's volume is mounted read-only in the sandbox
  (it is written only through the stager, before activation); a ``writable`` plan
  (``:rw``) is no sealed mount but a writable area of its own (below);
- ``disk_limit``: every writable path is a size-limited tmpfs volume (created
  with the container, labelled, and removed with it), and
  together they are exactly ``disk_mib`` (``split_disk``; a writable mount plan is
  one of these areas, filled after start); POSIX message queues
  get no bytes (``RLIMIT_MSGQUEUE`` 0); the container's output goes to no log file;
- ``network_policy``: ``NetworkMode: none`` (only ``lo``) in every mode; with
  ``allowlist``, the proxy variables name ``127.0.0.1:3128``, where the egress
  door opens into the proxy that allows only the listed destinations
  (``egress.py``);
- ``resource_limits``: ``NanoCpus``, ``Memory`` and ``MemorySwap`` equal (swap is
  not extra), ``PidsLimit``.

The writable areas are memory-backed: their pages count against ``memory_mib``,
so a sandbox can never hold more than ``memory_mib`` of memory and files together.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import Any

import docker.types

from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxBoundExceeded, SandboxPathRejected
from checkfu.contract.mounts import MountPlan
from checkfu.contract.paths import is_within
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import egress
from checkfu.providers.docker import labels as L

RESERVED_ROOTS = ("/proc", "/sys", "/dev")
"""Kernel and device trees a mount may not be placed in (``/dev/shm`` is a writable area)."""


@dataclass(frozen=True)
class SandboxUser:
    uid: int
    gid: int
    home: str

    @property
    def spec(self) -> str:
        return f"{self.uid}:{self.gid}"

    @classmethod
    def parse(cls, user: str, home: str) -> SandboxUser:
        """``"1000:1000"`` (or ``"1000"``) and a home path.

        Raises:
            SandboxAdapterUnavailable: ``user`` is not ``uid:gid`` of positive integers (root is refused),
                or ``home`` is not an absolute path below ``/``; the option is the error's field.
        """
        uid_text, _, gid_text = user.partition(":")
        gid_text = gid_text or uid_text
        if not (uid_text.isdigit() and gid_text.isdigit() and int(uid_text) > 0 and int(gid_text) > 0):
            raise SandboxAdapterUnavailable(
                f"sandbox_user: {user!r} is not uid:gid of positive integers (never root)", field="sandbox_user"
            )
        if not home.startswith("/") or home == "/":
            raise SandboxAdapterUnavailable(f"home: {home!r} is not an absolute path below /", field="home")
        return cls(uid=int(uid_text), gid=int(gid_text), home=home.rstrip("/"))


class ProcessGroups:
    """A group id of its own for every process the runner starts in a sandbox, so no process can reach another.

    Every process runs as the sandbox user (``uid``) with the sandbox user's group among its supplementary groups
    (the container's ``GroupAdd``), but under a primary group of its own. The kernel lets one process trace another,
    open its ``/proc/PID/mem``, read its ``environ`` or reach its descriptors through ``/proc/PID/fd`` without a
    capability only when all their user ids *and* all their group ids are equal (``ptrace_may_access``): so a
    process left behind by an earlier command can neither read nor tamper with a later one, while both still own
    (as ``uid``) every file either made. Files made in a writable area still belong to the sandbox user's group:
    the areas' roots are set-group-id (``Area.driver_opts``).

    Ids are taken in turn from a random start, so two processes of one provider object never share one; two
    provider objects (two ``checkfu exec`` commands against one long-lived sandbox) collide with a chance of one in
    the span. Under ``userns-remap`` the span is what a remapped sandbox maps (below 65536); else a billion ids.
    """

    FIRST, SPAN = 1 << 30, 1 << 30
    REMAPPED_FIRST, REMAPPED_SPAN = 10_000, 50_000

    def __init__(self, *, remapped: bool) -> None:
        self.first, self.span = (self.REMAPPED_FIRST, self.REMAPPED_SPAN) if remapped else (self.FIRST, self.SPAN)
        self._turn = itertools.count(secrets.randbelow(self.span))

    def user(self, user: SandboxUser) -> str:
        """The ``uid:gid`` an exec of ``user`` is made as: the sandbox user, under a group of its own."""
        return f"{user.uid}:{self.first + next(self._turn) % self.span}"


@dataclass(frozen=True)
class Area:
    """One writable path: a tmpfs volume of ``size_kib``."""

    path: str
    size_kib: int
    mode: int
    owned: bool
    """Whether the sandbox user owns the root of the area (else root owns it, mode 1777)."""
    executable: bool

    def driver_opts(self, user: SandboxUser) -> dict[str, str]:
        """The tmpfs options: its root set-group-id to the sandbox user's group, so what any process makes there
        belongs to that group whatever the process's own (``ProcessGroups``)."""
        opts = [f"size={self.size_kib}k", f"mode={self.mode | 0o2000:04o}", "nosuid", "nodev"]
        if self.owned:
            opts += [f"uid={user.uid}", f"gid={user.gid}"]
        else:
            opts.append(f"gid={user.gid}")
        if not self.executable:
            opts.append("noexec")
        return {"type": "tmpfs", "device": "tmpfs", "o": ",".join(opts)}


PAGE_KIB = 4


def staged_kib(plan: MountPlan) -> int:
    """What a plan's files take in a tmpfs: whole pages per file (a symlink's target included)."""
    return sum(max(1, -(-f.size // (PAGE_KIB * 1024))) * PAGE_KIB for f in plan.files)


def split_disk(disk_mib: int, user: SandboxUser, writable: tuple[MountPlan, ...] = ()) -> tuple[Area, ...]:
    """The writable areas and their sizes; the sizes add up to exactly ``disk_mib``.

    ``/dev/shm`` gets a sixteenth, ``/tmp`` a quarter, the home directory the rest. With writable
    mount plans (``:rw``), half of ``disk_mib`` is theirs: each gets what its files take, and the
    rest of that half is shared equally among them (room to write); ``/tmp`` then gets an eighth
    and the home directory what is left.

    Raises:
        SandboxBoundExceeded: the writable mounts' files take more than half of ``disk_mib``, or
            the home directory would be left less than 1 MiB (naming ``disk_mib`` and what is needed).
    """
    total = disk_mib * 1024
    shm = max(1024, total // 16)
    rw: list[Area] = []
    if writable:
        share = total // 2
        needs = [staged_kib(p) for p in writable]
        if sum(needs) > share:
            want = -(-sum(needs) * 2 // 1024) + 1
            raise SandboxBoundExceeded(
                f"profile.resource_limits.disk_mib: the writable mounts' files take {sum(needs) // 1024} MiB, more "
                f"than half of disk_mib ({disk_mib} MiB); ask for disk_mib {want} or more",
                field="profile.resource_limits.disk_mib",
            )
        spare = share - sum(needs)
        for i, (plan, need) in enumerate(zip(writable, needs, strict=True)):
            extra = spare // len(writable) + (spare % len(writable) if i == len(writable) - 1 else 0)
            rw.append(Area(path=plan.target, size_kib=need + extra, mode=0o755, owned=True, executable=True))
        tmp = max(1024, total // 8)
        home = total - share - shm - tmp
    else:
        tmp = max(1024, total // 4)
        home = total - shm - tmp
    if home < 1024:
        raise SandboxBoundExceeded(
            f"profile.resource_limits.disk_mib: {disk_mib} MiB leaves the home directory less than 1 MiB",
            field="profile.resource_limits.disk_mib",
        )
    return (
        Area(path=user.home, size_kib=home, mode=0o755, owned=True, executable=True),
        Area(path="/tmp", size_kib=tmp, mode=0o1777, owned=False, executable=True),
        Area(path="/dev/shm", size_kib=shm, mode=0o1777, owned=False, executable=False),
        *rw,
    )


def check_mount_targets(mounts: tuple[MountPlan, ...], areas: tuple[Area, ...]) -> None:
    """A mount may sit inside a writable area, but never on one, above one, or in a kernel tree.

    A writable plan's own area (at its target) is the one area it may sit on.

    Raises:
        SandboxPathRejected: naming the first mount target at fault.
    """
    for i, plan in enumerate(mounts):
        field = f"mounts.{i}.target"
        for area in areas:
            if plan.writable and area.path == plan.target:
                continue
            if is_within(area.path, plan.target):
                raise SandboxPathRejected(
                    f"{field}: {plan.target!r} would cover the writable area {area.path!r}", field=field
                )
        for root in RESERVED_ROOTS:
            if is_within(plan.target, root) and not any(is_within(plan.target, a.path) for a in areas):
                raise SandboxPathRejected(f"{field}: {plan.target!r} is inside {root}", field=field)


def area_volume_labels(area: Area, key: str, tag: str) -> dict[str, str]:
    return L.object_labels(key, tag, "area", **{L.TARGET: area.path})


def mount_volume_labels(target: str, key: str, tag: str) -> dict[str, str]:
    return L.object_labels(key, tag, "mount", **{L.TARGET: target})


def _volume_mount(
    target: str,
    source: str | None,
    *,
    read_only: bool,
    labels: dict[str, str],
    driver_opts: dict[str, str] | None = None,
) -> Any:
    """A volume mount; the engine creates the volume at ``create``, with ``labels`` and ``driver_opts``, when it
    does not exist yet (so the container and all its volumes cost one API round trip). ``source`` ``None`` is an
    anonymous volume, which the engine removes with the container (``v=True``); a named volume outlives it. A named
    volume that already exists keeps its own labels and options, as with ``POST /volumes/create``."""
    return docker.types.Mount(
        target=target,
        source=source,
        type="volume",
        read_only=read_only,
        no_copy=True,
        labels=labels,
        driver_config=docker.types.DriverConfig("local", driver_opts) if driver_opts is not None else None,
    )


def area_mounts(areas: tuple[Area, ...], user: SandboxUser, key: str, tag: str) -> list[Any]:
    """Every writable area as a size-limited tmpfs volume, labelled ``kind=area`` with its path.

    The areas belong to the sandbox container alone, so they are anonymous: removing the container
    with ``v=True`` removes them in the same engine call.
    """
    return [
        _volume_mount(
            a.path, None, read_only=False, labels=area_volume_labels(a, key, tag), driver_opts=a.driver_opts(user)
        )
        for a in areas
    ]


def mount_mounts(instance: str, mounts: tuple[MountPlan, ...], key: str, tag: str, *, read_only: bool) -> list[Any]:
    """Every mount plan as a disk volume, labelled ``kind=mount`` with its target, named after the instance
    (the stager and the sandbox share it)."""
    return [
        _volume_mount(
            p.target,
            L.mount_volume(instance, i),
            read_only=read_only,
            labels=mount_volume_labels(p.target, key, tag),
        )
        for i, p in enumerate(mounts)
    ]


def named_volumes(instance: str, mounts: tuple[MountPlan, ...]) -> tuple[str, ...]:
    """The volumes of an instance that outlive its container and are removed by name: its mount volumes."""
    return tuple(L.mount_volume(instance, i) for i in range(len(mounts)))


def stager_spec(
    api: Any, instance: str, image: str, mounts: tuple[MountPlan, ...], key: str, tag: str
) -> dict[str, Any]:
    """A container that is never started: the handle through which staged files reach the mount volumes."""
    host_config = api.create_host_config(
        mounts=mount_mounts(instance, mounts, key, tag, read_only=False),
        network_mode="none",
        log_config=docker.types.LogConfig(type="none"),
    )
    return {
        "image": image,
        "command": ["true"],
        "name": L.stager_name(instance),
        "labels": L.object_labels(key, tag, "stager"),
        "host_config": host_config,
    }


def sandbox_spec(
    api: Any,
    *,
    instance: str,
    image: str,
    profile: SandboxProfile,
    mounts: tuple[MountPlan, ...],
    areas: tuple[Area, ...],
    user: SandboxUser,
    key: str,
    tag: str,
    restore: str | None,
    targets: tuple[str, ...] | None = None,
    hold: bool = False,
) -> dict[str, Any]:
    """The sandbox container, created (not started) with every enforcement flag set; labelled held with ``hold``.

    ``mounts`` are the sealed plans (each a read-only volume); ``targets`` every mount target, the writable
    plans' (which are among ``areas``) too.
    """
    limits = profile.resource_limits
    volume_mounts = area_mounts(areas, user, key, tag) + mount_mounts(instance, mounts, key, tag, read_only=True)
    memory = limits.memory_mib * 1024 * 1024
    host_config = api.create_host_config(
        mounts=volume_mounts,
        read_only=True,
        network_mode="none",
        ipc_mode="private",
        init=True,
        privileged=False,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        group_add=[str(user.gid)],
        mem_limit=memory,
        memswap_limit=memory,
        nano_cpus=limits.cpu_millis * 1_000_000,
        pids_limit=limits.pids,
        ulimits=[docker.types.Ulimit(name="msgqueue", soft=0, hard=0)],
        log_config=docker.types.LogConfig(type="none"),
    )
    extra = {
        L.RETENTION: profile.retention_mode,
        L.MOUNTS: L.dump_list(targets if targets is not None else tuple(p.target for p in mounts)),
        L.AREAS: L.dump_list(tuple(a.path for a in areas)),
    }
    if mounts:
        extra[L.STAGER] = L.stager_name(instance)
    if restore is not None:
        extra[L.RESTORE] = restore
    if hold:
        extra[L.HOLD] = "1"
    environment = {"HOME": user.home}
    if egress.wants_egress(profile):
        extra[L.PROXY] = egress.proxy_name(instance)
        extra[L.ALLOWLIST] = L.dump_list(egress.allowlist_of(profile))
        environment.update(egress.sandbox_environment())
    return {
        "image": image,
        "command": ["sleep", "infinity"],
        "name": instance,
        "user": user.spec,
        "working_dir": user.home,
        "hostname": "sandbox",
        "environment": environment,
        "labels": L.object_labels(key, tag, "instance", **extra),
        "host_config": host_config,
    }
