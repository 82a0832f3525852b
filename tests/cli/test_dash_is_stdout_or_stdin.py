"""``-`` names stdout wherever a command writes a named file, and stdin wherever it reads one: no command makes a file
(or a directory) called ``-``, and a full path still names a file of that name. On the memory and host-process
providers: no engine."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE

from .test_run_cli import CHECKFU, Cli, isolated_cli, profile_file


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


def fed(cli: Cli, stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``checkfu ARGS`` with ``stdin`` on its stdin, in the CLI's home."""
    return subprocess.run(
        [str(CHECKFU), *args], input=stdin, cwd=cli.home, env=cli.env({}), capture_output=True, timeout=90, check=False
    )


def no_dash_file(cli: Cli) -> None:
    assert not (cli.home / "-").exists(), "a file called - was made"


def test_run_json_dash_writes_the_summary_to_stdout_after_the_commands_output(cli: Cli) -> None:
    prof = profile_file(cli.home, base_image=MEMORY_IMAGE, name="memory.toml")
    done = cli("run", "-q", "--provider", "memory", "--profile", str(prof), "--json", "-", "--", "echo", "hi")
    assert done.code == 0, str(done)
    own, _, summary = done.out.partition(b"\n")
    assert own == b"hi"
    assert json.loads(summary)["exit_code"] == 0
    no_dash_file(cli)


def test_a_refused_run_writes_its_json_to_stdout_too(cli: Cli) -> None:
    done = cli("run", "--provider", "memory", "--json", "-", "--", "")
    assert done.code != 0
    assert json.loads(done.out)["ok"] is False
    no_dash_file(cli)


def test_grade_html_dash_writes_only_the_page_to_stdout(cli: Cli) -> None:
    done = cli("provider", "grade", "host-process", "--html", "-")
    assert done.code == 0, str(done)
    assert done.out.startswith(b"<!doctype html>") and done.out.rstrip().endswith(b"</html>")
    no_dash_file(cli)


def test_provider_test_json_and_junit_dash_write_to_stdout(cli: Cli) -> None:
    done = cli("provider", "test", "host-process", "--case", "1", "--json", "-")
    assert json.loads(done.out)["target"] == "host-process", str(done)
    junit = cli("provider", "test", "host-process", "--case", "1", "--junit", "-")
    assert junit.out.startswith(b"<?xml") and b"<testsuites>" in junit.out, str(junit)
    no_dash_file(cli)


def test_profile_init_dash_prints_the_profile_and_profile_check_dash_reads_stdin(cli: Cli) -> None:
    made = cli("profile", "init", "-")
    assert made.code == 0, str(made)
    assert b'tier = "container"' in made.out
    no_dash_file(cli)
    checked = fed(cli, made.out, "profile", "check", "-", "--json")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["ok"] is True
    as_json = json.dumps(json.loads(checked.stdout)["profile"]).encode()  # stdin holds JSON: read as JSON
    again = fed(cli, as_json, "profile", "check", "-", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["ok"] is True, again.stderr


def test_run_profile_dash_reads_the_profile_from_stdin(cli: Cli) -> None:
    prof = profile_file(cli.home, base_image=MEMORY_IMAGE, name="memory.toml")
    done = fed(cli, prof.read_bytes(), "run", "-q", "--provider", "memory", "--profile", "-", "--", "echo", "ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"ok\n"


def test_a_full_path_still_names_a_file_called_dash(cli: Cli) -> None:
    done = cli("profile", "init", str(cli.home / "-"))
    assert done.code == 0, str(done)
    assert (cli.home / "-").read_text().startswith("#")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("kit", "export", "-"), "DIRECTORY"),
        (("keys", "generate", "--out", "-"), "--out"),
    ],
)
def test_an_option_that_names_no_single_file_refuses_dash_by_name(cli: Cli, args: tuple[str, ...], option: str) -> None:
    done = cli(*args)
    assert done.code == 2, str(done)
    said = " ".join(done.err.replace("│", " ").split())
    assert option in said and "- means stdout or stdin" in said, str(done)
    no_dash_file(cli)
    assert not (cli.home / "-.pub").exists()


def test_capture_dir_dash_is_refused_before_any_work(cli: Cli) -> None:
    done = cli("run", "--provider", "memory", "--capture", "/tmp/x", "--capture-dir", "-", "--json", "-", "--", "true")
    assert done.code == 125, str(done)
    error = json.loads(done.out)["error"]
    assert (error["code"], error["field"]) == ("SandboxPathRejected", "capture-dir")
    no_dash_file(cli)
