"""The sandbox's first process, started by its init rather than by an exec.

An exec costs the engine a runtime call of its own (``runc exec``: about 40 ms here, more than everything
else a short command needs), so the first process of a sandbox is started from inside instead. The sandbox's
main process (under the engine's init) is the ``STARTER``, a line of ``sh`` that waits on the container's
standard input for one line from the runner, runs it, and then idles as ``sleep infinity`` did before it:

- The activating provider attaches to the container (``attach``) just after it starts or thaws (the engine will
  not attach to a paused one): one raw stream carries the container's stdin to the starter and its stdout and
  stderr back, multiplexed as an exec's are.
- The first ``exec`` or ``openProcess`` without a terminal writes its line (``line``): change to the working
  directory, set the request's environment, look for the program where ``execvp`` would, then start it in the
  foreground through ``/bin/sh`` (``CHILD``), which reports its pid and becomes the program in a session of its
  own (``setsid``, so it is ended as an exec is, by its process group), with the rest of the stream as its
  stdin. Its exit status follows on both streams, after everything it wrote to each. Each record is marked
  by a random nonce (``Records``) and taken out of the output.
- Anything the line cannot do as an exec would (no such directory, no such program, no ``setsid``, ``/bin/sh``
  or ``/proc/1/fd``) is reported before anything of the request's runs (``u``), and the same request is then
  made as an exec: every such refusal and exit status stays the engine's own.
- Every later process is an exec, and so are: a terminal's; a request setting the starter's own variables
  (``OWN``) or a name ``sh`` cannot set; a program named like an option; and every process of a sandbox this
  provider object did not activate (a live sandbox reached from another process).

The process runs in the same container as an exec's would (namespaces, control group, user, capabilities,
seccomp, no new privileges, limits, no signal ignored): only who asks the kernel to start it differs. The
differences from an exec, measured or by construction:

- its parent is the starter, not something outside the sandbox;
- while it runs, the starter's two shells hold two more pids of ``pids``;
- its output ends with its exit, where an exec's stream waits for every process that still holds its stdout;
- a file with no ``#!`` line that is no binary is run by ``sh``, as ``execvp`` does, where an exec refuses it;
- a script whose interpreter is missing exits 127 (``setsid``'s word), where an exec says 126;
- a starter stream that breaks while the sandbox runs on (the engine restarted) leaves the process's exit to
  be asked of the engine when the sandbox stops (``sandbox_ended``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import select
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

from checkfu.contract.errors import SandboxNotFound, SandboxProviderFailed, SandboxStateConflict
from checkfu.contract.members import ProcessStarted
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput, ProcessStreamEnd
from checkfu.providers.docker.engine import Engine
from checkfu.providers.docker.process import (
    EXIT_WAIT,
    READ_SIZE,
    STDERR,
    STDOUT,
    Capture,
    DockerProcess,
    ExecOutcome,
    FrameDecoder,
    pump,
    upgrade,
)
from checkfu.providers.docker.transport import Stream

STARTER = (
    'nl=\'\n\'; IFS= read -r line && { (eval "$line"); s=$?; eval "${line%%;*}"; '
    'printf \'\\000%s:x %d\\n\' "$n" "$s"; printf \'\\000%s:x %d\\n\' "$n" "$s" >&2; }; '
    "exec sleep infinity </dev/null >/dev/null 2>&1"
)
"""The sandbox's main process: one line from the runner (``line``), run in a subshell (so no mistake in it can
end the sandbox), whose status it then reports on both streams, after all the process wrote to each; then it
idles. Without a line (no one attached, or the stream closed first) it idles at once. ``nl`` is how a line
carries a newline inside an argument; the line's first command sets the nonce ``n`` its records are marked by.
Neither shell holds a descriptor beyond 0-2 while the process runs, and the one that reaps the process has its
stderr on ``/dev/null`` by then (a shell says "Killed" of a child a signal ended)."""

MAX_LINE = 16 << 10
"""A longer line is made as an exec instead (``sh`` reads its line a byte at a time)."""
START_WAIT = 10.0
"""How long to wait for the starter to report the process started (or that it could not start it)."""
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNSET = ("PWD", "OLDPWD", "SHLVL")
"""Variables ``sh`` exports of its own; an exec's process does not get them (unless the request sets them)."""
OWN = frozenset({"n", "nl", "c", "f", "d", "s", "line", "IFS", *UNSET})
"""The starter's own shell variables, ``IFS`` (which its lines split by) and what a shell exports of its own: a
request setting one is made as an exec."""
CHILD = f'exec 2>/proc/1/fd/2; unset {" ".join(UNSET)}; printf "\\000%s:p %d\\n" "$0" "$$"; exec setsid "$@"'
"""The process's first moments, in ``/bin/sh``: take the container's stderr again (the shell that waits for it has
its own on ``/dev/null``, so that its words on a child a signal ended, such as "Killed", are no output of the
process), report its pid, and become the program in a session of its own. Started in the foreground, so it keeps
every signal's default (an ``&`` job of a shell without job control ignores SIGINT and SIGQUIT for good)."""


def quote(value: str) -> str:
    """``value`` as one word of ``sh``, on one line: single quotes, a newline spliced in from ``$nl``."""
    return "'" + value.replace("'", "'\\''").replace("\n", "'\"$nl\"'") + "'"


def new_nonce() -> str:
    return secrets.token_hex(16)


def line(nonce: str, argv: list[str], env: dict[str, str], cwd: str) -> bytes | None:
    """The starter's line for one process; ``None`` when the request is one to make as an exec."""
    if not argv or not argv[0] or argv[0].startswith("-") or not cwd:
        return None  # a program named like an option would be read as one of setsid's
    if any("\0" in a for a in (*argv, cwd, *env, *env.values())):
        return None
    if not all(NAME.fullmatch(k) and k not in OWN for k in env):
        return None

    def say(what: str) -> str:
        return f"printf '\\000{nonce}:{what}\\n'"

    unstarted = f"{{ {say('u')}; {say('u')} >&2; exit; }}"
    parts = [
        f"n={nonce}",
        f"cd -P -- {quote(cwd)} 2>/dev/null || {unstarted}",  # as chdir: links resolved, not ".." taken back
        *(f"export {quote(f'{k}={v}')}" for k, v in env.items()),
        "command -v setsid >/dev/null 2>&1 && [ -x /bin/sh ] && [ -w /proc/1/fd/2 ] || " + unstarted,
        f"c={quote(argv[0])}",
        'case $c in */*) [ -f "$c" ] && [ -x "$c" ] || c= ;; '
        '*) f=; set -f; IFS=:; for d in $PATH; do [ -f "${d:-.}/$c" ] && [ -x "${d:-.}/$c" ] && { f=1; break; }; '
        'done; unset IFS; set +f; [ -n "$f" ] || c= ;; esac',
        f'[ -n "$c" ] || {unstarted}',
        "exec 2>/dev/null",
        f"/bin/sh -c {quote(CHILD)} {nonce} {' '.join(quote(a) for a in argv)}",
        'exit "$?"',
    ]
    try:
        data = ("; ".join(parts) + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate: no bytes to pass as a shell word
        return None
    return data if len(data) <= MAX_LINE else None


class _Splitter:
    """One stream's bytes with the starter's records taken out; nothing after its exit record."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.held = b""
        self.records: list[str] = []
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        buf, out = self.held + data, bytearray()
        marker = self.marker
        while (i := buf.find(marker)) >= 0:
            j = buf.find(b"\n", i)
            if j < 0:
                break
            out += buf[:i]
            record = buf[i + len(marker) : j].decode("ascii", "replace")
            buf = buf[j + 1 :]
            self.records.append(record)
            if record == "u" or record.startswith("x "):
                self.done = True
                self.held = b""
                return bytes(out)
        i = buf.find(marker)
        if i >= 0:  # a record whose end has not come yet
            out += buf[:i]
            self.held = buf[i:]
            return bytes(out)
        # the tail may be the start of a record: hold it back until the next bytes say
        k = buf.rfind(b"\0", max(0, len(buf) - len(marker) + 1))
        hold = k if k >= 0 and marker.startswith(buf[k:]) else len(buf)
        out += buf[:hold]
        self.held = buf[hold:]
        return bytes(out)


class Records(FrameDecoder):
    """The attach stream of a starter: frames as an exec's, with the starter's records taken out of them.

    ``pid`` (the process's, in the sandbox) once reported; ``exit_code`` and ``ended`` once its exit was
    reported on both streams; ``unstarted`` when the starter could not start it as an exec would.
    """

    def __init__(self, nonce: str) -> None:
        super().__init__()
        marker = b"\0" + nonce.encode() + b":"
        self._streams = {STDOUT: _Splitter(marker), STDERR: _Splitter(marker)}

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        out = []
        for stream, payload in super().feed(data):
            split = self._streams.get(stream)
            kept = split.feed(payload) if split is not None else payload
            if kept:
                out.append((stream, kept))
        return out

    def _records(self) -> list[str]:
        return self._streams[STDOUT].records + self._streams[STDERR].records

    @property
    def unstarted(self) -> bool:
        return "u" in self._records()

    @property
    def pid(self) -> int | None:
        for record in self._streams[STDOUT].records:
            if record.startswith("p ") and record[2:].isdigit():
                return int(record[2:])
        return None

    @property
    def exit_code(self) -> int | None:
        for record in self._streams[STDOUT].records + self._streams[STDERR].records:
            if record.startswith("x ") and record[2:].isdigit():
                return int(record[2:])
        return None

    @property
    def ended(self) -> bool:
        return self.unstarted or all(s.done for s in self._streams.values())


def attach(dial: Callable[[float], Stream], api_version: str, container_id: str) -> tuple[Stream, bytes]:
    """A raw stream to the container's stdin, stdout and stderr (its starter's), opened before it starts."""
    path = f"/v{api_version}/containers/{container_id}/attach?stream=1&stdin=1&stdout=1&stderr=1"
    return upgrade(dial, path, b"", "attach", timeout=30.0)


def kill(engine: Engine, container_id: str, user: str, pid: int) -> None:
    """SIGKILL the process group of the starter's process ``pid`` (the sandbox's pid of a session leader, by
    ``setsid``). On this host's engine from outside, as an exec's group is ended (``process.kill_group``): the
    host pid whose innermost pid is ``pid`` and whose control group is the sandbox's, so no limit inside the
    sandbox (its pids all taken) can stop it. On a remote engine from inside, by an exec as the sandbox user. A pid
    its starter has not reaped yet cannot have been reused; nothing when it already ended."""
    if engine.local:
        host = _host_pid(container_id, pid)
        if host is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host, signal.SIGKILL)
        return
    try:
        created = engine.api.exec_create(
            container_id, ["sh", "-c", 'kill -s KILL -- "-$0" 2>/dev/null; exit 0', str(pid)], user=user
        )
        engine.api.exec_start(created["Id"])
    except Exception as exc:
        raise SandboxProviderFailed(f"cannot end process {pid} of the sandbox: {exc}") from exc


def _host_pid(container_id: str, pid: int) -> int | None:
    """The host pid of the sandbox's process ``pid``: its ``NSpid`` ends with it, and its cgroup is the sandbox's."""
    with os.scandir("/proc") as entries:
        names = [e.name for e in entries if e.name.isdigit()]
    for name in names:
        try:
            with open(f"/proc/{name}/status", encoding="utf-8") as f:
                nspid = next((ln.split()[1:] for ln in f if ln.startswith("NSpid:")), [])
            if len(nspid) < 2 or int(nspid[-1]) != pid:
                continue
            with open(f"/proc/{name}/cgroup", encoding="utf-8") as f:
                if container_id in f.read():
                    return int(name)
        except (OSError, ValueError):
            continue
    return None


def run(
    engine: Engine,
    sock: Stream,
    initial: bytes,
    *,
    nonce: str,
    data: bytes,
    container_id: str,
    user: str,
    stdin: bytes,
    cap: int,
    timeout: float,
    cancel: threading.Event,
) -> ExecOutcome | None:
    """One process through the starter, as ``process.run_exec`` runs one through an exec; ``None`` when the
    starter did not start it (nothing of it ran: make it as an exec). Closes ``sock``."""
    deadline = time.monotonic() + timeout
    opened = open_started(sock, initial, nonce=nonce, data=data)
    if opened is None:
        return None
    records, frames = opened
    out, err = Capture(cap), Capture(cap)
    for stream, payload in frames:
        (out if stream == STDOUT else err).add(payload)
    try:
        _, _, ended = pump(
            sock, b"", stdin=stdin, cap=cap, deadline=deadline, cancel=cancel, decoder=records, captures=(out, err)
        )
        overran = not ended
        if overran and records.pid is not None:
            kill(engine, container_id, user, records.pid)
            if not cancel.is_set():  # its exit, once ended; what it wrote meanwhile is not kept, as for an exec
                pump(
                    sock,
                    b"",
                    stdin=None,
                    cap=cap,
                    deadline=time.monotonic() + EXIT_WAIT,
                    cancel=cancel,
                    decoder=records,
                )
    finally:
        sock.close()
    code = records.exit_code
    if code is None:
        if not cancel.is_set():
            sandbox_ended(engine.api, container_id, wait=False)
        code = 137
    return ExecOutcome(
        exit_code=code,
        timed_out=overran and not cancel.is_set(),
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
    )


def sandbox_ended(api: Any, container_id: str, *, wait: bool = True) -> NoReturn:
    """Raise what the engine says of a sandbox whose starter's stream ended before its process's exit was
    reported, as an exec's exit is asked of the engine: it is gone, or (``wait``: once it has stopped) it stopped.

    Raises:
        SandboxNotFound: the sandbox was removed.
        SandboxProviderFailed: the sandbox stopped (or, not ``wait``, it runs on); the process's exit is not
            known, and none is made up.
    """
    try:
        if wait:
            api.wait(container_id)
        else:
            api.inspect_container(container_id)
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) == 404:
            raise SandboxNotFound("the sandbox was removed while its process ran; its exit is not known") from None
        raise
    raise SandboxProviderFailed("the sandbox stopped before its process's exit was reported; none is made up")


def open_started(
    sock: Stream, initial: bytes, *, nonce: str, data: bytes
) -> tuple[Records, list[tuple[int, bytes]]] | None:
    """Write the line of a process and wait until the starter reports it started: the stream's records and the
    frames its output already filled (to be read first). ``None`` when the starter did not start it: it said
    so, or the stream ended with nothing from it (a stream attached and closed before, by an activation that
    failed, closed the starter's stdin for good). On ``None`` and on error, ``sock`` is closed.

    Raises:
        SandboxProviderFailed: the starter said nothing within ``START_WAIT``.
    """
    records = Records(nonce)
    frames = records.feed(initial)
    heard = bool(initial)
    try:
        sock.settimeout(START_WAIT)
        sock.sendall(data)
        end = time.monotonic() + START_WAIT
        while records.pid is None and not records.ended:
            if time.monotonic() >= end:
                raise SandboxProviderFailed("the sandbox's starter did not report its first process started")
            try:
                chunk = sock.recv(READ_SIZE)
            except TimeoutError:
                continue
            if not chunk:
                break
            heard = True
            frames += records.feed(chunk)
        if records.unstarted or (records.pid is None and not heard):
            sock.close()
            return None
        if records.pid is None:  # it said something, then the stream ended: it may have started; never run twice
            raise SandboxProviderFailed("the sandbox's stream ended before its first process was reported started")
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return records, frames


def close_quietly(sock: Stream) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class StartedProcess(DockerProcess):
    """An open process the starter started: ``ProcessStream`` over the attach stream, its records taken out."""

    def __init__(
        self,
        engine: Engine,
        started: ProcessStarted,
        sock: Stream,
        records: Records,
        frames: list[tuple[int, bytes]],
        container_id: str,
        user: str,
    ) -> None:
        super().__init__(engine, started, sock, b"", container_id)
        self._records = records
        self._frames = frames
        self._user = user

    async def send_stdin(self, data: bytes) -> None:
        """Write ``data`` to the process; waits while the process is not reading, and stops once it has ended (the
        engine's init holds the container's stdin too, so a write to a process that no longer reads it would
        otherwise wait for good).

        Raises:
            SandboxStateConflict: stdin was closed, or the process has ended.
        """
        if self._stdin_closed:
            raise SandboxStateConflict("stdin: already closed", field="stdin")
        await self._engine.run("openProcess stdin", self._send, memoryview(data))

    def _send(self, data: memoryview) -> None:
        while len(data):
            if self._records.ended or self._finished:
                self._stdin_closed = True
                raise SandboxStateConflict("stdin: the process has ended", field="stdin")
            _, ready, _ = select.select([], [self._sock], [], 0.25)
            if ready:
                try:
                    if isinstance(self._sock, socket.socket):  # never blocks past what select said it can take
                        sent = self._sock.send(data[: 1 << 16], socket.MSG_DONTWAIT)
                    else:
                        sent = self._sock.send(data[: 1 << 12])
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    self._stdin_closed = True
                    raise SandboxStateConflict("stdin: the process has stopped reading it", field="stdin") from None
                data = data[sent:]

    async def events(self) -> AsyncIterator[ProcessEvent]:
        """Output chunks as they arrive, one end per stream, then the exit the starter reported."""
        pending, self._frames = self._frames, []
        try:
            while True:
                for stream, payload in pending:
                    if payload and stream in (STDOUT, STDERR):
                        yield ProcessOutput(stream="out" if stream == STDOUT else "err", data=payload)
                if self._records.ended:
                    break
                data = await self._engine.run("openProcess read", self._recv)
                if not data:
                    break
                pending = self._records.feed(data)
            yield ProcessStreamEnd(stream="out")
            yield ProcessStreamEnd(stream="err")
            yield await self._exit()
        finally:
            self._sock.close()

    async def _exit(self) -> ProcessExit:
        code = self._records.exit_code
        self._finished = True
        self._sock.close()
        if code is None:  # the stream ended first: the engine says what became of the sandbox
            await self._engine.run("openProcess exit", sandbox_ended, self._engine.api, self._container_id)
        assert code is not None
        return ProcessExit(exit_code=code)

    async def kill(self) -> None:
        """SIGKILL the process and its group; idempotent."""
        pid = self._records.pid
        if self._finished or self._records.ended or pid is None:
            return
        await self._engine.run("openProcess kill", kill, self._engine, self._container_id, self._user, pid)
