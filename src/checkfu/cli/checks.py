"""``checkfu envelope check`` and ``checkfu profile check``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from checkfu.cli.outputs import is_dash, shown, write_named
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxError
from checkfu.contract.model import Model
from checkfu.contract.tiers import assess
from checkfu.control.grading import grade_envelope
from checkfu.core.files import dump, load
from checkfu.core.profiles import DEFAULTS, read_profile

envelope_app = typer.Typer(help="Capability envelopes (SandboxProviderCapabilities).", no_args_is_help=True)
profile_app = typer.Typer(help="Sandbox profiles.", no_args_is_help=True)

FileArg = Annotated[Path, typer.Argument(help="a JSON or TOML file (- for stdin)", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object instead of a summary")]


def _refusal(exc: SandboxError) -> dict[str, object]:
    return {"ok": False, "error": {"code": exc.code, "message": exc.message, "field": exc.field}}


def _check(model: type[Model], key: str, file: Path, as_json: bool, *, quiet: bool = False) -> Model:
    out = Console(highlight=False)
    try:
        value = load(model, file)
    except SandboxError as exc:
        if as_json:
            print(json.dumps(_refusal(exc)))
        else:
            where = f" (field {exc.field})" if exc.field else ""
            Console(stderr=True, highlight=False).print(
                f"[bold red]refused[/] {escape(exc.code)}{escape(where)}: {escape(exc.message)}"
            )
        raise typer.Exit(1) from None
    if quiet:
        return value
    if as_json:
        print(json.dumps({"ok": True, key: dump(value)}))
    else:
        out.print(f"[bold green]ok[/] {escape(shown(file))} is a valid {escape(model.__name__)}")
    return value


@envelope_app.command("check")
def envelope_check(file: FileArg, as_json: JsonOpt = False) -> None:
    """Decode an envelope strictly; grade it as a third party's: its tier, what it cannot serve, and a warning
    for every claim a third party's ceiling would refuse."""
    env = _check(SandboxProviderCapabilities, "envelope", file, as_json, quiet=as_json)
    assert isinstance(env, SandboxProviderCapabilities)
    card = grade_envelope(env)
    a = assess(env)
    if as_json:
        assessment = {
            "tier": card.tier,
            "short_of_next": card.short_of_next,
            "not_enforced": list(a.not_counting),
            "cannot_serve": list(a.cannot_serve),
            "egress_certification": card.egress_certification,
            "uncertified_allowlist": card.uncertified_allowlist,
            "over_ceiling": card.over_ceiling,
            "warnings": card.warnings,
        }
        print(json.dumps({"ok": True, "envelope": dump(env), "assessment": assessment}))
        return
    out = Console(highlight=False)
    out.print(f"adapter   {escape(str(env.target))}")
    colour = "yellow" if card.tier == "below_day_one" else "green"
    out.print(f"tier      [bold {colour}]{escape(card.as_json()['tier_label'])}[/] (as a third party's)")
    if card.short_of_next:
        out.print("          short of the next tier: " + escape("; ".join(card.short_of_next)))
    if a.not_counting:
        out.print("[yellow]not enforced[/]:")
        for axis in a.not_counting:
            out.print(f"  - {escape(axis)} ({escape(env.enforcement.authority(axis))})")
    else:
        out.print("enforced  all nine axes count as enforcement")
    if card.uncertified_allowlist:
        out.print("[yellow]egress[/]    an uncertified allowlist (egress_certification 'unsupported')")
    if a.cannot_serve:
        out.print("cannot serve:")
        for item in a.cannot_serve:
            out.print(f"  - {escape(item)}")
    for claim in card.over_ceiling:
        out.print(f"[bold red]warning[/]   a third party's ceiling would refuse {escape(claim)}")
    if card.over_ceiling:
        out.print(
            "          only this package's own providers may claim runner_enforced, and security_boundary "
            "egress is not admissible for a provider that is not in-tree"
        )


@profile_app.command("check")
def profile_check(file: FileArg, as_json: JsonOpt = False) -> None:
    """Check a profile as `checkfu run` will: every problem listed, unknown keys named; print its digest.

    A base_image tag (checkfu/debian:12) is reported as pinned at admission, not refused; the digest is then
    the pinned profile's, known only at admission.
    """
    read = read_profile(file, "docker")
    err = Console(stderr=True, highlight=False)
    if read.problems:
        if as_json:
            print(
                json.dumps(
                    {
                        "ok": False,
                        "error": _refusal(read.problems[0].error)["error"],
                        "problems": [{"code": p.code, "field": p.field, "message": p.message} for p in read.problems],
                    }
                )
            )
        else:
            err.print(f"[bold red]refused[/] {escape(shown(file))}: {len(read.problems)} problem(s)")
            for p in read.problems:
                where = f" (field {p.field})" if p.field else ""
                err.print(f"  {escape(p.code)}{escape(where)}: {escape(p.message)}")
        raise typer.Exit(1)
    assert read.profile is not None and read.doc is not None
    digest = None if read.tag is not None else read.profile.digest
    if as_json:
        value = dump(read.profile)
        if read.tag is not None and isinstance(value, dict):
            value["base_image"] = read.tag
        print(json.dumps({"ok": True, "profile": value, "digest": digest, "notes": read.notes}))
        return
    out = Console(highlight=False)
    out.print(f"[bold green]ok[/] {escape(shown(file))} is a valid SandboxProfile")
    for note in read.notes:
        out.print(f"note      {escape(note)}")
    out.print(f"digest    {escape(digest or 'computed at admission, once base_image is pinned')}")


@profile_app.command("init")
def profile_init(
    file: Annotated[
        Path,
        typer.Argument(
            help="where to write it (default: profile.toml; - for stdout)", show_default=False, metavar="FILE"
        ),
    ] = Path("profile.toml"),
    provider: Annotated[
        str, typer.Option("--provider", help="the tier it is for: docker or host-process", metavar="NAME")
    ] = "docker",
    force: Annotated[bool, typer.Option("--force", help="overwrite FILE if it exists")] = False,
) -> None:
    """Write the built-in default profile of `checkfu run` to FILE, to edit (docs/profiles.md has every field)."""
    if provider not in DEFAULTS:
        raise typer.BadParameter(f"{provider!r} is not one of {', '.join(DEFAULTS)}", param_hint="--provider")
    name, text = DEFAULTS[provider]
    if is_dash(file):
        write_named(file, text)
        return
    if file.exists() and not force:
        raise typer.BadParameter(f"{file} exists; --force overwrites it", param_hint="FILE")
    try:
        write_named(file, text)
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {file}: {exc.strerror}", param_hint="FILE") from None
    Console(highlight=False).print(
        f"wrote {escape(str(file))} ({escape(name)}); edit it, then: checkfu run --profile {escape(str(file))} -- CMD"
    )
