"""The sandbox's starter (``checkfu.providers.docker.starter``): its first process is started from inside, and
every way a process can differ from an exec's is held to the exec's.

The record splitter is checked on its own, over every chunking; the rest on the engine, each first process
beside a second process of the same request made as an exec in the same sandbox.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess

import pytest
from docker_kit import Box, Kit
from hypothesis import given
from hypothesis import strategies as st

from checkfu.contract.members import ActivateRequest, ExecRequest, ExecResult, OpenProcessRequest
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.providers.docker import DockerProvider, starter
from checkfu.providers.docker.starter import Records

NONCE = "0123456789abcdef0123456789abcdef"


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def record(what: str) -> bytes:
    return b"\0" + NONCE.encode() + b":" + what.encode() + b"\n"


def split(wire: bytes, size: int) -> tuple[bytes, bytes, Records]:
    records = Records(NONCE)
    out, err = b"", b""
    for i in range(0, len(wire), size):
        for stream, payload in records.feed(wire[i : i + size]):
            if stream == 1:
                out += payload
            else:
                err += payload
    return out, err, records


def test_records_are_taken_out_of_the_output_over_any_chunking() -> None:
    wire = (
        frame(1, b"hel")
        + frame(1, b"lo\0" + record("p 12")[:5])
        + frame(1, record("p 12")[5:] + b"more\0\0")
        + frame(2, b"err" + record("x 3"))
        + frame(1, b"!" + record("x 3") + b"late")
        + frame(2, b"late too")
    )
    for size in (1, 2, 7, 8, 9, 33, len(wire)):
        out, err, records = split(wire, size)
        assert (out, err) == (b"hello\0more\0\0!", b"err"), size
        assert (records.pid, records.exit_code, records.ended, records.unstarted) == (12, 3, True, False)


def test_the_exit_is_known_only_once_both_streams_reported_it() -> None:
    records = Records(NONCE)
    records.feed(frame(1, record("x 0")))
    assert records.exit_code == 0 and not records.ended, "stderr may still hold what the process wrote to it"
    records.feed(frame(2, record("x 0")))
    assert records.ended


def test_unstarted_ends_at_once() -> None:
    out, _, records = split(frame(1, record("u")) + frame(2, b"nothing of the process"), 3)
    assert records.unstarted and records.ended and out == b"" and records.exit_code is None


def test_another_nonce_is_only_output() -> None:
    other = b"\0" + b"f" * 32 + b":x 0\n"
    out, _, records = split(frame(1, other), 5)
    assert out == other and not records.ended


@given(st.binary(max_size=200), st.integers(min_value=1, max_value=64))
def test_output_passes_whole_whatever_it_holds(data: bytes, size: int) -> None:
    out, err, records = split(frame(1, data + record("x 1")) + frame(2, data + record("x 1")), size)
    assert out == data and err == data and records.exit_code == 1 and records.ended


def test_requests_a_shell_cannot_state_as_an_exec_would_are_left_to_an_exec() -> None:
    assert starter.line(NONCE, ["true"], {}, "/home/sandbox") is not None
    assert starter.line(NONCE, [], {}, "/home/sandbox") is None
    assert starter.line(NONCE, ["true"], {"NOT-A-NAME": "x"}, "/home/sandbox") is None
    assert starter.line(NONCE, ["a\0b"], {}, "/") is None
    assert starter.line(NONCE, ["echo", "x" * starter.MAX_LINE], {}, "/") is None
    assert b"\n" not in starter.line(NONCE, ["echo", "two\nlines"], {}, "/")[:-1]  # type: ignore[index]


# on the engine ----------------------------------------------------------------------------------------------


def exec_request(box: Box, *argv: str, **kw: object) -> ExecRequest:
    base: dict[str, object] = {"timeout_ms": 30_000, "max_output_bytes": 1 << 20}
    base.update(kw)
    return ExecRequest(**box.call, argv=argv, **base)  # type: ignore[arg-type]


async def twice(kit: Kit, box: Box, *argv: str, **kw: object) -> tuple[ExecResult, ExecResult]:
    """The same request as the sandbox's first process (the starter's) and then as an exec."""
    first = await kit.provider.exec(exec_request(box, *argv, **kw))
    second = await kit.provider.exec(exec_request(box, *argv, **kw))
    return first, second


def same(a: ExecResult, b: ExecResult, *, unordered: bool = False) -> bool:
    """Equal results; ``unordered``: stdout's lines in any order (a shell hands on its environment in its own)."""
    keys = ("exit_code", "timed_out", "stderr", "stdout_truncated", "stderr_truncated")
    if unordered:
        outs = [sorted(r.stdout.splitlines()) for r in (a, b)]
        return outs[0] == outs[1] and all(getattr(a, k) == getattr(b, k) for k in keys)
    return all(getattr(a, k) == getattr(b, k) for k in (*keys, "stdout"))


@pytest.mark.docker
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("argv", "kw"),
    [
        (("sh", "-c", "echo out; echo err >&2; exit 3"), {}),
        (("env",), {}),
        (("env",), {"env": {"PWD": "/x", "EXTRA": "it's\na value"}}),
        (("sh", "-c", 'printf "%s|" "$0" "$@"', "it's", "two\nlines", "", "$HOME", "*"), {}),
        (("pwd",), {"cwd": "/tmp"}),
        (("cat",), {"stdin": b"fed\n" * 1000}),
        (("sh", "-c", "read x || echo eof"), {}),
        (("sh", "-c", "head -c 100000 /dev/zero"), {"max_output_bytes": 1000}),
        (("nosuch",), {}),
        (("/bin/nosuch",), {}),
        (("/etc/passwd",), {}),
        (("true",), {"cwd": "/nowhere"}),
        (("sh", "-c", "kill -9 $$"), {}),
        (("id",), {}),
        (("sh", "-c", "cat /proc/self/status | grep -E '^(Cap|NoNewPrivs|Seccomp)'"), {}),
        (("sh", "-c", "umask; ulimit -a"), {}),
        (("sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"), {}),  # no signal ignored (SIGINT, SIGQUIT)
        (("printf", "%s|", "two\nlines"), {"env": {"nl": "X", "c": "y", "IFS": "0"}}),  # the starter's own names
        (("-n",), {}),  # a program named like an option
    ],
    ids=lambda v: repr(v)[:40],
)
async def test_the_first_process_is_what_an_exec_of_it_is(
    kit: Kit, argv: tuple[str, ...], kw: dict[str, object]
) -> None:
    box = await kit.up("starter")
    try:
        first, second = await twice(kit, box, *argv, **kw)
        assert same(first, second, unordered=argv == ("env",)), (first, second)
    finally:
        await box.release()


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_first_process_past_its_timeout_is_ended_with_its_group(kit: Kit) -> None:
    box = await kit.up("starter-timeout")
    try:
        r = await kit.provider.exec(exec_request(box, "sh", "-c", "echo started; sleep 60 & sleep 61", timeout_ms=1500))
        assert r.timed_out and r.exit_code == 137 and r.stdout == b"started\n"
        left = await kit.provider.exec(exec_request(box, "sh", "-c", "ps -o args | grep -c '[s]leep 6' || true"))
        assert left.stdout.strip() == b"0"
    finally:
        await box.release()


@pytest.mark.docker
@pytest.mark.anyio
async def test_the_starter_is_seen_from_outside_and_idles_after_its_one_process(kit: Kit) -> None:
    box = await kit.up("starter-outside")
    try:
        config = kit.client.api.inspect_container(box.instance_id)["Config"]
        assert config["Cmd"] == ["sh", "-c", starter.STARTER] and config["OpenStdin"] and config["StdinOnce"]
        proc = await kit.provider.open_process(OpenProcessRequest(**box.call, argv=("sh", "-c", "echo $$")))
        assert proc.started.process_id.startswith("starter-")
        events = [e async for e in proc.events()]
        assert events[-1] == ProcessExit(exit_code=0)
        pid = b"".join(e.data for e in events if isinstance(e, ProcessOutput))
        top = subprocess.run(
            ["docker", "top", box.instance_id, "-o", "pid,comm"], capture_output=True, check=True, text=True
        ).stdout
        assert sorted(line.split()[-1] for line in top.splitlines()[1:]) == ["docker-init", "sleep"], top
        later = await kit.provider.exec(exec_request(box, "sh", "-c", "echo $$"))
        assert later.exit_code == 0 and later.stdout != pid
    finally:
        await box.release()


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_sandbox_whose_first_process_is_interrupted_keeps_running(kit: Kit) -> None:
    box = await kit.up("starter-cancel")
    try:
        task = asyncio.ensure_future(kit.provider.exec(exec_request(box, "sleep", "30")))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await kit.provider.exec(exec_request(box, "sh", "-c", "ps -o args | grep -c '[s]leep 30' || true"))
        assert after.exit_code == 0
        assert kit.client.api.inspect_container(box.instance_id)["State"]["Running"]
    finally:
        await box.release()


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_held_sandbox_adopted_by_another_provider_starts_its_first_process_too(
    kit: Kit, runner_tag: str, busybox_id: str
) -> None:
    held = DockerProvider(state_dir=kit.docker.state_dir, cache_tag=runner_tag, workers=4, hold=True)
    try:
        key, made = await Kit(held, kit.client, runner_tag, busybox_id, docker=held).provision("starter-held")
    finally:
        held.close()
    box = Box(kit, key, made.instance_id)
    try:
        await kit.provider.activate(ActivateRequest(**box.call))
        proc = await kit.provider.open_process(OpenProcessRequest(**box.call, argv=("echo", "thawed")))
        assert proc.started.process_id.startswith("starter-")
        events = [e async for e in proc.events()]
        assert events[0] == ProcessOutput(stream="out", data=b"thawed\n") and events[-1] == ProcessExit(exit_code=0)
    finally:
        await box.release()
