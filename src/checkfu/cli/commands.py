"""The ``checkfu`` command's tree of subcommands (``checkfu.cli.main`` is the entry point)."""

from __future__ import annotations

from typing import Annotated

import click
import typer
import typer.core

from checkfu.cli import checks, evidence, fleet, images, kit, logs, pool, provider, run, sandbox


def _plain_type(self: typer.core.TyperOption | typer.core.TyperArgument, ctx: click.Context) -> str | None:
    """The help's type column: the metavar a parameter names (``FILE``, ``HOST:PORT``), and nothing else; a flag
    or a plain value shows no ``<bool>``/``<str>`` clutter."""
    return self.metavar


typer.core.TyperOption.display_type_rich = _plain_type  # type: ignore[method-assign,assignment]
typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


def _version(value: bool) -> None:
    if value:
        from checkfu.cli import version_text  # noqa: PLC0415

        print(version_text())
        raise typer.Exit(0)


app = typer.Typer(
    name="checkfu",
    help="The sandbox provider seam: run commands in sandboxes, check envelopes and profiles, serve and grade "
    "providers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """The sandbox provider seam: run commands in sandboxes, check envelopes and profiles, serve and grade
    providers."""


app.add_typer(checks.envelope_app, name="envelope")
app.add_typer(checks.profile_app, name="profile")
app.add_typer(kit.app, name="kit")
app.add_typer(images.images_app, name="images")
app.add_typer(run.runs_app, name="runs")
app.add_typer(run.runner_app, name="runner")
app.add_typer(pool.pool_app, name="pool")
app.add_typer(provider.provider_app, name="provider")
app.add_typer(evidence.evidence_app, name="evidence")
app.add_typer(evidence.keys_app, name="keys")
app.command("run", context_settings={"allow_interspersed_args": False})(run.run_command)
app.command("submit", help=fleet.SUBMIT_HELP, context_settings={"allow_interspersed_args": False})(fleet.submit_command)
app.command("logs", help=logs.LOGS_HELP)(logs.logs_command)
sandbox.register(app)
