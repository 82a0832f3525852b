"""What the ``checkfu`` command imports before it does anything (issue 18): a regression guard, not a speed assertion.

Each case runs the installed console script in a fresh interpreter under ``-X importtime`` and reads which modules
were imported; ``bench/run B15`` measures the time.
"""

from __future__ import annotations

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
