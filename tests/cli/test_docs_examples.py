"""Every Python example of docs/sdk.md, docs/embedding.md, docs/mcp.md, docs/migrating.md and the README's sandbox
section runs, on the Docker tier (issues 11, 31 and 32).

Each ```python block is run as it is, from the repository root, in a process of its own with a state
directory and runner tag of this test's; nothing labelled with the tag is left on the engine and no
allocation is left open in the journal.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .test_run_cli import REPO, Cli
from .test_run_docker import dcli, engine, leftovers  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker

BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def examples() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for doc in (
        REPO / "docs" / "sdk.md",
        REPO / "docs" / "embedding.md",
        REPO / "docs" / "mcp.md",
        REPO / "docs" / "migrating.md",
        REPO / "README.md",
    ):
        for i, code in enumerate(BLOCK.findall(doc.read_text(encoding="utf-8"))):
            out.append((f"{doc.name}#{i + 1}", code))
    return out


def test_there_are_examples() -> None:
    names = [name for name, _ in examples()]
    assert len([n for n in names if n.startswith("sdk.md")]) >= 6
    assert any(n.startswith("README.md") for n in names)
    assert any(n.startswith("embedding.md") for n in names)
    assert any(n.startswith("mcp.md") for n in names)
    assert any(n.startswith("migrating.md") for n in names)


@pytest.mark.parametrize(("name", "code"), examples(), ids=[n for n, _ in examples()])
def test_example_runs(name: str, code: str, dcli: Cli, engine: Any, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=dcli.env({}), capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr.decode(errors='replace')[-3000:]}"
    # A detached sandbox or a snapshot an example left would be found here (and by the fixture).
    assert dcli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}
    assert not leftovers(engine, dcli.tag)
