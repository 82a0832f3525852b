"""``checkfu evidence verify`` and ``checkfu keys generate``: signed conformance evidence, checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from checkfu.cli.consoles import console
from checkfu.cli.outputs import refuse_dash
from checkfu.conformance.evidence import EvidenceError, generate_keys, load_public_key, verify_evidence
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.core.documents import DocumentError, read_bounded
from checkfu.core.files import load

err = console(stderr=True, highlight=False, soft_wrap=True)

evidence_app = typer.Typer(help="Signed conformance evidence.", no_args_is_help=True)
keys_app = typer.Typer(help="Signing keys for conformance evidence.", no_args_is_help=True)


@evidence_app.command("verify")
def evidence_verify(
    file: Annotated[Path, typer.Argument(help="an evidence file (checkfu provider verify --out)")],
    pub: Annotated[Path, typer.Option("--pub", help="the signer's Ed25519 public key (PEM)")],
    envelope: Annotated[
        Path | None, typer.Option("--envelope", help="also require the evidence to be for this envelope")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Check evidence: its signature, its subject, and (with --envelope) that it is for that envelope."""
    try:
        public = load_public_key(pub)
        try:
            document = read_bounded(file)
        except DocumentError as exc:
            raise EvidenceError(str(exc)) from None
        expected = load(SandboxProviderCapabilities, envelope) if envelope is not None else None
        verified = verify_evidence(document, public, envelope=expected)
    except EvidenceError as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        else:
            err.print(f"[bold red]refused[/]: {escape(str(exc))}")
        raise typer.Exit(1) from None
    if as_json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "execution_target": verified.target.model_dump(),
                    "envelope_digest": verified.envelope_digest,
                    "tally": verified.tally,
                    "suite_version": verified.suite_version,
                    "finished_at": verified.finished_at,
                    "key_id": verified.key_id,
                    "cases": verified.cases,
                }
            )
        )
        return
    t = verified.tally
    err.print(
        f"[green]verified[/]: {escape(str(verified.target))}, envelope {escape(verified.envelope_digest)}\n"
        f"  signed by key {escape(verified.key_id[:16])}; {t.get('pass', 0):d} passed, {t.get('fail', 0):d} failed, "
        f"{t.get('skip', 0):d} skipped ({escape(verified.suite_version)}, {escape(verified.finished_at)})"
    )


@keys_app.command("generate")
def keys_generate(
    out: Annotated[Path, typer.Option("--out", help="the private key's path; the public key goes to PATH.pub")],
) -> None:
    """Make an Ed25519 key pair for signing evidence (the private key is written with mode 0600).

    Both files are made new: a file, directory or link (even a dangling one) at PATH or PATH.pub is refused,
    never overwritten or followed (exit 2)."""
    refuse_dash(out, "--out", "a key pair is two files (PATH and PATH.pub)")
    try:
        private, public = generate_keys(out)
    except EvidenceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--out") from None
    err.print(f"private key {escape(str(private))}, public key {escape(str(public))}")
