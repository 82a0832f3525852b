"""Long-lived sandboxes on the Docker tier, from the SDK and from the command line (issue 11).

Every test has a state directory and runner tag of its own (``dcli``); on the way out nothing labelled
with that tag is on the engine and no allocation of it is open in the journal (snapshots included, so
each test deletes what it took).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pexpect
import pytest

import checkfu
from checkfu import AsyncSandbox
from checkfu.contract.errors import SandboxLeaseFenced, SandboxNotFound, SandboxProfileInvalid, SandboxStateConflict
from checkfu.core.journal import Journal, sqlite_url

from .test_run_cli import Cli
from .test_run_docker import dcli, engine, leftovers  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker

DURABLE = """\
tier = "container"
base_image = "checkfu/busybox:1"
retention_mode = "durable"

[network_policy]
mode = "none"

[resource_limits]
cpu_millis = 500
memory_mib = 128
disk_mib = 64
pids = 64
"""


def durable_profile(where: Path) -> Path:
    path = where / "durable.toml"
    path.write_text(DURABLE, encoding="utf-8")
    return path


def source_tree(where: Path) -> Path:
    src = where / "src"
    (src / "sub").mkdir(parents=True, exist_ok=True)
    (src / "a.txt").write_bytes(b"alpha\n")
    (src / "sub" / "b.txt").write_bytes(b"beta\n")
    return src


@pytest.fixture
def sdk_env(dcli: Cli, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:  # noqa: F811
    """The SDK in this process, with the CLI's state directory and tag."""
    monkeypatch.setenv("XDG_STATE_HOME", str(dcli.state))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", dcli.tag)
    yield dcli


def journal_of(cli: Cli) -> Journal:
    return Journal(sqlite_url(cli.journal_path))


def run_status(cli: Cli, run_id: str) -> str:
    j = journal_of(cli)
    try:
        run = j.run(run_id)
        assert run is not None
        return run.status
    finally:
        j.close()


# the SDK ---------------------------------------------------------------------------------------


def test_sdk_every_call(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    prof = durable_profile(tmp_path)
    src = source_tree(tmp_path)
    with checkfu.Sandbox(profile=prof, mounts=[f"{src}:/work"], provider="docker", ttl=120) as sb:
        assert sb.provider == "docker" and sb.sandbox_id.startswith("sb-")
        # exec: argv, env, cwd, exit status and output
        res = sb.exec(
            ["sh", "-c", 'echo "$GREETING"; pwd; cat a.txt; echo oops >&2; exit 3'], env={"GREETING": "hi"}, cwd="/work"
        )
        assert (res.exit_code, res.stdout, res.stderr) == (3, b"hi\n/work\nalpha\n", b"oops\n")
        # streamed output to callbacks, through openProcess
        outs: list[bytes] = []
        errs: list[bytes] = []
        res = sb.exec("echo one; echo two >&2", on_stdout=outs.append, on_stderr=errs.append)
        assert res.exit_code == 0 and b"".join(outs) == b"one\n" and b"".join(errs) == b"two\n"
        # a timeout kills the command: 124, as coreutils timeout
        t0 = time.monotonic()
        res = sb.exec(["sleep", "30"], timeout=1)
        assert res.timed_out and res.exit_code == 124 and time.monotonic() - t0 < 20
        # spawn: stdin, streamed output, wait; and kill
        got: list[bytes] = []
        proc = sb.spawn(["sh", "-c", "read x; echo got:$x"], on_stdout=got.append)
        proc.send_stdin(b"ping\n")
        proc.close_stdin()
        done = proc.wait()
        assert done.exit_code == 0 and done.stdout == b"got:ping\n" and b"".join(got) == b"got:ping\n"
        sleeper = sb.spawn(["sleep", "60"])
        sleeper.kill()
        assert sleeper.wait().exit_code != 0
        # files
        sb.files.write("/tmp/notes/n.txt", b"note 1\n")
        assert sb.files.read("/tmp/notes/n.txt") == b"note 1\n"
        assert [(e.path, e.kind, e.size) for e in sb.files.list("/tmp/notes")] == [("/tmp/notes/n.txt", "file", 7)]
        with pytest.raises(SandboxNotFound):
            sb.files.read("/tmp/notes/none")
        # snapshot, then change the sandbox: a resume has the snapshot's files, a clone the files now
        snap = sb.snapshot(keep=7 * 86400)
        assert snap.keep == 7 * 86400 and snap.sandbox_id == sb.sandbox_id
        # the lifetime reaches the provider, which states the expiry (checked by the runner: never past the ask)
        assert snap.expires_at is not None and 0 < time.time() + 7 * 86400 - snap.expires_at < 120
        sb.files.write("/tmp/notes/n.txt", b"note 2\n")
        resumed = checkfu.Sandbox.resume(snap, ttl=60)
        clone = sb.clone(ttl=60)
        try:
            assert resumed.files.read("/tmp/notes/n.txt") == b"note 1\n"
            assert resumed.files.read("/work/a.txt") == b"alpha\n"
            assert clone.files.read("/tmp/notes/n.txt") == b"note 2\n"
            assert clone.exec(["cat", "/work/sub/b.txt"]).stdout == b"beta\n"
            assert resumed.sandbox_id not in (sb.sandbox_id, clone.sandbox_id)
        finally:
            resumed.close()
            clone.close()
        sb.delete_snapshot(snap)
        with pytest.raises(SandboxNotFound):
            checkfu.Sandbox.resume(snap, ttl=60)
        # extend moves the deadline
        before = sb.expires_at
        after = sb.extend(600)
        assert after > before + 400 and abs(sb.expires_at - after) < 1
        # another handle attaches by id and sees the same files; closing it leaves the sandbox
        other = checkfu.Sandbox.connect(sb.sandbox_id)
        assert other.files.read("/tmp/notes/n.txt") == b"note 2\n"
        other.close()
        assert sb.exec(["true"]).exit_code == 0
        run_id = sb.run_id
    assert run_status(sdk_env, run_id) == "released"
    with pytest.raises(SandboxStateConflict):
        sb.exec(["true"])
    with pytest.raises(SandboxNotFound, match="released"):
        checkfu.Sandbox.connect(sb.sandbox_id)
    assert not leftovers(engine, sdk_env.tag)


def test_sdk_refusals_leave_nothing(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    with pytest.raises(SandboxProfileInvalid) as bad_ttl:
        checkfu.Sandbox(profile=durable_profile(tmp_path), ttl=-1)
    assert bad_ttl.value.field == "ttl"
    with pytest.raises(SandboxProfileInvalid) as bad_profile:
        checkfu.Sandbox(profile={"tier": "container", "base_image": "checkfu/busybox:1"})
    assert bad_profile.value.field is not None
    with pytest.raises(SandboxNotFound) as unknown:
        checkfu.Sandbox.connect("sb-0123456789abcdef0123")
    assert unknown.value.field == "sandbox_id"
    assert not leftovers(engine, sdk_env.tag)


def test_async_sandbox(sdk_env: Cli, tmp_path: Path) -> None:
    prof = durable_profile(tmp_path)

    async def main() -> None:
        async with AsyncSandbox(profile=prof, ttl=60) as sb:
            await sb.files.write("/tmp/a", "async\n")
            res = await sb.exec(["cat", "/tmp/a"])
            assert res.text == "async\n"
            proc = await sb.spawn(["cat"])
            await proc.send_stdin(b"x")
            await proc.close_stdin()
            assert (await proc.wait()).stdout == b"x"
            snap = await sb.snapshot()
            copy = await AsyncSandbox.resume(snap, ttl=60)
            assert await copy.files.read("/tmp/a") == b"async\n"
            await copy.close()
            await sb.delete_snapshot(snap)

    asyncio.run(main())


# the command line ------------------------------------------------------------------------------


def test_cli_every_command(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    prof = durable_profile(tmp_path)
    src = source_tree(tmp_path)
    made = dcli.json("sandbox", "create", "--profile", str(prof), "--mount", f"{src}:/work", "--ttl", "5m")
    sid = made["sandbox_id"]
    assert made["provider"] == "docker" and made["expires_at"]
    # exec: the exit status passes through; 127 and 126 as docker exec
    done = dcli("exec", "-e", "A=1", "-w", "/work", sid, "--", "sh", "-c", 'echo "$A"; pwd; cat a.txt; exit 7')
    assert done.code == 7 and done.out == b"1\n/work\nalpha\n", str(done)
    assert dcli("exec", sid, "--", "no-such-command").code == 127
    assert dcli("exec", sid, "--", "/work/a.txt").code == 126
    piped = subprocess.run(
        [str(Path(sys.executable).with_name("checkfu")), "exec", "-i", sid, "--", "sh", "-c", "tr a-z A-Z"],
        input=b"shout\n",
        env=dcli.env({}),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (piped.returncode, piped.stdout) == (0, b"SHOUT\n"), piped
    as_json = dcli("exec", "--json", sid, "--", "sh", "-c", "echo out; exit 2")
    assert as_json.code == 2 and json.loads(as_json.out)["stdout"] == "out\n"
    # cp, both ways, a file and a directory
    local = tmp_path / "local.txt"
    local.write_bytes(b"from here\n")
    assert dcli("cp", str(local), f"{sid}:/tmp/").code == 0
    assert dcli("exec", sid, "--", "cat", "/tmp/local.txt").out == b"from here\n"
    back = tmp_path / "back"
    back.mkdir()
    copied = dcli.json("cp", f"{sid}:/work", str(back))
    assert len(copied["copied"]) == 2
    assert (back / "work" / "sub" / "b.txt").read_bytes() == b"beta\n"
    assert dcli("cp", f"{sid}:/tmp/local.txt", str(tmp_path / "again.txt")).code == 0
    nowhere = dcli("cp", "--json", f"{sid}:/tmp/local.txt", str(tmp_path / "no" / "such" / "dir" / "f.txt"))
    assert nowhere.code == 125 and json.loads(nowhere.out)["error"]["code"] == "SandboxPathRejected", str(nowhere)
    assert json.loads(nowhere.out)["error"]["field"] == "path"
    assert (tmp_path / "again.txt").read_bytes() == b"from here\n"
    # snapshot, resume, clone: the files in each copy
    snap = dcli.json("snapshot", sid, "--keep", "7d")
    assert snap["keep_seconds"] == 7 * 86400
    assert dcli("exec", sid, "--", "sh", "-c", "echo later > /tmp/local.txt").code == 0
    resumed = dcli.json("resume", snap["snapshot_id"], "--ttl", "2m")["sandbox_id"]
    cloned = dcli.json("clone", sid, "--ttl", "2m")["sandbox_id"]
    assert dcli("exec", resumed, "--", "cat", "/tmp/local.txt", "/work/a.txt").out == b"from here\nalpha\n"
    assert dcli("exec", cloned, "--", "cat", "/tmp/local.txt", "/work/sub/b.txt").out == b"later\nbeta\n"
    # ps: live sandboxes with owner, age, time left and provider; the snapshot
    ps = dcli.json("ps")
    rows = {b["id"]: b for b in ps["sandboxes"]}
    assert set(rows) == {sid, resumed, cloned}
    assert all(r["owner"] == "detached" and r["provider"] == "docker" and r["state"] == "live" for r in rows.values())
    assert 200 < rows[sid]["time_left_seconds"] <= 300 and rows[sid]["age_seconds"] >= 0
    assert [s["id"] for s in ps["snapshots"]] == [snap["snapshot_id"]]
    kept_until = datetime.fromisoformat(ps["snapshots"][0]["expires_at"].replace("Z", "+00:00")).timestamp()
    assert 0 < time.time() + 7 * 86400 - kept_until < 120
    # a snapshot asked a short lifetime: once it passes, the next command deletes it and nothing resumes it
    brief = dcli.json("snapshot", sid, "--keep", "2s")
    assert brief["expires_at"] is not None
    time.sleep(3)
    assert [s["id"] for s in dcli.json("ps")["snapshots"]] == [snap["snapshot_id"]]
    expired = dcli("resume", "--json", brief["snapshot_id"])
    assert expired.code == 125 and json.loads(expired.out)["error"]["code"] == "SandboxNotFound", str(expired)
    table = dcli("ps")
    assert table.code == 0 and sid.encode() in table.out and b"TIME LEFT" in table.out
    # extend, kill, rm
    extended = dcli.json("sandbox", "extend", sid, "--ttl", "1h")
    assert extended["expires_at"]
    assert any(b["id"] == sid and b["time_left_seconds"] > 3000 for b in dcli.json("ps")["sandboxes"])
    assert dcli.json("kill", cloned)["killed"] == [cloned]
    assert dcli.json("sandbox", "rm", resumed, snap["snapshot_id"])["removed"] == [resumed, snap["snapshot_id"]]
    assert dcli("sandbox", "rm", sid).code == 0
    assert dcli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}
    # a gone sandbox, a bad id, a bad duration: the code and the field, no traceback, nothing made
    gone = dcli("exec", "--json", sid, "--", "true")
    assert gone.code == 125 and json.loads(gone.out)["error"]["code"] == "SandboxNotFound"
    bad = dcli("exec", "not-an-id", "--", "true")
    assert bad.code == 125 and "sandbox_id" in bad.err
    ttl = dcli("sandbox", "create", "--profile", str(prof), "--ttl", "soon", "--json")
    assert ttl.code == 125 and json.loads(ttl.out)["error"] == {
        "code": "SandboxProfileInvalid",
        "message": "--ttl: 'soon' is not a duration: write it as 90s, 30m, 2h or 7d",
        "field": "ttl",
    }
    both = dcli("cp", str(local), str(tmp_path / "x"))
    assert both.code == 125 and "SandboxPathRejected" in both.err
    assert not leftovers(engine, dcli.tag)


def test_created_by_one_process_used_by_another_then_expires(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    """`checkfu sandbox create` (a process that exits) makes it; a second process (the SDK) uses it; once its
    time-to-live passed, the next `checkfu ps` reclaims it and nothing is left."""
    prof = durable_profile(tmp_path)
    sid = dcli.json("sandbox", "create", "--profile", str(prof), "--ttl", "20s")["sandbox_id"]
    user = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, checkfu\n"
            "sb = checkfu.Sandbox.connect(sys.argv[1])\n"
            "sb.files.write('/tmp/by-second', b'second\\n')\n"
            "print(sb.exec(['cat', '/tmp/by-second']).text, end='')\n"
            "sb.close()\n",
            sid,
        ],
        env=dcli.env({}),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert (user.returncode, user.stdout) == (0, b"second\n"), user
    assert [b["state"] for b in dcli.json("ps")["sandboxes"]] == ["live"]  # closing a connection leaves it
    rec = dcli.json("ps")["sandboxes"][0]
    time.sleep(max(0.0, rec["time_left_seconds"]) + 1)
    ps = dcli.json("ps")
    [row] = ps["sandboxes"]
    assert (row["id"], row["state"], row["reclaimed"]) == (sid, "expired", True)
    assert not leftovers(engine, dcli.tag)
    assert run_status(dcli, rec["run_id"]) == "expired"
    assert dcli.json("ps")["sandboxes"] == []
    late = dcli("exec", sid, "--", "true")
    assert late.code == 125 and "reclaimed (expired)" in late.said


HOLDER = """\
import sys, time, checkfu
sb = checkfu.Sandbox(profile=sys.argv[1], ttl=600)
print(sb.sandbox_id, flush=True)
time.sleep(600)
"""


def test_kill_9_of_the_owner_then_ps_reclaims(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    prof = durable_profile(tmp_path)
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(prof)], env=dcli.env({}), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as holder:
        try:
            assert holder.stdout is not None
            sid = holder.stdout.readline().decode().strip()
            assert sid.startswith("sb-"), holder.stderr.read() if holder.stderr else ""
            [live] = dcli.json("ps")["sandboxes"]
            assert live["state"] == "live" and live["owner"] != "detached"
            assert leftovers(engine, dcli.tag)
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
    ps = dcli.json("ps")
    [row] = ps["sandboxes"]
    assert (row["id"], row["state"], row["reclaimed"]) == (sid, "orphaned", True)
    assert not leftovers(engine, dcli.tag)
    assert run_status(dcli, row["run_id"]) == "abandoned"


def test_kill_a_run(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    """`checkfu kill RUN` stops a `checkfu run` in progress: it releases what it held and is recorded interrupted."""
    running = dcli.start("run", "--profile", str(durable_profile(tmp_path)), "--", "sleep", "120")
    deadline = time.monotonic() + 90
    runs: list[Any] = []
    while time.monotonic() < deadline and not runs:
        runs = [r for r in dcli.json("ps")["runs"] if r["state"] == "running"]
        time.sleep(0.5)
    assert runs, "the Run never showed in ps"
    [run] = runs
    assert run["provider"] == "docker" and run["owner"] != "detached"
    killed = dcli.json("kill", run["id"])
    assert killed["kind"] == "run"
    running.proc.wait(timeout=60)
    assert run_status(dcli, run["id"]) == "interrupted"
    assert dcli.json("ps")["runs"] == []
    again = dcli("kill", run["id"], "--json")
    assert again.code == 125 and json.loads(again.out)["error"]["code"] == "SandboxStateConflict"
    assert not leftovers(engine, dcli.tag)


def test_ttl_passed_fences_calls(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    """A call made after the time-to-live passed is refused (the lease's deadline is the TTL), and the
    sandbox is reclaimed by the next command."""
    sb = checkfu.Sandbox(profile=durable_profile(tmp_path), ttl=3, detach=True)
    time.sleep(max(0.0, sb.expires_at - time.time()) + 0.5)
    with pytest.raises(SandboxLeaseFenced) as fenced:
        sb.exec(["true"])
    assert fenced.value.field == "ttl"
    # Any command that opens the journal reclaims it, not only ps: here `checkfu runs list`.
    listed = sdk_env("runs", "list", "--json")
    assert listed.code == 0 and f"reclaimed sandbox {sb.sandbox_id}: expired" in listed.said, str(listed)
    assert not leftovers(engine, sdk_env.tag)
    assert run_status(sdk_env, sb.run_id) == "expired"
    assert sdk_env.json("ps")["sandboxes"] == []
    sb.close()  # already reclaimed: nothing to do, no error


def test_exec_it_is_a_terminal_that_follows_the_callers(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    """``checkfu exec -it`` as a person types it: a real terminal inside, the caller's window size, and the
    shell's own exit status."""
    sid = dcli.json("sandbox", "create", "--profile", str(durable_profile(tmp_path)), "--ttl", "5m")["sandbox_id"]
    try:
        shell = pexpect.spawn(
            str(Path(sys.executable).with_name("checkfu")),
            ["exec", "-it", sid, "--", "sh"],
            env=dcli.env({"TERM": "dumb"}),
            timeout=60,
            dimensions=(31, 99),
        )
        try:
            shell.expect(r"[$#] ")
            shell.sendline("stty size; tty; echo $((6 * 7))")
            shell.expect("31 99")
            shell.expect("/dev/pts/")
            shell.expect("42")
            shell.sendline("exit 5")
            shell.expect(pexpect.EOF)
        finally:
            shell.close(force=True)
        assert shell.exitstatus == 5
    finally:
        assert dcli("sandbox", "rm", sid).code == 0
    assert not leftovers(engine, dcli.tag)


def test_create_leaves_out_what_exclude_names(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    """``sandbox create --exclude GLOB`` leaves files out of a directory mount as ``run --exclude`` does."""
    proj = tmp_path / "proj"
    (proj / ".venv").mkdir(parents=True)
    (proj / ".venv" / "big.bin").write_bytes(b"v" * 1000)
    (proj / "app.py").write_text("print('app')\n")
    (proj / "app.pyc").write_text("compiled\n")
    made = dcli.json(
        "sandbox", "create", "--profile", str(durable_profile(tmp_path)), "--mount", f"{proj}:/w",
        "--exclude", ".venv", "--exclude", "*.pyc", "--ttl", "5m",
    )  # fmt: skip
    sid = made["sandbox_id"]
    try:
        listed = dcli("exec", sid, "--", "sh", "-c", "cd /w && find . -type f | sort")
        assert listed.code == 0 and listed.out.decode().split() == ["./app.py"], str(listed)
    finally:
        assert dcli("sandbox", "rm", sid).code == 0
