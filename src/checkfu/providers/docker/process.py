"""Processes in a sandbox, through the Engine API's exec endpoints.

``exec_create`` goes through docker-py; the start is hijacked on the engine's
Unix socket here, byte-exact, so no output can be lost between the HTTP headers
and the raw stream (docker-py's socket mode reads the headers through a buffered
reader that may swallow the first frames), and so stdin can be half-closed.
The raw stream is demultiplexed by ``FrameDecoder``, a sans-I/O object.

An exec that outlives its timeout, or whose caller goes away, is ended with
SIGKILL to its process group: the engine starts every exec as a session leader,
so its group id is the host pid the engine reports. The pid is checked to
belong to the sandbox's cgroup first, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import select
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from checkfu.contract.errors import SandboxOperationUnsupported, SandboxProviderFailed, SandboxStateConflict
from checkfu.contract.members import ProcessStarted
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.providers.docker.archive import exists
from checkfu.providers.docker.engine import STATUS_ERRORS, Engine
from checkfu.providers.docker.transport import Stream

HEADER = 8
STDOUT, STDERR = 1, 2
READ_SIZE = 1 << 16
EXIT_WAIT = 10.0
"""How long to wait for the engine to record an exec's exit after its streams ended."""
PID_WAIT = 10.0
"""How long to wait for the engine to record the pid of an exec it already reports running."""


class FrameDecoder:
    """Splits the Engine API's multiplexed stream (8-byte header: stream, 0, 0, 0, big-endian size)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The frames ``data`` completes, in order; a partial frame waits for more."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        buf, pos = self._buf, self._pos
        while len(buf) - pos >= HEADER:
            size = int.from_bytes(buf[pos + 4 : pos + 8], "big")
            if len(buf) - pos - HEADER < size:
                break
            out.append((buf[pos], bytes(buf[pos + HEADER : pos + HEADER + size])))
            pos += HEADER + size
        if pos > 1 << 16 or pos == len(buf):
            del buf[:pos]
            pos = 0
        self._pos = pos
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf) - self._pos


@dataclass
class Capture:
    """One output stream, kept up to ``cap`` bytes; the rest is counted and dropped."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room >= len(chunk):
            self.data += chunk
        else:
            if room > 0:
                self.data += chunk[:room]
            self.dropped += len(chunk) - max(room, 0)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0


@dataclass
class ExecOutcome:
    exit_code: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool


def hijack(
    dial: Callable[[float], Stream], api_version: str, exec_id: str, *, timeout: float = 60.0, tty: bool = False
) -> tuple[Stream, bytes]:
    """Start exec ``exec_id`` attached over a connection ``dial`` opens; the stream and the bytes already read.

    Raises:
        SandboxNotFound: the exec (or its container) is gone.
        SandboxStateConflict: the container is not running (or is paused).
        SandboxProviderFailed: the engine refused the start otherwise, or closed the connection.
        OSError: the engine cannot be reached.
    """
    body = b'{"Detach":false,"Tty":true}' if tty else b'{"Detach":false,"Tty":false}'
    return upgrade(dial, f"/v{api_version}/exec/{exec_id}/start", body, "exec start", timeout=timeout)


def upgrade(
    dial: Callable[[float], Stream], path: str, body: bytes, what: str, *, timeout: float = 60.0
) -> tuple[Stream, bytes]:
    """``POST path`` asking the engine to turn the connection into a raw stream (an exec's start, a container's
    attach); the stream and the bytes already read past the answer's headers.

    Raises:
        SandboxNotFound, SandboxStateConflict: as the engine's status says.
        SandboxProviderFailed: the engine refused otherwise, or closed the connection.
        OSError: the engine cannot be reached.
    """
    sock = dial(timeout)
    try:
        sock.settimeout(timeout)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: docker\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                raise SandboxProviderFailed(f"{what}: the engine closed the connection before answering")
            buf += chunk
            if len(buf) > 1 << 16:
                raise SandboxProviderFailed(f"{what}: the engine's answer has no end of headers")
        header, _, rest = buf.partition(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        if status in (101, 200):
            sock.settimeout(None)
            return sock, rest
        message = _error_message(rest)
        cls = STATUS_ERRORS.get(status)
        detail = f"{what}: engine answered {status}" + (f" ({message})" if message else "")
        if cls is not None:
            raise cls(detail)
        raise SandboxProviderFailed(detail, retryable=status >= 500)
    except BaseException:
        sock.close()
        raise


def _error_message(body: bytes) -> str:
    try:
        value = json.loads(body.decode("utf-8", "replace") or "{}")
    except ValueError:
        return ""
    message = value.get("message") if isinstance(value, dict) else None
    return message[:300] if isinstance(message, str) else ""


def pump(
    sock: Stream,
    initial: bytes,
    *,
    stdin: bytes | None,
    cap: int,
    deadline: float,
    cancel: threading.Event,
) -> tuple[Capture, Capture, bool]:
    """Feed ``stdin`` (then half-close) and collect both streams until EOF, the deadline or ``cancel``.

    Returns the two captures and whether the stream ended (``False`` when the deadline passed or the caller
    cancelled first). Only the engine ends the stream (by closing it): nothing the process writes can.
    """
    out, err = Capture(cap), Capture(cap)
    decoder = FrameDecoder()

    def take(data: bytes) -> None:
        for stream, payload in decoder.feed(data):
            if stream == STDOUT:
                out.add(payload)
            elif stream == STDERR:
                err.add(payload)

    take(initial)
    pending = memoryview(stdin) if stdin is not None else None
    if pending is not None and len(pending) == 0:
        _close_write(sock)
        pending = None
    sock.setblocking(False)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    writing = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or cancel.is_set():
            return out, err, False
        want_write = pending is not None
        if want_write != writing:
            poller.modify(sock, select.POLLIN | (select.POLLOUT if want_write else 0))
            writing = want_write
        for _fd, ev in poller.poll(min(remaining, 0.25) * 1000):
            if ev & select.POLLOUT and pending is not None:
                try:
                    sent = sock.send(pending[: 1 << 16])
                except (BrokenPipeError, ConnectionResetError):
                    pending = None
                    continue
                except BlockingIOError:
                    continue
                pending = pending[sent:]
                if len(pending) == 0:
                    _close_write(sock)
                    pending = None
            if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    data = sock.recv(READ_SIZE)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    data = b""
                if not data:
                    return out, err, True
                take(data)


def _close_write(sock: Stream) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


ENGINE_SAID = b"OCI runtime exec failed"
"""How the engine's own words start when an exec's program could not be started: it writes them into the exec's
output stream as if the program had printed them (``docker exec`` prints them on stderr)."""


def engine_words(stdout: bytes, stderr: bytes, code: int) -> tuple[bytes, bytes]:
    """stdout and stderr as a shell would have them: a program that could not be started (126, 127) has the engine's
    reason on stderr, as ``docker exec`` and ``sh`` put it, not on stdout."""
    if code in (CANNOT_EXECUTE, NOT_FOUND) and not stderr and stdout.startswith(ENGINE_SAID):
        return b"", stdout.replace(b"\r\n", b"\n")
    return stdout, stderr


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CANNOT_EXECUTE, NOT_FOUND = 126, 127


def exit_as_shell(api: Any, container_id: str, code: int, argv0: str, cwd: str, env: dict[str, str]) -> int:
    """The exit status as a shell (and every other tier) reports it: the engine says 126 both for a program it
    cannot execute and for one that is not there; 127 is the second, told apart by looking for the program
    (the archive API's stat, inside the sandbox's own root, links not followed) where ``execvp`` would."""
    if code != CANNOT_EXECUTE or not argv0:
        return code
    if "/" in argv0:
        candidates = [posixpath.normpath(posixpath.join(cwd, argv0))]
    else:
        path = env.get("PATH")
        if path is None:
            image_env = api.inspect_container(container_id).get("Config", {}).get("Env") or []
            path = next((e[5:] for e in image_env if e.startswith("PATH=")), DEFAULT_PATH)
        candidates = [posixpath.join(d or ".", argv0) for d in path.split(":")]
        candidates = [c if c.startswith("/") else posixpath.join(cwd, c) for c in candidates]
    if any(exists(api, container_id, c) for c in dict.fromkeys(candidates)):
        return code
    return NOT_FOUND


def wait_exit(api: Any, exec_id: str, *, limit: float = EXIT_WAIT) -> int | None:
    """The exit code the engine records for ``exec_id``, waiting up to ``limit`` seconds for it."""
    end = time.monotonic() + limit
    pause = 0.002
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            code = info.get("ExitCode")
            return int(code) if isinstance(code, int) else None
        if time.monotonic() >= end:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def resize_exec(api: Any, exec_id: str, rows: int, cols: int) -> None:
    """Resize an exec's terminal; nothing when it already ended."""
    try:
        api.exec_resize(exec_id, height=rows, width=cols)
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) not in (404, 409, 500):
            raise


def running_pid(api: Any, exec_id: str, *, limit: float = PID_WAIT) -> int | None:
    """The host pid of a running exec, or None once it has ended.

    The engine marks an exec running, and its process may already have written output, a moment before it
    records the pid (``Pid`` reads 0 meanwhile): that moment is waited out, never taken for "nothing to end".

    Raises:
        SandboxProviderFailed: still no pid after ``limit`` seconds.
    """
    end = time.monotonic() + limit
    pause = 0.002
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            return None
        pid = info.get("Pid")
        if isinstance(pid, int) and pid > 0:
            return pid
        if time.monotonic() >= end:
            raise SandboxProviderFailed(f"exec {exec_id[:12]}: the engine reports it running with no pid")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def sandbox_pid(engine: Engine, exec_id: str, container_id: str) -> int | None:
    """The id of exec ``exec_id``'s process in the sandbox's own pid namespace (what ``ps`` inside it shows), read
    from this host's ``/proc`` (checked to belong to the sandbox's cgroup first); ``None`` when the process has ended
    already, or the engine is not local (its ``/proc`` is not this host's)."""
    if not engine.local:
        return None
    try:
        pid = running_pid(engine.api, exec_id)
    except SandboxProviderFailed:
        return None
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            if container_id not in f.read():
                return None
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    inside = int(line.split()[-1])
                    return inside if inside > 0 else None
    except (OSError, ValueError):
        return None
    return None


def kill_group(engine: Engine, exec_id: str, container_id: str) -> None:
    """SIGKILL the process group of a running exec; nothing when it already ended.

    The group id is the host pid the engine reports, checked to belong to the sandbox's cgroup
    first (a reused pid is never signalled): in this host's ``/proc`` for a local engine, and
    on a remote one by a short-lived helper container in the engine's host PID namespace,
    running the sandbox's own image, labelled as the sandbox is so it can always be reclaimed.

    Raises:
        SandboxProviderFailed: the process cannot be signalled.
    """
    api = engine.api
    pid = running_pid(api, exec_id)
    if pid is None:
        return
    if not engine.local:
        _kill_group_remote(api, pid, container_id)
        return
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            if container_id not in f.read():
                return
        os.killpg(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        return
    except PermissionError as exc:
        raise SandboxProviderFailed(f"cannot end exec {exec_id[:12]}: {exc}") from exc


def _kill_group_remote(api: Any, pid: int, container_id: str) -> None:
    sandbox = api.inspect_container(container_id)
    labels = {k: v for k, v in (sandbox.get("Config", {}).get("Labels") or {}).items() if k.startswith("checkfu.")}
    labels["checkfu.kind"] = "companion"
    script = f"grep -q {container_id} /proc/{pid}/cgroup 2>/dev/null && kill -KILL -{pid} 2>/dev/null; exit 0"
    helper = api.create_container(
        sandbox["Image"],
        ["sh", "-c", script],
        labels=labels,
        host_config=api.create_host_config(pid_mode="host", network_mode="none", auto_remove=False),
        user="0:0",
    )
    try:
        api.start(helper["Id"])
        api.wait(helper["Id"], timeout=30)
    except Exception as exc:
        raise SandboxProviderFailed(f"cannot end process group {pid} on the remote engine: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            api.remove_container(helper["Id"], force=True)


def run_exec(
    engine: Engine,
    *,
    container_id: str,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    user: str,
    stdin: bytes,
    cap: int,
    timeout: float,
    cancel: threading.Event,
) -> ExecOutcome:
    """Create, start and wait for one exec (blocking; run it in the engine's pool)."""
    api = engine.api
    deadline = time.monotonic() + timeout
    created = api.exec_create(
        container_id,
        argv,
        stdout=True,
        stderr=True,
        stdin=bool(stdin),
        tty=False,
        environment=env or None,
        workdir=cwd,
        user=user,
        privileged=False,
    )
    exec_id = created["Id"]
    sock, initial = hijack(engine.dial, engine.api_version, exec_id, timeout=max(1.0, timeout))
    ended = False
    try:
        out, err, ended = pump(sock, initial, stdin=stdin if stdin else None, cap=cap, deadline=deadline, cancel=cancel)
    finally:
        if not ended:
            kill_group(engine, exec_id, container_id)
        sock.close()
    # Its output may end before it does (it closed its own stdout): wait for the real exit until the deadline,
    # then end it as a timed-out command. An exit status is never made up.
    code = wait_exit(api, exec_id, limit=max(EXIT_WAIT, deadline - time.monotonic()))
    overran = code is None
    if overran:
        kill_group(engine, exec_id, container_id)
        code = wait_exit(api, exec_id)
    if code is None:
        raise SandboxProviderFailed(f"exec {exec_id[:12]}: the engine reports no exit status; none is made up")
    code = exit_as_shell(api, container_id, code, argv[0] if argv else "", cwd, env)
    stdout, stderr = engine_words(bytes(out.data), bytes(err.data), code)
    return ExecOutcome(
        exit_code=code,
        timed_out=(overran or not ended) and not cancel.is_set(),
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
    )


class DockerProcess:
    """An open process: ``ProcessStream`` over one hijacked exec stream."""

    def __init__(
        self,
        engine: Engine,
        started: ProcessStarted,
        sock: Stream,
        initial: bytes,
        container_id: str,
        *,
        tty: bool = False,
        launch: tuple[str, str, dict[str, str]] = ("", "/", {}),
    ) -> None:
        self._engine = engine
        self._started = started
        self._sock = sock
        self._initial = initial
        self._container_id = container_id
        self._stdin_closed = False
        self._finished = False
        self._tty = tty
        self._launch = launch
        """argv[0], the working directory and the request's environment: where a program is looked for."""

    @property
    def started(self) -> ProcessStarted:
        return self._started

    @property
    def exec_id(self) -> str:
        return self._started.process_id

    async def send_stdin(self, data: bytes) -> None:
        """Write ``data`` to the process; waits while the process is not reading.

        Raises:
            SandboxStateConflict: stdin was closed, or the process no longer reads it.
        """
        if self._stdin_closed:
            raise SandboxStateConflict("stdin: already closed", field="stdin")
        try:
            await self._engine.run("openProcess stdin", self._sock.sendall, data)
        except SandboxProviderFailed as exc:
            if isinstance(exc.__cause__, (BrokenPipeError, ConnectionResetError)):
                self._stdin_closed = True
                raise SandboxStateConflict("stdin: the process has stopped reading it", field="stdin") from None
            raise

    async def close_stdin(self) -> None:
        """End stdin; idempotent. Later ``send_stdin`` calls raise ``SandboxStateConflict``.

        On a terminal, end of input is the terminal's end-of-file character (``^D``), as a person types it.
        """
        if not self._stdin_closed:
            self._stdin_closed = True
            if self._tty:
                with contextlib.suppress(OSError):
                    await self._engine.run("openProcess stdin", self._sock.sendall, b"\x04")
                return
            _close_write(self._sock)

    async def resize(self, rows: int, cols: int) -> None:
        """Give the process's terminal a new window size.

        Raises:
            SandboxOperationUnsupported: the process was started without a terminal.
        """
        if not self._tty:
            raise SandboxOperationUnsupported("resize: the process has no terminal (it was started without tty)")
        if not self._finished:
            await self._engine.run("openProcess resize", resize_exec, self._engine.api, self.exec_id, rows, cols)

    async def events(self) -> AsyncIterator[ProcessEvent]:
        """Output chunks as they arrive, one end per stream, then the exit. Pulling is the backpressure."""
        if self._tty:
            async for event in self._raw_events():
                yield event
            return
        decoder = FrameDecoder()
        pending = decoder.feed(self._initial)
        self._initial = b""
        first = True
        held: bytes | None = None  # a first output that may be the engine's words, not the program's
        try:
            while True:
                for stream, payload in pending:
                    if payload and stream in (STDOUT, STDERR):
                        if first and stream == STDOUT and payload.startswith(ENGINE_SAID):
                            first, held = False, payload
                            continue
                        first = False
                        if held is not None:
                            yield ProcessOutput(stream="out", data=held)
                            held = None
                        yield ProcessOutput(stream="out" if stream == STDOUT else "err", data=payload)
                data = await self._engine.run("openProcess read", self._recv)
                if not data:
                    break
                pending = decoder.feed(data)
            if held is None:
                yield ProcessStreamEnd(stream="out")
                yield ProcessStreamEnd(stream="err")
                yield await self._exit()
                return
            ended = await self._exit()  # the engine's words only when the program was never started
            out, err = engine_words(held, b"", ended.exit_code)
            for name, data in (("out", out), ("err", err)):
                if data:
                    yield ProcessOutput(stream="out" if name == "out" else "err", data=data)
            yield ProcessStreamEnd(stream="out")
            yield ProcessStreamEnd(stream="err")
            yield ended
        finally:
            self._sock.close()  # also when the engine went away meanwhile, or the reader stopped reading

    async def _raw_events(self) -> AsyncIterator[ProcessEvent]:
        """A terminal's output is one raw stream (no multiplexing): all of it is ``out``; ``err`` has nothing."""
        try:
            yield ProcessStreamEnd(stream="err")
            data = self._initial
            self._initial = b""
            while True:
                if data:
                    yield ProcessOutput(stream="out", data=data)
                data = await self._engine.run("openProcess read", self._recv)
                if not data:
                    break
            yield ProcessStreamEnd(stream="out")
            yield await self._exit()
        finally:
            self._sock.close()

    async def _exit(self) -> ProcessExit:
        # Its output ended, yet the process may run on (it closed its own stdout): wait for the real exit,
        # however long; the reader's own timeout or a kill ends the wait. An exit is never made up.
        code = None
        while code is None:
            code = await self._engine.run("openProcess exit", wait_exit, self._engine.api, self.exec_id)
        argv0, cwd, env = self._launch
        code = await self._engine.run(
            "openProcess exit", exit_as_shell, self._engine.api, self._container_id, code, argv0, cwd, env
        )
        self._finished = True
        self._sock.close()
        return ProcessExit(exit_code=code)

    def _recv(self) -> bytes:
        try:
            return self._sock.recv(READ_SIZE)
        except (ConnectionResetError, OSError):
            return b""

    async def kill(self) -> None:
        """SIGKILL the process and its group; idempotent."""
        if self._finished:
            return
        await self._engine.run("openProcess kill", kill_group, self._engine, self.exec_id, self._container_id)
