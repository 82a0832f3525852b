"""``checkfu run`` on the Docker tier, end to end, as a new user meets it (issue 6).

Each test runs the installed console script with a state directory and runner
tag of its own, then asserts that nothing is left behind: no container, volume
or image labelled ``checkfu.runner_tag=<tag>``, no staged file and no open
allocation in the journal. Should anything be left, it is removed by label
before the test fails, so a failure never litters the engine.

Skipped when no engine answers, unless ``CHECKFU_REQUIRE_DOCKER=1`` (then it fails).
"""

from __future__ import annotations

import gc
import hashlib
import os
import shlex
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import pytest

from .test_run_cli import (
    PROFILES,
    REPO,
    Cli,
    Done,
    isolated_cli,
    make_repo,
    profile_file,
    run_id_of,
    summary_exit,
)

pytestmark = pytest.mark.docker

BUSYBOX = str(PROFILES / "busybox-none.toml")
LABEL = "checkfu.runner_tag"


def connect() -> Any:
    """A client of the engine; skips the test when none answers, unless ``CHECKFU_REQUIRE_DOCKER=1``."""
    client = None
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        if os.environ.get("CHECKFU_REQUIRE_DOCKER") == "1":
            raise
        if client is not None:
            client.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()  # docker-py leaves a failed connection's socket to the collector
        pytest.skip(f"no Docker Engine: {type(exc).__name__}")
    return client


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


def leftovers(client: Any, tag: str) -> list[str]:
    """Every container, volume and image labelled with ``tag``."""
    flt = {"label": f"{LABEL}={tag}"}
    return (
        [f"container {c.name}" for c in client.containers.list(all=True, filters=flt, ignore_removed=True)]
        + [f"volume {v.name}" for v in client.volumes.list(filters=flt)]
        + [f"image {i.id}" for i in client.images.list(filters=flt)]
    )


def reclaim(client: Any, tag: str) -> None:
    flt = {"label": f"{LABEL}={tag}"}
    for c in client.containers.list(all=True, filters=flt, ignore_removed=True):
        c.remove(force=True, v=True)
    for v in client.volumes.list(filters=flt):
        v.remove(force=True)
    for i in client.images.list(filters=flt):
        client.images.remove(i.id, force=True)


@contextmanager
def docker_cli(home: Path, client: Any) -> Iterator[Cli]:
    """``isolated_cli``, and on the way out nothing labelled with its tag is on the engine."""
    with isolated_cli(home) as cli:
        yield cli
        cli.stop_all()
        left = leftovers(client, cli.tag)
        if left:
            reclaim(client, cli.tag)
    assert not left, f"left behind on the engine: {left}"


@pytest.fixture
def dcli(tmp_path: Path, engine: Any) -> Iterator[Cli]:
    with docker_cli(tmp_path, engine) as cli:
        yield cli


def containers(engine: Any, tag: str, **more: str) -> list[Any]:
    return list(engine.containers.list(all=True, filters={"label": f"{LABEL}={tag}", **more}, ignore_removed=True))


# 1. The README's first command ---------------------------------------------------------------------


def readme_first_command() -> list[str]:
    """The part of the README's quick-start line after ``./scripts/setup --engine &&``."""
    [line] = [
        ln for ln in (REPO / "README.md").read_text().splitlines() if ln.endswith("# sets up and runs the main job")
    ]
    command = line.split("#", 1)[0].strip()
    prefix = "./scripts/setup --engine && "
    assert command.startswith(prefix), line
    return shlex.split(command[len(prefix) :])


def test_the_readme_first_command_runs_the_suite_and_explains_itself(dcli: Cli) -> None:
    argv = readme_first_command()
    assert argv[:2] == [".venv/bin/checkfu", "run"]
    done = dcli.exec(argv, cwd=REPO, timeout=180)
    assert done.code == 0, str(done)
    both = done.out.decode() + done.err
    oks = [ln for ln in both.splitlines() if ln.startswith("test_") and ln.endswith(" ... ok")]
    assert len(oks) == 7, str(done)
    assert "Ran 7 tests" in both
    # The summary a person reads at the end.
    for phrase in ("run ", "adapter", "grade:", "exit 0", "enforced all nine axes", "staged", "pinned"):
        assert phrase in done.said, f"{phrase!r} missing:\n{done}"
    # graded as `checkfu provider grade docker` grades it: the in-tree tier, not as a third party would be
    assert "grade: Docker parity" in done.said and "short of the next tier" not in done.said, str(done)
    assert run_id_of(done).startswith("run-")
    assert summary_exit(done) == 0


# 2. Exit status and streams -------------------------------------------------------------------------


def test_exit_status_propagates_and_streams_stay_apart(dcli: Cli) -> None:
    script = "printf 'to out\\n'; printf 'to err\\n' >&2; printf '\\000\\377'; exit 7"
    done = dcli("run", "--profile", BUSYBOX, "--", "sh", "-c", script)
    assert done.code == 7, str(done)
    assert done.out == b"to out\n\x00\xff"  # stdout holds the command's bytes and nothing else
    assert "to err" in done.err
    assert summary_exit(done) == 7


def test_a_large_output_arrives_whole(dcli: Cli) -> None:
    done = dcli("run", "--profile", BUSYBOX, "--", "seq", "1", "50000")
    assert done.code == 0, str(done)
    assert done.out == "".join(f"{i}\n" for i in range(1, 50001)).encode()


def test_a_command_that_does_not_exist(dcli: Cli) -> None:
    done = dcli("run", "--profile", BUSYBOX, "--", "no-such-command")
    assert done.code in (126, 127), str(done)
    # The engine reports this itself, on the exec's output stream (stdout, as it happens): either stream will do.
    assert "no-such-command" in done.out.decode() + done.err
    assert summary_exit(done) == done.code


def test_a_command_that_outlives_timeout_ends_with_124(dcli: Cli) -> None:
    t0 = time.monotonic()
    done = dcli("run", "--profile", BUSYBOX, "--timeout", "0.5", "--", "sleep", "30")
    assert time.monotonic() - t0 < 15
    assert "internal error" not in done.said, str(done)
    assert done.code == 124, str(done)


# 3. Captures ---------------------------------------------------------------------------------------


def test_capture_reads_a_file_back(dcli: Cli, tmp_path: Path) -> None:
    into = tmp_path / "captured"
    done = dcli(
        "run",
        "--profile",
        BUSYBOX,
        "--capture",
        "/home/sandbox/out.txt",
        "--capture-dir",
        str(into),
        "--",
        "sh",
        "-c",
        "echo hi > /home/sandbox/out.txt",
    )
    assert done.code == 0, str(done)
    assert (into / "home" / "sandbox" / "out.txt").read_bytes() == b"hi\n"
    assert "captured" in done.said


def test_capture_reads_a_directory_back_into_the_state_directory_by_default(dcli: Cli, tmp_path: Path) -> None:
    script = "mkdir -p /home/sandbox/d/sub && printf a > /home/sandbox/d/a && printf '\\000b' > /home/sandbox/d/sub/b"
    done = dcli("run", "--profile", BUSYBOX, "--capture", "/home/sandbox/d", "--", "sh", "-c", script, cwd=tmp_path)
    assert done.code == 0, str(done)
    into = dcli.state / "checkfu" / "captures" / run_id_of(done)
    assert f"captured 2 files into {into}" in done.said  # where they went is printed
    assert not (tmp_path / "captures").exists()  # never into the working directory unasked
    root = into / "home" / "sandbox" / "d"
    assert (root / "a").read_bytes() == b"a"
    assert (root / "sub" / "b").read_bytes() == b"\x00b"


def test_a_capture_of_nothing_is_named_and_the_exit_status_stays_the_commands(dcli: Cli, tmp_path: Path) -> None:
    into = tmp_path / "captured"
    done = dcli(
        "run",
        "--profile",
        BUSYBOX,
        "--capture",
        "/home/sandbox/never-written",
        "--capture",
        "/no/such/dir/file",
        "--capture-dir",
        str(into),
        "--",
        "sh",
        "-c",
        "exit 5",
    )
    assert done.code == 5, str(done)
    assert "warning" in done.said and "/home/sandbox/never-written" in done.said and "/no/such/dir/file" in done.said
    assert not into.exists()


# 4. Mounts -----------------------------------------------------------------------------------------


def test_a_directory_mount_arrives_byte_for_byte_and_sealed(dcli: Cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    blob = os.urandom(300_000)
    (data / "sub" / "blob.bin").write_bytes(blob)
    (data / "a.txt").write_bytes(b"alpha\n")
    script = "cd /data && sha256sum sub/blob.bin && cat a.txt && if echo x > /data/new; then echo WRITABLE; fi"
    done = dcli("run", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--", "sh", "-c", script)
    assert done.code == 0, str(done)
    assert done.out.decode().splitlines() == [f"{hashlib.sha256(blob).hexdigest()}  sub/blob.bin", "alpha"]
    assert "staged" in done.said


def test_a_git_mount_stages_the_ref_not_the_working_tree(dcli: Cli, tmp_path: Path) -> None:
    files = {"README": b"from main\n", "bin/data.bin": bytes(range(256)) * 4}
    repo = make_repo(tmp_path, files)
    script = "cd /src && cat README && sha256sum bin/data.bin && ls -A /src"
    done = dcli("run", "--profile", BUSYBOX, "--mount", f"{repo}@main:/src", "--", "sh", "-c", script)
    assert done.code == 0, str(done)
    lines = done.out.decode().splitlines()
    assert lines[0] == "from main"
    assert lines[1] == f"{hashlib.sha256(files['bin/data.bin']).hexdigest()}  bin/data.bin"
    assert sorted(lines[2:]) == ["README", "bin"]  # no .git: the runner pushes the tree's blobs only


# 5. Refusals ---------------------------------------------------------------------------------------

Case = Callable[[Path], tuple[list[str], list[str]]]
"""Given a scratch directory: the ``checkfu`` arguments, and phrases stderr must hold (the code first)."""


def _unknown_field(d: Path) -> tuple[list[str], list[str]]:
    return ["--profile", str(profile_file(d, extra="bogus = 1"))], ["SandboxProfileInvalid", "bogus", "unknown key"]


def _bad_toml(d: Path) -> tuple[list[str], list[str]]:
    (d / "bad.toml").write_text('tier = "container"\nbase_image =\n')
    return ["--profile", str(d / "bad.toml")], ["SandboxProfileInvalid", "bad.toml", "not valid TOML", "line 2"]


def _unpinned(d: Path) -> tuple[list[str], list[str]]:
    prof = profile_file(d, extra='packages = { apt = ["curl"] }')
    return ["--profile", str(prof)], ["SandboxProfileInvalid", "packages.apt.0", "'curl' is not a pinned apt name"]


def _no_profile(d: Path) -> tuple[list[str], list[str]]:
    return ["--profile", str(d / "nope.toml")], ["SandboxProfileInvalid", "nope.toml", "No such file"]


def _unknown_image(d: Path) -> tuple[list[str], list[str]]:
    prof = profile_file(d, base_image="checkfu/no-such-image:1")
    return ["--profile", str(prof)], ["SandboxProfileInvalid", "base_image", "checkfu/no-such-image:1"]


def _missing_mount(d: Path) -> tuple[list[str], list[str]]:
    src = d / "not-here"
    return ["--profile", BUSYBOX, "--mount", f"{src}:/data"], ["SandboxProfileInvalid", str(src), "does not exist"]


def _relative_target(d: Path) -> tuple[list[str], list[str]]:
    return ["--profile", BUSYBOX, "--mount", f"{d}:data"], ["SandboxPathRejected", "target", "absolute"]


def _missing_ref(d: Path) -> tuple[list[str], list[str]]:
    repo = make_repo(d, {"a": b"a"})
    return ["--profile", BUSYBOX, "--mount", f"{repo}@no-such-ref:/src"], ["SandboxProfileInvalid", "no-such-ref"]


def _network(d: Path) -> tuple[list[str], list[str]]:
    prof = profile_file(d, network="unrestricted")
    return ["--profile", str(prof)], ["SandboxCapabilityUnavailable", "profile.network_policy.mode", "unrestricted"]


def _too_much_cpu(d: Path) -> tuple[list[str], list[str]]:
    prof = profile_file(d, cpu_millis=500_000)
    return ["--profile", str(prof)], [
        "SandboxCapabilityUnavailable",
        "profile.resource_limits.cpu_millis",
        "above the maximum",
    ]


REFUSALS: dict[str, Case] = {
    "unknown-field": _unknown_field,
    "bad-toml": _bad_toml,
    "unpinned-package": _unpinned,
    "no-such-profile-file": _no_profile,
    "unknown-image": _unknown_image,
    "missing-mount-source": _missing_mount,
    "relative-mount-target": _relative_target,
    "missing-git-ref": _missing_ref,
    "network-not-served": _network,
    "cpu-above-maximum": _too_much_cpu,
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_is_one_clear_line_and_leaves_nothing(dcli: Cli, tmp_path: Path, case: str) -> None:
    args, phrases = REFUSALS[case](tmp_path)
    done = dcli("run", *args, "--", "true")
    assert done.code == 125, str(done)
    assert done.out == b""
    assert any(ln.startswith(f"{phrases[0]}: ") for ln in done.err.splitlines()), str(done)
    for phrase in phrases:
        assert phrase in done.said, f"{phrase!r} missing:\n{done}"
    assert done.said.count(phrases[0]) == 1, str(done)


# 6. Interruption in every phase --------------------------------------------------------------------

PHASES = ("materialize", "provision", "stage", "activate", "process", "capture")
AFTER_PROVISION = {"stage", "activate", "process", "capture"}
WRITE_OUT = "mkdir -p /home/sandbox/out && echo x > /home/sandbox/out/f"


def interrupted(done: Done, signum: int) -> None:
    assert done.code == 128 + signum, str(done)
    assert f"interrupted by {signal.Signals(signum).name}" in done.said, str(done)
    assert "nothing is left behind" in done.said, str(done)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", PHASES)
def test_an_interrupt_before_each_phase_releases_everything(
    dcli: Cli, engine: Any, tmp_path: Path, phase: str, signum: int
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_bytes(b"staged\n")
    running = dcli.start(
        "run",
        "--profile",
        BUSYBOX,
        "--mount",
        f"{data}:/data",
        "--capture",
        "/home/sandbox/out",
        "--",
        "sh",
        "-c",
        WRITE_OUT,
        pause_before=phase,
    )
    running.wait_for(f"paused before {phase}")
    held = containers(engine, dcli.tag)
    assert bool(held) == (phase in AFTER_PROVISION), held  # the interrupt finds a sandbox to reclaim, or none yet
    running.send(signum)
    done = running.finish()
    interrupted(done, signum)
    [run] = dcli.json("runs", "list")
    assert run["status"] == "interrupted"
    shown = dcli.json("runs", "show", run["run_id"])
    assert [a["state"] for a in shown["allocations"]] == (["released"] if phase in AFTER_PROVISION else [])


def test_an_interrupt_while_the_command_runs_stops_it_and_releases(dcli: Cli, engine: Any) -> None:
    running = dcli.start("run", "--profile", BUSYBOX, "--", "sleep", "30")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        up = containers(engine, dcli.tag, status="running")
        if up and any("sleep 30" in " ".join(p) for p in up[0].top().get("Processes") or []):
            break
        assert running.proc.poll() is None, running.stderr()
        time.sleep(0.05)
    else:
        pytest.fail(f"the command never ran:\n{running.stderr()}")
    t0 = time.monotonic()
    running.send(signal.SIGINT)
    done = running.finish()
    assert time.monotonic() - t0 < 10
    interrupted(done, signal.SIGINT)


def test_repeated_signals_do_not_cut_the_release_short(dcli: Cli, engine: Any) -> None:
    running = dcli.start("run", "--profile", BUSYBOX, "--", "true", pause_before="process")
    running.wait_for("paused before process")
    assert containers(engine, dcli.tag)
    running.send(signal.SIGINT)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        time.sleep(0.01)
        if running.proc.poll() is not None:
            break
        running.send(signum)
    done = running.finish()
    assert done.code == 130, str(done)
    assert "interrupted" in done.said
