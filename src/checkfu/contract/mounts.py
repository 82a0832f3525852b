"""Mount plans: what the runner stages into a sandbox, file by file, at each Run start."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, Strict, model_validator

from checkfu.contract.errors import SandboxError, SandboxPathRejected, SandboxProfileInvalid
from checkfu.contract.model import Bool, Model, NonNegInt, rule_error
from checkfu.contract.paths import MAX_PATH_BYTES, RelativePath, SandboxPath, is_within

# The path rule of ``checkfu.contract.paths`` as the published schema states it. A segment
# is neither empty, ``.`` nor ``..`` and holds no ``/`` or NUL; an absolute path is ``/``
# or ``/``-prefixed segments (so no trailing slash). ``maxLength`` counts characters, so
# it is a necessary bound only: the 4096 UTF-8 bytes are a rule beyond JSON Schema.
# The tests hold these patterns to ``path_problem`` exhaustively over short strings.
_SEGMENT = r"(?:[^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+)"
ABSOLUTE_PATH_PATTERN = rf"^(?:/|(?:/{_SEGMENT})+)$"
RELATIVE_PATH_PATTERN = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"
MOUNT_TARGET_PATTERN = rf"^(?:/{_SEGMENT})+$"
"""An absolute path other than ``/``: a mount may not cover the root."""

PATH_RULE = "sandbox path rule"
"""How the published schemas name the path rule: each path ``pattern`` sits beside a ``$comment`` starting so."""

AbsolutePath = Annotated[
    SandboxPath,
    Field(
        json_schema_extra={
            "$comment": f"{PATH_RULE}: an absolute path",
            "pattern": ABSOLUTE_PATH_PATTERN,
            "maxLength": MAX_PATH_BYTES,
        }
    ),
]
"""``SandboxPath`` with its rule in the schema too (the decoder's own check is unchanged)."""

MountTarget = Annotated[
    SandboxPath,
    Field(
        description="an absolute sandbox path other than /",
        json_schema_extra={
            "$comment": f"{PATH_RULE}: an absolute path other than / (a mount target)",
            "pattern": MOUNT_TARGET_PATTERN,
            "maxLength": MAX_PATH_BYTES,
        },
    ),
]

MountPath = Annotated[
    RelativePath,
    Field(
        json_schema_extra={
            "$comment": f"{PATH_RULE}: a relative path below a mount target",
            "pattern": RELATIVE_PATH_PATTERN,
            "maxLength": MAX_PATH_BYTES,
        }
    ),
]

ContentDigest = Annotated[str, Strict(), Field(pattern=r"^(?:sha256:[0-9a-f]{64}|git:(?:[0-9a-f]{40}|[0-9a-f]{64}))$")]
"""``sha256:<hex>`` of the bytes, or ``git:<blob id>`` for immutable Git content."""

MAX_FILE_BYTES = 1 << 32
"""No single staged file may be larger than 4 GiB."""

MAX_FILES_PER_MOUNT = 100_000


class MountFile(Model):
    """One file of a mount: where it lands below the target, its mode, size and digest.

    A symlink (``symlink`` true) is staged as a link, never followed: its bytes are the link's
    target, a relative path that stays inside the mount (``link_problem``); size and digest are
    those of the target's UTF-8 bytes.
    """

    decode_error: ClassVar[type[SandboxError]] = SandboxProfileInvalid

    path: MountPath
    mode: Annotated[int, Strict(), Field(ge=0, le=0o777, description="permission bits only (420 is octal 0644)")] = (
        0o644
    )
    size: Annotated[NonNegInt, Field(le=MAX_FILE_BYTES)]
    digest: ContentDigest
    symlink: Bool = Field(default=False, description="a symlink whose target (its bytes) stays inside the mount")


class MountPlan(Model):
    """A target directory and its files. Sealed read-only once the instance is active, unless ``writable``."""

    decode_error: ClassVar[type[SandboxError]] = SandboxProfileInvalid

    target: MountTarget
    files: Annotated[tuple[MountFile, ...], Field(max_length=MAX_FILES_PER_MOUNT)]
    writable: Bool = Field(
        default=False,
        description="copied in, owned by the sandbox user and writable (never sealed); its bytes count in disk_mib",
    )

    @model_validator(mode="after")
    def _distinct_files(self) -> MountPlan:
        if self.target == "/":
            raise rule_error(SandboxPathRejected, "target", "a mount may not cover the root '/'")
        seen: set[str] = set()
        dirs: set[str] = set()
        for i, f in enumerate(self.files):
            if f.path in seen or f.path in dirs:
                raise rule_error(SandboxPathRejected, f"files.{i}.path", f"{f.path!r} is staged twice")
            seen.add(f.path)
            parts = f.path.split("/")
            for j in range(1, len(parts)):
                dirs.add("/".join(parts[:j]))
        clash = seen & dirs
        if clash:
            name = sorted(clash)[0]
            raise rule_error(SandboxPathRejected, "files", f"{name!r} is both a file and a directory")
        return self

    def absolute(self, file: MountFile) -> str:
        return f"{self.target}/{file.path}"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def has_symlinks(self) -> bool:
        return any(f.symlink for f in self.files)


def link_problem(path: str, link: str) -> str | None:
    """Why a symlink at mount path ``path`` pointing to ``link`` may not be staged, or ``None``.

    The target must be relative, free of NUL, at most 4096 bytes, and resolve (lexically,
    from the link's own directory) to a path inside the mount, never its root's parent.
    """
    if not link or "\x00" in link:
        return "has an empty or NUL target"
    try:
        link.encode("utf-8")
    except UnicodeEncodeError:
        return "has a target that is not UTF-8"
    if len(link.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"has a target longer than {MAX_PATH_BYTES} bytes"
    if link.startswith("/"):
        return f"points outside the mount (absolute target {link[:200]!r})"
    depth = path.count("/")  # directories between the mount root and the link
    for segment in link.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            depth -= 1
            if depth < 0:
                return f"points outside the mount ({link[:200]!r})"
        else:
            depth += 1
    return None


def overlapping_targets(mounts: tuple[MountPlan, ...]) -> tuple[int, int] | None:
    """The first pair of mount indexes whose targets overlap (one inside the other), if any."""
    for i, a in enumerate(mounts):
        for j in range(i + 1, len(mounts)):
            b = mounts[j]
            if is_within(a.target, b.target) or is_within(b.target, a.target):
                return (i, j)
    return None
