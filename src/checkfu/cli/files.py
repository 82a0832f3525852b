"""Reading a JSON or TOML document from a file, with the clean refusals a user expects."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TypeVar

from checkfu.contract.codec import decode, decode_value
from checkfu.contract.model import Model

M = TypeVar("M", bound=Model)

MAX_FILE_BYTES = 16 * 1024 * 1024


def load(model: type[M], path: Path) -> M:
    """Decode ``path`` (TOML when it ends in ``.toml``, else JSON) into ``model``.

    Raises:
        SandboxError: ``model.decode_error`` for an unreadable, empty, oversized or
            malformed file, naming the file; the decoder's error for a bad document.
    """
    refuse = model.decode_error
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise refuse(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise refuse(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    if not raw.strip():
        raise refuse(f"{path}: the file is empty")
    if path.suffix.lower() == ".toml":
        try:
            value = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise refuse(f"{path}: not UTF-8") from None
        except tomllib.TOMLDecodeError as exc:
            raise refuse(f"{path}: not valid TOML: {exc}") from None
        except RecursionError:
            raise refuse(f"{path}: not valid TOML: nested too deeply") from None
        return decode_value(model, value)
    return decode(model, raw)


def dump(model: Model) -> object:
    """A model as a JSON value with every default filled in."""
    value: object = json.loads(model.model_dump_json())
    return value
