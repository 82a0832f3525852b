"""A command started cold (no start-up server, as scripts and CI run it) loads only what it uses (issue 31).

``checkfu --version`` and ``checkfu ps`` on a journal with nothing to list or reclaim load no third-party module
and only the checkfu modules pinned here; ``ps`` then prints exactly what the full command prints, and as soon as
there is anything to show, the full command runs (the quick path is a shortcut, never another answer).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys

import pytest

from checkfu.cli import quick
from checkfu.core import migrate

from .test_run_cli import CHECKFU, Cli, cli  # noqa: F401 - fixture

HEAVY = ("sqlalchemy", "pydantic", "pydantic_core", "typer", "click", "rich", "docker", "httpx", "websockets", "yaml")

PROBE = """
import atexit, sys
def _report():
    mods = sorted(m for m in sys.modules if m == 'checkfu' or m.startswith('checkfu.'))
    heavy = sorted({m.split('.')[0] for m in sys.modules} & set(%r))
    sys.stderr.write('MODULES ' + repr((mods, heavy)) + '\\n')
atexit.register(_report)
sys.argv = ['checkfu'] + %r
from checkfu.cli import main
main()
"""


def loaded(cli: Cli, *args: str) -> tuple[list[str], list[str], str]:  # noqa: F811
    """The checkfu modules and the heavy third-party ones that ``checkfu ARGS`` loaded, and what it printed."""
    done = cli.exec([sys.executable, "-c", PROBE % (HEAVY, list(args))], CHECKFU_SERVER="off")
    assert done.code == 0, str(done)
    line = next(x for x in done.err.splitlines() if x.startswith("MODULES "))
    mods, heavy = eval(line.removeprefix("MODULES "))
    return mods, heavy, done.out.decode()


def full(cli: Cli, *args: str) -> str:  # noqa: F811
    """What the full command prints (the quick path skipped)."""
    code = f"import sys; sys.argv = ['checkfu'] + {list(args)!r}\nfrom checkfu.cli import run_here\nrun_here()\n"
    done = cli.exec([sys.executable, "-c", code], CHECKFU_SERVER="off")
    assert done.code == 0, str(done)
    return done.out.decode()


def test_version_loads_nothing_but_itself(cli: Cli) -> None:  # noqa: F811
    mods, heavy, out = loaded(cli, "--version")
    assert (mods, heavy) == (["checkfu", "checkfu.cli"], [])
    assert out.startswith("checkfu ")


def test_ps_on_an_empty_journal_loads_no_library_and_says_what_the_full_command_says(cli: Cli) -> None:  # noqa: F811
    assert cli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}  # makes the journal
    for args in (["ps"], ["ps", "--json"], ["ps", "--db", f"sqlite:///{cli.journal_path}", "--json"]):
        mods, heavy, out = loaded(cli, *args)
        assert (mods, heavy) == (["checkfu", "checkfu.cli", "checkfu.cli.quick"], []), args
        assert out == full(cli, *args), args


def test_ps_with_a_live_sandbox_takes_the_full_path_and_lists_it(cli: Cli) -> None:  # noqa: F811
    made = cli.json("sandbox", "create", "--provider", "host-process", "--ttl", "5m")
    try:
        mods, heavy, out = loaded(cli, "ps", "--json")
        assert "sqlalchemy" in heavy and "checkfu.cli.sandbox" in mods
        assert [s["id"] for s in json.loads(out)["sandboxes"]] == [made["sandbox_id"]]
    finally:
        assert cli("sandbox", "rm", made["sandbox_id"]).code == 0
    mods, heavy, out = loaded(cli, "ps", "--json")
    assert heavy == [] and json.loads(out)["sandboxes"] == []


def test_the_quick_path_steps_aside_when_only_the_full_command_can_answer(
    cli: Cli,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cli("ps").code == 0
    monkeypatch.setenv("XDG_STATE_HOME", str(cli.state))
    monkeypatch.delenv("CHECKFU_JOURNAL_DEADLINE", raising=False)
    assert quick.ps(["ps"])  # the control: this journal is answered quickly
    assert not quick.ps(["ps", "--all"])  # an option it does not know
    assert not quick.ps(["ps", "--db", "postgresql://localhost/x"])  # another database
    monkeypatch.setenv("CHECKFU_JOURNAL_DEADLINE", "soon")  # the full command refuses it by name
    assert not quick.ps(["ps"])
    monkeypatch.delenv("CHECKFU_JOURNAL_DEADLINE")
    with sqlite3.connect(cli.journal_path) as conn:  # a journal that needs migrating
        conn.execute("UPDATE alembic_version SET version_num = '0005'")
    assert not quick.ps(["ps"])
    with sqlite3.connect(cli.journal_path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (migrate.HEAD,))
    os.chmod(cli.state / "checkfu", 0o755)  # a state directory the full command closes first
    assert not quick.ps(["ps"])
    assert cli("ps").code == 0
    assert (os.stat(cli.state / "checkfu").st_mode & 0o777) == 0o700


def test_the_quick_path_knows_the_schema_and_the_empty_listing() -> None:
    assert quick.HEAD == migrate.HEAD


@pytest.mark.parametrize("args", [["ps"], ["ps", "--json"]])
def test_the_installed_command_takes_the_quick_path(cli: Cli, args: list[str]) -> None:  # noqa: F811
    assert cli("ps").code == 0
    done = cli.exec([sys.executable, "-X", "importtime", str(CHECKFU), *args], CHECKFU_SERVER="off")
    assert done.code == 0
    assert "sqlalchemy" not in done.err and "checkfu.cli.quick" in done.err
