"""``checkfu run`` for real agent workloads (issue 10), on the Docker tier and the host-process tier.

Each test drives the installed console script as a person would: an interactive shell through a
real pseudo-terminal (pexpect), piped stdin, the environment and working directory, the exit-code
table, a real Python project's test suite writing its caches in a writable workspace, a project
whose ``.venv`` is a symlink, and staging in bounded memory. The host-process tier takes no mounts
(contract.md: it has no file system of its own), so the mount tests run on the Docker tier only.

Every test checks that nothing is left behind: no open allocation in the journal, no staged file,
and on the Docker tier nothing labelled with the test's runner tag.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pexpect
import pytest

from .test_run_cli import CHECKFU, PROFILES, Cli, Done, flat, git, isolated_cli, run_id_of
from .test_run_docker import connect, docker_cli

BUSYBOX = str(PROFILES / "busybox-none.toml")
TIERS = ("docker", "host-process")


@pytest.fixture(params=TIERS)
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Cli, list[str]]]:
    """A CLI with a state and tag of its own, and the arguments that select the tier (default profiles)."""
    with ExitStack() as stack:
        if request.param == "docker":
            request.applymarker(pytest.mark.docker)
            client = connect()
            stack.callback(client.close)
            cli = stack.enter_context(docker_cli(tmp_path, client))
            yield cli, []
        else:
            cli = stack.enter_context(isolated_cli(tmp_path))
            yield cli, ["--provider", "host-process"]


@pytest.fixture
def dcli(tmp_path: Path) -> Iterator[Cli]:
    client = connect()
    try:
        with docker_cli(tmp_path, client) as cli:
            yield cli
    finally:
        client.close()


def run_show(cli: Cli, done: Done) -> dict[str, Any]:
    return dict(cli.json("runs", "show", run_id_of(done)))


# an interactive shell, stdin, the environment ---------------------------------------------------------


def test_an_interactive_shell_under_it_follows_the_terminal(tier: tuple[Cli, list[str]]) -> None:
    cli, select = tier
    shell = pexpect.spawn(
        str(CHECKFU),
        ["run", "-q", "-it", *select, "--", "bash", "--norc", "--noprofile", "-i"],
        env=cli.env({"TERM": "dumb"}),
        cwd=str(cli.home),
        timeout=60,
        dimensions=(33, 101),
    )
    try:
        shell.expect(r"[$#] ")
        shell.sendline("stty size; tty; echo $((6 * 7))")
        shell.expect("33 101")  # the caller's window
        shell.expect("/dev/pts/")  # a real terminal inside
        shell.expect("42")
        shell.setwinsize(40, 120)  # the caller's terminal is resized: SIGWINCH reaches checkfu ...
        time.sleep(0.3)
        shell.sendline("stty size")
        shell.expect("40 120")  # ... and the sandbox's terminal follows
        shell.sendline("exit 3")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
    assert shell.exitstatus == 3  # the shell's own status passes through


def test_piped_stdin_reaches_cat_with_its_end(tier: tuple[Cli, list[str]]) -> None:
    cli, select = tier
    data = b"".join(b"line %d\n" % i for i in range(20000)) + b"\x00\xff no newline at the end"
    proc = subprocess.run(
        [str(CHECKFU), "run", "-q", "-i", *select, "--", "cat"],
        input=data,
        capture_output=True,
        env=cli.env({}),
        cwd=cli.home,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == data  # every byte, and the end of input reached cat (it exited)
    assert proc.stderr == b""  # -q: only the command's own output
    without = subprocess.run(
        [str(CHECKFU), "run", "-q", *select, "--", "cat"],
        input=b"not sent",
        capture_output=True,
        env=cli.env({}),
        cwd=cli.home,
        timeout=120,
        check=False,
    )
    assert (without.returncode, without.stdout) == (0, b"")  # without -i, stdin is empty, as docker's


def test_env_and_workdir_as_asked_and_no_value_is_recorded(tier: tuple[Cli, list[str]], tmp_path: Path) -> None:
    cli, select = tier
    secret = f"hunter2-{uuid.uuid4().hex}"
    from_file = f"filed-{uuid.uuid4().hex}"
    env_file = tmp_path / "vars.env"
    env_file.write_text(f"# a comment\n\nFROM_FILE={from_file}\nOVERRIDDEN=file\n", encoding="utf-8")
    json_out = tmp_path / "summary.json"
    script = 'printf "%s|%s|%s|%s|%s\\n" "$SECRET" "$FROM_FILE" "$OVERRIDDEN" "$PASSED" "$(pwd)"'
    done = cli(
        "run",
        *select,
        "-e",
        f"SECRET={secret}",
        "-e",
        "PASSED",
        "-e",
        "OVERRIDDEN=flag",
        "-e",
        "NOT_SET_ANYWHERE",
        "--env-file",
        str(env_file),
        "-w",
        "/tmp",
        "--json",
        str(json_out),
        "--",
        "sh",
        "-c",
        script,
        PASSED=f"passed-{secret}",
    )
    assert done.code == 0, str(done)
    assert done.out.decode() == f"{secret}|{from_file}|flag|passed-{secret}|/tmp\n"
    assert "NOT_SET_ANYWHERE is not set here" in done.said  # docker leaves it out; we also say so
    shown = run_show(cli, done)
    assert shown["summary"]["env"] == ["FROM_FILE", "OVERRIDDEN", "PASSED", "SECRET"]
    assert shown["summary"]["workdir"] == "/tmp"
    summary = json.loads(json_out.read_text())
    assert summary["exit_code"] == 0 and summary["env"] == shown["summary"]["env"] and summary["workdir"] == "/tmp"
    # No value anywhere: not in runs show, the summary, the JSON, nor any byte of the journal.
    for text in (json.dumps(shown), done.err, json_out.read_text(), cli("runs", "show", run_id_of(done)).out.decode()):
        assert secret not in text and from_file not in text
    journal = cli.journal_path.read_bytes() + b"".join(p.read_bytes() for p in cli.journal_path.parent.glob("*-wal"))
    assert secret.encode() not in journal and from_file.encode() not in journal


# the exit-code table -------------------------------------------------------------------------------------


def test_the_exit_code_table_holds(tier: tuple[Cli, list[str]], tmp_path: Path) -> None:
    cli, select = tier
    table = {
        "ok": (["--", "true"], 0),
        "the command's own": (["--", "sh", "-c", "exit 3"], 3),
        "not found": (["--", "no-such-command-anywhere"], 127),
        "not found by path": (["--", "/no/such/dir/program"], 127),
        "cannot execute": (["--", "/etc/hostname"], 126),
        "timeout": (["--timeout", "0.5", "--", "sleep", "30"], 124),
        "refused": (["-e", "1BAD=x", "--", "true"], 125),
        "usage error": (["--no-such-flag", "--", "true"], 125),
        "no command": ([], 125),
        "bad profile": (["--profile", str(tmp_path / "absent.toml"), "--", "true"], 125),
    }
    for name, (args, code) in table.items():
        done = cli("run", *select, *args)
        assert done.code == code, f"{name}:\n{done}"
    for signum in (signal.SIGINT, signal.SIGTERM):
        running = cli.start("run", *select, "--", "sleep", "30")
        running.wait_for("• activate")
        time.sleep(0.5)
        running.send(signum)
        done = running.finish()
        assert done.code == 128 + signum, str(done)  # 130 and 143


# a writable workspace, a real test suite, symlinks -----------------------------------------------------

PYTEST = "python3-pytest=7.2.1-2"
PYTEST_PROFILE = f"""\
tier = "container"
base_image = "checkfu/debian:12"
retention_mode = "ephemeral_zdr"
[packages]
apt = ["{PYTEST}"]
[network_policy]
mode = "none"
[resource_limits]
cpu_millis = 1000
memory_mib = 512
disk_mib = 256
pids = 128
"""


def python_project(where: Path) -> Path:
    """A small real project: a package, its pytest suite, a conftest, a .gitignore; a Git work tree."""
    proj = where / "proj"
    (proj / "calc").mkdir(parents=True)
    (proj / "tests").mkdir()
    (proj / "calc" / "__init__.py").write_text("from calc.ops import add, mean\n")
    (proj / "calc" / "ops.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
    )
    (proj / "tests" / "test_ops.py").write_text(
        "import pathlib\n\nimport calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n\n\n"
        "def test_mean():\n    assert calc.mean([1, 2, 3]) == 2\n\n\n"
        "def test_writes_a_cache(tmp_path):\n"
        "    cache = pathlib.Path('.cache')\n    cache.mkdir(exist_ok=True)\n"
        "    (cache / 'seen').write_text('1')\n    assert (cache / 'seen').read_text() == '1'\n"
    )
    (proj / "conftest.py").write_text("import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n")
    (proj / "run.sh").write_text('#!/bin/sh\nexec python3 -m pytest -q "$@"\n')
    (proj / "run.sh").chmod(0o755)
    (proj / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n.cache/\nbuild/\n")
    (proj / "build").mkdir()
    (proj / "build" / "huge.bin").write_bytes(b"\0" * (1 << 20))  # ignored by Git: not staged
    git(proj, "init", "-q", "-b", "main")
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "a project")
    return proj


def _drop_cached_pytest_image(cli: Cli) -> None:
    """Remove the cached image of the pytest profile, so this test builds it for real (display included)."""
    import tomllib  # noqa: PLC0415

    import docker  # noqa: PLC0415

    from checkfu.contract.codec import decode_value  # noqa: PLC0415
    from checkfu.contract.profile import SandboxProfile  # noqa: PLC0415
    from checkfu.providers.docker import pin_base_image  # noqa: PLC0415
    from checkfu.providers.docker.envelope import MATERIALIZATION_REVISION  # noqa: PLC0415
    from checkfu.providers.docker.materialize import materialization_digest  # noqa: PLC0415

    doc = tomllib.loads(PYTEST_PROFILE)
    doc["base_image"] = pin_base_image(doc["base_image"])
    digest = materialization_digest(decode_value(SandboxProfile, doc), MATERIALIZATION_REVISION)
    client = docker.from_env()
    try:
        for image in client.images.list(filters={"label": f"checkfu.materialization_digest={digest}"}):
            client.images.remove(image.id, force=True)
    finally:
        client.close()


@pytest.mark.docker
def test_a_real_test_suite_writes_its_caches_in_a_writable_workspace(dcli: Cli, tmp_path: Path) -> None:
    """The packages build (one real package, built here) is shown line by line, and pytest runs clean in :rw."""
    proj = python_project(tmp_path)
    profile = tmp_path / "pytest.toml"
    profile.write_text(PYTEST_PROFILE)
    _drop_cached_pytest_image(dcli)
    script = (
        "./run.sh && ls -a && test -d .pytest_cache && test -d calc/__pycache__ "
        "&& test ! -e build && touch new-file && id -u && stat -c %U:%a calc/ops.py run.sh"
    )
    done = dcli(
        "run",
        "--profile",
        str(profile),
        "--mount",
        f"{proj}:/workspace:rw",
        "-w",
        "/workspace",
        "--",
        "sh",
        "-c",
        script,
        timeout=600,
    )
    assert done.code == 0, str(done)
    out = done.out.decode()
    assert "3 passed" in out
    for noise in ("PytestCacheWarning", "could not create cache", "Read-only file system", "Traceback"):
        assert noise not in out + done.err, str(done)
    assert "1000\n" in out  # the sandbox user, who owns the workspace
    assert "sandbox:644" in out or "1000:644" in out
    assert ":755" in out.splitlines()[-1]  # the executable bit is kept
    # The build was real and shown line by line, with no display error.
    assert "build:" in done.err and "Successfully built" in done.said, str(done)
    assert "rstrip" not in done.err and "object has no attribute" not in done.err
    assert "writable /workspace" in done.said  # the summary says the workspace is not sealed
    # The source is never written back.
    assert not (proj / ".pytest_cache").exists() and not (proj / "new-file").exists()

    sealed = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/workspace", "--", "touch", "/workspace/x")
    assert sealed.code == 1 and "Read-only file system" in sealed.said  # the default stays sealed


@pytest.mark.docker
def test_a_writable_mount_larger_than_its_share_of_disk_is_refused_before_any_work(dcli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    (src / "blob").write_bytes(os.urandom(40 << 20))  # busybox-none: disk_mib 64, so 32 MiB for :rw mounts
    done = dcli("run", "--profile", BUSYBOX, "--mount", f"{src}:/w:rw", "--", "true")
    assert done.code == 125, str(done)
    assert "SandboxBoundExceeded" in done.said and "disk_mib" in done.said, str(done)


@pytest.mark.docker
def test_a_project_whose_venv_is_a_symlink_is_staged(dcli: Cli, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "venvs" / "py" / "bin").mkdir(parents=True)
    (proj / "venvs" / "py" / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (proj / "venvs" / "py" / "bin" / "tool").chmod(0o755)
    (proj / ".venv").symlink_to("venvs/py")  # inside the mount: staged as a link
    (proj / "main.txt").write_text("main\n")
    script = "readlink /w/.venv && /w/.venv/bin/tool && cat /w/main.txt"
    done = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/w", "--", "sh", "-c", script)
    assert done.code == 0, str(done)
    assert done.out == b"venvs/py\ntool ran\nmain\n"

    # A link that leads outside is refused by name, never followed ...
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_text("never staged\n")
    (proj / ".venv").unlink()
    (proj / ".venv").symlink_to(outside)
    refused = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/w", "--", "true")
    assert refused.code == 125, str(refused)
    assert "SandboxPathRejected" in refused.said and ".venv" in refused.said and "outside" in refused.said
    # ... unless Git ignores it, as a project's .gitignore usually says.
    (proj / ".gitignore").write_text(".venv\n")
    git(proj, "init", "-q", "-b", "main")
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "x")
    ignored = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/w", "--", "sh", "-c", "ls -A /w")
    assert ignored.code == 0, str(ignored)
    assert ".venv" not in ignored.out.decode() and "main.txt" in ignored.out.decode()
    everything = dcli("run", "--profile", BUSYBOX, "--no-ignore", "--mount", f"{proj}:/w", "--", "true")
    assert everything.code == 125 and ".venv" in everything.said  # --no-ignore stages (so checks) everything


@pytest.mark.docker
def test_a_non_git_project_leaves_its_venv_out_by_checkfuignore_or_exclude(dcli: Cli, tmp_path: Path) -> None:
    """Issue 32: outside Git, ``.checkfuignore`` (gitignore syntax) and ``--exclude GLOB`` leave files out; the
    summary says how much each top-level entry staged, so a ``.venv`` staged by mistake is seen."""
    proj = tmp_path / "proj"
    (proj / ".venv" / "bin").mkdir(parents=True)
    (proj / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")  # leads outside: staging it is refused
    (proj / ".venv" / "lib.bin").write_bytes(b"v" * 300_000)
    (proj / "src").mkdir()
    (proj / "src" / "app.py").write_text("print('app')\n")
    (proj / "src" / "app.pyc").write_text("compiled\n")
    (proj / "README").write_text("readme\n")
    listing = "cd /w && find . \\( -type f -o -type l \\) | sort"

    whole = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/w", "--", "true")
    assert whole.code == 125 and "SandboxPathRejected" in whole.said and ".venv/bin/python" in whole.said

    (proj / ".checkfuignore").write_text("# the interpreter stays on the host\n.venv/\n*.pyc\n")
    summary_file = tmp_path / "summary.json"
    done = dcli(
        "run", "--profile", BUSYBOX, "--json", str(summary_file), "--mount", f"{proj}:/w", "--", "sh", "-c", listing
    )
    assert done.code == 0, str(done)
    assert done.out.decode().split() == ["./.checkfuignore", "./README", "./src/app.py"]
    tops = json.loads(summary_file.read_text())["staged_top_level"]
    assert set(tops["/w"]) == {".checkfuignore", "README", "src/"} and tops["/w"]["src/"] == len("print('app')\n")

    (proj / ".checkfuignore").unlink()
    flag = dcli(
        "run", "--profile", BUSYBOX, "--exclude", ".venv", "--exclude", "*.pyc", "--mount", f"{proj}:/w", "--",
        "sh", "-c", listing,
    )  # fmt: skip
    assert flag.code == 0, str(flag)
    assert flag.out.decode().split() == ["./README", "./src/app.py"]

    # Without an exclusion a large .venv is staged, and the summary names it first (largest first).
    (proj / ".venv" / "bin" / "python").unlink()
    seen = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/w", "--", "true")
    assert seen.code == 0, str(seen)
    line = next(x for x in seen.err.splitlines() if x.strip().startswith("/w "))
    assert line.split()[1] == ".venv/", line


@pytest.mark.docker
def test_a_rw_sync_mount_copies_its_changes_back_into_src_and_never_through_a_link(dcli: Cli, tmp_path: Path) -> None:
    """Issue 32: ``--mount SRC:TARGET:rw,sync`` applies the sandbox's changes to SRC when the Run ends, counts
    them, refuses by name (``--mount``) what would leave SRC or go through a link, and never deletes from SRC."""
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "a.txt").write_text("old\n")
    (proj / "sub" / "old.txt").write_text("below\n")  # an empty directory is not staged
    (proj / "keep.txt").write_text("untouched\n")
    (proj / "del.txt").write_text("the Run removes me\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (proj / "escape").symlink_to(outside)  # a link out of SRC, left out of the mount by .checkfuignore
    (proj / ".checkfuignore").write_text("/escape\n")
    (proj / "inward").symlink_to("sub")  # a link inside SRC: staged as a link
    script = (
        "echo new > /w/a.txt && echo added > /w/sub/new.txt && rm /w/del.txt && ln -s /etc/passwd /w/evil"
        " && mkdir /w/escape && echo pwned > /w/escape/x && chmod +x /w/sub/new.txt"
        " && rm /w/inward && mkdir /w/inward && echo through > /w/inward/x"
    )
    summary_file = tmp_path / "summary.json"
    done = dcli(
        "run", "--profile", BUSYBOX, "--json", str(summary_file), "--mount", f"{proj}:/w:rw,sync", "--",
        "sh", "-c", script,
    )  # fmt: skip
    assert done.code == 0, str(done)
    assert (proj / "a.txt").read_text() == "new\n"
    assert (proj / "sub" / "new.txt").read_text() == "added\n" and os.access(proj / "sub" / "new.txt", os.X_OK)
    assert (proj / "keep.txt").read_text() == "untouched\n"
    assert (proj / "del.txt").exists()  # deletions do not propagate
    assert not (proj / "evil").exists() and not (proj / "evil").is_symlink()
    assert list(outside.iterdir()) == []  # nothing written through the link out of SRC (excluded: never synced)
    assert (proj / "inward").is_symlink() and not (proj / "sub" / "x").exists()  # nor through one inside it
    (synced,) = json.loads(summary_file.read_text())["synced"]
    assert (synced["added"], synced["changed"], synced["removed"]) == (1, 1, 2), synced
    removed = ["del.txt", "inward"]  # the link became a directory in the sandbox
    assert synced["paths"] == {"added": ["sub/new.txt"], "changed": ["a.txt"], "removed": removed, "conflicts": []}
    assert synced["deletions_propagated"] is False and synced["excluded"] == 1
    refused = {r["path"]: r for r in synced["refused"]}
    assert set(refused) == {"evil", "inward/x"}, refused
    assert all(r["code"] == "SandboxPathRejected" and r["field"] == "--mount" for r in refused.values())
    assert "1 added, 1 changed, 2 removed" in done.err and "SandboxPathRejected (--mount)" in done.err

    # Without sync a writable mount is still never written back.
    (proj / "a.txt").write_text("old\n")
    plain = dcli("run", "--profile", BUSYBOX, "--mount", f"{proj}:/w:rw", "--", "sh", "-c", "echo new > /w/a.txt")
    assert plain.code == 0 and (proj / "a.txt").read_text() == "old\n", str(plain)


@pytest.mark.docker
def test_a_rw_sync_mount_never_overwrites_what_the_user_changed_in_src_during_the_run(
    dcli: Cli, tmp_path: Path
) -> None:
    """Only what the sandbox changed is copied back, and only over what the Run was given. A file changed on both
    sides (edited, made, ``chmod``-ed or deleted in SRC while the Run went on) keeps SRC's version and is named a
    conflict (``SandboxStateConflict``, field ``--mount``); a file only SRC changed is left as SRC has it; every
    other change still applies. Before, the sandbox's copy silently replaced the user's edit and brought back what
    the user deleted."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("edited", "untouched", "mine", "chmodded", "deleted", "gone"):
        (proj / f"{name}.txt").write_text("as staged\n")
    script = (
        "for f in edited untouched chmodded deleted both; do echo sandbox > /w/$f.txt; done"
        " && echo ready >&2 && sleep 4"
    )
    summary_file = tmp_path / "summary.json"
    running = dcli.start(
        "run", "--profile", BUSYBOX, "--json", str(summary_file), "--mount", f"{proj}:/w:rw,sync", "--",
        "sh", "-c", script,
    )  # fmt: skip
    running.wait_for("ready", timeout=60)
    # meanwhile, on the host
    (proj / "edited.txt").write_text("the user's edit\n")  # changed on both sides
    (proj / "both.txt").write_text("the user's new file\n")  # made on both sides
    (proj / "chmodded.txt").chmod(0o755)  # on both sides: SRC's mode, the sandbox's bytes
    (proj / "deleted.txt").unlink()  # deleted in SRC, changed in the sandbox
    (proj / "mine.txt").write_text("only the user's\n")  # changed in SRC only
    (proj / "gone.txt").unlink()  # deleted in SRC only
    done = running.finish(timeout=60)
    assert done.code == 0, str(done)
    assert (proj / "edited.txt").read_text() == "the user's edit\n"
    assert (proj / "both.txt").read_text() == "the user's new file\n"
    assert (proj / "chmodded.txt").read_text() == "as staged\n" and os.access(proj / "chmodded.txt", os.X_OK)
    assert not (proj / "deleted.txt").exists() and not (proj / "gone.txt").exists()
    assert (proj / "mine.txt").read_text() == "only the user's\n"
    assert (proj / "untouched.txt").read_text() == "sandbox\n"  # the rest is applied
    (synced,) = json.loads(summary_file.read_text())["synced"]
    conflicts = ["both.txt", "chmodded.txt", "deleted.txt", "edited.txt"]
    assert synced["paths"]["conflicts"] == conflicts and synced["conflicts"] == 4, synced
    assert synced["paths"]["changed"] == ["untouched.txt"] and synced["paths"]["added"] == [], synced
    refused = {r["path"]: r for r in synced["refused"]}
    assert set(refused) == set(conflicts)
    assert all(r["code"] == "SandboxStateConflict" and r["field"] == "--mount" for r in refused.values())
    assert "kept edited.txt: it changed in" in flat(done.err), done.err


# staging in bounded memory -------------------------------------------------------------------------------

PEAK = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
sys.stderr.buffer.write(proc.stderr)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_of(cli: Cli, *args: str) -> tuple[int, int]:
    """The exit status and peak resident memory (KiB) of ``checkfu ARGS`` (the largest process it ran)."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(CHECKFU), *args],
        capture_output=True,
        env=cli.env({}),
        cwd=cli.home,
        timeout=1800,
        check=False,
    )
    code, peak = done.stdout.decode().split()
    assert int(code) == 0, done.stderr.decode()[-3000:]
    return int(code), int(peak)


def _mount_of(where: Path, total: int, piece: int) -> Path:
    src = where / "mount"
    src.mkdir()
    block = os.urandom(1 << 20)
    for i in range(total // piece):
        with (src / f"part-{i:04d}.bin").open("wb") as f:
            for _ in range(piece >> 20):
                f.write(block)
    return src


def _bounded(dcli: Cli, tmp_path: Path, total: int, piece: int) -> tuple[int, int]:
    profile = tmp_path / "big.toml"
    profile.write_text(
        PYTEST_PROFILE.replace(f'[packages]\napt = ["{PYTEST}"]\n', "").replace("disk_mib = 256", "disk_mib = 512")
    )
    _, baseline = peak_of(dcli, "run", "--profile", str(profile), "--", "true")
    src = _mount_of(tmp_path, total, piece)
    check = f"test $(cat /data/* | wc -c) -eq {total}"
    _, peak = peak_of(dcli, "run", "--profile", str(profile), "--mount", f"{src}:/data", "--", "sh", "-c", check)
    return baseline, peak


@pytest.mark.docker
def test_a_mount_is_staged_in_bounded_memory(dcli: Cli, tmp_path: Path) -> None:
    """192 MiB in 8 MiB files: the runner's peak grows by a few files' worth, never by the mount."""
    baseline, peak = _bounded(dcli, tmp_path, 192 << 20, 8 << 20)
    grown = (peak - baseline) * 1024
    assert grown < 64 << 20, f"peak {peak} KiB against {baseline} KiB without a mount"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CHECKFU_SLOW") != "1", reason="long run; set CHECKFU_SLOW=1")
def test_a_one_gib_mount_is_staged_in_bounded_memory(dcli: Cli, tmp_path: Path) -> None:
    baseline, peak = _bounded(dcli, tmp_path, 1 << 30, 16 << 20)
    grown = (peak - baseline) * 1024
    print(f"1 GiB mount: peak RSS {peak / 1024:.1f} MiB, {baseline / 1024:.1f} MiB without a mount")
    assert grown < 96 << 20, f"peak {peak} KiB against {baseline} KiB without a mount"


# captures of real directories (issue 16, defects 5 and 6) -------------------------------------------------


@pytest.mark.docker
def test_a_capture_of_many_files_and_a_name_that_is_not_utf8_keeps_the_commands_status(
    dcli: Cli, tmp_path: Path
) -> None:
    script = (
        "mkdir -p /home/sandbox/out/many && cd /home/sandbox/out && printf good > good.txt "
        "&& printf bad > \"$(printf 'bad\\377name')\" "
        "&& i=0; while [ $i -lt 1100 ]; do echo $i > many/f$i; i=$((i+1)); done; exit 7"
    )
    into = tmp_path / "into"
    done = dcli(
        "run",
        "--profile",
        BUSYBOX,
        "--capture",
        "/home/sandbox/out",
        "--capture-dir",
        str(into),
        "--",
        "sh",
        "-c",
        script,
        timeout=300,
    )
    assert done.code == 7, str(done)  # the command's status, not a provider failure
    out = into / "home" / "sandbox" / "out"
    assert (out / "good.txt").read_bytes() == b"good"
    assert len(list((out / "many").iterdir())) == 1100 and (out / "many" / "f1099").read_bytes() == b"1099\n"
    assert "not captured" in done.said and "bad\\xffname" in done.said, str(done)  # skipped by name
    assert "captured 1101 files into" in done.said
