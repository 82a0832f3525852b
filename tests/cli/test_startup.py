"""What the ``checkfu`` command imports before it does anything (issue 18): a regression guard, not a speed assertion.

Each case runs the installed console script in a fresh interpreter under ``-X importtime`` and reads which modules
were imported; ``bench/run B15`` measures the time.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import checkfu

CHECKFU = Path(sys.executable).with_name("checkfu")
HEAVY = ("pydantic", "pydantic_core", "docker", "sqlalchemy", "typer", "rich", "starlette", "uvicorn", "websockets")


def imported(*args: str) -> set[str]:
    """The modules ``checkfu ARGS`` imports, by name."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(CHECKFU), *args], capture_output=True, check=False)
    names = set()
    for line in done.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert names, done.stderr.decode()[-2000:]
    return names


def top_level(names: set[str]) -> set[str]:
    return {n.split(".", 1)[0] for n in names}


def test_version_imports_nothing_heavy() -> None:
    names = imported("--version")
    assert not top_level(names) & set(HEAVY), sorted(top_level(names) & set(HEAVY))
    assert "importlib.metadata" not in names and "typing" not in names


def test_version_is_the_installed_distributions() -> None:
    out = subprocess.run([str(CHECKFU), "--version"], capture_output=True, check=True, text=True).stdout
    assert out == f"checkfu {version('checkfu')}\n"
    assert checkfu.__version__ == version("checkfu")


def test_help_loads_no_subcommand_module() -> None:
    """``checkfu --help`` lists every command from the group's own table, so no command's module (nor docker-py,
    SQLAlchemy, pydantic or the wire) is imported for it."""
    names = imported("--help")
    kept = ("checkfu.cli.commands", "checkfu.cli.startup")  # startup: whether a warm server could run it
    assert not {n for n in names if n.startswith("checkfu.cli.") and n not in kept}, sorted(names)
    assert not top_level(names) & {"pydantic", "docker", "sqlalchemy", "starlette", "uvicorn", "websockets"}


def test_run_loads_only_what_it_uses() -> None:
    """``checkfu run`` (here refused before any work) loads its own module, not the provider service's server,
    the conformance suite or the other commands."""
    names = imported("run", "--provider", "no-such-provider", "--", "true")
    assert "checkfu.cli.run" in names
    for absent in ("checkfu.cli.provider", "checkfu.cli.images", "checkfu.cli.fleet", "checkfu.cli.evidence"):
        assert absent not in names, absent
    assert not top_level(names) & {"starlette", "uvicorn"}
    assert "checkfu.conformance" not in names and "checkfu.wire.server" not in names
    # nor, for an installed provider, the wire client, the terminal or the progress bars
    assert not {"checkfu.wire.client", "checkfu.cli.terminal", "rich.progress"} & names
    assert "websockets" not in top_level(names)


def test_the_lazy_table_says_what_each_command_says() -> None:
    """Each line ``checkfu --help`` lists from the table is the first paragraph of that command's own help, and the
    table names every command its modules add, so the lazy listing cannot drift from the commands."""
    from typer import _click  # noqa: PLC0415

    from checkfu.cli.commands import COMMANDS, REGISTER, load  # noqa: PLC0415

    listed: set[str] = set()
    for module in REGISTER:
        for name, command in load(module).items():
            listed.add(name)
            assert name in COMMANDS and COMMANDS[name].module == module, name
            first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
            assert COMMANDS[name].summary == first, name
            assert not command.hidden and not command.deprecated and not getattr(command, "rich_help_panel", None), name
            assert isinstance(command, _click.Command)
    assert listed == set(COMMANDS)


def test_the_collector_runs_again_once_the_command_is_loaded() -> None:
    """``main`` holds the garbage collector off while start-up makes its long-lived objects, then freezes them and
    turns it back on as the command's module is loaded, so a long-running command (``provider serve``, ``runner
    serve``) collects as any program does."""
    code = (
        "import gc, sys\n"
        "from checkfu.cli import main\n"
        "sys.argv = ['checkfu', 'kit', 'export', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 10000, 'checkfu.cli.kit' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    assert done.stdout.splitlines()[-1] == "True True True", done.stdout[-500:]
