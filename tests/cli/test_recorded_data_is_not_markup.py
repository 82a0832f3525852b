"""Everything recorded is data, never rich markup: an argv of ``[/]`` crashed ``runs list`` and ``runs show``
for everyone on that journal, and ``runs show`` swallowed the ``[local]`` of adapter names.

Two guards. A Run recorded with hostile text in every field it keeps is shown verbatim by ``runs list``,
``runs show`` and ``runner reconcile``. And a static check over ``src/checkfu/cli``: every value interpolated
into text that rich parses as markup is escaped, a number, or plain ``Text``, so the class cannot come back.
"""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.contract.codec import decode_value
from checkfu.contract.target import ExecutionTarget
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.leases import LeaseStore
from checkfu.testing import memory_envelope

CLI = Path(__file__).resolve().parents[2] / "src" / "checkfu" / "cli"
HOSTILE = ["echo", "[/]", "[bold red]x[/bold red]", "[link=https://example.invalid]y[/link]", "\\[z]", "[/"]


def hostile_target() -> ExecutionTarget:
    doc = json.loads(memory_envelope().target.model_dump_json())
    doc["provider_revision"] = "memory [local] 1"
    return decode_value(ExecutionTarget, doc)


@pytest.fixture
def journal_url(tmp_path: Path) -> str:
    url = sqlite_url(tmp_path / "journal.sqlite")
    journal = Journal(url)
    try:
        target = hostile_target()
        journal.start_run("run-[/]", runner_tag="[bold]tag", target=target, now=1.0, command=HOSTILE)
        lease = LeaseStore(journal, ManualClock(start=1.0), ttl=1.0).acquire("run-[/]")
        journal.journal_allocation(
            "ak-[/]", run_id="run-[/]", kind="instance", target=target, runner_tag="[bold]tag",
            lease_id=lease.lease_id, now=1.0,
        )  # fmt: skip
        journal.record_event(
            "run-[/]", "provision", started_at=1.0, duration_ms=1.0, outcome="error",
            allocation_key="ak-[/]", error_code="SandboxProviderFailed", detail="[/] [red]detail[/red] [local]",
        )  # fmt: skip
        journal.finish_run("run-[/]", status="refused:[/]", now=2.0, exit_code=None)
    finally:
        journal.close()
    return url


def invoke(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400", **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "MarkupError" not in result.output and "Traceback" not in result.output, result.output
    return result.stdout + result.stderr


def test_runs_list_shows_recorded_text_verbatim(journal_url: str) -> None:
    out = invoke("runs", "list", "--db", journal_url)
    assert shlex.join(HOSTILE) in out
    assert "memory [local] 1" in out and "run-[/]" in out and "refused:[/]" in out


def test_runs_show_shows_recorded_text_verbatim(journal_url: str) -> None:
    out = invoke("runs", "show", "run-[", "--db", journal_url)
    assert shlex.join(HOSTILE) in out
    assert "[test]" in out and "memory [local] 1" in out  # the placement and the revision, not swallowed
    assert "[/] [red]detail[/red] [local]" in out and "ak-[/]" in out


def test_runs_show_json_is_untouched(journal_url: str) -> None:
    shown = json.loads(CliRunner().invoke(app, ["runs", "show", "run-[", "--db", journal_url, "--json"]).stdout)
    assert shown["command"] == HOSTILE


def test_reconcile_reports_recorded_keys_verbatim(journal_url: str, tmp_path: Path) -> None:
    out = invoke(
        "runner", "reconcile", "--db", journal_url, "--provider", "host-process",
        env={"CHECKFU_RUNNER_TAG": "[bold]tag", "XDG_STATE_HOME": str(tmp_path / "state")},
    )  # fmt: skip
    assert "ak-[/]" in out  # left: its adapter is not loaded


# The static guard ---------------------------------------------------------------------------------

SINKS = {"print", "add_row", "add_task", "Table", "log", "say"}
"""Calls whose string arguments rich parses as markup (``say``: run's observer, which prints its argument)."""
RENDERABLES = {"table"}
"""Names that hold a rich renderable (its cells are checked where they are added)."""
STYLE_NAMES = {"colour", "style", "said"}
"""Names that hold a style this code chose from a literal table, interpolated inside ``[...]`` on purpose, or
(``said``) a lead-in of markup this code built with every value in it escaped."""
NUMERIC_SPECS = tuple("dfegn%")


def _safe(node: ast.expr) -> bool:
    """An expression whose text cannot be markup: escaped, a number by its format, plain Text, a literal."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("escape", "Text", "len"):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return all(_safe(a) for a in node.args)  # "sep".join(parts): safe when each part is
    if isinstance(node, ast.GeneratorExp | ast.ListComp):
        return _safe(node.elt)
    if isinstance(node, ast.List | ast.Tuple):
        return all(_safe(e) for e in node.elts)
    if isinstance(node, ast.BinOp):
        return _safe(node.left) and _safe(node.right)
    if isinstance(node, ast.IfExp):
        return _safe(node.body) and _safe(node.orelse)
    if isinstance(node, ast.Name) and node.id in STYLE_NAMES | RENDERABLES:
        return True
    return isinstance(node, ast.JoinedStr) and all(_safe_part(v) for v in node.values)


def _safe_part(value: ast.expr) -> bool:
    if not isinstance(value, ast.FormattedValue):
        return True
    spec = value.format_spec
    if isinstance(spec, ast.JoinedStr):
        text = "".join(str(c.value) for c in spec.values if isinstance(c, ast.Constant))
        if text.endswith(NUMERIC_SPECS):
            return True
    return _safe(value.value)


def _markup_off(call: ast.Call) -> bool:
    return any(
        k.arg == "markup" and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords
    )


def _unsafe_arguments(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute | ast.Name):
            continue
        if isinstance(node.func, ast.Name) and node.func.id == "print":
            continue  # the builtin print parses no markup
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if name not in SINKS or _markup_off(node):
            continue
        found.extend((arg.lineno, ast.unparse(arg)) for arg in node.args if not _safe(arg))
    return found


def test_every_interpolation_into_markup_in_the_cli_is_escaped() -> None:
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        if path.name == "consoles.py":
            continue  # the console itself: its ``print`` hands its caller's arguments on to rich's, unchanged
        for line, text in _unsafe_arguments(ast.parse(path.read_text())):
            offenders.append(f"{path.name}:{line}: {text}")
    assert offenders == [], "interpolated into markup without escape():\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("source", "unsafe"),
    [
        ('err.print(f"run {r.run_id}")', True),
        ('err.print(f"run {escape(r.run_id)}")', False),
        ('err.print(f"{n:d} passed")', False),
        ("table.add_row(r.status)", True),
        ("table.add_row(Text(r.status))", False),
        ('err.print("a " + ", ".join(xs))', True),
        ('err.print("a " + escape(", ".join(xs)))', False),
        ('err.print(f"run {r.run_id}", markup=False)', False),
    ],
)
def test_the_static_guard_can_fail(source: str, unsafe: bool) -> None:
    assert bool(_unsafe_arguments(ast.parse(source))) is unsafe
