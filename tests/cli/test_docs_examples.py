"""Every example of docs/ and the README runs, on the Docker tier (issues 11, 29, 31 and 32).

Each ```python block of docs/sdk.md, docs/embedding.md, docs/mcp.md, docs/migrating.md and the README is run as it
is, from the repository root, in a process of its own with a state directory and runner tag of this test's. Each
shell block (```sh, ```bash, ```console) of every page of docs/ and the README is run as docs/README.md says
("Examples in these pages"): from one scratch directory (a copy of examples/ and a small src/) with one state
directory for them all, unless an ``<!-- not run: REASON -->`` comment just before it gives the reason;
``<!-- exit: N -->`` says which exit status a refusal's example ends with. After each, nothing labelled with the tag
is left on the engine and no sandbox, Run or snapshot is live.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .test_run_cli import CHECKFU, REPO, Cli
from .test_run_docker import dcli, docker_cli, engine, leftovers  # noqa: F401 - fixtures

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


# Shell examples ----------------------------------------------------------------------------------------------

PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
SHELLS = ("sh", "bash", "shell", "console")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!--\s*(not run|exit):(.*?)-->\s*\Z", re.S)
MOST_NOT_RUN = 9
"""Exceptions stay few: a shell example that cannot run in a test says why, and there are at most this many (the
ninth: egress.md's published port, a server that runs until stopped, which tests/cli/test_ports_docker.py runs)."""


@dataclass(frozen=True)
class ShellExample:
    name: str
    script: str
    exit: int = 0
    not_run: str | None = None


def console_script(block: str) -> str:
    """The commands of a ```console block: each line that starts with ``$ ``, and the lines a ``\\`` continues it
    onto; every other line is output shown."""
    commands: list[str] = []
    going_on = False
    for line in block.splitlines():
        if going_on:
            commands.append(line)
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            continue
        going_on = line.endswith("\\")
    return "\n".join(commands) + "\n"


def shell_examples() -> list[ShellExample]:
    out: list[ShellExample] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        n = 0
        for m in FENCE.finditer(text):
            lang, body = m.group(1), m.group(2)
            if lang not in SHELLS:
                continue
            n += 1
            name = f"{page.name}#sh{n}"
            mark = MARK.search(text[: m.start()])
            kind, said = (mark.group(1), mark.group(2).strip()) if mark else (None, "")
            script = console_script(body) if lang == "console" else body
            if kind == "not run":
                out.append(ShellExample(name, script, not_run=said))
            elif kind == "exit":
                out.append(ShellExample(name, script, exit=int(said)))
            else:
                out.append(ShellExample(name, script))
    return out


def unfenced_shell_lines() -> list[str]:
    """Shell commands in an indented (unfenced) code block: an example no test would run."""
    found: list[str] = []
    for page in PAGES:
        fenced = False
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"^ {4,}(\$ |checkfu |\./scripts/|\.venv/bin/)", line):
                found.append(f"{page.name}:{i}: {line.strip()}")
    return found


def test_every_shell_example_is_fenced_and_run_or_says_why_not() -> None:
    examples = shell_examples()
    assert len([e for e in examples if e.not_run is None]) >= 4, [e.name for e in examples]
    assert {"sandboxes.md#sh1", "pool.md#sh1", "README.md#sh1"} <= {e.name for e in examples}
    for e in examples:
        if e.not_run is not None:
            assert len(e.not_run) >= 10, f"{e.name}: <!-- not run: --> needs its reason, got {e.not_run!r}"
    assert len([e for e in examples if e.not_run is not None]) <= MOST_NOT_RUN, [
        (e.name, e.not_run) for e in examples if e.not_run is not None
    ]
    assert unfenced_shell_lines() == []


def test_a_console_block_runs_its_prompted_lines_only() -> None:
    block = "$ echo one \\\n    two\none two\n$ true\n"
    assert console_script(block) == "echo one \\\n    two\ntrue\n"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory, engine: Any) -> Iterator[tuple[Cli, Path]]:  # noqa: F811
    """One CLI (state directory, runner tag) for every shell example, and the directory they run in: a copy of
    examples/ and a small src/ of a project's."""
    home = tmp_path_factory.mktemp("docs-shell")
    work = home / "work"
    shutil.copytree(REPO / "examples", work / "examples")
    (work / "src" / "lib").mkdir(parents=True)
    (work / "src" / "README").write_text("a project to run in a sandbox\n", encoding="utf-8")
    (work / "src" / "lib" / "hello.sh").write_text("#!/bin/sh\necho hello\n", encoding="utf-8")
    with docker_cli(home, engine) as cli:
        yield cli, work


RUNNABLE = [e for e in shell_examples() if e.not_run is None]


@pytest.mark.parametrize("example", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_shell_example_runs(example: ShellExample, scratch: tuple[Cli, Path], engine: Any) -> None:  # noqa: F811
    cli, work = scratch
    env = cli.env({"PATH": f"{CHECKFU.parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", example.script],
        cwd=work,
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    said = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
    assert done.returncode == example.exit, f"{example.name} exited {done.returncode}, not {example.exit}:\n{said}"
    assert "Traceback" not in said, said
    assert cli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}, example.name
    assert not leftovers(engine, cli.tag), example.name
