"""The sandbox SDK's public face and the sandbox commands' refusals, without an engine (issue 11)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checkfu.cli.sandbox import parse_duration
from checkfu.contract.errors import SandboxProfileInvalid

from .test_run_cli import Cli, cli  # noqa: F401 - fixture


def test_public_names_are_pinned_and_loaded_lazily() -> None:
    code = (
        "import sys, checkfu\n"
        "assert 'checkfu.sandbox' not in sys.modules and 'checkfu.core' not in sys.modules\n"
        "assert {'Sandbox', 'AsyncSandbox'} <= set(checkfu.__all__)\n"
        "from checkfu import Sandbox, AsyncSandbox\n"
        "import checkfu.sandbox as s\n"
        "assert Sandbox is s.Sandbox and AsyncSandbox is s.AsyncSandbox\n"
        "print(sorted(s.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert json.loads(done.stdout.decode().replace("'", '"')) == [
        "AsyncProcess",
        "AsyncSandbox",
        "AsyncSandboxFiles",
        "CommandResult",
        "FileEntry",
        "OutputTruncatedWarning",
        "Process",
        "Sandbox",
        "SandboxFiles",
        "SnapshotInfo",
    ]


def test_version_does_not_load_the_sdk() -> None:
    checkfu = Path(sys.executable).with_name("checkfu")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(checkfu), "--version"], capture_output=True, check=True
    )
    assert b"checkfu.sandbox" not in done.stderr and b"checkfu.cli.sandbox" not in done.stderr


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("7d", 604800.0), ("45", 45.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--ttl") == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "8d", "1w", "1e9"])
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(SandboxProfileInvalid) as bad:
        parse_duration(text, "--ttl")
    assert bad.value.field == "ttl"


def test_a_snapshot_may_be_kept_longer_than_a_sandbox_lives_but_not_past_the_contract() -> None:
    assert parse_duration("30d", "--keep") == 30 * 86400.0
    for text in ("soon", "0", "40000d"):
        with pytest.raises(SandboxProfileInvalid) as bad:
            parse_duration(text, "--keep")
        assert bad.value.field == "keep"


def test_refusals_without_an_engine(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    bad_id = cli("exec", "--json", "nope", "--", "true")
    assert bad_id.code == 125
    assert json.loads(bad_id.out)["error"] == {
        "code": "SandboxNotFound",
        "message": "sandbox_id: 'nope' is not a sandbox id (sb-<hex>)",
        "field": "sandbox_id",
    }
    unknown = cli("exec", "sb-0123456789abcdef0123", "--", "true")
    assert unknown.code == 125 and "no sandbox 'sb-0123456789abcdef0123' in this journal" in unknown.said
    usage = cli("exec", "--no-such-flag", "sb-01", "--", "true")
    assert usage.code == 125, str(usage)
    for args in (
        ["snapshot", "sb-01", "--keep", "forever"],
        ["sandbox", "extend", "sb-01", "--ttl", "0"],
        ["resume", "snap-01", "--ttl", "9d"],
        ["clone", "sb-01", "--ttl", "x"],
    ):
        done = cli(*args, "--json")
        assert done.code == 125, str(done)
        assert json.loads(done.out)["error"]["code"] == "SandboxProfileInvalid", str(done)
    assert cli("resume", "sb-01").code == 125
    assert cli("kill", "nothing").code == 125
    cp = cli("cp", "--json", str(tmp_path), str(tmp_path / "b"))
    assert cp.code == 125 and json.loads(cp.out)["error"]["field"] == "path"
    assert cli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}


def test_a_sandbox_refuses_rw_sync_by_name(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    """Issue 32: ``:rw,sync`` copies back when a Run ends; a sandbox has no such end, so it is refused, not ignored."""
    done = cli("sandbox", "create", "--json", "--mount", f"{tmp_path}:/w:rw,sync")
    assert done.code == 125, str(done)
    error = json.loads(done.out)["error"]
    assert error["code"] == "SandboxProfileInvalid" and error["field"] == "mounts.0"
    assert "checkfu cp" in error["message"]
    assert cli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}
