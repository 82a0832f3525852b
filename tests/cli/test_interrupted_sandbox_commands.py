"""``checkfu snapshot``, ``checkfu clone`` and ``checkfu resume`` interrupted (SIGKILL, SIGINT, SIGTERM) at the
moment that matters leave nothing behind once one ``checkfu runner reconcile`` has run: the source sandbox is not
left paused, no image or container of the cut-short command is left, every Run and sandbox row is settled, and the
source lives on. And a sandbox whose container is gone (``docker kill``) is settled by the ``exec`` that finds it
so, never shown ``live`` (issue 29).

Snapshot and clone pause the source while its writable areas are read: ``capturepoint.py`` (a test-owned wrapper of
docker-py's ``pause``) holds the capture right after the engine paused the sandbox, which the test sees from
outside (``docker inspect``: ``State.Paused``) before it signals the command. Resume is held by ``killpoint.py``
once the provider made the new sandbox. SIGINT and SIGTERM are sent while held, then the hold is let go, so the
command winds up as it would if the signal had come mid-capture.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checkfu.core.journal import Journal, sqlite_url

from .test_run_cli import PROFILES, Cli, Running
from .test_run_docker import dcli, engine  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker

HERE = Path(__file__).parent
CAPTUREPOINT = HERE / "capturepoint.py"
KILLPOINT = HERE / "killpoint.py"
PROFILE = str(PROFILES / "busybox-none.toml")
SIGNALS = [pytest.param(s, id=s.name) for s in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM)]


def start(cli: Cli, argv: list[str], **env: str) -> Running:
    n = len(cli.started)
    out_path, err_path = cli.home / f"held-{n}.out", cli.home / f"held-{n}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(argv, cwd=cli.home, env=cli.env(env), stdout=out, stderr=err)
    running = Running(proc, argv, out_path, err_path)
    cli.started.append(running)
    return running


def signal_held(running: Running, sig: signal.Signals, resume: Path) -> None:
    """Signal the held command; for SIGINT and SIGTERM let the hold go, so it winds up; wait for its end."""
    running.send(sig)
    if sig != signal.SIGKILL:
        time.sleep(0.3)
        resume.touch()
    code = running.proc.wait(timeout=120)
    said = running.stderr()
    assert "Traceback" not in said, said
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 128 + sig, said
        # it says it undid everything it began only where the reconcile after it finds nothing (``undone_by_itself``)
        assert f"interrupted by {sig.name}: everything it had begun is undone" in " ".join(said.split()), said


def journal_of(cli: Cli) -> Journal:
    return Journal(sqlite_url(cli.journal_path))


def sandbox_row(cli: Cli, sandbox_id: str) -> dict[str, Any]:
    from checkfu.core.journal import sandboxes  # noqa: PLC0415

    j = journal_of(cli)
    try:
        with j.tx() as c:
            row = c.execute(sandboxes.select().where(sandboxes.c.sandbox_id == sandbox_id)).mappings().one()
        return dict(row)
    finally:
        j.close()


def unsettled(cli: Cli) -> tuple[list[str], list[str], list[str], list[str]]:
    """Runs still ``running``; open allocation rows; sandboxes ``provisioning`` or ``live``; snapshots ``pending``."""
    from checkfu.core.journal import sandbox_snapshots, sandboxes  # noqa: PLC0415

    j = journal_of(cli)
    try:
        running = [r.run_id for r in j.list_runs(1000) if r.status == "running"]
        open_rows = [f"{r.kind} {r.allocation_key} {r.state}" for r in j.open_allocations(runner_tag=cli.tag)]
        with j.tx() as c:
            boxes = [
                f"{r.sandbox_id} {r.state}"
                for r in c.execute(sandboxes.select().where(sandboxes.c.state.in_(["provisioning", "live"])))
            ]
            pending = [
                r.snapshot_ref
                for r in c.execute(sandbox_snapshots.select().where(sandbox_snapshots.c.state == "pending"))
            ]
    finally:
        j.close()
    return running, open_rows, boxes, pending


def tagged(engine: Any, tag: str, kind: str) -> list[dict[str, Any]]:  # noqa: F811
    flt = {"label": [f"checkfu.runner_tag={tag}", f"checkfu.kind={kind}"]}
    if kind == "snapshot":
        return list(engine.api.images(filters=flt))
    return list(engine.api.containers(all=True, filters=flt))


def paused(engine: Any, key: str) -> bool:  # noqa: F811
    flt = {"label": [f"checkfu.allocation_key={key}", "checkfu.kind=instance"]}
    (c,) = engine.api.containers(all=True, filters=flt)
    return bool(engine.api.inspect_container(c["Id"])["State"]["Paused"])


def source(cli: Cli) -> tuple[str, str, str]:
    """A detached sandbox with a file in its home: its id, its allocation key and its Run."""
    made = cli.json("sandbox", "create", "--profile", PROFILE, "--ttl", "10m")
    sandbox_id = made["sandbox_id"]
    done = cli("exec", sandbox_id, "--", "sh", "-c", "echo kept > /home/sandbox/f")
    assert done.code == 0, str(done)
    row = sandbox_row(cli, sandbox_id)
    return sandbox_id, row["allocation_key"], row["run_id"]


def lives_on(cli: Cli, engine: Any, sandbox_id: str, key: str, run_id: str) -> None:  # noqa: F811
    """After one reconcile: the source is thawed and works, and nothing but it is held, live or running."""
    assert paused(engine, key) is False
    running, open_rows, boxes, pending = unsettled(cli)
    assert running == [run_id]
    assert [r.split()[1] for r in open_rows] == [key], open_rows
    assert boxes == [f"{sandbox_id} live"]
    assert pending == []
    shown = cli.json("ps")
    assert [(b["id"], b["state"]) for b in shown["sandboxes"]] == [(sandbox_id, "live")], shown
    assert shown["runs"] == [] and shown["snapshots"] == [], shown
    assert [c for c in tagged(engine, cli.tag, "instance") if c["Labels"]["checkfu.allocation_key"] != key] == []
    done = cli("exec", sandbox_id, "--", "cat", "/home/sandbox/f", timeout=60)
    assert (done.code, done.out) == (0, b"kept\n"), str(done)


def undone_by_itself(report: dict[str, Any], sig: signal.Signals) -> None:
    """A command interrupted by SIGINT or SIGTERM said it undid everything it began: the reconcile found nothing."""
    if sig != signal.SIGKILL:
        assert (report["compensated"], report["enumerated"], report["settled_runs"]) == ([], [], []), report


def reconcile_once(cli: Cli) -> dict[str, Any]:
    done = cli("runner", "reconcile", "--json", timeout=120)
    assert done.code == 0, str(done)
    report: dict[str, Any] = json.loads(done.out)
    assert report["failed"] == {} and report["skipped"] == {}, report
    return report


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_snapshot_interrupted_while_its_source_is_paused_leaves_nothing(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    sandbox_id, key, run_id = source(dcli)
    resume = tmp_path / "go"
    argv = [sys.executable, str(CAPTUREPOINT), "snapshot", sandbox_id, "--json"]
    held = start(dcli, argv, CAPTUREPOINT_RESUME_FILE=str(resume))
    held.wait_for("capturepoint paused", timeout=90)
    assert paused(engine, key) is True  # seen from outside: the moment that matters
    signal_held(held, sig, resume)

    undone_by_itself(reconcile_once(dcli), sig)
    assert tagged(engine, dcli.tag, "snapshot") == []  # no image of the cut-short snapshot
    lives_on(dcli, engine, sandbox_id, key, run_id)
    assert dcli("sandbox", "rm", sandbox_id).code == 0


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_clone_interrupted_while_its_source_is_paused_leaves_nothing(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    sandbox_id, key, run_id = source(dcli)
    resume = tmp_path / "go"
    held = start(
        dcli, [sys.executable, str(CAPTUREPOINT), "clone", sandbox_id, "--json"], CAPTUREPOINT_RESUME_FILE=str(resume)
    )
    held.wait_for("capturepoint paused", timeout=90)
    assert paused(engine, key) is True
    signal_held(held, sig, resume)

    undone_by_itself(reconcile_once(dcli), sig)
    lives_on(dcli, engine, sandbox_id, key, run_id)
    assert dcli("sandbox", "rm", sandbox_id).code == 0


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_resume_interrupted_once_its_sandbox_is_made_leaves_nothing(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    sandbox_id, key, run_id = source(dcli)
    snap = dcli.json("snapshot", sandbox_id)["snapshot_id"]
    resume = tmp_path / "go"
    point = "answered:resume#1"
    argv = [sys.executable, str(KILLPOINT), point, "cli", "resume", snap, "--json"]
    held = start(dcli, argv, KILLPOINT_RESUME_FILE=str(resume))
    held.wait_for(f"killpoint {point}", timeout=90)
    assert len(tagged(engine, dcli.tag, "instance")) == 2  # the provider made the resumed sandbox
    signal_held(held, sig, resume)

    undone_by_itself(reconcile_once(dcli), sig)
    shown = dcli.json("ps")
    assert [s["id"] for s in shown["snapshots"]] == [snap]  # the snapshot resumed from is kept
    lives_on_but_snapshot = unsettled(dcli)
    assert lives_on_but_snapshot[0] == [run_id]
    assert sorted(r.split()[0] for r in lives_on_but_snapshot[1]) == ["instance", "snapshot"]
    assert lives_on_but_snapshot[2:] == ([f"{sandbox_id} live"], [])
    assert [c["Labels"]["checkfu.allocation_key"] for c in tagged(engine, dcli.tag, "instance")] == [key]
    assert dcli("sandbox", "rm", snap).code == 0
    assert dcli("sandbox", "rm", sandbox_id).code == 0


@pytest.mark.parametrize("as_json", [False, True], ids=["stream", "json"])
def test_an_exec_that_finds_the_container_gone_settles_the_sandbox_and_its_run(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    as_json: bool,
) -> None:
    sandbox_id, key, run_id = source(dcli)
    (c,) = engine.api.containers(filters={"label": [f"checkfu.allocation_key={key}", "checkfu.kind=instance"]})
    engine.api.kill(c["Id"])  # gone behind checkfu's back

    done = dcli("exec", *(["--json"] if as_json else []), sandbox_id, "--", "true")
    assert done.code == 125, str(done)
    said = " ".join(done.err.split())
    assert f"sandbox {sandbox_id} is gone" in said and "its Run is settled as failed" in said, str(done)

    row = sandbox_row(dcli, sandbox_id)
    assert row["state"] == "failed" and row["reason"].startswith("lost: "), row
    j = journal_of(dcli)
    try:
        run = j.run(run_id)
        assert run is not None and run.status == "failed", run
    finally:
        j.close()
    shown = dcli.json("ps")
    assert shown["sandboxes"] == [] and shown["runs"] == [], shown
    assert tagged(engine, dcli.tag, "instance") == []
    again = dcli("exec", sandbox_id, "--", "true")
    assert again.code == 125 and "failed" in again.said, str(again)


def test_a_sandbox_whose_making_failed_after_the_provider_made_it_is_recorded_failed_not_refused(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Once the provider made the sandbox, a failure is the Run's (``failed``), not a refusal (``refused:...``, a
    Run that never got a sandbox)."""
    resume = tmp_path / "go"
    point = "answered:provision#1"
    argv = [sys.executable, str(KILLPOINT), point, "cli", "sandbox", "create", "--profile", PROFILE, "--json"]
    held = start(dcli, argv, KILLPOINT_RESUME_FILE=str(resume))
    held.wait_for(f"killpoint {point}", timeout=90)
    (made,) = tagged(engine, dcli.tag, "instance")
    engine.api.remove_container(made["Id"], force=True, v=True)  # gone before it is activated
    resume.touch()
    assert held.proc.wait(timeout=120) == 125, held.stderr()
    j = journal_of(dcli)
    try:
        (run,) = j.list_runs(10)
    finally:
        j.close()
    assert run.status == "failed", run
    assert unsettled(dcli) == ([], [], [], [])
    assert tagged(engine, dcli.tag, "instance") == []


def test_an_orphan_on_the_default_engine_is_pointed_to_with_docker_host_unset(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
) -> None:
    """A Run made on the default engine (``DOCKER_HOST`` unset), seen from a command that names another engine:
    the way back is ``env -u DOCKER_HOST``, never ``DOCKER_HOST=default`` (which names no engine)."""
    point = "answered:openProcess#1"
    argv = [sys.executable, str(KILLPOINT), point, "cli", "run", "--profile", PROFILE, "--", "sleep", "31.5"]
    held = start(dcli, argv, DOCKER_HOST="")
    held.wait_for(f"killpoint {point}", timeout=90)
    held.send(signal.SIGKILL)
    held.proc.wait(timeout=30)
    elsewhere = dcli("runs", "list", DOCKER_HOST="unix:///var/run/docker.sock")
    assert "its sandbox is on another Docker engine (default)" in elsewhere.said, str(elsewhere)
    assert "`env -u DOCKER_HOST checkfu runs list`" in elsewhere.said, str(elsewhere)
    assert "DOCKER_HOST=default" not in elsewhere.said, str(elsewhere)
    done = dcli("runner", "reconcile", "--json", DOCKER_HOST="")
    assert done.code == 0, str(done)
    assert tagged(engine, dcli.tag, "instance") == []


@pytest.mark.parametrize("point", ["before:snapshot#1", "answered:snapshot#1"])
def test_a_snapshot_killed_before_or_after_its_provider_call_leaves_nothing(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    point: str,
) -> None:
    """Journaled ``pending`` before the provider is asked: killed before the call or once the image is made (not
    yet recorded), the snapshot is found by the next command and undone; the source lives on."""
    sandbox_id, key, run_id = source(dcli)
    held = start(dcli, [sys.executable, str(KILLPOINT), point, "cli", "snapshot", sandbox_id, "--json"])
    held.wait_for(f"killpoint {point}", timeout=90)
    if point.startswith("answered:"):
        assert len(tagged(engine, dcli.tag, "snapshot")) == 1  # the image is made, and nothing says so yet
    held.send(signal.SIGKILL)
    assert held.proc.wait(timeout=30) == -signal.SIGKILL

    report = reconcile_once(dcli)
    assert len(report["compensated"]) == 1, report  # the snapshot's allocation, though its sandbox lives
    assert tagged(engine, dcli.tag, "snapshot") == []
    lives_on(dcli, engine, sandbox_id, key, run_id)
    assert dcli("sandbox", "rm", sandbox_id).code == 0


def test_an_exec_on_a_sandbox_left_paused_thaws_it_rather_than_destroying_it(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
) -> None:
    """A sandbox the engine reports paused, with no capture of a live process under way (here paused behind
    checkfu's back, as a dead capture leaves it when nothing journaled says so), is thawed by the next call, which
    goes on: it is never taken for gone and destroyed."""
    sandbox_id, key, run_id = source(dcli)
    (c,) = engine.api.containers(filters={"label": [f"checkfu.allocation_key={key}", "checkfu.kind=instance"]})
    engine.api.pause(c["Id"])
    assert paused(engine, key) is True
    done = dcli("exec", sandbox_id, "--", "cat", "/home/sandbox/f")
    assert (done.code, done.out) == (0, b"kept\n"), str(done)
    lives_on(dcli, engine, sandbox_id, key, run_id)
    assert dcli("sandbox", "rm", sandbox_id).code == 0
