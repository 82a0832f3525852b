"""``checkfu provider``: serve a provider over the wire, test it against the nine cases, sign the evidence."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from checkfu.cli.files import load
from checkfu.cli.state import client_credential
from checkfu.conformance.cases import CASES, Case, CaseResult
from checkfu.conformance.evidence import EvidenceError, load_private_key, sign
from checkfu.conformance.suite import Report, run_suite
from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.contract.profile import SandboxProfile
from checkfu.runner.registry import load_registry
from checkfu.wire.credentials import Credential, CredentialError
from checkfu.wire.server import create_app
from checkfu.wire.serving import serve

err = Console(stderr=True, highlight=False, soft_wrap=True)

provider_app = typer.Typer(
    help="Provider services: serve one over the wire; test one (in-tree or by URL) and sign the evidence.",
    no_args_is_help=True,
)

CredentialOpt = Annotated[
    Path | None,
    typer.Option(
        "--credential-file",
        help="file holding the credential clients must present (default: $CHECKFU_PROVIDER_CREDENTIAL)",
    ),
]


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (for example 127.0.0.1:8790)", param_hint="--listen")
    return host.strip("[]"), int(port)


@provider_app.command("serve")
def provider_serve(
    name: Annotated[str, typer.Argument(help="an installed provider: docker, host-process, memory")],
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on")] = "127.0.0.1:8790",
    credential_file: CredentialOpt = None,
) -> None:
    """Serve an installed provider as an HTTP service that `checkfu run --provider URL` can drive."""
    host, port = _listen(listen)
    credential = client_credential(credential_file)
    if credential is None:
        raise typer.BadParameter(
            "a service needs a credential: give --credential-file FILE or set CHECKFU_PROVIDER_CREDENTIAL",
            param_hint="--credential-file",
        )
    registry = asyncio.run(load_registry(entry_point_names=[name]))
    found = registry.by_provider(name)
    if len(found) != 1:
        why = "; ".join(f"{k}: {v}" for k, v in registry.unavailable.items()) or "not installed"
        raise SandboxAdapterUnavailable(f"cannot serve {name!r}: {why}", field="provider")
    adapter = found[0]
    err.print(
        f"serving {escape(str(adapter.target))} on http://{host}:{port} "
        "(its runner_enforced axes are stated as provider_attested over the wire; Ctrl-C stops)"
    )
    asyncio.run(serve(create_app(adapter.provider, [credential]), host, port))


TargetArg = Annotated[str, typer.Argument(help="an installed provider (docker, host-process, memory) or a service URL")]
SecretOpt = Annotated[
    str | None,
    typer.Option(
        "--credential",
        help="the service's credential: a file holding it, or the credential itself",
        show_default=False,
    ),
]
ProfileOpt = Annotated[
    Path | None, typer.Option("--profile", help="a profile the provider can serve (default: derived)")
]
CaseOpt = Annotated[list[int] | None, typer.Option("--case", min=1, max=9, help="run only this case (repeatable)")]


def _credential(credential: str | None, credential_file: Path | None) -> Credential | None:
    if credential is not None and credential_file is not None:
        raise typer.BadParameter("give --credential or --credential-file, not both", param_hint="--credential")
    if credential is not None:
        path = Path(credential)
        if path.is_file():
            return client_credential(path)
        try:
            return Credential(credential)
        except CredentialError as exc:
            raise typer.BadParameter(str(exc), param_hint="--credential") from None
    return client_credential(credential_file)


def _run_cases(
    target: str, credential: Credential | None, profile: Path | None, cases: list[int] | None, quiet: bool
) -> Report:
    prof = load(SandboxProfile, profile) if profile is not None else None
    shown = len(cases) if cases else len(CASES)
    done = [0]

    def progress(case: Case, result: CaseResult | None) -> None:
        if quiet:
            return
        if result is None:
            return
        done[0] += 1
        colour = {"pass": "green", "fail": "red", "skip": "yellow"}[result.outcome]
        err.print(
            f"  [{colour}]{result.outcome:<4}[/] case {case.number} {escape(case.name)} "
            f"[dim]({result.seconds:.2f} s, {done[0]}/{shown})[/]"
        )

    return asyncio.run(
        run_suite(target, credential=credential, profile=prof, progress=progress, only=tuple(cases or ()))
    )


def _table(report: Report) -> None:
    table = Table("case", "outcome", "time", "reason", title=f"conformance of {escape(str(report.envelope.target))}")
    for c in report.cases:
        colour = {"pass": "green", "fail": "red", "skip": "yellow"}[c.outcome]
        table.add_row(
            f"{c.number} {escape(c.name)}", f"[{colour}]{c.outcome}[/]", f"{c.seconds:.2f} s", escape(c.reason)
        )
    Console(stderr=True).print(table)
    t = report.tally()
    err.print(
        f"{t['pass']} passed, {t['fail']} failed, {t['skip']} skipped in {report.finished_at - report.started_at:.1f} s"
        f"; envelope {report.envelope_digest}"
    )


@provider_app.command("test")
def provider_test(
    target: TargetArg,
    credential: SecretOpt = None,
    credential_file: CredentialOpt = None,
    profile: ProfileOpt = None,
    case: CaseOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the report as JSON to FILE")] = None,
    junit_out: Annotated[Path | None, typer.Option("--junit", help="write a JUnit XML report to FILE")] = None,
) -> None:
    """Run the nine conformance cases against a provider; exits 0 only when no case failed."""
    report = _run_cases(target, _credential(credential, credential_file), profile, case, quiet=False)
    _table(report)
    if json_out is not None:
        report.write_json(json_out)
    if junit_out is not None:
        report.write_junit(junit_out)
    raise typer.Exit(0 if report.ok else 1)


@provider_app.command("verify")
def provider_verify(
    target: TargetArg,
    key: Annotated[Path, typer.Option("--key", help="the Ed25519 private key that signs (checkfu keys generate)")],
    out: Annotated[Path, typer.Option("--out", help="where the signed evidence (DSSE, JSON) goes")],
    credential: SecretOpt = None,
    credential_file: CredentialOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Run the suite and write signed evidence: an in-toto Statement in a DSSE envelope (Ed25519)."""
    private = _private_key(key)
    report = _run_cases(target, _credential(credential, credential_file), profile, None, quiet=False)
    _table(report)
    out.write_text(json.dumps(sign(report, private), indent=2) + "\n", encoding="utf-8")
    err.print(f"evidence written to {escape(str(out))} ({'no case failed' if report.ok else 'cases FAILED'})")
    raise typer.Exit(0 if report.ok else 1)


def _private_key(path: Path) -> Any:
    try:
        return load_private_key(path)
    except EvidenceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--key") from None
