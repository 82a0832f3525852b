"""Files a person names on the command line: ``-`` is stdout wherever a command writes one, and stdin wherever it
reads one (``checkfu.core.documents.read_bounded``, the one reader of named documents).

Every option that writes a file (``--json FILE``, ``--junit``, ``--html``, ``--out``, ``profile init FILE``) goes
through ``write_named``, so none of them makes a file called ``-``. An option that names a directory, or a pair of
files (``kit export DIR``, ``--capture-dir``, ``keys generate --out``), refuses ``-`` by name (``refuse_dash``)
instead of making a directory or files called ``-``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

DASH = "-"
"""The name that means stdout (writing) or stdin (reading)."""


def is_dash(path: Path | str | None) -> bool:
    """Whether ``path`` is ``-``: stdout or stdin, never a file of that name (a full path names one)."""
    return path is not None and str(path) == DASH


def shown(path: Path | str) -> str:
    """How a named file is called in what a command says: ``-`` is ``stdin`` (or ``stdout``, to a writer)."""
    return "stdin" if is_dash(path) else str(path)


def write_named(path: Path, data: str | bytes, *, private: bool = False) -> None:
    """Write ``data`` to the file ``path`` (made or truncated), or to stdout when it is ``-``.

    ``private``: a file this makes is ``0600``, the user's alone (one that exists keeps its mode).

    Raises:
        OSError: the file cannot be written (stdout: the pipe closed).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if is_dash(path):
        sys.stdout.flush()  # what was printed before goes first
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600 if private else 0o666)
    with os.fdopen(fd, "wb") as out:
        out.write(raw)


def refuse_dash(path: Path | str | None, option: str, why: str) -> None:
    """Refuse ``-`` for an option that names no single file (exit 2, the option named).

    Raises:
        typer.BadParameter: ``path`` is ``-``.
    """
    if is_dash(path):
        raise typer.BadParameter(
            f"- means stdout or stdin, but {why}; name a path (a file called - by its full path)", param_hint=option
        )
