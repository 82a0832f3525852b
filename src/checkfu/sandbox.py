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
import functools
import math
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from checkfu.contract.errors import SandboxBoundExceeded, SandboxProfileInvalid, SandboxProviderFailed
from checkfu.contract.ports import LOOPBACK, PublishedPort, parse_port_spec
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
    "OutputTruncatedWarning",
    "Process",
    "Sandbox",
    "SandboxFiles",
    "SnapshotInfo",
]

T = TypeVar("T")
OnOutput = Callable[[bytes], None]
ProfileArg = SandboxProfile | Mapping[str, Any] | str | Path | None
Truncation = Literal["warn", "raise", "ignore"]
TIMEOUT_EXIT = 124
"""The exit status of a command stopped at its ``timeout`` (as coreutils ``timeout`` reports it)."""
DEFAULT_MAX_OUTPUT_BYTES = 8 << 20
"""How much of each stream (stdout, stderr) a result keeps unless asked otherwise: 8 MiB, the runner's own bound on
what one ``exec`` call may hand back (``checkfu.core.session.Limits``)."""


class OutputTruncatedWarning(UserWarning):
    """A command wrote more than ``max_output_bytes`` to a stream: its result keeps only the first bytes
    (``CommandResult.truncated`` says so). ``warnings.simplefilter("error", OutputTruncatedWarning)``, or
    ``on_truncation="raise"``, makes it an error."""


@dataclass(frozen=True)
class CommandResult:
    """A finished command: its exit status and its output, all of it unless ``truncated`` says otherwise."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    stdout_truncated: bool = False
    """More was written to stdout than ``max_output_bytes``: ``stdout`` holds only the first bytes."""
    stderr_truncated: bool = False
    """More was written to stderr than ``max_output_bytes``: ``stderr`` holds only the first bytes."""

    @property
    def truncated(self) -> bool:
        """Whether either stream was cut at ``max_output_bytes``."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def text(self) -> str:
        """``stdout`` decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


def _max_output(value: int | None, default: int) -> int:
    """Raises SandboxProfileInvalid: ``value`` is not a whole number of bytes above 0."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SandboxProfileInvalid(
            f"max_output_bytes: {value!r} is not a number of bytes: give a whole number above 0",
            field="max_output_bytes",
        )
    return value


def _truncation(value: str) -> Truncation:
    """Raises SandboxProfileInvalid: ``value`` is not ``warn``, ``raise`` or ``ignore``."""
    if value not in ("warn", "raise", "ignore"):
        raise SandboxProfileInvalid(
            f"on_truncation: {value!r} is not one of 'warn', 'raise', 'ignore'", field="on_truncation"
        )
    return value  # type: ignore[return-value]


def _told(result: CommandResult, cap: int, on_truncation: Truncation, streamed: frozenset[str] = frozenset()) -> None:
    """Say that ``result`` was cut: a warning (not for a stream whose callback was handed every byte), or a refusal.

    Raises:
        SandboxBoundExceeded: ``on_truncation="raise"`` and a stream was cut (field ``stdout`` or ``stderr``).
    """
    cut = [name for name, was in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)) if was]
    if not cut or on_truncation == "ignore":
        return
    said = (
        f"{' and '.join(cut)}: the command wrote more than max_output_bytes={cap}; the result keeps the first {cap} "
        "bytes of each stream (pass a larger max_output_bytes to keep more)"
    )
    if on_truncation == "raise":
        raise SandboxBoundExceeded(said, field=cut[0])
    if any(name[3:] not in streamed for name in cut):
        warnings.warn(said, OutputTruncatedWarning, stacklevel=4)


def _timeout(value: float | None, name: str = "timeout") -> float | None:
    """Raises SandboxProfileInvalid: ``value`` is neither ``None`` nor a number of seconds above 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise SandboxProfileInvalid(
            f"{name}: {value!r} is not a number of seconds above 0 (None: no timeout of yours; the sandbox's "
            "time-to-live still ends the command)",
            field=name,
        )
    return float(value)


class _Kept:
    """One stream's output as a result keeps it: the first ``cap`` bytes, the rest counted as cut."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def take(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data.extend(chunk)


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
    reopen: Callable[[], Awaitable[_Context]]
    """A new context for the same provider, site and journal (``_open`` again): for a call made after the last
    sandbox let go of this one (deleting a snapshot after ``pause``)."""
    users: int = 1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def close(self) -> None:
        """One user fewer; the last one closes the journal and lets the providers go (their engine clients and
        threads), leaving the sandboxes as they are."""
        from checkfu.core.registry import close_adapters  # noqa: PLC0415

        self.users -= 1
        if self.users == 0:
            self.journal.close()
            await close_adapters(self.registry.adapters)

    @property
    def closed(self) -> bool:
        return self.users <= 0


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
        return _Context(
            service.journal,
            registry,
            service.sandboxes(registry),
            reopen=functools.partial(_open, provider, db, adapters, site=site),
        )
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


def _admitted(path: str, name: str) -> str:
    """``path`` if it is absolute and normal (the contract's sandbox path rule).

    Raises:
        SandboxPathRejected: it is not (its field is ``name``).
    """
    from checkfu.contract.paths import admit_path  # noqa: PLC0415

    admit_path(path, field=name)
    return path


def _argv(cmd: str | Sequence[str]) -> list[str]:
    """A command: a list of arguments as given, or a string run by ``sh -c`` (as E2B's ``commands.run``)."""
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


class AsyncProcess:
    """A process started with ``spawn``: write its stdin, let it stream, wait for it or kill it.

    Its output goes to ``on_stdout``/``on_stderr`` as it arrives (every byte), and the first ``max_output_bytes``
    of each stream are kept for ``wait``'s result (``truncated`` says when more came).
    """

    def __init__(
        self,
        proc: CheckedProcess,
        on_stdout: OnOutput | None,
        on_stderr: OnOutput | None,
        timeout: float | None,
        *,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        on_truncation: Truncation = "warn",
    ) -> None:
        self._proc = proc
        self._cap = max_output_bytes
        self._on_truncation = on_truncation
        self._kept = {"out": _Kept(max_output_bytes), "err": _Kept(max_output_bytes)}
        self._on = {"out": on_stdout, "err": on_stderr}
        self._told = False
        self._task: asyncio.Task[tuple[int, bool]] = asyncio.ensure_future(self._pump(timeout))

    @property
    def pid(self) -> int | None:
        """The process id inside the sandbox, when the provider reports one (``None`` otherwise: see
        ``process_id``)."""
        return self._proc.started.pid

    @property
    def process_id(self) -> str:
        """The provider's own id for the process (always set)."""
        return self._proc.started.process_id

    async def _pump(self, timeout: float | None) -> tuple[int, bool]:
        try:
            async with asyncio.timeout(timeout):
                async for event in self._proc.events():
                    if isinstance(event, ProcessOutput):
                        self._kept[event.stream].take(event.data)
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
        """The exit status and the output kept (``truncated``: a stream wrote more than ``max_output_bytes``).

        Raises:
            SandboxBoundExceeded: a stream was cut and ``on_truncation="raise"`` was asked for.
        """
        result = await self._wait()
        self._tell(result)
        return result

    async def _wait(self) -> CommandResult:
        code, timed_out = await asyncio.shield(self._task)
        out, err = self._kept["out"], self._kept["err"]
        return CommandResult(code, bytes(out.data), bytes(err.data), timed_out, out.truncated, err.truncated)

    def _tell(self, result: CommandResult) -> None:
        """Warn (or raise) once about a cut, in the caller's thread."""
        if not self._told:
            self._told = True
            streamed = frozenset(k for k, v in self._on.items() if v is not None)
            _told(result, self._cap, self._on_truncation, streamed)

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

    # E2B's names (``sandbox.files.exists/remove/make_dir/rename``), as thin calls over the same machinery

    async def exists(self, path: str) -> bool:
        """Whether anything is at ``path`` (a final link is not followed: a dangling one exists)."""
        res = await self._sb._live.list_dir(_admitted(path, "path"), recursive=False)
        return res.kind != "missing"

    async def remove(self, path: str) -> None:
        """Remove what is at ``path``, a directory with everything in it (nothing there is no error)."""
        await self._shell('rm -rf -- "$1"', _admitted(path, "path"))

    async def make_dir(self, path: str) -> bool:
        """Make the directory ``path`` and its parents; ``False`` if it was there already.

        Raises:
            SandboxProviderFailed: something other than a directory is at ``path``, or it could not be made.
        """
        res = await self._sb._live.list_dir(_admitted(path, "path"), recursive=False)
        if res.kind == "dir":
            return False
        if res.kind != "missing":
            raise SandboxProviderFailed(f"path: {path} is a {res.kind}, not a directory", field="path")
        await self._shell('mkdir -p -- "$1"', path)
        return True

    async def rename(self, old_path: str, new_path: str) -> None:
        """Move ``old_path`` to ``new_path`` (``mv``: a directory whole)."""
        await self._shell('mv -- "$1" "$2"', _admitted(old_path, "old_path"), _admitted(new_path, "new_path"))

    async def _shell(self, script: str, *paths: str) -> None:
        """``script`` run by the sandbox's ``sh`` with ``paths`` as ``$1``... (never spliced into the script).

        Raises:
            SandboxProviderFailed: the command failed (its own words say why; the field is the first path's).
        """
        res = await self._sb._live.exec(["sh", "-c", script, "sh", *paths], timeout=60.0)
        if res.exit_code != 0:
            why = res.stderr.decode("utf-8", "replace").strip()[:300] or f"exit {res.exit_code}"
            raise SandboxProviderFailed(f"path: {paths[0]}: {why}", field="path")


class AsyncCommands:
    """``sb.commands``: E2B's name for running commands. ``run`` is ``exec``, or ``spawn`` with
    ``background=True``; a non-zero exit is returned in the result, never raised."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        timeout: float | None = 60.0,
        stdin: bytes = b"",
    ) -> Any:
        """Run ``cmd`` (a string for ``sh -c``, or a list of arguments) to its end and return its
        ``CommandResult``; with ``background=True``, start it and return its process handle (``wait``, ``kill``,
        ``send_stdin``, ``pid``) at once. ``envs`` is its environment, ``timeout`` in seconds."""
        if background:
            proc = await self._sb.spawn(
                cmd, env=envs, cwd=cwd, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr
            )
            if stdin:
                await proc.send_stdin(stdin)
            return proc
        return await self._sb.exec(
            cmd,
            env=envs,
            cwd=cwd,
            timeout=timeout,
            stdin=stdin,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )


class AsyncSandboxPorts:
    """``sb.ports``: publish a port of the sandbox on this machine's loopback (the Docker tier only).

    The sandbox keeps its network (``none``: only ``lo``); what ``expose`` opens is one listening address on
    the host, ``127.0.0.1`` unless ``host`` names another, that leads to ``127.0.0.1:PORT`` inside the sandbox.
    It is closed with the sandbox (``close``, ``kill``, its time-to-live).
    """

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox
        self.published: list[PublishedPort] = []
        """Every port published so far, oldest first."""

    async def expose(self, port: int, *, host: str = LOOPBACK, host_port: int = 0) -> str:
        """Publish sandbox ``port`` on ``host:host_port`` (``host_port`` 0: any free port) and return its URL,
        ``http://127.0.0.1:N``.

        Raises:
            SandboxProfileInvalid: (field ``-p``) a port out of range, a host that is not an IP address.
            SandboxCapabilityUnavailable: (field ``-p``) the sandbox's provider cannot publish ports.
            SandboxProviderFailed: (field ``-p``) the address is taken, or the provider could not open it.
        """
        spec = parse_port_spec(f"{f'[{host}]' if ':' in host else host}:{host_port}:{port}")
        published = await self._sb._live.publish_port(spec)
        self.published.append(published)
        return published.url


class AsyncSandbox:
    """A long-lived sandbox, driven with ``await``.

    ``async with AsyncSandbox(profile=..., mounts=[...], provider="docker", ttl=600) as sb:`` makes it
    on entry and releases it on exit; ``await AsyncSandbox.create(...)`` makes one to keep.
    ``profile`` is a ``SandboxProfile``, a mapping, or a TOML/JSON file (default: the provider's built-in
    one); ``mounts`` are ``SRC:TARGET[:rw]`` strings (or ``MountSpec``); ``ttl`` is in seconds (default 30
    minutes); ``db`` is a journal URL (default: the state directory's, as every ``checkfu`` command).
    ``max_output_bytes`` (default 8 MiB) and ``on_truncation`` (``"warn"``, ``"raise"`` or ``"ignore"``) are the
    defaults of ``exec`` and ``spawn``: how much of each stream a result keeps, and what a cut does.
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
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        on_truncation: Truncation = "warn",
    ) -> None:
        self.max_output_bytes = _max_output(max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES)
        """What ``exec`` and ``spawn`` keep of each stream unless the call says otherwise."""
        self.on_truncation: Truncation = _truncation(on_truncation)
        """What a cut does unless the call says otherwise: ``warn`` (``OutputTruncatedWarning``), ``raise``
        (``SandboxBoundExceeded``) or ``ignore``; ``CommandResult.truncated`` tells either way."""
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
        self.commands = AsyncCommands(self)
        self.ports = AsyncSandboxPorts(self)

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
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        on_truncation: Truncation = "warn",
    ) -> AsyncSandbox:
        """Make a sandbox and return it, active, its mounts staged. ``adapters``: an adapters file loaded besides
        the installed providers (default: ``CHECKFU_ADAPTERS``; ``checkfu.core.registry.read_adapters_file``).

        Raises:
            SandboxError: refused (a profile, mount or ttl named with its field), or a provider fault;
                nothing is left allocated.
        """
        sb = cls(
            profile=profile,
            mounts=mounts,
            provider=provider,
            ttl=ttl,
            detach=detach,
            db=db,
            adapters=adapters,
            max_output_bytes=max_output_bytes,
            on_truncation=on_truncation,
        )
        await sb._make()
        return sb

    async def _make(self) -> None:
        from checkfu.core.job import QuietObserver, host_platform_value, resolve_mounts  # noqa: PLC0415
        from checkfu.core.registry import adapters_file, check_provider_name, is_endpoint  # noqa: PLC0415
        from checkfu.runner import RunnerService  # noqa: PLC0415

        args, self._args = self._args, None
        if args is None:
            return
        given = args["adapters"]
        check_provider_name(args["provider"], adapters_file(None if given is None else Path(given)))
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
            await ctx.close()
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
            await ctx.close()
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
            await ctx.close()
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
        timeout: float | None = 60.0,
        stdin: bytes = b"",
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        max_output_bytes: int | None = None,
        on_truncation: Truncation | None = None,
    ) -> CommandResult:
        """Run ``cmd`` (a list of arguments, or a string for ``sh -c``) to its end.

        With ``on_stdout``/``on_stderr``, output is handed over as it arrives (through ``openProcess``
        where the provider declares it). A command still running at ``timeout`` seconds is killed and
        reported with exit status 124 and ``timed_out``; ``timeout=None``: no timeout of the caller's, the
        sandbox's time-to-live still ends it.

        The result keeps the first ``max_output_bytes`` of each stream (default: the sandbox's, 8 MiB);
        a command that wrote more is reported ``truncated`` (``stdout_truncated``, ``stderr_truncated``), with an
        ``OutputTruncatedWarning``, or a ``SandboxBoundExceeded`` with ``on_truncation="raise"``. Callbacks are
        handed every byte whatever the cap.

        Raises:
            SandboxProfileInvalid: a bad ``timeout``, ``max_output_bytes`` or ``env`` (named by field); nothing ran.
            SandboxBoundExceeded: ``on_truncation="raise"`` and the output was cut.
        """
        result, tell = await self._exec(
            cmd,
            env=env,
            cwd=cwd,
            timeout=timeout,
            stdin=stdin,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            max_output_bytes=max_output_bytes,
            on_truncation=on_truncation,
        )
        tell(result)
        return result

    async def _exec(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
        stdin: bytes,
        on_stdout: OnOutput | None,
        on_stderr: OnOutput | None,
        max_output_bytes: int | None,
        on_truncation: Truncation | None,
    ) -> tuple[CommandResult, Callable[[CommandResult], None]]:
        """``exec``'s result, and how to say it was cut (called in the caller's thread, so a warning is theirs)."""
        argv = _argv(cmd)
        live = self._live
        seconds = _timeout(timeout)
        cap = _max_output(max_output_bytes, self.max_output_bytes)
        told = self.on_truncation if on_truncation is None else _truncation(on_truncation)
        bound = live.session.limits.max_output_bytes  # the most one exec call may hand back
        streams = live.streams()
        if seconds is None:
            seconds = max(1.0, live.remaining())
        if not streams or (on_stdout is None and on_stderr is None and cap <= bound):
            res = await live.exec(argv, env=env, cwd=cwd, stdin=stdin, timeout=seconds, max_output_bytes=cap)
            if on_stdout is not None and res.stdout:
                on_stdout(res.stdout)
            if on_stderr is not None and res.stderr:
                on_stderr(res.stderr)
            code = TIMEOUT_EXIT if res.timed_out else res.exit_code
            result = CommandResult(
                code, res.stdout, res.stderr, res.timed_out, res.stdout_truncated, res.stderr_truncated
            )
            return result, lambda r: _told(r, min(cap, bound), told)
        proc = await self.spawn(
            argv,
            env=env,
            cwd=cwd,
            timeout=seconds,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            max_output_bytes=cap,
            on_truncation=told,
        )
        try:
            if stdin:
                await proc.send_stdin(stdin)
            await proc.close_stdin()
            return await proc._wait(), proc._tell
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
        max_output_bytes: int | None = None,
        on_truncation: Truncation | None = None,
    ) -> AsyncProcess:
        """Start ``cmd`` and return its handle (stdin, streamed output, ``wait``, ``kill``, ``pid``). ``wait``'s
        result keeps the first ``max_output_bytes`` of each stream, as ``exec``'s does.

        Raises:
            SandboxOperationUnsupported: the provider does not declare ``openProcess``.
            SandboxProfileInvalid: a bad ``timeout``, ``max_output_bytes`` or ``env`` (named by field); nothing ran.
        """
        seconds = _timeout(timeout)
        cap = _max_output(max_output_bytes, self.max_output_bytes)
        told = self.on_truncation if on_truncation is None else _truncation(on_truncation)
        proc = await self._live.open_process(_argv(cmd), env=env, cwd=cwd)
        return AsyncProcess(proc, on_stdout, on_stderr, seconds, max_output_bytes=cap, on_truncation=told)

    # state -------------------------------------------------------------------------------------

    async def snapshot(self, *, keep: float | None = None) -> SnapshotInfo:
        """Snapshot the sandbox's files; ``keep`` asks for a lifetime in seconds: the snapshot is deleted once it
        passes (``expires_at`` says when)."""
        return _info(await self._live.snapshot(keep=keep))

    async def clone(self, *, ttl: float | None = None, detach: bool = False) -> AsyncSandbox:
        """A new sandbox holding this one's files as they are now."""
        ctx = self._ctx
        assert ctx is not None
        ctx.users += 1  # before the clone is awaited: closing this one meanwhile must not close the shared context
        try:
            live = await ctx.host.clone(self._live, ttl=_seconds(ttl, "ttl", _default_ttl()), detached=detach)
        except BaseException:
            await ctx.close()
            raise
        copy = AsyncSandbox._wrap(ctx, live)
        copy.max_output_bytes, copy.on_truncation = self.max_output_bytes, self.on_truncation
        return copy

    async def delete_snapshot(self, snapshot: SnapshotInfo | str) -> None:
        """Delete a snapshot through its provider (a snapshot already deleted is left as it is)."""
        ref = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) else snapshot
        ctx = self._ctx
        assert ctx is not None
        if not ctx.closed:
            await ctx.host.delete_snapshot(ref)
            return
        again = await ctx.reopen()  # after pause or close: the providers of the old one were let go
        try:
            await again.host.delete_snapshot(ref)
        finally:
            await again.close()

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
                await self._ctx.close()

    # E2B's and Modal's names, as thin calls

    async def kill(self) -> None:
        """E2B's ``kill``: release the sandbox, also one attached with ``connect`` (``close`` only lets go of
        that one). Idempotent."""
        await self._end()

    async def terminate(self) -> None:
        """Modal's ``terminate``: the same as ``kill``."""
        await self._end()

    async def _end(self) -> None:
        if not self._closed and self._live_sb is not None:
            self._attached = False  # ended by its holder, whoever made it
        await self.close()

    async def set_timeout(self, timeout: float) -> float:
        """E2B's name for ``extend``: the sandbox lives ``timeout`` seconds from now; returns the deadline."""
        return await self.extend(timeout)

    async def pause(self, *, keep: float | None = None) -> str:
        """E2B's pause, mapped onto a snapshot: snapshot the sandbox's files, release it, and return the snapshot's
        id; ``AsyncSandbox.resume(that_id)`` makes a new sandbox holding them (with a new sandbox id). Processes
        do not survive a pause; files do.

        Raises:
            SandboxProfileInvalid: the sandbox's profile is ``ephemeral_zdr``, whose snapshots die with it: pause
                needs ``retention_mode = "durable"`` (nothing is snapshotted or released).
        """
        from checkfu.contract.errors import SandboxProfileInvalid  # noqa: PLC0415

        if self._live.record.profile.retention_mode == "ephemeral_zdr":
            raise SandboxProfileInvalid(
                "retention_mode: pause keeps the files in a snapshot, and an ephemeral_zdr sandbox's snapshots die "
                'with it; make the sandbox with a profile whose retention_mode is "durable" to pause it',
                field="retention_mode",
            )
        info = await self.snapshot(keep=keep)
        await self._end()
        return info.snapshot_id


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
        """The process id inside the sandbox, when the provider reports one."""
        return self._inner.pid

    @property
    def process_id(self) -> str:
        """The provider's own id for the process."""
        return self._inner.process_id

    def send_stdin(self, data: bytes) -> None:
        _run(lambda: self._inner.send_stdin(data))

    def close_stdin(self) -> None:
        _run(self._inner.close_stdin)

    def wait(self) -> CommandResult:
        result = _run(self._inner._wait)
        self._inner._tell(result)
        return result

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

    def exists(self, path: str) -> bool:
        return _run(lambda: self._inner.exists(path))

    def remove(self, path: str) -> None:
        _run(lambda: self._inner.remove(path))

    def make_dir(self, path: str) -> bool:
        return _run(lambda: self._inner.make_dir(path))

    def rename(self, old_path: str, new_path: str) -> None:
        _run(lambda: self._inner.rename(old_path, new_path))


class Commands:
    """``sb.commands`` of a ``Sandbox`` (E2B's name): ``run`` is ``exec``, or ``spawn`` with ``background=True``."""

    def __init__(self, inner: AsyncCommands) -> None:
        self._inner = inner

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        timeout: float | None = 60.0,
        stdin: bytes = b"",
    ) -> Any:
        done = _run(
            lambda: self._inner.run(
                cmd,
                background=background,
                envs=envs,
                cwd=cwd,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                timeout=timeout,
                stdin=stdin,
            )
        )
        return Process(done) if background else done


class SandboxPorts:
    """``sb.ports`` of a ``Sandbox``: ``expose(8000)`` returns ``http://127.0.0.1:N`` (``AsyncSandboxPorts``)."""

    def __init__(self, inner: AsyncSandboxPorts) -> None:
        self._inner = inner

    @property
    def published(self) -> list[PublishedPort]:
        return self._inner.published

    def expose(self, port: int, *, host: str = LOOPBACK, host_port: int = 0) -> str:
        return _run(lambda: self._inner.expose(port, host=host, host_port=host_port))


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
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        on_truncation: Truncation = "warn",
        _inner: AsyncSandbox | None = None,
    ) -> None:
        if _inner is None:
            _inner = _run(
                lambda: AsyncSandbox.create(
                    profile=profile,
                    mounts=mounts,
                    provider=provider,
                    ttl=ttl,
                    detach=detach,
                    db=db,
                    max_output_bytes=max_output_bytes,
                    on_truncation=on_truncation,
                )
            )
        self._inner = _inner
        self.files = SandboxFiles(_inner.files)
        self.commands = Commands(_inner.commands)
        self.ports = SandboxPorts(_inner.ports)

    @classmethod
    def create(
        cls,
        *,
        profile: ProfileArg = None,
        mounts: Sequence[str | MountSpec] | None = None,
        provider: str = "docker",
        ttl: float | None = None,
        detach: bool = False,
        db: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        on_truncation: Truncation = "warn",
    ) -> Sandbox:
        """E2B's and Modal's way to make one: the same as ``Sandbox(...)``."""
        return cls(
            profile=profile,
            mounts=mounts,
            provider=provider,
            ttl=ttl,
            detach=detach,
            db=db,
            max_output_bytes=max_output_bytes,
            on_truncation=on_truncation,
        )

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

    @property
    def max_output_bytes(self) -> int:
        """What ``exec`` and ``spawn`` keep of each stream unless the call says otherwise."""
        return self._inner.max_output_bytes

    @max_output_bytes.setter
    def max_output_bytes(self, value: int) -> None:
        self._inner.max_output_bytes = _max_output(value, DEFAULT_MAX_OUTPUT_BYTES)

    @property
    def on_truncation(self) -> Truncation:
        """What a cut does unless the call says otherwise: ``warn``, ``raise`` or ``ignore``."""
        return self._inner.on_truncation

    @on_truncation.setter
    def on_truncation(self, value: Truncation) -> None:
        self._inner.on_truncation = _truncation(value)

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60.0,
        stdin: bytes = b"",
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        max_output_bytes: int | None = None,
        on_truncation: Truncation | None = None,
    ) -> CommandResult:
        result, tell = _run(
            lambda: self._inner._exec(
                cmd,
                env=env,
                cwd=cwd,
                timeout=timeout,
                stdin=stdin,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                max_output_bytes=max_output_bytes,
                on_truncation=on_truncation,
            )
        )
        tell(result)
        return result

    def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: OnOutput | None = None,
        on_stderr: OnOutput | None = None,
        max_output_bytes: int | None = None,
        on_truncation: Truncation | None = None,
    ) -> Process:
        inner = _run(
            lambda: self._inner.spawn(
                cmd,
                env=env,
                cwd=cwd,
                timeout=timeout,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                max_output_bytes=max_output_bytes,
                on_truncation=on_truncation,
            )
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

    def kill(self) -> None:
        """E2B's ``kill``: release the sandbox, also one attached with ``connect``."""
        _run(self._inner.kill)

    def terminate(self) -> None:
        """Modal's ``terminate``: the same as ``kill``."""
        _run(self._inner.terminate)

    def set_timeout(self, timeout: float) -> float:
        """E2B's name for ``extend``."""
        return _run(lambda: self._inner.extend(timeout))

    def pause(self, *, keep: float | None = None) -> str:
        """E2B's pause, mapped onto a snapshot: returns the snapshot id ``Sandbox.resume`` takes."""
        return _run(lambda: self._inner.pause(keep=keep))
