"""The crash pass (issue 29): a signal at any phase of ``checkfu run``, ``sandbox create``, ``pool fill``,
``run --pool`` and the SDK leaves nothing behind, and every answer about what is left is true.

Each case runs the real command as a subprocess with a state directory and runner tag of its own
(``XDG_STATE_HOME``, ``CHECKFU_RUNNER_TAG``), held in one phase by ``crash.py`` (the tests' own injection
point: inside the provider's worker thread where the work is there, see its docstring), and signals it:

- SIGINT or SIGTERM: it exits 130 or 143 (a program of the SDK's: Ctrl-C is its ``KeyboardInterrupt``, raised
  once the sandbox being made was wound up; SIGTERM ends a Python program that set no handler for it at once, as
  SIGKILL does, below); then, before any other ``checkfu``
  command opens the journal (one would reap what the command left), nothing carrying its tag is on the engine,
  its Runs are settled, no sandbox is ``provisioning`` or ``live`` and no allocation is open.
- SIGKILL: one ``checkfu runner reconcile`` afterwards, and then the same holds.

A message that says nothing is left behind is checked against the engine right after the command ended.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_run_cli import Cli, Done, Running
from .test_run_docker import BUSYBOX, LABEL, docker_cli, engine  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker

CRASH = Path(__file__).with_name("crash.py")
INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL


@pytest.fixture
def dcli(tmp_path: Path, engine: Any) -> Iterator[Cli]:  # noqa: F811
    with docker_cli(tmp_path, engine) as cli:
        yield cli


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A mount of a few small files: staged one ``writeFile`` each."""
    where = tmp_path / "data"
    where.mkdir()
    for i in range(5):
        (where / f"f{i}.txt").write_bytes(f"file {i}\n".encode())
    return where


def start(cli: Cli, phase: str, *args: str, **env: str) -> Running:
    """``crash.py PHASE ARGS...`` under ``cli``'s state and tag (no start-up server: this process is the one)."""
    argv = [sys.executable, str(CRASH), phase, *args]
    n = len(cli.started)
    out_path, err_path = cli.home / f"crash-{n}.out", cli.home / f"crash-{n}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            argv, cwd=cli.home, env=cli.env({"CHECKFU_SERVER": "off", **env}), stdout=out, stderr=err
        )
    running = Running(proc, argv, out_path, err_path)
    cli.started.append(running)
    return running


def on_engine(engine: Any, tag: str) -> list[str]:  # noqa: F811
    """Every container, volume, network and image labelled with ``tag``."""
    flt = {"label": f"{LABEL}={tag}"}
    return (
        [f"container {c.name}" for c in engine.containers.list(all=True, filters=flt, ignore_removed=True)]
        + [f"volume {v.name}" for v in engine.volumes.list(filters=flt)]
        + [f"network {n.name}" for n in engine.networks.list(filters=flt)]
        + [f"image {i.id}" for i in engine.images.list(filters=flt)]
    )


def unsettled(cli: Cli) -> dict[str, list[Any]]:
    """What the journal still has open for ``cli``'s tag, read directly (a ``checkfu`` command would reap it)."""
    if not cli.journal_path.exists():
        return {}
    db = sqlite3.connect(f"file:{cli.journal_path}?mode=ro", uri=True)
    try:
        found = {
            "runs": db.execute(
                "SELECT run_id, status FROM runs WHERE runner_tag = ? AND status IN ('running', 'queued')", (cli.tag,)
            ).fetchall(),
            "sandboxes": db.execute(
                "SELECT sandbox_id, state FROM sandboxes WHERE runner_tag = ? AND state IN ('provisioning', 'live')",
                (cli.tag,),
            ).fetchall(),
            "allocations": db.execute(
                "SELECT allocation_key, state FROM allocations WHERE runner_tag = ? AND state IN ('pending', 'live')",
                (cli.tag,),
            ).fetchall(),
        }
    finally:
        db.close()
    return {k: v for k, v in found.items() if v}


def statuses(cli: Cli) -> list[str]:
    db = sqlite3.connect(f"file:{cli.journal_path}?mode=ro", uri=True)
    try:
        return [s for (s,) in db.execute("SELECT status FROM runs WHERE runner_tag = ?", (cli.tag,))]
    finally:
        db.close()


def signalled(cli: Cli, running: Running, phase: str, signum: int) -> Done:
    """Wait until ``running`` is held in ``phase``, signal it and wait for it to end."""
    running.wait_for(f"held in {phase}", timeout=60)
    time.sleep(0.1)  # in the thread's hold, or the loop's, for certain
    running.send(signum)
    return running.finish(timeout=60)


def settled(cli: Cli, engine: Any, done: Done, signum: int, *, python: bool = False) -> None:  # noqa: F811
    """The crash pass's promise after ``done`` ended by ``signum``: see the module's docstring."""
    if signum == KILL or (python and signum == TERM):
        assert done.code == -signum, str(done)
        again = cli("runner", "reconcile", "--json")
        assert again.code == 0, str(again)
    elif python:  # the SDK's program (``crash.sdk``) exits 130 on KeyboardInterrupt, which comes after the wind-up
        assert done.code == 128 + INT, str(done)
    else:
        assert done.code == 128 + signum, str(done)
        assert f"interrupted by {signal.Signals(signum).name}" in done.said, str(done)
        assert "Traceback" not in done.err, str(done)
    left = on_engine(engine, cli.tag)
    if "nothing is left" in done.said:
        assert left == [], f"it said nothing is left, but on the engine: {left}\n{done}"
    assert left == [], f"left on the engine: {left}\n{done}"
    assert unsettled(cli) == {}, str(done)


# checkfu run, at every phase ---------------------------------------------------------------------------------

RUN_CASES = [
    ("resolve", TERM),
    ("select", INT),
    ("materialize", TERM),
    ("provision", INT),
    ("provision", TERM),
    ("provision", KILL),
    ("stage", KILL),
    ("activate", INT),
    ("activate", KILL),
    ("process", TERM),
    ("release", INT),
]


@pytest.mark.parametrize(("phase", "signum"), RUN_CASES, ids=[f"{p}-{signal.Signals(s).name}" for p, s in RUN_CASES])
def test_a_signal_at_any_phase_of_run_leaves_nothing(
    dcli: Cli,
    engine: Any,  # noqa: F811
    data: Path,
    phase: str,
    signum: int,
) -> None:
    running = start(dcli, phase, "run", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--", "cat", "/data/f0.txt")
    done = signalled(dcli, running, phase, signum)
    settled(dcli, engine, done, signum)
    if signum != KILL:
        # No Run before it is selected; one signalled as it released had run its course, as its status says.
        want = {"resolve": [], "select": [], "release": ["succeeded"]}.get(phase, ["interrupted"])
        assert statuses(dcli) == want, str(done)
        assert "nothing is left behind" in done.said, str(done)  # and that was checked


@pytest.mark.parametrize("signum", [INT, TERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_as_a_staged_file_is_handed_over_is_not_lost(
    dcli: Cli,
    engine: Any,  # noqa: F811
    data: Path,
    signum: int,
) -> None:
    """The signal is pending as a ``writeFile`` starts and answers at once: it stops the Run all the same (it used
    to be dropped, and the command ran and exited 0)."""
    running = start(
        dcli,
        "stage",
        "run", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--", "cat", "/data/f0.txt",
        CRASH_SELF=signal.Signals(signum).name,
    )  # fmt: skip
    done = running.finish(timeout=60)
    assert "held in stage" in done.said, str(done)
    assert b"file 0" not in done.out, str(done)  # the command never ran
    settled(dcli, engine, done, signum)
    assert statuses(dcli) == ["interrupted"], str(done)


def test_an_interrupted_provision_says_what_it_checked(dcli: Cli, engine: Any, data: Path) -> None:  # noqa: F811
    """Interrupted while the provider's thread was creating the sandbox: it waits for that thread, compensates
    everything it made, and says nothing is left only because the provider's own list shows nothing."""
    running = start(dcli, "provision", "run", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--", "true")
    done = signalled(dcli, running, "provision", INT)
    settled(dcli, engine, done, INT)
    assert "released and compensated; nothing is left behind" in done.said, str(done)
    [run] = dcli.json("runs", "list")
    shown = dcli.json("runs", "show", run["run_id"])
    members = [e["member"] for e in shown["events"]]
    assert "listAllocations" in members, members  # the check behind the claim is on the Run's record


# sandbox create, pool fill, run --pool -----------------------------------------------------------------------

CREATE_CASES = [("provision", INT), ("provision", TERM), ("stage", TERM), ("stage", KILL)]


@pytest.mark.parametrize(
    ("phase", "signum"), CREATE_CASES, ids=[f"{p}-{signal.Signals(s).name}" for p, s in CREATE_CASES]
)
def test_a_signal_while_a_sandbox_is_made_leaves_nothing(
    dcli: Cli,
    engine: Any,  # noqa: F811
    data: Path,
    phase: str,
    signum: int,
) -> None:
    running = start(dcli, phase, "sandbox", "create", "--profile", BUSYBOX, "--mount", f"{data}:/data")
    done = signalled(dcli, running, phase, signum)
    settled(dcli, engine, done, signum)
    assert done.out == b"", str(done)  # no sandbox id was printed: none was made


@pytest.mark.parametrize("signum", [TERM, KILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_while_the_pool_fills_leaves_nothing(
    dcli: Cli,
    engine: Any,  # noqa: F811
    signum: int,
) -> None:
    running = start(dcli, "provision", "pool", "fill", "--profile", BUSYBOX, "-n", "1", "--mount-target", "/data")
    done = signalled(dcli, running, "provision", signum)
    settled(dcli, engine, done, signum)


def test_a_signal_while_a_run_stages_into_an_adopted_sandbox_leaves_nothing(
    dcli: Cli,
    engine: Any,  # noqa: F811
    data: Path,
) -> None:
    [pooled] = dcli.json("pool", "fill", "--profile", BUSYBOX, "-n", "1", "--mount-target", "/data")["ready"]
    running = start(dcli, "stage", "run", "--pool", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--", "true")
    done = signalled(dcli, running, "stage", INT)
    assert done.code == 130, str(done)
    # The Run that adopted refills the pool in the background, as after any adoption: wait for it, drain it.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not dcli.json("pool", "ls")["ready"]:
        time.sleep(0.5)
    drained = dcli.json("pool", "drain")
    assert drained["left"] == {}
    assert pooled["allocation_key"] not in drained["drained"]  # the adopted one was released, not given back
    settled(dcli, engine, done, INT)


# the SDK -----------------------------------------------------------------------------------------------------

SDK_CASES = [("provision", INT), ("stage", TERM), ("activate", KILL)]


@pytest.mark.parametrize(("phase", "signum"), SDK_CASES, ids=[f"{p}-{signal.Signals(s).name}" for p, s in SDK_CASES])
def test_a_signal_while_the_sdk_makes_a_sandbox_leaves_nothing(
    dcli: Cli,
    engine: Any,  # noqa: F811
    data: Path,
    phase: str,
    signum: int,
) -> None:
    running = start(dcli, phase, "--sdk", BUSYBOX, f"{data}:/data")
    done = signalled(dcli, running, phase, signum)
    assert "sandbox sb-" not in done.said, str(done)  # it never got as far as being made
    settled(dcli, engine, done, signum, python=True)
