"""``checkfu mcp`` driven as an agent framework drives it: by the official MCP SDK's own client, over stdio and
over streamable HTTP on loopback with a bearer token (issue 32).

Every test has its own state directory and runner tag (``dcli``); on the way out nothing labelled with that tag is
on the engine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from checkfu.cli.mcp_server import TOOLS, input_schema, loopback_address, output_schema
from checkfu.contract.errors import SandboxProfileInvalid

from .test_run_cli import CHECKFU, REPO, Cli
from .test_run_docker import dcli, engine, leftovers  # noqa: F401 - fixtures

PROFILE = REPO / "examples" / "profiles" / "busybox-none.toml"
TOOL_NAMES = ["run", "sandbox_create", "exec", "write_file", "read_file", "list_files", "snapshot", "resume", "remove"]


@asynccontextmanager
async def over_stdio(cli: Cli, *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=str(CHECKFU), args=["mcp", "--profile", str(PROFILE), *args], env=cli.env({})
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    done = await session.call_tool(name, arguments)
    assert not done.is_error, done.structured_content
    assert isinstance(done.structured_content, dict)
    assert json.loads(done.content[0].text) == done.structured_content  # type: ignore[union-attr]
    return done.structured_content


async def refused(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    done = await session.call_tool(name, arguments)
    assert done.is_error, done.structured_content
    error: dict[str, Any] = done.structured_content["error"]  # type: ignore[index]
    return error


def test_every_tool_has_a_json_schema_made_from_the_contract() -> None:
    assert list(TOOLS) == TOOL_NAMES
    for tool in TOOLS.values():
        for schema in (input_schema(tool), output_schema(tool)):
            jsonschema.Draft202012Validator.check_schema(schema)
            assert schema["type"] == "object"
        assert tool.description, tool.name
    exec_in = input_schema(TOOLS["exec"])
    # the contract's own rules: an environment name is EnvName, a path is absolute
    env = exec_in["properties"]["env"]
    assert list(env["patternProperties"]) == [r"^[A-Za-z_][A-Za-z0-9_]{0,255}$"]
    assert env["additionalProperties"] is False
    assert exec_in["properties"]["cwd"]["anyOf"][0]["$comment"] == "sandbox path rule: an absolute path"
    create_in = json.dumps(input_schema(TOOLS["sandbox_create"]))
    assert "SandboxProfile" in create_in and "resource_limits" in create_in


@pytest.mark.docker
def test_an_mcp_client_makes_a_sandbox_writes_a_file_runs_it_and_reads_the_output(dcli: Cli, engine: Any) -> None:  # noqa: F811
    async def agent() -> None:
        async with over_stdio(dcli) as session:
            listed = await session.list_tools()
            assert [t.name for t in listed.tools] == TOOL_NAMES
            made = await call(session, "sandbox_create")
            sid = made["sandbox_id"]
            assert re.fullmatch(r"sb-[0-9a-f]+", sid) and made["provider"] == "docker"
            script = "#!/bin/sh\necho made by $1 > /home/sandbox/out.txt\necho to stderr >&2\nexit 7\n"
            wrote = await call(
                session, "write_file", sandbox_id=sid, path="/home/sandbox/job.sh", content=script, mode=0o755
            )
            assert wrote == {"path": "/home/sandbox/job.sh", "bytes": len(script)}
            ran = await call(session, "exec", sandbox_id=sid, command=["/home/sandbox/job.sh", "mcp"])
            assert (ran["exit_code"], ran["stderr"], ran["timed_out"]) == (7, "to stderr\n", False)
            read = await call(session, "read_file", sandbox_id=sid, path="/home/sandbox/out.txt")
            assert read["content"] == "made by mcp\n" and read["encoding"] == "utf-8"
            listing = await call(session, "list_files", sandbox_id=sid, path="/home/sandbox")
            assert {e["path"]: e["mode"] for e in listing["entries"]} == {
                "/home/sandbox/job.sh": 0o755,
                "/home/sandbox/out.txt": 0o644,
            }
            binary = bytes(range(256))
            await call(
                session,
                "write_file",
                sandbox_id=sid,
                path="/tmp/b.bin",
                content=base64.b64encode(binary).decode(),
                encoding="base64",
            )
            back = await call(session, "read_file", sandbox_id=sid, path="/tmp/b.bin", encoding="base64")
            assert base64.b64decode(back["content"]) == binary

            snap = await call(session, "snapshot", sandbox_id=sid)
            resumed = await call(session, "resume", snapshot_id=snap["snapshot_id"])
            assert resumed["sandbox_id"] != sid
            again = await call(session, "read_file", sandbox_id=resumed["sandbox_id"], path="/home/sandbox/out.txt")
            assert again["content"] == "made by mcp\n"
            assert await call(session, "remove", id=snap["snapshot_id"]) == {"id": snap["snapshot_id"], "removed": True}
            assert await call(session, "remove", id=sid) == {"id": sid, "removed": True}
            gone = await refused(session, "exec", sandbox_id=sid, command=["true"])
            assert gone["code"] in ("SandboxNotFound", "SandboxLeaseFenced"), gone

            one = await call(session, "run", command=["sh", "-c", "echo out; echo err >&2; exit 3"])
            assert (one["exit_code"], one["stdout"], one["stderr"]) == (3, "out\n", "err\n")
            assert one["run_id"].startswith("run-")
            # the resumed sandbox is left to the server's own end: released when it exits

    asyncio.run(asyncio.wait_for(agent(), 240))
    assert leftovers(engine, dcli.tag) == []
    ps = json.loads(dcli("ps", "--json").out)
    assert [s for s in ps.get("sandboxes", []) if s.get("state") == "live"] == []


@pytest.mark.docker
def test_bad_arguments_are_refused_by_name_with_a_vocabulary_code_and_leave_nothing(dcli: Cli, engine: Any) -> None:  # noqa: F811
    async def agent() -> None:
        async with over_stdio(dcli) as session:
            empty = await refused(session, "run", command=[])
            assert (empty["code"], empty["field"]) == ("SandboxProfileInvalid", "command")
            env = await refused(session, "run", command=["true"], env={"1BAD": "x"})
            assert env["code"] == "SandboxProfileInvalid" and env["field"].startswith("env"), env
            extra = await refused(session, "sandbox_create", image="x")
            assert extra["field"] == "image", extra
            relative = await refused(session, "read_file", sandbox_id="sb-0123", path="etc/passwd")
            assert relative["field"] == "path", relative
            unknown = await refused(session, "exec", sandbox_id="sb-0123456789", command=["true"])
            assert unknown["code"] == "SandboxNotFound", unknown
            nope = await refused(session, "format_disk")
            assert nope["field"] == "name", nope
            bad_profile = await refused(session, "sandbox_create", profile="/nonexistent/profile.toml")
            assert bad_profile["code"] == "SandboxProfileInvalid", bad_profile
            limits = await refused(
                session,
                "sandbox_create",
                profile={
                    "tier": "container",
                    "base_image": "checkfu/busybox:1",
                    "retention_mode": "ephemeral_zdr",
                    "network_policy": {"mode": "none"},
                    "resource_limits": {"cpu_millis": 500, "memory_mib": 1, "disk_mib": 64, "pids": 64},
                },
            )
            # an inline profile with a tag is read and pinned as `checkfu run` reads one; the envelope refuses it
            assert limits["code"] == "SandboxCapabilityUnavailable", limits
            assert "memory_mib" in limits["message"], limits

    asyncio.run(asyncio.wait_for(agent(), 120))
    assert leftovers(engine, dcli.tag) == []


def test_http_listens_on_loopback_only() -> None:
    assert loopback_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert loopback_address("[::1]:8765") == ("::1", 8765)
    assert loopback_address("localhost:9") == ("127.0.0.1", 9)
    for bad in ("0.0.0.0:8765", "192.0.2.1:80", "example.com:80", "127.0.0.1", "127.0.0.1:99999"):
        with pytest.raises(SandboxProfileInvalid) as caught:
            loopback_address(bad)
        assert caught.value.field == "--http"


def test_http_on_a_public_address_is_refused_before_anything_starts(dcli: Cli) -> None:  # noqa: F811
    done = dcli("mcp", "--http", "0.0.0.0:0", timeout=30)
    assert done.code == 125
    assert "SandboxProfileInvalid" in done.said and "--http" in done.said and "loopback" in done.said
    assert "Traceback" not in done.err


def _listening(proc: subprocess.Popen[str], deadline: float) -> str:
    said = ""
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            said += line
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                return m.group(1)
        assert proc.poll() is None, said
    raise AssertionError(f"checkfu mcp --http said no address: {said}")


def _listeners(port: int) -> set[str]:
    """Every local address with a TCP socket listening on ``port`` on this machine (``/proc/net/tcp*``)."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            address, _, hex_port = cols[1].rpartition(":")
            if cols[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.docker
def test_streamable_http_needs_the_token_and_serves_the_tools(dcli: Cli, engine: Any, tmp_path: Path) -> None:  # noqa: F811
    token = "t0k3n-" + "x" * 30
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    proc = subprocess.Popen(
        [str(CHECKFU), "mcp", "--profile", str(PROFILE), "--http", "127.0.0.1:0", "--token-file", str(token_file)],
        env=dcli.env({}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = _listening(proc, time.monotonic() + 60)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        # only 127.0.0.1:PORT listens, nothing on other addresses
        assert _listeners(port) == {"0100007F"}

        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for header in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": token}):
            answer = httpx.post(url, json=hello, headers={"Accept": "application/json, text/event-stream", **header})
            assert answer.status_code == 401, (header, answer.status_code)
            assert answer.json()["error"]["code"] == "SandboxUnauthenticated"

        async def agent() -> None:
            client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
            async with (
                client,
                streamable_http_client(url, http_client=client) as (read, write, *_),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                made = await call(session, "sandbox_create")
                await call(
                    session, "write_file", sandbox_id=made["sandbox_id"], path="/tmp/x.py", content="print(6 * 7)\n"
                )
                ran = await call(session, "exec", sandbox_id=made["sandbox_id"], command=["cat", "/tmp/x.py"])
                assert ran["stdout"] == "print(6 * 7)\n"
                await call(session, "remove", id=made["sandbox_id"])
                await call(session, "sandbox_create")  # left to the server's end: released when it is stopped

        asyncio.run(asyncio.wait_for(agent(), 180))
        assert leftovers(engine, dcli.tag) != []
    finally:
        proc.terminate()
        _, said = proc.communicate(timeout=60)
    assert "Traceback" not in said, said
    assert leftovers(engine, dcli.tag) == []


@pytest.mark.docker
def test_a_killed_server_s_sandboxes_are_reclaimed_by_the_next_command(dcli: Cli, engine: Any) -> None:  # noqa: F811
    killed: list[int] = []

    async def agent() -> None:
        params = StdioServerParameters(
            command=str(CHECKFU), args=["mcp", "--profile", str(PROFILE)], env=dcli.env({"CHECKFU_SERVER": "off"})
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            made = await call(session, "sandbox_create")
            ps = json.loads(dcli("ps", "--json").out)
            [row] = [s for s in ps["sandboxes"] if s["id"] == made["sandbox_id"]]
            pid = int(row["owner"].rsplit("/", 1)[1])  # host/PID: the server's own process owns it
            assert pid in _children_named("checkfu"), (row, _children_named("checkfu"), os.getpid())
            assert leftovers(engine, dcli.tag) != []
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            await session.send_ping()  # the client sees its server gone

    try:
        asyncio.run(asyncio.wait_for(agent(), 120))
    except Exception as exc:  # the session breaks with its server; anything before the kill is the test's failure
        if not killed:
            raise
        del exc
    assert killed
    dcli("ps")  # the next command keeps the house: the dead server's sandbox is an orphan, reclaimed
    assert leftovers(engine, dcli.tag) == []


def _children_named(name: str) -> list[int]:
    """Processes of this test (children of this process) whose command line runs ``name``."""
    me = str(os.getpid())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat[1] == me and any(part.endswith(name.encode()) for part in cmd[:2]):
            found.append(int(proc.name))
    return found


class RawStdio:
    """``checkfu mcp`` over stdio driven line by line (JSON-RPC), so the test holds its process and its stdin."""

    def __init__(self, cli: Cli) -> None:
        self.proc = subprocess.Popen(
            [str(CHECKFU), "mcp", "--profile", str(PROFILE)],
            env=cli.env({}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.next_id = 0
        self.ask(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        )
        self.tell("notifications/initialized")

    def tell(self, method: str, params: dict[str, Any] | None = None) -> None:
        assert self.proc.stdin is not None
        message = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read().decode() if self.proc.stderr else "no answer"
            answer = json.loads(line)
            if answer.get("id") == self.next_id:
                return dict(answer.get("result") or answer)

    def tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        result = self.ask("tools/call", {"name": name, "arguments": arguments})
        assert not result.get("isError"), result
        return dict(result["structuredContent"])


@pytest.mark.docker
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_with_stdin_still_open_releases_and_exits(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    signum: int,
    code: int,
) -> None:
    server = RawStdio(dcli)
    try:
        server.tool("sandbox_create")
        assert leftovers(engine, dcli.tag) != []
        server.proc.send_signal(signum)  # stdin stays open: the client did not go
        assert server.proc.wait(timeout=60) == code
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        _, said = server.proc.communicate(timeout=30)
    assert b"Traceback" not in said, said
    assert leftovers(engine, dcli.tag) == []
    assert dcli.json("ps")["sandboxes"] == []


@pytest.mark.docker
def test_a_sandbox_the_server_did_not_make_outlives_it(dcli: Cli, engine: Any) -> None:  # noqa: F811
    made = dcli.json("sandbox", "create", "--profile", str(PROFILE))["sandbox_id"]
    try:

        async def agent() -> None:
            async with over_stdio(dcli) as session:
                listed = await call(session, "list_files", sandbox_id=made, path="/home/sandbox")
                assert listed["kind"] == "dir"

        asyncio.run(asyncio.wait_for(agent(), 120))
        [row] = dcli.json("ps")["sandboxes"]
        assert (row["id"], row["state"]) == (made, "live")  # let go of, not released
        assert dcli("exec", made, "--", "true").code == 0
    finally:
        dcli("sandbox", "rm", made)


@pytest.mark.docker
def test_read_file_is_capped_and_text_is_text(dcli: Cli, engine: Any) -> None:  # noqa: F811
    async def agent() -> None:
        async with over_stdio(dcli) as session:
            sid = (await call(session, "sandbox_create"))["sandbox_id"]
            await call(
                session,
                "exec",
                sandbox_id=sid,
                command=["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a > /tmp/big"],
            )
            big = await call(session, "read_file", sandbox_id=sid, path="/tmp/big")
            assert (big["bytes"], big["truncated"], len(big["content"])) == (3_000_000, True, 1 << 20)
            await call(session, "write_file", sandbox_id=sid, path="/tmp/bin", content="/w==", encoding="base64")
            binary = await refused(session, "read_file", sandbox_id=sid, path="/tmp/bin")
            assert (binary["code"], binary["field"]) == ("SandboxProfileInvalid", "encoding"), binary
            raw = await call(session, "read_file", sandbox_id=sid, path="/tmp/bin", encoding="base64")
            assert (raw["content"], raw["truncated"]) == ("/w==", False)

            # a remove racing an exec: the exec answers that the sandbox went, not a command's exit
            running = asyncio.ensure_future(session.call_tool("exec", {"sandbox_id": sid, "command": ["sleep", "20"]}))
            await asyncio.sleep(1.5)
            removals = await asyncio.gather(
                session.call_tool("remove", {"id": sid}), session.call_tool("remove", {"id": sid})
            )
            assert sorted(r.is_error for r in removals) == [False, True]
            second = next(r for r in removals if r.is_error).structured_content["error"]  # type: ignore[index]
            assert second["code"] == "SandboxNotFound", second
            raced = await running
            assert raced.is_error and raced.structured_content["error"]["code"] in (  # type: ignore[index]
                "SandboxNotFound",
                "SandboxLeaseFenced",
            ), raced.structured_content

    asyncio.run(asyncio.wait_for(agent(), 180))
    assert leftovers(engine, dcli.tag) == []


def test_a_token_file_is_its_first_line_and_a_missing_one_is_named(dcli: Cli, tmp_path: Path) -> None:  # noqa: F811
    from checkfu.cli.mcp_server import _token  # noqa: PLC0415

    two = tmp_path / "token"
    two.write_text("first-line-token-0123456789\nsecond line\n")
    assert _token(two)[0] == "first-line-token-0123456789"
    done = dcli("mcp", "--http", "127.0.0.1:0", "--token-file", str(tmp_path / "missing"), timeout=30)
    assert done.code == 125 and "--token-file" in done.said and "Traceback" not in done.err, done.err
