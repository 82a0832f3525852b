"""``DockerProvider``: the seventeen members on the real Docker Engine.

What an instance is on the engine (all labelled ``checkfu.allocation_key`` and
``checkfu.runner_tag``, all but the areas named after the allocation key):

- the sandbox container, created at ``provision`` and started at ``activate``;
  its id on the seam is its name, ``checkfu-<sha256(allocation_key)[:32]>``;
- one tmpfs volume per writable area (home, ``/tmp``, ``/dev/shm``; ``spec.py``),
  anonymous, created by the sandbox's own create and removed with it (``v=True``);
- one disk volume per mount plan, mounted read-only in the sandbox, and a
  stager container (never started) through which ``writeFile`` fills them
  before activation; the stager is removed at ``activate``; the stager's create
  creates the mount volumes;
- for a clone, a carrier file with the source's areas in the state directory (beside the
  staging spools, named after the instance and runner tag), consumed at ``activate``;
- once it is snapshotted or cloned, or activated from a snapshot or a clone, a handle:
  a container never started, named ``<instance>-areas``, that mounts the area volumes
  alone, through which they are read and filled in one archive request (``snapshots.py``);
- for an ``allowlist`` profile, its way out (``egress.py``): an egress proxy
  container created and started at ``provision``, a door container that joins
  the sandbox's network namespace at ``activate`` only to open ``127.0.0.1:3128``
  into the proxy (removed once it has), and the tmpfs volume between the two.

Snapshots are images labelled with their own allocation key (``snapshots.py``).
A snapshot asked with a lifetime carries its expiry (``checkfu.expires_at``); this
provider deletes it once that passes: at its next call that names the runner tag
(``provision``, ``clone``, ``resume``, ``compensate``, ``listAllocations``; at most
once a minute per tag), on ``sweep_expired`` and whenever it is asked to resume it.
The envelope still says runner custody (the bytes die with the runner host's
engine), so the runner deletes it too (``checkfu.core.expiry``); whichever comes
first, the other finds nothing.
State is the container's real state: ``created`` is ``provisioning``, started is
``active``, gone is ``released`` (when this object released it) or not found.
The only in-memory state is one record per instance (``record.py``), moved through
its own small state table: the verified container id, the view of an instance this
object provisioned or activated (so ``writeFile``, ``activate`` and ``release`` need
not ask the engine first; the engine's answer to the call itself still decides, and
every other member reads the real state), the handle it made, the work under way
for it, and whether this object began or finished releasing it. A freshly built
provider (cold) finds everything again by name and label.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar

from checkfu.contract.envelope import Member
from checkfu.contract.errors import (
    SandboxCapabilityUnavailable,
    SandboxError,
    SandboxNotFound,
    SandboxPathRejected,
    SandboxProviderFailed,
    Unmet,
)
from checkfu.contract.lifecycle import snapshot_transition, transition
from checkfu.contract.members import (
    ActivateRequest,
    AllocationEntry,
    AllocationKind,
    CloneRequest,
    CloneResult,
    CompensateRequest,
    CompensateResult,
    DeleteSnapshotRequest,
    DeleteSnapshotResult,
    DescribeResult,
    ExecRequest,
    ExecResult,
    InspectRequest,
    InstanceCall,
    InstanceResult,
    ListAllocationsRequest,
    ListAllocationsResult,
    ListDirRequest,
    ListDirResult,
    MaterializeRequest,
    MaterializeResult,
    OpenProcessRequest,
    ProcessStarted,
    ProvisionRequest,
    ReadFilesRequest,
    ReadFilesResult,
    ReleaseRequest,
    ReleaseResult,
    ResumeRequest,
    ResumeResult,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    WriteFileResult,
    _Allocating,
    echo,
)
from checkfu.contract.model import format_timestamp, parse_timestamp
from checkfu.contract.paths import is_within
from checkfu.contract.ports import PortSpec, PublishedPort
from checkfu.providers.docker import egress, files, ports, snapshots, spec
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.engine import DEFAULT_WORKERS, Engine
from checkfu.providers.docker.envelope import HostFacts, build_envelope, check_target, host_facts, require_served
from checkfu.providers.docker.materialize import BuildLine, Materializer
from checkfu.providers.docker.process import (
    DockerProcess,
    ExecOutcome,
    hijack,
    resize_exec,
    run_exec,
    sandbox_pid,
)
from checkfu.providers.docker.record import Handle, Instance, Records
from checkfu.providers.docker.staging import (
    Spools,
    discard_writable,
    make_private_dirs,
    open_private,
)
from checkfu.providers.docker.writes import StagedWrites

T = TypeVar("T")


EGRESS_IMAGE = "checkfu/debian:12"
"""The image an ``allowlist`` sandbox's egress proxy and door run in, unless the provider is given another."""
SWEEP_INTERVAL = 60.0
"""The least time between two sweeps of a runner tag's expired snapshots made in passing (at a call)."""


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/checkfu-docker`` (``~/.local/state/checkfu-docker``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "checkfu-docker"


class _RootImageMissing(Exception):
    """The engine has no image by the request's ``root_image`` (404 on a create)."""


THAW_WAIT = 120.0
"""How long a call on a sandbox paused by another live process's capture waits for that capture to thaw it."""
CAPTURE_WAIT = 600.0
"""How long a reclaim of an allocation waits for a capture for it still running in this process."""


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/PID/stat``'s 22nd field), ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _this_process() -> str:
    """This process as ``pid/start``: a pid reused by another process is never taken for this one."""
    return f"{os.getpid()}/{_process_start(os.getpid())}"


def _process_alive(mark: str) -> bool:
    pid, _, start = mark.partition("/")
    return pid.isdigit() and bool(start) and _process_start(int(pid)) == start


def _marks(path: Path, container: str) -> bool:
    """Whether capture mark ``path`` is a live process's, of ``container``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("container") == container and _process_alive(str(doc.get("process")))


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _engine_reason(exc: BaseException) -> str:
    """What the engine said of a failed call, in one bounded line."""
    explanation = getattr(exc, "explanation", None)
    text = explanation if isinstance(explanation, str) and explanation else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:300]


class DockerProvider:
    """The in-tree Docker provider. Every docker-py call runs off the event loop, in ``engine``'s pool.

    Args:
        engine: the engine wrapper (a new one from the environment by default).
        sandbox_user: ``uid:gid`` every sandbox process runs as; never root.
        home: the sandbox user's home, a writable area and the default working directory.
        state_dir: where staged files wait for activation (named by instance, found again when cold).
        cache_tag: the runner tag materialized images are labelled with.
        progress: called on the event loop with each line of an image build's output (a ``str``).
        workers: threads for docker-py calls (of the engine made here when ``engine`` is not given).
        facts: the host's architecture, CPUs and memory; read from this host by default.
        egress_image: the image the egress proxy and door of an ``allowlist`` sandbox run in (it needs
            ``python3``, 3.9 or later); without it on the engine, ``allowlist`` is not advertised.
        egress_dns: the DNS servers the egress proxies ask (default: the engine's own choice for a container).
        hold: a sandbox ``provision`` makes (without an egress allowlist) is *held*: started and at once paused,
            so its boundary is up (namespaces, cgroup, mounted areas) and nothing in it runs until ``activate``
            thaws it. A warm pool's filler sets it, so that an adopting Run pays a thaw instead of a start.
            Staging is unchanged: sealed mounts are written through the stager, writable ones after the thaw.

    Raises:
        SandboxAdapterUnavailable: ``sandbox_user`` or ``home`` is malformed (the option is the field).
    """

    def __init__(
        self,
        *,
        engine: Engine | None = None,
        sandbox_user: str = "1000:1000",
        home: str = "/home/sandbox",
        state_dir: str | Path | None = None,
        cache_tag: str = "checkfu-cache",
        progress: BuildLine | None = None,
        workers: int = DEFAULT_WORKERS,
        facts: HostFacts | None = None,
        egress_image: str = EGRESS_IMAGE,
        egress_dns: tuple[str, ...] = (),
        hold: bool = False,
    ) -> None:
        self.hold = hold
        self.user = spec.SandboxUser.parse(sandbox_user, home)
        self.engine = engine if engine is not None else Engine(workers=workers)
        self._facts = facts if facts is not None else host_facts()
        self.egress_image = egress_image
        self.egress_dns = egress.parse_dns(",".join(egress_dns))
        self.envelope = build_envelope(self._facts)
        self._engine_read = False
        self.target = self.envelope.target
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.spools = Spools(self.state_dir / "staging")
        self.rw_spools = Spools(self.state_dir / "staging-rw")
        self.carriers = Spools(self.state_dir / "carriers")
        """A clone's carrier file (``snapshots.capture``), from ``clone`` until its ``activate``."""
        self.cache_tag = cache_tag
        self._progress = progress
        self._materializer = Materializer(self.engine.api, lambda: self.engine.build_client().api, self.user, cache_tag)
        self._fanout = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="checkfu-docker-fanout")
        self._records = Records()
        """What this object keeps about each instance, by instance id (``record.py``)."""
        self._writes = StagedWrites(
            engine=self.engine,
            user=self.user,
            spools=self.spools,
            rw_spools=self.rw_spools,
            fanout=self._fanout,
            records=self._records,
            in_background=self._in_background,
        )
        self._guard = threading.Lock()
        self._captures: dict[str, Future[None]] = {}
        """The captures running in this process, by the allocation key they capture for (``_capturing``)."""
        self._swept: dict[str, float] = {}  # runner tag -> when its expired snapshots were last swept in passing
        self._groups: spec.ProcessGroups | None = None  # made at the first process, once the engine says if remapped
        self.wall: Callable[[], float] = time.time
        """The wall clock expiries are stated and judged by."""

    def close(self) -> None:
        """Release the engine's threads and connections. Sandboxes are left as they are."""
        self._fanout.shutdown(wait=False, cancel_futures=True)
        self.spools.close()
        self.rw_spools.close()
        self.engine.close()

    # identity and state -------------------------------------------------------------------

    def _check_identity(self, request: InstanceCall) -> str:
        check_target(request, self.target)
        name = L.instance_name(request.allocation_key)
        if request.instance_id != name:
            raise SandboxNotFound(
                f"instance_id: {request.instance_id!r} is not the instance of allocation {request.allocation_key!r}",
                field="instance_id",
            )
        return name

    def _inspect_blocking(self, name: str, allocation_key: str) -> Instance | None:
        try:
            info = self.engine.api.inspect_container(name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise
        labels = info.get("Config", {}).get("Labels") or {}
        if labels.get(L.ALLOCATION_KEY) != allocation_key or L.kind_of(labels) != "instance":
            raise SandboxNotFound(f"instance_id: {name!r} is not an instance of allocation {allocation_key!r}")
        status = info.get("State", {}).get("Status", "")
        # A held sandbox waits paused until ``activate`` thaws it; an activated one is paused again only for the
        # moment a snapshot reads it, and its thaw mark (written before the thaw) tells the two apart.
        provisioning = status == "created" or (
            status == "paused"
            and labels.get(L.HOLD) == "1"
            and not self._thaw_mark(name, labels.get(L.RUNNER_TAG, "")).exists()
        )
        return Instance(
            container_id=str(info["Id"]),
            name=name,
            state="provisioning" if provisioning else "active",
            running=bool(info.get("State", {}).get("Running")) and not info.get("State", {}).get("Paused"),
            labels=labels,
            volumes=tuple(str(m["Name"]) for m in info.get("Mounts") or [] if m.get("Type") == "volume"),
        )

    async def _find(self, request: InstanceCall) -> tuple[str, Instance | None]:
        name = self._check_identity(request)
        found = await self.engine.run("inspect", self._inspect_blocking, name, request.allocation_key)
        if found is not None:
            self._records.find(name, found.container_id)
        return name, found

    def _released(self, name: str) -> bool:
        """This object released ``name`` (or compensated it) and has not found it since."""
        record = self._records.get(name)
        return record is not None and record.state == "released"

    async def _resolve(self, request: InstanceCall, member: Member) -> Instance:
        """The instance ``request`` addresses, after the lifecycle table allows ``member`` in its real state.

        Raises:
            SandboxIdentityMismatch: the request is for another adapter.
            SandboxNotFound: no such instance, or it belongs to another allocation.
            SandboxStateConflict: ``member`` is not allowed in the instance's state.
        """
        name, found = await self._find(request)
        if found is None:
            if self._released(name):
                transition("released", member)
            raise SandboxNotFound(f"instance_id: {name!r} does not exist", field="instance_id")
        transition(found.state, member)
        return found

    @staticmethod
    def _require_running(instance: Instance) -> None:
        if not instance.running:
            raise SandboxProviderFailed(
                f"instance {instance.name!r} was started but is no longer running", retryable=False
            )

    async def _running_id(self, request: InstanceCall, member: Member) -> str:
        """The container id of a running instance; from the cache when this object already verified it."""
        record = self._records.get(self._check_identity(request))
        cached = record.running_id if record is not None else None
        if cached is not None:
            return cached
        instance = await self._thawed(await self._resolve(request, member))
        self._require_running(instance)
        return instance.container_id

    async def _explain(self, request: InstanceCall, member: Member, exc: SandboxError) -> NoReturn:
        """Raise the error the instance's real state calls for after a call on a cached id failed."""
        instance = await self._thawed(await self._resolve(request, member))
        self._require_running(instance)
        raise exc

    async def _thawed(self, instance: Instance) -> Instance:
        """``instance``, running again if the engine reports it paused by a capture: one still going on in a live
        process is waited for (it thaws the sandbox itself, in a moment); one whose process died left it paused,
        and it is thawed here. Never a held sandbox waiting for its Run (``provisioning``)."""
        if instance.running or instance.state != "active":
            return instance
        return await self.engine.run("thaw", self._thawed_blocking, instance)

    def _thawed_blocking(self, instance: Instance) -> Instance:
        root = self.state_dir / "capturing"
        deadline = time.monotonic() + THAW_WAIT
        while True:
            try:
                info = self.engine.api.inspect_container(instance.container_id)
            except Exception as exc:
                if _status(exc) == 404:
                    return instance
                raise
            state = info.get("State") or {}
            if not (state.get("Running") and state.get("Paused")):
                return dataclasses.replace(instance, running=bool(state.get("Running")))
            capturing = root.exists() and any(_marks(m, instance.container_id) for m in root.glob("*~*"))
            if not capturing:
                self._thaw(instance.container_id)
                return dataclasses.replace(instance, running=True)
            if time.monotonic() > deadline:
                return instance
            time.sleep(0.05)

    async def namespaces(self) -> tuple[str, ...]:
        """The namespaces every sandbox gets of its own on this engine: a user namespace only under userns-remap.

        ``describe`` carries the answer as the envelope's ``user_namespace``; ``sandbox_isolation``
        holds with or without it.
        """
        info = await self.engine.info()
        options = info.get("SecurityOptions") or []
        userns = any(isinstance(o, str) and "name=userns" in o.split(",") for o in options)
        return ("mnt", "pid", "net", "ipc", "uts", *(("user",) if userns else ()))

    # describe, materialize ------------------------------------------------------------------

    def _egress_image_id(self) -> str | None:
        """The id of ``egress_image`` on the engine, or ``None`` when it has none (the answer to the question
        ``engine.ask_image_early`` sent, when a command sent it)."""
        return self.engine.image_id(self.egress_image)

    def _require_egress_image(self) -> str:
        """Raises SandboxCapabilityUnavailable when the engine has no ``egress_image``."""
        image = self._egress_image_id()
        if image is None:
            why = (
                f"'allowlist' needs the egress image {self.egress_image!r} (with python3) on this engine, and "
                "nothing is pulled (scripts/base-images builds checkfu/debian:12)"
            )
            raise SandboxCapabilityUnavailable(
                [Unmet("profile.network_policy.mode", why)], provider=self.envelope.provider
            )
        return image

    async def describe(self) -> DescribeResult:
        """The envelope, once the engine has said whether sandboxes get a user namespace of their own, and
        whether it holds the egress image an ``allowlist`` sandbox's proxy runs in.

        Every call asks the engine (a ``ping`` once the rest is known), so an engine that went down is
        reported here: the runner of a fleet asks before it places a sandbox on one of several engines.

        Raises:
            SandboxProviderFailed: the engine does not answer.
        """
        if self._engine_read:
            await self.engine.run("describe", self.engine.api.ping)
        else:
            spaces, egress_image = await asyncio.gather(
                self.namespaces(), self.engine.run("describe", self._egress_image_id)
            )
            user_namespace, allowlist = "user" in spaces, egress_image is not None
            self.envelope = build_envelope(self._facts, user_namespace=user_namespace, allowlist=allowlist)
            self._engine_read = True
        return DescribeResult(envelope=self.envelope)

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult:
        """Build (or find) the image of ``request.profile``.

        Raises:
            SandboxIdentityMismatch: the request is for another adapter.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile.
            SandboxNotFound: the base image is not on this engine.
            SandboxProviderFailed: the build failed.
        """
        check_target(request, self.target)
        require_served(self.envelope, request.profile, request.platform)
        loop = asyncio.get_running_loop()
        progress = self._progress

        def emit(line: str) -> None:  # called in the build's worker thread: the line goes to this loop
            if progress is not None:
                loop.call_soon_threadsafe(progress, line)

        image, built = await self.engine.run(
            "materialize",
            self._materializer.materialize,
            request.profile,
            self.envelope.materialization_revision,
            emit if progress is not None else None,
        )
        return MaterializeResult(
            **echo(
                request,
                profile_digest=request.profile_digest,
                image=image,
                materialization_revision=self.envelope.materialization_revision,
                built=built,
            )
        )

    # provision, clone, resume -------------------------------------------------------------

    def _create_blocking(
        self, request: _Allocating, areas: tuple[spec.Area, ...], restore: str | None, hold: bool = False
    ) -> None:
        """Create the instance's containers and volumes, and its record (``staging``); for an ``allowlist`` profile
        its proxy (created meanwhile, in another thread, then started without waiting: the door waits for it at
        ``activate``) and its door too."""
        api = self.engine.api
        key, tag = request.allocation_key, request.runner_tag
        name = L.instance_name(key)
        image = self._require_egress_image() if egress.wants_egress(request.profile) else None
        proxy = self._fanout.submit(self._create_proxy, request, image) if image is not None else None
        try:
            container_id, labels, volumes = self._create_sandbox(request, areas, restore, hold)
            if image is not None:
                self._create_if_absent(egress.door_spec(api, instance=name, image=image, key=key, tag=tag))
        except _RootImageMissing as exc:
            if proxy is not None:
                with contextlib.suppress(Exception):
                    proxy.result()
            self._reclaim_blocking(allocation_key=key, runner_tag=tag, snapshots_of=False)
            raise SandboxNotFound(
                f"root_image: {request.root_image[:80]} is not on this engine", field="root_image"
            ) from exc.__cause__
        except BaseException:
            if proxy is not None:
                with contextlib.suppress(Exception):
                    proxy.result()
            raise
        if proxy is not None:
            proxy.result()
        self._records.create(
            Instance(container_id, name, "provisioning", running=False, labels=labels, volumes=volumes)
        )
        if proxy is not None:
            self._in_background(name, self._start_proxy, name)

    def _in_background(self, instance: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` in the pool without waiting for it; ``release`` and ``compensate`` of ``instance`` wait for it
        first (``Records.settle``: a removal never races a start or another removal of the same object)."""
        self._records.add_background(instance, self._fanout.submit(fn, *args))

    def _start_proxy(self, instance: str) -> None:
        """Start ``instance``'s proxy in the background; a failure is kept on its record, for ``activate`` to report
        when the door finds no proxy."""
        try:
            self.engine.api.start(egress.proxy_name(instance))
        except Exception as exc:
            self._records.proxy_failed(instance, _engine_reason(exc))

    def _create_if_absent(self, config: dict[str, Any]) -> None:
        """Create a container; one of that name already there (a retried call) is left as it is."""
        try:
            self.engine.api.create_container(**config)
        except Exception as exc:
            if _status(exc) != 409:
                raise

    def _create_proxy(self, request: _Allocating, image: str) -> None:
        api = self.engine.api
        name = L.instance_name(request.allocation_key)
        config = egress.proxy_spec(
            api,
            instance=name,
            image=image,
            allowlist=egress.allowlist_of(request.profile),
            key=request.allocation_key,
            tag=request.runner_tag,
            dns=self.egress_dns,
        )
        self._create_if_absent(config)

    def _create_sandbox(
        self, request: _Allocating, areas: tuple[spec.Area, ...], restore: str | None, hold: bool = False
    ) -> tuple[str, dict[str, str], tuple[str, ...]]:
        """The stager (with mounts) and the sandbox container; with ``hold``, started and at once paused.

        Raises:
            _RootImageMissing: the engine has no ``root_image`` (the caller reclaims what was made).
        """
        api = self.engine.api
        key, tag = request.allocation_key, request.runner_tag
        name = L.instance_name(key)
        # The volumes are created by the container creates themselves (``spec.area_mounts``, ``spec.mount_mounts``),
        # labelled like every other object: the stager creates the mount volumes, the sandbox its (anonymous) areas.
        sealed = tuple(m for m in request.mounts if not m.writable)
        if sealed:
            try:
                api.create_container(**spec.stager_spec(api, name, request.root_image, sealed, key, tag))
            except Exception as exc:
                if _status(exc) == 404:
                    raise _RootImageMissing() from exc
                if _status(exc) != 409:
                    raise
        config = spec.sandbox_spec(
            api,
            instance=name,
            image=request.root_image,
            profile=request.profile,
            mounts=sealed,
            areas=areas,
            user=self.user,
            key=key,
            tag=tag,
            restore=restore,
            targets=tuple(m.target for m in request.mounts),
            hold=hold,
        )
        try:
            created = api.create_container(**config)
        except Exception as exc:
            status = _status(exc)
            if status == 404:
                raise _RootImageMissing() from exc
            if status != 409:
                raise
            existing = self._inspect_blocking(name, key)
            transition(existing.state if existing is not None else "released", "provision")
            raise
        if hold:
            # Up and frozen: what a start costs is paid now, and nothing runs until ``activate`` thaws it. A failure
            # leaves objects that carry the allocation key, for ``compensate``, as any failed create does.
            api.start(created["Id"])
            api.pause(created["Id"])
            # The engine applied every flag at this start: checked now, so that the thaw is all ``activate`` does.
            self._verify_sealed(
                Instance(str(created["Id"]), name, "provisioning", running=True, labels=config["labels"], volumes=()),
                "provision",
            )
        return str(created["Id"]), dict(config["labels"]), spec.named_volumes(name, sealed)

    async def _allocate(self, request: _Allocating, member: Member, restore: str | None) -> None:
        check_target(request, self.target)
        require_served(self.envelope, request.profile, request.platform, request.mounts)
        writable = tuple(m for m in request.mounts if m.writable)
        areas = spec.split_disk(request.profile.resource_limits.disk_mib, self.user, writable)
        spec.check_mount_targets(request.mounts, areas)
        if egress.wants_egress(request.profile):
            egress.allowlist_of(request.profile)  # every destination readable by the proxy, before any create
        transition("absent", member)
        hold = self.hold and member == "provision" and not egress.wants_egress(request.profile)
        await self.engine.run(member, self._create_blocking, request, areas, restore, hold)

    @staticmethod
    def _new_instance(request: _Allocating) -> dict[str, Any]:
        """The echo of the instance ``request`` allocated: ``provisioning``, its id derived from its key."""
        return echo(request, instance_id=L.instance_name(request.allocation_key), state="provisioning")

    async def provision(self, request: ProvisionRequest) -> InstanceResult:
        """Create the sandbox (not started), its writable areas, and its mount volumes and stager.

        A cancelled or failed call may already have created some of these; all
        carry the allocation key, so ``compensate`` reclaims them.

        Raises:
            SandboxIdentityMismatch: the request is for another adapter.
            SandboxCapabilityUnavailable: the envelope cannot serve the profile, platform or mounts (or the egress
                proxy an allowlist destination).
            SandboxPathRejected: a mount target covers a writable area or sits in a kernel tree.
            SandboxNotFound: the root image is not on this engine.
            SandboxStateConflict: the allocation already has an instance.
        """
        # The sweep is a chore of the runner tag's, not this sandbox's: it runs beside the allocation, not before.
        sweeping = asyncio.ensure_future(self._sweep_in_passing(request.runner_tag))
        try:
            await self._allocate(request, "provision", None)
        finally:
            await sweeping
        return InstanceResult(**self._new_instance(request))

    async def clone(self, request: CloneRequest) -> CloneResult:
        """A new instance (``provisioning``) whose writable areas will hold the source's, as they are now.

        Raises:
            SandboxNotFound: the source does not exist or belongs to another allocation.
            SandboxStateConflict: the source is not active.
            (and every error of ``provision``)
        """
        check_target(request, self.target)
        await self._sweep_in_passing(request.runner_tag)
        source_call = InstanceCall(
            target=request.target,
            lease=request.lease,
            allocation_key=request.source_allocation_key,
            instance_id=request.source_instance_id,
        )
        require_served(self.envelope, request.profile, request.platform, request.mounts)
        source = await self._thawed(await self._resolve(source_call, "clone"))
        self._require_running(source)
        # The source's areas are read while the clone's container is created; they are written to the
        # carrier file only once that container exists, so reclaiming the clone's key always finds the file.
        captured = asyncio.ensure_future(
            self.engine.run("clone", self._capture_blocking, source, request.allocation_key, request.runner_tag)
        )
        try:
            await self._allocate(request, "clone", snapshots.CARRIER)
        except BaseException:
            with contextlib.suppress(BaseException):
                (await captured).close()
            raise
        name = L.instance_name(request.allocation_key)
        try:
            data = await captured
            await self.engine.run("clone", self._keep_carrier, data, name, request.runner_tag)
        except BaseException:
            with contextlib.suppress(BaseException):
                await self.engine.run(
                    "clone",
                    self._reclaim_blocking,
                    allocation_key=request.allocation_key,
                    runner_tag=request.runner_tag,
                    snapshots_of=False,
                )
                self._records.forget(name)
            raise
        return CloneResult(**self._new_instance(request), source_instance_id=request.source_instance_id)

    def _thaw_mark(self, instance: str, runner_tag: str) -> Path:
        """The file that says held ``instance`` was activated (thawed): a paused held sandbox without it is one
        that waits for its Run; with it, one an activated sandbox's snapshot has paused for a moment."""
        return self.state_dir / "thawed" / f"{instance}~{runner_tag}"

    def _unmark_thawed(self, instance: str, runner_tag: str | None) -> None:
        root = self.state_dir / "thawed"
        if root.exists():
            for mark in root.glob(f"{instance}~{runner_tag or '*'}"):
                mark.unlink(missing_ok=True)

    def _discard_carrier(self, instance: str, runner_tag: str | None) -> int:
        """Remove ``instance``'s carrier file (of ``runner_tag`` only, when given), and any half-written one;
        how many whole ones were there."""
        removed = self.carriers.discard(instance, runner_tag)
        if self.carriers.root.exists():
            for part in self.carriers.root.glob(f"{instance}~{runner_tag or '*'}.tar.part"):
                part.unlink(missing_ok=True)
        return removed

    def _keep_carrier(self, data: IO[bytes], instance: str, runner_tag: str) -> None:
        """Write a clone's captured areas to its carrier file (whole, or not at all)."""
        path = self.carriers.get(instance, runner_tag).path
        part = path.with_name(path.name + ".part")
        with data:
            make_private_dirs(path.parent)
            with open_private(part, os.O_TRUNC) as out:
                shutil.copyfileobj(data, out, 1 << 20)
            part.replace(path)

    def _snapshot_labels(self, snapshot_id: str) -> Mapping[str, str] | None:
        try:
            info = self.engine.api.inspect_image(snapshot_id)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise
        labels: Mapping[str, str] = info.get("Config", {}).get("Labels") or {}
        return labels

    async def resume(self, request: ResumeRequest) -> ResumeResult:
        """A new instance (``provisioning``) whose writable areas will hold the snapshot's.

        Raises:
            SandboxNotFound: the snapshot does not exist (or was deleted), or is another allocation's or runner's.
            (and every error of ``provision``)
        """
        check_target(request, self.target)
        await self._sweep_in_passing(request.runner_tag)
        labels = await self.engine.run("resume", self._snapshot_labels, request.snapshot_id)
        if labels is not None and self._expired(labels) and labels.get(L.RUNNER_TAG) == request.runner_tag:
            await self.engine.run("resume", self._sweep_blocking, request.runner_tag)
            labels = None  # expired: gone
        if (
            labels is None
            or labels.get(L.ALLOCATION_KEY) != request.snapshot_allocation_key
            or labels.get(L.RUNNER_TAG) != request.runner_tag
            or L.kind_of(labels) != "snapshot"
        ):
            raise SandboxNotFound(
                f"snapshot_id: {request.snapshot_id!r} is not a snapshot of allocation "
                f"{request.snapshot_allocation_key!r}",
                field="snapshot_id",
            )
        snapshot_transition("present", "resume")
        await self._allocate(request, "resume", request.snapshot_id)
        return ResumeResult(**self._new_instance(request), snapshot_id=request.snapshot_id)

    # writeFile, activate ----------------------------------------------------------------------

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult:
        """Stage ``data`` at ``request.path`` for the mount that contains it, after checking its length and digest.

        Raises:
            SandboxStateConflict: the instance is not provisioning.
            SandboxPathRejected: the path is not strictly below one of the instance's mount targets.
            SandboxDigestMismatch: the bytes do not have the stated length or SHA-256.
        """
        record = self._records.get(self._check_identity(request))
        staged = record.staged if record is not None else None
        instance = staged if staged is not None else await self._resolve(request, "writeFile")
        if staged is None:
            self._records.move(instance.name, instance.container_id, "stage", instance)
        transition(instance.state, "writeFile")
        target = next((t for t in instance.mounts if is_within(request.path, t) and request.path != t), None)
        if target is None:
            raise SandboxPathRejected(
                f"path: {request.path!r} is not below a mount target of this instance "
                f"({', '.join(instance.mounts) or 'it has none'})",
                field="path",
            )
        if not self._writes.stage_inline(instance, request, target, data):
            await self.engine.run("writeFile", self._writes.stage, instance, request, target, data)
        return WriteFileResult(**echo(request, path=request.path, size=request.size, digest=request.digest))

    def _activate_blocking(self, instance: Instance) -> None:
        if instance.restore is None:
            self._start_blocking(instance)
            return
        # A clone or a resumed snapshot: while the sandbox starts, its image is read back and the handle on its
        # areas made (the inspect for that comes first: an inspect waits for a start's container lock); then the
        # areas are filled in one upload. The handle is kept for the instance's own snapshots.
        api = self.engine.api
        restore, carrier = instance.restore, self.carriers.get(instance.name, instance.runner_tag)
        if restore == snapshots.CARRIER:
            loaded = self._fanout.submit(snapshots.load_carrier, carrier.path, instance.areas, instance.mounts)
        else:
            loaded = self._fanout.submit(snapshots.load, api, restore, instance.areas, instance.mounts)
        kind = self._fanout.submit(lambda: None if restore == snapshots.CARRIER else self._snapshot_labels(restore))
        try:
            handle = self._plan_handle(instance)
            made = self._fanout.submit(snapshots.create_handle, api, handle.config)
            try:
                self._start_blocking(instance)
            finally:
                made.exception()
            data, _ = loaded.result()
            with data:
                made.result()
                snapshots.fill(api, handle.name, data)
        except BaseException:
            self._drop_handle(instance)
            with contextlib.suppress(BaseException):
                loaded.result()[0].close()
            raise
        self._records.keep_handle(instance.name, handle)
        carrier.discard()  # consumed (a clone's carrier file)
        labels = kind.result() or {}
        if L.kind_of(labels) == "carrier" and labels.get(L.ALLOCATION_KEY) == instance.labels.get(L.ALLOCATION_KEY):
            # Consumed: removed in the background (an image removal waits for the engine's layer store, which
            # every other image operation on the host holds at times); release and compensate wait for it.
            self._in_background(instance.name, self._gone, functools.partial(api.remove_image, instance.restore))
        for target in instance.writable:
            self._writes.fill_writable(instance, target)

    def _start_blocking(self, instance: Instance) -> None:
        """Flush the staged files into the mount volumes and start the sandbox meanwhile, drop the stager, and
        verify the sandbox.

        The sandbox starts (or thaws) while the last staged files go up: until ``activate`` returns, all that runs
        in it is its init, and the sandbox user's first process is asked for only after that, so every mount is
        whole before anything of theirs can read it. A file marked partly written refuses before anything starts;
        an upload that fails leaves the sandbox as it was (stopped again, or paused again when held).
        """
        api = self.engine.api
        if instance.stager is None:
            self._start_or_thaw(instance)
        else:
            spool = self.spools.get(instance.name, instance.runner_tag)
            with spool.lock:
                spool.seal()
                if spool.partial:
                    path = sorted(spool.partial)[0]
                    raise SandboxProviderFailed(
                        f"activate: {path!r} may be partly written in its mount (its upload failed or its bytes did "
                        "not match their digest); write it again, or release the instance"
                    )
                started = self._fanout.submit(self._start_or_thaw, instance)
                try:
                    self._writes.drain(spool, instance.stager, "activate")
                except BaseException:
                    if started.exception() is None:
                        self._stop_again(instance)
                    raise
            started.result()
            if instance.held:  # its work is done; a held sandbox's thaw does not wait for its removal
                self._in_background(
                    instance.name, self._gone, functools.partial(api.remove_container, instance.stager, force=True)
                )
            else:
                try:
                    api.remove_container(instance.stager, force=True)
                except Exception as exc:
                    if _status(exc) != 404:
                        raise
        if instance.proxy is None:
            if not instance.held:  # a held one's flags were checked when it was started, at provision
                self._verify_sealed(instance)
        else:
            try:
                self._all(lambda: self._verify_sealed(instance), lambda: egress.open_door(api, instance.name))
            except SandboxProviderFailed as exc:
                with contextlib.suppress(Exception):  # a sandbox whose door did not open is not left running
                    api.kill(instance.container_id)
                reason = self._records.take_proxy_failure(instance.name)
                if reason is not None:
                    raise SandboxProviderFailed(
                        f"activate: the egress proxy did not start: {reason} (is the engine's default bridge up?)"
                    ) from exc
                raise
            self._verify_proxy(instance)
            door = egress.door_name(instance.name)
            self._in_background(instance.name, self._gone, functools.partial(api.remove_container, door, force=True))
        if instance.restore is None:
            for target in instance.writable:
                self._writes.fill_writable(instance, target)

    def _start_or_thaw(self, instance: Instance) -> None:
        """Start the sandbox; thaw it when held (marked thawed first)."""
        api = self.engine.api
        if instance.held:
            mark = self._thaw_mark(instance.name, instance.runner_tag)
            make_private_dirs(mark.parent)
            open_private(mark, os.O_TRUNC).close()
            api.unpause(instance.container_id)
        else:
            api.start(instance.container_id)

    def _stop_again(self, instance: Instance) -> None:
        """Put a sandbox whose activation failed after it started back as it was before: paused when held (and no
        longer marked thawed), else stopped. Best effort: releasing it removes it either way."""
        api = self.engine.api
        with contextlib.suppress(Exception):
            if instance.held:
                api.pause(instance.container_id)
                self._unmark_thawed(instance.name, instance.runner_tag)
            else:
                api.kill(instance.container_id)
                api.wait(instance.container_id, timeout=10)

    def _verify_proxy(self, instance: Instance) -> None:
        """The egress proxy runs as it was built, allowing the sandbox's own list; otherwise the sandbox is stopped
        and refused."""
        assert instance.proxy is not None
        problems = egress.proxy_problems(self.engine.api.inspect_container(instance.proxy), instance.allowlist)
        if problems:
            self.engine.api.kill(instance.container_id)
            raise SandboxProviderFailed(f"activate: the egress proxy is not as built: {', '.join(problems)}")

    def _verify_sealed(self, instance: Instance, member: str = "activate") -> None:
        """After start, the engine reports every flag as set; otherwise the sandbox is stopped and refused."""
        info = self.engine.api.inspect_container(instance.container_id)
        host = info.get("HostConfig", {})
        problems = []
        if not info.get("State", {}).get("Running"):
            problems.append("not running")
        if not host.get("ReadonlyRootfs"):
            problems.append("root is writable")
        if host.get("NetworkMode") != "none":
            problems.append("network is not none")
        if "ALL" not in (host.get("CapDrop") or []):
            problems.append("capabilities kept")
        if "no-new-privileges" not in (host.get("SecurityOpt") or []):
            problems.append("new privileges allowed")
        writable = set(instance.writable)
        for mount in info.get("Mounts") or []:
            if mount.get("Destination") in writable:
                continue  # a writable mount (:rw) is a writable area by request, sized within disk_mib
            if mount.get("Destination") in instance.mounts and mount.get("RW"):
                problems.append(f"mount {mount.get('Destination')} is writable")
        if problems:
            self.engine.api.kill(instance.container_id)
            raise SandboxProviderFailed(f"{member}: the engine did not apply the sandbox flags: {', '.join(problems)}")

    async def activate(self, request: ActivateRequest) -> InstanceResult:
        """Flush staged files into the mount volumes, drop the stager, start the sandbox with its mounts read-only,
        and fill its writable areas when it is a clone or a resumed snapshot.

        Raises:
            SandboxStateConflict: the instance is not provisioning.
            SandboxNotFound: the snapshot or clone data it restores from is gone.
            SandboxProviderFailed: the engine failed to start it or did not apply every flag.
        """
        record = self._records.get(self._check_identity(request))
        staged = record.staged if record is not None else None
        instance = staged if staged is not None else await self._resolve(request, "activate")
        transition(instance.state, "activate")
        name, container_id = instance.name, instance.container_id
        self._records.move(name, container_id, "activate")
        try:
            await self.engine.run("activate", self._activate_blocking, instance)
        except BaseException:
            self._records.move(name, container_id, "fail")
            raise
        self._records.move(name, container_id, "activated", dataclasses.replace(instance, state="active", running=True))
        return InstanceResult(**echo(request, state="active"))

    # published ports (not a wire member: ``checkfu.contract.ports.PortPublisher``) -------------

    async def publish_port(
        self, *, allocation_key: str, instance_id: str, runner_tag: str, spec: PortSpec
    ) -> PublishedPort:
        """Publish port ``spec.port`` of the running sandbox on ``spec.host:spec.host_port`` of the engine's host
        (``ports.py``): a door in the sandbox's network namespace and a porter on the host, removed with it.
        The sandbox keeps its network as it is.

        Raises:
            SandboxNotFound: no such running instance of that allocation.
            SandboxCapabilityUnavailable: (field ``-p``) the engine has no ``egress_image`` (python3) to run them.
            SandboxProviderFailed: (field ``-p``) the door or the porter did not open (address taken, a port
                below 1024, a namespace with more than ``lo``).
        """
        name = L.instance_name(allocation_key)
        if instance_id != name:
            raise SandboxNotFound(
                f"instance_id: {instance_id!r} is not the instance of allocation {allocation_key!r}",
                field="instance_id",
            )
        found = await self.engine.run("publishPort", self._inspect_blocking, name, allocation_key)
        if found is None or found.state != "active" or not found.running:
            raise SandboxNotFound(f"instance_id: {name!r} is not a running sandbox", field="instance_id")
        if self._egress_image_id() is None:
            raise SandboxCapabilityUnavailable(
                [Unmet("-p", f"publishing a port needs the image {self.egress_image!r} (with python3) on this engine")]
            )
        return await self.engine.run(
            "publishPort",
            functools.partial(
                ports.open_port,
                self.engine.api,
                instance=name,
                image=self.egress_image,
                key=allocation_key,
                tag=runner_tag,
                spec=spec,
            ),
        )

    # exec, openProcess ----------------------------------------------------------------------

    async def exec(self, request: ExecRequest) -> ExecResult:
        """Run one process as the sandbox user, through the Engine API; kill its group at the timeout.

        Raises:
            SandboxStateConflict: the instance is not active.
            SandboxNotFound: no such instance.
            SandboxProviderFailed: the sandbox stopped, or the engine failed the exec.
        """
        container_id = await self._running_id(request, "exec")
        user = await self._process_user()
        cancel = threading.Event()
        try:
            outcome: ExecOutcome = await self.engine.run(
                "exec",
                run_exec,
                self.engine,
                container_id=container_id,
                argv=list(request.argv),
                env=dict(request.env),
                cwd=request.cwd or self.user.home,
                user=user,
                stdin=request.stdin,
                cap=request.max_output_bytes,
                timeout=request.timeout_ms / 1000,
                cancel=cancel,
            )
        except asyncio.CancelledError:
            cancel.set()
            raise
        except SandboxError as exc:
            if exc.code in ("SandboxNotFound", "SandboxStateConflict"):
                await self._explain(request, "exec", exc)
            raise
        return ExecResult(
            **echo(
                request,
                exit_code=outcome.exit_code,
                timed_out=outcome.timed_out,
                stdout=outcome.stdout,
                stderr=outcome.stderr,
                stdout_truncated=outcome.stdout_truncated,
                stderr_truncated=outcome.stderr_truncated,
            )
        )

    async def _process_user(self) -> str:
        """The ``uid:gid`` of the next process: the sandbox user under a group of its own (``spec.ProcessGroups``)."""
        if self._groups is None:
            info = await self.engine.info()
            options = [o for o in info.get("SecurityOptions") or [] if isinstance(o, str)]
            # a remapped or rootless engine maps only a subordinate range of group ids into its sandboxes
            remapped = any({"name=userns", "name=rootless"} & set(o.split(",")) for o in options)
            if self._groups is None:
                self._groups = spec.ProcessGroups(remapped=remapped)
        return self._groups.user(self.user)

    def _open_blocking(
        self, container_id: str, request: OpenProcessRequest, user: str
    ) -> tuple[str, Any, bytes, int | None]:
        api = self.engine.api
        tty = request.tty is not None
        created = api.exec_create(
            container_id,
            list(request.argv),
            stdout=True,
            stderr=True,
            stdin=True,
            tty=tty,
            environment=dict(request.env) or None,
            workdir=request.cwd or self.user.home,
            user=user,
            privileged=False,
        )
        exec_id = str(created["Id"])
        sock, initial = hijack(self.engine.dial, self.engine.api_version, exec_id, tty=tty)
        try:
            if request.tty is not None:
                resize_exec(api, exec_id, request.tty.rows, request.tty.cols)
            pid = sandbox_pid(self.engine, exec_id, container_id)
        except BaseException:
            sock.close()
            raise
        return exec_id, sock, initial, pid

    async def open_process(self, request: OpenProcessRequest) -> DockerProcess:
        """Start one process as the sandbox user with streamed stdin, stdout and stderr.

        Raises:
            SandboxStateConflict: the instance is not active.
            SandboxNotFound: no such instance.
        """
        container_id = await self._running_id(request, "openProcess")
        user = await self._process_user()
        try:
            exec_id, sock, initial, pid = await self.engine.run(
                "openProcess", self._open_blocking, container_id, request, user
            )
        except SandboxError as exc:
            if exc.code in ("SandboxNotFound", "SandboxStateConflict"):
                await self._explain(request, "openProcess", exc)
            raise
        started = ProcessStarted(**echo(request, process_id=exec_id, pid=pid))
        launch = (request.argv[0], request.cwd or self.user.home, dict(request.env))
        return DockerProcess(
            self.engine, started, sock, initial, container_id, tty=request.tty is not None, launch=launch
        )

    # readFiles, listDir ---------------------------------------------------------------------

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult:
        """The regular files at ``paths`` (never through a symlink's final component); the rest in ``missing``.

        Raises:
            SandboxStateConflict: the instance is not active.
            SandboxBoundExceeded: the files hold more than ``max_bytes`` together.
        """
        instance = await self._resolve(request, "readFiles")
        found, missing = await self.engine.run(
            "readFiles", files.read_files, self.engine.api, instance.container_id, request.paths, request.max_bytes
        )
        return ReadFilesResult(**echo(request, files=tuple(found), missing=tuple(missing)))

    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        """What is at the path (``missing``, ``file``, ``symlink``, ``other``: answered, not raised) and, for a
        directory, its entries, one level or all, at most ``max_entries``; links are listed, never followed.

        Raises:
            SandboxStateConflict: the instance is not active.
            SandboxNotFound: no such instance.
        """
        instance = await self._resolve(request, "listDir")
        kind, entries, truncated = await self.engine.run(
            "listDir",
            files.list_dir,
            self.engine.api,
            instance.container_id,
            request.path,
            recursive=request.recursive,
            max_entries=request.max_entries,
        )
        return ListDirResult(**echo(request, path=request.path, kind=kind, entries=tuple(entries), truncated=truncated))

    # snapshot family ------------------------------------------------------------------------

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        """Capture every writable area (the sandbox paused meanwhile) as an image labelled with
        ``snapshot_allocation_key``.

        Raises:
            SandboxStateConflict: the instance is not active.
            SandboxProviderFailed: the sandbox stopped, or the capture failed.
        """
        instance = await self._thawed(await self._resolve(request, "snapshot"))
        self._require_running(instance)
        extra = {L.SOURCE_KEY: request.allocation_key, L.RETENTION: instance.retention}
        expires_at = None
        if request.keep_seconds is not None:  # from before the capture: never later than asked
            expires_at = format_timestamp(self.wall() + request.keep_seconds)
            extra[L.EXPIRES_AT] = expires_at
        labels = L.object_labels(request.snapshot_allocation_key, instance.runner_tag, "snapshot", **extra)
        snapshot_id = await self.engine.run(
            "snapshot", self._take_blocking, instance, labels, request.snapshot_allocation_key
        )
        return SnapshotResult(
            **echo(
                request,
                snapshot_allocation_key=request.snapshot_allocation_key,
                snapshot_id=snapshot_id,
                expires_at=expires_at,
            )
        )

    def _plan_handle(self, instance: Instance) -> Handle:
        """The handle ``instance`` would have (``snapshots.handle_spec``), from the engine's inspect of it."""
        api = self.engine.api
        info = api.inspect_container(instance.container_id)
        image = str(info.get("Image") or "")
        volumes = snapshots.area_volumes(info, instance.areas)
        name = snapshots.handle_name(instance.name)
        labels = L.object_labels(instance.labels.get(L.ALLOCATION_KEY, ""), instance.runner_tag, "handle")
        config = snapshots.handle_spec(api, name=name, image=image, volumes=volumes, labels=labels, read_only=False)
        return Handle(name=name, container=instance.container_id, image=image, volumes=volumes, config=config)

    def _drop_handle(self, instance: Instance) -> None:
        """Forget ``instance``'s handle and remove it in the background (``release`` and ``compensate`` wait)."""
        self._records.drop_handle(instance.name)
        remove = functools.partial(snapshots.remove_handle, self.engine.api, snapshots.handle_name(instance.name))
        self._in_background(instance.name, remove)

    def _through_handle(self, instance: Instance, capture: Callable[[Handle, bool], T]) -> T:
        """``capture(handle, fresh)`` through ``instance``'s handle (``fresh``: not made yet, ``capture`` makes
        it while the sandbox is being paused), which is kept for the next capture, or dropped if it failed."""
        # A release waits for this capture (its thread goes on when the caller's deadline cancels the await), so
        # that it finds the handle made here and removes it and the areas it holds.
        running: Future[None] = Future()
        record = self._records.get(instance.name)
        handle = record.handle if record is not None else None
        self._records.add_background(instance.name, running)
        try:
            fresh = handle is None or handle.container != instance.container_id
            if handle is None or fresh:
                handle = self._plan_handle(instance)
            try:
                result = capture(handle, fresh)
            except BaseException:
                self._drop_handle(instance)  # made again at the next capture
                raise
            self._records.keep_handle(instance.name, handle)
            return result
        finally:
            running.set_result(None)

    def _take_blocking(self, instance: Instance, labels: dict[str, str], key: str) -> str:
        """Capture ``instance``'s areas as a snapshot image labelled ``labels`` and with its root image."""
        api = self.engine.api

        def take(handle: Handle, fresh: bool) -> str:
            tagged = {**labels, L.ROOT_IMAGE: handle.image} if handle.image else labels
            return snapshots.take(
                api, instance.container_id, instance.areas, instance.mounts, tagged, handle.config, fresh
            )

        with self._capturing(instance, key, instance.runner_tag):
            return self._through_handle(instance, take)

    # a capture cut short ------------------------------------------------------------------------

    def _capture_mark(self, key: str, runner_tag: str) -> Path:
        """The file that says a capture for allocation ``key`` (a snapshot's, or a clone's) may have paused a
        sandbox: written before the pause, removed once the sandbox is thawed again. One whose process is gone
        names the sandbox a reclaim of ``key`` thaws (``_thaw_left``)."""
        return self.state_dir / "capturing" / f"{key}~{runner_tag}"

    @contextlib.contextmanager
    def _capturing(self, instance: Instance, key: str, runner_tag: str) -> Iterator[None]:
        """Mark (on disk) and note (in this object) a capture of ``instance`` for allocation ``key`` while it runs:
        a process that dies meanwhile leaves the mark, and a reclaim of ``key`` in this process waits for it."""
        mark = self._capture_mark(key, runner_tag)
        make_private_dirs(mark.parent)
        doc = {"container": instance.container_id, "name": instance.name, "process": _this_process()}
        with open_private(mark, os.O_TRUNC) as out:
            out.write(json.dumps(doc).encode())
        done: Future[None] = Future()
        with self._guard:
            self._captures[key] = done
        try:
            yield
        finally:
            mark.unlink(missing_ok=True)
            with self._guard:
                self._captures.pop(key, None)
            done.set_result(None)

    def _thaw_left(self, key: str, runner_tag: str | None) -> None:
        """Before allocation ``key`` is reclaimed: wait for a capture for it still running in this process (it
        thaws its sandbox itself, and an image it is importing lands before the reclaim looks for it), then thaw
        each sandbox a capture for ``key`` left paused when its process died. The engine's word decides: only a
        sandbox the engine reports paused is thawed, and not while another live process captures it."""
        with self._guard:
            running = self._captures.get(key)
        if running is not None:
            with contextlib.suppress(Exception):
                running.result(timeout=CAPTURE_WAIT)
        root = self.state_dir / "capturing"
        if not root.exists():
            return
        for mark in root.glob(f"{key}~{runner_tag or '*'}"):
            try:
                doc = json.loads(mark.read_text(encoding="utf-8"))
                container = str(doc["container"])
            except (OSError, ValueError, KeyError, TypeError):
                mark.unlink(missing_ok=True)
                continue
            if _process_alive(str(doc.get("process", ""))):
                continue  # its capture is still going on in another process, which thaws it
            others = [m for m in root.glob("*~*") if m != mark and _marks(m, container)]
            if not others:
                self._thaw(container)
            mark.unlink(missing_ok=True)

    def _thaw(self, container: str) -> None:
        """Unpause ``container`` if the engine says it is paused (a held sandbox waiting for its Run stays paused)."""
        api = self.engine.api
        try:
            info = api.inspect_container(container)
        except Exception as exc:
            if _status(exc) == 404:
                return
            raise
        state = info.get("State") or {}
        labels = info.get("Config", {}).get("Labels") or {}
        if not state.get("Paused"):
            return
        if (
            labels.get(L.HOLD) == "1"
            and not self._thaw_mark(str(info.get("Name", "")).lstrip("/"), labels.get(L.RUNNER_TAG, "")).exists()
        ):
            return
        try:
            api.unpause(container)
        except Exception as exc:
            if _status(exc) not in (404, 409):
                raise

    def _capture_blocking(self, instance: Instance, key: str, runner_tag: str) -> IO[bytes]:
        """Capture ``instance``'s areas into a spool (a clone's carrier, before it is kept)."""
        api = self.engine.api

        def capture(handle: Handle, fresh: bool) -> IO[bytes]:
            spool = tempfile.SpooledTemporaryFile(max_size=snapshots.SPOOL_BYTES)  # noqa: SIM115 (returned)
            try:
                snapshots.capture(
                    api, instance.container_id, instance.areas, instance.mounts, handle.config, fresh, spool
                )
            except BaseException:
                spool.close()
                raise
            spool.seek(0)
            return spool

        with self._capturing(instance, key, runner_tag):
            return self._through_handle(instance, capture)

    # expiry -----------------------------------------------------------------------------------

    def _expired(self, labels: Mapping[str, str] | None) -> bool:
        raw = (labels or {}).get(L.EXPIRES_AT)
        if not raw:
            return False
        try:
            return parse_timestamp(raw) <= self.wall()
        except ValueError:
            return False  # not a label this provider wrote: never delete on a guess

    def _sweep_blocking(self, runner_tag: str | None) -> list[str]:
        api = self.engine.api
        selector = L.label_filter(runner_tag=runner_tag, kind="snapshot")
        selector["label"].append(L.EXPIRES_AT)
        deleted = []
        for image in api.images(filters=selector):
            if self._expired(image.get("Labels")):
                try:
                    if self._gone(lambda i=image: api.remove_image(i["Id"])):
                        deleted.append(str(image["Id"]))
                except SandboxProviderFailed:
                    continue  # in use or being removed: the next sweep takes it
        return deleted

    async def sweep_expired(self, runner_tag: str | None = None) -> list[str]:
        """Delete every snapshot image (of ``runner_tag``, or of every tag) whose expiry has passed; their ids."""
        return await self.engine.run("sweep", self._sweep_blocking, runner_tag)

    async def _sweep_in_passing(self, runner_tag: str) -> None:
        """Sweep ``runner_tag``'s expired snapshots, at most once per ``SWEEP_INTERVAL``; never fails the call."""
        now = time.monotonic()
        with self._guard:
            if now - self._swept.get(runner_tag, -SWEEP_INTERVAL) < SWEEP_INTERVAL:
                return
            self._swept[runner_tag] = now
        with contextlib.suppress(SandboxError):
            await self.sweep_expired(runner_tag)

    def _delete_snapshot_blocking(self, snapshot_key: str, snapshot_id: str) -> bool:
        labels = self._snapshot_labels(snapshot_id)
        if labels is None:
            return False
        if labels.get(L.ALLOCATION_KEY) != snapshot_key or L.kind_of(labels) != "snapshot":
            raise SandboxNotFound(
                f"snapshot_id: {snapshot_id!r} is not a snapshot of allocation {snapshot_key!r}", field="snapshot_id"
            )
        return self._gone(lambda: self.engine.api.remove_image(snapshot_id)) == 1

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult:
        """Remove a snapshot's image; ``deleted`` says whether this call removed it (idempotent).

        Raises:
            SandboxNotFound: the id names an image that is not this allocation's snapshot.
        """
        check_target(request, self.target)
        deleted = await self.engine.run(
            "deleteSnapshot", self._delete_snapshot_blocking, request.snapshot_allocation_key, request.snapshot_id
        )
        return DeleteSnapshotResult(
            **echo(
                request,
                snapshot_allocation_key=request.snapshot_allocation_key,
                snapshot_id=request.snapshot_id,
                deleted=deleted,
            )
        )

    # inspect, release, compensate, listAllocations -------------------------------------------

    async def inspect(self, request: InspectRequest) -> InstanceResult:
        """The instance's real state: ``provisioning``, ``active``, or ``released`` when this object released it.

        Raises:
            SandboxNotFound: no such instance (or it is gone and this object did not release it).
        """
        name, found = await self._find(request)
        if found is None:
            if self._released(name):
                return InstanceResult(**echo(request, state=transition("released", "inspect")))
            raise SandboxNotFound(f"instance_id: {name!r} does not exist", field="instance_id")
        return InstanceResult(**echo(request, state=transition(found.state, "inspect")))

    def _reclaim_blocking(self, *, allocation_key: str, runner_tag: str | None, snapshots_of: bool) -> int:
        """Remove every object labelled with ``allocation_key`` (and ``runner_tag`` when given): containers,
        then volumes, then images, then the staging spool; with ``snapshots_of``, also every snapshot taken
        from the allocation. The number of objects removed."""
        api = self.engine.api
        self._thaw_left(allocation_key, runner_tag)
        self._records.settle(L.instance_name(allocation_key))
        self._records.drop_handle(L.instance_name(allocation_key))  # a container of the key: removed below
        count = 0
        selector = L.label_filter(allocation_key=allocation_key, runner_tag=runner_tag)
        for container in api.containers(all=True, filters=selector):
            count += self._gone(lambda c=container: api.remove_container(c["Id"], force=True))
        volumes = api.volumes(filters=selector).get("Volumes") or []
        removals = [
            self._fanout.submit(self._gone, lambda v=v: api.remove_volume(v["Name"], force=True)) for v in volumes
        ]
        count += sum(f.result() for f in removals)
        images = list(api.images(filters=selector))
        if snapshots_of:
            images += api.images(
                filters=L.label_filter(runner_tag=runner_tag, kind="snapshot", **{L.SOURCE_KEY: allocation_key})
            )
        for image in images:
            count += self._gone(lambda i=image: api.remove_image(i["Id"], force=False, noprune=False))
        name = L.instance_name(allocation_key)
        self._unmark_thawed(name, runner_tag)
        return (
            count
            + self.spools.discard(name, runner_tag)
            + self._discard_carrier(name, runner_tag)
            + discard_writable(self.rw_spools, name, runner_tag)
        )

    @staticmethod
    def _gone(remove: Any) -> int:
        """1 when ``remove()`` removed its object, 0 when it was gone already.

        Raises:
            SandboxProviderFailed: retryable, when the engine answers 409: the object is being removed by
                another call, or still in use (an image a container runs); a reclaim is never a state conflict.
        """
        try:
            remove()
        except Exception as exc:
            status = _status(exc)
            if status == 404:
                return 0
            if status == 409:
                raise SandboxProviderFailed(
                    "reclaim: the engine is busy with an object of the allocation (409: being removed, or in use); "
                    "retry",
                    retryable=True,
                ) from exc
            raise
        return 1

    def _all(self, *calls: Callable[[], T]) -> list[T]:
        """Run independent blocking calls at once (the first in this thread) and wait for every one of them.

        Raises:
            the first call's error, in the order given, after all have finished.
        """
        futures = [self._fanout.submit(c) for c in calls[1:]]
        results: list[T] = []
        error: BaseException | None = None
        try:
            results.append(calls[0]())
        except BaseException as exc:
            error = exc
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error
        return results

    def _release_blocking(self, instance: Instance, zdr: bool, read_back: bool = False) -> None:
        """Remove what ``instance`` is made of, found from the container itself; with ``zdr``, its snapshots too.

        Two rounds of engine calls, each issued at once: the containers (and the look-ups of the images to
        remove), then the volumes they mounted and those images. An instance ``read_back`` from the engine
        (not made by this provider) may have a handle this provider does not know of: it is removed by name,
        and its areas (among the volumes read back) by name after it.
        """
        api = self.engine.api
        self._records.move(instance.name, instance.container_id, "release")
        self._records.settle(instance.name)
        handle = self._records.drop_handle(instance.name)
        key = instance.labels.get(L.ALLOCATION_KEY, "")
        stager, restore = instance.stager, instance.restore
        first: list[Callable[[], Any]] = [
            lambda: self._gone(lambda: api.remove_container(instance.container_id, force=True, v=True))
        ]
        if stager is not None:
            first.append(lambda: self._gone(lambda: api.remove_container(stager, force=True)))
        if instance.proxy is not None:
            for helper in (instance.proxy, egress.door_name(instance.name)):
                first.append(functools.partial(self._gone, functools.partial(api.remove_container, helper, force=True)))
        first.append(functools.partial(self._release_ports, instance.name, key))
        # A handle mounts the areas too: the sandbox's removal cannot take them while it is there, so they are
        # removed by name after it (they are among the volumes of an instance read back from the engine).
        has_handle = handle is not None or read_back
        if has_handle:
            remove = functools.partial(snapshots.remove_handle, api, snapshots.handle_name(instance.name))
            first.append(remove)
        if restore is not None:
            first.append(lambda: {} if restore == snapshots.CARRIER else self._snapshot_labels(restore) or {})
        if zdr:
            selector = L.label_filter(runner_tag=instance.runner_tag, kind="snapshot", **{L.SOURCE_KEY: key})
            first.append(lambda: api.images(filters=selector))
        found = self._all(*first)
        volumes = instance.volumes + ((egress.socket_volume(instance.name),) if instance.proxy is not None else ())
        if not has_handle:
            # Only the volumes named after the instance (its mounts', its egress socket's) outlive its container:
            # the anonymous ones (its areas, among the volumes of one read from the engine) went with it (v=True).
            volumes = tuple(v for v in volumes if v.startswith(f"{instance.name}-"))
        if handle is not None:
            volumes += tuple(v for v in handle.volumes if v not in volumes)
        second: list[Callable[[], int]] = [
            functools.partial(self._gone, functools.partial(api.remove_volume, v, force=True)) for v in volumes
        ]
        if restore is not None:
            labels = found[2 + (stager is not None) + 2 * (instance.proxy is not None) + has_handle]
            if L.kind_of(labels) == "carrier" and labels.get(L.ALLOCATION_KEY) == key:
                second.append(functools.partial(self._gone, functools.partial(api.remove_image, restore)))
        if zdr:
            second += [functools.partial(self._gone, functools.partial(api.remove_image, i["Id"])) for i in found[-1]]
        if second:
            self._all(*second)
        self.spools.discard(instance.name, instance.runner_tag)
        self._discard_carrier(instance.name, instance.runner_tag)
        discard_writable(self.rw_spools, instance.name, instance.runner_tag)
        self._unmark_thawed(instance.name, instance.runner_tag)

    def _release_ports(self, instance: str, key: str) -> int:
        """Remove the ports door and porters of ``instance``, then their socket volume (none: one list call)."""
        found = ports.helpers(self.engine.api, key)
        if not found:
            return 0
        removed = 0
        for c in found:  # this runs in the pool already: one after the other, not in it again
            removed += self._gone(functools.partial(self.engine.api.remove_container, c["Id"], force=True))
        return removed + self._gone(
            functools.partial(self.engine.api.remove_volume, ports.socket_volume(instance), force=True)
        )

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        """Remove the sandbox and everything of its allocation (killing every process it started); for
        ``ephemeral_zdr`` also every snapshot taken from it. Idempotent: a second call returns the same identity.

        Raises:
            SandboxIdentityMismatch: the request is for another adapter.
            SandboxNotFound: the instance belongs to another allocation.
            SandboxProviderFailed: retryable, when the engine is busy with an object of it (removing it already).
        """
        name = self._check_identity(request)
        record = self._records.get(name)
        known = record.view if record is not None else None
        found = known if known is not None else (await self._find(request))[1]
        if found is not None:
            transition(found.state, "release")
            zdr = found.retention != "durable"
            await self.engine.run("release", self._release_blocking, found, zdr, known is None)
        else:
            # Gone already (a second release, or released elsewhere): sweep what still carries the key.
            # Snapshots carry their own keys and are left alone: a durable release keeps them.
            transition("released", "release")
            await self.engine.run(
                "release",
                self._reclaim_blocking,
                allocation_key=request.allocation_key,
                runner_tag=None,
                snapshots_of=False,
            )
        self._records.forget(name)
        return ReleaseResult(**echo(request, state="released", destroyed=True))

    async def compensate(self, request: CompensateRequest) -> CompensateResult:
        """Remove every container, volume and image labelled with both the allocation key and the runner tag,
        and the allocation's staging spool. Trusts nothing returned earlier; idempotent; works cold.

        Raises:
            SandboxIdentityMismatch: the request is for another adapter.
            SandboxProviderFailed: retryable, when the engine is busy with an object of the allocation (removing
                it already, or an image of it still in use).
        """
        check_target(request, self.target)
        await self._sweep_in_passing(request.runner_tag)
        count = await self.engine.run(
            "compensate",
            self._reclaim_blocking,
            allocation_key=request.allocation_key,
            runner_tag=request.runner_tag,
            snapshots_of=False,
        )
        self._records.forget(L.instance_name(request.allocation_key))
        return CompensateResult(**echo(request, reclaimed=count))

    def _list_blocking(self, runner_tag: str) -> list[AllocationEntry]:
        api = self.engine.api
        selector = L.label_filter(runner_tag=runner_tag)
        found: list[tuple[Mapping[str, str], str, AllocationKind]] = []
        for c in api.containers(all=True, filters=selector):
            labels = c.get("Labels") or {}
            found.append((labels, str(c["Id"]), "instance" if L.kind_of(labels) == "instance" else "other"))
        for v in api.volumes(filters=selector).get("Volumes") or []:
            found.append((v.get("Labels") or {}, str(v["Name"]), "volume"))
        for i in api.images(filters=selector):
            labels = i.get("Labels") or {}
            found.append((labels, str(i["Id"]), "snapshot" if L.kind_of(labels) == "snapshot" else "image"))
        entries = []
        for labels, object_id, kind in found:
            key = labels.get(L.ALLOCATION_KEY, "")
            try:
                entries.append(AllocationEntry(allocation_key=key, kind=kind, object_id=object_id))
            except ValueError:
                continue
        return entries

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult:
        """Every container, volume and image labelled with ``runner_tag``, with its allocation key and kind."""
        check_target(request, self.target)
        await self._sweep_in_passing(request.runner_tag)
        entries = await self.engine.run("listAllocations", self._list_blocking, request.runner_tag)
        return ListAllocationsResult(**echo(request, runner_tag=request.runner_tag, allocations=tuple(entries)))
