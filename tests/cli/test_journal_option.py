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
    done = subprocess.run(
        [CHECKFU, *args], check=False, capture_output=True, text=True, timeout=60, env={"XDG_STATE_HOME": str(tmp_path)}
    )
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
