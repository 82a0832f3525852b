"""``checkfu run``, ``checkfu runs`` and ``checkfu runner reconcile``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from checkfu.cli.common import (
    EXIT_REFUSED,
    AdaptersOpt,
    ConsoleObserver,
    CpusOpt,
    CredentialOpt,
    DbOpt,
    DiskOpt,
    ExcludeOpt,
    ImageOpt,
    JsonOpt,
    MemoryOpt,
    NetworkOpt,
    PidsOpt,
    ask_early,
    choose,
    err,
    human_bytes,
    load_adapters,
    overrides_of,
    pin_image,
    refill_in_background,
    refused,
    resolved_profile,
    resolved_text,
    write_json,
)
from checkfu.cli.engines import EngineCertsOpt, EngineOpt, engine_sites
from checkfu.cli.interrupts import signals_cancel, sigterm_interrupts
from checkfu.cli.outputs import is_dash
from checkfu.cli.state import (
    client_credential,
    close_journal,
    enrolled_credential,
    is_url,
    open_journal,
    open_service,
    runner_tag,
    service_of,
)
from checkfu.contract.codec import decode_value
from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxError,
    SandboxPathRejected,
    SandboxProfileInvalid,
)
from checkfu.contract.ports import PortSpec, admit_ports, exposure_warning
from checkfu.contract.profile import DESTINATION_PATTERN, NetworkPolicy, SandboxProfile
from checkfu.contract.tiers import assess
from checkfu.core.admission import (
    ENV_NAME,
    Problem,
    argv_problems,
    capture_problems,
    env_problems,
    raise_problems,
    runner_tag_problems,
    target_problems,
    workdir_problems,
)
from checkfu.core.documents import DocumentError, read_bounded
from checkfu.core.job import JobResult, resolve_mounts
from checkfu.core.journal import ORPHANED, JournalError
from checkfu.core.mounts import DirectorySource, MountSpec, parse_mount, top_level_sizes
from checkfu.core.output import CAP_ENV, output_cap
from checkfu.core.profiles import Overrides, ReadProfile, parse_seconds, read_profile
from checkfu.core.reconcile import describe_owner, run_status
from checkfu.core.registry import (
    adapters_file,
    installed_entry_points,
    read_adapters_file,
)
from checkfu.core.runner import Attempt

if TYPE_CHECKING:
    from checkfu.wire.credentials import Credential

# Loaded where used, so that `checkfu run` on an installed provider starts without them: the wire client (a
# provider service's URL), rich's progress bars (mounts to hash or stage), the terminal (-i/-t) and the tables of
# `checkfu runs`.

runs_app = typer.Typer(help="The history of Runs, from the journal.", no_args_is_help=True)
runner_app = typer.Typer(help="Runner maintenance.", no_args_is_help=True)


def _terminal() -> Any:
    """``checkfu.cli.terminal``, loaded only for -i/-t."""
    from checkfu.cli import terminal  # noqa: PLC0415

    return terminal


def _allow_problems(allow: list[str]) -> list[Problem]:
    return [
        Problem(
            SandboxProfileInvalid(
                f"--allow: {value[:80]!r} is not HOST:PORT (a lowercase DNS name, an IPv4 address or a bracketed "
                "IPv6 address, then a port 1..65535)",
                field="allow",
            )
        )
        for value in allow
        if not re.fullmatch(DESTINATION_PATTERN, value)
    ]


def _allowing(prof: SandboxProfile, allow: list[str]) -> SandboxProfile:
    """``prof`` with its network an allowlist of exactly ``allow`` (``HOST:PORT`` each), when any is given."""
    if not allow:
        return prof
    policy = decode_value(NetworkPolicy, {"mode": "allowlist", "allowlist": list(dict.fromkeys(allow))})
    return prof.model_copy(update={"network_policy": policy})


# the environment ---------------------------------------------------------------------------------

MAX_ENV_FILE = 1 << 20


def _env(values: list[str], files: list[Path], warn: list[str]) -> tuple[dict[str, str], list[Problem]]:
    """The process's environment from ``--env-file`` files, then ``-e`` (later wins), as docker reads them.

    ``NAME=VALUE`` sets a value; ``NAME`` alone copies the caller's (and is left out, with a warning, when the
    caller has none). In a file, blank lines and lines starting with ``#`` are skipped. Values are never shown.
    """
    env: dict[str, str] = {}
    problems: list[Problem] = []

    def take(item: str, where: str) -> None:
        name, sep, value = item.partition("=")
        if not ENV_NAME.match(name):  # named once, where it was given (not again as env)
            problems.extend(env_problems({name: ""}, field=where))
            env.pop(name, None)
            return
        if not sep:
            if name not in os.environ:
                warn.append(f"{name} is not set here, so it is not passed ({where})")
                return
            env[name] = os.environ[name]
        else:
            env[name] = value

    for path in files:
        try:
            raw = read_bounded(path, limit=MAX_ENV_FILE)  # a FIFO or a device is refused, not read
        except DocumentError as exc:
            problems.append(Problem(SandboxProfileInvalid(f"--env-file: {exc}", field="env-file")))
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(Problem(SandboxProfileInvalid(f"--env-file: {path} is not UTF-8", field="env-file")))
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            take(line, f"--env-file {path}:{number}")
    for item in values:
        take(item, "-e")
    problems.extend(env_problems(env))
    return env, problems


def _capture_dir_problems(path: Path) -> list[Problem]:
    """``--capture-dir`` must be a directory this user can write, or creatable as one: a file is made and removed
    in it (or in its nearest existing parent), which is the only test that holds for root and read-only mounts."""
    if is_dash(path):  # stdout or stdin, never a directory of that name
        why = "- means stdout or stdin, but captures are a directory of files; name a path (one called - in full)"
        return [Problem(SandboxPathRejected(f"--capture-dir: {why}", field="capture-dir"))]
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe == path and not path.is_dir():
        why = f"{path} exists and is not a directory"
    elif not probe.is_dir():
        why = f"{path} cannot be made ({probe} is not a directory)"
    else:
        try:
            with tempfile.TemporaryFile(dir=probe):
                return []
        except OSError as exc:
            why = f"{path} cannot be written ({probe}: {exc.strerror})"
    return [Problem(SandboxPathRejected(f"--capture-dir: {why}", field="capture-dir"))]


# the run -------------------------------------------------------------------------------------------

FINISHED: list[int] = []
"""The command's exit status once the Run ran it (so ``main`` tells it from a usage error's)."""


@dataclass(frozen=True)
class CheckedRun:
    """``checkfu run``'s inputs, every one checked before any work (``checkfu submit`` checks its own with this)."""

    read: ReadProfile
    specs: list[MountSpec]
    env: dict[str, str]
    timeout: float = 3600.0


def check_run_inputs(
    *,
    command: list[str],
    profile: Path | None,
    mounts: list[str],
    no_ignore: bool,
    env_values: list[str],
    env_files: list[Path],
    workdir: str | None,
    interactive: bool,
    use_tty: bool,
    name: str,
    remote: bool,
    captures: list[str],
    capture_dir: Path | None,
    db: str | None,
    timeout: float | str,
    allow: list[str],
    warnings: list[str],
    adapters: Path | None = None,
    overrides: Overrides | None = None,
    excludes: tuple[str, ...] = (),
) -> CheckedRun:
    """Every check of ``checkfu run``'s inputs that asks no provider anything, every problem listed.

    ``adapters``: an adapters file (already defaulted from ``CHECKFU_ADAPTERS``); it is read and its tables checked
    here, and a provider name it may serve is not refused for not being installed (its factories are called only
    when the Run loads its registry). ``overrides``: the docker-style flags over the profile (each wins).
    ``timeout``: seconds, or a duration (``30s``, ``5m``).

    Raises:
        SandboxError: the problems found (nothing was run, nothing allocated).
    """
    problems: list[Problem] = []
    if adapters is not None and not remote:
        try:
            read_adapters_file(adapters)
        except SandboxError as exc:
            problems.append(Problem(exc))
    if not remote and adapters is None:
        installed = sorted(ep.name for ep in installed_entry_points())
        if name not in installed:
            problems.append(
                Problem(
                    SandboxAdapterUnavailable(
                        f"no provider named {name!r} (installed: {', '.join(installed) or 'none'})", field="provider"
                    )
                )
            )
    if remote and profile is None:
        problems.append(
            Problem(SandboxProfileInvalid("--profile: a provider service needs a profile file", field="profile"))
        )
    read = read_profile(profile, name, overrides)
    problems.extend(read.problems)
    specs: list[MountSpec] = []
    for i, text in enumerate(mounts):
        try:
            specs.append(parse_mount(text, stage_all=no_ignore, excludes=excludes))
        except SandboxError as exc:
            problems.append(Problem(type(exc)(f"mounts.{i}: {exc.message}", field=f"mounts.{i}")))
    problems.extend(target_problems([s.target for s in specs]))
    for i, spec in enumerate(specs):
        src = spec.source
        where = src.path if isinstance(src, DirectorySource) else src.repo
        if not where.exists():
            problems.append(
                Problem(
                    SandboxProfileInvalid(f"mounts.{i}: {spec.describe()}: {where} does not exist", field=f"mounts.{i}")
                )
            )
    env, env_probs = _env(env_values, env_files, warnings)
    problems.extend(env_probs)
    problems.extend(workdir_problems(workdir))
    problems.extend(capture_problems(captures))
    if captures and capture_dir is not None:
        problems.extend(_capture_dir_problems(capture_dir))
    problems.extend(argv_problems(command))
    problems.extend(runner_tag_problems(runner_tag(db)))
    problems.extend(_allow_problems(allow))
    try:
        output_cap()
    except ValueError as exc:
        problems.append(Problem(SandboxProfileInvalid(str(exc), field=CAP_ENV)))
    seconds = 3600.0
    try:
        seconds = parse_seconds(timeout, "--timeout")
    except SandboxProfileInvalid as exc:
        problems.append(Problem(exc))
    if interactive and use_tty and not _terminal().stdin_is_terminal():
        problems.append(
            Problem(
                SandboxProfileInvalid(
                    "-it: the input is not a terminal; use -i alone to stream piped input", field="tty"
                )
            )
        )
    raise_problems(problems)
    return CheckedRun(read=read, specs=specs, env=env, timeout=seconds)


def run_command(
    command: Annotated[
        list[str],
        typer.Argument(
            help="the command to run inside the sandbox, after --", show_default=False, metavar="COMMAND..."
        ),
    ],
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="a SandboxProfile, TOML or JSON (default: the built-in one; see `checkfu profile init`)",
            show_default=False,
            metavar="FILE",
        ),
    ] = None,
    mount: Annotated[
        list[str] | None,
        typer.Option(
            "--mount",
            help="SRC:TARGET[:rw]: a directory or REPO@REF at an absolute sandbox path; sealed read-only unless :rw; "
            ":rw,sync copies the target back into a directory SRC when the Run ends",
            show_default=False,
            metavar="SRC:TARGET[:rw]",
        ),
    ] = None,
    no_ignore: Annotated[
        bool, typer.Option("--no-ignore", help="stage what git ignores too (a directory inside a git work tree)")
    ] = False,
    publish: Annotated[
        list[str] | None,
        typer.Option(
            "-p",
            "--publish",
            help="[HOST_IP:]HOST_PORT:PORT: reach sandbox PORT at HOST_IP:HOST_PORT on this machine while the Run "
            "lasts (HOST_IP 127.0.0.1 unless named, 0.0.0.0 only if you say so; HOST_PORT 0: any free port); the "
            "sandbox keeps its network (docs/egress.md#published-ports); Docker only",
            show_default=False,
            metavar="[HOST_IP:]HOST_PORT:PORT",
        ),
    ] = None,
    exclude: ExcludeOpt = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "-e",
            "--env",
            help="NAME=VALUE, or NAME to pass the caller's value (repeatable)",
            show_default=False,
            metavar="NAME[=VALUE]",
        ),
    ] = None,
    env_file: Annotated[
        list[Path] | None,
        typer.Option("--env-file", help="a file of NAME=VALUE lines (repeatable)", show_default=False, metavar="FILE"),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option(
            "-w",
            "--workdir",
            help="the working directory in the sandbox (absolute)",
            show_default=False,
            metavar="PATH",
        ),
    ] = None,
    interactive: Annotated[bool, typer.Option("-i", "--interactive", help="stream stdin to the command")] = False,
    use_tty: Annotated[
        bool, typer.Option("-t", "--tty", help="give the command a pseudo-terminal that follows this one's size")
    ] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="print only the command's own output")] = False,
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="write the summary as JSON to FILE (- for stdout, after the command's own output)",
            show_default=False,
            metavar="FILE",
        ),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(
            "--provider",
            help="provider name, or a provider service's URL (default: docker)",
            show_default=False,
            metavar="NAME|URL",
        ),
    ] = None,
    capture: Annotated[
        list[str] | None,
        typer.Option(
            "--capture",
            help="an absolute sandbox path to read back: a file, or a directory (end it with / to say so; a "
            "directory needs a provider that serves listDir)",
            show_default=False,
            metavar="PATH",
        ),
    ] = None,
    capture_dir: Annotated[
        Path | None,
        typer.Option(
            "--capture-dir",
            help="where captures go (default: captures/RUN in the state directory)",
            show_default=False,
            metavar="DIR",
        ),
    ] = None,
    db: DbOpt = None,
    timeout: Annotated[
        str,
        typer.Option("--timeout", help="how long the command may run: 30s, 5m, 2h, or seconds", metavar="DURATION"),
    ] = "3600",
    credential_file: CredentialOpt = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            help="HOST:PORT the sandbox may reach (repeatable): the profile's network becomes this allowlist",
            show_default=False,
            metavar="HOST:PORT",
        ),
    ] = None,
    adapters: AdaptersOpt = None,
    pool: Annotated[
        bool,
        typer.Option(
            "--pool",
            help="adopt a ready sandbox of `checkfu pool fill` (same provider, profile and mount targets) when there "
            "is one, else provision as always; the pool is refilled in the background",
        ),
    ] = False,
    image: ImageOpt = None,
    memory: MemoryOpt = None,
    cpus: CpusOpt = None,
    pids: PidsOpt = None,
    disk: DiskOpt = None,
    network: NetworkOpt = None,
) -> None:
    """Run one command in a fresh sandbox, with mounts staged by the runner.

    The Run's output is kept in the journal for `checkfu logs RUN`: the first 16 MiB (stdout and stderr
    together; CHECKFU_OUTPUT_CAP=BYTES sets another cap), beyond which it is counted, not kept; no value given
    with -e or --env-file is kept in it (docs/runs.md).

    Exit status: the command's own, or one of checkfu's (docs/exit-codes.md):
    125 refused, usage error or sandbox failure; 126 cannot execute; 127 not found;
    124 --timeout; 130 SIGINT; 143 SIGTERM.
    """
    name = provider or "docker"
    remote = is_url(name)
    warnings: list[str] = []
    summary: dict[str, Any] = {"ok": False}
    try:
        overrides, allowed = overrides_of(image, memory, cpus, pids, disk, network, allow or [])
        with sigterm_interrupts():  # until the Run's event loop takes both signals over (`_run`)
            code = _admit_and_run(
                command=command,
                profile=profile,
                mounts=mount or [],
                no_ignore=no_ignore,
                excludes=tuple(exclude or ()),
                env_values=env or [],
                env_files=env_file or [],
                workdir=workdir,
                interactive=interactive,
                use_tty=use_tty,
                quiet=quiet,
                name=name,
                remote=remote,
                explicit=provider is not None,
                captures=capture or [],
                capture_dir=capture_dir,
                db=db,
                timeout=timeout,
                credential_file=credential_file,
                allow=allowed,
                warnings=warnings,
                summary=summary,
                pool=pool,
                adapters=adapters_file(adapters),
                overrides=overrides,
                publish=publish or [],
            )
    except SandboxError as exc:
        refused(exc, json_file, summary)
        raise typer.Exit(EXIT_REFUSED) from None
    if json_file is not None:
        write_json(json_file, summary)
    FINISHED.append(code)
    raise typer.Exit(code)


def _admit_and_run(
    *,
    command: list[str],
    profile: Path | None,
    mounts: list[str],
    no_ignore: bool,
    env_values: list[str],
    env_files: list[Path],
    workdir: str | None,
    interactive: bool,
    use_tty: bool,
    quiet: bool,
    name: str,
    remote: bool,
    explicit: bool,
    captures: list[str],
    capture_dir: Path | None,
    db: str | None,
    timeout: float | str,
    credential_file: Path | None,
    allow: list[str],
    warnings: list[str],
    summary: dict[str, Any],
    pool: bool = False,
    adapters: Path | None = None,
    overrides: Overrides | None = None,
    publish: list[str] | None = None,
    excludes: tuple[str, ...] = (),
) -> int:
    """Every input checked (every problem listed), then the Run. Returns the exit status.

    Raises:
        SandboxError: a refusal (nothing ran, nothing was allocated) or a sandbox failure.
    """
    checked = check_run_inputs(
        command=command,
        profile=profile,
        mounts=mounts,
        no_ignore=no_ignore,
        env_values=env_values,
        env_files=env_files,
        workdir=workdir,
        interactive=interactive,
        use_tty=use_tty,
        name=name,
        remote=remote,
        captures=captures,
        capture_dir=capture_dir,
        db=db,
        timeout=timeout,
        allow=allow,
        warnings=warnings,
        adapters=adapters,
        overrides=overrides,
        excludes=excludes,
    )
    read, specs, env, timeout = checked.read, checked.specs, checked.env, checked.timeout
    ports = admit_ports(publish or [], name)
    warnings.extend(w for w in map(exposure_warning, ports) if w is not None)
    for line in warnings:
        if not quiet:
            err.print(f"[bold yellow]warning[/]: {escape(line)}")
    credential = client_credential(credential_file) if remote else None
    early = None if remote else ask_early(read, name)
    try:
        journal = open_journal(db)
    except BaseException:
        if early is not None:
            early.close()
        raise
    if remote and credential is None:
        credential = enrolled_credential(journal, name)
    try:
        if not quiet:
            err.print(f"[dim]• profile     {escape(read.name)}[/]")
        prof: SandboxProfile | ReadProfile = read if remote else _allowing(pin_image(read, name, quiet, early), allow)
        size = _terminal().window_size() if use_tty else None
        return asyncio.run(
            _run(
                prof,
                name,
                explicit,
                specs,
                command,
                captures,
                capture_dir,
                journal,
                timeout,
                credential,
                allow,
                env=env,
                workdir=workdir,
                interactive=interactive,
                tty=size,
                quiet=quiet,
                summary=summary,
                db=db,
                profile_name=read.name,
                pool=pool,
                adapters=adapters,
                image_name=read.tag,
                ports=ports,
            )
        )
    finally:
        close_journal(journal)


async def _run(
    prof: SandboxProfile | ReadProfile,
    name: str,
    explicit: bool,
    specs: list[MountSpec],
    command: list[str],
    captures: list[str],
    capture_dir: Path | None,
    journal: Any,
    timeout: float,
    credential: Credential | None,
    allow: list[str],
    *,
    env: dict[str, str],
    workdir: str | None,
    interactive: bool,
    tty: tuple[int, int] | None,
    quiet: bool,
    summary: dict[str, Any],
    db: str | None = None,
    profile_name: str = "",
    pool: bool = False,
    adapters: Path | None = None,
    image_name: str | None = None,
    ports: list[PortSpec] | None = None,
) -> int:
    observer = ConsoleObserver(quiet=quiet)
    got: list[int] = []
    # From the first phase on, SIGINT and SIGTERM stop the Run wherever it is (``checkfu.cli.interrupts``).
    with signals_cancel(got):
        try:
            # Mounts are read, bounded and hashed before any provider is asked anything (describe included).
            t0 = time.perf_counter()
            resolved = await resolve_mounts(specs, observer)
            resolve_seconds = time.perf_counter() - t0
            observer.phase("resolve", resolve_seconds)
            service = service_of(journal, db, adapters)
            registry = await load_adapters(service, name, credential, observer)
            if isinstance(prof, ReadProfile):  # a provider service: the provider it serves decides who pins a tag
                (adapter,) = registry.adapters
                target = adapter.target
                prof = _allowing(pin_image(prof, adapter.envelope.provider, quiet), allow)
            else:
                target = choose(registry, name, explicit)
            interact = None
            if interactive or tty is not None:

                async def interact(proc: Any) -> None:
                    terminal = _terminal()
                    with terminal.raw_mode(tty is not None and interactive and terminal.stdin_is_terminal()):
                        observer.raw = tty is not None and interactive
                        try:
                            await terminal.feed(proc, stdin=interactive, resize=tty is not None)
                        finally:
                            observer.raw = False

            result = await service.run(
                registry,
                target,
                prof,
                command,
                mounts=specs,
                captures=captures,
                capture_dir=capture_dir,
                observer=observer,
                timeout=timeout,
                env=env,
                cwd=workdir,
                interact=interact,
                tty=tty,
                resolved=resolved,
                pool=pool,
                ports=ports or [],
                noted={"profile_source": profile_name} if profile_name else None,
            )
            result.phases = {"resolve": resolve_seconds, **result.phases}
        except asyncio.CancelledError:
            return _interrupted(got, observer.attempt, db, summary)
        except (SandboxError, JournalError):
            _report_left(observer.attempt, db, "[bold red]failed[/]")
            summary.update(_left_of(observer.attempt))
            raise
        finally:
            if observer.attempt is not None and observer.attempt.session.adopted is not None:
                refill_in_background(db)
    chosen = registry.select(target)
    grade = assess(chosen.envelope, in_tree=chosen.in_tree)  # graded as the grade card grades it
    label = grade.label
    if grade.short_of_next:
        label += f" (short of the next tier: {'; '.join(grade.short_of_next)})"
    allowed = tuple(prof.network_policy.allowlist) if allow else ()
    summary.update(
        ok=True,
        run_id=result.run_id,
        exit_code=result.exit_code,
        adapter=result.adapter,
        grade=label,
        profile=profile_name,
        phases_ms={k: round(v * 1000, 1) for k, v in result.phases.items()},
        staged_bytes=result.staged_bytes,
        writable=list(result.writable),
        env=sorted(env),
        workdir=workdir,
        captured=result.captured,
        capture_dir=str(result.capture_dir) if result.capture_dir is not None else None,
        not_enforced=list(result.not_enforced),
        allowed=list(allowed),
        resolved_profile=resolved_profile(prof, timeout, image_name),
        staged_top_level={m.plan.target: top_level_sizes(m.plan) for m in resolved},
    )
    if result.synced:
        summary["synced"] = result.synced
    if pool:
        summary["adopted"] = result.adopted
    if ports:
        summary["ports"] = [p.to_json() for p in result.ports]
    if not quiet:
        _summary(
            result, label, allowed, profile_name, env, workdir, summary["resolved_profile"], summary["staged_top_level"]
        )
    if _report_left(observer.attempt, db, f"[bold red]the command exited {result.exit_code:d}, but[/]"):
        summary.update(ok=False, exit_code=LEFT_BEHIND_EXIT, **_left_of(observer.attempt))
        return LEFT_BEHIND_EXIT
    if result.unjournaled:
        summary["unjournaled"] = dict(result.unjournaled)
    return result.exit_code


TOP_LEVEL_SHOWN = 8
"""Top-level entries of a mount the summary names, largest first (``--json`` has them all)."""


def _summary(
    result: JobResult,
    attempt_label: str,
    allowed: tuple[str, ...],
    profile_name: str,
    env: dict[str, str],
    workdir: str | None,
    resolved: dict[str, Any] | None = None,
    top_level: dict[str, dict[str, int]] | None = None,
) -> None:
    err.print()
    err.print(f"[bold]run[/]        {escape(result.run_id)}")
    err.print(f"[bold]adapter[/]    {escape(result.adapter)} — grade: {escape(attempt_label)}")
    if profile_name:
        err.print(f"[bold]profile[/]    {escape(profile_name)}")
    if resolved is not None:
        err.print(f"[bold]resolved[/]   {escape(resolved_text(resolved))}")
    err.print("[bold]phases[/]     " + ", ".join(f"{escape(k)} {v * 1000:.0f} ms" for k, v in result.phases.items()))
    if result.staged_bytes:
        err.print(f"[bold]staged[/]     {escape(human_bytes(result.staged_bytes))}")
    for target, sizes in (top_level or {}).items():  # how much each top-level entry staged: nothing left out silently
        shown = [f"{name} {human_bytes(size)}" for name, size in list(sizes.items())[:TOP_LEVEL_SHOWN]]
        more = len(sizes) - TOP_LEVEL_SHOWN
        err.print(f"[bold]  {escape(target)}[/] " + escape(", ".join(shown) + (f", {more:d} more" if more > 0 else "")))
    if env:
        err.print("[bold]env[/]        " + escape(", ".join(sorted(env))) + " [dim](names only)[/]")
    if workdir:
        err.print(f"[bold]workdir[/]    {escape(workdir)}")
    if allowed:
        err.print("[bold]allowed[/]  " + escape(", ".join(allowed)))
    for p in result.ports:
        err.print(f"[bold]port[/]       {escape(p.url)} -> sandbox port {p.port:d} (closed with the sandbox)")
    colour = "green" if result.exit_code == 0 else "red"
    err.print(f"[bold]exit[/]       [{colour}]{result.exit_code:d}[/]")
    if result.capture_dir is not None:
        err.print(f"[bold]captured[/]   {len(result.captured):d} files into {escape(str(result.capture_dir))}")
    if result.writable:
        err.print("[bold]writable[/]   " + escape(", ".join(result.writable)) + " (:rw, not sealed)")
    for synced in result.synced:  # :rw,sync: what came back into SRC (deletions never propagate)
        err.print(
            f"[bold]synced[/]     {escape(synced['target'])} → {escape(synced['source'])}: "
            f"{synced['added']:d} added, {synced['changed']:d} changed, {synced['removed']:d} removed in the "
            f"sandbox (kept in SRC), {len(synced['refused']):d} refused"
        )
        kept = synced.get("paths", {}).get("conflicts", [])
        for path in kept[:10]:  # the user's own edit made during the Run wins; say which, so neither is lost unseen
            err.print(
                f"[bold yellow]kept[/]       {escape(path)}: it changed in {escape(synced['source'])} while the Run "
                "went on; the sandbox's copy was not written back"
            )
        if len(kept) > 10:
            err.print(f"[bold yellow]kept[/]       and {len(kept) - 10:d} more (--json: synced[].paths.conflicts)")
    if result.not_enforced:
        err.print("[bold yellow]not enforced[/] " + escape(", ".join(result.not_enforced)))
    else:
        err.print("[bold]enforced[/]   all nine axes")


LEFT_BEHIND_EXIT = EXIT_REFUSED
"""The exit status of a Run that finished but left something of its sandbox behind (see ``_report_left``): a
sandbox failure around the command, so checkfu's own 125, never a status the command could have had."""


def _interrupted(got: list[int], attempt: Attempt | None, db: str | None, summary: dict[str, Any]) -> int:
    """Say how the Run was interrupted and, truthfully, what is left of it; returns 128 + the signal."""
    signum = got[0] if got else signal.SIGINT
    name = signal.Signals(signum).name
    said = f"[bold red]interrupted[/] by {escape(name)}"
    if not _report_left(attempt, db, said):
        err.print(f"{said}: {escape(_nothing_left(attempt, db))}")
    summary.update(ok=False, exit_code=128 + signum, interrupted=name)
    summary.update(_left_of(attempt))
    return 128 + signum


def _nothing_left(attempt: Attempt | None, db: str | None) -> str:
    """What may be said (plain text, escaped where it is printed) of a Run wound up with nothing ``left``: that
    nothing is left behind only when nothing was allocated, or the provider's own list (``listAllocations``)
    showed nothing of the Run after its wind-up."""
    if attempt is None:
        return "nothing was allocated; nothing is left behind"
    session = attempt.session
    if session.confirmed:
        return "released and compensated; nothing is left behind"
    finish = "checkfu runner reconcile" + (f" --db {shlex.quote(db)}" if db else "")
    why = session.unconfirmed or "the provider was not asked what it still holds"
    return (
        f"released and compensated every allocation, but {why}, so nothing confirms that none is left; "
        f"`{finish}` reclaims whatever is"
    )


def _left_of(attempt: Attempt | None) -> dict[str, Any]:
    """For the ``--json`` summary: ``left``, what of the Run is still held or, by the provider's own word, survived
    its release (by allocation key, with why); nothing when there is none."""
    if attempt is None:
        return {}
    left = {**attempt.session.left, **attempt.session.undestroyed}
    return {"left": left} if left else {}


def _report_left(attempt: Attempt | None, db: str | None, said: str) -> bool:
    """Say what of the Run is still held (never claim it was released) and how to finish, and what a release said
    it kept against the envelope's promise; returns whether there is either. Also say what the journal could not
    record (that needs no action: reconciliation settles it)."""
    if attempt is None:
        return False
    session = attempt.session
    finish = "checkfu runner reconcile" + (f" --db {shlex.quote(db)}" if db else "")
    if session.undestroyed:
        err.print(
            f"{said}: the release of {len(session.undestroyed):d} sandbox(es) of {escape(session.run_id)} answered "
            "destroyed: false, against the envelope's promise; by the provider's own word something of each "
            "survived its release:"
        )
        for key, why in session.undestroyed.items():
            err.print(f"  {escape(key)}: {escape(why[:300])}")
        err.print(
            "[bold yellow]warning[/]: each was compensated by its key since, but only the provider says what that "
            f"reclaimed; report it to the provider's author (`checkfu runs show {escape(session.run_id)}` lists "
            "every call)"
        )
    if session.unjournaled:
        err.print(
            "[bold yellow]warning[/]: the journal could not record everything (it was locked or unreachable); "
            f"`{escape(finish)}` settles its rows once it answers:"
        )
        for what, why in session.unjournaled.items():
            err.print(f"  {escape(what)}: {escape(why[:300])}")
    if not session.left:
        return bool(session.undestroyed)
    err.print(
        f"{said}: {len(session.left):d} allocation(s) of {escape(session.run_id)} could not be released "
        "and are left behind:"
    )
    for key, why in session.left.items():
        err.print(f"  {escape(key)}: {escape(why[:300])}")
    err.print(
        f"to finish: once {escape(str(session.target))} answers again (for Docker, once the engine is up), "
        f"run `{escape(finish)}`; it releases them by their keys"
    )
    return True


@runs_app.command("list")
def runs_list(
    db: DbOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="how many Runs, newest first")] = 20,
) -> None:
    """The most recent Runs."""
    journal = open_journal(db)
    rows = journal.list_runs(limit)
    journal.close()
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "run_id": r.run_id,
                        "status": run_status(r),
                        "exit_code": r.exit_code,
                        "adapter": str(r.target) if r.target else None,
                        "created_at": r.created_at,
                        "finished_at": r.finished_at,
                        "command": r.command,
                        "owner": r.owner,
                        "reaped": r.status == ORPHANED,
                    }
                    for r in rows
                ]
            )
        )
        return
    from rich.table import Table  # noqa: PLC0415

    table = Table("run", "status", "exit", "adapter", "command")
    for r in rows:  # everything recorded is data, never markup: each cell is plain Text
        status = run_status(r)
        table.add_row(
            Text(r.run_id),
            Text(
                "orphaned (reaped)"
                if r.status == ORPHANED
                else "orphaned (not yet reclaimed)"
                if status != r.status
                else status
            ),
            Text("" if r.exit_code is None else str(r.exit_code)),
            Text(str(r.target) if r.target else "(not yet selected)"),
            Text(shlex.join(r.command or [])),
        )
    Console().print(table)


@runs_app.command("show")
def runs_show(
    run: Annotated[str, typer.Argument(help="a run id or a unique prefix (or a sandbox id: its Run)")],
    db: DbOpt = None,
    as_json: JsonOpt = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="write the Run's story as one self-contained HTML page to FILE (adapter and grade, the nine axes, "
            "staged files and digests, member calls, kept output)",
            show_default=False,
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """One Run: each member call with its duration and outcome, its profile, network allowlist and timeout (and
    whether it timed out). A sandbox id shows the sandbox's Run."""
    from checkfu.cli.logs import find_run, history_lines, history_of, sandbox_of  # noqa: PLC0415 - logs imports this

    journal = open_journal(db)
    try:
        r = find_run(journal, run, as_json=as_json)
        sandbox = sandbox_of(journal, r)
        events = journal.events_for_run(r.run_id)
        allocs = journal.allocations_for_run(r.run_id)
        chunks = _all_output(journal, r.run_id) if html is not None else []
    finally:
        journal.close()
    if html is not None:
        _write_page(html, r, events, allocs, chunks)
    if as_json:
        print(
            json.dumps(
                {
                    "run_id": r.run_id,
                    "status": run_status(r),
                    "owner": r.owner,
                    "reaped": r.status == ORPHANED,
                    "story": r.story,
                    "exit_code": r.exit_code,
                    "adapter": str(r.target) if r.target else None,
                    "profile_digest": r.profile_digest,
                    "command": r.command,
                    **history_of(r, sandbox),
                    "summary": r.summary,
                    "events": [
                        {
                            "member": e.member,
                            "allocation_key": e.allocation_key,
                            "started_at": e.started_at,
                            "duration_ms": e.duration_ms,
                            "outcome": e.outcome,
                            "error_code": e.error_code,
                            "detail": e.detail,
                        }
                        for e in events
                    ],
                    "allocations": [
                        {"allocation_key": a.allocation_key, "kind": a.kind, "state": a.state} for a in allocs
                    ],
                }
            )
        )
        return
    if html is not None:
        return
    out = Console(highlight=False)
    # Everything recorded is data, never markup (an argv of '[/]', an adapter named '[local]'): plain Text only.
    out.print(Text(f"run {r.run_id}  {run_status(r)}  exit {r.exit_code}  {r.target}"))
    if r.command is not None or sandbox is None:
        out.print(Text(f"command {shlex.join(r.command or [])}"))
    for line in history_lines(r, sandbox):
        out.print(Text(line))
    if r.owner:
        out.print(Text(f"owner {describe_owner(r.owner)}"))
    reason = (r.summary or {}).get("reason")
    if reason:
        out.print(Text(f"settled {(r.summary or {}).get('settled_by', '')}: {reason}"))
    elif run_status(r) != r.status:
        out.print(Text("orphaned: its owner process is gone; the next checkfu command reclaims what it holds"))
    from rich.table import Table  # noqa: PLC0415

    table = Table("member", "duration", "outcome", "allocation", "detail")
    for e in events:
        table.add_row(
            Text(e.member),
            Text(f"{e.duration_ms:.1f} ms"),
            Text(e.error_code or e.outcome),
            Text(e.allocation_key or ""),
            Text((e.detail or "")[:80]),
        )
    out.print(table)
    for a in allocs:
        out.print(Text(f"allocation {a.allocation_key} {a.kind} {a.state}"))


def _all_output(journal: Any, run_id: str) -> list[Any]:
    chunks: list[Any] = []
    while True:
        got = journal.output_since(run_id, chunks[-1].id if chunks else 0)
        if not got:
            return chunks
        chunks.extend(got)


def _write_page(path: Path, r: Any, events: Any, allocs: Any, chunks: Any) -> None:
    """Write the Run's page to ``path`` (``-``: stdout); a file it makes is ``0600``, the user's alone, as the
    journal the page is read from is.

    Raises:
        typer.Exit: it cannot be written (said on stderr, exit 1).
    """
    from checkfu.cli.logs import truncation_note  # noqa: PLC0415
    from checkfu.cli.outputs import is_dash, write_named  # noqa: PLC0415
    from checkfu.cli.page import render  # noqa: PLC0415

    page = render(r, events, allocs, chunks, truncation_note(r))
    try:  # it holds the Run's argv and output: made 0600 (a file that exists keeps its mode)
        write_named(path, page, private=True)
    except OSError as exc:
        err.print(f"[bold red]cannot write --html {escape(str(path))}[/]: {escape(exc.strerror or str(exc))}")
        raise typer.Exit(1) from None
    if not is_dash(path):
        err.print(f"wrote {escape(str(path))} ({escape(human_bytes(len(page.encode())))})")


@runner_app.command("reconcile")
def runner_reconcile(
    db: DbOpt = None,
    provider: Annotated[list[str] | None, typer.Option("--provider")] = None,
    as_json: JsonOpt = False,
    engine: EngineOpt = None,
    engine_certs: EngineCertsOpt = None,
    adapters: AdaptersOpt = None,
) -> None:
    """Compensate every unsettled allocation whose lease expired or whose owner is gone, and settle its Run.

    Exits 1 when anything is left (a compensation failed, a provider could not be reached, or the journal
    holds a gone runner's allocations under another runner tag): what is left and how to finish are listed.
    An adapters file that makes two adapters advertise one target is refused (SandboxAdapterAmbiguous)
    before anything is compensated: which one reclaims an allocation would be a guess.
    """
    sites = engine_sites(engine, engine_certs)
    service = open_service(db, reap=False, adapters=adapters)  # this pass reaps orphans itself, and counts them
    try:
        report = asyncio.run(service.reconcile(provider, sites=sites))
    finally:
        service.close()
    if as_json:
        print(
            json.dumps(
                {
                    "compensated": report.compensated,
                    "enumerated": report.enumerated,
                    "failed": report.failed,
                    "skipped": report.skipped,
                    "unaccounted": report.unaccounted,
                    "settled_runs": report.settled_runs,
                    "unsettled_runs": report.unsettled_runs,
                    "other_tags": report.other_tags,
                }
            )
        )
    else:
        err.print(
            f"compensated {len(report.compensated):d}, strays {len(report.enumerated):d}, "
            f"runs settled {len(report.settled_runs):d}; left: failed {len(report.failed):d}, "
            f"not reached {len(report.skipped):d}"
        )
        for key, why in report.left.items():
            err.print(f"  left {escape(key)}: {escape(why)}")
        if report.unaccounted:
            err.print(
                f"{len(report.unaccounted):d} held under this runner's tag are not in this journal and were left "
                f"alone (another journal's: reconcile with its --db): {escape(', '.join(report.unaccounted[:10]))}"
            )
        if report.left:
            finish = "checkfu runner reconcile" + (f" --db {shlex.quote(db)}" if db else "")
            err.print(
                f"[bold red]not finished[/]: {len(report.left):d} allocation(s) are still held; once their provider "
                f"answers again (for Docker, once the engine is up), run `{escape(finish)}` again"
            )
        for tag, count in sorted(report.other_tags.items()):
            finish = f"CHECKFU_RUNNER_TAG={shlex.quote(tag)} checkfu runner reconcile" + (
                f" --db {shlex.quote(db)}" if db else ""
            )
            err.print(
                f"[bold red]not taken[/]: {count:d} allocation(s) in this journal were recorded under runner tag "
                f"{escape(tag)}, not this one ({escape(runner_tag(db))}: another state directory, or --db spelled "
                f"another way), and their runner is gone; to finish them, run `{escape(finish)}`"
            )
    if report.left or report.other_tags:
        raise typer.Exit(1)
