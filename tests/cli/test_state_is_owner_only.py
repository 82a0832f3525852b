"""What checkfu keeps of a Run is readable by the user who ran it and by no other local user.

The journal holds each Run's argv and its kept output (``checkfu logs``), a capture holds files read back
out of the sandbox: the state directory is made ``0700`` and every file checkfu makes in it ``0600`` (the
journal's SQLite side files too), and a capture directory it makes is ``0700`` wherever it is. Each test
runs the real ``checkfu`` in a home that other users can traverse, as ``/home/USER`` usually is, and then
tries to read what it left as user ``nobody`` (``setpriv``); a world-readable control file proves that
such a read would succeed if the modes allowed it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE

from .test_run_cli import Cli, isolated_cli, profile_file, run_id_of

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
SECRET_ARG = "argv-secret-7c1d"
SECRET_OUT = "output-secret-93ab"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="reading as another user needs root and setpriv"
)


def as_nobody(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*NOBODY, *argv], capture_output=True, timeout=30, check=False)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def home() -> Iterator[Path]:
    """A home other users may traverse (``0755``), holding one world-readable control file that ``nobody``
    must be able to read: without it, a refused read could be the harness's doing, not checkfu's."""
    home = Path(tempfile.mkdtemp(prefix="checkfu-owner-only-"))
    try:
        home.chmod(0o755)
        control = home / "control"
        control.write_text("anyone may read this\n")
        control.chmod(0o644)
        seen = as_nobody("cat", str(control))
        assert seen.returncode == 0 and seen.stdout == b"anyone may read this\n", seen
        yield home
    finally:
        shutil.rmtree(home)


@pytest.fixture
def cli(home: Path) -> Iterator[Cli]:
    with isolated_cli(home) as c:
        yield c


def unreadable_by_nobody(path: Path) -> None:
    """``nobody`` can neither read ``path`` (a file) nor list it (a directory)."""
    tried = as_nobody("ls", "-a", str(path)) if path.is_dir() else as_nobody("cat", str(path))
    assert tried.returncode != 0, f"nobody read {path}: {tried.stdout[:200]!r}"
    assert SECRET_ARG.encode() not in tried.stdout and SECRET_OUT.encode() not in tried.stdout


def test_a_runs_journal_and_its_captures_are_its_users_alone(cli: Cli, home: Path) -> None:
    profile = profile_file(home, base_image=MEMORY_IMAGE, name="memory.toml")
    data = home / "data"
    data.mkdir()
    (data / f"{SECRET_ARG}.txt").write_text(SECRET_OUT)
    inside = f"/data/{SECRET_ARG}.txt"
    done = cli(
        "run",
        "--profile",
        str(profile),
        "--provider",
        "memory",
        "--mount",
        f"{data}:/data",
        "--capture",
        inside,
        "--",
        "cat",
        inside,
    )
    assert done.code == 0 and done.out == SECRET_OUT.encode(), str(done)
    run_id = run_id_of(done)
    state = cli.state / "checkfu"
    captured = state / "captures" / run_id / "data" / f"{SECRET_ARG}.txt"
    assert captured.read_bytes() == SECRET_OUT.encode()
    kept = cli.journal_path.read_bytes()  # its write-ahead log was copied back into it as the journal closed
    assert SECRET_ARG.encode() in kept and SECRET_OUT.encode() in kept

    assert mode(cli.state) == 0o700  # $XDG_STATE_HOME itself, made by checkfu here
    assert mode(state) == 0o700
    for made in (state / "captures", state / "captures" / run_id, captured.parent):
        assert mode(made) == 0o700, made
    for kept in (cli.journal_path, captured, *state.glob("journal.sqlite-*")):
        assert mode(kept) == 0o600, kept
    for path in (state, cli.journal_path, captured):
        unreadable_by_nobody(path)

    shown = cli("logs", run_id)  # the user who ran it still reads it all
    assert shown.code == 0 and SECRET_OUT.encode() in shown.out, str(shown)
    page = home / "run.html"
    wrote = cli("runs", "show", run_id, "--html", str(page))
    assert wrote.code == 0 and SECRET_OUT in page.read_text(), str(wrote)
    assert mode(page) == 0o600
    unreadable_by_nobody(page)


def test_a_capture_dir_the_user_names_gets_private_files_and_directories(cli: Cli, home: Path) -> None:
    profile = profile_file(home, base_image=MEMORY_IMAGE, name="memory.toml")
    named = home / "named"
    named.mkdir(mode=0o755)
    named.chmod(0o755)
    done = cli(
        "run",
        "--profile",
        str(profile),
        "--provider",
        "memory",
        "--capture",
        "/home/deep/out.txt",
        "--capture-dir",
        str(named / "made"),
        "--",
        "write",
        "/home/deep/out.txt",
        SECRET_OUT,
    )
    assert done.code == 0, str(done)
    captured = named / "made" / "home" / "deep" / "out.txt"
    assert captured.read_bytes() == SECRET_OUT.encode()
    assert mode(named) == 0o755  # the user's own directory keeps the mode it had
    for made in (named / "made", named / "made" / "home", captured.parent):
        assert mode(made) == 0o700, made
    assert mode(captured) == 0o600
    unreadable_by_nobody(captured)
    unreadable_by_nobody(named / "made")


def test_a_state_directory_left_open_by_an_older_checkfu_is_closed_by_the_next_command(cli: Cli) -> None:
    state = cli.state / "checkfu"
    state.mkdir(parents=True)
    cli.state.chmod(0o755)
    state.chmod(0o755)
    (state / "older.txt").write_text(SECRET_OUT)
    (state / "older.txt").chmod(0o644)
    done = cli("runs", "list")
    assert done.code == 0, str(done)
    assert mode(state) == 0o700
    assert mode(cli.state) == 0o755  # not checkfu's own: left as it was
    unreadable_by_nobody(state / "older.txt")


def test_a_state_directory_of_another_user_is_refused_by_name(cli: Cli) -> None:
    """Its owner could read and change every Run kept there: refused, saying which and what to do, nothing run."""
    state = cli.state / "checkfu"
    state.mkdir(parents=True)
    os.chown(state, 65534, 65534)
    for argv, code in ((("runs", "list"), None), (("run", "--provider", "host-process", "--", "true"), 125)):
        done = cli(*argv)
        assert done.code != 0 and (code is None or done.code == code), str(done)
        said = " ".join(done.err.split())
        assert f"{state} belongs to uid 65534" in said and "XDG_STATE_HOME" in said, said
        assert "internal error" not in said and "Traceback" not in said, said
    assert list(state.iterdir()) == []


def test_a_link_where_a_captured_file_goes_is_never_followed(cli: Cli, home: Path) -> None:
    # Else a link planted in the capture directory would send the Run's output where its owner can read it.
    profile = profile_file(home, base_image=MEMORY_IMAGE, name="memory.toml")
    planted = home / "captures" / "home" / "out.txt"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(home / "elsewhere")
    done = cli(
        "run",
        "--profile",
        str(profile),
        "--provider",
        "memory",
        "--capture",
        "/home/out.txt",
        "--capture-dir",
        str(home / "captures"),
        "--",
        "write",
        "/home/out.txt",
        SECRET_OUT,
    )
    assert done.code == 125, str(done)
    assert f"SandboxPathRejected: capture /home/out.txt: cannot write {planted}" in done.said
    assert not (home / "elsewhere").exists() and planted.is_symlink()
