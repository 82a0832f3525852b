"""The runner's front door (issue 31): ``checkfu.runner`` is the one pinned face every other face stands on.

- its public names are pinned, and importing it loads no database driver, model library or CLI;
- no file outside ``checkfu/cli`` imports the CLI, and no face builds a ``Runner`` (or a fleet member, or a sandbox
  host) except through ``RunnerService``;
- a ``RunnerConfig`` given in full is honoured: the journal, captures and tag are where it says, not where the
  environment would put them.
"""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import checkfu.runner
from checkfu.contract.errors import SandboxProfileInvalid
from checkfu.runner import QuietObserver, RunnerConfig, RunnerService

SRC = Path(checkfu.runner.__file__).resolve().parents[1]
"""``src/checkfu``."""

PUBLIC = ["ConfigError", "JobResult", "LiveSandbox", "Observer", "QuietObserver", "RunnerConfig", "RunnerService"]
"""A copy of ``checkfu.runner.__all__``, sorted. Changing the public face means changing this list."""

SERVICE_METHODS = {
    "aclose",
    "adapters",
    "all_adapters",
    "attach_sandbox",
    "choose",
    "clone_sandbox",
    "close",
    "create_sandbox",
    "delete_snapshot",
    "enroll",
    "enrolled_credential",
    "fleet",
    "grade",
    "keep_house",
    "let_go",
    "open",
    "open_async",
    "pool_drain",
    "pool_fill",
    "pool_ready",
    "profile",
    "reap_orphans",
    "reclaim_sandboxes",
    "reconcile",
    "record",
    "remote",
    "resume_snapshot",
    "run",
    "run_command",
    "runner",
    "sandboxes",
    "submit",
    "sweep_snapshots",
    "wait",
}

BUILT_ONLY_AT_THE_DOOR = {"Runner", "FleetRunner", "SandboxHost"}
"""What a face gets from ``RunnerService`` and never builds itself."""


def _sources(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_face_is_pinned() -> None:
    assert sorted(checkfu.runner.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(checkfu.runner, name) is not None
    public = {n for n in dir(RunnerService) if not n.startswith("_")} - {"tag"}
    assert public == SERVICE_METHODS
    with pytest.raises(AttributeError):
        _ = checkfu.runner.Journal  # type: ignore[attr-defined]


def test_importing_the_face_loads_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from checkfu.runner import RunnerConfig\n"
        "RunnerConfig()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'pydantic', 'typer', 'rich', 'docker', 'httpx', 'websockets') "
        "or m.startswith(('checkfu.cli', 'checkfu.core.journal', 'checkfu.wire')))\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_nothing_outside_the_cli_imports_the_cli() -> None:
    offenders = []
    for path in _sources(SRC):
        if path.is_relative_to(SRC / "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            offenders += [f"{path.relative_to(SRC)}:{node.lineno}" for n in names if n.startswith("checkfu.cli")]
    assert offenders == []


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found += [(node.lineno, node.module or "")]
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def test_the_cli_does_not_stand_on_the_sdk() -> None:
    """Two faces over one door: the command line reaches sandboxes through ``RunnerService``, not the SDK."""
    offenders = [
        f"{path.relative_to(SRC)}:{line} {name}"
        for path in _sources(SRC / "cli")
        for line, name in _imports(path)
        if name in ("checkfu.sandbox", "checkfu.Sandbox", "checkfu.AsyncSandbox") or name.startswith("checkfu.sandbox.")
    ]
    assert offenders == []


def test_every_face_gets_its_runner_through_the_front_door() -> None:
    """Only the session core itself (``checkfu/core``) and the front door (``checkfu/runner``) build a ``Runner``,
    a fleet member or a sandbox host; the CLI, the SDK, conformance and the rest ask ``RunnerService``."""
    built = []
    for path in _sources(SRC):
        if path.is_relative_to(SRC / "core") or path.is_relative_to(SRC / "runner"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in BUILT_ONLY_AT_THE_DOOR:
                    built.append(f"{path.relative_to(SRC)}:{node.lineno} {name}(")
    assert built == []


def test_the_grep_would_see_a_face_that_builds_its_own(tmp_path: Path) -> None:
    """The positive control of the test above: the same walk finds a ``Runner(`` where a face would write it."""
    face = tmp_path / "face.py"
    face.write_text("from checkfu.core.runner import Runner\nrunner = Runner(registry, journal, runner_tag='t')\n")
    calls = [
        n.func.id
        for n in ast.walk(ast.parse(face.read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    ]
    assert "Runner" in calls


def test_a_full_configuration_is_honoured_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "environment-state"
    monkeypatch.setenv("XDG_STATE_HOME", str(elsewhere))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", "from-the-environment")
    state = tmp_path / "platform-state"
    config = RunnerConfig(state_dir=state, tag="platform-a")

    async def go() -> tuple[int, bytes, str]:
        service = await RunnerService.open_async(config, notice=lambda _line: None)
        try:
            seen = QuietObserver()
            result = await service.run_command(
                "host-process", ["sh", "-c", "echo embedded"], observer=seen, captures=[]
            )
            rows = service.journal.allocations_for_run(result.run_id)
            return result.exit_code, bytes(seen.out), rows[0].runner_tag if rows else ""
        finally:
            service.close()

    code, out, tag = asyncio.run(go())
    assert (code, out) == (0, b"embedded\n")
    assert tag == "platform-a"
    assert (state / "journal.sqlite").exists()
    assert oct(os.stat(state).st_mode & 0o777) == "0o700"
    assert not elsewhere.exists()


def test_a_refused_profile_names_its_field_before_any_provider_work(tmp_path: Path) -> None:
    with pytest.raises(SandboxProfileInvalid) as refused:
        RunnerService.profile(
            {"tier": "container", "base_image": "host", "retention_mode": "sometimes"}, "host-process"
        )
    assert refused.value.field


def test_the_default_journal_is_in_the_state_directory(tmp_path: Path) -> None:
    config = RunnerConfig(state_dir=tmp_path / "s")
    assert config.journal() == f"sqlite+pysqlite:///{tmp_path / 's' / 'journal.sqlite'}"
    assert config.with_journal("sqlite+pysqlite:////elsewhere.sqlite").runner_tag().startswith(config.runner_tag())
    assert config.with_journal("sqlite+pysqlite:////elsewhere.sqlite").runner_tag() != config.runner_tag()


def test_the_journal_deadline_default_is_the_journals() -> None:
    from checkfu.core.journal import DEFAULT_JOURNAL_DEADLINE  # noqa: PLC0415
    from checkfu.runner.config import DEFAULT_JOURNAL_DEADLINE as DOOR  # noqa: PLC0415

    assert DOOR == DEFAULT_JOURNAL_DEADLINE
