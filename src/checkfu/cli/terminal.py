"""The caller's side of ``-i`` and ``-t``: stdin streamed to the process, and a terminal that follows.

stdin is read by a daemon thread (a blocking read works on a pipe, a file and a
terminal alike, and a daemon thread never holds the exit up); what it reads goes
to the process in order, and the end of input closes the process's stdin. With
``-t`` on a terminal the caller's terminal is put in raw mode for the process's
lifetime (keys, Ctrl-C included, go to the process, as with ``docker run -it``)
and every ``SIGWINCH`` resizes the process's terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator

from checkfu.contract.errors import SandboxError
from checkfu.core.driver import CheckedProcess

READ_BYTES = 1 << 16
DEFAULT_SIZE = (24, 80)


def window_size() -> tuple[int, int]:
    """The caller's terminal size as ``(rows, cols)``: stdout's, stdin's, or 24 by 80."""
    for stream in (sys.stdout, sys.stdin, sys.stderr):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError, AttributeError):
            continue
        if size.lines > 0 and size.columns > 0:
            return size.lines, size.columns
    return DEFAULT_SIZE


def stdin_is_terminal() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def raw_mode(active: bool) -> Iterator[None]:
    """The caller's terminal (stdin) in raw mode while inside, restored on the way out whatever happens."""
    if not active:
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _reader(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes]) -> None:
    fd = sys.stdin.fileno()
    while True:
        try:
            data = os.read(fd, READ_BYTES)
        except OSError:
            data = b""
        try:
            loop.call_soon_threadsafe(queue.put_nowait, data)
        except RuntimeError:  # the loop is gone: nobody waits for more
            return
        if not data:
            return


async def feed(proc: CheckedProcess, *, stdin: bool, resize: bool) -> None:
    """Stream the caller's stdin into ``proc`` (then end it), and follow the caller's window size.

    Ends when stdin ends or the process stops reading; cancelled when the process exits.
    """
    loop = asyncio.get_running_loop()
    if resize:
        loop.add_signal_handler(signal.SIGWINCH, lambda: asyncio.ensure_future(_resize(proc)))
    try:
        if not stdin:
            await proc.close_stdin()
            await asyncio.Event().wait()  # follow the window until the process exits
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        threading.Thread(target=_reader, args=(loop, queue), name="checkfu-stdin", daemon=True).start()
        while data := await queue.get():
            try:
                await proc.send_stdin(data)
            except SandboxError:
                return  # the process stopped reading: the rest of the input has nowhere to go
        with contextlib.suppress(SandboxError):
            await proc.close_stdin()
        if resize:
            await asyncio.Event().wait()
    finally:
        if resize:
            loop.remove_signal_handler(signal.SIGWINCH)


async def _resize(proc: CheckedProcess) -> None:
    with contextlib.suppress(SandboxError):
        await proc.resize(*window_size())
