"""A spawned process's pipes on the event loop: one-shot capture for ``exec``, a stream for ``openProcess``.

Output ends when its pipe does. A process may leave a background child holding
its pipes after it exits; the runner does not wait on such a child forever: once
the process has exited, its pipes get ``drain_grace`` seconds to end, then they
are detached. A detached pipe still hands the reader what it had already read,
then its end; it keeps being read and its later bytes are dropped, so the child is
never killed by ``SIGPIPE`` for writing to a pipe nobody reads; it ends with the
instance. Output that reached its end before the grace is never dropped, however
slowly it is read.

The process's exit is observed through a pidfd on the event loop (a waiting
thread where pidfds are missing), so no thread sits in ``waitpid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from checkfu.contract.errors import SandboxOperationUnsupported, SandboxStateConflict
from checkfu.contract.members import ProcessStarted
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd, Stream
from checkfu.providers.host_process.spawning import Tree, exit_status, set_window

HIGH_WATER = 256 * 1024
"""Bytes an open process's pipe may hold unread before the runner stops reading it (backpressure)."""

Ending = Callable[[Tree], Awaitable[None]]
Linger = set[asyncio.BaseTransport]
"""An instance's pipes that are still open (a background child holds them); closed at release."""


def watch_exit(tree: Tree) -> asyncio.Future[int]:
    """A future of the process's return code, settled when it exits (the process is reaped then)."""
    loop = asyncio.get_running_loop()
    popen = tree.popen
    try:
        fd = os.pidfd_open(popen.pid)
    except OSError:
        return asyncio.ensure_future(asyncio.to_thread(popen.wait))
    future: asyncio.Future[int] = loop.create_future()

    def exited() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        code = popen.wait()  # it has exited: this only reaps
        if not future.done():
            future.set_result(code)

    loop.add_reader(fd, exited)
    return future


class _Capture(asyncio.Protocol):
    """One output pipe of an ``exec``: keeps the first ``cap`` bytes, counts the rest as truncated."""

    def __init__(self, cap: int, ended: asyncio.Future[None], linger: Linger) -> None:
        self.data = bytearray()
        self.cap = cap
        self.truncated = False
        self.ended = ended
        self.detached = False
        self.linger = linger
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.linger.add(transport)

    def data_received(self, data: bytes) -> None:
        if self.detached:
            return
        room = self.cap - len(self.data)
        if room > 0:
            self.data += data[:room]
        if len(data) > room:
            self.truncated = True

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.linger.discard(self.transport)
        if not self.ended.done():
            self.ended.set_result(None)


@dataclass(frozen=True, slots=True)
class Captured:
    """What ``exec`` returns of one run."""

    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool


async def _feed_stdin(tree: Tree, data: bytes, linger: Linger) -> None:
    pipe = tree.popen.stdin
    if pipe is None:
        return
    loop = asyncio.get_running_loop()
    protocol = _Stdin()
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    linger.add(transport)
    protocol.on_lost = lambda: linger.discard(transport)
    transport.write(data)
    transport.close()  # flushes, then closes; a process that exits unread just loses the rest


async def capture(
    tree: Tree, *, stdin: bytes, timeout: float, max_output: int, drain_grace: float, ending: Ending, linger: Linger
) -> Captured:
    """Run ``tree`` to completion: feed ``stdin``, keep up to ``max_output`` bytes per stream.

    At ``timeout`` the whole tree is ended (``ending``) and the result says
    ``timed_out``. If the call is cancelled, the tree is ended before the
    cancellation propagates. Pipes a background child still holds stay in
    ``linger`` until they end.
    """
    loop = asyncio.get_running_loop()
    popen = tree.popen
    assert popen.stdout is not None and popen.stderr is not None
    out = _Capture(max_output, loop.create_future(), linger)
    err = _Capture(max_output, loop.create_future(), linger)
    await loop.connect_read_pipe(lambda: out, popen.stdout)
    await loop.connect_read_pipe(lambda: err, popen.stderr)
    exited = watch_exit(tree)
    timed_out = False
    try:
        if stdin:
            await _feed_stdin(tree, stdin, linger)
        try:
            await asyncio.wait_for(asyncio.shield(exited), timeout)
        except TimeoutError:
            timed_out = True
            await ending(tree)
            await exited
        await asyncio.wait([out.ended, err.ended], timeout=drain_grace)
    except BaseException:
        await asyncio.shield(_end_quietly(ending, tree))
        raise
    finally:
        out.detached = err.detached = True
    return Captured(
        returncode=exited.result(),
        timed_out=timed_out,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
    )


async def _end_quietly(ending: Ending, tree: Tree) -> None:
    try:
        await ending(tree)
    except Exception:  # the caller's own error is the one that matters; release ends the tree anyway
        return


class _Pipe(asyncio.Protocol):
    """One output pipe of an open process: a bounded queue of chunks; pulling is the backpressure."""

    def __init__(self, linger: Linger) -> None:
        self._linger = linger
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._ended = False
        self._detached = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport
        self._linger.add(transport)

    def data_received(self, data: bytes) -> None:
        if self._detached:
            return
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._linger.discard(self._transport)
        self._ended = True
        self._wake()

    def detach(self) -> None:
        """Stop waiting for this pipe's end: the reader still gets every byte already read, then the end; later
        bytes (a background child's, holding the pipe open) are read and dropped. A pipe that already ended
        keeps all it holds for the reader, however slow."""
        if self._ended:
            return
        self._detached = True
        self._resume()
        self._wake()

    def _resume(self) -> None:
        if self._paused and self._transport is not None:
            self._transport.resume_reading()
            self._paused = False

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> bytes:
        """The next chunk, or ``b""`` once the stream has ended."""
        while not self._chunks and not self._ended and not self._detached:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if not self._chunks:
            return b""
        data = self._chunks.popleft()
        self._size -= len(data)
        if self._size <= HIGH_WATER // 2:
            self._resume()
        return data


class _Stdin(asyncio.Protocol):
    """The write side of an open process's stdin, with flow control."""

    def __init__(self) -> None:
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.lost = False
        self.on_lost: Callable[[], object] | None = None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.on_lost is not None:
            self.on_lost()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def drain(self) -> None:
        while self._paused and not self.lost:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class HostProcessStream:
    """An open process of a host-process instance (the ``ProcessStream`` protocol)."""

    ORDER: ClassVar[tuple[Stream, ...]] = ("out", "err")

    def __init__(
        self,
        started: ProcessStarted,
        tree: Tree,
        *,
        ending: Ending,
        drain_grace: float,
        linger: Linger,
        finished: Callable[[], object] | None = None,
    ) -> None:
        self._started = started
        self._finished = finished
        self._linger = linger
        self._tree = tree
        self._ending = ending
        self._drain_grace = drain_grace
        self._pipes: dict[Stream, _Pipe] = {"out": _Pipe(linger), "err": _Pipe(linger)}
        self._stdin: asyncio.WriteTransport | None = None
        self._stdin_protocol = _Stdin()
        self._stdin_closed = False
        self._exited: asyncio.Future[int] | None = None
        self._iterated = False

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        popen = self._tree.popen
        master = self._tree.pty
        if master is not None:
            # A terminal: everything the process writes comes through its master side as ``out`` (reading it fails
            # with EIO once every holder of the other side is gone: the end); ``err`` has nothing, and ends at once.
            writer = os.dup(master)
            await loop.connect_read_pipe(lambda: self._pipes["out"], os.fdopen(master, "rb", buffering=0))
            self._pipes["err"].connection_lost(None)
            stdin_pipe: Any = os.fdopen(writer, "wb", buffering=0)
        else:
            assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
            await loop.connect_read_pipe(lambda: self._pipes["out"], popen.stdout)
            await loop.connect_read_pipe(lambda: self._pipes["err"], popen.stderr)
            stdin_pipe = popen.stdin
        transport, _ = await loop.connect_write_pipe(lambda: self._stdin_protocol, stdin_pipe)
        self._stdin = transport
        self._stdin_protocol.on_lost = lambda: self._linger.discard(transport)
        self._linger.add(transport)
        self._exited = watch_exit(self._tree)
        self._exited.add_done_callback(lambda _: loop.call_later(self._drain_grace, self._detach))

    @classmethod
    async def open(
        cls,
        started: ProcessStarted,
        tree: Tree,
        *,
        ending: Ending,
        drain_grace: float,
        linger: Linger,
        finished: Callable[[], object] | None = None,
    ) -> HostProcessStream:
        """Connect the process's pipes to the running loop and watch its exit.

        ``finished`` runs once the process has exited and its pipes are done with.
        """
        stream = cls(started, tree, ending=ending, drain_grace=drain_grace, linger=linger, finished=finished)
        await stream._open()
        return stream

    def _detach(self) -> None:
        for pipe in self._pipes.values():
            pipe.detach()
        if self._finished is not None:
            self._finished()

    @property
    def started(self) -> ProcessStarted:
        return self._started

    async def send_stdin(self, data: bytes) -> None:
        """Write to stdin; waits while the process is not reading.

        Raises:
            SandboxStateConflict: stdin was closed, or the process closed its end.
        """
        if self._stdin_closed or self._stdin is None:
            raise SandboxStateConflict("stdin: already closed by close_stdin", field="stdin")
        if self._stdin_protocol.lost or self._stdin.is_closing():
            raise SandboxStateConflict("stdin: the process closed its end", field="stdin")
        self._stdin.write(data)
        await self._stdin_protocol.drain()

    async def close_stdin(self) -> None:
        """End stdin (idempotent); later ``send_stdin`` calls raise ``SandboxStateConflict``.

        On a terminal, end of input is the terminal's end-of-file character (``^D``), as a person types it: the
        terminal stays the process's own.
        """
        if self._tree.pty is not None and not self._stdin_closed and self._stdin is not None:
            if not self._stdin.is_closing() and not self._stdin_protocol.lost:
                self._stdin.write(b"\x04")
            self._stdin_closed = True
            return
        self._close_stdin()

    async def resize(self, rows: int, cols: int) -> None:
        """Give the terminal a new window size.

        Raises:
            SandboxOperationUnsupported: the process was started without a terminal.
        """
        if self._tree.pty is None:
            raise SandboxOperationUnsupported("resize: the process has no terminal (it was started without tty)")
        if self._stdin is not None and not self._stdin.is_closing():
            with contextlib.suppress(OSError):
                set_window(self._stdin.get_extra_info("pipe").fileno(), rows, cols)

    def _close_stdin(self) -> None:
        self._stdin_closed = True
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()

    def events(self) -> AsyncIterator[ProcessEvent]:
        """Output chunks, one end per stream, then the exit. Only one consumer may iterate.

        Raises:
            SandboxStateConflict: events are already being consumed.
        """
        if self._iterated:
            raise SandboxStateConflict("events: already being consumed", field="events")
        self._iterated = True
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessEvent]:
        reads: dict[asyncio.Future[bytes], Stream] = {
            asyncio.ensure_future(self._pipes[name].read()): name for name in self.ORDER
        }
        try:
            while reads:
                done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: self.ORDER.index(reads[t])):
                    name = reads.pop(task)
                    data = task.result()
                    if data:
                        yield ProcessOutput(stream=name, data=data)
                        reads[asyncio.ensure_future(self._pipes[name].read())] = name
                    else:
                        yield ProcessStreamEnd(stream=name)
            assert self._exited is not None
            yield ProcessExit(exit_code=exit_status(await self._exited))
        finally:
            for task in reads:
                task.cancel()
            self._close_stdin()

    async def kill(self) -> None:
        """End the process and everything it started (its whole tree); idempotent."""
        await self._ending(self._tree)

    async def wait(self) -> int:
        """The exit status, once the process has exited."""
        assert self._exited is not None
        return exit_status(await self._exited)


class FailedStart:
    """A process that could not be started: the reason on stderr, then the exit status a shell would give."""

    def __init__(self, started: ProcessStarted, message: bytes, status: int) -> None:
        self._started = started
        self._message = message
        self._status = status
        self._iterated = False

    @property
    def started(self) -> ProcessStarted:
        return self._started

    async def send_stdin(self, data: bytes) -> None:
        """Raises SandboxStateConflict: there is no process to read it."""
        raise SandboxStateConflict("stdin: the process never started", field="stdin")

    async def close_stdin(self) -> None:
        return None

    async def resize(self, rows: int, cols: int) -> None:
        return None  # there is no process, so nothing to resize

    def events(self) -> AsyncIterator[ProcessEvent]:
        """The reason, both ends, then the exit.

        Raises:
            SandboxStateConflict: events are already being consumed.
        """
        if self._iterated:
            raise SandboxStateConflict("events: already being consumed", field="events")
        self._iterated = True
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessEvent]:
        yield ProcessOutput(stream="err", data=self._message)
        yield ProcessStreamEnd(stream="out")
        yield ProcessStreamEnd(stream="err")
        yield ProcessExit(exit_code=self._status)

    async def kill(self) -> None:
        return None
