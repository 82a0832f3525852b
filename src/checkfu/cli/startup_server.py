"""The start-up server: a process that has imported what ``checkfu`` commands use, and forks one child per command.

``checkfu.cli.startup`` says what it is for and how a client finds it. Here:

- **Start.** ``python -P -m checkfu.cli.startup_server --dir DIR --key KEY [--idle SECONDS]`` (what ``checkfu server
  start`` and a command at a terminal run). It takes ``DIR/KEY.lock`` (one server per key: a second exits at
  once), imports the libraries (``PRELOAD``) and every checkfu module, builds the command tree, and only then
  listens on ``DIR/KEY.sock`` (mode 0600), so a client never waits for it to warm up: until then it runs its
  command itself.
- **Serve.** One thread, one loop: a connection from another user is closed unanswered. Requests are read as their
  bytes come, every connection's at once, so one that sends nothing holds up no other (it is closed once
  ``REQUEST_TIMEOUT`` has passed without its whole request). ``run`` goes to a child, which answers with its process
  id, runs the command and answers with its exit status (the server does for a child killed by a signal: 128 + the
  signal, as a shell says); ``status`` and ``stop`` are answered here.
- **Whose context.** A child runs a command with the server's credentials, capabilities, namespaces, limits,
  priority and confinement, not its client's. So a ``run`` is refused (``refused: context``, the client then runs
  the command in its own process) unless the process that connected has the same context as the server: read by the
  server itself from ``/proc`` (``checkfu.cli.process_context``), with what only a process can see of itself as its
  client says it (``startup.own_context``), and with the client's proof that it may look at the server (the
  server's proof file, a ``memfd`` the client opens through ``/proc/<pid>/fd/N`` and passes after its streams:
  ``startup.proof``). A refused command does not keep the server from its idle exit.
- **The spare.** Once commands have been quiet a moment (``SPARE_QUIET``), the server forks a child ahead of the
  next one (``_spare``): it leaves the server and copies the pages it shares with it (``_prefault``), then waits.
  A ``run`` is handed to it (the client's connection and streams passed as descriptors, with the request); with
  none ready, a child is forked for it. ``CHECKFU_SERVER_SPARE=0`` keeps none.
- **The child.** Its own process group (the client signals the group, as a terminal would); the client's three
  descriptors become 0, 1 and 2, with Python's streams made over them as the client's were; then the client's
  working directory, umask, environment and arguments, the server's signal handlers gone, the command line's
  consoles made again for those streams (``checkfu.cli.consoles``), and ``checkfu.cli.run_here()``. At its end
  Python's exit functions run and the status goes to the client. A client that goes away first makes the child
  get SIGTERM (a Run releases what it holds on SIGTERM).
- **Stop.** ``stop`` (``checkfu server stop``), SIGTERM, or ``--idle`` seconds without a command running. Commands
  still running are not stopped: each reports its own status to its client.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import fcntl
import gc
import importlib
import io
import locale
import os
import selectors
import signal
import socket
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import rich
import typer
from typer import _click

from checkfu.cli import consoles, process_context, startup

PRELOAD = (
    "sqlite3",
    "sqlalchemy",
    "sqlalchemy.dialects.sqlite",
    "docker",
    "pydantic",
    "typer",
    "rich.console",
    "rich.markup",
    "rich.table",
    # What a Run would otherwise import in the child (``test_preload_leaves_nothing_for_a_run_to_import``):
    "rich._emoji_codes",  # rich's markup, at the first print
    "typer._adapters",
    "typer._click.decorators",
    "pydantic.type_adapter",
    "netrc",  # requests, at the first request
    "encodings.ascii",
    "encodings.utf_16_be",  # requests' guess at a JSON body's encoding
)
"""The libraries every command leans on; checkfu's own modules are all imported after them (``preload``)."""
SKIPPED = ("checkfu.cli.startup_server",)
REQUEST_TIMEOUT = 5.0
"""Seconds a connection has to send its whole request (and each later send to it may take)."""
SPARE_QUIET = 0.25
"""Seconds without a command starting or ending before the server makes its next spare. Making one copies the
server's memory (tens of milliseconds of processor time), work a command just started should not compete with; and
commands run one after another (a script's loop) are served as they come, with no spare made between them."""
SPARE_RETRY = 5.0
"""Seconds before trying again after a spare could not be made (no process or no memory to be had)."""


@dataclass
class Spare:
    """A child made ahead of the next command (``_spare``): its process id, the server's end of the socket it is
    handed a command through, and whether it has said it is ready."""

    pid: int
    hand: socket.socket
    ready: bool = False


@dataclass
class Caller:
    """A connection whose request has not all come yet: what it sent so far (the client's streams come with its
    first bytes), and when the rest must have come by (monotonic)."""

    conn: socket.socket
    inbox: startup.Inbox
    deadline: float
    accepted: float
    """The boot-time clock (``CLOCK_BOOTTIME``) when it was accepted: its process must have started by then."""

    def close(self) -> None:
        self.inbox.close()
        self.conn.close()


def preload() -> list[str]:
    """Import ``PRELOAD`` and every checkfu module, and build every command of the tree as running it would;
    the modules that could not be imported (an optional extra not installed), by name.

    The command line's consoles are made again in each child (``checkfu.cli.consoles``), for its streams."""
    import checkfu  # noqa: PLC0415

    skipped: list[str] = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a missing library is the child's to report, as it would be without us
            skipped.append(name)
    for name in _module_names(Path(checkfu.__file__).parent, "checkfu"):
        if name in SKIPPED or name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(name)
        except Exception:
            skipped.append(name)
    from checkfu.cli import commands  # noqa: PLC0415
    from checkfu.core.registry import installed_entry_points  # noqa: PLC0415

    installed_entry_points()  # read once here, for every child
    for name in commands.REGISTER:
        if name not in skipped:
            commands.load(name)
    _parse_once(typer.main.get_command(commands.app), "checkfu", None)
    try:
        rehearse()
    except Exception:  # a warm-up only: each command's journal compiles what it uses, as without a server
        skipped.append("rehearsal")
    return skipped


def rehearse() -> None:
    """Open a journal in a scratch directory as a command does, and run one Run through it on the in-memory
    provider (``checkfu.testing.MemoryProvider``): every statement a Run writes to its journal is then compiled
    once, here, in the dialect and cache every SQLite journal of this process shares
    (``checkfu.core.journal._share_compiled``), and a child's journal finds them compiled. Nothing outside the
    scratch directory is touched, and it is gone afterwards. It also writes and reads an enrollment, as a Run of an
    in-tree provider does before it starts (the in-memory provider is not one)."""
    import asyncio  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from checkfu.cli.state import open_service  # noqa: PLC0415
    from checkfu.core.journal import sqlite_url  # noqa: PLC0415
    from checkfu.core.registry import Adapter, Registry  # noqa: PLC0415
    from checkfu.runner import RunnerConfig, RunnerService  # noqa: PLC0415
    from checkfu.testing import MemoryProvider, memory_profile  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="checkfu-rehearsal-") as scratch:
        opened = open_service(sqlite_url(Path(scratch) / "journal.sqlite"))
        journal = opened.journal
        service = RunnerService(
            RunnerConfig(state_dir=Path(scratch), journal_url=opened.config.journal_url, tag="checkfu-rehearsal"),
            journal,
        )
        try:
            memory = MemoryProvider()
            registry = Registry()
            registry.add(Adapter(envelope=memory.envelope, provider=memory, source="the start-up server's rehearsal"))
            asyncio.run(
                service.run(
                    registry,
                    memory.target,
                    memory_profile(),
                    ["true"],
                    keep_output=1 << 20,
                    noted={"engine": "rehearsal"},
                )
            )
            # As ``Runner.record_in_tree`` does for an in-tree adapter (the in-memory one is not one).
            journal.record_enrollment(
                memory.target,
                source="the start-up server's rehearsal",
                kind="in_tree",
                envelope_digest="sha256:" + "0" * 64,
                envelope=memory.envelope.model_dump_json(),
                ceiling="{}",
                now=0.0,
            )
            journal.enrollment(memory.target)
        finally:
            journal.close()


def _parse_once(command: _click.Command, name: str, parent: _click.Context | None) -> None:
    """Parse an empty command line for ``command`` and every command under it, leniently (no callback runs, no
    error is raised): what typer and pydantic make on a command's first parse is then made once, here, and a
    child's first parse costs what a later one would (3 ms rather than 10)."""
    try:
        with command.make_context(name, [], parent=parent, resilient_parsing=True) as ctx:
            if isinstance(command, typer.core.TyperGroup):
                for sub in command.list_commands(ctx):
                    found = command.get_command(ctx, sub)
                    if found is not None:
                        _parse_once(found, sub, ctx)
    except Exception:  # a warm-up only: the command reports its own errors when it runs
        pass


def _module_names(root: Path, package: str) -> list[str]:
    """Every module under ``root`` by its dotted name, namespace packages (a directory without ``__init__.py``,
    such as ``checkfu.core``) included, which ``pkgutil.walk_packages`` does not enter."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts or any(not p.isidentifier() for p in parts):
            continue
        names.append(".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts)))
    return names


class Server:
    def __init__(self, directory: str, key: str, idle: float, spare: bool = True) -> None:
        self.proof: int | None = None
        """This process's proof file (``startup.proof``): made first, so it is the first descriptor after the three
        streams, where a client looks for it first. ``None``: none could be made, and no command is run."""
        with contextlib.suppress(OSError, AttributeError):
            self.proof = os.memfd_create(startup.PROOF_NAME, os.MFD_CLOEXEC)
        self.directory, self.key, self.idle = directory, key, idle
        self.keep_spare = spare
        """Whether to keep a spare child ready (``startup.spare_wanted``)."""
        self.path = startup.socket_path(directory, key)
        self.started = time.time()
        self.served = 0
        self.children: dict[int, socket.socket] = {}
        self.callers: dict[int, Caller] = {}
        """Connections still sending their request, by descriptor."""
        self.stopping = False
        self.lock: Any = None
        self.listener: socket.socket | None = None
        self.bound = 0
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.last = time.monotonic()
        self.skipped: list[str] = []
        self.spare: Spare | None = None
        self.stirred = 0.0
        """When a command last started or ended (monotonic)."""
        self.spare_failed = 0.0
        self.spares = 0
        """How many commands a spare took (the rest were forked as they came)."""
        self.own: dict[str, Any] = {}
        """What this process sees of itself alone (``startup.own_context``), as a client says it."""
        self.context: dict[str, str] | None = None
        """This process's context (``process_context``), which a caller's must be to have a command run; ``None``:
        it could not be read, and no command is run."""
        self.refused = 0
        """How many commands were refused for their caller's context."""
        self.last_refused: list[str] = []
        """What differed for the last of them."""

    # set-up and tear-down -----------------------------------------------------------------------

    def claim(self) -> bool:
        """Take this key's lock; ``False`` when another server holds it. (``checkfu server stop`` takes it for a
        moment to tell a dead server's socket from a live one's: a server starting then tries for a second.)"""
        fd = os.open(os.path.join(self.directory, f"{self.key}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.lock = os.fdopen(fd, "r+")
        for _ in range(20):
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                time.sleep(0.05)
        self.lock.close()
        return False

    def listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        self.bound = os.stat(self.path).st_ino
        self.own = startup.own_context()
        self.context = self._own_context()
        listener.listen(64)
        listener.setblocking(False)
        self.listener = listener
        self.last = time.monotonic()  # idle from now: the import before does not count
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)

    def _own_context(self) -> dict[str, str] | None:
        """This process's context, read as a caller's is; ``None`` when it cannot be (``/proc`` is another pid
        namespace's, so no caller's could be read either)."""
        if not process_context.own_pid_is_procs():
            return None
        try:
            return process_context.with_report(process_context.read(os.getpid()), self.own, sees_server=True)
        except process_context.Unreadable:
            return None

    def _on_term(self, *_: object) -> None:
        self.stopping = True

    def close(self) -> None:
        if self.listener is not None:
            # The socket file is removed only while it is still ours (a server started after a stop may own it).
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self.bound:
                    os.unlink(self.path)
            self.listener.close()
        for conn in self.children.values():
            conn.close()
        for caller in self.callers.values():
            caller.close()
        self._drop_spare(wait=True)
        if self.lock is not None:
            self.lock.close()
        if self.proof is not None:
            os.close(self.proof)
            self.proof = None

    # spares -------------------------------------------------------------------------------------

    def _spare_due(self) -> float | None:
        """Seconds until a spare should be made (0: now); ``None`` when none is wanted."""
        if not self.keep_spare or self.spare is not None or self.stopping or self.listener is None:
            return None
        if self.context is not None and process_context.filtered(self.context):
            return None  # under a seccomp filter: no caller's context is ever taken for this one, nor a spare's
        due = max(self.spare_failed + SPARE_RETRY, self.stirred + SPARE_QUIET if self.served else 0.0)
        return max(0.0, due - time.monotonic())

    def _make_spare(self) -> None:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            self.spare_failed = time.monotonic()
            return
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            self.spare_failed = time.monotonic()
            return
        if pid == 0:
            ours.close()
            _spare(self, theirs)  # never returns
        theirs.close()
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does
        self.spare = Spare(pid, ours)
        self.selector.register(ours, selectors.EVENT_READ)

    def _spare_said(self) -> None:
        """The spare wrote: ready, or (at its end) gone."""
        assert self.spare is not None
        try:
            said = self.spare.hand.recv(1)
        except OSError:
            said = b""
        if said != b"r":
            self._lost_spare()
            return
        # The spare will run commands in its own context: it must be the server's, read afresh (nothing on a
        # command's way: a spare is made while commands are quiet). One that differs (changed from outside since
        # it was made) is let go, and another made later.
        self.context = self._own_context()
        try:
            spare = process_context.with_report(process_context.read(self.spare.pid), self.own, sees_server=True)
        except process_context.Unreadable:
            spare = None
        if self.context is None or spare is None or process_context.differences(self.context, spare):
            self._lost_spare()
            return
        self.spare.ready = True

    def _lost_spare(self) -> None:
        """The spare ended by itself. One that never got ready counts as a failure (``SPARE_RETRY``), so a spare
        that cannot be made is not made again and again."""
        if self.spare is not None and not self.spare.ready:
            self.spare_failed = time.monotonic()
        self._drop_spare()

    def _drop_spare(self, wait: bool = False) -> None:
        """Let the spare go: it ends when it reads that its socket closed. ``wait``: until it has (a second at most,
        then it is killed), as the server's own exit does."""
        spare, self.spare = self.spare, None
        if spare is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(spare.hand)
        spare.hand.close()
        if not wait:
            return  # reaped with the children
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                if os.waitpid(spare.pid, os.WNOHANG)[0] == spare.pid:
                    return
            except ChildProcessError:
                return
            time.sleep(0.005)
        with contextlib.suppress(OSError):
            os.kill(spare.pid, signal.SIGKILL)
            os.waitpid(spare.pid, 0)

    def _hand_to_spare(self, conn: socket.socket, fds: list[int], message: dict[str, Any]) -> bool:
        """Give the command to the ready spare; ``False`` when there is none, or it could not take it."""
        spare = self.spare
        if spare is None or not spare.ready:
            return False
        try:
            startup.send_message(spare.hand, message, [conn.fileno(), *fds])
        except OSError:
            self._drop_spare()
            return False
        self.spare = None
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(spare.hand)
        spare.hand.close()
        for fd in fds:
            os.close(fd)
        self.served += 1
        self.spares += 1
        self.stirred = time.monotonic()
        self.children[spare.pid] = conn
        return True

    # the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping:
            if not self.children and time.monotonic() - self.last >= self.idle:
                return
            if (due := self._spare_due()) == 0.0:
                self._make_spare()
                due = None
            wait = 5.0 if self.children else max(0.0, min(5.0, self.last + self.idle - time.monotonic()))
            if due is not None:
                wait = min(wait, due)
            if self.callers:
                wait = min(wait, max(0.0, min(c.deadline for c in self.callers.values()) - time.monotonic()))
            for ready, _ in self.selector.select(timeout=wait):
                if ready.fileobj is self.listener:
                    self._accept()
                elif isinstance(ready.data, Caller):
                    self._read(ready.data)
                elif self.spare is not None and ready.fileobj is self.spare.hand:
                    self._spare_said()
                else:
                    with contextlib.suppress(OSError):
                        while os.read(self.wake_r, 512):
                            pass
            self._expire()
            self._reap()

    def _accept(self) -> None:
        """Take a connection, and read its request as it comes (``_read``): nothing waits for it here."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            conn.setblocking(False)
            if not startup.same_user(conn):
                conn.close()
                return
        except OSError:
            conn.close()
            return
        caller = Caller(conn, startup.Inbox(), time.monotonic() + REQUEST_TIMEOUT, process_context.boottime())
        self.callers[conn.fileno()] = caller
        self.selector.register(conn, selectors.EVENT_READ, caller)

    def _read(self, caller: Caller) -> None:
        """Read what ``caller`` has sent; once its request is whole, answer it."""
        try:
            if not caller.inbox.read_from(caller.conn, want_fds=4):  # the streams, then the proof
                raise EOFError
            taken = caller.inbox.take()
        except BlockingIOError:
            return
        except (OSError, EOFError, ValueError):
            self._forget(caller)
            caller.close()
            return
        if taken is None:
            return
        self._forget(caller)
        message, fds = taken
        try:
            caller.conn.settimeout(REQUEST_TIMEOUT)  # each send to it may take as long (and a child shares the mode)
        except OSError:
            for fd in fds:
                os.close(fd)
            caller.close()
            return
        self._answer(caller, message, fds)

    def _forget(self, caller: Caller) -> None:
        self.callers.pop(caller.conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(caller.conn)

    def _expire(self) -> None:
        """Close each connection whose request has not all come in ``REQUEST_TIMEOUT``."""
        now = time.monotonic()
        for caller in [c for c in self.callers.values() if c.deadline <= now]:
            self._forget(caller)
            caller.close()

    def _answer(self, caller: Caller, message: dict[str, Any], fds: list[int]) -> None:
        conn, op = caller.conn, message.get("op")
        if op == "run" and len(fds) in (3, 4) and _valid(message):
            fds, proof = fds[:3], fds[3:]  # the client's streams; the proof it may look at this process, if any
            try:
                differs = self._differs(caller, message, proof[0] if proof else None)
            finally:
                for fd in proof:
                    os.close(fd)
            if not differs:
                self.last = time.monotonic()
                self._fork(conn, fds, message)
                return
            # Not run here: the client runs it in its own process. Nor is it activity: a server none can use exits
            # when idle.
            self.refused += 1
            self.last_refused = differs
            answer = {
                "error": f"the caller's process context is not the server's: {', '.join(differs)}",
                "refused": "context",
                "differs": differs,
            }
        else:
            self.last = time.monotonic()
            answer = None
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            if answer is not None:
                startup.send_message(conn, answer)
            elif op == "status":
                startup.send_message(conn, self.status())
            elif op == "stop":
                self.stopping = True
                startup.send_message(conn, {"stopping": True, "pid": os.getpid()})
            else:
                startup.send_message(conn, {"error": f"not a request this server answers: {str(op)[:40]!r}"})
        conn.close()

    def _differs(self, caller: Caller, message: dict[str, Any], proof: int | None) -> list[str]:
        """What differs between the context of the process that sent ``message`` (with ``proof``, the descriptor
        ``startup.proof`` passed, if any) and this server's (its children's): nothing, or the names that differ
        (``process_context``), or why it could not be read."""
        if self.context is None:
            return ["the server's own context (unread)"]
        try:
            theirs = process_context.read_peer(caller.conn, caller.accepted)
        except process_context.Unreadable as exc:
            return [f"the caller's (unread: {exc.reason})"]
        except OSError as exc:
            return [f"the caller's (unread: {exc.strerror})"]
        sees = process_context.proves_access(proof, self.proof)
        theirs = process_context.with_report(theirs, message.get("own"), sees_server=sees)
        return process_context.differences(self.context, theirs)

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "key": self.key,
            "socket": self.path,
            "started": self.started,
            "served": self.served,
            "running": len(self.children),
            "idle_exit_s": self.idle,
            "rss_kib": _rss_kib(),
            "spare": {"pid": self.spare.pid, "ready": self.spare.ready, "rss_kib": _rss_kib(self.spare.pid)}
            if self.spare is not None
            else None,
            "served_by_spare": self.spares,
            "refused": self.refused,
            "last_refused": self.last_refused,
            "not_preloaded": self.skipped,
        }

    def _fork(self, conn: socket.socket, fds: list[int], message: dict[str, Any]) -> None:
        if self._hand_to_spare(conn, fds, message):
            return
        try:
            pid = os.fork()
        except OSError as exc:  # no process to be had: the client runs the command itself
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                startup.send_message(conn, {"error": f"cannot fork: {exc.strerror}"})
            conn.close()
            return
        if pid == 0:
            _child(self, conn, fds, message)  # never returns
        # From here the connection is the child's to write (its process id first, its status last): the server
        # writes only once the child is gone. Nor does it change the socket's mode, which the two share.
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does
        self.served += 1
        self.stirred = time.monotonic()
        self.children[pid] = conn

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spare is not None and pid == self.spare.pid:
                self._lost_spare()  # it ended before it was handed anything
                continue
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.stirred = time.monotonic()
            # A child that exited said its status itself (the client takes the first it reads); one killed could not.
            with contextlib.suppress(OSError):
                code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
                startup.send_message(conn, {"exit": code})
            conn.close()
            self.last = time.monotonic()


def _valid(message: dict[str, Any]) -> bool:
    argv, env, stdio = message.get("argv"), message.get("env"), message.get("stdio")
    return (
        isinstance(argv, list)
        and all(isinstance(a, str) for a in argv)
        and isinstance(message.get("cwd"), str)
        and isinstance(message.get("argv0"), str)
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        and isinstance(message.get("umask"), int)
        and isinstance(stdio, list)
        and len(stdio) == 3
    )


def _rss_kib(pid: int | None = None) -> int:
    try:
        with open(f"/proc/{pid or 'self'}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


# the child ------------------------------------------------------------------------------------


def _stream(fd: int, spec: Any) -> io.TextIOWrapper:
    """A text stream over ``fd`` as Python's own would be (stdout line-buffered at a terminal, stderr always)."""
    encoding, errors = [*spec, None, None][:2] if isinstance(spec, list) else (None, None)
    encoding = encoding if isinstance(encoding, str) else "utf-8"
    errors = errors if isinstance(errors, str) else "strict"
    if fd == 0:
        reader = io.BufferedReader(io.FileIO(0, "r", closefd=False))
        return io.TextIOWrapper(reader, encoding=encoding, errors=errors, newline="\n")
    buffered = io.BufferedWriter(io.FileIO(fd, "w", closefd=False))
    line = fd == 2 or os.isatty(fd)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # the client's (set before the streams are made)
    return io.TextIOWrapper(
        buffered, encoding=encoding, errors=errors, newline="\n", line_buffering=line, write_through=unbuffered
    )


def _leave_server(server: Server) -> None:
    """What a child does first, whatever it will run: a process group of its own (the client signals the group,
    as a terminal would), its name, Python's default signal handling, and none of the server's descriptors."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write("checkfu")  # what ps and top name it (its command line stays the server's)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server.selector.close()
    if server.listener is not None:
        server.listener.close()
    for other in server.children.values():
        other.close()
    for caller in server.callers.values():
        caller.close()  # this process's copies: another client's connection ends when the server closes it
    if server.spare is not None:
        server.spare.hand.close()
    os.close(server.wake_r)
    os.close(server.wake_w)
    if server.lock is not None:
        server.lock.close()
    if server.proof is not None:
        os.close(server.proof)  # no process but the server holds it: a command's child is no proof of anything


def _child(server: Server, conn: socket.socket, fds: list[int], message: dict[str, Any]) -> NoReturn:
    """A child forked for the command that just came (no spare was ready)."""
    try:
        _leave_server(server)
    except BaseException:  # nothing of the server's may run on in a child
        _exit(conn, startup.NO_STATUS)
    _command(conn, fds, message)


def _spare(server: Server, hand: socket.socket) -> NoReturn:
    """A child made ahead of the next command: it leaves the server, copies the memory it shares with it
    (``_prefault``), says it is ready, and waits on ``hand`` for the server to hand it a command (the client's
    connection and three streams, and its request). The server closing ``hand`` first ends it."""
    # Any way out before the command runs is NO_STATUS: a spare handed a command that cannot run it must never be
    # taken for one that ran it and succeeded (the server reports a child's exit status to its client).
    try:
        _leave_server(server)
        _prefault()
        hand.sendall(b"r")
        message, fds = startup.recv_message(hand, want_fds=4)
    except BaseException:  # the server stopped or went away (no one is told), or what came was no command
        os._exit(startup.NO_STATUS)
    hand.close()
    if len(fds) != 4:
        os._exit(startup.NO_STATUS)
    os.set_inheritable(fds[0], False)  # as the server's accepted socket was: no process the command starts has it
    conn = socket.socket(fileno=fds[0])
    conn.settimeout(REQUEST_TIMEOUT)  # the server's mode for it, which the two share
    _command(conn, fds[1:], message)


MADV_POPULATE_WRITE = 23
"""``madvise``'s advice to fault in a range's pages writable now (Linux 5.14): a page a child shares with the server
is copied then, as its first write would copy it."""
PAGE = os.sysconf("SC_PAGE_SIZE")
PRESENT, EXCLUSIVE = 1 << 63, 1 << 56
"""``/proc/self/pagemap`` flags: the page is in memory; it is mapped by this process alone."""


def _prefault() -> int:
    """Copy now the private writable pages this process still shares with the server; the bytes copied.

    A forked child pays for each page of the server's memory it writes to (a copy-on-write fault), and a
    command writes to thousands (every object it uses has its reference count changed): measured, a warm
    ``checkfu run`` took about 6,800 of them, and 127 ms of processor time against 107 ms in a spare. A spare takes
    those faults while it waits, so the command it is handed runs at the speed of a process of its own. Only pages
    present and shared are copied: none is allocated that the server never touched. Without
    ``MADV_POPULATE_WRITE`` (a kernel before 5.14) nothing is copied ahead, and the command pays as a forked child
    does."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        maps = Path("/proc/self/maps").read_text().splitlines()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, AttributeError):
        return 0
    copied = 0
    try:
        for line in maps:
            fields = line.split()
            perms, name = fields[1], (fields[5] if len(fields) > 5 else "")
            if not perms.startswith("rw") or perms[3] != "p" or (name.startswith("[") and name != "[heap]"):
                continue  # not private and writable, or the stack and the kernel's pages
            first, end = (int(x, 16) // PAGE for x in fields[0].split("-"))
            flags = memoryview(os.pread(pagemap, (end - first) * 8, first * 8)).cast("Q")
            run = None
            for i in range(len(flags) + 1):
                shared = i < len(flags) and flags[i] & PRESENT and not flags[i] & EXCLUSIVE
                if shared and run is None:
                    run = i
                elif not shared and run is not None:
                    if madvise((first + run) * PAGE, (i - run) * PAGE, MADV_POPULATE_WRITE) != 0:
                        return copied  # not supported here, or no memory for it: the command pays as it would
                    copied += (i - run) * PAGE
                    run = None
    except (OSError, ValueError):
        pass
    finally:
        os.close(pagemap)
    return copied


def _command(conn: socket.socket, fds: list[int], message: dict[str, Any]) -> NoReturn:
    """Run the client's command in this process (a child that has left the server) and report its status."""
    code = startup.NO_STATUS
    done = threading.Event()
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        # The connection keeps the server's timeout (its mode is shared with the server's copy): each send and
        # the watch below wait on it with poll, whatever the mode.
        startup.send_message(conn, {"pid": os.getpid()})
        os.environ.clear()
        os.environ.update(message["env"])
        sys.stdin, sys.stdout, sys.stderr = (_stream(i, message["stdio"][i]) for i in range(3))
        for name in ("stdin", "stdout", "stderr"):
            setattr(sys, f"__{name}__", getattr(sys, name))
        time.tzset()
        with contextlib.suppress(locale.Error):
            locale.setlocale(locale.LC_CTYPE, "")
        os.umask(message["umask"] & 0o777)
        consoles.refresh()
        rich._console = None  # rich's global console too, made when first asked for
        sys.argv = [message["argv0"], *message["argv"]]
        # As a console script's: click names the program after ``sys.argv[0]`` only when ``__main__`` is no package's.
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            os.chdir(message["cwd"])
        except OSError as exc:
            print(f"checkfu: the working directory {message['cwd']!r} is gone ({exc.strerror})", file=sys.stderr)
            code = 1
        else:
            threading.Thread(target=_watch_client, args=(conn, done), daemon=True).start()
            from checkfu.cli import state  # noqa: PLC0415 - loaded already (``preload``)

            state.AFTER_REPLY = []
            code = _run()
    except BaseException:  # nothing of the server's may run on in a child
        code = startup.NO_STATUS
    finally:
        done.set()
        with contextlib.suppress(BaseException):
            # As an interpreter's exit does: threads the command left running finish first (the Docker tier's
            # removals in the background, thread pools' work), then the exit functions run.
            threading._shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
    _exit(conn, code)


def _exit(conn: socket.socket, code: int) -> NoReturn:
    _let_go_of_streams()
    with contextlib.suppress(BaseException):
        startup.send_message(conn, {"exit": code})
    _after_reply()
    os._exit(code)


def _after_reply() -> None:
    """What the command left until its status was told (``checkfu.cli.state.AFTER_REPLY``, a journal's close):
    each done now, on its own; nothing of it can change the status, which the client already has."""
    state = sys.modules.get("checkfu.cli.state")
    for job in getattr(state, "AFTER_REPLY", None) or ():
        with contextlib.suppress(BaseException):
            job()


def _let_go_of_streams() -> None:
    """Point descriptors 0, 1 and 2 at ``/dev/null``, so that the client's streams end with its command rather
    than with this process: a caller reading the client's output through a pipe sees it end as soon as the client
    exits, not after the kernel has taken down this process's copy of the server's memory (several milliseconds
    for tens of megabytes)."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.dup2(null, fd)
    os.close(null)


def _run() -> int:
    from checkfu.cli import run_here  # noqa: PLC0415

    try:
        run_here(warm=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception:  # what run_here lets through (CHECKFU_DEBUG=1): told as Python would tell it
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _watch_client(conn: socket.socket, done: threading.Event) -> None:
    """SIGTERM to this process when its client goes away while the command runs."""
    while True:
        try:
            if not conn.recv(4096):
                break  # the client closed its end
        except TimeoutError:
            continue  # nothing from the client (it sends nothing more): still there
        except OSError:
            break
    if not done.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checkfu.cli.startup_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="the directory of this user's servers")
    parser.add_argument("--key", required=True, help="the version of the code (startup.code_key) it serves")
    parser.add_argument("--idle", type=float, default=startup.IDLE_DEFAULT, help="seconds idle before it exits")
    args = parser.parse_args(argv)
    if (problem := startup.dir_problem(args.dir, create=True)) is not None:
        print(f"checkfu server: {problem}", file=sys.stderr)
        return 1
    if startup.code_key() != args.key:  # its module path, environment or context is not the client's
        print(f"checkfu server: this process's code is not {args.key}; not serving it", file=sys.stderr)
        return 1
    server = Server(args.dir, args.key, max(1.0, args.idle), spare=startup.spare_wanted())
    if not server.claim():
        return 0  # one is already serving this code
    try:
        server.skipped = preload()
        if threading.active_count() != 1:  # a fork must not copy a thread's half-held locks
            print("checkfu server: an import started a thread; not serving", file=sys.stderr)
            return 1
        gc.collect()
        gc.freeze()  # every child shares these objects' pages until it writes to them
        server.listen()
        server.run()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
