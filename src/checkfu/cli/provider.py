"""``checkfu provider``: serve a provider over the wire, test it against the nine cases, sign the evidence."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from checkfu.cli.consoles import console
from checkfu.cli.outputs import is_dash, write_named
from checkfu.cli.state import client_credential, is_url, open_journal, open_service, service_of, state_dir
from checkfu.conformance.cases import CASES, Case, CaseResult
from checkfu.conformance.evidence import EvidenceError, load_private_key, load_public_key, sign
from checkfu.conformance.suite import Report, run_suite
from checkfu.contract.ceiling import RunnerProviderCapability
from checkfu.contract.codec import decode
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxEnrollmentRefused, SandboxError
from checkfu.contract.profile import SandboxProfile
from checkfu.control.enrollment import refuse_matrix_evidence
from checkfu.control.grading import GradeCard, grade, grade_envelope, render_html, render_text
from checkfu.core.documents import DocumentError, read_bounded
from checkfu.core.files import load
from checkfu.core.registry import enrollment_endpoint, load_registry
from checkfu.wire.credentials import Credential, CredentialError
from checkfu.wire.server import create_app
from checkfu.wire.serving import serve
from checkfu.wire.tls import ServerTls, TlsError

err = console(stderr=True, highlight=False, soft_wrap=True)

T = TypeVar("T")
EXIT_REFUSED = 1
"""A refusal of this group's commands (``checkfu.cli.main`` exits so for any ``SandboxError``)."""

provider_app = typer.Typer(
    help="Provider services: serve one over the wire; test one (in-tree or by URL) and sign the evidence.",
    no_args_is_help=True,
)

CredentialOpt = Annotated[
    Path | None,
    typer.Option(
        "--credential-file",
        help="file holding the credential, or - for the first line of stdin (default: $CHECKFU_PROVIDER_CREDENTIAL)",
    ),
]


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (for example 127.0.0.1:8790)", param_hint="--listen")
    return host.strip("[]"), int(port)


def _server_tls(cert: Path | None, key: Path | None) -> ServerTls | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = "--tls-key" if key is None else "--tls-cert"
        raise typer.BadParameter("TLS needs both --tls-cert and --tls-key", param_hint=missing)
    tls = ServerTls(cert, key)
    try:
        tls.check()
    except TlsError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls-cert/--tls-key") from None
    return tls


@provider_app.command("serve")
def provider_serve(
    name: Annotated[str, typer.Argument(help="an installed provider: docker, host-process, memory")],
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on")] = "127.0.0.1:8790",
    credential_file: CredentialOpt = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", help="serve HTTPS with this certificate chain (PEM); needs --tls-key"),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="the certificate's private key (PEM, not encrypted)")
    ] = None,
) -> None:
    """Serve an installed provider as an HTTP service that `checkfu run --provider URL` can drive.

    With --tls-cert and --tls-key it serves only HTTPS (and WSS for openProcess); a client trusts its
    certificate through the system's store, SSL_CERT_FILE, or CHECKFU_PROVIDER_CA=FILE.
    """
    host, port = _listen(listen)
    tls = _server_tls(tls_cert, tls_key)
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
    scheme = "https" if tls is not None else "http"
    err.print(
        f"serving {escape(str(adapter.target))} on {escape(scheme)}://{escape(host)}:{port:d} "
        "(its runner_enforced axes are stated as provider_attested over the wire; Ctrl-C stops)"
    )
    asyncio.run(serve(create_app(adapter.provider, [credential]), host, port, tls=tls))


TargetArg = Annotated[str, typer.Argument(help="an installed provider (docker, host-process, memory) or a service URL")]
SecretOpt = Annotated[
    str | None,
    typer.Option(
        "--credential",
        help="a file holding the service's credential; the credential itself is accepted with a warning, since any "
        "user of the machine can read it in the process list (prefer --credential-file)",
        show_default=False,
    ),
]
EXPOSED = (
    "--credential puts the secret in this command's arguments, where any user of this machine can read it (ps, "
    "/proc/PID/cmdline) while it runs; give --credential-file FILE, --credential-file - (the first line of stdin) "
    "or CHECKFU_PROVIDER_CREDENTIAL instead"
)
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
            given = Credential(credential)
        except CredentialError as exc:
            raise typer.BadParameter(str(exc), param_hint="--credential") from None
        err.print(f"[bold yellow]warning[/]: {escape(EXPOSED)}")
        return given
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
            f"  [{colour}]{escape(result.outcome):<4}[/] case {case.number:d} {escape(case.name)} "
            f"[dim]({result.seconds:.2f} s, {done[0]:d}/{shown:d})[/]"
        )

    return asyncio.run(
        run_suite(target, credential=credential, profile=prof, progress=progress, only=tuple(cases or ()))
    )


def _table(report: Report) -> None:
    table = Table("case", "outcome", "time", "reason", title=f"conformance of {escape(str(report.envelope.target))}")
    for c in report.cases:
        colour = {"pass": "green", "fail": "red", "skip": "yellow"}[c.outcome]
        table.add_row(
            f"{c.number:d} {escape(c.name)}",
            f"[{colour}]{escape(c.outcome)}[/]",
            f"{c.seconds:.2f} s",
            escape(c.reason) + (f" [dim](exercised: {escape(', '.join(c.exercised))})[/]" if c.exercised else ""),
        )
    Console(stderr=True).print(table)
    t = report.tally()
    err.print(
        f"{t['pass']:d} passed, {t['fail']:d} failed, {t['skip']:d} skipped"
        f" in {report.finished_at - report.started_at:.1f} s"
        f"; envelope {escape(report.envelope_digest)}"
    )


@provider_app.command("test")
def provider_test(
    target: TargetArg,
    credential: SecretOpt = None,
    credential_file: CredentialOpt = None,
    profile: ProfileOpt = None,
    case: CaseOpt = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the report as JSON to FILE (- for stdout)")
    ] = None,
    junit_out: Annotated[
        Path | None, typer.Option("--junit", help="write a JUnit XML report to FILE (- for stdout)")
    ] = None,
) -> None:
    """Run the nine conformance cases against a provider; exits 0 only when no case failed."""
    report = _run_cases(target, _credential(credential, credential_file), profile, case, quiet=False)
    _table(report)
    if json_out is not None:
        _write(json_out, "--json", json.dumps(report.as_json(), indent=2) + "\n")
    if junit_out is not None:
        _write(junit_out, "--junit", report.junit_xml())
    raise typer.Exit(0 if report.ok else 1)


def _write(path: Path, option: str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` (``-``: stdout).

    Raises:
        typer.Exit: it cannot be written (said on stderr, naming the option; exit 1).
    """
    try:
        write_named(path, data)
    except OSError as exc:
        err.print(f"[bold red]cannot write {escape(option)} {escape(str(path))}[/]: {escape(exc.strerror or str(exc))}")
        raise typer.Exit(1) from None


@provider_app.command("verify")
def provider_verify(
    target: TargetArg,
    key: Annotated[Path, typer.Option("--key", help="the Ed25519 private key that signs (checkfu keys generate)")],
    out: Annotated[Path, typer.Option("--out", help="where the signed evidence (DSSE, JSON) goes (- for stdout)")],
    credential: SecretOpt = None,
    credential_file: CredentialOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Run the suite and write signed evidence: an in-toto Statement in a DSSE envelope (Ed25519)."""
    private = _private_key(key)
    report = _run_cases(target, _credential(credential, credential_file), profile, None, quiet=False)
    _table(report)
    _write(out, "--out", json.dumps(sign(report, private), indent=2) + "\n")
    where = "stdout" if is_dash(out) else str(out)
    err.print(f"evidence written to {escape(where)} ({'no case failed' if report.ok else 'cases FAILED'})")
    raise typer.Exit(0 if report.ok else 1)


def _private_key(path: Path) -> Any:
    try:
        return load_private_key(path)
    except EvidenceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--key") from None


DbOpt = Annotated[str | None, typer.Option("--db", help="journal URL (default: SQLite in the state directory)")]


def _public_key(path: Path, option: str) -> Any:
    try:
        return load_public_key(path)
    except EvidenceError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _read_file(path: Path, option: str) -> bytes:
    try:
        return read_bounded(path)
    except DocumentError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


@provider_app.command("enroll")
def provider_enroll(
    target: TargetArg,
    evidence: Annotated[Path, typer.Option("--evidence", help="signed conformance evidence for this provider")],
    pub: Annotated[
        Path | None,
        typer.Option(
            "--pub", help="the conformance key that signed it (default: the state directory's keys/conformance.pub)"
        ),
    ] = None,
    matrix_evidence: Annotated[
        Path | None,
        typer.Option(
            "--matrix-evidence",
            hidden=True,
            help="refused: security_boundary egress is not admissible for a provider that is not in-tree",
        ),
    ] = None,
    matrix_pub: Annotated[
        Path | None,
        typer.Option(
            "--matrix-pub",
            hidden=True,
            help="refused: security_boundary egress is not admissible for a provider that is not in-tree",
        ),
    ] = None,
    credential: SecretOpt = None,
    credential_file: CredentialOpt = None,
    db: DbOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON object, a refusal included ({ok: false, error})")
    ] = False,
) -> None:
    """Admit a provider for selection: verify its evidence, hold its envelope to the ceiling, issue a credential.

    A provider that is not in-tree is held to advisory_filter egress at most: security_boundary is not
    admissible, and no evidence (--matrix-evidence included, which is refused by name) stands in for it.
    """

    def body() -> Any:
        if matrix_evidence is not None or matrix_pub is not None:
            raise refuse_matrix_evidence("--matrix-evidence" if matrix_evidence is not None else "--matrix-pub")
        keys = state_dir() / "keys"
        conformance_pub = pub or keys / "conformance.pub"
        if pub is None and not conformance_pub.exists():
            raise typer.BadParameter(
                f"give the key that signed the evidence with --pub (or keep it at {conformance_pub})",
                param_hint="--pub",
            )
        key = _public_key(conformance_pub, "--pub")
        document = _read_file(evidence, "--evidence")
        given = _credential(credential, credential_file)
        service = open_service(db)
        try:
            return asyncio.run(service.enroll(target, document, key, credential=given))
        finally:
            service.close()

    enrolled = _refusing(as_json, body, usage_code=SandboxEnrollmentRefused.code)
    t = enrolled.evidence.tally
    if as_json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "execution_target": enrolled.adapter.target.model_dump(),
                    "envelope_digest": enrolled.evidence.envelope_digest,
                    "tally": t,
                    "credential_file": str(enrolled.credential_path) if enrolled.credential_path else None,
                }
            )
        )
        return
    err.print(
        f"[green]enrolled[/] {escape(str(enrolled.adapter.target))}: {t.get('pass', 0):d} passed, "
        f"{t.get('skip', 0):d} skipped, within its ceiling"
    )
    if enrolled.credential_path is not None:
        err.print(
            f"credential issued to {escape(str(enrolled.credential_path))} (mode 0600): configure the service with it "
            "(its --credential-file or CHECKFU_PROVIDER_CREDENTIAL); checkfu run --provider URL uses it from now on"
        )


@provider_app.command("list")
def provider_list(
    db: DbOpt = None, as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False
) -> None:
    """Every adapter: installed providers and enrolled services, with tuple, ceiling and grade."""
    journal = open_journal(db)
    try:
        registry = asyncio.run(load_registry())
        service_of(journal, db).record(registry)  # this package's own adapters, as a runner records them
        rows = {(r.target.model_dump_json(), r.endpoint): r for r in journal.enrollments()}
    finally:
        journal.close()
    listed: list[dict[str, Any]] = []
    for adapter in registry.adapters:
        key = (adapter.target.model_dump_json(), enrollment_endpoint(adapter))
        card = grade(adapter, enrollment=rows.pop(key, None))
        listed.append(_listing(adapter.source, card))
    for row in rows.values():
        env = decode(SandboxProviderCapabilities, row.envelope)
        card = grade_envelope(
            env, in_tree=row.kind == "in_tree", ceiling=decode(RunnerProviderCapability, row.ceiling), enrollment=row
        )
        listed.append(_listing(row.source, card))
    if as_json:
        print(json.dumps({"adapters": listed, "unavailable": dict(registry.unavailable)}))
        return
    table = Table("adapter", "enrolled", "ceiling", "tier", "enforced", "egress")
    for a in listed:
        table.add_row(
            escape(a["target"]),
            escape(a["enrolled"]),
            "in-tree" if a["in_tree"] else "third party",
            escape(a["tier_label"]),
            f"{a['enforced']:d}/9",
            escape(a["egress_certification"]),
        )
    Console().print(table)
    for source, why in registry.unavailable.items():
        err.print(f"[yellow]unavailable[/] {escape(source)}: {escape(why)}")


def _listing(source: str, card: GradeCard) -> dict[str, Any]:
    enr = card.enrollment
    enrolled = "in-tree" if card.in_tree else ("no" if enr is None else ("yes" if enr["current"] else "stale"))
    if not card.in_tree and enr is None and card.target.endswith("[test]"):
        enrolled = "test placement"
    return {
        "target": card.target,
        "source": source,
        "in_tree": card.in_tree,
        "enrolled": enrolled,
        "tier": card.tier,
        "tier_label": card.as_json()["tier_label"],
        "enforced": sum(1 for a in card.axes.values() if a["counts"]),
        "egress_certification": card.egress_certification,
        "ceiling": card.ceiling,
    }


@provider_app.command("grade")
def provider_grade(
    target: TargetArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the card as one JSON object")] = False,
    html_out: Annotated[
        Path | None, typer.Option("--html", help="write the card as one self-contained page to FILE (- for stdout)")
    ] = None,
    test: Annotated[bool, typer.Option("--test", help="run the conformance cases now and show their tally")] = False,
    credential: SecretOpt = None,
    credential_file: CredentialOpt = None,
    db: DbOpt = None,
) -> None:
    """The grade card: tier, each axis and who enforces it, egress, ceiling, conformance, warnings, faults."""
    cred = _credential(credential, credential_file)
    service = open_service(db)
    try:
        if cred is None and is_url(target):  # the credential issued at enrollment, as `checkfu run` uses it
            cred = service.enrolled_credential(target)
        card = _refusing(as_json, lambda: asyncio.run(service.grade(target, credential=cred)))
        if test:
            report = _run_cases(target, cred, None, None, quiet=as_json)
            card = asyncio.run(service.grade(target, credential=cred, conformance=report.as_json()))
    finally:
        service.close()
    if html_out is not None:
        _write(html_out, "--html", render_html(card))
    if as_json:
        print(json.dumps(card.as_json()))
        return
    if is_dash(html_out):
        return  # stdout holds the page: the text card would spoil it
    out = Console(highlight=False)
    for line in render_text(card):
        style = "bold red" if line.startswith(("warning", "fault")) else ""
        out.print(f"[{style}]{escape(line)}[/]" if style else escape(line))
    if html_out is not None:
        err.print(f"page written to {escape(str(html_out))}")


def _refusing(as_json: bool, body: Callable[[], T], *, usage_code: str | None = None) -> T:
    """``body()``; with ``as_json``, a refusal is also printed as ``{"ok": false, "error": {code, message, field}}``
    on stdout (the shape ``checkfu run --json`` writes), and either way the command exits as it would without it:
    1 for a refusal (its code first on stderr), 2 for a usage error (its field the option at fault; click says the
    rest on stderr; printed as JSON only with ``usage_code``, the vocabulary code such a refusal amounts to)."""
    try:
        return body()
    except SandboxError as exc:
        if not as_json:
            raise
        err.print(f"[bold red]{escape(exc.code)}[/]: {escape(exc.message)}")
        print(json.dumps({"ok": False, "error": {"code": exc.code, "message": exc.message, "field": exc.field}}))
        raise typer.Exit(EXIT_REFUSED) from None
    except typer.BadParameter as exc:
        if as_json and usage_code is not None:
            hint = exc.param_hint if isinstance(exc.param_hint, str) else None
            error = {"code": usage_code, "message": exc.format_message(), "field": hint}
            print(json.dumps({"ok": False, "error": error}))
        raise
