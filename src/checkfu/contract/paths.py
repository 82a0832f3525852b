"""Path admission: the one pure rule every path on the seam passes.

A sandbox path is absolute, normalized (no ``.`` or ``..`` segment, no empty
segment, no trailing slash except the root itself), free of NUL, valid UTF-8,
at most 4096 bytes, and inside an admitted root. The runner applies it to every
path it sends and every path a provider returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator, Strict
from pydantic_core import PydanticCustomError

from checkfu.contract.errors import SandboxPathRejected

MAX_PATH_BYTES = 4096


def path_problem(path: object, *, relative: bool = False) -> str | None:
    """Why ``path`` is not an admissible sandbox path, or ``None`` when it is."""
    if not isinstance(path, str):
        return "is not a string"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(encoded) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    if "\x00" in path:
        return "contains NUL"
    if relative:
        if not path or path.startswith("/"):
            return "must be a non-empty relative path"
        body = path
    else:
        if not path.startswith("/"):
            return "must be absolute"
        if path == "/":
            return None
        body = path[1:]
    for segment in body.split("/"):
        if segment == "":
            return "has an empty segment"
        if segment in (".", ".."):
            return f"has a {segment!r} segment"
    return None


def is_within(path: str, root: str) -> bool:
    """Whether admitted ``path`` is ``root`` or below it (both already admitted)."""
    return root == "/" or path == root or path.startswith(root + "/")


def _shown(path: object) -> str:
    text = repr(path)
    return text if len(text) <= 120 else text[:117] + "..."


def admit_path(path: object, *, roots: Iterable[str] = ("/",), field: str = "path") -> str:
    """Return ``path`` if it is admissible and inside one of ``roots``.

    Raises:
        SandboxPathRejected: naming ``field`` and the path, for the first rule it breaks.
    """
    problem = path_problem(path)
    if problem is not None:
        raise SandboxPathRejected(f"{field}: path {_shown(path)} {problem}", field=field)
    assert isinstance(path, str)
    root_list = tuple(roots)
    if not any(is_within(path, root) for root in root_list):
        raise SandboxPathRejected(
            f"{field}: path {_shown(path)} is outside the admitted roots {', '.join(root_list) or '(none)'}",
            field=field,
        )
    return path


def _absolute(value: str) -> str:
    problem = path_problem(value)
    if problem is not None:
        raise PydanticCustomError("sandbox_path", "path {path} " + problem, {"path": _shown(value)})
    return value


def _relative(value: str) -> str:
    problem = path_problem(value, relative=True)
    if problem is not None:
        raise PydanticCustomError("sandbox_path", "path {path} " + problem, {"path": _shown(value)})
    return value


SandboxPath = Annotated[str, Strict(), AfterValidator(_absolute)]
"""An absolute, admissible sandbox path; a violation decodes to ``SandboxPathRejected``."""

RelativePath = Annotated[str, Strict(), AfterValidator(_relative)]
"""A normalized relative path (inside a mount); a violation decodes to ``SandboxPathRejected``."""
