"""A Run SIGKILLed at every step of its lifecycle, on the Docker and host-process tiers, is finished by one
reconciliation from a fresh process: nothing of it is left, its Run and every row are settled, and a second
reconciliation does nothing.

The Run is frozen at its step by ``killpoint.py`` (a fault-injection point owned by the tests, wrapping the
provider door: the shipped CLI has none) and then killed by the test:

- ``before:M#N``: the N-th call of member M is journaled (an allocation's row written ``pending`` first)
  and the provider not yet asked;
- ``answered:M#N``: the provider answered; the runner neither checked the answer nor settled its row.

``checkfu run`` (with a directory mount and a capture on Docker) is killed before and after each member it
calls: materialize, provision, each staged file, activate, the open process, the capture and release. A
Session driven through the runner API is killed around clone, snapshot and a late release. The default suite
runs a cross-section of the points; ``CHECKFU_SLOW=1`` runs every one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.core.journal import Journal, sqlite_url

from .test_run_cli import PROFILES, Cli, Running, isolated_cli
from .test_run_docker import connect, leftovers, reclaim

KILLPOINT = Path(__file__).with_name("killpoint.py")
SLEEP = "31.25"
"""The command's sleep: an argument no other process on the machine has, so a survivor can be found."""

DOCKER_CLI = (
    "before:materialize#1",
    "before:provision#1",
    "answered:provision#1",
    "answered:writeFile#1",
    "answered:writeFile#2",
    "before:activate#1",
    "answered:activate#1",
    "answered:openProcess#1",
    "answered:readFiles#1",
    "before:release#1",
    "answered:release#1",
)
HOST_CLI = (
    "before:materialize#1",
    "before:provision#1",
    "answered:provision#1",
    "answered:activate#1",
    "answered:openProcess#1",
    "before:release#1",
    "answered:release#1",
)
SESSION = (
    "before:clone#1",
    "answered:clone#1",
    "before:snapshot#1",
    "answered:snapshot#1",
    "answered:release#2",
)
DEFAULT_SUITE = {
    ("docker", "cli", "answered:provision#1"),
    ("docker", "cli", "answered:writeFile#1"),
    ("docker", "cli", "answered:openProcess#1"),
    ("docker", "cli", "answered:release#1"),
    ("docker", "session", "answered:clone#1"),
    ("docker", "session", "answered:snapshot#1"),
    ("host-process", "cli", "answered:provision#1"),
    ("host-process", "cli", "answered:openProcess#1"),
    ("host-process", "session", "answered:snapshot#1"),
}
"""A cross-section that runs in the default suite: an allocation, staging, a running command, release, a
clone and a snapshot. Every other point is marked slow."""


def cases() -> list[Any]:
    out = []
    for tier, mode, points in (
        ("docker", "cli", DOCKER_CLI),
        ("host-process", "cli", HOST_CLI),
        ("docker", "session", SESSION),
        ("host-process", "session", SESSION),
    ):
        for point in points:
            marks = [pytest.mark.docker] if tier == "docker" else []
            if (tier, mode, point) not in DEFAULT_SUITE:
                marks.append(pytest.mark.slow)
            out.append(pytest.param(tier, mode, point, marks=marks, id=f"{tier}-{mode}-{point}"))
    return out


# What a tier can leave behind, seen from outside the runner ----------------------------------------


def host_leftovers(cli: Cli) -> list[str]:
    """Instances and snapshots in the host-process tier's state directory, and any process still running
    the command (found by its unique argument) or working under that directory."""
    root = cli.state / "checkfu" / "host-process"
    left = [f"{kind} {p.name}" for kind in ("instances", "snapshots") for p in sorted((root / kind).glob("*"))]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if SLEEP.encode() in argv or cwd.startswith(str(root)):
            left.append(f"process {proc.name} {argv[:3]!r} in {cwd}")
    return left


@dataclass
class Tier:
    name: str
    engine: Any = None

    def left(self, cli: Cli) -> list[str]:
        return leftovers(self.engine, cli.tag) if self.name == "docker" else host_leftovers(cli)

    def held(self, cli: Cli) -> bool:
        return bool(self.left(cli))

    def clean(self, cli: Cli) -> None:
        if self.name == "docker":
            reclaim(self.engine, cli.tag)


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


@pytest.fixture
def tier(request: pytest.FixtureRequest) -> Tier:
    name = request.node.callspec.params["tier_name"]
    return Tier(name, request.getfixturevalue("docker_engine") if name == "docker" else None)


@pytest.fixture
def kcli(tmp_path: Path, tier: Tier) -> Iterator[Cli]:
    """``isolated_cli``; on the way out nothing of its tag is left on the tier (removed by label if so)."""
    with isolated_cli(tmp_path) as cli:
        yield cli
        cli.stop_all()
        left = tier.left(cli)
        if left:
            tier.clean(cli)
    assert not left, f"left behind: {left}"


def start_at(cli: Cli, point: str, mode: str, *args: str, **env: str) -> Running:
    """Start ``killpoint.py POINT MODE ARGS`` with this CLI's state and tag."""
    argv = [sys.executable, str(KILLPOINT), point, mode, *args]
    n = len(cli.started)
    out_path, err_path = cli.home / f"kill-{n}.out", cli.home / f"kill-{n}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(argv, cwd=cli.home, env=cli.env(env), stdout=out, stderr=err)
    running = Running(proc, argv, out_path, err_path)
    cli.started.append(running)
    return running


def cli_args(tier: str, tmp_path: Path, point: str) -> list[str]:
    """The command sleeps on (to be found alive, if it survives) where it is killed while it runs."""
    wait = f"exec sleep {SLEEP}" if point == "answered:openProcess#1" else "true"
    if tier == "host-process":
        return ["run", "--provider", "host-process", "--profile", str(PROFILES / "host.toml"), "--", "sh", "-c", wait]
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_bytes(b"a\n")
    (data / "b.txt").write_bytes(b"b\n")
    return [
        "run", "--profile", str(PROFILES / "busybox-none.toml"), "--mount", f"{data}:/data",
        "--capture", "/home/sandbox/out", "--",
        "sh", "-c", f"mkdir -p /home/sandbox/out && cp /data/a.txt /home/sandbox/out/ && {wait}",
    ]  # fmt: skip


def kill_at(cli: Cli, point: str, mode: str, args: list[str], **env: str) -> None:
    """Run until ``point``, then SIGKILL it there."""
    running = start_at(cli, point, mode, *args, **env)
    running.wait_for(f"killpoint {point}", timeout=90)
    running.proc.send_signal(signal.SIGKILL)
    assert running.proc.wait(timeout=10) == -signal.SIGKILL


def reconcile_json(cli: Cli, *more: str, **env: str) -> tuple[int, dict[str, Any]]:
    """``checkfu runner reconcile --json`` in a fresh process."""
    done = cli("runner", "reconcile", *more, "--json", timeout=120, **env)
    return done.code, json.loads(done.out)


def settled(cli: Cli, url: str | None = None) -> tuple[list[str], list[str]]:
    """This CLI's Runs still ``running``, and its allocation rows still open (a settled durable snapshot is
    not open: it is a Session's checkpoint)."""
    journal = Journal(url or sqlite_url(cli.journal_path))
    try:
        running = [r.run_id for r in journal.list_runs(1000) if r.status == "running"]
        open_rows = [f"{r.kind} {r.allocation_key} {r.state}" for r in journal.open_allocations(runner_tag=cli.tag)]
    finally:
        journal.close()
    return running, open_rows


def second_pass(cli: Cli) -> dict[str, Any]:
    result = CliRunner().invoke(
        app, ["runner", "reconcile", "--json"], env={"XDG_STATE_HOME": str(cli.state), "CHECKFU_RUNNER_TAG": cli.tag}
    )
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize(("tier_name", "mode", "point"), cases())
def test_a_run_killed_at_this_step_is_finished_by_one_reconciliation(
    kcli: Cli, tier: Tier, tmp_path: Path, tier_name: str, mode: str, point: str
) -> None:
    args = cli_args(tier.name, tmp_path, point) if mode == "cli" else [tier.name]
    kill_at(kcli, point, mode, args)
    if point.startswith("answered:") and "release" not in point:
        assert tier.held(kcli), "the provider answered: something is held for reconciliation to find"

    code, report = reconcile_json(kcli)
    assert code == 0, report
    assert report["failed"] == {} and report["skipped"] == {} and report["unaccounted"] == []
    assert len(report["settled_runs"]) == 1, report
    assert tier.left(kcli) == []
    running, open_rows = settled(kcli)
    assert (running, open_rows) == ([], [])
    shown = kcli.json("runs", "list")
    # A `checkfu run` records its owner process, so its Run is settled as reaped with it; a Session driven
    # through the runner API records none, and is abandoned.
    assert [r["status"] for r in shown] == ["orphaned" if mode == "cli" else "abandoned"]

    again = second_pass(kcli)
    assert (again["compensated"], again["enumerated"], again["settled_runs"], again["failed"]) == ([], [], [], {})


# Two runners, two journals, one engine -------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.parametrize("tags", ["per-journal", "shared"])
def test_two_runners_with_their_own_journals_never_take_each_others_sandboxes(
    tmp_path: Path, docker_engine: Any, tags: str
) -> None:
    """Runner A keeps ``--db other.sqlite``, runner B the default journal; both on one engine, one state
    directory. With tags derived per journal (the default) and even with one tag forced on both, a reconcile
    of either journal takes only what that journal accounts for."""
    cli = Cli(tmp_path, "")
    env = {"CHECKFU_RUNNER_TAG": "shared-" + tmp_path.name[-8:]} if tags == "shared" else {}
    other = sqlite_url(tmp_path / "other.sqlite")
    args = ["run", "--profile", str(PROFILES / "busybox-none.toml"), "--", "sleep", SLEEP]

    def containers() -> dict[str, str]:
        """The containers of either Run (by the keys the two journals hold), each with its runner tag."""
        # The list endpoint alone: other tests remove their containers meanwhile, and an inspect would race them.
        found = docker_engine.api.containers(all=True, filters={"label": "checkfu.allocation_key"})
        return {
            c["Labels"]["checkfu.allocation_key"]: c["Labels"].get("checkfu.runner_tag", "")
            for c in found
            if c["Labels"]["checkfu.allocation_key"] in keys
        }

    def env_of(extra: dict[str, str]) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k not in ("CHECKFU_RUNNER_TAG", "XDG_STATE_HOME")}
        return {**base, "XDG_STATE_HOME": str(cli.state), **extra}

    def start(point: str, *more: str) -> subprocess.Popen[bytes]:
        path = tmp_path / f"{len(procs)}.err"
        with path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(KILLPOINT), point, "cli", *args[:1], *more, *args[1:]],
                cwd=tmp_path, env=env_of(env), stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        procs.append((proc, path))
        return proc

    def wait_said(i: int, phrase: str) -> None:
        deadline = time.monotonic() + 90
        while phrase not in procs[i][1].read_text(errors="replace"):
            assert procs[i][0].poll() is None, procs[i][1].read_text(errors="replace")
            assert time.monotonic() < deadline, procs[i][1].read_text(errors="replace")
            time.sleep(0.05)

    def reconcile(*more: str) -> dict[str, Any]:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("checkfu")), "runner", "reconcile", *more, "--json"],
            cwd=tmp_path, env=env_of(env), capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert b"Traceback" not in done.stderr, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def journal_keys(url: str) -> set[str]:
        journal = Journal(url)
        try:
            return {r.allocation_key for run in journal.list_runs() for r in journal.allocations_for_run(run.run_id)}
        finally:
            journal.close()

    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    keys: set[str] = set()
    try:
        start("answered:openProcess#1", "--db", other)  # A
        start("answered:openProcess#1")  # B
        wait_said(0, "killpoint")
        wait_said(1, "killpoint")
        a_keys, b_keys = journal_keys(other), journal_keys(sqlite_url(cli.journal_path))
        keys = a_keys | b_keys
        assert len(a_keys) == len(b_keys) == 1 and a_keys != b_keys
        held = containers()
        assert set(held) == keys
        if tags == "per-journal":
            assert len(set(held.values())) == 2  # each journal its own tag

        procs[0][0].kill()  # A dies; B is alive
        procs[0][0].wait()
        report_b = reconcile()  # B's journal: A's sandbox is not its to take, B's own Run is live
        assert report_b["compensated"] == report_b["enumerated"] == [] and report_b["settled_runs"] == []
        assert set(containers()) == keys
        if tags == "shared":
            assert report_b["unaccounted"] == sorted(a_keys)  # seen under the shared tag, left alone
        report_a = reconcile("--db", other)  # A's journal: A's sandbox only
        assert report_a["compensated"] == sorted(a_keys) and len(report_a["settled_runs"]) == 1
        assert set(containers()) == b_keys  # B's is untouched, B still runs

        procs[1][0].kill()
        procs[1][0].wait()
        report_b = reconcile()
        assert report_b["compensated"] == sorted(b_keys) and len(report_b["settled_runs"]) == 1
        assert containers() == {}
        assert reconcile()["compensated"] == [] and reconcile("--db", other)["compensated"] == []
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for key in keys:
            flt = {"label": f"checkfu.allocation_key={key}"}
            for c in docker_engine.api.containers(all=True, filters=flt):
                docker_engine.api.remove_container(c["Id"], force=True, v=True)
        left = [
            v["Name"]
            for key in keys
            for v in docker_engine.api.volumes(filters={"label": f"checkfu.allocation_key={key}"})["Volumes"] or []
        ]
        for name in left:
            docker_engine.api.remove_volume(name, force=True)
    assert left == []


# A reconcile under another tag says what it did not take -------------------------------------------


def test_a_reconcile_under_another_tag_names_what_it_left_and_how_to_finish(tmp_path: Path) -> None:
    """The same journal reconciled under a tag that is not the killed Run's (another state directory, or a --db
    spelled otherwise) takes nothing of it, and says so with exit 1 and the command that finishes it; run as
    the Run's own tag, that command does."""
    with isolated_cli(tmp_path) as cli:
        try:
            kill_at(cli, "answered:openProcess#1", "cli", cli_args("host-process", tmp_path, "answered:openProcess#1"))
            assert host_leftovers(cli), "the provider answered: a process and its instance are held"
            other = cli("runner", "reconcile", timeout=120, CHECKFU_RUNNER_TAG="someone-else")
            assert other.code == 1, other
            said = " ".join(other.err.split())
            assert f"recorded under runner tag {cli.tag}" in said and "not taken" in said, other
            assert f"CHECKFU_RUNNER_TAG={cli.tag} checkfu runner reconcile" in said, other
            assert host_leftovers(cli), "another tag's reconcile took nothing"
            code, report = reconcile_json(cli)
            assert code == 0 and report["other_tags"] == {} and len(report["settled_runs"]) == 1, report
            assert host_leftovers(cli) == []
        finally:
            cli.stop_all()
