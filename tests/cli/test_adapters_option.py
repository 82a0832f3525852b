"""``--adapters FILE`` and ``CHECKFU_ADAPTERS``: an operator's adapters file, on every command that builds a registry.

The file is TOML, ``[[adapters]]`` tables of ``factory`` (an entry point name or ``module:callable``) and
``options`` (``checkfu.core.registry.read_adapters_file``). Through it ``SandboxAdapterAmbiguous`` (two adapters
advertising one target) and ``SandboxAdapterUnavailable`` (an adapter that cannot load, named with its reason) reach
the person at ``checkfu``, on ``run``, ``submit``, ``sandbox create``, ``runner serve`` and ``runner reconcile``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE
from checkfu.testing.memory import memory_envelope

from .test_run_cli import CHECKFU, Cli, isolated_cli, profile_file


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


def _toml(value: Any) -> str:
    """``value`` (JSON-like) as a TOML value: tables inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _envelope(provider: str) -> str:
    """The memory envelope under another provider name, as a TOML inline table."""
    doc: dict[str, Any] = json.loads(memory_envelope().model_dump_json())
    doc["provider"] = provider
    return _toml(doc)


def adapters_file(where: Path, *tables: str, name: str = "adapters.toml") -> Path:
    path = where / name
    path.write_text("\n".join(f"[[adapters]]\n{t}\n" for t in tables), encoding="utf-8")
    return path


TWICE = ('factory = "memory"', 'factory = "checkfu.testing.memory:create"')
"""The memory provider twice over: by its entry point name, and by its factory."""
ACME = f'factory = "checkfu.testing.memory:create"\noptions = {{ envelope = {_envelope("acme")} }}'
BROKEN = 'factory = "no.such.module:create"'


@pytest.fixture
def memory_profile(tmp_path: Path) -> Path:
    return profile_file(tmp_path, base_image=MEMORY_IMAGE, name="memory.toml")


def _run(cli: Cli, profile: Path, *args: str, **env: str) -> Any:
    return cli("run", "--profile", str(profile), *args, "--", "echo", "ran", **env)


def test_an_adapters_file_loading_one_target_twice_is_ambiguous_naming_every_source(
    cli: Cli, memory_profile: Path, tmp_path: Path
) -> None:
    path = adapters_file(tmp_path, *TWICE)
    summary = tmp_path / "summary.json"
    done = _run(cli, memory_profile, "--provider", "memory", "--adapters", str(path), "--json", str(summary))
    assert done.code == 125, str(done)
    assert done.out == b"", str(done)
    assert "SandboxAdapterAmbiguous" in done.said and f"{path}#0" in done.said and f"{path}#1" in done.said
    doc = json.loads(summary.read_text())
    assert doc["ok"] is False and doc["error"]["code"] == "SandboxAdapterAmbiguous"
    # CHECKFU_ADAPTERS names the same file as a default.
    again = _run(cli, memory_profile, "--provider", "memory", CHECKFU_ADAPTERS=str(path))
    assert again.code == 125 and "SandboxAdapterAmbiguous" in again.said, str(again)
    # Without it, the installed memory provider alone is there, and runs.
    assert _run(cli, memory_profile, "--provider", "memory").code == 0


def test_a_factory_that_cannot_load_is_named_with_its_reason(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    path = adapters_file(tmp_path, BROKEN)
    done = _run(cli, memory_profile, "--provider", "stranger", "--adapters", str(path))
    assert done.code == 125, str(done)
    assert "SandboxAdapterUnavailable" in done.said, str(done)
    assert f"{path}#0" in done.said and "no.such.module:create" in done.said and "No module named" in done.said


def test_an_adapter_from_the_file_is_run_by_its_provider_name(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    path = adapters_file(tmp_path, ACME)
    done = _run(cli, memory_profile, "--provider", "acme", "--adapters", str(path))
    assert done.code == 0, str(done)
    assert done.out == b"ran\n" and "acme@memory 1" in done.said
    # Not installed, and no file: refused by name before anything is asked.
    refused = _run(cli, memory_profile, "--provider", "acme")
    assert refused.code == 125 and "no provider named 'acme'" in refused.said, str(refused)


def test_an_adapters_file_that_cannot_be_read_is_refused_before_any_work(
    cli: Cli, memory_profile: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[adapters]\nfactory = ", encoding="utf-8")
    for given in (["--adapters", str(bad)], ["--adapters", str(tmp_path / "absent.toml")]):
        done = _run(cli, memory_profile, "--provider", "memory", *given)
        assert done.code == 125, str(done)
        assert "SandboxAdapterUnavailable" in done.said and "adapters file" in done.said, str(done)
        assert not cli.journal_path.exists()  # refused with the inputs: not even the journal was opened


def test_submit_takes_a_provider_of_the_adapters_file(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    path = adapters_file(tmp_path, ACME)
    done = cli("submit", "--profile", str(memory_profile), "--provider", "acme", "--adapters", str(path), "--", "true")
    assert done.code == 0, str(done)
    assert done.out.decode().startswith("run-")
    refused = cli("submit", "--profile", str(memory_profile), "--provider", "acme", "--", "true")
    assert refused.code == 1 and "no provider named 'acme'" in refused.said, str(refused)
    absent = str(tmp_path / "no")
    bad = cli("submit", "--profile", str(memory_profile), "--provider", "acme", "--adapters", absent, "--", "true")
    assert bad.code == 1 and "SandboxAdapterUnavailable" in bad.said, str(bad)


def test_sandbox_create_is_ambiguous_too(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    path = adapters_file(tmp_path, *TWICE)
    done = cli(
        "sandbox", "create", "--provider", "memory", "--profile", str(memory_profile), "--adapters", str(path), "--json"
    )
    assert done.code != 0, str(done)
    assert "SandboxAdapterAmbiguous" in done.said or "SandboxAdapterAmbiguous" in done.out.decode(), str(done)
    made = cli(
        "sandbox", "create", "--provider", "acme", "--profile", str(memory_profile), "--json",
        CHECKFU_ADAPTERS=str(adapters_file(tmp_path, ACME, name="acme.toml")),
    )  # fmt: skip
    assert made.code == 0, str(made)
    sandbox = json.loads(made.out)["sandbox_id"]
    removed = cli("sandbox", "rm", sandbox, CHECKFU_ADAPTERS=str(tmp_path / "acme.toml"))
    assert removed.code == 0, str(removed)


def test_reconcile_refuses_an_ambiguous_registry(cli: Cli, tmp_path: Path) -> None:
    path = adapters_file(tmp_path, *TWICE)
    done = cli("runner", "reconcile", "--adapters", str(path))
    assert done.code == 1, str(done)
    assert "SandboxAdapterAmbiguous" in done.said and f"{path}#0" in done.said and f"{path}#1" in done.said
    assert cli("runner", "reconcile", "--adapters", str(adapters_file(tmp_path, ACME, name="acme.toml"))).code == 0


def test_runner_serve_loads_the_adapters_file(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    """A queued Run of a provider from the file, and one whose provider the file makes ambiguous."""
    acme = adapters_file(tmp_path, ACME, *TWICE)
    ids = []
    for provider in ("acme", "memory"):
        done = cli("submit", "--profile", str(memory_profile), "--provider", provider, "--adapters", str(acme), "--",
                   "true")  # fmt: skip
        assert done.code == 0, str(done)
        ids.append(done.out.decode().strip())
    log = tmp_path / "serve.jsonl"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(CHECKFU), "runner", "serve", "--json", "--poll", "0.05", "--adapters", str(acme)],
            env=cli.env({}), stdout=out, stderr=subprocess.DEVNULL, cwd=tmp_path,
        )  # fmt: skip
    try:
        settled: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while len(settled) < 2 and time.monotonic() < deadline and proc.poll() is None:
            for line in log.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "settled":
                    settled[event["run_id"]] = event["status"]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert settled == {ids[0]: "succeeded", ids[1]: "refused:SandboxAdapterAmbiguous"}, log.read_text()


@pytest.mark.parametrize(
    "command", [["run"], ["submit"], ["sandbox", "create"], ["runner", "serve"], ["runner", "reconcile"]]
)
def test_help_names_the_option_and_the_variable(cli: Cli, command: list[str]) -> None:
    done = cli(*command, "--help")
    assert done.code == 0, str(done)
    text = " ".join(done.out.decode().split())
    assert "--adapters" in text and "CHECKFU_ADAPTERS" in text, text
