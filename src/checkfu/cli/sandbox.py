"""Long-lived sandboxes from the command line: ``checkfu sandbox create|rm|extend``, ``checkfu exec``, ``checkfu cp``,
``checkfu snapshot``, ``checkfu resume``, ``checkfu clone``, ``checkfu ps`` and ``checkfu kill``.

Every command goes through the runner's front door (``checkfu.runner.RunnerService``), hence through its checked,
journaled, fenced machinery, as the SDK does. Every command takes ``--json``; a refusal prints the vocabulary code
and the field at fault (with ``--json``: ``{"ok": false, "error": {...}}`` on stdout) and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.markup import escape

from checkfu.cli.common import (
    CpusOpt,
    DiskOpt,
    ExcludeOpt,
    ImageOpt,
    MemoryOpt,
    NetworkOpt,
    PidsOpt,
    resolved_profile,
    resolved_text,
)
from checkfu.cli.consoles import console
from checkfu.cli.interrupts import Interrupted, run_interruptible, sigterm_interrupts
from checkfu.cli.state import open_journal, runner_tag
from checkfu.contract.errors import (
    SandboxError,
    SandboxNotFound,
    SandboxPathRejected,
    SandboxProfileInvalid,
    SandboxProviderFailed,
    SandboxStateConflict,
)
from checkfu.contract.ports import PublishedPort, admit_ports, exposure_warning
from checkfu.core.journal import JournalError
from checkfu.core.profiles import Overrides, duration_seconds

err = console(stderr=True, highlight=False, soft_wrap=True)
out = console(highlight=False, soft_wrap=True)

sandbox_app = typer.Typer(help="Long-lived sandboxes: create, remove, extend.", no_args_is_help=True)

T = TypeVar("T")
EXIT_FAILED = 125
TIMEOUT_EXIT = 124
"""A command killed at --timeout, as ``timeout(1)`` and ``checkfu run`` report it."""
"""This command's own failure (a refusal, a sandbox that is gone): docker's code for the same."""

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="journal URL (default: SQLite in the state directory)", show_default=False, metavar="URL"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]
TtlOpt = Annotated[
    str,
    typer.Option("--ttl", help="time-to-live: 90s, 30m, 2h, 7d (or seconds)", metavar="DURATION"),
]

SANDBOX_ID = re.compile(r"^sb-[0-9a-f]{1,40}$")
SNAPSHOT_ID = re.compile(r"^snap-[0-9a-f]{1,40}$")


def parse_duration(text: str, name: str) -> float:
    """``90s``, ``30m``, ``2h``, ``7d`` or a number of seconds.

    Raises:
        SandboxProfileInvalid: not a duration (its field is ``name``).
    """
    seconds = duration_seconds(text)
    if seconds is None or seconds <= 0:
        raise SandboxProfileInvalid(
            f"{name}: {text[:40]!r} is not a duration: write it as 90s, 30m, 2h or 7d", field=name.lstrip("-")
        )
    if name == "--keep":  # a snapshot's lifetime: bounded by the contract, not by a sandbox's time-to-live
        from checkfu.core.sandboxes import check_keep  # noqa: PLC0415

        return float(check_keep(seconds, field="keep"))
    from checkfu.core.sandboxes import check_ttl  # noqa: PLC0415

    return check_ttl(seconds, field=name.lstrip("-"))


def _check_id(value: str, *, snapshot: bool = False) -> str:
    pattern, what = (SNAPSHOT_ID, "snapshot") if snapshot else (SANDBOX_ID, "sandbox_id")
    if not pattern.match(value):
        shape = "snap-<hex>" if snapshot else "sb-<hex>"
        raise SandboxNotFound(f"{what}: {value[:60]!r} is not a {what.replace('_', ' ')} ({shape})", field=what)
    return value


def _fail(exc: SandboxError | JournalError, as_json: bool, code: int = EXIT_FAILED) -> NoReturn:
    if isinstance(exc, JournalError):
        body: dict[str, str | None] = {"code": "JournalUnavailable", "message": str(exc), "field": "--db"}
        err.print(f"[bold red]journal[/]: {escape(str(exc))}")
    else:
        body = {"code": exc.code, "message": exc.message, "field": exc.field}
        where = f" (field: {exc.field})" if exc.field else ""
        err.print(f"[bold red]{escape(exc.code)}[/]: {escape(exc.message)}{escape(where)}")
        if exc.code in ("SandboxProfileInvalid", "SandboxPathRejected", "SandboxCapabilityUnavailable"):
            err.print("[dim]  nothing was made; fix the input above and run again (docs/errors.md says more)[/]")
    if as_json:
        print(json.dumps({"ok": False, "exit_code": code, "error": body}))
    raise typer.Exit(code)


def _run(body: Callable[[], Awaitable[T]], as_json: bool, db: str | None) -> T:
    """Run ``body`` on an event loop: SIGINT and SIGTERM stop it where it is, what it was making is released
    (``checkfu.cli.interrupts``), and the command says truthfully what is left before it exits 130 or 143."""

    async def main() -> T:
        return await body()

    try:
        with sigterm_interrupts():
            return run_interruptible(main())
    except (SandboxError, JournalError) as exc:
        _fail(exc, as_json)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        left = _left_here(db)
        if left is None:
            said = "what is left of what it had begun could not be read from the journal"
        elif left:
            said = (
                f"{len(left)} allocation(s) it had begun are still held ({', '.join(left)}); "
                "`checkfu runner reconcile` finishes them"
            )
        else:
            said = "everything it had begun is undone"
        err.print(f"[bold red]interrupted[/] by {escape(name)}: {escape(said)}")
        if as_json:
            doc = {"ok": False, "exit_code": 128 + signum, "interrupted": name, "left": left}
            print(json.dumps(doc))
        raise typer.Exit(128 + signum) from None


def _left_here(db: str | None) -> list[str] | None:
    """The allocations this process began that are still open (``None``: the journal cannot be read), as an
    interrupted command winds up: the truth it owes before it says anything is undone."""
    from checkfu.cli.state import config  # noqa: PLC0415
    from checkfu.core.leases import current_owner  # noqa: PLC0415
    from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415
    from checkfu.runner import RunnerService  # noqa: PLC0415

    try:
        service = RunnerService.open(config(db), housekeeping=False)
    except Exception:
        return None
    try:
        return SandboxBook(service.journal).held_by(current_owner())
    except Exception:
        return None
    finally:
        service.close()


def _emit(as_json: bool, doc: dict[str, Any], line: str) -> None:
    if as_json:
        print(json.dumps({"ok": True, **doc}))
    else:
        print(line)


def _when(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _span(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


async def _opened(db: str | None, adapters: Path | None = None) -> Any:
    """The runner, through its front door, loaded only for these commands (it keeps the house first)."""
    from checkfu.cli.state import config  # noqa: PLC0415
    from checkfu.runner import RunnerService  # noqa: PLC0415

    return await RunnerService.open_async(config(db, adapters), notice=lambda line: print(line, file=sys.stderr))


def _credential() -> Any:
    """The credential for a provider service named by URL: ``CHECKFU_PROVIDER_CREDENTIAL``, else (``None``) the
    one issued when it was enrolled."""
    from checkfu.wire.credentials import read_credential  # noqa: PLC0415

    return read_credential(None)


async def _attached(service: Any, sandbox_id: str) -> Any:
    """The live sandbox ``sandbox_id`` of this runner (its id checked first)."""
    return await service.attach_sandbox(_check_id(sandbox_id), credential=_credential())


# sandbox create | rm | extend -----------------------------------------------------------------


@sandbox_app.command("create")
def sandbox_create(
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="a SandboxProfile, TOML or JSON (default: the built-in one)", metavar="FILE"),
    ] = None,
    mount: Annotated[
        list[str] | None,
        typer.Option("--mount", help="SRC:TARGET[:rw], staged before anything runs", metavar="SRC:TARGET[:rw]"),
    ] = None,
    no_ignore: Annotated[bool, typer.Option("--no-ignore", help="stage what git ignores too")] = False,
    exclude: ExcludeOpt = None,
    publish: Annotated[
        list[str] | None,
        typer.Option(
            "-p",
            "--publish",
            help="[HOST_IP:]HOST_PORT:PORT: reach sandbox PORT at HOST_IP:HOST_PORT on this machine until the sandbox "
            "is removed (HOST_IP 127.0.0.1 unless named; HOST_PORT 0: any free port); the sandbox keeps its network "
            "(docs/egress.md#published-ports); Docker only",
            show_default=False,
            metavar="[HOST_IP:]HOST_PORT:PORT",
        ),
    ] = None,
    ttl: TtlOpt = "30m",
    provider: Annotated[str, typer.Option("--provider", help="provider name (or service URL)")] = "docker",
    db: DbOpt = None,
    as_json: JsonOpt = False,
    adapters: Annotated[
        Path | None,
        typer.Option(
            "--adapters",
            help="an adapters file loaded besides the installed providers (default: $CHECKFU_ADAPTERS, which the "
            "later commands on the sandbox read too); docs/adapters.md",
            metavar="FILE",
        ),
    ] = None,
    image: ImageOpt = None,
    memory: MemoryOpt = None,
    cpus: CpusOpt = None,
    pids: PidsOpt = None,
    disk: DiskOpt = None,
    network: NetworkOpt = None,
) -> None:
    """Make a sandbox that outlives this command; prints its id. Its time-to-live ends it (extend it with
    `checkfu sandbox extend`), or `checkfu sandbox rm`."""
    from checkfu.core.registry import is_endpoint  # noqa: PLC0415

    flags = Overrides(image=image, memory=memory, cpus=cpus, pids=pids, disk=disk, network=tuple(network or ()))
    tags: list[str | None] = []
    published: list[PublishedPort] = []

    async def body() -> Any:
        from checkfu.core.admission import raise_problems  # noqa: PLC0415
        from checkfu.core.mounts import parse_mount  # noqa: PLC0415
        from checkfu.core.profiles import read_profile  # noqa: PLC0415

        seconds = parse_duration(ttl, "--ttl")
        specs = [parse_mount(m, stage_all=no_ignore, excludes=tuple(exclude or ())) for m in mount or []]
        for i, mount_spec in enumerate(specs):
            if mount_spec.sync:  # a sandbox has no end of Run to copy back at: `checkfu cp` reads files out of it
                raise SandboxProfileInvalid(
                    f"--mount {mount_spec.describe()}: rw,sync copies back when a Run ends; a sandbox is not a Run "
                    "(use :rw, and `checkfu cp` to read files out)",
                    field=f"mounts.{i}",
                )
        ports = admit_ports(publish or [], provider)
        for spec in ports:
            warned = exposure_warning(spec)
            if warned is not None:
                err.print(f"[bold yellow]warning[/]: {escape(warned)}")
        given: Any = profile
        if flags.given():  # the flags over the profile (or the built-in one): each wins
            read = read_profile(profile, "docker" if "://" in provider else provider, flags)
            raise_problems(read.problems)
            given = read.doc
            tags.append(read.tag)
        service = await _opened(db, adapters)
        try:
            live = await service.create_sandbox(
                provider, profile=given, mounts=specs, ttl=seconds, detached=True, credential=_credential()
            )
            try:  # the ports stay open with the sandbox: its provider removes them when the sandbox goes
                for spec in ports:
                    published.append(await live.publish_port(spec))
            except BaseException:
                await live.release(status="failed")  # a sandbox whose port did not open is not left behind
                raise
        finally:
            await service.aclose()
        return live.record

    rec = _run(body, as_json, db)
    resolved = resolved_profile(rec.profile, None, tags[0] if tags else None)
    _emit(
        as_json,
        {
            "sandbox_id": rec.sandbox_id,
            "run_id": rec.run_id,
            "provider": rec.provider,
            "endpoint": rec.site if is_endpoint(rec.site) else None,
            "expires_at": _when(rec.expires_at),
            "resolved_profile": resolved,
            **({"ports": [p.to_json() for p in published]} if publish else {}),
        },
        rec.sandbox_id,
    )
    if flags.given() and not as_json:
        err.print(f"[bold]resolved[/]   {escape(resolved_text(resolved))}")
    if not as_json:
        for p in published:
            err.print(f"[bold]port[/]       {escape(p.url)} -> sandbox port {p.port:d} (until `checkfu sandbox rm`)")


@sandbox_app.command("rm")
def sandbox_rm(
    ids: Annotated[list[str], typer.Argument(help="sandbox ids (sb-...) or snapshot ids (snap-...)", metavar="ID...")],
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release sandboxes (or delete snapshots); nothing of them is left in the provider."""
    done = _run(lambda: _remove(ids, db, status="released"), as_json, db)
    _emit(as_json, {"removed": done}, "\n".join(done))


async def _remove(ids: list[str], db: str | None, *, status: str) -> list[str]:
    done: list[str] = []
    for ident in ids:
        service = await _opened(db)
        try:
            if ident.startswith("snap-"):
                await service.delete_snapshot(_check_id(ident, snapshot=True), credential=_credential())
            else:
                live = await _attached(service, ident)
                await live.release(status=status)
        finally:
            await service.aclose()
        done.append(ident)
    return done


@sandbox_app.command("extend")
def sandbox_extend(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    ttl: TtlOpt = "30m",
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a sandbox's time-to-live to --ttl from now."""

    async def body() -> float:
        from checkfu.core.sandboxes import check_ttl  # noqa: PLC0415

        seconds = parse_duration(ttl, "--ttl")
        service = await _opened(db)
        try:
            live = await _attached(service, sandbox_id)
            return float(await live.extend(check_ttl(seconds)))
        finally:
            await service.aclose()

    until = _run(body, as_json, db)
    _emit(as_json, {"sandbox_id": sandbox_id, "expires_at": _when(until)}, f"{sandbox_id} expires {_when(until)}")


# exec -------------------------------------------------------------------------------------------


def exec_command(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    command: Annotated[list[str], typer.Argument(help="the command, after --", metavar="COMMAND...")],
    env: Annotated[
        list[str] | None,
        typer.Option("-e", "--env", help="NAME=VALUE, or NAME to pass the caller's", metavar="NAME[=VALUE]"),
    ] = None,
    workdir: Annotated[
        str | None, typer.Option("-w", "--workdir", help="working directory (absolute)", metavar="PATH")
    ] = None,
    interactive: Annotated[bool, typer.Option("-i", "--interactive", help="stream stdin to the command")] = False,
    use_tty: Annotated[bool, typer.Option("-t", "--tty", help="give the command a pseudo-terminal")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds before the command is killed (exit 124)")
    ] = 3600.0,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a command in a live sandbox; its exit status is this command's (125: checkfu's own failure, as docker
    exec)."""
    from checkfu.cli.run import _env  # noqa: PLC0415
    from checkfu.core.admission import argv_problems, raise_problems, workdir_problems  # noqa: PLC0415

    if command[:1] == ["--"]:
        command = command[1:]
    warnings: list[str] = []
    values, problems = _env(env or [], [], warnings)
    for w in warnings:
        err.print(f"[bold yellow]warning[/]: {escape(w)}")

    async def body() -> int:
        raise_problems(problems + argv_problems(command) + workdir_problems(workdir))
        if not 0 < timeout < 10**7:
            raise SandboxProfileInvalid(f"--timeout: {timeout!r} is not a number of seconds above 0", field="timeout")
        service = await _opened(db)
        try:
            live = await _attached(service, sandbox_id)
            if as_json:
                res = await live.exec(command, env=values, cwd=workdir, timeout=timeout)
                code = TIMEOUT_EXIT if res.timed_out else int(res.exit_code)
                doc: dict[str, Any] = {
                    "sandbox_id": sandbox_id,
                    "exit_code": code,
                    "timed_out": res.timed_out,
                    "stdout_truncated": res.stdout_truncated,
                    "stderr_truncated": res.stderr_truncated,
                }
                for name, data in (("stdout", res.stdout), ("stderr", res.stderr)):
                    try:
                        doc[name] = data.decode("utf-8")
                    except UnicodeDecodeError:
                        import base64  # noqa: PLC0415

                        doc[name] = None
                        doc[f"{name}_base64"] = base64.b64encode(data).decode()
                _say_cut(res, "run it without --json to stream all of it")
                print(json.dumps({"ok": True, **doc}))
                return code
            return await _stream(live, command, values, workdir, timeout, interactive, use_tty)
        finally:
            await service.aclose()

    code = _run(body, as_json, db)
    from checkfu.cli.run import FINISHED  # noqa: PLC0415

    FINISHED.append(code)  # the command's own status, passed through (a 2 is not a usage error)
    raise typer.Exit(code)


def _say_cut(res: Any, how: str) -> None:
    """Warn on stderr that ``exec``'s answer cut a stream at the runner's bound."""
    cut = [name for name in ("stdout", "stderr") if getattr(res, f"{name}_truncated")]
    if cut:
        err.print(
            f"[bold yellow]warning[/]: {escape(' and '.join(cut))} cut: the command wrote more than one exec answer "
            f"keeps; {escape(how)}"
        )


async def _stream(
    live: Any, argv: list[str], env: dict[str, str], cwd: str | None, timeout: float, interactive: bool, tty: bool
) -> int:
    from checkfu.cli.terminal import feed, raw_mode, stdin_is_terminal, window_size  # noqa: PLC0415
    from checkfu.contract.process import ProcessExit, ProcessOutput  # noqa: PLC0415

    if not live.streams():
        data = sys.stdin.buffer.read() if interactive else b""
        res = await live.exec(argv, env=env, cwd=cwd, timeout=timeout, stdin=data)
        _say_cut(res, "its provider does not stream a process's output (no openProcess)")
        sys.stdout.buffer.write(res.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(res.stderr)
        sys.stderr.flush()
        return TIMEOUT_EXIT if res.timed_out else int(res.exit_code)
    size = window_size() if tty else None
    proc = await live.open_process(argv, env=env, cwd=cwd, tty=size)
    feeding: asyncio.Future[None] | None = None
    with raw_mode(tty and interactive and stdin_is_terminal()):
        try:
            if interactive or tty:
                feeding = asyncio.ensure_future(feed(proc, stdin=interactive, resize=tty))
            else:
                await proc.close_stdin()
            async with asyncio.timeout(timeout):
                async for event in proc.events():
                    if isinstance(event, ProcessOutput):
                        stream = sys.stdout.buffer if event.stream == "out" else sys.stderr.buffer
                        stream.write(event.data)
                        stream.flush()
                    elif isinstance(event, ProcessExit):
                        return int(event.exit_code)
        except TimeoutError:
            err.print(f"[bold yellow]warning[/]: the command ran longer than {timeout:g} s and was killed")
            return TIMEOUT_EXIT
        finally:
            if feeding is not None:
                feeding.cancel()
                await asyncio.gather(feeding, return_exceptions=True)
            await proc.kill()
    return EXIT_FAILED


# cp ---------------------------------------------------------------------------------------------


def _split(spec: str) -> tuple[str | None, str]:
    head, sep, tail = spec.partition(":")
    if sep and SANDBOX_ID.match(head):
        return head, (tail.rstrip("/") or "/") if tail.startswith("/") else tail
    return None, spec


def cp_command(
    src: Annotated[str, typer.Argument(metavar="SRC", help="ID:PATH or a local path")],
    dst: Annotated[str, typer.Argument(metavar="DEST", help="ID:PATH or a local path")],
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Copy files between a sandbox and this machine, in either direction (as docker cp): ID:PATH LOCAL or
    LOCAL ID:PATH. A directory is copied whole; links are never followed."""
    (sid, spath), (did, dpath) = _split(src), _split(dst)

    async def body() -> list[str]:
        if (sid is None) == (did is None):
            raise SandboxPathRejected(
                "cp: name exactly one side as ID:PATH (a sandbox path) and the other as a local path", field="path"
            )
        local = Path(dpath if sid is not None else spath)
        service = await _opened(db)
        try:
            live = await _attached(service, str(sid if sid is not None else did))
            if sid is not None:
                return await _cp_out(live, spath, local)
            return await _cp_in(live, local, dpath)
        except OSError as exc:  # this machine's side: a directory missing, a permission refused
            where = exc.filename or local
            raise SandboxPathRejected(f"path: {where}: {exc.strerror or exc} (on this machine)", field="path") from exc
        finally:
            await service.aclose()

    copied = _run(body, as_json, db)
    _emit(as_json, {"copied": copied}, f"copied {len(copied)} file(s)")


async def _cp_out(live: Any, path: str, local: Path) -> list[str]:
    """Copy ``path`` out of the sandbox to ``local``, keeping each file's permission bits (setuid, setgid and sticky
    dropped). Files are read with ``readFiles`` in batches within the runner's read bound; a file larger than the
    bound is streamed through ``cat`` in the sandbox (``openProcess``), never held whole in memory."""
    from checkfu.contract.errors import SandboxBoundExceeded  # noqa: PLC0415
    from checkfu.contract.paths import admit_path  # noqa: PLC0415

    admit_path(path, field="path")
    listing = await live.list_dir(path)
    if listing.kind == "missing":
        raise SandboxNotFound(f"path: nothing at {path} in sandbox {live.sandbox_id}", field="path")
    into = local / PurePosixPath(path).name if local.is_dir() else local
    if listing.kind == "file":
        saved = await _read_out(live, [(path, None, None)], lambda p: into)
        if not saved:
            raise SandboxNotFound(f"path: no file at {path} in sandbox {live.sandbox_id}", field="path")
        return saved
    if listing.kind != "dir":
        raise SandboxPathRejected(f"path: {path} is a {listing.kind}; links are never followed", field="path")
    tree = await live.list_dir(path, recursive=True)
    if tree.truncated:
        raise SandboxBoundExceeded(
            f"path: {path} holds more than {len(tree.entries)} entries, more than one listing returns; copy its "
            "subdirectories one by one",
            field="path",
        )
    entries = tree.entries
    into.mkdir(parents=True, exist_ok=True)
    dirs = [e for e in entries if e.kind == "dir"]
    for e in dirs:
        (into / PurePosixPath(e.path).relative_to(path)).mkdir(parents=True, exist_ok=True)
    files = [(e.path, e.size, e.mode) for e in entries if e.kind == "file"]
    saved = await _read_out(live, files, lambda p: into / PurePosixPath(p).relative_to(path))
    for e in sorted(dirs, key=lambda e: e.path.count("/"), reverse=True):  # the deepest first: a parent may shut
        os.chmod(into / PurePosixPath(e.path).relative_to(path), e.mode & 0o777)
    return saved


async def _read_out(
    live: Any, files: list[tuple[str, int | None, int | None]], local_of: Callable[[str], Path]
) -> list[str]:
    """Save each ``(path, size, mode)`` at ``local_of(path)``: in ``readFiles`` batches of at most the runner's read
    bound (and 256 paths), a file larger than the bound streamed by itself. A path with no regular file is skipped."""
    bound = int(live.session.limits.max_read_bytes)
    saved: list[str] = []
    batch: list[str] = []
    held = 0
    large: list[tuple[str, int | None]] = []

    async def flush() -> None:
        nonlocal batch, held
        if batch:
            got, too_large = await _read_batch(live, batch, local_of)
            saved.extend(got)
            large.extend((p, None) for p in too_large)
        batch, held = [], 0

    for p, size, mode in files:
        if size is not None and size > bound:
            large.append((p, mode))
            continue
        if batch and (held + (size or 0) > bound or len(batch) >= 256):
            await flush()
        batch.append(p)
        held += size or 0
    await flush()
    for p, mode in large:
        saved.append(await _stream_out(live, p, local_of(p), mode))
    return saved


async def _read_batch(live: Any, paths: list[str], local_of: Callable[[str], Path]) -> tuple[list[str], list[str]]:
    """Read ``paths`` with one ``readFiles`` and save them: what was saved, and what is too large to read so. A batch
    refused for its size (the files grew since they were listed) is read again one file at a time."""
    try:
        res = await live.read_files(paths)
    except SandboxProviderFailed as exc:
        if exc.reported_code != "SandboxBoundExceeded":
            raise
        if len(paths) == 1:
            return [], list(paths)
        saved_each: list[str] = []
        large: list[str] = []
        for p in paths:
            got, too_large = await _read_batch(live, [p], local_of)
            saved_each.extend(got)
            large.extend(too_large)
        return saved_each, large
    saved = []
    for f in res.files:
        target = local_of(f.path)  # its directory made from the listing: a local path missing is refused
        target.write_bytes(f.data)
        os.chmod(target, f.mode & 0o777)
        saved.append(str(target))
    return saved, []


async def _stream_out(live: Any, path: str, target: Path, mode: int | None) -> str:
    """Stream the file at ``path`` to ``target`` through ``cat`` in the sandbox, chunk by chunk; ``target`` is left
    only once all of it arrived (a failure removes it).

    Raises:
        SandboxBoundExceeded: the provider cannot stream a process's output (no ``openProcess``), so a file larger
            than the runner's read bound cannot be copied out.
        SandboxProviderFailed: ``cat`` could not read it (its words say why).
    """
    from checkfu.contract.errors import SandboxBoundExceeded  # noqa: PLC0415
    from checkfu.contract.process import ProcessExit, ProcessOutput  # noqa: PLC0415

    if not live.streams():
        bound = int(live.session.limits.max_read_bytes)
        raise SandboxBoundExceeded(
            f"path: {path} is larger than the runner's read bound ({bound} bytes) and provider "
            f"{live.record.provider} cannot stream it (no openProcess)",
            field="path",
        )
    if mode is None:
        mode = await _mode_of(live, path)
    partial = target.with_name(f".{target.name}.checkfu-part")
    proc = await live.open_process(["cat", "--", path])
    code: int | None = None
    said = bytearray()
    try:
        await proc.close_stdin()
        with partial.open("wb") as f:
            async for event in proc.events():
                if isinstance(event, ProcessOutput):
                    if event.stream == "out":
                        f.write(event.data)
                    elif len(said) < 4096:
                        said.extend(event.data)
                elif isinstance(event, ProcessExit):
                    code = event.exit_code
        if code != 0:
            why = said.decode("utf-8", "replace").strip()[:300] or f"exit {code}"
            raise SandboxProviderFailed(f"path: {path} could not be read: {why}", field="path")
        os.chmod(partial, (mode if mode is not None else 0o644) & 0o777)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        await proc.kill()
    return str(target)


async def _mode_of(live: Any, path: str) -> int | None:
    """The permission bits of the file at ``path``, from its directory's listing (``None``: not found there)."""
    parent = str(PurePosixPath(path).parent)
    listing = await live.list_dir(parent)
    return next((e.mode for e in listing.entries if e.path == path), None)


async def _cp_in(live: Any, local: Path, path: str) -> list[str]:
    from checkfu.contract.paths import admit_path  # noqa: PLC0415

    admit_path(path, field="path")
    if not local.exists() or (local.is_symlink() and not local.is_file()):
        raise SandboxPathRejected(f"path: {local} does not exist here", field="path")
    there = await live.list_dir(path)
    dest = str(PurePosixPath(path) / local.name) if there.kind == "dir" else path
    if local.is_file():
        await live.write_file(dest, local.read_bytes(), mode=local.stat().st_mode & 0o777)
        return [dest]
    written: list[str] = []
    for item in sorted(local.rglob("*")):
        if item.is_symlink() or not item.is_file():
            continue
        target = str(PurePosixPath(dest) / item.relative_to(local).as_posix())
        await live.write_file(target, item.read_bytes(), mode=item.stat().st_mode & 0o777)
        written.append(target)
    return written


# snapshot | resume | clone ------------------------------------------------------------------------


def snapshot_command(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    keep: Annotated[
        str | None,
        typer.Option(
            "--keep",
            help="lifetime to ask for: 7d, 12h; the snapshot is deleted once it passes (default: kept until deleted)",
            metavar="DURATION",
        ),
    ] = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Snapshot a live sandbox's files; prints the snapshot id (`checkfu resume` makes a sandbox of it)."""

    async def body() -> Any:
        seconds = parse_duration(keep, "--keep") if keep is not None else None
        service = await _opened(db)
        try:
            live = await _attached(service, sandbox_id)
            return await live.snapshot(keep=seconds)
        finally:
            await service.aclose()

    snap = _run(body, as_json, db)
    _emit(
        as_json,
        {
            "snapshot_id": snap.snapshot_ref,
            "sandbox_id": sandbox_id,
            "keep_seconds": snap.keep_seconds,
            "expires_at": _when(snap.expires_at),
        },
        snap.snapshot_ref,
    )


def resume_command(
    snapshot: Annotated[str, typer.Argument(metavar="SNAPSHOT")],
    ttl: TtlOpt = "30m",
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a new sandbox from a snapshot; prints its id."""

    async def body() -> Any:
        seconds = parse_duration(ttl, "--ttl")
        service = await _opened(db)
        try:
            ref = _check_id(snapshot, snapshot=True)
            live = await service.resume_snapshot(ref, ttl=seconds, detached=True, credential=_credential())
        finally:
            await service.aclose()
        return live.record

    rec = _run(body, as_json, db)
    _emit(as_json, {"sandbox_id": rec.sandbox_id, "run_id": rec.run_id, "snapshot_id": snapshot}, rec.sandbox_id)


def clone_command(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID")],
    ttl: TtlOpt = "30m",
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a new sandbox holding a live sandbox's files as they are now; prints its id."""

    async def body() -> Any:
        seconds = parse_duration(ttl, "--ttl")
        service = await _opened(db)
        try:
            live = await _attached(service, sandbox_id)
            copy = await service.clone_sandbox(live, ttl=seconds, detached=True)
        finally:
            await service.aclose()
        return copy.record

    rec = _run(body, as_json, db)
    _emit(as_json, {"sandbox_id": rec.sandbox_id, "run_id": rec.run_id, "source": sandbox_id}, rec.sandbox_id)


# ps | kill --------------------------------------------------------------------------------------


def _owner_text(owner: str | None) -> str:
    if not owner or owner.startswith("detached:"):
        return "detached"
    host, _, rest = owner.partition("/")
    return f"{host}/{rest.split('/')[0]}"


def ps_command(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Live sandboxes and Runs (owner, age, time left, provider) and the snapshots kept. Whatever is due is
    reclaimed first: a sandbox whose time-to-live passed, or whose owner process is gone, is shown as
    expired or orphaned, and reclaimed. What lives on a provider service names its URL (``endpoint``)."""
    from checkfu.cli import state  # noqa: PLC0415
    from checkfu.core.clock import SystemClock  # noqa: PLC0415
    from checkfu.core.leases import LeaseStore, owner_alive  # noqa: PLC0415
    from checkfu.core.registry import is_endpoint  # noqa: PLC0415
    from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

    try:
        journal = open_journal(db)
    except JournalError as exc:
        _fail(exc, as_json)
    try:
        reclaimed = list(state.RECLAIMED)
        now = time.time()
        book = SandboxBook(journal)
        tag = runner_tag(db)
        store = LeaseStore(journal, SystemClock())
        boxes: list[dict[str, Any]] = []
        sandbox_runs = set()
        for rec in book.live(tag):
            sandbox_runs.add(rec.run_id)
            why = rec.orphaned(now)
            boxes.append(
                {
                    "id": rec.sandbox_id,
                    "kind": "sandbox",
                    "state": ("expired" if why == "its time-to-live passed" else "orphaned") if why else rec.state,
                    "owner": _owner_text(rec.owner),
                    "age_seconds": round(now - rec.created_at, 1),
                    "time_left_seconds": round(max(0.0, rec.expires_at - now), 1),
                    "expires_at": _when(rec.expires_at),
                    "provider": rec.provider,
                    "endpoint": rec.site if is_endpoint(rec.site) else None,
                    "run_id": rec.run_id,
                    "reclaimed": False,
                    "ports": _published(journal, rec.run_id),
                }
            )
        for r in reclaimed:
            gone = book.get(r.sandbox_id)
            if gone is None:
                continue
            listed = next((b for b in boxes if b["id"] == r.sandbox_id), None)
            if listed is not None:  # it could not be reclaimed, so it is still live: one line, with why
                if r.error:
                    listed["error"] = r.error
                continue
            rec = gone
            sandbox_runs.add(rec.run_id)
            boxes.append(
                {
                    "id": rec.sandbox_id,
                    "kind": "sandbox",
                    "state": r.reason,
                    "owner": _owner_text(rec.owner),
                    "age_seconds": round(now - rec.created_at, 1),
                    "time_left_seconds": 0.0,
                    "expires_at": _when(rec.expires_at),
                    "provider": rec.provider,
                    "endpoint": rec.site if is_endpoint(rec.site) else None,
                    "run_id": rec.run_id,
                    "reclaimed": r.error is None,
                    **({"error": r.error} if r.error else {}),
                }
            )
        runs: list[dict[str, Any]] = []
        for run in journal.unsettled_runs(runner_tag=tag):
            if run.run_id in sandbox_runs:
                continue
            owner, left = None, None
            for lease_id in journal.lease_ids_for_run(run.run_id):
                try:
                    held = store.record(lease_id)
                except SandboxError:
                    continue
                if not held.ended:
                    owner, left = held.owner, held.expires_at - now
            alive = owner_alive(owner) if owner else None
            sites = [run.site] + [a.site for a in journal.allocations_for_run(run.run_id)]
            runs.append(
                {
                    "id": run.run_id,
                    "kind": "run",
                    "state": "orphaned" if alive is False else "running",
                    "owner": _owner_text(owner),
                    "age_seconds": round(now - run.created_at, 1),
                    "time_left_seconds": round(max(0.0, left), 1) if left is not None else None,
                    "provider": run.target.provider if run.target is not None else None,
                    "endpoint": next((site for site in sites if is_endpoint(site)), None),
                    "command": run.command,
                    "ports": _published(journal, run.run_id),
                }
            )
        snaps: list[dict[str, Any]] = [
            {
                "id": s.snapshot_ref,
                "kind": "snapshot",
                "sandbox_id": s.sandbox_id,
                "age_seconds": round(now - s.created_at, 1),
                "keep_seconds": s.keep_seconds,
                "expires_at": _when(s.expires_at),
                "provider": s.target.provider,
                "endpoint": s.site if is_endpoint(s.site) else None,
            }
            for s in book.snapshots(tag)
        ]
    finally:
        journal.close()
    if as_json:
        print(json.dumps({"ok": True, "sandboxes": boxes, "runs": runs, "snapshots": snaps}))
        return
    rows = [("ID", "KIND", "STATE", "OWNER", "AGE", "TIME LEFT", "PROVIDER", "PORTS")]
    for row in [*boxes, *runs]:
        left = row["time_left_seconds"]
        rows.append(
            (
                row["id"],
                row["kind"],
                row["state"] + (" (reclaimed)" if row.get("reclaimed") else ""),
                row["owner"],
                _span(row["age_seconds"]),
                "-" if left is None else _span(left),
                _where(row),
                ", ".join(f"{_host(p['host'])}:{p['host_port']}->{p['port']}/tcp" for p in row.get("ports") or ()),
            )
        )
    for snap in snaps:
        rows.append(
            (
                snap["id"],
                "snapshot",
                "kept",
                f"of {snap['sandbox_id']}",
                _span(snap["age_seconds"]),
                f"expires {snap['expires_at']}" if snap["expires_at"] else "until deleted",
                _where(snap),
                "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def _published(journal: Any, run_id: str) -> list[dict[str, Any]]:
    """The ports published for ``run_id``'s sandbox (``-p``), as ``PublishedPort.to_json()`` gave them when they
    were opened; they stay open as long as the sandbox does."""
    from checkfu.contract.ports import PUBLISH_PORT  # noqa: PLC0415

    found: list[dict[str, Any]] = []
    for event in journal.events_for_run(run_id):
        if event.member == PUBLISH_PORT and event.outcome == "ok" and event.detail:
            with contextlib.suppress(ValueError):
                value = json.loads(event.detail)
                if isinstance(value, dict):
                    found.append(value)
    return found


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _where(row: dict[str, Any]) -> str:
    """A row's provider as the table shows it: its name, and the service's URL when it lives on one."""
    return f"{row['provider']} at {row['endpoint']}" if row.get("endpoint") else str(row["provider"])


KILL_WAIT = 15.0
"""How long ``checkfu kill RUN`` waits for a Run's own process to release after SIGTERM, before SIGKILL."""


def kill_command(
    ident: Annotated[str, typer.Argument(metavar="RUN|ID", help="a Run id (run-...) or a sandbox id (sb-...)")],
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop a sandbox (released at once) or a Run: its process is sent SIGTERM (it releases everything and
    records the Run as interrupted), then SIGKILL after 15 s, and what it held is reclaimed."""
    if ident.startswith("sb-"):
        done = _run(lambda: _remove([ident], db, status="killed"), as_json, db)
        _emit(as_json, {"killed": done, "kind": "sandbox"}, ident)
        return
    how = _run(lambda: _kill_run(ident, db), as_json, db)
    _emit(as_json, {"killed": [ident], "kind": "run", "how": how}, f"{ident} ({how})")


async def _kill_run(run_id: str, db: str | None) -> str:
    from checkfu.control.endpoints import reach  # noqa: PLC0415
    from checkfu.core.clock import SystemClock  # noqa: PLC0415
    from checkfu.core.leases import LeaseStore, owner_alive  # noqa: PLC0415
    from checkfu.core.reconcile import reconcile  # noqa: PLC0415
    from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

    if not re.match(r"^run-[0-9a-f]{1,40}$", run_id):
        raise SandboxNotFound(
            f"run: {run_id[:60]!r} is neither a Run id (run-...) nor a sandbox id (sb-...)", field="run"
        )
    journal = open_journal(db)
    try:
        run = journal.run(run_id)
        if run is None:
            raise SandboxNotFound(f"run: no Run {run_id} in this journal", field="run")
        if run.status != "running":
            raise SandboxStateConflict(f"run: {run_id} already ended ({run.status})", field="run")
        tag = runner_tag(db)
        if run.runner_tag != tag:
            raise SandboxStateConflict(
                f"run: {run_id} belongs to runner tag {run.runner_tag!r}, not this one ({tag!r}): kill it as that "
                "runner (CHECKFU_RUNNER_TAG)",
                field="run",
            )
        for box in SandboxBook(journal).live():
            if box.run_id == run_id:
                await _remove([box.sandbox_id], db, status="killed")
                return f"sandbox {box.sandbox_id} released"
        store = LeaseStore(journal, SystemClock())
        owners = []
        for lease_id in journal.lease_ids_for_run(run_id):
            rec = store.record(lease_id)
            if not rec.ended:
                owners.append(rec.owner)
        how = "reclaimed"
        for owner in owners:
            alive = owner_alive(owner)
            if alive is True and owner != run.owner:
                # a process that holds the Run but did not start it in place (a fleet runner serving many Runs,
                # a program embedding the runner, a sandbox still being made) is never signalled for one Run
                raise SandboxStateConflict(
                    f"run: {run_id} is held by {owner}, which serves more than this Run: stop it there",
                    field="run",
                )
            if alive is True:
                pid = int(owner.rsplit("/", 2)[1])
                _signal(pid, signal.SIGTERM, run_id)
                deadline = time.monotonic() + KILL_WAIT
                while time.monotonic() < deadline and owner_alive(owner):
                    await asyncio.sleep(0.1)
                if owner_alive(owner):
                    _signal(pid, signal.SIGKILL, run_id)
                    how = "SIGKILL, then reclaimed"
                else:
                    how = "SIGTERM: it released what it held"
            elif alive is None:
                raise SandboxStateConflict(
                    f"run: {run_id} is held by {owner}, on another host: stop it there", field="run"
                )
        after = journal.run(run_id)
        if after is not None and after.status == "running" and run.target is not None:
            # each allocation where it was journaled: a provider service's at its endpoint, never a local namesake
            wanted = {(r.target.provider, r.site) for r in journal.open_allocations(run_id=run_id)}
            registry = await reach(journal, wanted or {(run.target.provider, None)}, recorder=journal)
            report = await reconcile(journal, registry, SystemClock(), runner_tag=tag)
            mine = {r.allocation_key for r in journal.allocations_for_run(run_id)}
            left = {key: why for key, why in report.left.items() if key in mine}
            if left:
                raise SandboxProviderFailed(
                    f"provider: {run_id}'s process is stopped, but what it holds could not be reclaimed: "
                    + "; ".join(f"{key}: {why}" for key, why in sorted(left.items()))
                    + " (run `checkfu runner reconcile` once its provider answers)",
                    field="provider",
                )
        return how
    finally:
        journal.close()


def _signal(pid: int, sig: signal.Signals, run_id: str) -> None:
    """Signal a Run's owner; one that ended meanwhile is simply gone.

    Raises:
        SandboxStateConflict: the owner is another user's process (field ``run``).
    """
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        raise SandboxStateConflict(
            f"run: {run_id}'s owner (pid {pid}) cannot be signalled: {exc}", field="run"
        ) from exc


def register(app: typer.Typer) -> None:
    """Add these commands to the ``checkfu`` command."""
    app.add_typer(sandbox_app, name="sandbox")
    plain = {"allow_interspersed_args": False}
    app.command("exec", context_settings=plain)(exec_command)
    app.command("cp")(cp_command)
    app.command("snapshot")(snapshot_command)
    app.command("resume")(resume_command)
    app.command("clone")(clone_command)
    app.command("ps")(ps_command)
    app.command("kill")(kill_command)
