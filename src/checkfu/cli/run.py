"""``checkfu run``, ``checkfu runs`` and ``checkfu runner reconcile``."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import DownloadColumn, Progress, TaskID
from rich.table import Table
from rich.text import Text

from checkfu.cli.engines import EngineCertsOpt, EngineOpt, engine_sites
from checkfu.cli.files import load, read_document
from checkfu.cli.state import client_credential, enrolled_credential, is_url, open_journal, runner_tag
from checkfu.contract.codec import decode_value
from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxError
from checkfu.contract.profile import DESTINATION_PATTERN, NetworkPolicy, SandboxProfile
from checkfu.contract.tiers import assess
from checkfu.runner.clock import SystemClock
from checkfu.runner.job import JobResult, run_job
from checkfu.runner.journal import JournalError
from checkfu.runner.mounts import MountSpec, parse_mount
from checkfu.runner.reconcile import reconcile
from checkfu.runner.registry import ENTRY_POINT_GROUP, Registry, adapter_from_factory, load_registry
from checkfu.runner.runner import Attempt, Runner
from checkfu.wire.client import RemoteProvider
from checkfu.wire.credentials import Credential

err = Console(stderr=True, highlight=False, soft_wrap=True)

runs_app = typer.Typer(help="The history of Runs, from the journal.", no_args_is_help=True)
runner_app = typer.Typer(help="Runner maintenance.", no_args_is_help=True)

CredentialOpt = Annotated[
    Path | None,
    typer.Option(
        "--credential-file",
        help="file holding the provider service's credential (default: $CHECKFU_PROVIDER_CREDENTIAL)",
    ),
]
DbOpt = Annotated[str | None, typer.Option("--db", help="journal URL (default: SQLite in the state directory)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


class ConsoleObserver:
    """Renders a Run for a person: phases as they finish, live output, staging progress."""

    def __init__(self) -> None:
        self.staging: Progress | None = None
        self.task: TaskID | None = None
        self.attempt: Attempt | None = None

    async def before(self, name: str) -> None:
        pass

    def phase(self, name: str, seconds: float) -> None:
        err.print(f"[dim]• {escape(name):<11} {seconds * 1000:8.1f} ms[/]")

    def warning(self, text: str) -> None:
        err.print(f"[bold yellow]warning[/]: {escape(text)}")

    def selected(self, attempt: Attempt) -> None:
        self.attempt = attempt
        a = assess(attempt.adapter.envelope)
        err.print(f"[dim]• adapter     {escape(str(attempt.adapter.target))} — grade: {escape(a.label)}[/]")

    def build_line(self, line: str) -> None:
        err.print(f"[dim]  build: {escape(line.rstrip())}[/]")

    def stage_progress(self, done: int, total: int) -> None:
        if self.staging is None:
            self.staging = Progress(
                *Progress.get_default_columns(),
                DownloadColumn(),
                console=err,
                transient=True,
                disable=not err.is_terminal,
            )
            self.task = self.staging.add_task("staging mounts", total=total)
            self.staging.start()
        assert self.task is not None
        self.staging.update(self.task, completed=done)
        if done >= total:
            self.staging.stop()
            self.staging = None
            err.print(f"[dim]  staged {total:d} bytes[/]")

    def output(self, stream: str, data: bytes) -> None:
        target = sys.stdout if stream == "out" else sys.stderr
        target.buffer.write(data)
        target.flush()


ENGINE_DOWN = (
    "Either start a Docker Engine (scripts/engine-up does it as root), or run on the host with "
    "--provider host-process --profile examples/profiles/host.toml, which enforces no isolation and says so."
)


def _pin_image(profile: dict[str, Any], provider: str) -> None:
    """Pin an unpinned ``base_image`` tag to the engine's image id (admission owns the digest).

    Pinning is the Docker provider's to do; other providers take the profile as written.

    Raises:
        SandboxAdapterUnavailable: no Docker Engine answers (the profile may well be fine).
        SandboxProfileInvalid: the engine has no image of that tag.
    """
    ref = profile.get("base_image")
    if not isinstance(ref, str) or ref == "host" or "sha256:" in ref or provider != "docker":
        return
    from checkfu.providers.docker import pin_base_image  # noqa: PLC0415 - only the Docker tier pins

    try:
        image_id = pin_base_image(ref)
    except SandboxAdapterUnavailable as exc:
        raise SandboxAdapterUnavailable(f"{exc.message}. {ENGINE_DOWN}", field="provider") from None
    err.print(f"[dim]• pinned      {escape(ref)} → {escape(image_id)}[/]")
    profile["base_image"] = image_id


def _read_profile(path: Path, provider: str) -> SandboxProfile:
    if path.suffix.lower() != ".toml":
        return load(SandboxProfile, path)
    doc = read_document(SandboxProfile, path)  # bounded: size, regular file, nesting
    _pin_image(doc, provider)
    return decode_value(SandboxProfile, doc)


def _choose(registry: Registry, provider: str, explicit: bool) -> Any:
    found = registry.by_provider(provider)
    if len(found) == 1:
        return found[0].target
    if not found:
        why = "; ".join(f"{k}: {v}" for k, v in registry.unavailable.items())
        if not explicit and provider == "docker":
            raise SandboxAdapterUnavailable(
                "the Docker tier is not available" + (f" ({why})" if why else "") + f". {ENGINE_DOWN}",
                field="provider",
            )
        raise SandboxAdapterUnavailable(
            f"no adapter for provider {provider!r}" + (f" ({why})" if why else ""), field="provider"
        )
    raise SandboxAdapterUnavailable(
        f"{len(found)} adapters of provider {provider!r}; name one exactly", field="provider"
    )


def _allowing(prof: SandboxProfile, allow: list[str]) -> SandboxProfile:
    """``prof`` with its network an allowlist of exactly ``allow`` (``HOST:PORT`` each), when any is given.

    Raises:
        typer.BadParameter: a destination is not ``HOST:PORT`` (a usage error naming ``--allow``, exit 2).
    """
    if not allow:
        return prof
    for value in allow:
        if not re.fullmatch(DESTINATION_PATTERN, value):
            raise typer.BadParameter(
                f"{value[:80]!r} is not HOST:PORT (a lowercase DNS name, an IPv4 address or a bracketed IPv6 "
                "address, then a port 1..65535)",
                param_hint="--allow",
            )
    policy = decode_value(NetworkPolicy, {"mode": "allowlist", "allowlist": list(dict.fromkeys(allow))})
    return prof.model_copy(update={"network_policy": policy})


def _summary(result: JobResult, attempt_label: str, allowed: tuple[str, ...] = ()) -> None:
    err.print()
    err.print(f"[bold]run[/]        {escape(result.run_id)}")
    err.print(f"[bold]adapter[/]    {escape(result.adapter)} — grade: {escape(attempt_label)}")
    err.print("[bold]phases[/]     " + ", ".join(f"{escape(k)} {v * 1000:.0f} ms" for k, v in result.phases.items()))
    if allowed:
        err.print("[bold]allowed[/]  " + escape(", ".join(allowed)))
    colour = "green" if result.exit_code == 0 else "red"
    err.print(f"[bold]exit[/]       [{colour}]{result.exit_code:d}[/]")
    if result.captured:
        err.print("[bold]captured[/]   " + escape(", ".join(result.captured)))
    if result.not_enforced:
        err.print("[bold yellow]not enforced[/] " + escape(", ".join(result.not_enforced)))
    else:
        err.print("[bold]enforced[/]   all nine axes")


@dataclass(frozen=True)
class CheckedRun:
    """``checkfu run``'s options, checked before any work (``checkfu submit`` takes and checks the same)."""

    name: str
    remote: bool
    credential: Credential | None
    specs: list[MountSpec]
    profile: SandboxProfile | Path
    """A provider service's profile stays a path: it is read once the service's envelope says who pins."""


def check_run_options(
    *,
    profile: Path,
    mount: list[str] | None,
    provider: str | None,
    capture: list[str] | None,
    capture_dir: Path | None,
    timeout: float,
    credential_file: Path | None,
    allow: list[str] | None,
) -> CheckedRun:
    """Every check of ``checkfu run``'s options that needs no journal and no provider.

    Raises:
        SandboxAdapterUnavailable: no installed provider of that name.
        SandboxError: a mount or the profile is refused.
        typer.BadParameter: a usage error naming the option.
    """
    name = provider or "docker"
    remote = is_url(name)
    if not remote:
        installed = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        if name not in installed:
            raise SandboxAdapterUnavailable(
                f"no provider named {name!r} (installed: {', '.join(installed) or 'none'})", field="provider"
            )
    credential = client_credential(credential_file) if remote else None
    specs: list[MountSpec] = [parse_mount(m) for m in (mount or [])]
    if not timeout > 0:  # also refuses nan
        raise typer.BadParameter(f"must be a positive number of seconds, not {timeout}", param_hint="--timeout")
    if capture and capture_dir is not None and capture_dir.exists() and not capture_dir.is_dir():
        raise typer.BadParameter(f"{capture_dir} exists and is not a directory", param_hint="--capture-dir")
    prof = profile if remote else _allowing(_read_profile(profile, name), allow or [])
    return CheckedRun(name=name, remote=remote, credential=credential, specs=specs, profile=prof)


def run_command(
    command: Annotated[list[str], typer.Argument(help="the command to run inside the sandbox, after --")],
    profile: Annotated[Path, typer.Option("--profile", help="a SandboxProfile (TOML or JSON)")],
    mount: Annotated[list[str] | None, typer.Option("--mount", help="SRC:TARGET; SRC a directory or REPO@REF")] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="provider name, or a provider service's URL (default: docker)")
    ] = None,
    capture: Annotated[list[str] | None, typer.Option("--capture", help="a sandbox path to read back")] = None,
    capture_dir: Annotated[Path | None, typer.Option("--capture-dir", help="where captures go")] = None,
    db: DbOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds the command may run")] = 3600.0,
    credential_file: CredentialOpt = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow", help="HOST:PORT the sandbox may reach (repeatable): the profile's network becomes this allowlist"
        ),
    ] = None,
) -> None:
    """Run one command in a fresh sandbox built from a profile, with mounts staged by the runner."""
    checked = check_run_options(
        profile=profile,
        mount=mount,
        provider=provider,
        capture=capture,
        capture_dir=capture_dir,
        timeout=timeout,
        credential_file=credential_file,
        allow=allow,
    )
    name, remote, credential, specs, prof = (
        checked.name,
        checked.remote,
        checked.credential,
        checked.specs,
        checked.profile,
    )
    journal = open_journal(db)
    if remote and credential is None:
        credential = enrolled_credential(journal, name)
    try:
        code = asyncio.run(
            _run(
                prof,
                name,
                provider is not None,
                specs,
                command,
                capture or [],
                capture_dir,
                journal,
                timeout,
                credential,
                allow or [],
                db,
            )
        )
    finally:
        journal.close()
    raise typer.Exit(code)


async def _registry(name: str, credential: Credential | None, observer: ConsoleObserver, journal: Any) -> Registry:
    """The adapters to choose from: the named installed provider, or the provider service at a URL."""
    if is_url(name):
        registry = Registry()
        registry.add(await adapter_from_factory(lambda: RemoteProvider(name, credential), name, {}, recorder=journal))
        return registry
    options = {"docker": {"progress": observer.build_line}}  # the Docker tier reports each line of a build
    return await load_registry(entry_point_names=[name], options=options, recorder=journal)


async def _run(
    prof: SandboxProfile | Path,
    name: str,
    explicit: bool,
    specs: list[MountSpec],
    command: list[str],
    captures: list[str],
    capture_dir: Path | None,
    journal: Any,
    timeout: float,
    credential: Credential | None = None,
    allow: list[str] | None = None,
    db: str | None = None,
) -> int:
    observer = ConsoleObserver()
    registry = await _registry(name, credential, observer, journal)
    if isinstance(prof, Path):  # a provider service: the provider it serves decides who pins a tag
        (adapter,) = registry.adapters
        target = adapter.target
        prof = _allowing(_read_profile(prof, adapter.envelope.provider), allow or [])
    else:
        target = _choose(registry, name, explicit)
    runner = Runner(registry, journal, runner_tag=runner_tag(db))
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    got: list[int] = []

    def on_signal(signum: int) -> None:
        got.append(signum)
        if task is not None:
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        result = await run_job(
            runner,
            target,
            prof,
            command,
            mounts=specs,
            captures=captures,
            capture_dir=capture_dir,
            observer=observer,
            timeout=timeout,
        )
    except asyncio.CancelledError:
        signum = got[0] if got else signal.SIGINT
        said = f"[bold red]interrupted[/] by {escape(signal.Signals(signum).name)}"
        if not _report_left(observer.attempt, db, said):
            err.print(f"{said}: released and compensated; nothing is left behind")
        return 128 + signum
    except (SandboxError, JournalError):
        _report_left(observer.attempt, db, "[bold red]failed[/]")
        raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    grade = assess(registry.select(target).envelope)
    label = grade.label
    if grade.short_of_next:
        label += f" (short of the next tier: {'; '.join(grade.short_of_next)})"
    allowed = tuple(prof.network_policy.allowlist) if allow else ()
    _summary(result, label, allowed)
    if _report_left(observer.attempt, db, f"[bold red]the command exited {result.exit_code:d}, but[/]"):
        return LEFT_BEHIND_EXIT
    return result.exit_code


LEFT_BEHIND_EXIT = 1
"""The exit status of a Run that finished but left something of its sandbox behind (see ``_report_left``)."""


def _report_left(attempt: Attempt | None, db: str | None, said: str) -> bool:
    """Say what of the Run is still held (never claim it was released) and how to finish; returns whether
    anything is. Also say what the journal could not record (that needs no action: reconciliation settles it)."""
    if attempt is None:
        return False
    session = attempt.session
    finish = "checkfu runner reconcile" + (f" --db {shlex.quote(db)}" if db else "")
    if session.unjournaled:
        err.print(
            "[bold yellow]warning[/]: the journal could not record everything (it was locked or unreachable); "
            f"`{escape(finish)}` settles its rows once it answers:"
        )
        for what, why in session.unjournaled.items():
            err.print(f"  {escape(what)}: {escape(why[:300])}")
    if not session.left:
        return False
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
                        "status": r.status,
                        "exit_code": r.exit_code,
                        "adapter": str(r.target) if r.target else None,
                        "created_at": r.created_at,
                        "finished_at": r.finished_at,
                        "command": r.command,
                    }
                    for r in rows
                ]
            )
        )
        return
    table = Table("run", "status", "exit", "adapter", "command")
    for r in rows:  # everything recorded is data, never markup: each cell is plain Text
        table.add_row(
            Text(r.run_id),
            Text(r.status),
            Text("" if r.exit_code is None else str(r.exit_code)),
            Text(str(r.target) if r.target else "(not yet selected)"),
            Text(shlex.join(r.command or [])),
        )
    Console().print(table)


@runs_app.command("show")
def runs_show(
    run: Annotated[str, typer.Argument(help="a run id or a unique prefix")], db: DbOpt = None, as_json: JsonOpt = False
) -> None:
    """One Run: each member call with its duration and outcome."""
    journal = open_journal(db)
    try:
        found = journal.find_runs(run)
        if len(found) != 1:
            err.print(
                f"[bold red]SandboxNotFound[/]: {'no' if not found else len(found)} runs match {escape(repr(run))}"
            )
            raise typer.Exit(1)
        r = found[0]
        events = journal.events_for_run(r.run_id)
        allocs = journal.allocations_for_run(r.run_id)
    finally:
        journal.close()
    if as_json:
        print(
            json.dumps(
                {
                    "run_id": r.run_id,
                    "status": r.status,
                    "exit_code": r.exit_code,
                    "adapter": str(r.target) if r.target else None,
                    "profile_digest": r.profile_digest,
                    "command": r.command,
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
    out = Console(highlight=False)
    # Everything recorded is data, never markup (an argv of '[/]', an adapter named '[local]'): plain Text only.
    out.print(Text(f"run {r.run_id}  {r.status}  exit {r.exit_code}  {r.target}"))
    out.print(Text(f"command {shlex.join(r.command or [])}"))
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


@runner_app.command("reconcile")
def runner_reconcile(
    db: DbOpt = None,
    provider: Annotated[list[str] | None, typer.Option("--provider")] = None,
    as_json: JsonOpt = False,
    engine: EngineOpt = None,
    engine_certs: EngineCertsOpt = None,
) -> None:
    """Compensate every unsettled allocation whose lease expired or whose owner is gone, and settle its Run.

    Exits 1 when anything is left (a compensation failed, or a provider could not be reached): what is
    left and how to finish are listed.
    """
    sites = engine_sites(engine, engine_certs)
    journal = open_journal(db)
    try:
        registry = asyncio.run(load_registry(entry_point_names=provider, recorder=journal, sites=sites))
        report = asyncio.run(reconcile(journal, registry, SystemClock(), runner_tag=runner_tag(db)))
    finally:
        journal.close()
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
    if report.left:
        raise typer.Exit(1)
