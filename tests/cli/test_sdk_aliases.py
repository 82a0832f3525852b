"""The SDK's E2B and Modal names (issue 32): thin aliases of checkfu's own calls, on the Docker tier.

Each alias is held to the call it stands for (the same result, the same refusal), and every test leaves nothing
labelled with its tag on the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from checkfu import AsyncSandbox, Sandbox
from checkfu.contract.errors import SandboxPathRejected, SandboxProfileInvalid, SandboxProviderFailed

from .test_run_cli import REPO, Cli
from .test_run_docker import dcli, engine, leftovers  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker

EPHEMERAL = str(REPO / "examples" / "profiles" / "busybox-none.toml")
DURABLE = str(REPO / "examples" / "profiles" / "busybox-durable.toml")


@pytest.fixture
def sdk(dcli: Cli, engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:  # noqa: F811
    monkeypatch.setenv("XDG_STATE_HOME", str(dcli.state))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", dcli.tag)
    yield dcli
    assert leftovers(engine, dcli.tag) == []


def test_commands_run_is_exec_and_spawn(sdk: Cli) -> None:
    with Sandbox.create(profile=EPHEMERAL) as sb:
        chunks: list[bytes] = []
        done = sb.commands.run("echo out; echo err >&2; exit 3", on_stdout=chunks.append, envs={"X": "1"})
        same = sb.exec("echo out; echo err >&2; exit 3")
        assert (
            (done.exit_code, done.stdout, done.stderr)
            == (same.exit_code, same.stdout, same.stderr)
            == (
                3,
                b"out\n",
                b"err\n",
            )
        )
        assert b"".join(chunks) == b"out\n"
        assert sb.commands.run(["sh", "-c", "echo $X"], envs={"X": "from envs"}).stdout == b"from envs\n"
        handle = sb.commands.run("read line; echo got $line", background=True, stdin=b"hello\n")
        handle.close_stdin()
        assert handle.wait().stdout == b"got hello\n"
        slow = sb.commands.run("sleep 30", background=True, timeout=0.5)
        assert slow.wait().timed_out


def test_files_exists_remove_make_dir_rename(sdk: Cli) -> None:
    with Sandbox.create(profile=EPHEMERAL) as sb:
        assert not sb.files.exists("/home/sandbox/d")
        assert sb.files.make_dir("/home/sandbox/d/e") is True
        assert sb.files.make_dir("/home/sandbox/d/e") is False
        sb.files.write("/home/sandbox/d/e/f.txt", "x")
        sb.files.rename("/home/sandbox/d/e/f.txt", "/home/sandbox/d/g.txt")
        assert not sb.files.exists("/home/sandbox/d/e/f.txt")
        assert sb.files.read("/home/sandbox/d/g.txt") == b"x"
        sb.files.remove("/home/sandbox/d")
        assert not sb.files.exists("/home/sandbox/d")
        sb.files.remove("/home/sandbox/never-there")  # nothing there: no error, as rm -f
        with pytest.raises(SandboxProviderFailed) as caught:
            sb.files.rename("/home/sandbox/missing", "/home/sandbox/other")
        assert caught.value.field == "path" and "/home/sandbox/missing" in caught.value.message
        with pytest.raises(SandboxPathRejected) as rejected:
            sb.files.remove("relative/path")
        assert rejected.value.field == "path"
        with pytest.raises(SandboxProviderFailed):  # the read-only root refuses, and says so
            sb.files.make_dir("/usr/new")
        # a name that is a shell word is a path, never a command
        sb.files.make_dir("/tmp/$(touch /tmp/pwned)")
        assert not sb.files.exists("/tmp/pwned")


def test_kill_terminate_set_timeout(sdk: Cli) -> None:
    sb = Sandbox.create(profile=EPHEMERAL, ttl=60)
    before = sb.expires_at
    deadline = sb.set_timeout(3600)
    assert deadline > before + 3000 and abs(sb.expires_at - deadline) < 1
    sb.kill()
    assert sdk.json("ps")["sandboxes"] == []
    other = Sandbox.create(profile=EPHEMERAL)
    other.terminate()
    assert sdk.json("ps")["sandboxes"] == []


def test_pause_and_resume(sdk: Cli) -> None:
    sb = Sandbox.create(profile=DURABLE)
    sb.files.write("/home/sandbox/state.txt", "kept")
    snapshot_id = sb.pause()
    assert snapshot_id.startswith("snap-")
    assert sdk.json("ps")["sandboxes"] == []  # paused: released, its files in the snapshot
    back = Sandbox.resume(snapshot_id)
    try:
        assert back.sandbox_id != sb.sandbox_id
        assert back.files.read("/home/sandbox/state.txt") == b"kept"
        back.delete_snapshot(snapshot_id)
    finally:
        back.kill()


def test_a_paused_sandbox_deletes_its_snapshot_after_its_providers_were_let_go(sdk: Cli) -> None:
    """E2B's ``sid = sb.pause(); sb.delete_snapshot(sid)``: ``pause`` let go of the sandbox's providers (their
    engine client and threads), and the deletion reaches the provider again rather than failing on a closed one."""
    sb = Sandbox.create(profile=DURABLE)
    snapshot_id = sb.pause()
    assert [s["id"] for s in sdk.json("ps")["snapshots"]] == [snapshot_id]
    sb.delete_snapshot(snapshot_id)
    assert sdk.json("ps")["snapshots"] == []


def test_pausing_an_ephemeral_sandbox_is_refused_and_changes_nothing(sdk: Cli) -> None:
    with Sandbox.create(profile=EPHEMERAL) as sb:
        with pytest.raises(SandboxProfileInvalid) as caught:
            sb.pause()
        assert caught.value.field == "retention_mode"
        assert sb.exec("true").exit_code == 0  # still live
        assert sdk.json("ps")["snapshots"] == []


def test_the_async_names(sdk: Cli) -> None:
    async def body() -> None:
        sb = await AsyncSandbox.create(profile=DURABLE)
        try:
            assert (await sb.commands.run("echo hi")).stdout == b"hi\n"
            proc = await sb.commands.run("echo bg", background=True)
            assert (await proc.wait()).stdout == b"bg\n"
            assert await sb.files.make_dir("/tmp/a")
            assert await sb.files.exists("/tmp/a")
            await sb.set_timeout(120)
            assert sb.expires_at - time.time() > 100
        finally:
            await sb.kill()

    asyncio.run(body())


def test_kill_ends_a_sandbox_it_connected_to(sdk: Cli) -> None:
    made = sdk.json("sandbox", "create", "--profile", EPHEMERAL)["sandbox_id"]
    Sandbox.connect(made).kill()  # E2B's way to end a sandbox made elsewhere
    assert sdk.json("ps")["sandboxes"] == []
    other = sdk.json("sandbox", "create", "--profile", EPHEMERAL)["sandbox_id"]
    held = Sandbox.connect(other)
    held.close()  # close of a connected one only lets go
    assert [s["id"] for s in sdk.json("ps")["sandboxes"]] == [other]
    Sandbox.connect(other).terminate()
    assert sdk.json("ps")["sandboxes"] == []


def test_make_dir_over_a_file_is_refused(sdk: Cli) -> None:
    with Sandbox.create(profile=EPHEMERAL) as sb:
        sb.files.write("/tmp/f", "x")
        with pytest.raises(SandboxProviderFailed) as caught:
            sb.files.make_dir("/tmp/f")
        assert caught.value.field == "path" and "not a directory" in caught.value.message
