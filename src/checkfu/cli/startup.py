"""The start-up server's client side: hand this command to a warm ``checkfu`` process, or say there is none.

A ``checkfu`` command spends most of its wall time importing (SQLAlchemy, docker-py, pydantic, typer, rich and
checkfu's own modules) before it does any work. The start-up server (``checkfu.cli.startup_server``) is a process
that has already imported them and forks one child per command: the child takes this process's standard streams
(passed as file descriptors, so a terminal stays a terminal), its arguments, working directory, environment and
umask, runs the command exactly as ``checkfu`` would, and exits with its status, which this process then exits
with. The server holds no state of its own (no journal, no lease, no sandbox): everything a command does happens
in its child, which starts from the server's freshly imported modules every time.

This module is imported by every command that does not answer at once (``checkfu --version`` does), so it uses
only modules Python has already loaded at start-up, or that cost next to nothing.

- Where: a socket per version of the code in ``$XDG_RUNTIME_DIR/checkfu-server`` (else
  ``/tmp/checkfu-server-<uid>``), a directory of this user's alone (mode 0700); one that is not is never used.
  The version (``code_key``) covers the interpreter, every checkfu source file's size and time, the directories
  packages install into, the ``PYTHON*`` environment and the few variables libraries read at import
  (``IMPORT_TIME_ENV``), so a changed checkout or an upgrade never runs stale
  code: it finds no server of its own and starts afresh. A server left without clients exits after its idle time.
- When: ``CHECKFU_SERVER`` is ``auto`` (the default: use a running server; start one in the background after a
  command run at a terminal), ``on`` (also start one from scripts) or ``off`` (never use or start one).
- Who: both ends are this user's (``SO_PEERCRED``). A child runs a command in the server's process context, so the
  server runs only a command whose process has the same (``checkfu.cli.process_context``: credentials,
  capabilities, namespaces, limits, priority, confinement; that this process may look at the server, which a
  Landlock domain forbids and ``/proc`` does not show, it proves: ``proof``): any other, it refuses, and the
  command runs here. The commonest differences (groups, some limits, control group, mount namespace) are also
  part of the key, so a process with its own has a server of its own. A background job of a terminal always runs
  here.
  ``CHECKFU_SERVER_DEBUG=1`` says on stderr why a command ran here.
- Signals: a terminal's (SIGINT, SIGQUIT, SIGWINCH) go to the command's process group, a ``kill`` of this
  process (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) to the command alone; Ctrl-Z stops both. If this process goes
  away, the command is sent SIGTERM.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    import socket
    import subprocess
    from collections.abc import Iterator
    from typing import Any
else:  # the C modules: ``signal`` and ``socket`` import enum (and more), which costs more than all of this module
    import _signal as signal
    import _socket as socket

ENV = "CHECKFU_SERVER"
IDLE_ENV = "CHECKFU_SERVER_IDLE"
IDLE_DEFAULT = 600.0
"""Seconds a server with no command running waits for the next before it exits."""
DEBUG_ENV = "CHECKFU_SERVER_DEBUG"
"""Set (not ``0``): a command that runs in its own process rather than in a server's child says why, on stderr."""
SPARE_ENV = "CHECKFU_SERVER_SPARE"
"""``0``/``off``/``no``/``false``: the server keeps no spare child ready (it forks each command as it comes, and
saves the spare's memory); anything else, or unset: it keeps one."""
MODES = ("auto", "on", "off")
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGWINCH", "SIGUSR1", "SIGUSR2")
NO_STATUS = 70
"""This process's status when the command's process ended without one reaching it (its server was stopped and
the command was killed by a signal)."""
IMPORT_TIME_ENV = (
    "FORCE_COLOR",
    "PY_COLORS",
    "GITHUB_ACTIONS",
    "TERMINAL_WIDTH",
    "TYPER_USE_RICH",
    "TYPER_STANDARD_TRACEBACK",
    "_TYPER_STANDARD_TRACEBACK",
    "_TYPER_FORCE_DISABLE_TERMINAL",
)
"""Variables a library reads once, when imported (typer's help colours and width): part of the key, so a command
with other values than the server's runs in a server started with them."""
HEADER = struct.Struct(">I")
MAX_REQUEST = 16 << 20
UCRED = struct.Struct("3i")
"""``struct ucred``: pid, uid, gid."""


def mode(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """``CHECKFU_SERVER``: ``auto``, ``on`` or ``off`` (anything else reads as ``auto``; ``0``/``no``/``false``
    as ``off``, ``1``/``yes``/``true`` as ``on``)."""
    value = (environ if environ is not None else os.environ).get(ENV, "auto").strip().lower()
    if value in ("0", "no", "false"):
        return "off"
    if value in ("1", "yes", "true"):
        return "on"
    return value if value in MODES else "auto"


def spare_wanted(environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """Whether a server started with ``environ`` keeps a spare child ready (``CHECKFU_SERVER_SPARE``)."""
    value = (environ if environ is not None else os.environ).get(SPARE_ENV, "").strip().lower()
    return value not in ("0", "off", "no", "false")


def runtime_dir(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """Where this user's servers keep their sockets."""
    env = environ if environ is not None else os.environ
    base = env.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isabs(base):
        return os.path.join(base, "checkfu-server")
    return f"/tmp/checkfu-server-{os.getuid()}"


def private_dir(path: str, create: bool = False) -> bool:
    """Whether ``path`` is a directory of this user's that no one else can enter (made so when ``create``)."""
    return dir_problem(path, create) is None


def dir_problem(path: str, create: bool = False) -> str | None:
    """What is wrong with ``path`` as this user's server directory (``private_dir``), and what to do about it, in
    a sentence that names it; ``None`` when nothing is. ``create``: make it first (mode 0700) if it is missing."""
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            return f"{path} cannot be made ({exc.strerror}); set XDG_RUNTIME_DIR to a directory of your own"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be used ({exc.strerror})"
    kind = st.st_mode & 0o170000
    if kind == 0o120000:
        return f"{path} is a symbolic link, not a directory: remove the link (rm {path}); checkfu makes the directory"
    if kind != 0o040000:
        return f"{path} is not a directory: remove it (rm {path}); checkfu makes the directory"
    if st.st_uid != os.getuid():
        import pwd  # noqa: PLC0415 - only to name who has it

        try:
            owner = f"uid {st.st_uid} ({pwd.getpwuid(st.st_uid).pw_name})"
        except KeyError:
            owner = f"uid {st.st_uid}"
        return (
            f"{path} belongs to {owner}, not to you (uid {os.getuid()}): someone else made it, and checkfu never "
            f"uses it. Have its owner or an administrator remove it (rm -r {path}), or set XDG_RUNTIME_DIR to a "
            "directory of your own"
        )
    if st.st_mode & 0o077:
        return (
            f"{path} has mode {st.st_mode & 0o7777:04o}: others may enter it, so nothing in it can be trusted and "
            f"checkfu never uses it. Remove it (rm -r {path}; a server still running from it exits when idle): "
            "checkfu makes it again, mode 0700"
        )
    return None


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_key(package: str | None = None, environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """A short name for the code a command would run: changes when any checkfu source file, the interpreter, an
    installed package set, a ``PYTHON*`` variable or one of ``IMPORT_TIME_ENV`` does."""
    env = environ if environ is not None else os.environ
    chosen = sorted(f"{k}={v}" for k, v in env.items() if k[:6] == "PYTHON" or k in IMPORT_TIME_ENV)
    parts: list[str] = [sys.executable, sys.version, *chosen, *_context()]
    for entry in sys.path:
        try:
            parts.append(f"{entry}:{os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            parts.append(entry)
    stack = [package or _package_dir()]
    while stack:
        top = stack.pop()
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name)
        except OSError:
            continue
        for item in entries:
            if item.name == "__pycache__":
                continue
            if item.is_dir(follow_symlinks=False):
                stack.append(item.path)
            elif item.name.endswith((".py", ".json", ".toml")):
                st = item.stat(follow_symlinks=False)
                parts.append(f"{item.path}:{st.st_size}:{st.st_mtime_ns}")
    return f"{zlib.crc32(chr(0).join(parts).encode('utf-8', 'surrogateescape')):08x}"


def _context() -> list[str]:
    """What a child inherits from its server rather than from its client, so a client whose differs gets a server
    of its own: group and supplementary groups, resource limits, control group, mount namespace.

    A few of the things ``checkfu.cli.process_context`` compares, not derived from its lists: those are read from
    another process's ``/proc`` with modules this one does not load, and this is read by this process of itself on
    every command's way (and six limits, not all of ``limits``, which would change which contexts share a server).
    Nor need the two agree: this only picks which server a client asks, and the server's comparison decides. A part
    here the comparison lacks splits servers needlessly; one it has that is missing here costs a refusal."""
    import resource  # noqa: PLC0415 - a small C module, needed only here

    parts = [f"gid={os.getgid()}/{os.getegid()}", f"groups={sorted(os.getgroups())}"]
    for name in ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_AS", "RLIMIT_STACK", "RLIMIT_MEMLOCK"):
        limit = getattr(resource, name, None)
        if limit is not None:
            parts.append(f"{name}={resource.getrlimit(limit)}")
    try:
        parts.append(os.readlink("/proc/self/ns/mnt"))
        with open("/proc/self/cgroup", encoding="utf-8") as cgroup:
            parts.append(cgroup.read())
    except OSError:
        parts.append("no /proc")
    return parts


def socket_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"{key}.sock")


# The wire between a client and its server: length-prefixed ``marshal``, the client's streams passed with the first.


def frame(message: dict[str, Any]) -> bytes:
    """``message`` as it goes on the wire: its length, then ``marshal``'s bytes (both ends are this user's, checked,
    running the same interpreter)."""
    data = marshal.dumps(message)
    return HEADER.pack(len(data)) + data


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """``message`` framed (``frame``), with ``fds`` passed alongside its first bytes."""
    framed = frame(message)
    if fds:
        sent = sock.sendmsg([framed], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
        framed = framed[sent:]
    if framed:
        sock.sendall(framed)


class Inbox:
    """What one stream has delivered that no message has taken yet: its bytes, and the descriptors passed with them.

    A read takes whatever the socket holds: the end of one message and the start of the next, or two whole ones (a
    child that ends at once says its process id and its status before its client reads either). Every byte read
    stays here until a message takes it, so a caller reading more than one message from a stream must read them all
    through the same inbox. Descriptors go with the next message taken (only a stream's first message carries
    any)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.fds: list[int] = []

    def feed(self, data: bytes, fds: list[int] | None = None) -> None:
        self.data += data
        self.fds.extend(fds or ())

    def read_from(self, sock: socket.socket, want_fds: int = 0) -> bool:
        """Read once from ``sock`` (as much as it holds, and up to ``want_fds`` descriptors in all: any more are
        closed); ``False`` when the peer has closed its end.

        Raises:
            OSError: the read failed (``BlockingIOError`` when a non-blocking socket has nothing yet).
        """
        size = 65536
        if len(self.data) >= HEADER.size:
            size = max(size, min(1 << 20, HEADER.size + HEADER.unpack_from(self.data)[0] - len(self.data)))
        if not want_fds:
            data = sock.recv(size)
        else:
            data, ancdata, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(want_fds * 4))
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    for fd in struct.unpack(f"{usable // 4}i", payload[:usable]):
                        if len(self.fds) < want_fds:
                            self.fds.append(fd)
                        else:
                            os.close(fd)
        self.data += data
        return bool(data)

    def take(self) -> tuple[dict[str, Any], list[int]] | None:
        """The first message, once all of it is here, with the descriptors that came so far; ``None`` until then.

        Raises:
            ValueError: what is here is no message (too long, or not ``marshal``'s encoding of a dict).
        """
        if len(self.data) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self.data)
        if size > MAX_REQUEST:
            raise ValueError(f"a message of {size} bytes")
        end = HEADER.size + size
        if len(self.data) < end:
            return None
        body = bytes(self.data[HEADER.size : end])
        del self.data[:end]
        try:
            message = marshal.loads(body)
        except (EOFError, TypeError, ValueError) as exc:
            raise ValueError("a message that does not decode") from exc
        if not isinstance(message, dict):
            raise ValueError("a message that is not an object")
        fds, self.fds = self.fds, []
        return message, fds

    def pending(self) -> bool:
        """Whether anything read has not been taken."""
        return bool(self.data or self.fds)

    def close(self) -> None:
        """Close the descriptors no message took."""
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)


def recv_message(
    sock: socket.socket, want_fds: int = 0, inbox: Inbox | None = None
) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it (up to ``want_fds``). A caller that reads more than one
    message from ``sock`` passes the same ``inbox`` each time: what was read past a message waits there for the next.

    Raises:
        EOFError: the peer closed its end before a whole message came.
        ValueError: what came is not a message.
        OSError: the socket failed, or its timeout passed.
    """
    inbox = inbox if inbox is not None else Inbox()
    try:
        while (taken := inbox.take()) is None:
            if not inbox.read_from(sock, want_fds):
                raise EOFError
    except BaseException:
        inbox.close()  # what came with a message that never came whole
        raise
    return taken


def same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of the Unix socket ``sock`` runs as this user (``SO_PEERCRED``)."""
    _, uid, _ = UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
    return bool(uid == os.getuid())


PR_GET_SECUREBITS, PR_GET_MDWE = 27, 66


def own_context() -> dict[str, Any]:
    """What the kernel shows of this process's context to this process alone, for its server to compare with its
    own (``checkfu.cli.process_context``, which reads the rest from ``/proc`` itself): its securebits and
    memory-deny-write-execute (``prctl``; a negative value is the error it gave), and its personality (which
    ``/proc`` shows others only with ptrace's access). An honest client's word, no more: whether this process may
    look at its server is not said but proved (``proof``)."""
    try:
        with open("/proc/self/personality", "rb") as f:
            personality: int | None = int(f.read(), 16)
    except (OSError, ValueError):
        personality = None
    bits: list[int] | list[None]
    try:
        bits = _prctl_get(PR_GET_SECUREBITS, PR_GET_MDWE)
    except (ImportError, AttributeError, OSError, TypeError):  # no _ctypes here: unknown, as in its server
        bits = [None, None]
    securebits, mdwe = bits
    return {"securebits": securebits, "mdwe": mdwe, "personality": personality}


PROOF_NAME = "checkfu-server-proof"
"""The name of the server's proof file (``proof``): a ``memfd``, which ``/proc/<pid>/fd`` shows as
``/memfd:NAME (deleted)``."""


def proof(sock: socket.socket) -> int | None:
    """The server's proof file (the process at the other end of ``sock``), opened again for reading through
    ``/proc/<pid>/fd/N``: passed with the request, it proves that this process may look at the server.

    Reading that link, and opening through it, take ptrace's read access to the server, which a Landlock domain
    (or an LSM) denies towards a process outside it, and ``/proc`` shows neither; the file has no other name. The
    server checks that the descriptor is its own file's (``checkfu.cli.process_context.proves_access``). ``None``:
    this process may not look at the server (or it is not in this process's pid namespace, or keeps no proof file),
    and the server will refuse the command."""
    try:
        pid = UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))[0]
        if pid <= 0:
            return None
        where = f"/proc/{pid}/fd/"
        for name in _server_fds(where):
            try:
                if os.readlink(where + name) == f"/memfd:{PROOF_NAME} (deleted)":
                    return os.open(where + name, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # closed since it was listed
    except OSError:
        pass
    return None


def _server_fds(where: str) -> Iterator[str]:
    """The server's descriptors by number: its first after the three streams, where it makes its proof file, then
    every one (listing them costs several times as much)."""
    yield "3"
    yield from sorted(os.listdir(where), key=int)


def _prctl_get(*options: int) -> list[int]:
    """``prctl(option, 0, 0, 0, 0)`` for each option: its value, or minus the error it gave. Through ``_ctypes``
    alone: ``ctypes`` would cost every command five times as much to import."""
    import _ctypes  # noqa: PLC0415 - only once a server is there to compare with

    c: Any = _ctypes  # its private names, which typeshed types for ctypes' own use

    class Int(c._SimpleCData):  # type: ignore[misc]
        _type_ = "i"

    class ULong(c._SimpleCData):  # type: ignore[misc]
        _type_ = "L"

    class Prctl(c.CFuncPtr):  # type: ignore[misc]
        _flags_ = c.FUNCFLAG_CDECL | c.FUNCFLAG_USE_ERRNO
        _restype_ = Int
        _argtypes_ = (Int, ULong, ULong, ULong, ULong)

    class Libc:
        _handle = c.dlopen(None, 2)  # RTLD_NOW: this process's own C library

    prctl = Prctl(("prctl", Libc))
    values = []
    for option in options:
        c.set_errno(0)
        value = int(prctl(option, 0, 0, 0, 0))
        values.append(value if value >= 0 else -int(c.get_errno()))
    return values


def connect(directory: str, key: str, timeout: float | None = None) -> socket.socket | None:
    """A connection to the server of ``key`` in ``directory``; ``None`` when there is none (or none safe to use)."""
    if not private_dir(directory):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout if timeout is not None else 2.0)
    try:
        sock.connect(socket_path(directory, key))
        # The server runs as this user: checked, as the directory alone only says who could have made it.
        if not same_user(sock):
            raise OSError("the server is another user's")
    except OSError:
        sock.close()
        return None
    return sock


def _stdio() -> tuple[list[int], list[list[str | None]]]:
    """This process's standard streams as descriptors to pass and how Python set up each (encoding, errors), so
    the command's streams are the same."""
    specs = [[getattr(s, "encoding", None), getattr(s, "errors", None)] for s in (sys.stdin, sys.stdout, sys.stderr)]
    return [0, 1, 2], specs


def _background() -> bool:
    """Whether this process is a background job of the terminal on its standard input."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) != os.getpgrp()
    except OSError:
        return False


def attach(argv: list[str]) -> int | str | None:
    """Run ``checkfu ARGV`` in a warm server's child and return its exit status; ``None`` when no server of this
    code took the command, and the server's reason when it refused this process's context (either way the caller
    runs it itself; after a refusal it starts no server, as one serves this code already). Once a server has the
    command, it is never run here as well."""
    for fd in (0, 1, 2):  # a closed one is /dev/null (the lowest free descriptor): never the socket made below
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    if _background():
        _why("a background job of its terminal")
        return None  # run here, where the terminal stops a background job that reads or sets it
    directory = runtime_dir()
    sock = connect(directory, code_key())
    if sock is None:
        if _debugging():
            _why(dir_problem(directory) or f"no server of this code ({code_key()}) in {directory}")
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        sock.close()
        return None  # the command says what is wrong with a working directory that is gone
    fds, specs = _stdio()
    request = {
        "op": "run",
        "argv": argv,
        "argv0": sys.argv[0],
        "cwd": cwd,
        "env": dict(os.environ),
        "umask": _umask(),
        "stdio": specs,
        "own": own_context(),
    }
    seen = proof(sock)
    if seen is not None:
        fds.append(seen)  # after the streams: the server takes the fourth descriptor for the proof
    forwarder = _Forwarder()  # from here, a signal is the command's, even before its process is known
    try:
        send_message(sock, request, fds)
    except OSError:
        sock.close()
        forwarder.restore()
        return None  # the server did not get the whole request: nothing started
    finally:
        if seen is not None:
            os.close(seen)
    sock.settimeout(None)
    inbox = Inbox()  # the child's process id and its status may come in one read
    try:
        while True:
            try:
                message, _ = recv_message(sock, inbox=inbox)
            except EOFError:
                if forwarder.pid is None:  # closed before a child said it started: nothing started
                    forwarder.restore()
                    return None
                return NO_STATUS
            except (OSError, ValueError):
                return NO_STATUS if forwarder.pid is not None else _gone(forwarder)
            if "exit" in message and isinstance(message["exit"], int):
                return int(message["exit"])
            if forwarder.pid is None and isinstance(message.get("pid"), int) and message["pid"] > 1:
                forwarder.start(int(message["pid"]))
            elif forwarder.pid is None and "error" in message:
                forwarder.restore()  # refused before anything started
                _why(f"the server refused it: {message['error']}")
                return str(message["error"]) if message.get("refused") == "context" else None
    finally:
        sock.close()


def _debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "0") not in ("", "0")


def _why(reason: str) -> None:
    """Say, when asked to (``CHECKFU_SERVER_DEBUG``), why this command runs in this process."""
    if _debugging():
        print(f"checkfu: running here, not in a start-up server: {reason}", file=sys.stderr, flush=True)


def _gone(forwarder: _Forwarder) -> int:
    forwarder.restore()
    return NO_STATUS


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


GROUP_SIGNALS = ("SIGINT", "SIGQUIT", "SIGWINCH")
"""What a terminal sends to its foreground job: forwarded to the command's process group, as the terminal would have
sent them to every process of it. The others (``kill`` of this process) go to the command's process alone."""


class _Forwarder:
    """Sends the signals this process gets on to the command; until the command's process is known (its first
    message), keeps them and sends them then. Ctrl-Z stops the command, then this process; it goes on when this
    process is continued in the foreground of its terminal (a job continued in the background stays stopped until
    it is brought to the foreground, rather than reading or setting the terminal from behind)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.saved = {getattr(signal, name): signal.signal(getattr(signal, name), self.forward) for name in FORWARDED}
        self.saved[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self.stop)
        self.saved[signal.SIGCONT] = signal.signal(signal.SIGCONT, self.cont)

    def start(self, pid: int) -> None:
        self.pid = pid
        while self.pending:
            self.forward(self.pending.pop(0), None)

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        for signum in self.pending:  # nothing started to take them: this process gets them after all
            os.kill(os.getpid(), signum)

    def forward(self, signum: int, _frame: object) -> None:
        if self.pid is None:
            self.pending.append(signum)
            return
        group = signum in {getattr(signal, name) for name in GROUP_SIGNALS} or signum in (
            signal.SIGTSTP,
            signal.SIGCONT,
        )
        try:
            if group:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)
        except OSError:
            try:  # noqa: SIM105 - contextlib costs this module's whole import again
                os.kill(self.pid, signum)
            except OSError:
                pass

    def stop(self, _signum: int, _frame: object) -> None:
        if self.pid is None:
            return
        self.forward(signal.SIGTSTP, None)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until SIGCONT (``cont`` sends it on)
        signal.signal(signal.SIGTSTP, self.stop)

    def cont(self, _signum: int, _frame: object) -> None:
        if self.pid is not None and not _background():
            self.forward(signal.SIGCONT, None)


_BOOT = (
    "import ast, sys; sys.path[:] = ast.literal_eval(sys.argv.pop(1)); "
    "from checkfu.cli.startup_server import main; sys.exit(main())"
)


def spawn(directory: str | None = None, idle: float | None = None) -> subprocess.Popen[bytes] | None:
    """Start a server for this code in the background (a session of its own, its streams on ``/dev/null``); its
    process, or ``None`` when this user's server directory is not safe to use."""
    directory = directory or runtime_dir()
    if not private_dir(directory, create=True):
        return None
    if idle is None:
        try:
            idle = float(os.environ.get(IDLE_ENV, IDLE_DEFAULT))
        except ValueError:
            idle = IDLE_DEFAULT
    # The server imports from this process's module path (so from the installation or checkout this key covers),
    # set before anything is imported; -P keeps its working directory off it. It computes the key itself and does
    # not serve one that differs from this process's.
    argv = [sys.executable, "-P", "-c", _BOOT, repr(sys.path), "--dir", directory, "--key", code_key()]
    argv += ["--idle", str(idle)]
    return detached(argv, cwd="/")


def detached(argv: list[str], cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached from this process: a session of its own (no terminal, no signals of this job), its
    streams on ``/dev/null``, none of this process's other descriptors.

    Raises:
        OSError: it could not be started.
    """
    import subprocess  # noqa: PLC0415 - only when something is started

    null = subprocess.DEVNULL
    return subprocess.Popen(argv, stdin=null, stdout=null, stderr=null, start_new_session=True, close_fds=True, cwd=cwd)
