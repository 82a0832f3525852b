"""``checkfu submit`` takes ``checkfu run``'s options, refused by run's own checks before anything is queued;
``checkfu runs wait`` on a Run no runner has claimed says so and exits 124 at its ``--timeout``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKFU = str(Path(sys.executable).with_name("checkfu"))
PROFILE = Path(__file__).resolve().parents[2] / "examples" / "profiles" / "debian-none.toml"


def checkfu(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHECKFU_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["COLUMNS"] = "400"  # a usage error's box is not wrapped mid-message
    return subprocess.run([CHECKFU, *args], check=False, capture_output=True, text=True, timeout=120, env=env)


def queued(tmp_path: Path, db: str) -> list[dict[str, object]]:
    done = checkfu(tmp_path, "runs", "list", "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    runs: list[dict[str, object]] = json.loads(done.stdout)
    return runs


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--profile", "no-such-profile.toml"], "no-such-profile.toml"),
        (["--profile", str(PROFILE), "--timeout", "0"], "--timeout"),
        (["--profile", str(PROFILE), "--allow", "not a destination"], "allow"),
        (["--profile", str(PROFILE), "--mount", "relative:workspace"], "workspace"),
        (["--profile", str(PROFILE), "--provider", "no-such-provider"], "no-such-provider"),
        (["--profile", str(PROFILE), "--credential-file", "/dev/null"], "--credential-file"),
    ],
)
def test_submit_refuses_what_run_refuses_and_queues_nothing(args: list[str], named: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    done = checkfu(tmp_path, "submit", "--db", db, *args, "--", "true")
    assert done.returncode != 0
    assert named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""  # no run id
    assert queued(tmp_path, db) == []


def test_a_submitted_run_is_queued_and_waited_for(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    done = checkfu(tmp_path, "submit", "--db", db, "--profile", str(PROFILE), "--", "echo", "hi")
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert run_id.startswith("run-") and "\n" not in run_id
    (row,) = queued(tmp_path, db)
    assert (row["run_id"], row["status"]) == (run_id, "queued")
    waited = checkfu(tmp_path, "runs", "wait", run_id, "--db", db, "--timeout", "1")
    assert waited.returncode == 124, waited.stderr  # no runner serves this journal
    assert "queued" in waited.stderr
    assert "Traceback" not in waited.stderr


def test_the_sdk_reads_a_profile_bounded_and_queues_nothing_it_refuses(tmp_path: Path) -> None:
    """``checkfu.submit`` reads the profile file as ``checkfu run`` does: a FIFO is refused by what it is (it
    never blocks waiting for a writer), as is a device; nothing is queued."""
    import checkfu  # noqa: PLC0415
    from checkfu.contract.errors import SandboxProfileInvalid  # noqa: PLC0415

    db = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    fifo = tmp_path / "profile.toml"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(SandboxProfileInvalid, match=kind):
            checkfu.submit(["true"], db=db, provider="memory", profile=path)
    assert queued(tmp_path, db) == []


@pytest.mark.parametrize(
    ("args", "named", "why"),
    [
        (["-e", "TOKEN=secret"], "-e/--env", "never reaches the journal"),
        (["-i"], "-i", "no caller's input"),
        (["-t"], "-t", "no terminal"),
        (["--json", "summary.json"], "--json", "runs wait RUN --json"),
    ],
)
def test_submit_refuses_what_a_queued_run_cannot_carry_by_name(
    args: list[str], named: str, why: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    done = checkfu(tmp_path, "submit", "--db", db, "--profile", str(PROFILE), *args, "--", "true")
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and why in done.stderr, done.stderr
    assert "secret" not in done.stderr
    assert queued(tmp_path, db) == []


def test_submit_carries_the_workdir_a_writable_mount_and_no_ignore(tmp_path: Path) -> None:
    from checkfu.core.clock import SystemClock  # noqa: PLC0415
    from checkfu.core.journal import Journal  # noqa: PLC0415
    from checkfu.core.queue import RunQueue  # noqa: PLC0415

    db = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    done = checkfu(
        tmp_path, "submit", "--db", db, "--profile", str(PROFILE), "-w", "/work", "--no-ignore",
        "--mount", f"{tmp_path / 'src'}:/work:rw", "-q", "--", "ls",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    journal = Journal(db)
    try:
        request = RunQueue(journal, SystemClock()).request(done.stdout.strip())
    finally:
        journal.close()
    assert request is not None
    assert (request.workdir, request.stage_all, request.mounts) == ("/work", True, (f"{tmp_path / 'src'}:/work:rw",))
