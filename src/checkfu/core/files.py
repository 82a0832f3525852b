"""Reading a JSON or TOML document from a file, with the clean refusals a user expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from checkfu.contract.codec import decode_value, strict_json
from checkfu.contract.model import Model
from checkfu.core.documents import (
    MAX_DOCUMENT_FILE_BYTES,
    DocumentError,
    check_nesting,
    is_toml,
    parse_toml,
    read_bounded,
)

M = TypeVar("M", bound=Model)

MAX_FILE_BYTES = MAX_DOCUMENT_FILE_BYTES


def read_document(model: type[M], path: Path) -> Any:
    """The parsed document at ``path`` (TOML when it ends in ``.toml``, else JSON), not yet decoded.

    Only a regular file is read (a FIFO or a device is refused at once), at most ``MAX_FILE_BYTES``,
    nested at most ``MAX_NESTING`` deep: the same bounds for TOML and JSON.

    Raises:
        SandboxError: ``model.decode_error`` naming the file: unreadable, not a regular file, empty,
            oversized, malformed or nested too deeply.
    """
    try:
        raw = read_bounded(path, limit=MAX_FILE_BYTES)
    except DocumentError as exc:
        raise model.decode_error(str(exc)) from None
    return parse_document(model, raw, path)


def parse_document(model: type[M], raw: bytes, path: Path) -> Any:
    """The bytes of a document read from ``path`` parsed as ``read_document`` parses them, not yet decoded.

    Raises:
        SandboxError: ``model.decode_error`` naming the file: empty, oversized, malformed or nested too deeply.
    """
    try:
        if len(raw) > MAX_FILE_BYTES:
            raise DocumentError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        if not raw.strip():
            raise DocumentError(f"{path}: the file is empty")
        if is_toml(path, raw):
            return parse_toml(raw, path)
        try:
            value = strict_json(raw.decode("utf-8"))  # bytes would let json guess UTF-16 or UTF-32
        except UnicodeDecodeError:
            raise DocumentError(f"{path}: not a valid JSON document: not UTF-8") from None
        except ValueError as exc:
            raise DocumentError(f"{path}: not a valid JSON document: {str(exc).splitlines()[0][:200]}") from None
        check_nesting(value, path)
        return value
    except DocumentError as exc:
        raise model.decode_error(str(exc)) from None


def decode_document(model: type[M], raw: bytes, path: Path) -> M:
    """Decode the bytes of a document read from ``path`` into ``model``, as ``load`` does.

    Raises:
        SandboxError: as ``load``.
    """
    return decode_value(model, parse_document(model, raw, path))


def load(model: type[M], path: Path) -> M:
    """Decode ``path`` (TOML when it ends in ``.toml``, else JSON) into ``model``.

    Raises:
        SandboxError: ``model.decode_error`` for an unreadable, empty, oversized, deep or
            malformed file, naming the file; the decoder's error for a bad document.
    """
    return decode_value(model, read_document(model, path))


def dump(model: Model) -> object:
    """A model as a JSON value with every default filled in."""
    value: object = json.loads(model.model_dump_json())
    return value
