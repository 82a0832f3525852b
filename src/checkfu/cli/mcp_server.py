"""``checkfu mcp``: the runner's sandboxes as Model Context Protocol tools, so an agent framework can use them with
no code of its own.

The server speaks MCP over stdio (the default: the framework starts ``checkfu mcp`` as its child) or over
streamable HTTP on a loopback address (``--http 127.0.0.1:PORT``), where every request must carry
``Authorization: Bearer TOKEN``. It is built on the official ``mcp`` SDK's low-level server, so each tool's input
and output JSON Schemas are ours, made from the contract's own types (``checkfu.contract``): a path is an absolute,
normal sandbox path, an environment name is the contract's ``EnvName``, an inline profile is a
``SandboxProfile``.

Every tool goes through the runner's front door (``checkfu.runner.RunnerService``): the same checks, journal,
leases and reclaiming as ``checkfu run`` and ``checkfu sandbox create``. A refusal is a tool error (``isError``)
whose structured content is ``{"error": {"code", "message", "retryable", "field"?}}``, a code of the contract's
closed vocabulary, and it leaves nothing allocated. The sandboxes the server makes are its own: they live while it
runs (and within their time-to-live), are released when it exits, and are reclaimed by the next ``checkfu``
command if it is killed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import ipaddress
import json
import os
import secrets
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from checkfu.contract.errors import SandboxError, SandboxNotFound, SandboxProfileInvalid
from checkfu.contract.members import Arg, EnvName
from checkfu.contract.mounts import AbsolutePath
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ProviderName
from checkfu.core.job import QuietObserver
from checkfu.core.profiles import TAG
from checkfu.runner import RunnerService

SERVER_NAME = "checkfu"
TOOL_OUTPUT_CAP = 1 << 20
"""Bytes of each stream a tool hands back to the agent; more is cut and the cut is flagged (``*_truncated``)."""
DEFAULT_EXEC_TIMEOUT = 60.0
DEFAULT_RUN_TIMEOUT = 600.0
TOKEN_ENV = "CHECKFU_MCP_TOKEN"
"""The bearer token ``--http`` requires, when ``--token-file`` is not given (else one is made and written)."""


# -- tool inputs and outputs: JSON Schemas made from the contract's types ------------------------------------------


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Command = Annotated[list[Arg], Field(min_length=1, max_length=4096, description="argv: the program, then its args")]
Env = Annotated[
    dict[EnvName, Arg],
    Field(
        default_factory=dict,
        description="extra environment, name to value",
        json_schema_extra={"additionalProperties": False},
    ),
]
Timeout = Annotated[float, Field(gt=0, le=86400, description="seconds before the process is killed")]
Encoding = Annotated[
    Literal["utf-8", "base64"], Field(default="utf-8", description="how `content` carries the file's bytes")
]


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``#/$defs/...`` reference replaced by what it names (so it can stand inside another)."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref[len("#/$defs/") :]])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out: dict[str, Any] = walk(schema)
    return out


def _profile_schema(schema: dict[str, Any]) -> None:
    """A profile argument: a file's path, or the contract's ``SandboxProfile`` whose ``base_image`` may also be a
    local tag (``checkfu/debian:12``, pinned at admission as ``checkfu run`` pins it)."""
    profile = _inlined(SandboxProfile.model_json_schema())
    image = profile["properties"]["base_image"]
    profile["properties"]["base_image"] = {"anyOf": [image, {"type": "string", "pattern": TAG.pattern}]}
    schema.pop("anyOf", None)
    schema.pop("type", None)
    schema["anyOf"] = [{"type": "string", "description": "a profile file's path"}, profile, {"type": "null"}]


Profile = Annotated[
    str | dict[str, Any] | None,
    Field(
        default=None,
        description="a profile file's path (on the server's machine), or a profile itself; "
        "default: the server's --profile, else the provider's built-in one",
        json_schema_extra=_profile_schema,
    ),
]
SandboxId = Annotated[str, Field(pattern=r"^sb-[0-9a-f]{1,40}$", description="a sandbox id, as sandbox_create gave")]
SnapshotRef = Annotated[str, Field(pattern=r"^snap-[0-9a-f]{1,40}$", description="a snapshot id, as snapshot gave")]


class RunIn(_In):
    """Run one command in a fresh sandbox, released when it ends (as `checkfu run`)."""

    command: Command
    env: Env
    cwd: AbsolutePath | None = None
    timeout: Timeout = DEFAULT_RUN_TIMEOUT
    provider: ProviderName | None = Field(default=None, description="default: the server's --provider")
    profile: Profile


class CreateIn(_In):
    """Make a long-lived sandbox; exec in it, write and read its files, snapshot it, remove it."""

    provider: ProviderName | None = Field(default=None, description="default: the server's --provider")
    profile: Profile
    ttl: float | None = Field(default=None, gt=0, description="seconds it may live (default 15 minutes)")


class ExecIn(_In):
    """Run one command to completion in a live sandbox."""

    sandbox_id: SandboxId
    command: Command
    env: Env
    cwd: AbsolutePath | None = None
    stdin: str = Field(default="", description="text given to the command's stdin")
    timeout: Timeout = DEFAULT_EXEC_TIMEOUT


class WriteIn(_In):
    """Write a file in a live sandbox (its parent directories are made)."""

    sandbox_id: SandboxId
    path: AbsolutePath
    content: str
    encoding: Encoding
    mode: int = Field(default=0o644, ge=0, le=0o7777, description="permission bits (420 is 0o644)")


class ReadIn(_In):
    """Read a file of a live sandbox."""

    sandbox_id: SandboxId
    path: AbsolutePath
    encoding: Encoding


class ListIn(_In):
    """List what is at a path of a live sandbox (a directory's entries; links are never followed)."""

    sandbox_id: SandboxId
    path: AbsolutePath
    recursive: bool = False


class SnapshotIn(_In):
    """Snapshot a live sandbox's files; `resume` makes a new sandbox of it."""

    sandbox_id: SandboxId
    keep: float | None = Field(default=None, gt=0, description="seconds to keep the snapshot")


class ResumeIn(_In):
    """Make a new sandbox from a snapshot."""

    snapshot_id: SnapshotRef
    ttl: float | None = Field(default=None, gt=0, description="seconds it may live (default 15 minutes)")


class RemoveIn(_In):
    """Release a sandbox (its files are gone), or delete a snapshot."""

    id: str = Field(pattern=r"^(sb|snap)-[0-9a-f]{1,40}$", description="a sandbox id or a snapshot id")


class Ran(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool | None = Field(description="the command was killed at its timeout; null: not reported")
    run_id: str | None = Field(default=None, description="`run`: the Run's id in the journal (`checkfu logs RUN`)")
    warnings: list[str] = Field(default_factory=list, description="`run`: what the runner warned of")


class Made(BaseModel):
    sandbox_id: str
    provider: str
    expires_at: float | None


class Written(BaseModel):
    path: str
    bytes: int


class Read(BaseModel):
    path: str
    content: str
    encoding: Literal["utf-8", "base64"]
    mode: int
    bytes: int = Field(description="the file's whole size")
    truncated: bool = Field(description="only the first 1 MiB is in content")


class Entry(BaseModel):
    path: str
    kind: str
    size: int
    mode: int


class Listed(BaseModel):
    path: str
    kind: str
    entries: list[Entry]
    truncated: bool


class Snapped(BaseModel):
    snapshot_id: str
    sandbox_id: str
    expires_at: float | None


class Removed(BaseModel):
    id: str
    removed: bool


# -- the tools ---------------------------------------------------------------------------------------------------


def _text(data: bytes, cap: int = TOOL_OUTPUT_CAP) -> tuple[str, bool]:
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


class _Collector(QuietObserver):
    """What a Run printed, kept up to ``TOOL_OUTPUT_CAP`` per stream (the rest counted, not kept), and what the
    runner warned of; the rest of what a Run tells its observer is not for the agent."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.cut: dict[str, bool] = {"stdout": False, "stderr": False}

    def output(self, stream: str, data: bytes) -> None:
        name = "stderr" if stream in ("err", "stderr") else "stdout"
        kept = self.kept[name]
        room = TOOL_OUTPUT_CAP - len(kept)
        if len(data) > room:
            self.cut[name] = True
        kept += data[: max(room, 0)]


class Tools:
    """The tools' work, over one open front door. Sandboxes made here are held by id until removed or closed."""

    def __init__(self, service: RunnerService, provider: str, profile: str | None) -> None:
        self.service = service
        self.provider = provider
        self.profile = profile
        self.held: dict[str, Any] = {}
        self.made: set[str] = set()
        """The sandboxes this server made (released when it ends); any other it holds was attached (let go of)."""
        self.locks: dict[str, asyncio.Lock] = {}
        self.busy: Counter[int] = Counter()
        """How many calls are using each held sandbox object now (by its ``id``): one removed meanwhile keeps its
        providers open until the last of them ends."""

    def _profile(self, given: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        return self.profile if given is None else given

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self.locks.setdefault(sandbox_id, asyncio.Lock())

    async def _sandbox(self, sandbox_id: str) -> Any:
        """The live sandbox ``sandbox_id``: one this server holds, else attached once (made by anyone)."""
        async with self._lock(sandbox_id):
            live = self.held.get(sandbox_id)
            if live is None:
                live = await self.service.attach_sandbox(sandbox_id)
                self.held[sandbox_id] = live
            return live

    @contextlib.asynccontextmanager
    async def _using(self, sandbox_id: str) -> AsyncIterator[Any]:
        """``_sandbox``, for one call: if the sandbox is removed while the call runs, its providers are let go of
        when the call ends, not under it (a provider closed under a call would fail it with no code of ours)."""
        live = await self._sandbox(sandbox_id)
        self.busy[id(live)] += 1
        try:
            yield live
        finally:
            self.busy[id(live)] -= 1
            if self.busy[id(live)] <= 0:
                del self.busy[id(live)]
                if self.held.get(sandbox_id) is not live:  # removed meanwhile: the last call lets go of it
                    await self.service.let_go(live)

    def _gone_meanwhile(self, sandbox_id: str) -> None:
        """Raise when ``sandbox_id`` was removed through this server while a call on it ran (its answer would be
        the sandbox's end, not the command's).

        Raises:
            SandboxNotFound: it was (field ``sandbox_id``).
        """
        if sandbox_id not in self.held:
            raise SandboxNotFound(f"sandbox_id: {sandbox_id} was removed while the call ran", field="sandbox_id")

    async def run(self, a: RunIn) -> Ran:
        seen = _Collector()
        result = await self.service.run_command(
            a.provider or self.provider,
            a.command,
            profile=self._profile(a.profile),
            env=dict(a.env),
            cwd=a.cwd,
            timeout=a.timeout,
            observer=seen,
        )
        return Ran(
            exit_code=result.exit_code,
            stdout=seen.kept["stdout"].decode("utf-8", "replace"),
            stderr=seen.kept["stderr"].decode("utf-8", "replace"),
            stdout_truncated=seen.cut["stdout"],
            stderr_truncated=seen.cut["stderr"],
            run_id=result.run_id,
            timed_out=result.timed_out,
            warnings=seen.warnings,
        )

    async def sandbox_create(self, a: CreateIn) -> Made:
        live = await self.service.create_sandbox(
            a.provider or self.provider, profile=self._profile(a.profile), ttl=a.ttl
        )
        self.held[live.sandbox_id] = live
        self.made.add(live.sandbox_id)
        return Made(sandbox_id=live.sandbox_id, provider=live.record.provider, expires_at=live.record.expires_at)

    async def exec(self, a: ExecIn) -> Ran:
        async with self._using(a.sandbox_id) as live:
            stdin = a.stdin.encode("utf-8")
            res = await live.exec(a.command, env=dict(a.env), cwd=a.cwd, stdin=stdin, timeout=a.timeout)
        self._gone_meanwhile(a.sandbox_id)
        out, out_cut = _text(res.stdout)
        err, err_cut = _text(res.stderr)
        return Ran(
            exit_code=res.exit_code,
            stdout=out,
            stderr=err,
            stdout_truncated=out_cut or res.stdout_truncated,
            stderr_truncated=err_cut or res.stderr_truncated,
            timed_out=res.timed_out,
        )

    async def write_file(self, a: WriteIn) -> Written:
        data = _decode(a.content, a.encoding)
        async with self._using(a.sandbox_id) as live:
            await live.write_file(a.path, data, mode=a.mode)
        return Written(path=a.path, bytes=len(data))

    async def read_file(self, a: ReadIn) -> Read:
        async with self._using(a.sandbox_id) as live:
            got = await live.read_files([a.path])
        if not got.files:
            raise SandboxNotFound(f"path: no file at {a.path} in {a.sandbox_id}", field="path")
        f = got.files[0]
        data = bytes(f.data)
        kept = data[:TOOL_OUTPUT_CAP]
        if a.encoding == "base64":
            content = base64.b64encode(kept).decode()
        else:
            try:
                content = kept.decode("utf-8")
            except UnicodeDecodeError as exc:
                if exc.start < len(kept) - 3 or len(data) <= TOOL_OUTPUT_CAP:  # not a character cut at the cap
                    raise SandboxProfileInvalid(
                        f"encoding: {a.path} is not UTF-8 text (byte {exc.start}); read it with encoding base64",
                        field="encoding",
                    ) from None
                content = kept[: exc.start].decode("utf-8")
        return Read(
            path=f.path,
            content=content,
            encoding=a.encoding,
            mode=f.mode,
            bytes=len(data),
            truncated=len(data) > TOOL_OUTPUT_CAP,
        )

    async def list_files(self, a: ListIn) -> Listed:
        async with self._using(a.sandbox_id) as live:
            got = await live.list_dir(a.path, recursive=a.recursive)
        return Listed(
            path=a.path,
            kind=got.kind,
            entries=[Entry(path=e.path, kind=e.kind, size=e.size, mode=e.mode) for e in got.entries],
            truncated=bool(getattr(got, "truncated", False)),
        )

    async def snapshot(self, a: SnapshotIn) -> Snapped:
        async with self._using(a.sandbox_id) as live:
            snap = await live.snapshot(keep=a.keep)
        return Snapped(snapshot_id=snap.snapshot_ref, sandbox_id=a.sandbox_id, expires_at=snap.expires_at)

    async def resume(self, a: ResumeIn) -> Made:
        live = await self.service.resume_snapshot(a.snapshot_id, ttl=a.ttl)
        self.held[live.sandbox_id] = live
        self.made.add(live.sandbox_id)
        return Made(sandbox_id=live.sandbox_id, provider=live.record.provider, expires_at=live.record.expires_at)

    async def remove(self, a: RemoveIn) -> Removed:
        if a.id.startswith("snap-"):
            await self.service.delete_snapshot(a.id)
            return Removed(id=a.id, removed=True)
        live = await self._sandbox(a.id)
        async with self._lock(a.id):
            if self.held.pop(a.id, None) is None:
                raise SandboxNotFound(f"id: {a.id} was removed already", field="id")
            self.made.discard(a.id)
            try:
                await live.release()
            finally:
                # Released (or failed trying): the server holds it no more. Its providers go now, unless a call on
                # it is still running: that one lets go of them as it ends.
                if not self.busy.get(id(live)):
                    await self.service.let_go(live)
        return Removed(id=a.id, removed=True)

    async def close(self) -> None:
        """The server's end: release every sandbox it made; let go of the ones it only attached (made by someone
        else, they live on until removed or their time-to-live passes)."""
        while self.held:
            sandbox_id, live = self.held.popitem()
            try:
                if sandbox_id in self.made:
                    with contextlib.suppress(SandboxError):
                        await live.release()
                else:
                    live.detach()
            finally:
                await self.service.let_go(live)


def _decode(content: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content.encode("ascii"), validate=True)
    except ValueError:
        raise SandboxProfileInvalid("content: not base64 (encoding is base64)", field="content") from None


@dataclass(frozen=True)
class Tool:
    name: str
    takes: type[_In]
    gives: type[BaseModel]
    does: Callable[[Tools, Any], Awaitable[BaseModel]]

    @property
    def description(self) -> str:
        return (self.takes.__doc__ or "").strip()


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("run", RunIn, Ran, Tools.run),
        Tool("sandbox_create", CreateIn, Made, Tools.sandbox_create),
        Tool("exec", ExecIn, Ran, Tools.exec),
        Tool("write_file", WriteIn, Written, Tools.write_file),
        Tool("read_file", ReadIn, Read, Tools.read_file),
        Tool("list_files", ListIn, Listed, Tools.list_files),
        Tool("snapshot", SnapshotIn, Snapped, Tools.snapshot),
        Tool("resume", ResumeIn, Made, Tools.resume),
        Tool("remove", RemoveIn, Removed, Tools.remove),
    )
}
"""Every tool, in the order ``tools/list`` gives them."""


def input_schema(tool: Tool) -> dict[str, Any]:
    return tool.takes.model_json_schema()


def output_schema(tool: Tool) -> dict[str, Any]:
    return tool.gives.model_json_schema()


def _refusal(exc: ValidationError) -> SandboxProfileInvalid:
    """A tool's arguments that do not fit its schema, named by the first argument at fault."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "arguments"
    return SandboxProfileInvalid(f"{where}: {first['msg']}", field=where)


async def call(tools: Tools, name: str, arguments: Mapping[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """One tool call: ``(structured content, is_error)``. Never raises for a refusal or a sandbox's fault."""
    tool = TOOLS.get(name)
    try:
        if tool is None:
            raise SandboxProfileInvalid(f"name: no tool {name!r}; the tools are {', '.join(TOOLS)}", field="name")
        try:
            args = tool.takes.model_validate(dict(arguments or {}))
        except ValidationError as exc:
            raise _refusal(exc) from None
        done = await tool.does(tools, args)
    except SandboxError as exc:
        return {"error": exc.to_wire()}, True
    return done.model_dump(mode="json"), False


# -- the MCP server ----------------------------------------------------------------------------------------------


def build_server(tools: Tools) -> Any:
    """The SDK's low-level server, answering ``tools/list`` and ``tools/call`` from ``TOOLS``."""
    from mcp import types  # noqa: PLC0415 - only `checkfu mcp` loads the SDK
    from mcp.server.lowlevel import Server  # noqa: PLC0415

    from checkfu import __version__  # noqa: PLC0415

    listed = [
        types.Tool(
            name=t.name,
            description=t.description,
            input_schema=input_schema(t),
            output_schema=output_schema(t),
        )
        for t in TOOLS.values()
    ]

    async def list_tools(_ctx: Any, _params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(_ctx: Any, params: Any) -> Any:
        content, failed = await call(tools, params.name, params.arguments)
        text = json.dumps(content, indent=None, sort_keys=True)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=content, is_error=failed
        )

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions="Sandboxes from checkfu: run a command in a fresh sandbox (`run`), or make one "
        "(`sandbox_create`) and exec in it, write, read and list its files, snapshot and resume it, and remove it.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _bearer(expected: str, app: Any) -> Any:
    """``app`` behind a bearer token: a request without ``Authorization: Bearer <expected>`` is answered 401."""
    want = f"Bearer {expected}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, want):
                body = json.dumps(
                    {"error": {"code": "SandboxUnauthenticated", "message": "send Authorization: Bearer TOKEN"}}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="checkfu mcp"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def loopback_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` for ``--http``, whose host must be a loopback address (the server is root's sandboxes on
    this machine: it is never offered to the network).

    Raises:
        SandboxProfileInvalid: not ``HOST:PORT``, or the host is not loopback (field ``--http``).
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
        number = int(port)
    except ValueError:
        loopback, number = False, -1
    if not sep or not 0 <= number <= 65535:
        raise SandboxProfileInvalid(f"--http: {text!r} is not HOST:PORT (say 127.0.0.1:8765)", field="--http")
    if not loopback:
        raise SandboxProfileInvalid(
            f"--http: {host} is not a loopback address; the MCP server listens on this machine only (127.0.0.1 or ::1)",
            field="--http",
        )
    return host, number


def _token(token_file: Path | None) -> tuple[str, str]:
    """The bearer token and where it came from: ``--token-file``, else ``CHECKFU_MCP_TOKEN``, else a new one written
    (owner-only) to ``mcp-token`` in the state directory."""
    if token_file is not None:
        try:
            lines = token_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SandboxProfileInvalid(
                f"--token-file: cannot read {token_file}: {getattr(exc, 'strerror', None) or exc}", field="--token-file"
            ) from None
        text = lines[0].strip() if lines else ""
        if len(text) < 16:
            raise SandboxProfileInvalid(
                f"--token-file: {token_file} holds {len(text)} characters; a token needs 16 or more",
                field="--token-file",
            )
        return text, str(token_file)
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        if len(given) < 16:
            raise SandboxProfileInvalid(f"{TOKEN_ENV}: a token needs 16 or more characters", field=TOKEN_ENV)
        return given, TOKEN_ENV
    from checkfu.cli.state import state_dir  # noqa: PLC0415

    path = state_dir() / "mcp-token"
    made = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(made + "\n")
    os.chmod(path, 0o600)
    return made, str(path)


async def serve_stdio(tools: Tools) -> None:
    from mcp.server.stdio import stdio_server  # noqa: PLC0415

    server = build_server(tools)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(
    tools: Tools, host: str, port: int, token: str, said: Callable[[str], None], stopping: asyncio.Event
) -> None:
    import socket  # noqa: PLC0415

    import uvicorn  # noqa: PLC0415
    from mcp.server.transport_security import TransportSecuritySettings  # noqa: PLC0415

    class Quiet(uvicorn.Server):
        """uvicorn without its own signal handlers: ``checkfu mcp`` stops it (and releases its sandboxes first)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = build_server(tools)
    shown_host = f"[{host}]" if ":" in host else host
    # the Host (and Origin) a request may name: this address only, so a page of another site cannot reach it
    # through a name that resolves to loopback (DNS rebinding)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{shown_host}:*", *(["localhost:*"] if host == "127.0.0.1" else [])],
        allowed_origins=[f"http://{shown_host}:*", *(["http://localhost:*"] if host == "127.0.0.1" else [])],
    )
    app = _bearer(token, server.streamable_http_app(host=host, transport_security=security))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # listening before it is said to be
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    said(f"checkfu mcp: listening on http://{shown}:{bound}/mcp")
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    web = Quiet(config)
    serving = asyncio.ensure_future(web.serve(sockets=[sock]))
    waiting = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    web.should_exit = True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(serving), 5)
    if serving.done() and not serving.cancelled() and serving.exception() is not None:
        raise serving.exception()  # type: ignore[misc]


ProviderOpt = Annotated[
    str, typer.Option("--provider", help="the provider sandboxes are made on, unless a tool call names one")
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option("--profile", help="the profile sandboxes get, unless a tool call gives one", metavar="FILE"),
]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="journal URL (default: SQLite in the state directory)", show_default=False, metavar="URL"
    ),
]
AdaptersOpt = Annotated[
    Path | None,
    typer.Option("--adapters", help="adapters file (as `checkfu run --adapters`)", metavar="FILE"),
]
HttpOpt = Annotated[
    str | None,
    typer.Option(
        "--http",
        help="serve streamable HTTP on this loopback address instead of stdio (port 0: any free port)",
        metavar="HOST:PORT",
    ),
]
TokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help=f"with --http: the bearer token every request must carry (else ${TOKEN_ENV}, else a new one written "
        "to mcp-token in the state directory)",
        metavar="FILE",
    ),
]


def mcp_command(
    provider: ProviderOpt = "docker",
    profile: ProfileOpt = None,
    db: DbOpt = None,
    adapters: AdaptersOpt = None,
    http: HttpOpt = None,
    token_file: TokenOpt = None,
) -> None:
    """Serve sandboxes as MCP tools (stdio, or streamable HTTP on loopback with a bearer token): run,
    sandbox_create, exec, write_file, read_file, list_files, snapshot, resume, remove."""

    def said(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        import mcp.server.lowlevel  # noqa: F401, PLC0415
    except ImportError:
        said("checkfu mcp: the MCP SDK is not installed: pip install 'checkfu[mcp]'")
        raise typer.Exit(125) from None

    async def main() -> int:
        """Serve until the client goes (0) or a signal comes (128 + it); the sandboxes are released either way."""
        from checkfu.cli.state import config  # noqa: PLC0415

        where = loopback_address(http) if http is not None else None
        token = _token(token_file) if where is not None else None
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        got: list[int] = []

        def on_signal(signum: int) -> None:
            if not got:  # a second signal while the first is handled changes nothing
                got.append(signum)
                stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        service = await RunnerService.open_async(config(db, adapters), notice=said)
        tools = Tools(service, provider, None if profile is None else str(profile))
        try:
            if where is None:
                # stdin is read by a thread no cancellation reaches: on a signal, stop waiting for it
                serving = asyncio.ensure_future(serve_stdio(tools))
                waiting = asyncio.ensure_future(stopping.wait())
                await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if serving.done():
                    serving.result()
            else:
                assert token is not None
                said(f"checkfu mcp: bearer token from {token[1]}")
                await serve_http(tools, where[0], where[1], token[0], said, stopping)
        finally:
            await tools.close()
            await service.aclose()
        if got:
            # Told to stop, maybe with stdin still open: the thread reading it would hold up the loop's and the
            # interpreter's end. What this server held is released and its journal closed: end here.
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(128 + got[0])
        return 0

    try:
        asyncio.run(main())
    except SandboxError as exc:
        said(f"checkfu mcp: {exc.code}: {exc.message}")
        raise typer.Exit(125) from None
