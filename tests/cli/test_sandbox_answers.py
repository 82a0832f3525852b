"""Every answer of a long-lived sandbox tells the truth (issue 29), on the Docker tier and the host-process tier.

- ``exec`` that cuts its output says so (``truncated``, a warning or a refusal), and the cut is configurable;
- ``Process.pid`` is the process's id inside the sandbox;
- ``checkfu cp`` out of a sandbox keeps permission bits and copies files larger than the runner's read bound, and a
  refusal the contract lists for ``readFiles`` does not cost the user their sandbox;
- a mistyped provider, a bad environment name and a bad timeout are refused as what they are; a ``files.write``
  that runs out of space leaves nothing behind; a program that is not there says so on stderr, with 127.

Every test has a state directory and runner tag of its own; on the way out nothing labelled with that tag is on the
engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import checkfu
from checkfu import AsyncSandbox
from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxBoundExceeded,
    SandboxPathRejected,
    SandboxProfileInvalid,
    SandboxProviderFailed,
)
from checkfu.sandbox import OutputTruncatedWarning

from .test_run_cli import Cli
from .test_run_docker import dcli, engine, leftovers  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker

ROOMY = """\
tier = "container"
base_image = "checkfu/busybox:1"
retention_mode = "durable"

[network_policy]
mode = "none"

[resource_limits]
cpu_millis = 1000
memory_mib = 512
disk_mib = {disk}
pids = 64
"""
MiB = 1 << 20
HOST = Path(__file__).resolve().parents[2] / "examples" / "profiles" / "host.toml"


def profile(where: Path, disk: int = 64) -> Path:
    """A busybox profile; ``disk`` MiB of writable space (a quarter in /tmp, most of the rest in the home)."""
    path = where / f"p{disk}.toml"
    path.write_text(ROOMY.format(disk=disk), encoding="utf-8")
    return path


@pytest.fixture
def sdk_env(dcli: Cli, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:  # noqa: F811
    """The SDK in this process, with the CLI's state directory and tag."""
    monkeypatch.setenv("XDG_STATE_HOME", str(dcli.state))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", dcli.tag)
    yield dcli


# exec's output: a cut is visible, and its size is the caller's -------------------------------


def test_exec_cut_is_flagged_warned_and_configurable(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    ten = "head -c 10000000 /dev/zero"
    with checkfu.Sandbox(profile=profile(tmp_path), ttl=300) as sb:
        # the default keeps 8 MiB of each stream: the cut is flagged, and warned about at the caller's line
        with pytest.warns(OutputTruncatedWarning, match="max_output_bytes=8388608") as said:
            cut = sb.exec(ten)
        assert said[0].filename == __file__
        assert cut.exit_code == 0 and len(cut.stdout) == 8 * MiB
        assert cut.truncated and cut.stdout_truncated and not cut.stderr_truncated
        # a larger cap keeps it all (50 MiB, as the report), and says nothing was cut
        with warnings.catch_warnings():
            warnings.simplefilter("error", OutputTruncatedWarning)
            whole = sb.exec("head -c 52428800 /dev/zero", max_output_bytes=64 * MiB)
            assert len(whole.stdout) == 50 * MiB and not whole.truncated
            small = sb.exec("echo fits", max_output_bytes=5 * MiB)
            assert small.stdout == b"fits\n" and not small.truncated
        # a smaller one cuts stderr too, each stream on its own
        with pytest.warns(OutputTruncatedWarning, match="stdout and stderr"):
            both = sb.exec("head -c 100 /dev/zero; head -c 50 /dev/zero >&2", max_output_bytes=10)
        assert (len(both.stdout), len(both.stderr), both.stdout_truncated, both.stderr_truncated) == (
            10,
            10,
            True,
            True,
        )
        # opt in to a refusal: the vocabulary's bound, naming the stream
        with pytest.raises(SandboxBoundExceeded) as refused:
            sb.exec("head -c 100 /dev/zero >&2", max_output_bytes=10, on_truncation="raise")
        assert refused.value.field == "stderr"
        # or to silence: the flag still tells
        with warnings.catch_warnings():
            warnings.simplefilter("error", OutputTruncatedWarning)
            quiet = sb.exec("head -c 100 /dev/zero", max_output_bytes=10, on_truncation="ignore")
        assert quiet.truncated and len(quiet.stdout) == 10
        # a sandbox-wide setting
        sb.max_output_bytes = 20 * MiB
        assert not sb.exec(ten).truncated
        sb.max_output_bytes, sb.on_truncation = 1000, "raise"
        with pytest.raises(SandboxBoundExceeded):
            sb.exec(ten)
        sb.on_truncation = "warn"
        # callbacks are handed every byte; the result keeps the cap, flagged, with no warning (nothing was lost)
        got: list[bytes] = []
        with warnings.catch_warnings():
            warnings.simplefilter("error", OutputTruncatedWarning)
            streamed = sb.exec(ten, on_stdout=got.append)
        assert sum(map(len, got)) == 10_000_000 and len(streamed.stdout) == 1000 and streamed.truncated
        # spawn's wait is held to the same cap
        proc = sb.spawn(ten, max_output_bytes=100)
        with pytest.warns(OutputTruncatedWarning):
            waited = proc.wait()
        assert len(waited.stdout) == 100 and waited.truncated
        for bad in (0, -1, 1.5, "10"):
            with pytest.raises(SandboxProfileInvalid) as wrong:
                sb.exec("true", max_output_bytes=bad)  # type: ignore[arg-type]
            assert wrong.value.field == "max_output_bytes"
        with pytest.raises(SandboxProfileInvalid) as wrong_mode:
            sb.exec("true", on_truncation="shout")  # type: ignore[arg-type]
        assert wrong_mode.value.field == "on_truncation"
    assert not leftovers(engine, sdk_env.tag)


def test_async_exec_cut_is_flagged(sdk_env: Cli, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncSandbox(profile=profile(tmp_path), ttl=120, max_output_bytes=1000) as sb:
            with pytest.warns(OutputTruncatedWarning) as said:
                res = await sb.exec("head -c 5000 /dev/zero")
            assert said[0].filename == __file__
            assert res.truncated and len(res.stdout) == 1000
            assert not (await sb.exec("head -c 5000 /dev/zero", max_output_bytes=5000)).truncated

    asyncio.run(main())


def test_exec_json_on_the_command_line_says_what_was_cut(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    sid = dcli.json("sandbox", "create", "--profile", str(profile(tmp_path)), "--ttl", "5m")["sandbox_id"]
    try:
        doc = json.loads(dcli("exec", "--json", sid, "--", "sh", "-c", "head -c 10000000 /dev/zero | tr '\\0' a").out)
        assert doc["exit_code"] == 0 and len(doc["stdout"]) == 8 * MiB
        assert doc["stdout_truncated"] is True and doc["stderr_truncated"] is False
        plain = dcli("exec", sid, "--", "sh", "-c", "head -c 10000000 /dev/zero")
        assert plain.code == 0 and len(plain.out) == 10_000_000  # streamed: all of it
    finally:
        dcli("sandbox", "rm", sid)
    assert not leftovers(engine, dcli.tag)


# Process.pid ---------------------------------------------------------------------------------


def test_spawned_process_has_its_pid_in_the_sandbox(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    with checkfu.Sandbox(profile=profile(tmp_path), ttl=120) as sb:
        proc = sb.spawn(["sleep", "30"])
        try:
            assert isinstance(proc.pid, int) and proc.pid > 1
            assert proc.process_id
            seen = sb.exec(["ps", "-o", "pid,args"]).text
            assert any(line.split()[:2] == [str(proc.pid), "sleep"] for line in seen.splitlines()), seen
            # the pid is the one to signal from inside the sandbox
            assert sb.exec(["kill", "-TERM", str(proc.pid)]).exit_code == 0
            assert proc.wait().exit_code != 0
        finally:
            proc.kill()
    assert not leftovers(engine, sdk_env.tag)


def test_spawned_process_has_its_pid_on_the_host_process_tier(sdk_env: Cli, tmp_path: Path) -> None:
    with checkfu.Sandbox(profile=HOST, provider="host-process", ttl=120) as sb:
        proc = sb.spawn(["sh", "-c", "echo $$; exec sleep 30"])
        try:
            assert isinstance(proc.pid, int) and proc.pid > 1
            os.kill(proc.pid, 0)  # a process of this host
        finally:
            proc.kill()
        assert proc.wait().stdout.strip() == str(proc.pid).encode()


# cp out: permission bits, files larger than the read bound, and the sandbox kept ----------------


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_cp_out_keeps_modes_and_copies_100_mb(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    sid = dcli.json("sandbox", "create", "--profile", str(profile(tmp_path, disk=256)), "--ttl", "10m")["sandbox_id"]
    try:
        made = dcli(
            "exec",
            sid,
            "--",
            "sh",
            "-c",
            "set -e; d=/home/sandbox/d; mkdir -p $d/sub; head -c 104857600 /dev/urandom > $d/big; chmod 640 $d/big; "
            "printf '#!/bin/sh\\necho hi\\n' > $d/sub/run.sh; chmod 755 $d/sub/run.sh; "
            "head -c 30000000 /dev/urandom > $d/m1; head -c 30000000 /dev/urandom > $d/m2; "
            "head -c 10000000 /dev/urandom > $d/m3; sha256sum $d/big $d/m1 $d/m2 $d/m3",
        )
        assert made.code == 0, str(made)
        sums = {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in made.out.decode().splitlines()}
        # one file of 100 MB
        single = tmp_path / "big"
        assert dcli.json("cp", f"{sid}:/home/sandbox/d/big", str(single))["copied"] == [str(single)]
        assert single.stat().st_size == 100 * MiB and _digest(single) == sums["big"]
        assert single.stat().st_mode & 0o777 == 0o640
        # a directory of 170 MB: every file, every byte, every executable bit; the sandbox is still there
        back = tmp_path / "back"
        back.mkdir()
        copied = dcli.json("cp", f"{sid}:/home/sandbox/d", str(back))["copied"]
        assert len(copied) == 5
        for name in ("big", "m1", "m2", "m3"):
            assert _digest(back / "d" / name) == sums[name], name
        script = back / "d" / "sub" / "run.sh"
        assert script.read_bytes() == b"#!/bin/sh\necho hi\n" and script.stat().st_mode & 0o777 == 0o755
        assert os.access(script, os.X_OK)
        assert (back / "d" / "big").stat().st_mode & 0o777 == 0o640
        assert dcli("exec", sid, "--", "true").code == 0
        assert [s["id"] for s in dcli.json("ps")["sandboxes"]] == [sid]
    finally:
        dcli("sandbox", "rm", sid)
    assert not leftovers(engine, dcli.tag)


def test_cp_out_keeps_the_executable_bit(dcli: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    sid = dcli.json("sandbox", "create", "--profile", str(profile(tmp_path)), "--ttl", "5m")["sandbox_id"]
    try:
        script = "mkdir -p /tmp/t && printf '#!/bin/sh\\necho hi\\n' > /tmp/t/run.sh && chmod 750 /tmp/t/run.sh"
        assert dcli("exec", sid, "--", "sh", "-c", script).code == 0
        one = tmp_path / "run.sh"
        assert dcli("cp", f"{sid}:/tmp/t/run.sh", str(one)).code == 0
        assert one.stat().st_mode & 0o777 == 0o750
        back = tmp_path / "back"
        back.mkdir()
        assert dcli("cp", f"{sid}:/tmp/t", str(back)).code == 0
        assert (back / "t" / "run.sh").stat().st_mode & 0o777 == 0o750
    finally:
        dcli("sandbox", "rm", sid)
    assert not leftovers(engine, dcli.tag)


def test_a_read_refused_for_its_size_keeps_the_sandbox(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    """``readFiles`` refusing files over its bound (``SandboxBoundExceeded``, listed by the contract) is an answer
    about the request: the sandbox stays live and usable."""
    with checkfu.Sandbox(profile=profile(tmp_path, disk=256), ttl=300) as sb:
        assert sb.exec("head -c 70000000 /dev/zero > /home/sandbox/big").exit_code == 0
        with pytest.raises(SandboxProviderFailed) as refused:
            sb.files.read("/home/sandbox/big")
        assert refused.value.reported_code == "SandboxBoundExceeded"
        assert sb.exec(["stat", "-c", "%s", "/home/sandbox/big"]).stdout == b"70000000\n"
        sb.files.write("/home/sandbox/after", b"still here\n")
        assert sb.files.read("/home/sandbox/after") == b"still here\n"
    assert not leftovers(engine, sdk_env.tag)


# refusals named for what they are --------------------------------------------------------------


def test_a_mistyped_provider_is_named_as_such(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    with pytest.raises(SandboxAdapterUnavailable) as sdk:
        checkfu.Sandbox(provider="dockr", ttl=60)
    assert sdk.value.field == "provider" and "'dockr'" in sdk.value.message and "docker" in sdk.value.message
    cli = sdk_env("sandbox", "create", "--provider", "dockr", "--json")
    assert cli.code == 125, str(cli)
    error = json.loads(cli.out)["error"]
    assert (error["code"], error["field"]) == ("SandboxAdapterUnavailable", "provider"), error
    assert not leftovers(engine, sdk_env.tag)


def test_bad_env_and_timeout_are_refused_by_field(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    with checkfu.Sandbox(profile=profile(tmp_path), ttl=120) as sb:
        for env in ({"BAD NAME": "x"}, {"1X": "x"}, {"OK": "nul\x00"}):
            with pytest.raises(SandboxProfileInvalid) as bad:
                sb.exec(["env"], env=env)
            assert bad.value.field is not None and bad.value.field.startswith("env"), bad.value
            with pytest.raises(SandboxProfileInvalid):
                sb.spawn(["env"], env=env)
        # timeout=None: no timeout of the caller's (the sandbox's time-to-live still ends the command)
        for call in (sb.exec, lambda argv, **kw: sb.exec(argv, on_stdout=lambda _: None, **kw)):
            res = call(["sh", "-c", "sleep 1; echo done"], timeout=None)
            assert (res.exit_code, res.stdout, res.timed_out) == (0, b"done\n", False)
        for bad_timeout in (0, -1, float("nan"), float("inf"), "10"):
            with pytest.raises(SandboxProfileInvalid) as wrong:
                sb.exec(["true"], timeout=bad_timeout)  # type: ignore[arg-type]
            assert wrong.value.field == "timeout"
        assert sb.exec(["true"]).exit_code == 0
    assert not leftovers(engine, sdk_env.tag)


def test_a_write_out_of_space_leaves_nothing(sdk_env: Cli, tmp_path: Path, engine: Any) -> None:  # noqa: F811
    with checkfu.Sandbox(profile=profile(tmp_path), ttl=120) as sb:  # /tmp holds 16 MiB
        sb.files.write("/tmp/kept.txt", b"before\n")
        before = sb.exec(["df", "-k", "/tmp"]).text.splitlines()[-1].split()[2]
        for path in ("/tmp/kept.txt", "/tmp/new/file.bin"):
            with pytest.raises(SandboxBoundExceeded) as full:
                sb.files.write(path, b"x" * (20 * MiB))
            assert full.value.field == "path" and path in full.value.message
        assert sb.files.read("/tmp/kept.txt") == b"before\n"
        assert sb.exec(["ls", "-A", "/tmp/new"]).stdout == b""
        assert [e.path for e in sb.files.list("/tmp")] == ["/tmp/kept.txt", "/tmp/new"]
        assert sb.exec(["df", "-k", "/tmp"]).text.splitlines()[-1].split()[2] == before
        # a write that fits replaces the file whole, with its mode
        sb.files.write("/tmp/kept.txt", b"after\n", mode=0o700)
        assert sb.exec(["stat", "-c", "%a %s", "/tmp/kept.txt"]).stdout == b"700 6\n"
        with pytest.raises(SandboxPathRejected) as onto_dir:
            sb.files.write("/tmp/new", b"x")
        assert onto_dir.value.field == "path"
    assert not leftovers(engine, sdk_env.tag)


def test_a_missing_program_says_so_on_stderr(dcli: Cli, tmp_path: Path, engine: Any, monkeypatch: Any) -> None:  # noqa: F811
    monkeypatch.setenv("XDG_STATE_HOME", str(dcli.state))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", dcli.tag)
    with checkfu.Sandbox(profile=profile(tmp_path), ttl=120) as sb:
        for res in (sb.exec(["nosuch"]), sb.exec(["nosuch"], on_stdout=lambda _: None)):
            assert res.exit_code == 127 and res.stdout == b"", res
            assert b'"nosuch"' in res.stderr and b"not found" in res.stderr and b"\r" not in res.stderr, res
        shell = sb.exec("nosuch")
        assert shell.exit_code == 127 and b"nosuch: not found" in shell.stderr
        cli = dcli("exec", sb.sandbox_id, "--", "nosuch")
        assert cli.code == 127 and cli.out == b"" and '"nosuch"' in cli.err, str(cli)
        # a program's own output that happens to look like the engine's words stays its own
        echo = sb.exec(["echo", "OCI runtime exec failed: not really"])
        assert echo.exit_code == 0 and echo.stdout == b"OCI runtime exec failed: not really\n"
        streamed = sb.exec(["echo", "OCI runtime exec failed: no"], on_stdout=lambda _: None)
        assert streamed.stdout == b"OCI runtime exec failed: no\n" and streamed.stderr == b""
    assert not leftovers(engine, dcli.tag)
