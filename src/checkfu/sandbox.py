"""The public SDK: ``checkfu.Sandbox`` and ``checkfu.AsyncSandbox``, a long-lived sandbox driven from code.

::

    import checkfu

    with checkfu.Sandbox(profile="examples/profiles/busybox-none.toml", provider="docker", ttl=600) as sb:
        sb.files.write("/tmp/hello.txt", b"hello\\n")
        result = sb.exec(["cat", "/tmp/hello.txt"])
        assert result.exit_code == 0 and result.stdout == b"hello\\n"

Every call goes through the runner (``checkfu.core.sandboxes``): selection and the capability
check before any provider work, every allocation journaled before it is asked for, every call
fenced by the sandbox's lease and recorded as an event of its Run. Nothing here knows one provider
from another: ``provider`` is a name from the registry (or a provider service's URL), and errors are
the contract's vocabulary (``checkfu.contract.errors``).

``AsyncSandbox`` is the core; ``Sandbox`` runs it on a private event loop thread.

A sandbox made here is owned by this process: when the process is gone, the next ``checkfu``
command reclaims it (``detach=True``: only its time-to-live ends it, as ``checkfu sandbox create``).
Any process attaches to a live sandbox with ``Sandbox.connect(sandbox_id)``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from checkfu.contract.errors import SandboxProviderFailed
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.contract.profile import SandboxProfile

if TYPE_CHECKING:
    from checkfu.core.driver import CheckedProcess
    from checkfu.core.journal import Journal
    from checkfu.core.mounts import MountSpec
    from checkfu.core.registry import Registry
    from checkfu.core.sandboxes import LiveSandbox, SandboxHost, SnapshotRecord

__all__ = [
    "AsyncProcess",
    "AsyncSandbox",
    "AsyncSandboxFiles",
    "CommandResult",
    "FileEntry",
    "Process",
    "Sandbox",
    "SandboxFiles",
    "SnapshotInfo",
]

T = TypeVar("T")
OnOutput = Callable[[bytes], None]
ProfileArg = SandboxProfile | Mapping[str, Any] | str | Path | None
TIMEOUT_EXIT = 124
"""The exit status of a command stopped at its ``timeout`` (as coreutils ``timeout`` reports it)."""


@dataclass(frozen=True)
class CommandResult:
    """A finished command: its exit status and its whole output."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False

    @property
    def text(self) -> str:
        """``stdout`` decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class FileEntry:
    """One entry of ``files.list``."""

    path: str
    kind: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a sandbox: ``Sandbox.resume(snapshot)`` makes a new sandbox from it."""

    snapshot_id: str
    sandbox_id: str
    """The sandbox it was taken of."""
    created_at: float
    expires_at: float | None
    """When its provider deletes it; ``None``: kept until deleted."""
    keep: float | None = None
    """The lifetime asked for, in seconds."""


@dataclass
class _Context:
    """A journal and a registry shared by every sandbox one ``AsyncSandbox`` call made (its clones and resumes)."""

    journal: Journal
    registry: Registry
    host: SandboxHost
    users: int = 1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def close(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.journal.close()


def _seconds(value: float | None, name: str, default: float) -> float:
    from checkfu.core.sandboxes import check_ttl  # noqa: PLC0415

    return check_ttl(default if value is None else value, field=name)


async def _open(
    provider: str, db: str | None, adapters: str | Path | None = None, *, site: str | None = None
) -> _Context:
    """Open the runner through its front door (``checkfu.runner.RunnerService``, which keeps the house as every
    ``checkfu`` command does) and load ``provider``: an installed provider by name (with the adapters file
    ``adapters``, default: the one ``CHECKFU_ADAPTERS`` names), or the provider service at a URL (``provider``
    itself, or ``site`` when a journal row places the sandbox at a service's endpoint), with
    ``CHECKFU_PROVIDER_CREDENTIAL`` or else the credential issued when it was enrolled."""
    from checkfu.core.registry import is_endpoint  # noqa: PLC0415
    from checkfu.runner import RunnerConfig, RunnerService  # noqa: PLC0415
    from checkfu.wire.credentials import read_credential  # noqa: PLC0415

    config = RunnerConfig.from_environment(journal_url=db, adapters=None if adapters is None else Path(adapters))
    service = await RunnerService.open_async(config)
    try:
        served = provider if is_endpoint(provider) else site if is_endpoint(site) else None
        given = read_credential(None) if served else None
        credentials = {served: given} if served and given is not None else None
        registry = await service.adapters([(provider, served)], credentials=credentials, adapters_file=not served)
        return _Context(service.journal, registry, service.sandboxes(registry))
    except BaseException:
        service.close()
        raise


async def _journal(db: str | None) -> Journal:
    """The journal at ``db`` (default: the state directory's), opened on a thread, with no house kept."""
    from checkfu.runner import RunnerConfig, RunnerService  # noqa: PLC0415

    service = await RunnerService.open_async(RunnerConfig.from_environment(journal_url=db), housekeeping=False)
    return service.journal


def _profile(profile: ProfileArg, provider: str) -> SandboxProfile:
    """The profile as the runner takes it (``checkfu.runner.RunnerService.profile``)."""
    from checkfu.runner import RunnerService  # noqa: PLC0415

    return RunnerService.profile(profile, provider)


def _mounts(mounts: Sequence[str | MountSpec] | None) -> list[MountSpec]:
    from checkfu.core.mounts import parse_mount  # noqa: PLC0415

    return [parse_mount(m) if isinstance(m, str) else m for m in mounts or ()]


def _argv(cmd: str | Sequence[str]) -> list[str]:
    """A command: a list of arguments as given, or a string run by ``sh -c`` (as E2B's ``commands.run``)."""
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


class AsyncProcess:
    """A process started with ``spawn``: write its stdin, let it stream, wait for it or kill it.

    Its output goes to ``on_stdout``/``on_stderr`` as it arrives, and is kept for ``wait``'s result.
    """

    def __init__(
        self, proc: CheckedProcess, on_stdout: OnOutput | None, on_stderr: OnOutput | None, timeout: float | None
    ) -> None:
        self._proc = proc
        self._out = bytearray()
        self._err = bytearray()
        self._on = {"out": on_stdout, "err": on_stderr}
        self._task: asyncio.Task[tuple[int, bool]] = asyncio.ensure_future(self._pump(timeout))

    @property
    def pid(self) -> int | None:
        """The process id inside the sandbox, when the provider reports one."""
        return getattr(self._proc.started, "pid", None)

    async def _pump(self, timeout: float | None) -> tuple[int, bool]:
        try:
            async with asyncio.timeout(timeout):
                async for event in self._proc.events():
                    if isinstance(event, ProcessOutput):
                        (self._out if event.stream == "out" else self._err).extend(event.data)
                        callback = self._on.get(event.stream)
                        if callback is not None:
                            callback(event.data)
                    elif isinstance(event, ProcessExit):
                        return event.exit_code, False
        except TimeoutError:
            await self._proc.kill()
            return TIMEOUT_EXIT, True
        raise SandboxProviderFailed("the process stream ended without an exit", field="events")

    async def send_stdin(self, data: bytes) -> None:
        await self._proc.send_stdin(data)

    async def close_stdin(self) -> None:
        await self._proc.close_stdin()

    async def wait(self) -> CommandResult:
        """The exit status and the whole output, once the process ended."""
        code, timed_out = await asyncio.shield(self._task)
        return CommandResult(code, bytes(self._out), bytes(self._err), timed_out)

    async def kill(self) -> None:
        await self._proc.kill()


class AsyncSandboxFiles:
    """``sb.files``: write, read and list files in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def write(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Write ``data`` to the absolute ``path`` (parents made). The image needs a POSIX ``sh``."""
        raw = data.encode() if isinstance(data, str) else data
        await self._sb._live.write_file(path, raw, mode=mode)

    async def read(self, path: str) -> bytes:
        """The bytes of the file at ``path``.

        Raises:
            SandboxNotFound: no file there (a directory, a link or nothing).
        """
        from checkfu.contract.errors import SandboxNotFound  # noqa: PLC0415

        res = await self._sb._live.read_files([path])
        for f in res.files:
            if f.path == path:
                return f.data
        raise SandboxNotFound(f"path: no file at {path} in sandbox {self._sb.sandbox_id}", field="path")

    async def list(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        """The entries of the directory ``path`` (links are never followed).

        Raises:
            SandboxNotFound: nothing at ``path``, or it is not a directory.
        """
        from checkfu.contract.errors import SandboxNotFound  # noqa: PLC0415

        res = await self._sb._live.list_dir(path, recursive=recursive)
        if res.kind != "dir":
            raise SandboxNotFound(f"path: {path} is {res.kind}, not a directory", field="path")
        return [FileEntry(e.path, e.kind, e.size, e.mode) for e in res.entries]


class AsyncSandbox:
    """A long-lived sandbox, driven with ``await``.

    ``async with AsyncSandbox(profile=..., mounts=[...], provider="docker", ttl=600) as sb:`` makes it
    on entry and releases it on exit; ``await AsyncSandbox.create(...)`` makes one to keep.
    ``profile`` is a ``SandboxProfile``, a mapping, or a TOML/JSON file (default: the provider's built-in
    one); ``mounts`` are ``SRC:TARGET[:rw]`` strings (or ``MountSpec``); ``ttl`` is in seconds (default 30
    minutes); ``db`` is a journal URL (default: the state directory's, as every ``checkfu`` command).
    """

    def __init__(
        self,
        *,
        profile: ProfileArg = None,
        mounts: Sequence[str | MountSpec] | None = None,
        provider: str = "docker",
        ttl: float | None = None,
        detach: bool = False,
        db: str | None = None,
        adapters: str | Path | None = None,
    ) -> None:
        self._args: dict[str, Any] | None = {
            "profile": profile,
            "mounts": mounts,
            "provider": provider,
            "ttl": ttl,
            "detach": detach,
            "db": db,
            "adapters": adapters,
        }
        self._ctx: _Context | None = None
        self._live_sb: LiveSandbox | None = None
        self._closed = False
        self._attached = False
        self.files = AsyncSandboxFiles(self)

    # making and finding ----------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        *,
        profile: ProfileArg = None,
        mounts: Sequence[str | MountSpec] | None = None,
        provider: str = "docker",
        ttl: float | None = None,
        detach: bool = False,
        db: str | None = None,
        adapters: str | Path | None = None,
    ) -> AsyncSandbox:
        """Make a sandbox and return it, active, its mounts staged. ``adapters``: an adapters file loaded besides
        the installed providers (default: ``CHECKFU_ADAPTERS``; ``checkfu.core.registry.read_adapters_file``).

        Raises:
            SandboxError: refused (a profile, mount or ttl named with its field), or a provider fault;
                nothing is left allocated.
        """
        sb = cls(profile=profile, mounts=mounts, provider=provider, ttl=ttl, detach=detach, db=db, adapters=adapters)
        await sb._make()
        return sb

    async def _make(self) -> None:
        from checkfu.core.job import QuietObserver, host_platform_value, resolve_mounts  # noqa: PLC0415
        from checkfu.core.registry import is_endpoint  # noqa: PLC0415
        from checkfu.runner import RunnerService  # noqa: PLC0415

        args, self._args = self._args, None
        if args is None:
            return
        ttl = _seconds(args["ttl"], "ttl", _default_ttl())
        specs = _mounts(args["mounts"])
        served = is_endpoint(args["provider"])
        prof = None if served else await asyncio.to_thread(_profile, args["profile"], args["provider"])
        resolved = await resolve_mounts(specs, QuietObserver())
        ctx = await _open(args["provider"], args["db"], args["adapters"])
        try:
            target = RunnerService.choose(ctx.registry, args["provider"])
            if prof is None:  # a provider service: the provider it serves decides who pins a tag, as in `checkfu run`
                prof = await asyncio.to_thread(_profile, args["profile"], target.provider)
            self._live_sb = await ctx.host.create(
                target,
                prof,
                host_platform_value(),
                mounts=resolved,
                specs=specs,
                ttl=ttl,
                detached=bool(args["detach"]),
            )
        except BaseException:
            ctx.close()
            raise
        self._ctx = ctx

    @classmethod
    async def connect(cls, sandbox_id: str, *, provider: str | None = None, db: str | None = None) -> AsyncSandbox:
        """Attach to a live sandbox by its id (made by any process); closing this one leaves it running.

        Raises:
            SandboxNotFound: no live sandbox of that id in the journal.
        """
        from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

        if provider is None:
            journal = await _journal(db)
            try:
                rec = SandboxBook(journal).get(sandbox_id)
            finally:
                journal.close()
            provider = rec.provider if rec is not None else "docker"
            site = rec.site if rec is not None else None
        else:
            site = None
        ctx = await _open(provider, db, site=site)
        sb = cls(provider=provider, db=db)
        sb._args = None
        try:
            sb._live_sb = ctx.host.attach(sandbox_id)
        except BaseException:
            ctx.close()
            raise
        sb._ctx = ctx
        sb._attached = True
        return sb

    @classmethod
    async def resume(
        cls,
        snapshot: SnapshotInfo | str,
        *,
        ttl: float | None = None,
        detach: bool = False,
        provider: str | None = None,
        db: str | None = None,
    ) -> AsyncSandbox:
        """A new sandbox holding ``snapshot``'s files.

        Raises:
            SandboxNotFound: no such snapshot, or it was deleted.
        """
        ref = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) else snapshot
        name, site = (provider, None) if provider else await _provider_of_snapshot(ref, db)
        ctx = await _open(name, db, site=site)
        try:
            live = await ctx.host.resume(ref, ttl=_seconds(ttl, "ttl", _default_ttl()), detached=detach)
        except BaseException:
            ctx.close()
            raise
        return cls._wrap(ctx, live)

    @classmethod
    def _wrap(cls, ctx: _Context, live: LiveSandbox) -> AsyncSandbox:
        sb = cls()
        sb._args = None
        sb._ctx = ctx
        sb._live_sb = live
        return sb

    async def __aenter__(self) -> AsyncSandbox:
        await self._make()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # what it is --------------------------------------------------------------------------------

    @property
    def _live(self) -> LiveSandbox:
        if self._live_sb is None:
            from checkfu.contract.errors import SandboxStateConflict  # noqa: PLC0415

            raise SandboxStateConflict(
                "the sandbox is not made yet: use `async with AsyncSandbox(...)` or `await AsyncSandbox.create(...)`",
                field="state",
            )
        if self._closed:
            from checkfu.contract.errors import SandboxStateConflict  # noqa: PLC0415

            raise SandboxStateConflict(f"sandbox {self._live_sb.sandbox_id} was closed", field="state")
        return self._live_sb

    @property
    def _made(self) -> LiveSandbox:
        """The sandbox, closed or not (its identity outlives ``close``)."""
        if self._live_sb is None:
            return self._live
        return self._live_sb

    @property
    def sandbox_id(self) -> str:
        return self._made.sandbox_id

    @property
    def run_id(self) -> str:
        """The Run that records every call made on this sandbox (``checkfu runs show``)."""
        return self._made.record.run_id

    @property
    def provider(self) -> str:
        return self._made.record.provider

    @property
    def expires_at(self) -> float:
        """The time-to-live deadline (seconds since the epoch), as the journal holds it now."""
        rec = self._live.host.book.get(self.sandbox_id)
        return rec.expires_at if rec is not None else self._live.record.expires_at

    # running -----------------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 60.0,
        stdin: bytes = b"",
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
    ) -> CommandResult:
        """Run ``cmd`` (a list of arguments, or a string for ``sh -c``) to its end.

        With ``on_stdout``/``on_stderr``, output is handed over as it arrives (through ``openProcess``
        where the provider declares it). A command still running at ``timeout`` seconds is killed and
        reported with exit status 124 and ``timed_out``.
        """
        argv = _argv(cmd)
        live = self._live
        if (on_stdout is None and on_stderr is None) or not live.streams():
            res = await live.exec(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout)
            if on_stdout is not None and res.stdout:
                on_stdout(res.stdout)
            if on_stderr is not None and res.stderr:
                on_stderr(res.stderr)
            code = TIMEOUT_EXIT if res.timed_out else res.exit_code
            return CommandResult(code, res.stdout, res.stderr, res.timed_out)
        proc = await self.spawn(argv, env=env, cwd=cwd, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        try:
            if stdin:
                await proc.send_stdin(stdin)
            await proc.close_stdin()
            return await proc.wait()
        finally:
            await proc.kill()

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
    ) -> AsyncProcess:
        """Start ``cmd`` and return its handle (stdin, streamed output, ``wait``, ``kill``).

        Raises:
            SandboxOperationUnsupported: the provider does not declare ``openProcess``.
        """
        proc = await self._live.open_process(_argv(cmd), env=env, cwd=cwd)
        return AsyncProcess(proc, on_stdout, on_stderr, timeout)

    # state -------------------------------------------------------------------------------------

    async def snapshot(self, *, keep: float | None = None) -> SnapshotInfo:
        """Snapshot the sandbox's files; ``keep`` asks for a lifetime in seconds: the snapshot is deleted once it
        passes (``expires_at`` says when)."""
        return _info(await self._live.snapshot(keep=keep))

    async def clone(self, *, ttl: float | None = None, detach: bool = False) -> AsyncSandbox:
        """A new sandbox holding this one's files as they are now."""
        ctx = self._ctx
        assert ctx is not None
        live = await ctx.host.clone(self._live, ttl=_seconds(ttl, "ttl", _default_ttl()), detached=detach)
        ctx.users += 1
        return AsyncSandbox._wrap(ctx, live)

    async def delete_snapshot(self, snapshot: SnapshotInfo | str) -> None:
        """Delete a snapshot through its provider (a snapshot already deleted is left as it is)."""
        ref = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) else snapshot
        ctx = self._ctx
        assert ctx is not None
        await ctx.host.delete_snapshot(ref)

    async def extend(self, ttl: float) -> float:
        """Set the time-to-live to ``ttl`` seconds from now; returns the new deadline."""
        return await self._live.extend(_seconds(ttl, "ttl", ttl))

    async def close(self) -> None:
        """Release the sandbox (a sandbox attached with ``connect`` is only let go of). Idempotent."""
        if self._closed or self._live_sb is None:
            self._closed = True
            return
        live = self._live_sb
        try:
            if not self._attached:
                await live.release()
        finally:
            self._closed = True
            if self._ctx is not None:
                self._ctx.close()


def _info(rec: SnapshotRecord) -> SnapshotInfo:
    return SnapshotInfo(rec.snapshot_ref, rec.sandbox_id, rec.created_at, rec.expires_at, rec.keep_seconds)


async def _provider_of_snapshot(ref: str, db: str | None) -> tuple[str, str | None]:
    """The provider a snapshot was taken on, and its site (a service's endpoint, if it is one)."""
    from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

    journal = await _journal(db)
    try:
        rec = SandboxBook(journal).snapshot(ref)
    finally:
        journal.close()
    return (rec.target.provider, rec.site) if rec is not None else ("docker", None)


def _default_ttl() -> float:
    from checkfu.core.sandboxes import DEFAULT_TTL  # noqa: PLC0415

    return DEFAULT_TTL


# the synchronous face --------------------------------------------------------------------------


class _Portal:
    """One private event loop on a daemon thread, shared by every ``Sandbox`` of this process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="checkfu-sandbox", daemon=True).start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def call(cls, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread and wait for it. Ctrl-C (``KeyboardInterrupt``) meanwhile cancels it
        and waits for it to wind up (a sandbox being made is released, its Run settled) before going on: the
        loop's thread is a daemon, which ends with this process, and the interrupt may end it at once."""
        loop = cls.loop()
        running: list[asyncio.Task[Any]] = []

        async def body() -> T:
            task = asyncio.current_task()
            if task is not None:
                running.append(task)
            return await coro

        future = asyncio.run_coroutine_threadsafe(body(), loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            # not started yet: cancelling the future stops it before it does anything
            loop.call_soon_threadsafe(lambda: running[0].cancel() if running else future.cancel())
            while True:
                try:
                    concurrent.futures.wait([future])
                    break
                except KeyboardInterrupt:
                    continue  # a second Ctrl-C does not cut the wind-up short
            raise


def _run(make: Callable[[], Awaitable[T]]) -> T:
    async def body() -> T:
        return await make()

    return _Portal.call(body())


class Process:
    """A process started with ``Sandbox.spawn``: the synchronous face of ``AsyncProcess``."""

    def __init__(self, inner: AsyncProcess) -> None:
        self._inner = inner

    @property
    def pid(self) -> int | None:
        return self._inner.pid

    def send_stdin(self, data: bytes) -> None:
        _run(lambda: self._inner.send_stdin(data))

    def close_stdin(self) -> None:
        _run(self._inner.close_stdin)

    def wait(self) -> CommandResult:
        return _run(self._inner.wait)

    def kill(self) -> None:
        _run(self._inner.kill)


class SandboxFiles:
    """``sb.files`` of a ``Sandbox``."""

    def __init__(self, inner: AsyncSandboxFiles) -> None:
        self._inner = inner

    def write(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        _run(lambda: self._inner.write(path, data, mode=mode))

    def read(self, path: str) -> bytes:
        return _run(lambda: self._inner.read(path))

    def list(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        return _run(lambda: self._inner.list(path, recursive=recursive))


class Sandbox:
    """A long-lived sandbox, made as soon as it is constructed; ``with`` releases it on exit.

    ``with checkfu.Sandbox(profile=..., mounts=[...], provider="docker", ttl=600) as sb:``. The
    arguments are ``AsyncSandbox``'s; so are the methods, without ``await``.
    """

    def __init__(
        self,
        *,
        profile: ProfileArg = None,
        mounts: Sequence[str | MountSpec] | None = None,
        provider: str = "docker",
        ttl: float | None = None,
        detach: bool = False,
        db: str | None = None,
        _inner: AsyncSandbox | None = None,
    ) -> None:
        if _inner is None:
            _inner = _run(
                lambda: AsyncSandbox.create(
                    profile=profile, mounts=mounts, provider=provider, ttl=ttl, detach=detach, db=db
                )
            )
        self._inner = _inner
        self.files = SandboxFiles(_inner.files)

    @classmethod
    def connect(cls, sandbox_id: str, *, provider: str | None = None, db: str | None = None) -> Sandbox:
        return cls(_inner=_run(lambda: AsyncSandbox.connect(sandbox_id, provider=provider, db=db)))

    @classmethod
    def resume(
        cls,
        snapshot: SnapshotInfo | str,
        *,
        ttl: float | None = None,
        detach: bool = False,
        provider: str | None = None,
        db: str | None = None,
    ) -> Sandbox:
        inner = _run(lambda: AsyncSandbox.resume(snapshot, ttl=ttl, detach=detach, provider=provider, db=db))
        return cls(_inner=inner)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def sandbox_id(self) -> str:
        return self._inner.sandbox_id

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def expires_at(self) -> float:
        return _run(lambda: asyncio.to_thread(lambda: self._inner.expires_at))

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 60.0,
        stdin: bytes = b"",
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
    ) -> CommandResult:
        return _run(
            lambda: self._inner.exec(
                cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr
            )
        )

    def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
    ) -> Process:
        inner = _run(
            lambda: self._inner.spawn(cmd, env=env, cwd=cwd, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr)
        )
        return Process(inner)

    def snapshot(self, *, keep: float | None = None) -> SnapshotInfo:
        return _run(lambda: self._inner.snapshot(keep=keep))

    def clone(self, *, ttl: float | None = None, detach: bool = False) -> Sandbox:
        return Sandbox(_inner=_run(lambda: self._inner.clone(ttl=ttl, detach=detach)))

    def delete_snapshot(self, snapshot: SnapshotInfo | str) -> None:
        _run(lambda: self._inner.delete_snapshot(snapshot))

    def extend(self, ttl: float) -> float:
        return _run(lambda: self._inner.extend(ttl))

    def close(self) -> None:
        _run(self._inner.close)
