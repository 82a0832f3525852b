"""What the commands that start sandboxes share: their options, the console they report on, how they pin a
profile's image, choose an adapter and report a refusal (``checkfu run``, ``submit``, ``pool``, ``images``,
``logs``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from checkfu.cli.consoles import console
from checkfu.cli.state import is_url
from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxError, SandboxProfileInvalid
from checkfu.contract.ports import PublishedPort
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.tiers import assess
from checkfu.core.profiles import Overrides, ReadProfile, describe_resolved, parse_network, pinned

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from checkfu.core.registry import Registry
    from checkfu.core.runner import Attempt
    from checkfu.runner import RunnerService
    from checkfu.wire.credentials import Credential

err = console(stderr=True, highlight=False, soft_wrap=True)


CredentialOpt = Annotated[
    Path | None,
    typer.Option(
        "--credential-file",
        help="file holding the provider service's credential, or - for the first line of stdin "
        "(default: $CHECKFU_PROVIDER_CREDENTIAL)",
        show_default=False,
        metavar="FILE",
    ),
]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="journal URL (default: SQLite in the state directory)", show_default=False, metavar="URL"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]
AdaptersOpt = Annotated[
    Path | None,
    typer.Option(
        "--adapters",
        help="an adapters file (TOML: [[adapters]] tables of factory = ENTRY-POINT or MODULE:CALLABLE, and options) "
        "loaded besides the installed providers (default: $CHECKFU_ADAPTERS); docs/adapters.md",
        show_default=False,
        metavar="FILE",
    ),
]

ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        help="leave files matching GLOB (gitignore syntax) out of every directory mount, as its "
        ".checkfuignore does (repeatable)",
        show_default=False,
        metavar="GLOB",
    ),
]
ImageOpt = Annotated[
    str | None,
    typer.Option(
        "--image",
        help="the base image in place of the profile's (a local tag, as docker names one, or a digest)",
        show_default=False,
        metavar="IMAGE",
    ),
]
MemoryOpt = Annotated[
    str | None,
    typer.Option("-m", "--memory", help="memory, as docker --memory: 512m, 1g (writable areas count)", metavar="SIZE"),
]
CpusOpt = Annotated[str | None, typer.Option("--cpus", help="CPU cores, as docker --cpus: 0.5, 1.5", metavar="N")]
PidsOpt = Annotated[
    int | None, typer.Option("--pids", "--pids-limit", help="most processes and threads at once", metavar="N")
]
DiskOpt = Annotated[
    str | None, typer.Option("--disk", help="writable disk, over every writable path: 256m, 1g", metavar="SIZE")
]
NetworkOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--network",
        help="none, or allow:HOST:PORT[,HOST:PORT] (repeatable; as --allow): the sandbox reaches those only",
        show_default=False,
        metavar="none|allow:HOST:PORT",
    ),
]
"""The docker-style flags over a profile (``checkfu run``, ``submit``, ``sandbox create``): each one wins over the
profile's own value; a profile may give any subset of the resource limits, the built-in default the rest."""


def overrides_of(
    image: str | None,
    memory: str | None,
    cpus: str | None,
    pids: int | None,
    disk: str | None,
    network: list[str] | None,
    allow: list[str],
) -> tuple[Overrides, list[str]]:
    """The flags as ``Overrides``, and the ``--allow`` list with ``--network allow:...`` folded in (one allowlist
    path, one summary line).

    Raises:
        SandboxProfileInvalid: ``--network`` names no network checkfu gives, or says none and an allowlist at once
            (``--allow`` included).
    """
    nets = tuple(network or ())
    policy = parse_network(nets) if nets else None
    if policy is not None and policy["mode"] == "none" and allow:
        raise SandboxProfileInvalid("--network: none and --allow contradict each other; give one", field="--network")
    allowed = [*list((policy or {}).get("allowlist", ())), *allow]
    given = Overrides(
        image=image,
        memory=memory,
        cpus=cpus,
        pids=pids,
        disk=disk,
        network=("none",) if policy is not None and policy["mode"] == "none" else (),
    )
    return given, list(dict.fromkeys(allowed))


def human_bytes(n: int) -> str:
    """A byte count as people read it: ``200.0 MiB`` (``512 B`` below a KiB)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    return f"{n} B"  # unreachable


class ConsoleObserver:
    """Renders a Run for a person: phases as they finish, live output, hashing and staging progress.

    ``quiet`` (``-q``) shows only the command's own output.
    """

    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet
        self.bars: dict[str, tuple[Progress, TaskID]] = {}
        self.raw = False
        """The caller's terminal is in raw mode (``-it``): lines need a carriage return."""
        self.attempt: Attempt | None = None

    async def before(self, name: str) -> None:
        pass

    def say(self, said: str) -> None:
        """Print ``said``: markup this code built, every value in it escaped (the static guard checks callers)."""
        if not self.quiet:
            err.print(said + ("\r" if self.raw else ""))

    def phase(self, name: str, seconds: float) -> None:
        self.say(f"[dim]• {escape(name):<11} {seconds * 1000:8.1f} ms[/]")

    def warning(self, text: str) -> None:
        self.say(f"[bold yellow]warning[/]: {escape(text)}")

    def published(self, port: PublishedPort) -> None:
        """Said even with ``-q``: the address is how the caller reaches the sandbox while the command runs."""
        err.print(f"published {escape(port.url)} -> sandbox port {port.port:d}" + ("\r" if self.raw else ""))

    def selected(self, attempt: Attempt) -> None:
        self.attempt = attempt
        a = assess(attempt.adapter.envelope, in_tree=attempt.adapter.in_tree)
        self.say(f"[dim]• adapter     {escape(str(attempt.adapter.target))} — grade: {escape(a.label)}[/]")

    def build_line(self, line: object) -> None:
        text = line if isinstance(line, str) else str(getattr(line, "line", None) or line)
        self.say(f"[dim]  build: {escape(text.rstrip())}[/]")

    def _progress(self, label: str, done: int, total: int, finished: str) -> None:
        if self.quiet:
            return
        bar = self.bars.get(label)
        if bar is None:
            from rich.progress import DownloadColumn, Progress  # noqa: PLC0415

            progress = Progress(
                *Progress.get_default_columns(),
                DownloadColumn(binary_units=True),
                console=err,
                transient=True,
                disable=not err.is_terminal,
            )
            bar = (progress, progress.add_task(escape(label), total=total))
            self.bars[label] = bar
            progress.start()
        progress, task = bar
        progress.update(task, completed=done, total=total)
        if done >= total:
            progress.stop()
            del self.bars[label]
            self.say(f"[dim]  {escape(finished)} {escape(human_bytes(total))}[/]")

    def hash_progress(self, done: int, total: int) -> None:
        self._progress("hashing mounts", done, total, "hashed")

    def stage_progress(self, done: int, total: int) -> None:
        self._progress("staging mounts", done, total, "staged")

    def output(self, stream: str, data: bytes) -> None:
        target = sys.stdout if stream == "out" else sys.stderr
        target.buffer.write(data)
        target.flush()


ENGINE_DOWN = (
    "Either start a Docker Engine (scripts/engine-up does it as root), or run on the host with "
    "--provider host-process, which enforces no isolation and says so."
)

EXIT_REFUSED = 125
"""``checkfu run``'s own failure (a refusal, a usage error, a sandbox failure): docker's code for the same."""


def pin_image(read: ReadProfile, provider: str, quiet: bool, early: Any = None) -> SandboxProfile:
    """The profile, its ``base_image`` tag pinned to the engine's image id (admission owns the digest).

    Pinning is the Docker provider's to do; other providers take the profile as written. ``early``: the question
    ``ask_early`` sent the engine about the tag.

    Raises:
        SandboxAdapterUnavailable: no Docker Engine answers (the profile may well be fine).
        SandboxProfileInvalid: the engine has no image of that tag, or a tag for a provider that pins none.
    """
    if read.tag is None:
        assert read.profile is not None
        return read.profile
    if provider != "docker":
        raise SandboxProfileInvalid(
            f"{read.name}: base_image: {read.tag!r} is a tag, and only the Docker tier pins tags; name the image "
            "by digest (name@sha256:...) or by image id (sha256:...)",
            field="base_image",
        )
    from checkfu.providers.docker import pin_base_image  # noqa: PLC0415 - only the Docker tier pins

    try:
        image_id = pin_base_image(read.tag, early)
    except SandboxAdapterUnavailable as exc:
        raise SandboxAdapterUnavailable(f"{exc.message}. {ENGINE_DOWN}", field="provider") from None
    if not quiet:
        err.print(f"[dim]• pinned      {escape(read.tag)} → {escape(image_id)}[/]")
    return pinned(read, image_id)


def ask_early(read: ReadProfile, provider: str) -> Any:
    """For the Docker tier, the engine's read-only questions of a Run's start, sent now so that it answers them
    while the journal opens: the tag's image id (returned, for ``pin_image``), and the engine's facts and whether
    it holds the egress image (taken by the provider's ``describe``). None for another provider, or a profile that
    needs no pinning."""
    if provider != "docker":
        return None
    from checkfu.providers.docker import ask_pin_early, engine  # noqa: PLC0415 - only the Docker tier pins
    from checkfu.providers.docker.provider import EGRESS_IMAGE  # noqa: PLC0415

    engine.ask_info_early()
    engine.ask_image_early(EGRESS_IMAGE)
    return ask_pin_early(read.tag) if read.tag is not None else None


def choose(registry: Registry, provider: str, explicit: bool) -> Any:
    found = registry.by_provider(provider)
    ambiguous = registry.ambiguity(provider)
    if ambiguous is not None:
        raise ambiguous
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


def refused(exc: SandboxError, json_file: Path | None, summary: dict[str, Any]) -> None:
    lines = exc.message.split("; ") if exc.message.count(": ") > 1 and " problems: " in exc.message else [exc.message]
    if len(lines) > 1:
        head, _, first = lines[0].partition(" problems: ")
        err.print(f"[bold red]refused[/]: {escape(head)} problems, nothing was run or allocated:")
        for line in [first, *lines[1:]]:
            err.print(f"  {escape(line)}", highlight=False)
    else:
        err.print(f"[bold red]{escape(exc.code)}[/]: {escape(exc.message)}", highlight=False)
    if exc.code in (
        "SandboxProfileInvalid",
        "SandboxPathRejected",
        "SandboxCapabilityUnavailable",
        "SandboxBoundExceeded",
    ):
        err.print("[dim]  nothing was run; fix the input above and run again (docs/errors.md says more)[/]")
    summary.update(
        ok=False, exit_code=EXIT_REFUSED, error={"code": exc.code, "message": exc.message, "field": exc.field}
    )
    if json_file is not None:
        write_json(json_file, summary)


def write_json(path: Path, summary: dict[str, Any]) -> None:
    """Write ``summary`` to ``path`` (``-``: stdout, after the command's own output)."""
    from checkfu.cli.outputs import write_named  # noqa: PLC0415

    try:
        write_named(path, json.dumps(summary, indent=2) + "\n")
    except OSError as exc:
        why = exc.strerror or str(exc)
        err.print(f"[bold yellow]warning[/]: cannot write --json {escape(str(path))}: {escape(why)}")


async def load_adapters(
    service: RunnerService, name: str, credential: Credential | None, observer: ConsoleObserver, *, hold: bool = False
) -> Registry:
    """The adapters to choose from, through the runner's front door: the named installed provider and those of the
    configured adapters file, or the provider service at a URL (with ``credential``). With ``hold`` (a warm pool's
    filler), the Docker tier provisions held sandboxes: started and paused, thawed at activation."""
    if is_url(name):
        return await service.remote(name, credential)
    docker: dict[str, Any] = {"progress": observer.build_line}  # the Docker tier reports each line of a build
    if hold:
        docker["hold"] = "yes"
    return await service.adapters([(name, None)], options={"docker": docker})


def refill_in_background(db: str | None) -> None:
    """Start ``checkfu pool refill`` detached from this process (its own session, no terminal), and go on."""
    argv = [sys.executable, "-c", "from checkfu.cli import main; main()", "pool", "refill"] + (
        ["--db", db] if db else []
    )
    try:
        from checkfu.cli import startup  # noqa: PLC0415 - stdlib only

        startup.detached(argv)
    except OSError as exc:
        err.print(f"[bold yellow]warning[/]: the pool is not refilled: {escape(str(exc))}")


def resolved_profile(prof: SandboxProfile, timeout: float | None, image_name: str | None) -> dict[str, Any]:
    """What the Run really got, flags and defaults applied: ``--json``'s ``resolved_profile``. ``image`` is the tag
    named (``image_id`` the image it was pinned to) or the digest given."""
    out = describe_resolved(prof, timeout)
    if image_name is not None:
        out = {"image": image_name, "image_id": prof.base_image, **{k: v for k, v in out.items() if k != "image"}}
    return out


def resolved_text(resolved: dict[str, Any]) -> str:
    """One line of the resolved profile: ``checkfu/debian:12, 1.5 cpus, 256 MiB memory, ... network none``."""
    network = resolved["network"]
    if resolved.get("allowlist"):
        network += " (" + ", ".join(resolved["allowlist"]) + ")"
    parts = [
        str(resolved["image"]),
        f"{resolved['cpus']:g} cpus",
        f"{resolved['memory_mib']} MiB memory",
        f"{resolved['disk_mib']} MiB disk",
        f"{resolved['pids']} pids",
        f"network {network}",
    ]
    if resolved.get("timeout_seconds") is not None:
        parts.append(f"timeout {resolved['timeout_seconds']:g} s")
    return ", ".join(parts)
