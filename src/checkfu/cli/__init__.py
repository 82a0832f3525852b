"""The ``checkfu`` command. Thin: it calls only the public API and renders what comes back."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

from checkfu.cli import checks, evidence, fleet, kit, provider, run
from checkfu.contract.errors import SandboxError
from checkfu.runner.journal import JournalError

app = typer.Typer(
    name="checkfu",
    help="The sandbox provider seam: check envelopes and profiles, export the author kit, run sandboxes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(checks.envelope_app, name="envelope")
app.add_typer(checks.profile_app, name="profile")
app.add_typer(kit.app, name="kit")
app.add_typer(run.runs_app, name="runs")
app.add_typer(run.runner_app, name="runner")
app.add_typer(provider.provider_app, name="provider")
app.add_typer(evidence.evidence_app, name="evidence")
app.add_typer(evidence.keys_app, name="keys")
app.command("run", context_settings={"allow_interspersed_args": False})(run.run_command)
app.command("submit", help=fleet.SUBMIT_HELP, context_settings={"allow_interspersed_args": False})(fleet.submit_command)

EXIT_REFUSED = 1
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def main() -> None:
    """Entry point: no traceback reaches a user unless ``CHECKFU_DEBUG=1``."""
    err = Console(stderr=True, soft_wrap=True)
    try:
        app()
    except SandboxError as exc:
        err.print(f"[bold red]{escape(exc.code)}[/]: {escape(exc.message)}", highlight=False, markup=True)
        sys.exit(EXIT_REFUSED)
    except JournalError as exc:
        err.print(
            f"[bold red]journal unavailable[/]: {escape(str(exc))}. Nothing was asked of a provider without its "
            "record; run `checkfu runner reconcile` once the journal answers to settle what it could not record",
            highlight=False,
        )
        sys.exit(EXIT_REFUSED)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if os.environ.get("CHECKFU_DEBUG") == "1":
            raise
        err.print(
            f"checkfu: internal error: {type(exc).__name__}: {exc} (set CHECKFU_DEBUG=1 for a traceback)",
            highlight=False,
            markup=False,
        )
        sys.exit(EXIT_INTERNAL)
