"""Per-instance cgroups (v1): where an instance's processes are born, what bounds them, how all of them end.

An instance gets one directory in each of four v1 hierarchies, named for the
state directory and the allocation key, created *below the runner's own cgroup*
in that hierarchy so an instance can never escape a limit the runner itself is
under::

    freezer  <own>/checkfu-hp-<state>-<key>/s-<n>   one child per spawned process tree
    pids     <own>/checkfu-hp-<state>-<key>         pids.max
    memory   <own>/checkfu-hp-<state>-<key>         memory(.memsw).limit_in_bytes
    cpu      <own>/checkfu-hp-<state>-<key>         cpu.cfs_quota_us over a 100 ms period

A process is born inside them, never moved there after the fact: the spawning
thread writes its own thread id to each ``tasks`` file, forks, and moves back
(see ``spawner``). v1 places tasks per thread and a child inherits the cgroups
of the thread that forked it, so there is no window in which a child could fork
outside its instance. Membership in the freezer tree is what makes
reaping complete: a process that calls ``setsid`` leaves its process group but
not its cgroup. Ending a tree freezes it, kills every member and thaws it, so
nothing can fork while it is being killed.

What this module must not do: kill the runner. The spawning thread is inside
an instance's cgroups while it forks, so every member list leaves out the
runner's own pid, and freezing and spawning into one instance are serialized by
the instance's lock.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from checkfu.contract.vocabulary import Resources

CONTROLLERS: tuple[str, ...] = ("freezer", "pids", "memory", "cpu")
CFS_PERIOD_US = 100_000
MIN_CPU_MILLIS = 10
"""The kernel's smallest CFS quota is 1 ms per period: 10 thousandths of a core at a 100 ms period."""
NAME_PREFIX = "checkfu-hp-"
SPAWN_PREFIX = "s-"

_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted v1 hierarchy: where it is mounted and which cgroup the mount shows at its top."""

    controller: str
    mount: Path
    root: str

    def directory(self, cgroup_path: str) -> Path | None:
        """The directory of ``cgroup_path`` (as ``/proc/*/cgroup`` names it), or ``None`` if the mount hides it."""
        root = self.root.rstrip("/")
        if cgroup_path != root and not cgroup_path.startswith(root + "/"):
            return None
        return self.mount / cgroup_path[len(root) :].lstrip("/")


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_hierarchies(mountinfo: str) -> dict[str, Hierarchy]:
    """The v1 hierarchy of each controller in ``CONTROLLERS`` that ``mountinfo`` shows mounted."""
    found: dict[str, Hierarchy] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup":
            continue
        options = set(tail[2].split(","))
        for controller in CONTROLLERS:
            if controller in options and controller not in found:
                found[controller] = Hierarchy(controller, Path(_unescape(fields[4])), _unescape(fields[3]))
    return found


def parse_own(self_cgroup: str) -> dict[str, str]:
    """The cgroup path of each controller in a ``/proc/<pid>/cgroup`` text (v1 lines only)."""
    own: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[1]:
            continue
        for controller in parts[1].split(","):
            own[controller] = parts[2]
    return own


def instance_name(state_hash: str, allocation_key: str) -> str:
    """The directory name of an instance's cgroups: one per state directory and allocation key."""
    return f"{NAME_PREFIX}{state_hash}-{allocation_key}"


@dataclass(frozen=True, slots=True)
class InstanceCgroups:
    """An instance's four cgroup directories, and the lock that keeps spawning and freezing apart."""

    dirs: Mapping[str, Path]
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False)

    @property
    def freezer(self) -> Path:
        return self.dirs["freezer"]

    def as_label(self) -> dict[str, str]:
        return {c: str(d) for c, d in self.dirs.items()}


class CgroupHost:
    """The hierarchies new instances are created in. Built only by ``probe``, which proves it works."""

    def __init__(self, hierarchies: Mapping[str, Hierarchy], bases: Mapping[str, Path]) -> None:
        self.hierarchies = dict(hierarchies)
        self.bases = dict(bases)

    def plan(self, name: str) -> InstanceCgroups:
        """The directories an instance named ``name`` gets (not yet created)."""
        return InstanceCgroups({c: self.bases[c] / name for c in CONTROLLERS})

    def create(self, cgroups: InstanceCgroups, limits: Resources) -> None:
        """Create the instance's directories and apply ``limits``; an existing directory is reused.

        Raises:
            OSError: a directory cannot be made or a limit cannot be written.
        """
        for directory in cgroups.dirs.values():
            directory.mkdir(exist_ok=True)
        memory = cgroups.dirs["memory"]
        limit = str(limits.memory_mib << 20)
        _write(memory / "memory.limit_in_bytes", limit)
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", limit)
        _write(cgroups.dirs["pids"] / "pids.max", str(limits.pids))
        cpu = cgroups.dirs["cpu"]
        _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(max(limits.cpu_millis, MIN_CPU_MILLIS) * CFS_PERIOD_US // 1000))

    @staticmethod
    def new_spawn_dir(cgroups: InstanceCgroups) -> Path:
        """A fresh freezer child for one spawned process tree."""
        while True:
            candidate = cgroups.freezer / f"{SPAWN_PREFIX}{os.urandom(6).hex()}"
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate


@contextmanager
def placed(cgroups: InstanceCgroups, spawn_dir: Path, home: Mapping[str, Path]) -> Iterator[None]:
    """Move the calling thread into the instance (freezer: ``spawn_dir``) while the block runs.

    Children forked inside the block are born in the instance's cgroups. The
    caller must hold ``cgroups.lock``. It is moved back to ``home`` (the runner's
    own cgroups) on the way out; a thread whose move back failed must exit, which
    takes it out (``spawner`` checks).

    Raises:
        OSError: a ``tasks`` file refused the thread.
    """
    tid = str(threading.get_native_id())
    try:
        for controller in CONTROLLERS:
            target = spawn_dir if controller == "freezer" else cgroups.dirs[controller]
            _write(target / "tasks", tid)
        yield
    finally:
        for controller in CONTROLLERS:
            with suppress(OSError):
                _write(home[controller] / "tasks", tid)


def probe(state_dir: Path) -> CgroupHost | str:
    """A ``CgroupHost`` if this host lets the provider create, enter and bound cgroups; else the reason why not.

    It checks, for each of freezer, pids, memory and cpu: a mounted v1 hierarchy,
    a directory for the runner's own cgroup, that a child can be made there and
    that a thread can enter it. For memory it also checks that limits nest
    (``memory.use_hierarchy``) and that swap cannot add to a limit (swap
    accounting present, or no swap at all). The probe leaves nothing behind.
    """
    try:
        hierarchies = parse_hierarchies(Path("/proc/self/mountinfo").read_text())
        own = parse_own(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return f"cannot read the process's cgroups: {exc.strerror}"
    bases: dict[str, Path] = {}
    for controller in CONTROLLERS:
        hierarchy = hierarchies.get(controller)
        if hierarchy is None or controller not in own:
            return f"no cgroup v1 hierarchy for {controller}"
        base = hierarchy.directory(own[controller])
        if base is None or not base.is_dir():
            return f"the runner's own {controller} cgroup is not visible"
        bases[controller] = base
    memory = bases["memory"]
    if _read(memory / "memory.use_hierarchy") != "1":
        return "memory limits do not nest here (memory.use_hierarchy is 0)"
    if not (memory / "memory.memsw.limit_in_bytes").exists() and _swap_total() != 0:
        return "swap is on and not accounted, so a memory limit would not hold"
    outcome: list[str] = []
    thread = threading.Thread(target=_try_enter, args=(bases, state_dir, outcome), name="checkfu-hp-probe")
    thread.start()
    thread.join()
    if outcome:
        return outcome[0]
    return CgroupHost(hierarchies, bases)


def _try_enter(bases: Mapping[str, Path], state_dir: Path, outcome: list[str]) -> None:
    name = f"{NAME_PREFIX}probe-{os.getpid()}-{os.urandom(4).hex()}"
    trial = InstanceCgroups({c: bases[c] / name for c in CONTROLLERS})
    made: list[Path] = []
    try:
        for directory in trial.dirs.values():
            directory.mkdir()
            made.append(directory)
        with trial.lock, placed(trial, trial.freezer, bases):
            pass
    except OSError as exc:
        outcome.append(f"cannot create or enter a cgroup ({exc.strerror or exc}); state dir {state_dir}")
    finally:
        for directory in reversed(made):
            _rmdir_retrying(directory)


def hierarchies_on_host() -> dict[str, Hierarchy]:
    """The v1 hierarchies mounted here, for checking recorded paths; empty when none can be read."""
    try:
        return parse_hierarchies(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return {}


def verified(recorded: Mapping[str, str], name: str) -> InstanceCgroups:
    """The recorded directories of a label that really are this provider's cgroups named ``name``.

    A recorded path counts only if it lies below the mount of its controller's v1
    hierarchy, has no ``..`` segment and is named ``name``: a tampered label
    cannot point compensation at someone else's cgroup.
    """
    hierarchies = hierarchies_on_host()
    dirs: dict[str, Path] = {}
    for controller, text in recorded.items():
        hierarchy = hierarchies.get(controller)
        path = Path(text)
        if hierarchy is None or not path.is_absolute() or ".." in path.parts or path.name != name:
            continue
        if path.is_relative_to(hierarchy.mount) and path != hierarchy.mount:
            dirs[controller] = path
    return InstanceCgroups(dirs)


# Ending and removing --------------------------------------------------------------------------


def members(root: Path) -> set[int]:
    """Every process in ``root`` and its child cgroups, never the runner itself."""
    found: set[int] = set()
    for directory in _tree(root):
        text = _read(directory / "cgroup.procs")
        if text:
            found.update(int(p) for p in text.split())
    found.discard(os.getpid())
    return found


def _tree(root: Path) -> list[Path]:
    """``root`` and every cgroup below it, deepest last."""
    out = [root]
    i = 0
    while i < len(out):
        with suppress(OSError), os.scandir(out[i]) as entries:
            out.extend(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
        i += 1
    return out


def end_tree(cgroups: InstanceCgroups, root: Path, *, grace: float, deadline: float = 10.0) -> bool:
    """End every process in the freezer tree ``root``: SIGTERM, ``grace`` seconds, then freeze-kill-thaw.

    Returns whether the tree is empty afterwards. Takes the instance's lock, so
    it must run in a worker thread, never on the event loop.
    """
    with cgroups.lock:
        if not members(root):
            return True
        if grace > 0:
            _signal(members(root), signal.SIGTERM)
            if _wait_empty(root, grace):
                return True
        stop = time.monotonic() + deadline
        while time.monotonic() < stop:
            if _freeze_kill(root):
                return True
        return not members(root)


@contextmanager
def frozen(cgroups: InstanceCgroups) -> Iterator[None]:
    """Hold every process of the instance still while the block runs (a consistent snapshot).

    Takes the instance's lock; must run in a worker thread.
    """
    with cgroups.lock:
        state = cgroups.freezer / "freezer.state"
        _write(state, "FROZEN")
        try:
            _wait_state(state, "FROZEN", 2.0)
            yield
        finally:
            _write(state, "THAWED")


def _freeze_kill(root: Path) -> bool:
    state = root / "freezer.state"
    can_freeze = state.exists()
    try:
        if can_freeze:
            _write(state, "FROZEN")
            _wait_state(state, "FROZEN", 1.0)
        _signal(members(root), signal.SIGKILL)
    finally:
        if can_freeze:
            with suppress(FileNotFoundError):
                _write(state, "THAWED")
    return _wait_empty(root, 2.0)


def end_instance(cgroups: InstanceCgroups, *, grace: float) -> bool:
    """End every process of an instance; whether none is left. Worker thread only.

    The freezer tree is used when the instance has one (a recorded label may
    name fewer hierarchies); any other hierarchy lists the same processes.
    """
    for controller in CONTROLLERS:
        root = cgroups.dirs.get(controller)
        if root is not None and root.is_dir():
            return end_tree(cgroups, root, grace=grace)
    return True


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_empty(root: Path, seconds: float) -> bool:
    stop = time.monotonic() + seconds
    delay = 0.001
    while members(root):
        if time.monotonic() >= stop:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True


def _wait_state(path: Path, want: str, seconds: float) -> bool:
    stop = time.monotonic() + seconds
    while _read(path) != want:
        if time.monotonic() >= stop:
            return False
        time.sleep(0.001)
    return True


def remove_spawn_dir(spawn_dir: Path) -> bool:
    """Remove one spawn's freezer child if nothing runs in it any more; whether it is gone.

    One attempt, no waiting: safe on the event loop. A child left behind goes with the instance.
    """
    if members(spawn_dir):
        return False
    return _rmdir_retrying(spawn_dir, seconds=0.0)


def remove(cgroups: InstanceCgroups) -> int:
    """Remove every directory of the instance (children first); how many existed. Processes must be gone.

    Raises:
        OSError: a directory stays busy.
    """
    removed = 0
    for directory in cgroups.dirs.values():
        if not directory.exists():
            continue
        for child in reversed(_tree(directory)):
            if not _rmdir_retrying(child):
                raise OSError(errno.EBUSY, "cgroup stays busy", str(child))
        removed += 1
    return removed


def _rmdir_retrying(directory: Path, seconds: float = 2.0) -> bool:
    stop = time.monotonic() + seconds
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= stop:
                return False
            time.sleep(0.005)


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _swap_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("SwapTotal:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
