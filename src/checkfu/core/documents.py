"""Reading a document a person named (a profile, an envelope, an adapters file, evidence, a key): bounded.

One reader for every such file, so none of them can hang or exhaust memory: only a regular file is
read (a FIFO, a device such as ``/dev/zero``, a socket or a directory is refused by what it is, without
blocking on it), at most ``limit`` bytes, and a document nested too deeply is refused as such. TOML and
JSON are parsed here with the same bounds.
"""

from __future__ import annotations

import os
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

MAX_DOCUMENT_FILE_BYTES = 16 * 1024 * 1024
"""No document a person names may be larger than this."""

MAX_NESTING = 64
"""No document a person names may nest arrays and tables deeper than this (no contract message comes close)."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class DocumentError(ValueError):
    """A document that cannot be read or parsed; the message names the file and what is wrong."""


STDIN = "-"
"""The name a person gives for stdin: wherever a document is read, ``-`` reads stdin to its end (a full path names a
file called ``-``), as every command that writes a named file writes ``-`` to stdout."""


def read_bounded(path: Path, *, limit: int = MAX_DOCUMENT_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (a symlink is followed to what it names), or of stdin to its end
    when ``path`` is ``-``, bounded alike.

    Raises:
        DocumentError: it cannot be opened, is not a regular file, or holds more than ``limit`` bytes.
    """
    if str(path) == STDIN:
        return _read_stdin(limit)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise DocumentError(f"cannot read {path}: it is {kind}, not a regular file")
        raw = _read_to(fd, limit)
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise DocumentError(f"{path}: larger than {limit} bytes")
    return raw


def _read_to(fd: int, limit: int) -> bytes:
    """``fd`` to its end, or to one byte past ``limit`` (so that the caller can tell it is larger)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def is_toml(path: Path, raw: bytes) -> bool:
    """Whether the document read from ``path`` is TOML: its name ends in ``.toml``; stdin (``-``, which has no name)
    is TOML unless it opens as JSON does (``{`` or ``[``)."""
    if str(path) == STDIN:
        return not raw.lstrip().startswith((b"{", b"["))
    return path.suffix.lower() == ".toml"


def _read_stdin(limit: int) -> bytes:
    """Stdin to its end, at most ``limit`` bytes (a pipe, a file or a terminal alike).

    Raises:
        DocumentError: stdin is closed, cannot be read, or holds more than ``limit`` bytes.
    """
    try:
        raw = _read_to(sys.stdin.fileno() if sys.stdin is not None else 0, limit)
    except (OSError, ValueError) as exc:
        raise DocumentError(f"cannot read - (stdin): {getattr(exc, 'strerror', None) or exc}") from None
    if len(raw) > limit:
        raise DocumentError(f"- (stdin): larger than {limit} bytes")
    return raw


def parse_toml(raw: bytes, path: Path | str) -> dict[str, Any]:
    """A TOML document, parsed within the same bounds as a JSON one.

    Raises:
        DocumentError: not UTF-8, not valid TOML (or a value it cannot convert), or nested deeper than
            ``MAX_NESTING``.
    """
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise DocumentError(f"{path}: not UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise DocumentError(f"{path}: not valid TOML: {exc}") from None
    except ValueError as exc:  # a value tomllib cannot convert: an integer past Python's 4300-digit limit
        raise DocumentError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise DocumentError(f"{path}: not valid TOML: nested too deeply") from None
    check_nesting(doc, path)
    return doc


def check_nesting(value: object, path: Path | str, *, limit: int = MAX_NESTING) -> None:
    """Raises DocumentError: ``value`` nests lists and dicts deeper than ``limit`` (walked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            raise DocumentError(f"{path}: nested more than {limit} deep")
        stack.extend((child, depth + 1) for child in children)
