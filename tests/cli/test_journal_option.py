"""A journal that cannot be opened is a usage error naming --db, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECKFU = str(Path(sys.executable).with_name("checkfu"))


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["runs", "list", "--db", "garbage://"], "Can't load plugin"),
        (["runs", "list", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x"], "connection"),
        (["runner", "reconcile", "--db", "garbage://"], "Can't load plugin"),
    ],
)
def test_an_unopenable_journal_is_a_usage_error(args: list[str], reason: str, tmp_path: Path) -> None:
    # a refused connection is retried for the journal's deadline (30 s by default) before it is reported: 2 s here
    env = {"XDG_STATE_HOME": str(tmp_path), "CHECKFU_JOURNAL_DEADLINE": "2"}
    done = subprocess.run([CHECKFU, *args], check=False, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "--db" in done.stderr
    assert "cannot open the journal" in done.stderr
    assert reason in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_runs_list_needs_a_positive_limit(limit: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [CHECKFU, "runs", "list", "--limit", limit],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"XDG_STATE_HOME": str(tmp_path)},
    )
    assert done.returncode == 2
    assert "--limit" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_runner_tag_names_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two journals of one state directory get two tags, so a reconcile on one never matches the other's
    sandboxes; every spelling of one journal gets one tag; the default journal keeps the state directory's."""
    from checkfu.cli.state import default_journal_url, runner_tag  # noqa: PLC0415

    monkeypatch.delenv("CHECKFU_RUNNER_TAG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    base = runner_tag()
    assert base.startswith("runner-") and runner_tag(None) == base == runner_tag(default_journal_url())
    other = runner_tag("sqlite:///other.sqlite")
    assert other != base and other.startswith(base + "-j")
    assert runner_tag(f"sqlite+pysqlite:///{tmp_path}/other.sqlite") == other  # the same file, spelled otherwise
    (tmp_path / "link.sqlite").symlink_to(tmp_path / "other.sqlite")
    assert runner_tag("sqlite:///link.sqlite") == other
    assert runner_tag("sqlite:///third.sqlite") not in (base, other)
    pg = "postgresql+psycopg://u:secret@DB.example:5432/j"
    assert runner_tag(pg) == runner_tag("postgresql://u:other@db.example:5432/j") != base
    assert "secret" not in runner_tag(pg)
    local = runner_tag("postgresql://u@localhost/j")  # one database, however its loopback and port are spelled
    assert local == runner_tag("postgresql+psycopg://u@127.0.0.1:5432/j") == runner_tag("postgresql://u@[::1]/j")
    assert local != runner_tag("postgresql://u@localhost:5433/j")
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", "pinned")
    assert runner_tag("sqlite:///other.sqlite") == "pinned"
