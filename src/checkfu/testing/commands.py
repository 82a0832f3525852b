"""The memory provider's built-in commands, and how they run: to completion or as an open process.

A command is an async function of a ``Context`` (its instance's files, cwd, env,
stdin and output) and its arguments, returning an exit code. None does I/O
beyond the virtual file system; ``sleep`` reads the injected ``Clock``, so a test
can make time pass without waiting.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import posixpath
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from checkfu.contract.errors import SandboxOperationUnsupported, SandboxStateConflict
from checkfu.contract.members import ProcessStarted
from checkfu.contract.paths import is_within
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd, Stream
from checkfu.testing.vfs import Vfs, fs_reason, resolve

TIMEOUT_EXIT = 124
"""Exit code of a command stopped by its ``timeout_ms`` (as coreutils ``timeout`` reports it)."""
KILLED_EXIT = 137
"""Exit code of a command ended by ``kill``, ``release`` or ``compensate`` (128 + SIGKILL)."""
NOT_FOUND_EXIT = 127
OUTPUT_WINDOW = 16
"""Output chunks an open process may have unread before it waits for the reader."""

T = TypeVar("T")


class Clock(Protocol):
    """Time as an input: ``sleep`` and ``timeout_ms`` read it."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


StdinReader = Callable[[], Awaitable[bytes | None]]
Emitter = Callable[[Stream, bytes], Awaitable[None]]


class _TimedOut(Exception):
    """The command reached its deadline; never leaves this module."""


@dataclass
class Context:
    """What a running command sees: its instance's files, cwd, env, stdin and output."""

    vfs: Vfs
    cwd: str
    env: Mapping[str, str]
    sealed: tuple[str, ...]
    clock: Clock
    deadline: float | None
    read_stdin: StdinReader
    emit: Emitter

    def path(self, arg: str) -> str:
        return resolve(arg, self.cwd)

    async def out(self, data: bytes) -> None:
        if data:
            await self.emit("out", data)

    async def err(self, text: str) -> None:
        await self.emit("err", text.encode())

    async def stdin(self) -> bytes:
        data = b""
        while (chunk := await self.read_stdin()) is not None:
            data += chunk
        return data

    async def sleep(self, seconds: float) -> None:
        if self.deadline is not None and self.clock.now() + seconds > self.deadline:
            await self.clock.sleep(max(0.0, self.deadline - self.clock.now()))
            raise _TimedOut
        await self.clock.sleep(seconds)

    async def missing(self, command: str, arg: str) -> None:
        why = "Is a directory" if self.vfs.is_dir(self.path(arg)) else "No such file or directory"
        await self.err(f"{command}: {arg}: {why}\n")


async def _cat(ctx: Context, args: list[str]) -> int:
    if not args:  # stream stdin to stdout, chunk by chunk
        while (chunk := await ctx.read_stdin()) is not None:
            await ctx.out(chunk)
        return 0
    code = 0
    for arg in args:
        node = ctx.vfs.read(ctx.path(arg))
        if node is None:
            await ctx.missing("cat", arg)
            code = 1
        else:
            await ctx.out(node.data)
    return code


async def _echo(ctx: Context, args: list[str]) -> int:
    await ctx.out((" ".join(args) + "\n").encode())
    return 0


async def _env(ctx: Context, args: list[str]) -> int:
    await ctx.out("".join(f"{k}={v}\n" for k, v in sorted(ctx.env.items())).encode())
    return 0


async def _ls(ctx: Context, args: list[str]) -> int:
    code = 0
    for arg in args or ["."]:
        path = ctx.path(arg)
        if ctx.vfs.is_dir(path):
            await ctx.out("".join(posixpath.basename(e.path) + "\n" for e in ctx.vfs.entries(path)).encode())
        elif ctx.vfs.read(path) is not None:
            await ctx.out(f"{arg}\n".encode())
        else:
            await ctx.err(f"ls: cannot access '{arg}': No such file or directory\n")
            code = 2
    return code


async def _sha256sum(ctx: Context, args: list[str]) -> int:
    if not args:
        await ctx.out(f"{hashlib.sha256(await ctx.stdin()).hexdigest()}  -\n".encode())
        return 0
    code = 0
    for arg in args:
        node = ctx.vfs.read(ctx.path(arg))
        if node is None:
            await ctx.missing("sha256sum", arg)
            code = 1
        else:
            await ctx.out(f"{hashlib.sha256(node.data).hexdigest()}  {arg}\n".encode())
    return code


async def _true(ctx: Context, args: list[str]) -> int:
    return 0


async def _false(ctx: Context, args: list[str]) -> int:
    return 1


async def _sleep(ctx: Context, args: list[str]) -> int:
    try:
        seconds = sum(float(a) for a in args)
    except ValueError:
        seconds = math.nan
    if not args or not math.isfinite(seconds) or seconds < 0:
        await ctx.err(f"sleep: invalid time interval {' '.join(args)!r}\n")
        return 1
    await ctx.sleep(seconds)
    return 0


async def _nc(ctx: Context, args: list[str]) -> int:
    """A memory sandbox has no network stack at all: every connection is unreachable."""
    where = ":".join(args[-2:]) if len(args) >= 2 else "?"
    await ctx.err(f"nc: {where}: Network is unreachable\n")
    return 1


async def _write(ctx: Context, args: list[str]) -> int:
    if not args:
        await ctx.err("write: missing file operand\n")
        return 1
    path = ctx.path(args[0])
    if any(is_within(path, root) for root in ctx.sealed):
        await ctx.err(f"write: {args[0]}: Read-only file system\n")
        return 1
    try:
        ctx.vfs.write(path, " ".join(args[1:]).encode(), 0o644)
    except OSError as exc:
        await ctx.err(f"write: {args[0]}: {fs_reason(exc)}\n")
        return 1
    return 0


COMMANDS: dict[str, Callable[[Context, list[str]], Awaitable[int]]] = {
    "cat": _cat,
    "echo": _echo,
    "env": _env,
    "false": _false,
    "ls": _ls,
    "nc": _nc,
    "sha256sum": _sha256sum,
    "sleep": _sleep,
    "true": _true,
    "write": _write,
}
"""The built-in commands, by the base name of ``argv[0]``."""


async def run(ctx: Context, argv: Sequence[str]) -> tuple[int, bool]:
    """Run ``argv`` to its exit: ``(exit_code, timed_out)``."""
    command = COMMANDS.get(posixpath.basename(argv[0]))
    if command is None:
        await ctx.err(f"{argv[0]}: command not found\n")
        return NOT_FOUND_EXIT, False
    if not ctx.vfs.is_dir(ctx.cwd):
        await ctx.err(f"{argv[0]}: cannot change directory to {ctx.cwd}: No such file or directory\n")
        return NOT_FOUND_EXIT, False
    try:
        return await command(ctx, list(argv[1:])), False
    except _TimedOut:
        return TIMEOUT_EXIT, True


class Capture:
    """One ``exec`` output stream: the first ``limit`` bytes, and whether more were dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        self.truncated |= len(chunk) > room


class MemoryProcess:
    """An open built-in command, as a ``ProcessStream``. Iterate ``events()`` once.

    stdin is a one-chunk queue, so ``send_stdin`` waits while the command is not
    reading; output is a small queue, so the command waits while nobody pulls
    events. Stdin sent after the command has exited is dropped, as a closed pipe's would be.
    """

    def __init__(self, started: ProcessStarted, start: Callable[[StdinReader, Emitter], asyncio.Task[Any]]) -> None:
        self._started = started
        self._stdin: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1)
        self._output: asyncio.Queue[ProcessOutput] = asyncio.Queue(maxsize=OUTPUT_WINDOW)
        self._stdin_closed = False
        self._task = start(self._stdin.get, self._emit)

    @property
    def started(self) -> ProcessStarted:
        return self._started

    async def _emit(self, stream: Stream, data: bytes) -> None:
        await self._output.put(ProcessOutput(stream=stream, data=data))

    async def send_stdin(self, data: bytes) -> None:
        """Raises SandboxStateConflict: stdin was already closed."""
        if self._stdin_closed:
            raise SandboxStateConflict("stdin: already closed", field="stdin")
        await self._until_exit(self._stdin.put(data))

    async def close_stdin(self) -> None:
        if not self._stdin_closed:
            self._stdin_closed = True
            await self._until_exit(self._stdin.put(None))

    async def events(self) -> AsyncIterator[ProcessEvent]:
        while (chunk := await self._until_exit(self._output.get())) is not None:
            yield chunk
        while not self._output.empty():
            yield self._output.get_nowait()
        yield ProcessStreamEnd(stream="out")
        yield ProcessStreamEnd(stream="err")
        yield ProcessExit(exit_code=KILLED_EXIT if self._task.cancelled() else self._task.result()[0])

    async def resize(self, rows: int, cols: int) -> None:
        """Raises SandboxOperationUnsupported: the memory provider has no terminals (``terminal`` is false)."""
        raise SandboxOperationUnsupported("resize: the memory provider gives no process a terminal", field="tty")

    async def kill(self) -> None:
        self._task.cancel()
        await asyncio.wait({self._task})

    async def _until_exit(self, step: Coroutine[Any, Any, T]) -> T | None:
        """``step``'s result, or ``None`` if the command exits first (``step`` is then abandoned)."""
        pending = asyncio.ensure_future(step)
        try:
            await asyncio.wait({pending, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not pending.done():
                pending.cancel()
        return pending.result() if pending.done() else None
