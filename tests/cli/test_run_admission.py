"""``checkfu run`` checks every input before any provider call, and a refusal lists every problem (issues 10, 16).

Each refusal exits 125, runs nothing and allocates nothing: no Run is journaled and no provider is asked
anything (the tier is the host-process one, which needs no engine; the Docker tier refuses the same way,
before it is even described). Issue 16's defect 12 each have a case: a relative ``--capture``, an
unwritable ``--capture-dir``, more than 4096 arguments, arguments that are not UTF-8, an invalid
``CHECKFU_RUNNER_TAG``, a 300-byte name in a mount, and a working directory in ``/proc``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .test_run_cli import CHECKFU, Cli, git, isolated_cli, profile_file

HOST = ["--provider", "host-process"]


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


def refused(cli: Cli, done: object) -> None:
    """Nothing ran: no Run in the journal, no provider state made."""
    assert not cli.journal_path.exists() or cli.json("runs", "list") == []
    assert not (cli.state / "checkfu" / "host-process" / "instances").exists() or not any(
        (cli.state / "checkfu" / "host-process" / "instances").iterdir()
    )


def _long_name_repo(where: Path) -> Path:
    repo = where / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    blob = (
        subprocess.run(
            ["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=b"x\n", capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},dir/{'n' * 300}")
    git(repo, "commit", "-q", "-m", "a name no file system holds")
    return repo


CASES: dict[str, Callable[[Path], tuple[list[str], dict[str, str], str]]] = {
    "relative-capture": lambda d: (["--capture", "out/report.xml"], {}, "must be absolute"),
    "unwritable-capture-dir": lambda d: (
        ["--capture", "/tmp/x", "--capture-dir", str(d / "ro" / "inside")],
        {},
        "cannot be written",
    ),
    "argv-count": lambda d: ([], {}, "4097 arguments"),
    "invalid-runner-tag": lambda d: ([], {"CHECKFU_RUNNER_TAG": "has spaces/and slashes"}, "CHECKFU_RUNNER_TAG"),
    "long-name-in-mount": lambda d: (["--mount", f"{_long_name_repo(d)}@main:/w"], {}, "300 bytes"),
    "proc-workdir": lambda d: (["-w", "/proc/self/fd/7"], {}, "inside /proc"),
    "long-workdir-name": lambda d: (["-w", "/" + "w" * 300], {}, "300 bytes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_input_is_refused_before_any_work(cli: Cli, tmp_path: Path, case: str) -> None:
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    args, env, phrase = CASES[case](tmp_path)
    command = ["echo"] * 4097 if case == "argv-count" else ["true"]
    if os.geteuid() == 0 and case == "unwritable-capture-dir":
        args[-1] = "/proc/sys/checkfu/inside"  # root writes wherever a mode allows; in /proc/sys it cannot
    done = cli("run", *HOST, *args, "--", *command, **env)
    assert done.code == 125, str(done)
    assert phrase in done.said, str(done)
    refused(cli, done)


def test_arguments_that_are_not_utf8_are_refused_before_any_work(cli: Cli) -> None:
    argv = [os.fsencode(str(CHECKFU)), b"run", *[a.encode() for a in HOST], b"--", b"echo", b"caf\xe9"]
    proc = subprocess.run(argv, capture_output=True, env=cli.env({}), cwd=cli.home, timeout=60, check=False)
    assert proc.returncode == 125, proc.stderr.decode(errors="replace")
    assert "argv.1" in proc.stderr.decode(errors="replace") and "UTF-8" in proc.stderr.decode(errors="replace")
    refused(cli, proc)


def test_a_refusal_lists_every_problem_with_unknown_keys_named(cli: Cli, tmp_path: Path) -> None:
    prof = profile_file(tmp_path, base_image="host", extra="bogus = 1\n[surprise]\nx = 1", network="unrestricted")
    done = cli(
        "run",
        *HOST,
        "--profile",
        str(prof),
        "-e",
        "9LIVES=x",
        "--capture",
        "relative",
        "--mount",
        f"{tmp_path}:not-absolute",
        "-w",
        "/sys/kernel",
        "--",
        "true",
    )
    assert done.code == 125, str(done)
    said = done.said
    for phrase in (
        "problems, nothing was run or allocated",
        "unknown key 'bogus'",
        "unknown key 'surprise'",
        "'9LIVES' is not an environment name",
        "capture path 'relative' must be absolute",
        "mount target 'not-absolute' must be absolute",
        "inside /sys",
    ):
        assert phrase in said, f"{phrase!r}:\n{done}"
    assert said.count("'9LIVES' is not an environment name") == 1, said  # each problem once, where it was given
    refused(cli, done)


def test_json_summary_of_a_refusal(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    done = cli("run", *HOST, "--json", str(out), "-e", "1X=y", "--", "true")
    assert done.code == 125
    import json  # noqa: PLC0415

    body = json.loads(out.read_text())
    assert body["ok"] is False and body["exit_code"] == 125
    assert body["error"]["code"] == "SandboxProfileInvalid" and "1X" in body["error"]["message"]


def test_no_profile_runs_in_the_built_in_default_named_in_the_summary(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    done = cli("run", *HOST, "--json", str(out), "--", "true")
    assert done.code == 0, str(done)
    assert "profile built-in default for the host-process tier" in done.said
    # named in the closing summary and in its JSON, not only in the progress lines above them
    summary = done.said[done.said.index(" run run-") :]
    assert "profile built-in default for the host-process tier" in summary, done.said
    import json  # noqa: PLC0415

    assert json.loads(out.read_text())["profile"] == "built-in default for the host-process tier"
