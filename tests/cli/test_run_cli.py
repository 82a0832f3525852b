"""``checkfu run`` as a person meets it, without a Docker Engine: the memory provider, refusals, a dead engine.

Every test runs the installed console script as a real subprocess with its own
state directory (``XDG_STATE_HOME``) and runner tag (``CHECKFU_RUNNER_TAG``), so
its journal and labels are its own. After each test the journal must hold no open
(``pending``/``live``) allocation of that tag: nothing is left behind.

This module also holds that harness (``Cli``, ``Running``, ``cli``, ``profile_file``);
``test_run_docker.py`` and ``test_runs_history.py`` import it from here.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checkfu.core.journal import AllocationRow, Journal, sqlite_url
from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE

CHECKFU = Path(sys.executable).with_name("checkfu")
REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "examples" / "profiles"
PAUSED = Path(__file__).with_name("paused.py")
SCRUBBED = ("CHECKFU_DEBUG", "CHECKFU_RUNNER_TAG", "XDG_STATE_HOME", "COLUMNS")
ALPHA = b"alpha\n"
FAKE_IMAGE = "sha256:" + "ab" * 32
"""A well-formed pinned image id: enough for tests that never reach an engine."""


def flat(text: str) -> str:
    """``text`` with every run of whitespace made one space: undoes the console's line wrapping."""
    return " ".join(text.split())


@dataclass
class Done:
    """A finished ``checkfu`` process."""

    argv: list[str]
    code: int
    out: bytes
    err: str

    @property
    def said(self) -> str:
        """stderr with its wrapping undone, for phrase checks."""
        return flat(self.err)

    def __str__(self) -> str:
        return f"$ {' '.join(self.argv)}\n-> {self.code}\nstdout: {self.out[-2000:]!r}\nstderr:\n{self.err[-4000:]}"


def finished(argv: list[str], code: int, out: bytes, err: bytes) -> Done:
    done = Done(argv, code, out, err.decode("utf-8", "replace"))
    assert "Traceback" not in done.err, str(done)
    return done


@dataclass
class Running:
    """A ``checkfu`` process still running; its output goes to files so a test can poll it."""

    proc: subprocess.Popen[bytes]
    argv: list[str]
    out_path: Path
    err_path: Path

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, phrase: str, timeout: float = 20.0) -> None:
        """Wait until stderr says ``phrase``; fails (with the output so far) if the process ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if phrase in flat(self.stderr()):
                return
            if self.proc.poll() is not None:
                pytest.fail(f"checkfu ended ({self.proc.returncode}) before saying {phrase!r}:\n{self.stderr()}")
            time.sleep(0.02)
        pytest.fail(f"checkfu did not say {phrase!r} within {timeout} s:\n{self.stderr()}")

    def send(self, signum: int) -> None:
        """Signal this process (the one the test started, by its pid)."""
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 30.0) -> Done:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"checkfu did not end within {timeout} s:\n{self.stderr()}")
        return finished(self.argv, code, self.out_path.read_bytes(), self.err_path.read_bytes())


@dataclass
class Cli:
    """The ``checkfu`` command with a state directory and a runner tag of its own."""

    home: Path
    tag: str
    started: list[Running] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.home / "state"

    @property
    def journal_path(self) -> Path:
        return self.state / "checkfu" / "journal.sqlite"

    @property
    def staging(self) -> Path:
        """Where the Docker provider spools staged files until activation."""
        return self.state / "checkfu-docker" / "staging"

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        env.update(XDG_STATE_HOME=str(self.state), CHECKFU_RUNNER_TAG=self.tag)
        env.update(extra)
        return env

    def __call__(self, *args: str, cwd: Path | None = None, timeout: float = 90.0, **env: str) -> Done:
        return self.exec([str(CHECKFU), *args], cwd=cwd, timeout=timeout, **env)

    def exec(self, argv: list[str], *, cwd: Path | None = None, timeout: float = 90.0, **env: str) -> Done:
        """Run ``argv`` (a command line a person would type) with this CLI's state and tag."""
        proc = subprocess.run(
            argv, cwd=cwd or self.home, env=self.env(env), capture_output=True, timeout=timeout, check=False
        )
        return finished(argv, proc.returncode, proc.stdout, proc.stderr)

    def start(self, *args: str, cwd: Path | None = None, pause_before: str | None = None, **env: str) -> Running:
        """Start ``checkfu ARGS``; with ``pause_before``, its Run is held as that phase begins (``paused.py``)."""
        argv = [str(CHECKFU), *args] if pause_before is None else [sys.executable, str(PAUSED), pause_before, *args]
        n = len(self.started)
        out_path, err_path = self.home / f"run-{n}.out", self.home / f"run-{n}.err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(argv, cwd=cwd or self.home, env=self.env(env), stdout=out, stderr=err)
        running = Running(proc, argv, out_path, err_path)
        self.started.append(running)
        return running

    def json(self, *args: str, **env: str) -> Any:
        done = self(*args, "--json", **env)
        assert done.code == 0, str(done)
        return json.loads(done.out)

    def open_allocations(self, url: str | None = None) -> list[AllocationRow]:
        """This tag's ``pending``/``live`` allocations in the journal (none if it was never made)."""
        if url is None and not self.journal_path.exists():
            return []
        journal = Journal(url or sqlite_url(self.journal_path))
        try:
            return journal.open_allocations(runner_tag=self.tag)
        finally:
            journal.close()

    def stop_all(self) -> None:
        for running in self.started:
            if running.proc.poll() is None:
                running.proc.kill()
                running.proc.wait()


@contextmanager
def isolated_cli(home: Path) -> Iterator[Cli]:
    """A CLI with a fresh tag under ``home``; on the way out, no allocation of its tag is open in the journal
    and no staged file is left."""
    c = Cli(home, f"test-{uuid.uuid4().hex[:8]}")
    try:
        yield c
    finally:
        c.stop_all()
    left = c.open_allocations()
    assert not left, f"open allocations left in the journal: {left}"
    staged = sorted(p for p in c.staging.rglob("*") if p.is_file()) if c.staging.exists() else []
    assert not staged, f"staged files left behind: {staged}"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


def profile_file(
    where: Path,
    *,
    base_image: str = "checkfu/busybox:1",
    network: str = "none",
    cpu_millis: int = 500,
    extra: str = "",
    name: str = "profile.toml",
) -> Path:
    """A profile like ``examples/profiles/busybox-none.toml`` with the given changes (``extra``: top-level TOML)."""
    text = (
        f'tier = "container"\nbase_image = "{base_image}"\nretention_mode = "ephemeral_zdr"\n{extra}\n'
        f'[network_policy]\nmode = "{network}"\n\n'
        f"[resource_limits]\ncpu_millis = {cpu_millis}\nmemory_mib = 128\ndisk_mib = 64\npids = 64\n"
    )
    path = where / name
    path.write_text(text, encoding="utf-8")
    return path


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        check=True,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(repo),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid",
        },
    )
    return done.stdout.decode()


def make_repo(where: Path, files: dict[str, bytes]) -> Path:
    """A Git repository with ``files`` committed on ``main``; the working tree then differs from it."""
    repo = where / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name, data in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    for name in files:  # uncommitted edits: a Git mount must stage the ref, not the working tree
        (repo / name).write_bytes(b"uncommitted\n")
    return repo


def summary_exit(done: Done) -> int:
    """The exit code ``checkfu run``'s summary reports."""
    lines = [line.split() for line in done.err.splitlines() if line.startswith("exit ")]
    assert len(lines) == 1, str(done)
    return int(lines[0][1])


def run_id_of(done: Done) -> str:
    lines = [line.split() for line in done.err.splitlines() if line.startswith("run ")]
    assert len(lines) == 1, str(done)
    return lines[0][1]


# The memory provider: the whole path without an engine --------------------------------------------


@pytest.fixture
def memory_profile(tmp_path: Path) -> Path:
    return profile_file(tmp_path, base_image=MEMORY_IMAGE, name="memory.toml")


def test_output_goes_to_the_right_stream_and_stdout_holds_only_the_command(cli: Cli, memory_profile: Path) -> None:
    done = cli("run", "--profile", str(memory_profile), "--provider", "memory", "--", "echo", "hello", "world")
    assert done.code == 0, str(done)
    assert done.out == b"hello world\n"
    assert summary_exit(done) == 0
    # The memory provider confines nothing and the run says so, loudly, twice.
    assert "does not enforce" in done.said
    assert "not enforced sandbox_isolation" in done.said
    assert "all nine axes" not in done.said

    failed = cli("run", "--profile", str(memory_profile), "--provider", "memory", "--", "cat", "/no/such/file")
    assert failed.code == 1, str(failed)
    assert failed.out == b""
    assert "cat: /no/such/file: No such file or directory" in failed.err
    assert summary_exit(failed) == 1


def test_the_command_exit_status_is_checkfu_runs(cli: Cli, memory_profile: Path) -> None:
    done = cli("run", "--profile", str(memory_profile), "--provider", "memory", "--", "no-such-command")
    assert done.code == 127, str(done)
    assert "command not found" in done.err
    assert summary_exit(done) == 127


def test_a_directory_mount_arrives_byte_for_byte(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    blob = bytes(range(256)) * 8
    (data / "sub" / "blob.bin").write_bytes(blob)
    (data / "a.txt").write_bytes(ALPHA)
    done = cli(
        "run",
        "--profile",
        str(memory_profile),
        "--provider",
        "memory",
        "--mount",
        f"{data}:/data",
        "--",
        "sha256sum",
        "/data/sub/blob.bin",
        "/data/a.txt",
    )
    assert done.code == 0, str(done)
    assert done.out.decode().splitlines() == [
        f"{hashlib.sha256(blob).hexdigest()}  /data/sub/blob.bin",
        f"{hashlib.sha256(ALPHA).hexdigest()}  /data/a.txt",
    ]
    assert "staged" in done.said


def test_capture_reads_a_file_back(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    into = tmp_path / "captured"
    done = cli(
        "run",
        "--profile",
        str(memory_profile),
        "--provider",
        "memory",
        "--capture",
        "/home/out.txt",
        "--capture-dir",
        str(into),
        "--",
        "write",
        "/home/out.txt",
        "hello",
        "there",
    )
    assert done.code == 0, str(done)
    assert (into / "home" / "out.txt").read_bytes() == b"hello there"
    assert "captured" in done.said


def test_capture_reads_a_directory_back(cli: Cli, memory_profile: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "deep").mkdir(parents=True)
    (data / "one.txt").write_bytes(b"1")
    (data / "deep" / "two.txt").write_bytes(b"22")
    into = tmp_path / "captured"
    done = cli(
        "run",
        "--profile",
        str(memory_profile),
        "--provider",
        "memory",
        "--mount",
        f"{data}:/data",
        "--capture",
        "/data",
        "--capture-dir",
        str(into),
        "--",
        "true",
    )
    assert done.code == 0, str(done)
    assert (into / "data" / "one.txt").read_bytes() == b"1"
    assert (into / "data" / "deep" / "two.txt").read_bytes() == b"22"


def test_a_command_that_outlives_timeout_ends_with_124(cli: Cli, memory_profile: Path) -> None:
    t0 = time.monotonic()
    done = cli("run", "--profile", str(memory_profile), "--provider", "memory", "--timeout", "0.5", "--", "sleep", "30")
    assert time.monotonic() - t0 < 15
    assert "internal error" not in done.said, str(done)
    assert done.code == 124, str(done)


def test_a_profile_the_memory_provider_cannot_serve_is_refused_before_any_work(cli: Cli, tmp_path: Path) -> None:
    prof = profile_file(tmp_path, base_image=MEMORY_IMAGE, network="unrestricted")
    done = cli("run", "--profile", str(prof), "--provider", "memory", "--", "true")
    assert done.code == 125, str(done)  # checkfu's own refusal: docker's 125, never a command's 1
    assert "SandboxCapabilityUnavailable" in done.said
    assert "profile.network_policy.mode" in done.said
    assert "materialize" not in done.said  # refused before any provider work
    assert cli.json("runs", "list") == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_memory_run_releases(cli: Cli, memory_profile: Path, signum: int) -> None:
    running = cli.start(
        "run",
        "--profile",
        str(memory_profile),
        "--provider",
        "memory",
        "--",
        "echo",
        "never",
        pause_before="process",
    )
    running.wait_for("paused before process")
    running.send(signum)
    done = running.finish()
    assert done.code == 128 + signum, str(done)
    assert done.out == b""
    assert f"interrupted by {signal.Signals(signum).name}" in done.said
    assert "nothing is left behind" in done.said
    [run] = cli.json("runs", "list")
    assert run["status"] == "interrupted"


# Refusals that need no engine -----------------------------------------------------------------------


def test_no_command_is_a_usage_error(cli: Cli) -> None:
    done = cli("run", "--profile", str(PROFILES / "busybox-none.toml"))
    assert done.code == 125, str(done)  # a usage error of `run` is checkfu's own failure, as docker's is
    assert "Missing argument" in done.said


@pytest.mark.parametrize(
    "image",
    [pytest.param("checkfu/busybox:1", id="readme-profile-tag"), pytest.param(FAKE_IMAGE, id="pinned-profile")],
)
def test_an_unknown_provider_is_named(cli: Cli, tmp_path: Path, image: str) -> None:
    prof = profile_file(tmp_path, base_image=image)
    done = cli("run", "--profile", str(prof), "--provider", "no-such-provider", "--", "true")
    assert done.code == 125, str(done)
    assert "SandboxAdapterUnavailable" in done.said
    assert "'no-such-provider'" in done.said


@pytest.mark.parametrize(
    "image",
    [pytest.param("checkfu/busybox:1", id="readme-profile-tag"), pytest.param(FAKE_IMAGE, id="pinned-profile")],
)
def test_an_unreachable_engine_names_the_two_ways_out(cli: Cli, tmp_path: Path, image: str) -> None:
    prof = profile_file(tmp_path, base_image=image)
    done = cli("run", "--profile", str(prof), "--", "true", DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    assert done.code == 125, str(done)
    assert "SandboxAdapterUnavailable" in done.said
    assert "start a Docker Engine" in done.said
    assert "--provider host-process" in done.said
    assert "SandboxProfileInvalid" not in done.said  # the profile is fine; the engine is what is missing
