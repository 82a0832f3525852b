"""One command in one sandbox, through the whole seam: the job behind ``checkfu run``.

Phases, in order: resolve mounts (read and verify every byte), select and check
(no provider work before this passes), materialize, provision, stage, activate,
the process, capture, release. Any failure or cancellation after provisioning
releases and compensates; nothing is left behind.
"""

from __future__ import annotations

import asyncio
import platform as host_platform
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from checkfu.contract.errors import SandboxError, SandboxPathRejected
from checkfu.contract.ports import PortSpec, PublishedPort
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.vocabulary import Platform
from checkfu.core import owner_only
from checkfu.core.admission import (
    argv_problems,
    capture_problems,
    capture_spec,
    env_problems,
    raise_problems,
    target_problems,
    workdir_problems,
)
from checkfu.core.driver import CheckedProcess, Instance, RunSession
from checkfu.core.journal import JournalError
from checkfu.core.mounts import DirectorySource, GitSource, MountSpec, ResolvedMount, resolve_mount
from checkfu.core.output import MASK_MIN, OutputKeeper
from checkfu.core.pool import adopt
from checkfu.core.profiles import describe_resolved
from checkfu.core.runner import Attempt, Needs, Runner
from checkfu.core.syncback import sync_back

TIMEOUT_EXIT = 124
"""The exit status of a command stopped by ``timeout`` (as coreutils ``timeout`` reports it)."""
READ_BATCH = 1024
"""Paths per ``readFiles`` request: the contract's bound on one request."""

Interact = Callable[[CheckedProcess], Awaitable[None]]
"""Feeds an open process from the caller (stdin, terminal resizes) until cancelled; must end its stdin itself."""

PHASES = (
    "resolve",
    "select",
    "materialize",
    "provision",
    "stage",
    "activate",
    "process",
    "capture",
    "release",
)
POOL_PHASE = "adopt"
"""A Run with ``pool`` has this phase after ``select``; one that adopted a sandbox skips ``materialize`` and
``provision``."""


class Observer(Protocol):
    """What a person sees; the CLI renders it, tests record it."""

    def phase(self, name: str, seconds: float) -> None: ...

    async def before(self, name: str) -> None:
        """Called as phase ``name`` begins; may wait (a test pauses a Run here to interrupt it)."""

    def warning(self, text: str) -> None: ...

    def selected(self, attempt: Attempt) -> None: ...

    def stage_progress(self, done: int, total: int) -> None: ...

    def hash_progress(self, done: int, total: int) -> None:
        """Bytes of the mounts hashed so far (resolution); called from a worker thread."""

    def output(self, stream: str, data: bytes) -> None: ...

    def published(self, port: PublishedPort) -> None:
        """A port of the sandbox was published (``ports``), before the command starts."""


class QuietObserver:
    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.phases: dict[str, float] = {}
        self.warnings: list[str] = []

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = seconds

    async def before(self, name: str) -> None:
        pass

    def warning(self, text: str) -> None:
        self.warnings.append(text)

    def published(self, port: PublishedPort) -> None:
        pass

    def selected(self, attempt: Attempt) -> None:
        pass

    def stage_progress(self, done: int, total: int) -> None:
        pass

    def hash_progress(self, done: int, total: int) -> None:
        pass

    def output(self, stream: str, data: bytes) -> None:
        (self.out if stream == "out" else self.err).extend(data)


class _Keeping:
    """``inner``, with every chunk of output also kept in the journal by ``keeper``."""

    def __init__(self, inner: Observer, keeper: OutputKeeper) -> None:
        self.inner = inner
        self.keeper = keeper

    def phase(self, name: str, seconds: float) -> None:
        self.inner.phase(name, seconds)

    async def before(self, name: str) -> None:
        await self.inner.before(name)

    def warning(self, text: str) -> None:
        self.inner.warning(text)

    def selected(self, attempt: Attempt) -> None:
        self.inner.selected(attempt)

    def stage_progress(self, done: int, total: int) -> None:
        self.inner.stage_progress(done, total)

    def hash_progress(self, done: int, total: int) -> None:
        self.inner.hash_progress(done, total)

    def output(self, stream: str, data: bytes) -> None:
        self.keeper.feed(stream, data)
        self.inner.output(stream, data)

    def published(self, port: PublishedPort) -> None:
        self.inner.published(port)


def source_text(mount: ResolvedMount) -> str:
    """Where a resolved mount's bytes came from, as a person wrote it (``repo@ref`` for Git)."""
    src = mount.source
    return f"{src.repo}@{src.ref}" if isinstance(src, GitSource) else str(src.path)


def host_platform_value() -> Platform:
    machine = host_platform.machine().lower()
    arch = "arm64" if machine in ("aarch64", "arm64") else "amd64"
    return Platform(os="linux", architecture=arch)


@dataclass
class JobResult:
    run_id: str
    exit_code: int
    phases: dict[str, float] = field(default_factory=dict)
    captured: list[str] = field(default_factory=list)
    synced: list[dict[str, Any]] = field(default_factory=list)
    """Per ``:rw,sync`` mount, what was copied back (``checkfu.core.syncback.SyncReport.doc``)."""
    not_enforced: tuple[str, ...] = ()
    adapter: str = ""
    tier: str = ""
    staged_bytes: int = 0
    capture_dir: Path | None = None
    writable: tuple[str, ...] = ()
    """Targets of the mounts that are writable (``:rw``), hence not sealed."""
    left: dict[str, str] = field(default_factory=dict)
    """What is still held in the provider after release, by allocation key, with why (empty: nothing)."""
    undestroyed: dict[str, str] = field(default_factory=dict)
    """What ``release`` said it kept against the envelope's promise to destroy it (compensated since), by key."""
    unjournaled: dict[str, str] = field(default_factory=dict)
    """What the journal could not record (it was locked or unreachable): reconciliation settles it later."""
    adopted: str | None = None
    """With ``pool``: the allocation key of the pooled sandbox the Run adopted (``None``: it provisioned one)."""
    ports: list[PublishedPort] = field(default_factory=list)
    """The ports published for the Run (``ports``), open while its command ran."""
    timed_out: bool = False
    """The command ran past ``timeout`` and was killed (``exit_code`` is then ``TIMEOUT_EXIT``)."""


class _Phases:
    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.seconds: dict[str, float] = {}

    def run(self, name: str) -> _Timer:
        return _Timer(self, name)


class _Timer:
    def __init__(self, phases: _Phases, name: str) -> None:
        self.phases = phases
        self.name = name

    async def __aenter__(self) -> None:
        await self.phases.observer.before(self.name)
        self.t0 = time.perf_counter()

    async def __aexit__(self, *exc: object) -> None:
        took = time.perf_counter() - self.t0
        self.phases.seconds[self.name] = took
        self.phases.observer.phase(self.name, took)


async def run_job(
    runner: Runner,
    target: ExecutionTarget,
    profile: SandboxProfile,
    argv: Sequence[str],
    *,
    mounts: Sequence[MountSpec] = (),
    captures: Sequence[str] = (),
    capture_dir: Path | None = None,
    observer: Observer | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 3600.0,
    interact: Interact | None = None,
    tty: tuple[int, int] | None = None,
    capture_root: Path | None = None,
    resolved: Sequence[ResolvedMount] | None = None,
    owner: str | None = None,
    keep_output: int | None = None,
    noted: dict[str, object] | None = None,
    pool: bool = False,
    ports: Sequence[PortSpec] = (),
) -> JobResult:
    """Run ``argv`` in a fresh sandbox; returns its exit code and what happened.

    ``env`` and ``cwd`` are the process's; only the names of ``env`` are recorded, never a value.
    ``interact`` feeds the process from the caller (``-i``), ``tty`` gives it a pseudo-terminal
    of ``(rows, cols)`` (``-t``). Every input is checked before any work, every problem listed.
    Captures go to ``capture_dir``, else to ``capture_root/RUN`` (default ``captures/RUN``).
    ``resolved`` are ``mounts`` already resolved (``resolve_mounts``), by a caller that resolves
    them before it asks any provider anything. ``owner`` is the process the Run lives and dies with
    (``leases.current_owner()``, for a Run started in place): a Run it leaves behind is reaped as an
    orphan. With ``keep_output`` (a cap in bytes), the first that many bytes of output are kept in the
    journal as they stream (``checkfu logs``), every value of ``env`` masked; the summary says what was kept
    and dropped. ``noted`` goes into the Run's story as given, with ``timeout``; the summary says whether the
    command ``timed_out``. With ``pool``, the Run adopts a ready pooled sandbox of its adapter, profile
    digest, sealed mount targets and engine (``noted["engine"]``) when there is one (``checkfu.core.pool``),
    else provisions as always; either way its mounts are staged before it is activated. ``ports`` are published
    once the sandbox is active, before the command starts (``obs.published`` and ``result.ports`` say where), and
    closed with the sandbox.

    Raises:
        SandboxError: a refusal or a provider fault; whatever was allocated has been
            released or compensated before it propagates.
    """
    obs = observer or QuietObserver()
    phases = _Phases(obs)
    platform = host_platform_value()
    env = dict(env or {})
    raise_problems(
        argv_problems(argv)
        + env_problems(env)
        + workdir_problems(cwd)
        + target_problems([m.target for m in mounts])
        + capture_problems(captures)
    )
    if resolved is None:
        async with phases.run("resolve"):
            resolved = await resolve_mounts(mounts, obs)
    resolved = list(resolved)
    needs = Needs(
        terminal=tty is not None,
        writable_mounts=any(r.plan.writable for r in resolved),
        mount_symlinks=any(r.plan.has_symlinks for r in resolved),
        interactive=interact is not None,
        capture=bool(captures),
        capture_dirs=tuple(path for path, is_dir in map(capture_spec, captures) if is_dir),
    )
    async with phases.run("select"):
        # the Run's first records: off the event loop where the journal is offloaded (a serving runner)
        attempt = await runner.journal.work(
            runner.start,
            target,
            profile,
            platform=platform,
            mount_count=len(resolved),
            command=list(argv),
            needs=needs,
            owner=owner,
            mounts=[(r.plan, source_text(r)) for r in resolved],
            noted={
                "resolved_profile": describe_resolved(profile, timeout),
                **(noted or {}),
                "timeout": timeout,
            },  # the Run page's header
        )
    session = attempt.session
    keeper: OutputKeeper | None = None
    if keep_output is not None:
        keeper = OutputKeeper(runner.journal, session.run_id, runner.clock, cap=keep_output, mask=env.values())
        keeper.start()
        obs = _Keeping(obs, keeper)
        phases.observer = obs
    result = JobResult(
        run_id=session.run_id,
        exit_code=-1,
        not_enforced=attempt.not_enforced,
        adapter=str(attempt.adapter.target),
        staged_bytes=sum(r.plan.total_bytes for r in resolved),
        capture_dir=(capture_dir or (capture_root or Path("captures")) / session.run_id) if captures else None,
        writable=tuple(r.plan.target for r in resolved if r.plan.writable),
    )
    status = "failed"
    failure: SandboxError | None = None
    try:
        obs.selected(attempt)
        warning = attempt.warning()
        if warning:
            obs.warning(warning)
        await _drive(
            session,
            profile,
            platform,
            resolved,
            argv,
            captures,
            result.capture_dir,
            phases,
            obs,
            env,
            cwd,
            timeout,
            interact,
            tty,
            result,
            pool,
            str(noted["engine"]) if noted and "engine" in noted else None,
            ports,
        )
        status = "succeeded" if result.exit_code == 0 else "command_failed"
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    except SandboxError as exc:
        # A refusal is a Run that never got a sandbox: nothing was journaled for the provider to make. Once
        # something was, the provider was at work and the Run failed (its summary keeps the error's code).
        status = "failed" if session.core.rows else f"refused:{exc.code}"
        failure = exc
        raise
    finally:
        if keeper is not None:
            keeper.stop()
        t0 = time.perf_counter()
        # A Run that did not run its course asks the provider what it still holds before anyone says nothing is.
        interrupted = await _finish_releasing(session, confirm=status not in ("succeeded", "command_failed"))
        phases.seconds["release"] = time.perf_counter() - t0
        obs.phase("release", phases.seconds["release"])
        result.phases = phases.seconds
        result.left = dict(session.left)
        result.undestroyed = dict(session.undestroyed)
        summary: dict[str, object] = {
            "phases": phases.seconds,
            "captured": result.captured,
            "not_enforced": list(attempt.not_enforced),
            "env": sorted(env),
            "workdir": cwd,
            "tty": tty is not None,
            "stdin": interact is not None,
            "writable": list(result.writable),
            "timed_out": result.timed_out,
        }
        if result.synced:
            summary["synced"] = [{k: v for k, v in s.items() if k != "paths"} for s in result.synced]
        if pool:
            summary["adopted"] = result.adopted
        if failure is not None:
            summary["error"] = {"code": failure.code, "message": failure.message, "field": failure.field}
        if session.left:
            summary["left"] = session.left
        if session.undestroyed:
            summary["undestroyed"] = session.undestroyed
        if keeper is not None:
            summary.update(keeper.summary())
            short = sorted(name for name, value in env.items() if 0 < len(value.encode()) < MASK_MIN)
            if short:
                summary["output_unmasked_env"] = short
            if keeper.failure is not None:
                session.unjournaled["output"] = f"{keeper.lost} bytes of output were not kept: {keeper.failure}"
        try:
            await runner.journal.work(
                runner.finish,
                attempt,
                status=status,
                exit_code=result.exit_code if result.exit_code >= 0 else None,
                summary=summary,
            )
        except JournalError as exc:
            # The sandbox is released; only its record is missing. Reconciliation settles the Run later.
            session.unjournaled["run"] = f"its end was not recorded: {exc}"
        result.unjournaled = dict(session.unjournaled)
        if interrupted and status != "interrupted":
            raise asyncio.CancelledError
    return result


class _Stop(Exception):
    """Resolution was abandoned: the Run was cancelled while a worker thread hashed."""


async def resolve_mounts(mounts: Sequence[MountSpec], obs: Observer) -> list[ResolvedMount]:
    """Resolve every mount in a worker thread (hashing never blocks the loop, so a signal is taken at once);
    a cancellation stops the hashing at its next chunk."""
    stop = threading.Event()
    base = 0
    grand = 0

    def progress(done: int, total: int) -> None:
        if stop.is_set():
            raise _Stop
        obs.hash_progress(base + done, max(grand, base + total))

    out: list[ResolvedMount] = []
    try:
        for spec in mounts:
            mount = await asyncio.to_thread(resolve_mount, spec, progress=progress)
            base += mount.plan.total_bytes
            grand = base
            out.append(mount)
    except asyncio.CancelledError:
        stop.set()
        raise
    return out


async def _finish_releasing(session: RunSession, *, confirm: bool = False) -> bool:
    """Release and compensate everything of the Run, to the end, even through repeated cancellation (with
    ``confirm``, then ask the provider what it still holds: ``RunSession.release_all``).

    Returns whether a cancellation arrived meanwhile (the caller re-raises it afterwards).
    """
    interrupted = await _to_the_end(session.release_all(confirm=confirm))
    if interrupted and session.confirmed is None:  # a signal came as it released: it will be said what is left
        await _to_the_end(session.confirm())
    return interrupted


async def _to_the_end(work: Awaitable[object]) -> bool:
    """Await ``work`` to its end through any number of cancellations; returns whether one arrived meanwhile."""
    task = asyncio.ensure_future(work)
    interrupted = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            interrupted = True
    task.result()
    return interrupted


async def _drive(
    session: RunSession,
    profile: SandboxProfile,
    platform: Platform,
    resolved: Sequence[ResolvedMount],
    argv: Sequence[str],
    captures: Sequence[str],
    capture_dir: Path | None,
    phases: _Phases,
    obs: Observer,
    env: dict[str, str],
    cwd: str | None,
    timeout: float,
    interact: Interact | None,
    tty: tuple[int, int] | None,
    result: JobResult,
    pool: bool = False,
    engine: str | None = None,
    ports: Sequence[PortSpec] = (),
) -> None:
    inst: Instance | None = None
    if pool:
        async with phases.run(POOL_PHASE):
            inst = adopt(session, profile, [r.plan for r in resolved], engine=engine)
        result.adopted = inst.allocation_key if inst is not None else None
    if inst is None:
        async with phases.run("materialize"):
            image = (await session.materialize(profile, platform)).image
        async with phases.run("provision"):
            inst = await session.provision(profile, platform, image, resolved)
    async with phases.run("stage"):
        await session.stage(inst, resolved, progress=obs.stage_progress)
    async with phases.run("activate"):
        await session.activate(inst)
    if ports:
        async with phases.run("publish"):
            for spec in ports:
                published = await session.publish_port(inst, spec)
                result.ports.append(published)
                obs.published(published)
    async with phases.run("process"):
        result.exit_code, result.timed_out = await _process(session, inst, argv, obs, env, cwd, timeout, interact, tty)
    syncing = [r for r in resolved if r.sync and isinstance(r.source, DirectorySource)]
    if syncing and result.exit_code >= 0:
        async with phases.run("sync"):
            for r in syncing:
                assert isinstance(r.source, DirectorySource)
                report = await sync_back(session, inst, r.plan, r.source.path, r.excludes)
                for refused in report.refused:
                    obs.warning(f"{refused['code']} ({refused['field']}): {refused['message']}")
                result.synced.append(report.doc())
    if captures:
        async with phases.run("capture"):
            into = capture_dir or Path("captures") / session.run_id
            try:
                result.captured = await _capture(session, inst, captures, into, obs)
            except SandboxError as exc:
                exc.message = f"{exc.message} (capture failed after the command exited {result.exit_code})"
                exc.args = (exc.message,)
                raise


async def _process(
    session: RunSession,
    inst: Instance,
    argv: Sequence[str],
    obs: Observer,
    env: dict[str, str],
    cwd: str | None,
    timeout: float,
    interact: Interact | None,
    tty: tuple[int, int] | None,
) -> tuple[int, bool]:
    """The command's exit status, and whether it ran past ``timeout`` (then killed: ``TIMEOUT_EXIT``)."""
    if session.envelope.declares("openProcess"):
        proc = await session.open_process(inst, argv, env=env, cwd=cwd, tty=tty)
        feeding: asyncio.Future[None] | None = None
        try:
            # No member call renews the lease while the command streams: hold it for the whole timeout,
            # or reconciliation takes an expired lease (and the running sandbox) from a live Run. A lease kept by a
            # heartbeat (a runner of the fleet's) is renewed by it every fraction of its TTL, and a renewal is held
            # to that TTL anyway: there is nothing to renew here.
            if not session.leases.heartbeat:
                session.leases.renew(session.lease, ttl=max(session.leases.ttl, timeout + 120))
            if interact is None:
                await proc.close_stdin()
            else:
                feeding = asyncio.ensure_future(interact(proc))
            async with asyncio.timeout(timeout):
                async for event in proc.events():
                    if isinstance(event, ProcessOutput):
                        obs.output(event.stream, event.data)
                    elif isinstance(event, ProcessExit):
                        return event.exit_code, False
        except TimeoutError:
            obs.warning(f"the command ran longer than {timeout:g} s and was killed")
            return TIMEOUT_EXIT, True
        finally:
            if feeding is not None:
                feeding.cancel()
                await asyncio.gather(feeding, return_exceptions=True)
            await proc.kill()
        return -1, False  # unreachable: events() ends with an exit or raises
    res = await session.exec(inst, argv, env=env, cwd=cwd, timeout=timeout)
    obs.output("out", res.stdout)
    obs.output("err", res.stderr)
    return (TIMEOUT_EXIT, True) if res.timed_out else (res.exit_code, False)


async def _capture(session: RunSession, inst: Instance, paths: Sequence[str], into: Path, obs: Observer) -> list[str]:
    """Read each path back (a directory: every file below it) into ``into``, mirroring sandbox paths.

    Files are read in batches of at most ``READ_BATCH`` paths and the runner's read bound, each
    batch written out before the next is asked for. What cannot be captured is not an error of
    the Run: ``obs`` is warned, naming it (a missing path, a link, a name that is not UTF-8, a
    file over the read bound, a listing cut short by its bound). What it holds is the Run's output, the
    user's alone: each directory it makes is ``0700``, each file ``0600`` (``checkfu.core.owner_only``); a
    directory that exists keeps its mode, and a symbolic link where a file goes is never followed.

    Raises:
        SandboxPathRejected: a file cannot be written here (field ``capture-dir``, naming it).
    """
    files: dict[str, int] = {}
    missing: list[str] = []
    skipped: list[str] = []
    listing_dirs = session.envelope.declares("listDir")
    for text in paths:
        path, _ = capture_spec(text)  # a directory spec without listDir was refused at selection
        if not listing_dirs:
            files.setdefault(path, 0)  # a file, or nothing: readFiles returns it or reports it missing
            continue
        listing = await session.list_dir(inst, path, recursive=True)
        if listing.kind == "dir":
            for e in listing.entries:
                if e.kind == "file":
                    files.setdefault(e.path, e.size)
                elif e.kind in ("symlink", "other"):
                    skipped.append(e.path)
            if listing.truncated:
                obs.warning(
                    f"capture of {path}: the listing stopped at its bound of {len(listing.entries)} entries; "
                    "what lies beyond it is not captured (capture the subdirectories one by one)"
                )
        elif listing.kind == "file":
            files.setdefault(path, 0)
        elif listing.kind == "missing":
            missing.append(path)
        else:
            obs.warning(f"not captured, {path} is a {listing.kind} (links are never followed)")
    limit = session.limits.max_read_bytes
    too_big = [p for p, size in files.items() if size > limit]
    batches: list[list[str]] = [[]]
    held = 0
    for p, size in files.items():
        if size > limit:
            continue
        if len(batches[-1]) >= READ_BATCH or (batches[-1] and held + size > limit):
            batches.append([])
            held = 0
        batches[-1].append(p)
        held += size
    saved: list[str] = []
    for batch in batches:
        if not batch:
            continue
        result = await session.read_files(inst, batch)
        missing.extend(result.missing)
        for f in result.files:
            local = into / PurePosixPath(f.path).relative_to("/")
            try:
                owner_only.make_dirs(local.parent)
                owner_only.write_file(local, f.data)
            except OSError as exc:
                raise SandboxPathRejected(
                    f"capture {f.path}: cannot write {local}: {exc.strerror or exc}", field="capture-dir"
                ) from None
            saved.append(str(local))
    if missing and not listing_dirs:
        obs.warning(
            f"not captured, no such file in the sandbox: {', '.join(missing)} (a directory is not captured either: "
            "this provider does not serve listDir, so only files named one by one can be read back)"
        )
    elif missing:
        obs.warning(f"not captured, no such file in the sandbox: {', '.join(missing)}")
    if skipped:
        shown = ", ".join(skipped[:20]) + (f" and {len(skipped) - 20} more" if len(skipped) > 20 else "")
        obs.warning(f"not captured (a link, not a regular file, or a name that is not UTF-8): {shown}")
    if too_big:
        obs.warning(f"not captured, over the read bound of {limit} bytes each: {', '.join(too_big)}")
    return saved
