"""What checkfu keeps for the user who ran it alone: the state directory, and how each file and directory
it keeps is made.

The journal holds every Run's argv and its kept output, a capture holds files read out of a sandbox, a pool
file names sandboxes: none of it is another local user's business. So every directory made here has mode
``0700`` and every file ``0600`` from the moment it exists (the mode is given to ``mkdir`` and ``open``,
never set afterwards, so there is no moment in which another user could open it; a umask can only narrow
it), and no write follows a symbolic link at its last component. A directory or file that existed already
keeps its mode: it is not checkfu's to change, with one exception, the state directory itself
(``state_dir``), which an older checkfu made ``0755``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o700
FILE_MODE = 0o600
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class StateDirRefused(PermissionError):
    """The state directory belongs to another user; the message names it and says what to do."""


def state_dir(path: Path | None = None) -> Path:
    """``path``, else ``$XDG_STATE_HOME/checkfu`` (else ``~/.local/state/checkfu``), made ``0700`` with each
    parent it lacks.

    When it exists with any permission for group or others and belongs to this user (a state directory an
    older checkfu made ``0755``), those permissions are taken away: what it holds was readable by every
    local user. One that belongs to another user is refused: its owner could read and change every Run and
    credential kept in it.

    Raises:
        StateDirRefused: it belongs to another user (the message names it and what to do).
        OSError: it cannot be made (a parent is not a directory, or cannot be written).
    """
    if path is None:
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        path = Path(base) / "checkfu"
    make_dirs(path)
    st = os.lstat(path)
    if st.st_uid != os.geteuid():
        raise StateDirRefused(
            f"the state directory {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): its owner "
            "could read and change what checkfu keeps there; remove it, or set XDG_STATE_HOME to a directory of "
            "your own"
        )
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & DIR_MODE)
    return path


def make_dirs(path: Path) -> None:
    """Make directory ``path`` and each parent it lacks, each ``0700``; one that exists keeps its mode.

    Raises:
        FileExistsError: ``path`` or a parent exists and is not a directory.
        OSError: a directory cannot be made.
    """
    try:
        os.mkdir(path, DIR_MODE)
    except FileNotFoundError:
        if path.parent == path:
            raise
        make_dirs(path.parent)
        make_dirs(path)
    except FileExistsError:
        if not path.is_dir():
            raise


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``: a new file is made ``0600``; an existing one is truncated and keeps its mode.

    Raises:
        OSError: it cannot be written; ``ELOOP`` when ``path`` is a symbolic link (never followed).
    """
    fd = os.open(path, _WRITE | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with a ``0600`` file holding ``data``, at once: a reader sees the old file or the new.

    Raises:
        OSError: it cannot be written (what was at ``path`` is then unchanged).
    """
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        write_file(part, data)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def create_file(path: Path, data: bytes) -> None:
    """Make ``path`` as a new ``0600`` file holding ``data``; nothing that exists there (a file, a directory, a
    symbolic link, dangling or not) is ever opened, replaced or followed. A file left partly written (a write
    that failed) is removed.

    Raises:
        FileExistsError: something exists at ``path``.
        OSError: it cannot be made or written.
    """
    fd = os.open(path, _WRITE | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def open_append(path: Path) -> BinaryIO:
    """``path`` open for appending (a lock file), made ``0600`` when new.

    Raises:
        OSError: it cannot be opened; ``ELOOP`` when ``path`` is a symbolic link (never followed).
    """
    return os.fdopen(os.open(path, _WRITE | os.O_APPEND, FILE_MODE), "ab")
