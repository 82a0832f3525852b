"""The ``checkfu`` command's tree of subcommands (``checkfu.cli.main`` is the entry point).

The tree is lazy: ``COMMANDS`` names each subcommand, the module that defines it and the first paragraph of its
help, so ``checkfu --help`` lists every command from this table alone, and running a command imports only its own
module (``checkfu run`` never loads the provider service's server, the conformance suite or the image commands).
A test holds each line of the table equal to its command's own help.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any

import typer
import typer.core
import typer.main
from typer import _click


def _plain_type(self: typer.core.TyperOption | typer.core.TyperArgument, ctx: _click.Context) -> str | None:
    """The help's type column: the metavar a parameter names (``FILE``, ``HOST:PORT``), and nothing else; a flag
    or a plain value shows no ``<bool>``/``<str>`` clutter."""
    return self.metavar


typer.core.TyperOption.display_type_rich = _plain_type  # type: ignore[method-assign]
typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


@dataclass(frozen=True)
class Lazy:
    """One subcommand: the module that defines it and the first paragraph of its help (what ``--help`` lists)."""

    module: str
    summary: str


_PLAIN = {"allow_interspersed_args": False}

COMMANDS: dict[str, Lazy] = {
    "run": Lazy("checkfu.cli.run", "Run one command in a fresh sandbox, with mounts staged by the runner."),
    "submit": Lazy(
        "checkfu.cli.fleet",
        "Queue a Run for the fleet and print its id: any `checkfu runner serve` on the same --db runs it as "
        "`checkfu run` would. Takes the options of `checkfu run`; follow it with `checkfu runs wait RUN`.",
    ),
    "logs": Lazy(
        "checkfu.cli.logs",
        "The output kept with a Run: its stdout to stdout, its stderr to stderr, in the order they came.",
    ),
    "exec": Lazy(
        "checkfu.cli.sandbox",
        "Run a command in a live sandbox; its exit status is this command's (125: checkfu's own failure, as "
        "docker\nexec).",
    ),
    "cp": Lazy(
        "checkfu.cli.sandbox",
        "Copy files between a sandbox and this machine, in either direction (as docker cp): ID:PATH LOCAL or\n"
        "LOCAL ID:PATH. A directory is copied whole; links are never followed.",
    ),
    "snapshot": Lazy(
        "checkfu.cli.sandbox",
        "Snapshot a live sandbox's files; prints the snapshot id (`checkfu resume` makes a sandbox of it).",
    ),
    "resume": Lazy("checkfu.cli.sandbox", "Make a new sandbox from a snapshot; prints its id."),
    "clone": Lazy(
        "checkfu.cli.sandbox", "Make a new sandbox holding a live sandbox's files as they are now; prints its id."
    ),
    "ps": Lazy(
        "checkfu.cli.sandbox",
        "Live sandboxes and Runs (owner, age, time left, provider) and the snapshots kept. Whatever is due is\n"
        "reclaimed first: a sandbox whose time-to-live passed, or whose owner process is gone, is shown as\n"
        "expired or orphaned, and reclaimed. What lives on a provider service names its URL (``endpoint``).",
    ),
    "kill": Lazy(
        "checkfu.cli.sandbox",
        "Stop a sandbox (released at once) or a Run: its process is sent SIGTERM (it releases everything and\n"
        "records the Run as interrupted), then SIGKILL after 15 s, and what it held is reclaimed.",
    ),
    "envelope": Lazy("checkfu.cli.checks", "Capability envelopes (SandboxProviderCapabilities)."),
    "profile": Lazy("checkfu.cli.checks", "Sandbox profiles."),
    "kit": Lazy("checkfu.cli.kit", "The provider author kit: JSON Schemas and golden vectors."),
    "images": Lazy("checkfu.cli.images", "The images checkfu built."),
    "runs": Lazy("checkfu.cli.fleet", "The history of Runs, from the journal."),
    "runner": Lazy("checkfu.cli.fleet", "Runner maintenance."),
    "pool": Lazy(
        "checkfu.cli.pool",
        "A warm pool: sandboxes provisioned ahead of demand, each adopted by one `checkfu run --pool`.",
    ),
    "provider": Lazy(
        "checkfu.cli.provider",
        "Provider services: serve one over the wire; test one (in-tree or by URL) and sign the evidence.",
    ),
    "evidence": Lazy("checkfu.cli.evidence", "Signed conformance evidence."),
    "keys": Lazy("checkfu.cli.evidence", "Signing keys for conformance evidence."),
    "sandbox": Lazy("checkfu.cli.sandbox", "Long-lived sandboxes: create, remove, extend."),
    "mcp": Lazy(
        "checkfu.cli.mcp_server",
        "Serve sandboxes as MCP tools (stdio, or streamable HTTP on loopback with a bearer token): run,\n"
        "sandbox_create, exec, write_file, read_file, list_files, snapshot, resume, remove.",
    ),
    "server": Lazy(
        "checkfu.cli.server",
        "The start-up server: a warm process each command runs in, so no command pays for importing checkfu.",
    ),
}
"""Every subcommand, in the order ``checkfu --help`` lists them."""


def _register_checks(app: typer.Typer, m: Any) -> None:
    app.add_typer(m.envelope_app, name="envelope")
    app.add_typer(m.profile_app, name="profile")


def _register_fleet(app: typer.Typer, m: Any) -> None:
    """``submit``, and ``runs``/``runner`` whole: ``checkfu.cli.fleet`` adds ``runs wait``, ``runner serve`` and
    ``runner list`` to the groups ``checkfu.cli.run`` defines."""
    app.command("submit", help=m.SUBMIT_HELP, context_settings=_PLAIN)(m.submit_command)
    app.add_typer(m.run_cli.runs_app, name="runs")
    app.add_typer(m.run_cli.runner_app, name="runner")


def _register_evidence(app: typer.Typer, m: Any) -> None:
    app.add_typer(m.evidence_app, name="evidence")
    app.add_typer(m.keys_app, name="keys")


REGISTER: dict[str, Callable[[typer.Typer, Any], None]] = {
    "checkfu.cli.run": lambda app, m: app.command("run", context_settings=_PLAIN)(m.run_command),
    "checkfu.cli.fleet": _register_fleet,
    "checkfu.cli.logs": lambda app, m: app.command("logs", help=m.LOGS_HELP)(m.logs_command),
    "checkfu.cli.sandbox": lambda app, m: m.register(app),
    "checkfu.cli.checks": _register_checks,
    "checkfu.cli.kit": lambda app, m: app.add_typer(m.app, name="kit"),
    "checkfu.cli.images": lambda app, m: app.add_typer(m.images_app, name="images"),
    "checkfu.cli.pool": lambda app, m: app.add_typer(m.pool_app, name="pool"),
    "checkfu.cli.provider": lambda app, m: app.add_typer(m.provider_app, name="provider"),
    "checkfu.cli.evidence": _register_evidence,
    "checkfu.cli.server": lambda app, m: app.add_typer(m.server_app, name="server"),
    "checkfu.cli.mcp_server": lambda app, m: app.command("mcp")(m.mcp_command),
}
"""How each module's commands join the tree (as ``app.command``/``app.add_typer`` would add them eagerly)."""


ON_LOAD: list[Callable[[], None]] = []
"""Called once, after the first command's module is loaded (``checkfu.cli.main`` settles the garbage collector
there)."""


class LazyGroup(typer.core.TyperGroup):
    """The root group: a subcommand's module is imported when that subcommand is looked up to run (or completed),
    and the help lists ``COMMANDS`` without importing any of them."""

    _listing = False
    _loaded: dict[str, dict[str, _click.Command]] = {}  # noqa: RUF012 - one cache per process, by module

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(name for name in COMMANDS if name not in self.commands)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in COMMANDS:
            return found
        lazy = COMMANDS[cmd_name]
        if self._listing:
            return typer.core.TyperCommand(cmd_name, help=lazy.summary)
        return load(lazy.module).get(cmd_name)

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def load(module: str) -> dict[str, _click.Command]:
    """The commands ``module`` adds to the tree, by name, built as typer builds an eager tree."""
    done = LazyGroup._loaded.get(module)
    if done is None:
        __import__(module)  # not importlib.import_module: `python -X importtime` shows only what `import` imports
        loaded: ModuleType = sys.modules[module]
        holder = typer.Typer(pretty_exceptions_enable=False)
        REGISTER[module](holder, loaded)
        done = dict(typer.main.get_group(holder).commands)
        LazyGroup._loaded[module] = done
        while ON_LOAD:
            ON_LOAD.pop()()
    return done


def _version(value: bool) -> None:
    if value:
        from checkfu.cli import version_text  # noqa: PLC0415

        print(version_text())
        raise typer.Exit(0)


app = typer.Typer(
    name="checkfu",
    cls=LazyGroup,
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
